// The DeepSpeed reference's worker pool (reference_pool.h). Note [Reference pool deadlines]: every
// wait is a poll() against one deadline per command; a worker that closes its pipe has crashed
// (waitpid names the signal or exit status); one that is silent past the deadline has hung
// (often in a gloo collective whose peer failed). Either way every worker is killed (SIGKILL to
// its process group) and reaped, so nothing outlives the comparison, and the next run() starts
// a fresh pool. Workers die with this process too (PR_SET_PDEATHSIG).
#include "props/reference_pool.h"

#include "props/deepspeed_target.h"

#include "engine/data_files.h"
#include "engine/errors.h"
#include "engine/rng.h"
#include "engine/trace.h"
#include "props/stopwatch.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#ifndef ZC_SOURCE_DIR
#error "ZC_SOURCE_DIR must name the source tree (props/CMakeLists.txt)"
#endif

extern char** environ;

namespace zc::props {

namespace {

std::string getenv_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// A variable an MPI or SLURM launcher set for this process. A worker is a rank of the pool's own
// gloo world, not of the launcher's: DeepSpeed reads OMPI_COMM_WORLD_LOCAL_RANK and friends in
// init_distributed and refuses a LOCAL_RANK that disagrees ("conflicting local rank info"), which
// made every comparison under `mpirun zerocheck verify --against deepspeed` a refusal.
bool launcher_variable(const std::string& key) {
  for (const char* prefix : {"OMPI_", "PMIX_", "PMI_", "OPAL_", "PRTE_", "HYDRA_", "I_MPI_", "MPI_LOCAL", "SLURM_"}) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// A free loopback port for the rank-0 TCP store (bound to port 0, read back, released).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw UsageError(fmt::format("socket(): {}", std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw UsageError(fmt::format("cannot find a free loopback port: {}", std::strerror(errno)));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

std::filesystem::path pinned_env_dir() {
  const std::string cache = getenv_or("XDG_CACHE_HOME", getenv_or("HOME", "/root") + "/.cache");
  return getenv_or("ZC_DS_ENV", cache + "/zerocheck/ds-env");
}

ReferenceEnv reference_env(const std::string& target, bool with_adam_ops) {
  ReferenceEnv e;
  e.target = target;
  e.env_dir = pinned_env_dir();
  e.python = e.env_dir / "bin" / "python";
  e.worker = getenv_or("ZC_DS_WORKER", data_file("reference/deepspeed/worker.py", ZC_SOURCE_DIR).string());
  if (const char* t = std::getenv("ZC_DS_TIMEOUT_S")) e.timeout_s = std::atof(t);
  if (!std::filesystem::exists(e.env_dir / ".zerocheck-complete") || !std::filesystem::exists(e.python)) {
    throw ConfigError(fmt::format("the DeepSpeed reference environment {} is missing or incomplete: run "
                                  "scripts/ds-env.sh (make test does), or set ZC_DS_ENV to one it made",
                                  e.env_dir.string()));
  }
  if (!std::filesystem::exists(e.worker)) {
    throw ConfigError(fmt::format("the DeepSpeed worker {} does not exist (set ZC_DS_WORKER)", e.worker.string()));
  }
  e.ext_dir = e.env_dir / "torch_extensions";
  if (!is_pinned(target)) {
    const Overlay o = ensure_overlay(target, with_adam_ops);
    e.overlay_site = o.site;
    e.expect_version = o.version;
    e.ext_dir = o.ext_dir;
  }
  const std::filesystem::path ninja = e.ext_dir / "fused_adam" / "build.ninja";
  std::ifstream in(ninja);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cflags", 0) != 0) continue;
    if (line.find("-D__AVX512__") != std::string::npos) e.adam_simd_width = 16;
    else if (line.find("-D__AVX256__") != std::string::npos) e.adam_simd_width = 8;
  }
  if (e.adam_simd_width == 0 && with_adam_ops) {
    throw ConfigError(fmt::format("cannot tell the vector width of DeepSpeed's CPU Adam from {} (no -D__AVX512__ or "
                                  "-D__AVX256__ in its cflags; zerocheck models those two builds): rerun scripts/ds-env.sh",
                                  ninja.string()));
  }
  probe_torch_sqrt(e);
  return e;
}

namespace {

// The CPU's identity for the probe's cache: its model name and flags (the first processor's).
std::uint64_t cpu_key() {
  std::ifstream in("/proc/cpuinfo");
  std::string key, line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 || line.rfind("flags", 0) == 0) key += line + "\n";
    if (line.empty() && !key.empty()) break;
  }
  return fnv1a(key);
}

std::string hex32(float v) { return fmt::format("0x{:08x}", std::bit_cast<std::uint32_t>(v)); }

// The probe's inputs: uniform in [0, 100), then k * 2^e for e in [-30, 30).
std::vector<float> probe_inputs() {
  Rng rng(0x5a12u);
  std::vector<float> xs;
  for (int i = 0; i < 2048; ++i) xs.push_back(static_cast<float>(rng.uniform01() * 100.0));
  for (int i = 0; i < 2048; ++i) {
    const double k = 1.0 + static_cast<double>(rng.range(0, (1 << 23) - 1)) / (1 << 23);
    xs.push_back(static_cast<float>(std::ldexp(k, static_cast<int>(rng.range(-30, 29)))));
  }
  return xs;
}

// torch's answers for the inputs: the vector sqrt of all, then pow(0.5) of 0-dim tensors for the
// first 256. Empty when the probe did not run (the reason in `why`).
std::vector<float> torch_sqrt_of(const ReferenceEnv& env, const std::vector<float>& xs, std::string& why) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(ec) / fmt::format("zc-sqrt-{}", ::getpid());
  std::filesystem::create_directories(dir, ec);
  {
    std::ofstream out(dir / "x.f32", std::ios::binary);
    out.write(reinterpret_cast<const char*>(xs.data()), static_cast<std::streamsize>(xs.size() * sizeof(float)));
    if (!out) {
      why = fmt::format("cannot write the probe's inputs in {}", dir.string());
      return {};
    }
  }
  // At most two minutes (importing torch takes seconds), paths quoted.
  const std::string cmd = fmt::format(
      "cd '{}' && OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= timeout 120 '{}' -c \"import torch; torch.set_num_threads(1); "
      "x = torch.frombuffer(bytearray(open('x.f32', 'rb').read()), dtype=torch.float32); "
      "y = torch.cat([x.sqrt(), torch.stack([x[i].clone().pow(0.5) for i in range(256)])]); "
      "open('y.f32', 'wb').write(y.numpy().tobytes())\" > probe.log 2>&1", dir.string(), env.python.string());
  std::vector<float> ys(xs.size() + 256);
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir / "probe.log");
    why = std::string(std::istreambuf_iterator<char>(log), {}).substr(0, 400);
    ys.clear();
  } else {
    std::ifstream in(dir / "y.f32", std::ios::binary);
    in.read(reinterpret_cast<char*>(ys.data()), static_cast<std::streamsize>(ys.size() * sizeof(float)));
    if (!in) {
      why = "the probe wrote no answers";
      ys.clear();
    }
  }
  std::filesystem::remove_all(dir, ec);
  return ys;
}

}  // namespace

