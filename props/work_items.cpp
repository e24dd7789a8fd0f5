// ChildPool, Journal and the one-process runner (props/work_items.h).
#include "props/work_items.h"

#include "engine/errors.h"
#include "props/verify.h"

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

namespace zc::props {

namespace {

std::string hex(std::uint64_t v) { return fmt::format("0x{:016x}", v); }

nlohmann::json read_result(const std::filesystem::path& file, int status) {
  if (WIFSIGNALED(status)) {
    return {{"ok", false}, {"error", fmt::format("the work item died with signal {} ({})", WTERMSIG(status),
                                                 strsignal(WTERMSIG(status)))}};
  }
  std::ifstream f(file);
  if (!f) return {{"ok", false}, {"error", fmt::format("the work item exited {} without a result", WEXITSTATUS(status))}};
  try {
    nlohmann::json got;
    f >> got;
    return got;
  } catch (const nlohmann::json::exception& e) {
    return {{"ok", false}, {"error", fmt::format("unreadable result: {}", e.what())}};
  }
}

}  // namespace

ChildPool::ChildPool(RunFn run, int jobs, double item_timeout_s, int attempts)
    : run_(std::move(run)), jobs_(std::max(1, jobs)), item_timeout_s_(item_timeout_s), attempts_(std::max(1, attempts)) {
  // Node-local: under mpirun on several nodes, --out may exist only where rank 0 runs.
  work_ = std::filesystem::temp_directory_path() / fmt::format("zerocheck-items-{}", getpid());
  std::filesystem::create_directories(work_);
}

ChildPool::~ChildPool() {
  for (const auto& [pid, child] : running_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  std::error_code ec;
  std::filesystem::remove_all(work_, ec);
}

std::filesystem::path ChildPool::file_of(std::size_t item, int attempt) const {
  return work_ / fmt::format("item-{}-{}.json", item, attempt);
}

void ChildPool::start(std::size_t item) { spawn(item, 1); }

void ChildPool::spawn(std::size_t item, int attempt) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw UsageError(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    int rc = 0;
    nlohmann::json out;
    try {
      out = {{"ok", true}, {"result", run_(item, attempt)}};
    } catch (const std::exception& e) {
      out = {{"ok", false}, {"error", e.what()}};
      rc = 3;
    }
    std::ofstream f(file_of(item, attempt));
    f << out.dump();
    f.close();
    std::fflush(nullptr);
    _exit(f ? rc : 4);
  }
  running_.emplace(pid, Child{item, attempt, Deadline(item_timeout_s_), false});
}

void ChildPool::kill_overdue() {
  for (auto& [pid, child] : running_) {
    if (!child.timed_out && child.deadline.passed()) {
      kill(pid, SIGKILL);
      child.timed_out = true;
    }
  }
}

std::optional<std::pair<std::size_t, nlohmann::json>> ChildPool::reap(bool block) {
  if (running_.empty()) return std::nullopt;
  int status = 0;
  pid_t pid = 0;
  while ((pid = waitpid(-1, &status, WNOHANG)) == 0) {  // polled, so overdue children are killed
    kill_overdue();
    if (!block) return std::nullopt;
    usleep(5000);
  }
  if (pid < 0) throw UsageError(fmt::format("waitpid failed: {}", std::strerror(errno)));
  const auto it = running_.find(pid);
  if (it == running_.end()) return std::nullopt;  // not ours (a DeepSpeed worker's)
  const Child child = it->second;
  running_.erase(it);
  const std::filesystem::path file = file_of(child.item, child.attempt);
  nlohmann::json got = read_result(file, status);
  std::error_code ec;
  std::filesystem::remove(file, ec);
  if (child.timed_out) {
    return std::make_pair(child.item, nlohmann::json{{"ok", false}, {"error", fmt::format(
        "the work item ran past its timeout of {:.0f} s and was killed (--item-timeout-s)", item_timeout_s_)}});
  }
  const bool died = WIFSIGNALED(status) || got.value("error", "").rfind("the work item exited", 0) == 0;
  if (died && child.attempt < attempts_) {
    spawn(child.item, child.attempt + 1);
    return std::nullopt;
  }
  if (child.attempt > 1) {
    got["attempts"] = child.attempt;
    if (died) got["error"] = fmt::format("{} (in each of {} attempts)", got.value("error", ""), child.attempt);
  }
  return std::make_pair(child.item, std::move(got));
}

Journal::Journal(const std::filesystem::path& out, const VerifyJob& job, bool resume)
    : path_(out / "journal.jsonl") {
  std::filesystem::create_directories(out);
  const nlohmann::json header = {{"zerocheck", "verify-journal"}, {"fingerprint", hex(job.fingerprint())},
                                 {"job", job.describe()}, {"items", job.size()}};
  if (resume) {
    std::ifstream in(path_);
    if (!in) {
      throw UsageError(fmt::format("--resume: no journal at {}: nothing to resume (run without --resume)", path_.string()));
    }
    std::string line;
    std::getline(in, line);
    const nlohmann::json h = nlohmann::json::parse(line, nullptr, false);
    if (h.is_discarded() || h.value("zerocheck", "") != "verify-journal") {
      throw ConfigError(fmt::format("--resume: {} is not a verify journal", path_.string()));
    }
    if (h.value("fingerprint", "") != header["fingerprint"]) {
      throw ConfigError(fmt::format("--resume: the journal in {} is for {}, this run is {}: resume with the "
                                    "options of that run, or drop --resume", out.string(), h.value("job", "?"),
                                    job.describe()));
    }
    while (std::getline(in, line)) {
      const nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
      if (e.is_discarded() || !e.contains("item") || !e.contains("result")) continue;  // torn: rerun it
      const std::size_t i = e["item"].get<std::size_t>();
      if (i >= job.size() || e.value("name", "") != job.name(i)) continue;
      finished_[i] = e["result"];
    }
  }
  file_ = std::fopen(path_.c_str(), resume ? "a" : "w");
  if (file_ == nullptr) throw UsageError(fmt::format("cannot write {}: {}", path_.string(), std::strerror(errno)));
  if (!resume) {
    std::fputs((header.dump() + "\n").c_str(), file_);
    std::fflush(file_);
  }
}

Journal::~Journal() {
  if (file_ != nullptr) std::fclose(file_);
}

void Journal::record(std::size_t item, const std::string& name, const nlohmann::json& result) {
  finished_[item] = result;
  const std::string line = nlohmann::json{{"item", item}, {"name", name}, {"result", result}}.dump() + "\n";
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    throw UsageError(fmt::format("cannot append to {}: {}", path_.string(), std::strerror(errno)));
  }
}

