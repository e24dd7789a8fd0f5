// The DeepSpeed reference's worker pool: W Python processes (reference/deepspeed/worker.py), one per
// rank of a gloo world, started once and reused for many scenarios (importing DeepSpeed costs
// seconds). Each command is answered by every rank within the timeout, or the pool is torn down
// and the comparison ends with a RankFailure that names the rank, what happened (crashed with its
// exit status, hung, or raised) and the tail of its log; the next run() starts a fresh pool. No
// call waits without a deadline.
#pragma once

#include "engine/torch_reductions.h"

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace zc::props {

struct ReferenceEnv {
  std::filesystem::path env_dir;     // the virtual environment (scripts/ds-env.sh)
  std::filesystem::path python;      // env_dir/bin/python
  std::filesystem::path worker;      // reference/deepspeed/worker.py
  // Which DeepSpeed: "deepspeed" (the pinned 0.19.8 in env_dir), "deepspeed==X.Y.Z" or
  // "deepspeed@DIR" (an overlay scripts/ds-release.sh made: its site/ first on the workers'
  // PYTHONPATH, its ops in ext_dir).
  std::string target = "deepspeed";
  std::filesystem::path overlay_site;  // empty for the pinned one
  std::string expect_version;          // the overlay's DeepSpeed version; the workers must import it from there
  std::filesystem::path ext_dir;       // TORCH_EXTENSIONS_DIR: the prebuilt CPU ops
  double timeout_s = 120;            // per command (a scenario on every rank, or the start)
  // The vector width DeepSpeed built its CPU Adam with on this machine (-D__AVX512__: 16,
  // -D__AVX256__: 8; read from the prebuilt op's build.ninja): Options::adam_simd_width.
  int adam_simd_width = 0;
  // The f32 sqrt kernel torch runs on this CPU (probe_torch_sqrt): Options::torch_sqrt. When it is
  // neither model, torch_sqrt_unknown says how it differs, and the comparison leaves out what
  // depends on it (reference_unexpressible: clipping).
  TorchSqrt torch_sqrt = TorchSqrt::correctly_rounded;
  std::string torch_sqrt_unknown;
};

// Note [Probing torch's sqrt]: which f32 sqrt torch runs here (Note [torch's f32 sqrt on a CPU]) is
// measured once per CPU and environment: 4,096 values (uniform in [0, 100) and k * 2^e over 60
// binades) through torch's vector sqrt and, for 256 of them, a 0-dim tensor's pow(0.5), against the
// correctly rounded sqrtf and the mkl_sse model. The answer is cached in the environment,
// keyed by the CPU's model name and flags; torch_sqrt_unknown names the first value that neither
// model gives.
void probe_torch_sqrt(ReferenceEnv& env);

// The environment scripts/ds-env.sh creates: $ZC_DS_ENV, else ${XDG_CACHE_HOME:-$HOME/.cache}/zerocheck/ds-env
// (the script's own default); the worker from $ZC_DS_WORKER, else the source tree's.
// ConfigError naming what is missing and the command that makes it, when it is not complete.
// A target other than "deepspeed" (props/deepspeed_target.h) is made first if it is not there
// (scripts/ds-release.sh, with its progress on stderr); its errors are ConfigErrors naming it.
// with_adam_ops false: only the ops the workers need to start (the seeds' checks run no Adam), so
// a new release costs seconds of op builds, not minutes; adam_simd_width is then 0.
ReferenceEnv reference_env(const std::string& target = "deepspeed", bool with_adam_ops = true);
// Where that environment lives ($ZC_DS_ENV or the default), whether or not it is complete.
std::filesystem::path pinned_env_dir();

class ReferencePool {
 public:
  ReferencePool(ReferenceEnv env, int world);
  ~ReferencePool();
  ReferencePool(const ReferencePool&) = delete;
  ReferencePool& operator=(const ReferencePool&) = delete;

  // Runs the scenario directory on every rank (each writes rank{R}.rec there). RankFailure when a
  // rank crashes, hangs past the timeout, or reports an error; the pool is then stopped.
  void run(const std::filesystem::path& dir);
  // A probe of DeepSpeed itself (reference/deepspeed/probes.py) on every rank, with the keyword
  // arguments of args_json (a JSON object); rank 0 writes dir/probe_<name>.json. RankFailure as run().
  void probe(const std::string& name, const std::filesystem::path& dir, const std::string& args_json = "{}");
  // A raw command to one rank (the pool's tests: "crash", "hang"), then waits as run() does.
  void command_one(int rank, const std::string& json_line);
  // The deadline of every later command (the start keeps the one it had).
  void set_timeout(double seconds) { env_.timeout_s = seconds; }
  int world() const { return world_; }
  int starts() const { return starts_; }  // how many times the workers were (re)started
  // Workers found dead before a command was sent (killed between scenarios: the kernel's OOM
  // killer, a signal from outside), each with how it ended and its log's tail. The pool replaced
  // them and ran the command on fresh workers: what they had answered was complete, and the
  // command they missed had not been sent. Reported by the campaign, never silent.
  const std::vector<std::string>& idle_deaths() const { return idle_deaths_; }
  // A rank's process id, -1 when the pool is not running (the pool's tests signal one).
  pid_t pid(int rank) const { return workers_.empty() ? -1 : workers_.at(static_cast<std::size_t>(rank)).pid; }
  const ReferenceEnv& env() const { return env_; }

 private:
  struct Worker {
    pid_t pid = -1;
    int to_fd = -1;    // the worker's stdin
    int from_fd = -1;  // its protocol pipe
    std::string pending;
    std::filesystem::path log;
  };
  void start();
  void stop(bool force);
  // Restarts the pool when a worker has died since its last answer (idle_deaths()).
  void replace_idle_dead();
  // Waits briefly for a worker whose pipe closed and says how it ended.
  std::string reap(Worker& w);
  // Sends one line to every rank and checks every reply is ok.
  void broadcast_command(const std::string& line, const std::string& what);
  // One reply line from each rank in `ranks`, by the deadline; RankFailure otherwise.
  std::vector<std::string> replies(const std::vector<int>& ranks, const std::string& what);
  [[noreturn]] void fail(int rank, const std::string& what);
  std::string log_tail(int rank) const;

  ReferenceEnv env_;
  int world_;
  int starts_ = 0;
  int port_ = 0;  // the workers' MASTER_PORT
  std::filesystem::path logs_;
  std::vector<Worker> workers_;
  std::vector<std::string> idle_deaths_;
};

// "exited with status N" or "was killed by signal N (name)", from waitpid's status.
std::string how_it_ended(int wait_status);

// One pool per world size, started on first use.
class ReferencePools {
 public:
  explicit ReferencePools(ReferenceEnv env) : env_(std::move(env)) {}
  ReferencePool& get(int world);
  // Stops that world's pool (its workers quit); the next get() starts fresh ones. For a probe that
  // leaves process-wide DeepSpeed state behind (the I3 probe's AutoTP groups).
  void retire(int world);
  const ReferenceEnv& env() const { return env_; }
  // Every pool's idle_deaths(), retired pools' first.
  std::vector<std::string> idle_deaths() const;

 private:
  ReferenceEnv env_;
  std::vector<std::string> retired_deaths_;
  std::map<int, std::unique_ptr<ReferencePool>> pools_;
};

}  // namespace zc::props