void probe_torch_sqrt(ReferenceEnv& env) {
  const std::filesystem::path cache = env.env_dir / fmt::format("torch_sqrt-{:016x}.txt", cpu_key());
  std::string answer;
  if (std::ifstream in(cache); in) std::getline(in, answer);
  if (answer.empty()) {
    const std::vector<float> xs = probe_inputs();
    std::string why;
    const std::vector<float> ys = torch_sqrt_of(env, xs, why);
    if (ys.empty()) throw ConfigError(fmt::format("cannot run torch's sqrt probe with {}: {}", env.python.string(), why));
    std::string first_rounded, first_mkl;
    for (std::size_t i = 0; i < ys.size(); ++i) {
      const float x = xs[i < xs.size() ? i : i - xs.size()];
      const auto differs = [&](float model) { return std::bit_cast<std::uint32_t>(model) != std::bit_cast<std::uint32_t>(ys[i]); };
      const std::string at = fmt::format("sqrt({}) = {} in torch", hex32(x), hex32(ys[i]));
      if (first_rounded.empty() && differs(std::sqrt(x))) first_rounded = at + ", correctly rounded " + hex32(std::sqrt(x));
      if (first_mkl.empty() && (!torch_sqrt_mkl_sse_available() || differs(mkl_sse_sqrt_f32(x)))) {
        first_mkl = at + ", MKL's SSE kernel " + hex32(mkl_sse_sqrt_f32(x));
      }
    }
    answer = first_rounded.empty() ? "correctly_rounded"
             : first_mkl.empty()   ? "mkl_sse"
                                   : fmt::format("unknown: {}; {}", first_rounded, first_mkl);
    // Cached when the environment is writable (a shared read-only one probes every time).
    const std::filesystem::path tmp = cache.string() + fmt::format(".{}", ::getpid());
    std::error_code ec;
    if (std::ofstream(tmp) << answer << "\n") std::filesystem::rename(tmp, cache, ec);
    std::filesystem::remove(tmp, ec);
  }
  if (answer == "mkl_sse") env.torch_sqrt = TorchSqrt::mkl_sse;
  else if (answer != "correctly_rounded") env.torch_sqrt_unknown = answer;
}