void run_locally(const Dispatch& d, int jobs, double item_timeout_s) {
  ChildPool pool(d.run, jobs, item_timeout_s);
  bool more = true;
  while (more || !pool.idle()) {
    while (more && !pool.full()) {
      const std::optional<std::size_t> i = d.next();
      if (i) pool.start(*i);
      more = i.has_value();
    }
    if (auto got = pool.reap(true)) d.land(got->first, got->second);
  }
}

Dispatch verify_dispatch(const VerifyJob& job, Journal& journal,
                         const std::function<void(const std::string&, int, int)>& progress) {
  auto todo = std::make_shared<std::vector<std::size_t>>();
  for (std::size_t i = 0; i < job.size(); ++i) {
    if (!journal.finished().contains(i)) todo->push_back(i);
  }
  auto next = std::make_shared<std::size_t>(0);
  auto done = std::make_shared<int>(static_cast<int>(job.size() - todo->size()));
  Dispatch d;
  d.run = [&job](std::size_t i, int attempt) { return job.run(i, attempt); };
  d.next = [todo, next]() -> std::optional<std::size_t> {
    if (*next >= todo->size()) return std::nullopt;
    return (*todo)[(*next)++];
  };
  d.land = [&job, &journal, progress, done](std::size_t i, const nlohmann::json& r) {
    journal.record(i, job.name(i), r);
    if (progress) progress(job.name(i), ++*done, static_cast<int>(job.size()));
  };
  return d;
}

std::vector<nlohmann::json> run_items_locally(const VerifyJob& job, Journal& journal, int jobs, double item_timeout_s,
                                              const std::function<void(const std::string&, int, int)>& progress) {
  run_locally(verify_dispatch(job, journal, progress), jobs, item_timeout_s);
  std::vector<nlohmann::json> results(job.size());
  for (const auto& [i, r] : journal.finished()) results[i] = r;
  return results;
}

}  // namespace zc::props
