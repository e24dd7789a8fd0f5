// Running the verify job's work items: forked children a few at a time (ChildPool), and the
// journal of finished items that lets a killed run resume (Journal). Both serve the one-process
// runner here and the MPI runner (real/verify_mpi.h).
#pragma once

#include "props/stopwatch.h"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zc::props {

class VerifyJob;

// Note [Items in child processes]: each work item runs in a fork()ed child that writes its result
// as JSON to a file and exits; the parent keeps up to `jobs` children going. A child that dies (a
// signal, an abort, no result) is started again, up to `attempts` times in all, then becomes a
// failed item naming the signal and the attempts. A deterministic crash therefore costs two runs
// and is reported; a transient one (the OOM killer, a stray signal) is absorbed. A child still
// running after `item_timeout_s` is killed and reported as timed out, not rerun: nothing hangs.
class ChildPool {
 public:
  // `run(i, attempt)` computes item i in the child; its exceptions become failed items.
  using RunFn = std::function<nlohmann::json(std::size_t, int)>;
  static constexpr double kItemTimeoutS = 7200;
  ChildPool(RunFn run, int jobs, double item_timeout_s = kItemTimeoutS, int attempts = 2);
  ~ChildPool();
  ChildPool(const ChildPool&) = delete;
  ChildPool& operator=(const ChildPool&) = delete;

  bool full() const { return static_cast<int>(running_.size()) >= jobs_; }
  bool idle() const { return running_.empty(); }
  void start(std::size_t item);
  // A finished item and its result ({"ok": true, "result": ...} or {"ok": false, "error": ...}),
  // or nullopt when none has finished (block = false) or a crashed one was restarted.
  std::optional<std::pair<std::size_t, nlohmann::json>> reap(bool block);

 private:
  struct Child {
    std::size_t item = 0;
    int attempt = 1;
    Deadline deadline;
    bool timed_out = false;
  };
  void kill_overdue();
  void spawn(std::size_t item, int attempt);
  std::filesystem::path file_of(std::size_t item, int attempt) const;

  RunFn run_;
  int jobs_;
  double item_timeout_s_;
  int attempts_;
  std::filesystem::path work_;  // node-local scratch for the children's result files
  std::map<pid_t, Child> running_;
};

// out/journal.jsonl: a header naming the job (its fingerprint), then one line per finished item,
// flushed and fsync()ed as it lands, so a run killed at any point (a dead MPI rank takes the whole
// job down) loses only the items in flight. A torn last line is ignored: that item reruns.
class Journal {
 public:
  // Starts a fresh journal, or (resume) reads the finished items of the one there; ConfigError if
  // it belongs to another job, UsageError if there is none to resume.
  Journal(const std::filesystem::path& out, const VerifyJob& job, bool resume);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  const std::map<std::size_t, nlohmann::json>& finished() const { return finished_; }
  void record(std::size_t item, const std::string& name, const nlohmann::json& result);

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::map<std::size_t, nlohmann::json> finished_;
};

// What a runner needs: how to compute item i (in a child), which item to start next (nullopt:
// none is left, or the budget is spent; asked only until it first says none), and what to do
// with a finished one.
struct Dispatch {
  ChildPool::RunFn run;
  std::function<std::optional<std::size_t>()> next;
  std::function<void(std::size_t, const nlohmann::json&)> land;
};

// The one-process runner: `jobs` children at a time until next() says none and all have landed.
void run_locally(const Dispatch& d, int jobs, double item_timeout_s = ChildPool::kItemTimeoutS);

// The verify job's items not in the journal, through run_locally; results in item order.
std::vector<nlohmann::json> run_items_locally(const VerifyJob& job, Journal& journal, int jobs, double item_timeout_s,
                                              const std::function<void(const std::string&, int, int)>& progress);

// The verify job as a Dispatch: the journal's missing items, each result journaled and counted.
Dispatch verify_dispatch(const VerifyJob& job, Journal& journal,
                         const std::function<void(const std::string&, int, int)>& progress);

}  // namespace zc::props