ReferencePool::ReferencePool(ReferenceEnv env, int world) : env_(std::move(env)), world_(world) {
  if (world < 1 || world > 4) throw ConfigError(fmt::format("the DeepSpeed reference runs worlds 1-4, not {}", world));
  // A write to a worker that has died must be an error naming it (EPIPE), not SIGPIPE killing us.
  ::signal(SIGPIPE, SIG_IGN);
  logs_ = std::filesystem::temp_directory_path() / fmt::format("zerocheck-ds-{}-w{}", ::getpid(), world);
  std::filesystem::create_directories(logs_);
}

ReferencePool::~ReferencePool() {
  try {
    stop(false);
    if (std::getenv("ZC_DS_KEEP_LOGS") == nullptr) std::filesystem::remove_all(logs_);  // kept for debugging when set
  } catch (...) {  // a destructor never throws; the workers are killed either way
  }
}

void ReferencePool::start() {
  const int port = free_port();
  port_ = port;
  workers_.assign(static_cast<std::size_t>(world_), Worker{});
  const std::filesystem::path ext = env_.ext_dir.empty() ? env_.env_dir / "torch_extensions" : env_.ext_dir;
  for (int r = 0; r < world_; ++r) {
    Worker& w = workers_[static_cast<std::size_t>(r)];
    w.log = logs_ / fmt::format("rank{}.log", r);
    int to[2], from[2];
    if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) {
      throw UsageError(fmt::format("pipe(): {}", std::strerror(errno)));
    }
    std::vector<std::string> vars = {
        fmt::format("RANK={}", r), fmt::format("WORLD_SIZE={}", world_), fmt::format("LOCAL_RANK={}", r),
        fmt::format("LOCAL_SIZE={}", world_), "MASTER_ADDR=127.0.0.1", fmt::format("MASTER_PORT={}", port),
        "DS_ACCELERATOR=cpu", "CUDA_VISIBLE_DEVICES=", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1",
        "TORCH_EXTENSIONS_DIR=" + ext.string(), fmt::format("ZC_DS_TIMEOUT_S={}", env_.timeout_s)};
    // Another DeepSpeed: its overlay before the environment's own site-packages.
    if (!env_.overlay_site.empty()) vars.push_back("PYTHONPATH=" + env_.overlay_site.string());
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (launcher_variable(key)) continue;
      bool ours = false;
      for (const std::string& v : vars) ours = ours || v.substr(0, v.find('=')) == key;
      if (!ours) vars.push_back(kv);
    }
    const std::string python = env_.python.string(), worker = env_.worker.string(), log = w.log.string();
    const pid_t pid = ::fork();
    if (pid < 0) throw UsageError(fmt::format("fork(): {}", std::strerror(errno)));
    if (pid == 0) {  // the child: only async-signal-safe calls until exec
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(to[0], 0);
      ::dup2(from[1], 1);
      const int lf = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (lf >= 0) ::dup2(lf, 2);
      std::vector<char*> envp;
      for (std::string& v : vars) envp.push_back(v.data());
      envp.push_back(nullptr);
      char* argv[] = {const_cast<char*>(python.c_str()), const_cast<char*>(worker.c_str()), nullptr};
      ::execve(python.c_str(), argv, envp.data());
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    w.pid = pid;
    w.to_fd = to[1];
    w.from_fd = from[0];
  }
  ++starts_;
  std::vector<int> all;
  for (int r = 0; r < world_; ++r) all.push_back(r);
  for (const std::string& line : replies(all, "start (import DeepSpeed, init_distributed over gloo)")) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.value("ready", false)) {
      throw RankFailure(0, fmt::format("a DeepSpeed worker did not report ready: {}", line), nullptr);
    }
    // Another DeepSpeed: a missing or half-removed overlay would let Python fall back to the
    // environment's own 0.19.8 without a word.
    const std::string file = j.value("deepspeed_file", std::string());
    if (!env_.expect_version.empty() &&
        (j.value("deepspeed", std::string()) != env_.expect_version || file.rfind(env_.overlay_site.string(), 0) != 0)) {
      const std::string got = j.value("deepspeed", std::string("?"));
      stop(true);
      throw ConfigError(fmt::format("{}: the workers imported DeepSpeed {} from {}, not {} from {}: the overlay is "
                                    "incomplete; remove {} and run again", env_.target, got, file, env_.expect_version,
                                    env_.overlay_site.string(), env_.overlay_site.parent_path().string()));
    }
  }
}

void ReferencePool::stop(bool force) {
  for (Worker& w : workers_) {
    if (w.pid <= 0) continue;
    if (!force) {
      const std::string quit = "{\"cmd\": \"quit\"}\n";
      [[maybe_unused]] const ssize_t n = ::write(w.to_fd, quit.data(), quit.size());
    }
  }
  const Deadline deadline(force ? 0 : 5);
  for (Worker& w : workers_) {
    int status = 0;
    while (w.pid > 0 && ::waitpid(w.pid, &status, WNOHANG) == 0) {
      if (deadline.passed()) {
        ::kill(-w.pid, SIGKILL);
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, &status, 0);
        break;
      }
      ::usleep(10000);
    }
    // A worker already reaped (crashed, or found dead) still has its pipes open here.
    if (w.to_fd >= 0) ::close(w.to_fd);
    if (w.from_fd >= 0) ::close(w.from_fd);
    w.to_fd = w.from_fd = -1;
    w.pid = -1;
  }
  workers_.clear();
  // Note [DeepSpeed shm buffers]: init_distributed on the CPU accelerator creates shared-memory
  // all-reduce buffers (/dev/shm/deepspeed_allreduce_buffer_<n>_<addr>_<port>_<rank>, about 65 MB
  // per rank) and never unlinks them; a pool restarted per port would fill memory (21 GB seen).
  std::error_code ec;
  const std::string mine = fmt::format("_127.0.0.1_{}_", port_);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("deepspeed_allreduce_buffer_", 0) == 0 && name.find(mine) != std::string::npos) {
      std::filesystem::remove(e.path(), ec);
    }
  }
}

std::string how_it_ended(int wait_status) {
  if (!WIFSIGNALED(wait_status)) return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
  const int sig = WTERMSIG(wait_status);
  // The pool sends SIGKILL only in stop(), which reaps the worker itself: a worker found killed
  // by it was killed from outside, most often by the kernel when memory ran out.
  return fmt::format("was killed by signal {} ({}){}", sig, strsignal(sig),
                     sig == SIGKILL ? ", from outside zerocheck: the kernel's OOM killer when memory runs out "
                                      "(`dmesg` names it)"
                                    : "");
}

std::string ReferencePool::log_tail(int rank) const {
  std::ifstream in(logs_ / fmt::format("rank{}.log", rank));
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) lines.push_back(l);
  }
  std::string out;
  for (std::size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i) out += " | " + lines[i];
  return out.empty() ? " (its log is empty)" : out;
}

void ReferencePool::fail(int rank, const std::string& what) {
  const std::string tail = log_tail(rank);
  stop(true);
  throw RankFailure(rank, fmt::format("DeepSpeed worker (world {}) {}; the pool was stopped and restarts on the "
                                      "next scenario; its log ends{}", world_, what, tail), nullptr);
}

std::vector<std::string> ReferencePool::replies(const std::vector<int>& ranks, const std::string& what) {
  std::vector<std::string> got(ranks.size());
  std::vector<bool> done(ranks.size(), false);
  Deadline deadline(env_.timeout_s);
  std::size_t remaining = ranks.size();
  int raised = -1;  // the first rank that answered with an error: the others may wait on it in a collective
  std::string raised_error;
  while (remaining > 0) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (done[i]) continue;
      fds.push_back({workers_[static_cast<std::size_t>(ranks[i])].from_fd, POLLIN, 0});
      which.push_back(i);
    }
    const std::int64_t left = deadline.ms_left();
    if (left <= 0 && raised >= 0) {
      fail(raised, fmt::format("raised during '{}': {}; the other ranks then waited in a collective", what, raised_error));
    }
    if (left <= 0) {
      fail(ranks[which.front()], fmt::format("did not answer '{}' within {} s (hung)", what, env_.timeout_s));
    }
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<std::int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) throw UsageError(fmt::format("poll(): {}", std::strerror(errno)));
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const std::size_t i = which[k];
      Worker& w = workers_[static_cast<std::size_t>(ranks[i])];
      char buf[4096];
      const ssize_t got_bytes = ::read(w.from_fd, buf, sizeof buf);
      if (got_bytes <= 0) {
        int status = 0;
        ::waitpid(w.pid, &status, 0);
        w.pid = -1;
        fail(ranks[i], fmt::format("{} during '{}' (crashed)", how_it_ended(status), what));
      }
      w.pending.append(buf, static_cast<std::size_t>(got_bytes));
      const std::size_t nl = w.pending.find('\n');
      if (nl != std::string::npos) {
        got[i] = w.pending.substr(0, nl);
        w.pending.erase(0, nl + 1);
        done[i] = true;
        --remaining;
        const nlohmann::json j = nlohmann::json::parse(got[i], nullptr, false);
        if (raised < 0 && (j.is_discarded() || !j.value("ok", true))) {
          raised = ranks[i];
          raised_error = j.is_discarded() ? got[i] : j.value("error", "no error text");
          deadline.tighten(5);
        }
      }
    }
  }
  return got;
}

std::string ReferencePool::reap(Worker& w) {
  int status = 0;
  const Deadline deadline(2);  // a closed pipe with the process still there: give it a moment to end
  pid_t got = 0;
  while ((got = ::waitpid(w.pid, &status, WNOHANG)) == 0 && !deadline.passed()) ::usleep(10000);
  if (got != w.pid) return "closed its pipe but is still running";
  w.pid = -1;
  return how_it_ended(status);
}

void ReferencePool::replace_idle_dead() {
  for (int r = 0; r < world_ && !workers_.empty(); ++r) {
    Worker& w = workers_[static_cast<std::size_t>(r)];
    int status = 0;
    if (w.pid <= 0 || ::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
    w.pid = -1;
    idle_deaths_.push_back(fmt::format("world {} rank {} {} while idle, after its last scenario had answered; its "
                                       "log ends{}", world_, r, how_it_ended(status), log_tail(r)));
    stop(true);
    start();
  }
}

void ReferencePool::broadcast_command(const std::string& line, const std::string& what) {
  if (workers_.empty()) start();
  replace_idle_dead();
  std::vector<int> all;
  for (int r = 0; r < world_; ++r) {
    all.push_back(r);
    Worker& w = workers_[static_cast<std::size_t>(r)];
    if (::write(w.to_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      const std::string why = std::strerror(errno);
      fail(r, fmt::format("could not be sent '{}' ({}): it {}", what, why, reap(w)));
    }
  }
  const std::vector<std::string> got = replies(all, what);
  for (int r = 0; r < world_; ++r) {
    const nlohmann::json j = nlohmann::json::parse(got[static_cast<std::size_t>(r)], nullptr, false);
    if (j.is_discarded() || !j.value("ok", false)) {
      const std::string error = j.is_discarded() ? got[static_cast<std::size_t>(r)] : j.value("error", "no error text");
      // The other ranks finished or failed too (they all answered), so the pool stays usable.
      throw RankFailure(r, fmt::format("DeepSpeed raised on this scenario: {}", error), nullptr);
    }
  }
}

void ReferencePool::run(const std::filesystem::path& dir) {
  const std::string abs = std::filesystem::absolute(dir).string();
  broadcast_command(nlohmann::json{{"cmd", "run"}, {"dir", abs}}.dump() + "\n", "run " + dir.filename().string());
}

void ReferencePool::probe(const std::string& name, const std::filesystem::path& dir, const std::string& args_json) {
  const std::string abs = std::filesystem::absolute(dir).string();
  const nlohmann::json args = nlohmann::json::parse(args_json);
  broadcast_command(nlohmann::json{{"cmd", "probe"}, {"name", name}, {"dir", abs}, {"args", args}}.dump() + "\n",
                    "probe " + name);
}

void ReferencePool::command_one(int rank, const std::string& json_line) {
  if (workers_.empty()) start();
  const std::string line = json_line + "\n";
  Worker& w = workers_.at(static_cast<std::size_t>(rank));
  if (::write(w.to_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    const std::string why = std::strerror(errno);
    fail(rank, fmt::format("could not be sent a command ({}): it {}", why, reap(w)));
  }
  replies({rank}, json_line);
}

void ReferencePools::retire(int world) {
  const auto it = pools_.find(world);
  if (it == pools_.end()) return;
  retired_deaths_.insert(retired_deaths_.end(), it->second->idle_deaths().begin(), it->second->idle_deaths().end());
  pools_.erase(it);
}

std::vector<std::string> ReferencePools::idle_deaths() const {
  std::vector<std::string> all = retired_deaths_;
  for (const auto& [world, pool] : pools_) all.insert(all.end(), pool->idle_deaths().begin(), pool->idle_deaths().end());
  return all;
}

ReferencePool& ReferencePools::get(int world) {
  auto it = pools_.find(world);
  if (it == pools_.end()) it = pools_.emplace(world, std::make_unique<ReferencePool>(env_, world)).first;
  return *it->second;
}

}  // namespace zc::props
