// The verify job over MPI ranks (cli/verify_mpi.h).
//
// Note [Verify over MPI]: dynamic dispatch, so a long item (a proof, a bug hunt) does not hold up
// a static share. A worker rank keeps one request open per free child slot: it sends kRequest,
// gets back an item index (or kStop), forks the item, and sends its result (kResult: the item
// index, then the JSON text) when the child finishes. Rank 0 never blocks: it polls its own
// children and MPI_Iprobe in one loop, answers requests from the queue of items the journal does
// not already hold, and journals each result as it lands. Children never call MPI; they only
// compute and _exit, which OpenMPI's shared-memory and TCP transports allow after fork(). Results
// and counterexamples travel as data, so nodes need no shared file system; rank 0 writes them.
#include "cli/verify_mpi.h"

#include "engine/errors.h"
#include "props/stopwatch.h"
#include "props/work_items.h"
#include "real/bootstrap.h"
#include "real/mpi_comm.h"

#include <fmt/format.h>
#include <mpi.h>

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>

namespace zc::cli {

namespace {

constexpr int kRequest = 101;
constexpr int kAssign = 102;
constexpr int kResult = 103;
constexpr long long kStop = -1;

void send_result(std::size_t item, const nlohmann::json& result) {
  const std::string text = result.dump();
  std::string msg(sizeof(std::uint64_t), '\0');
  const std::uint64_t i = item;
  std::memcpy(msg.data(), &i, sizeof i);
  msg += text;
  MPI_CHECK(MPI_Send(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, 0, kResult, MPI_COMM_WORLD));
}

std::pair<std::size_t, nlohmann::json> recv_result(const MPI_Status& probed) {
  int count = 0;
  MPI_CHECK(MPI_Get_count(&probed, MPI_CHAR, &count));
  std::string msg(static_cast<std::size_t>(count), '\0');
  MPI_CHECK(MPI_Recv(msg.data(), count, MPI_CHAR, probed.MPI_SOURCE, kResult, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  ZC_ASSERT(msg.size() >= sizeof(std::uint64_t), "a result message of {} bytes from rank {}", msg.size(), probed.MPI_SOURCE);
  std::uint64_t i = 0;
  std::memcpy(&i, msg.data(), sizeof i);
  return {static_cast<std::size_t>(i), nlohmann::json::parse(msg.substr(sizeof i))};
}

// A worker: ask for items while a child slot is free, run them, send each result to rank 0.
void serve(const props::Dispatch& d, int jobs, double item_timeout_s, int rank, const props::VerifyFaults& faults) {
  props::ChildPool pool(d.run, jobs, item_timeout_s);
  bool stopped = false;
  int finished = 0;
  while (!stopped || !pool.idle()) {
    while (!stopped && !pool.full()) {
      int ask = 0;
      MPI_CHECK(MPI_Send(&ask, 1, MPI_INT, 0, kRequest, MPI_COMM_WORLD));
      long long item = kStop;
      MPI_CHECK(MPI_Recv(&item, 1, MPI_LONG_LONG, 0, kAssign, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      if (item == kStop) {
        stopped = true;
      } else {
        pool.start(static_cast<std::size_t>(item));
      }
    }
    auto got = pool.reap(true);
    if (!got) continue;
    send_result(got->first, got->second);
    if (rank == faults.die_rank && ++finished >= faults.die_after) std::raise(SIGKILL);
  }
}

// Rank 0: its own children and every worker's requests and results, in one polling loop, until
// next() has said none, every item handed out has landed, and every worker has been stopped.
void coordinate(const props::Dispatch& d, int jobs, double item_timeout_s, int size) {
  props::ChildPool pool(d.run, jobs, item_timeout_s);
  std::optional<std::size_t> pending = d.next();  // the next item to hand out
  std::size_t outstanding = 0;                    // handed out, not landed
  int stops_sent = 0;
  auto take = [&] {
    const std::size_t i = *pending;
    pending = d.next();
    ++outstanding;
    return i;
  };
  while (pending || outstanding > 0 || stops_sent < size - 1) {
    bool busy = false;
    while (pending && !pool.full()) pool.start(take());
    if (auto got = pool.reap(false)) {
      --outstanding;
      d.land(got->first, got->second);
      busy = true;
    }
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st));
    if (flag != 0 && st.MPI_TAG == kRequest) {
      int ask = 0;
      MPI_CHECK(MPI_Recv(&ask, 1, MPI_INT, st.MPI_SOURCE, kRequest, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      long long item = kStop;
      if (pending) {
        item = static_cast<long long>(take());
      } else {
        ++stops_sent;
      }
      MPI_CHECK(MPI_Send(&item, 1, MPI_LONG_LONG, st.MPI_SOURCE, kAssign, MPI_COMM_WORLD));
      busy = true;
    } else if (flag != 0 && st.MPI_TAG == kResult) {
      const auto [i, r] = recv_result(st);
      --outstanding;
      d.land(i, r);
      busy = true;
    }
    if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

// mpirun or srun, not torchrun's variables alone (left in a shell, they must not turn a plain
// `zerocheck verify` into an MPI job).
bool verify_under_mpi() {
  const real::LaunchEnv env = real::detect_launch_env();
  const bool mpi_launcher = env.source.find("openmpi") != std::string::npos || env.source.find("slurm") != std::string::npos;
  return mpi_launcher && env.world > 1;
}

namespace {

// MPI for the length of one job: init (after the launcher check), the rank and size, finalize.
// Errors before the job starts are symmetric (every rank throws the same ConfigError); an error
// mid-job ends the whole job with MPI_Abort, since the other ranks wait on this one.
struct MpiJob {
  int rank = 0, size = 1;
  MpiJob() {
    const real::LaunchEnv env = real::detect_launch_env();  // before MPI_Init: fail fast on disagreement
    setenv("OMPI_MCA_mpi_warn_on_fork", "0", 0);  // the children never call MPI
    MPI_CHECK(MPI_Init(nullptr, nullptr));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    real::check_against_comm(env, rank, size);
  }
  ~MpiJob() { MPI_Finalize(); }
  MpiJob(const MpiJob&) = delete;
  MpiJob& operator=(const MpiJob&) = delete;

  void check_same(std::uint64_t fingerprint) const {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size));
    MPI_CHECK(MPI_Allgather(&fingerprint, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));
    for (int r = 0; r < size; ++r) {
      if (all[static_cast<std::size_t>(r)] != all[0]) {
        throw ConfigError(fmt::format("rank {} built other work items than rank 0 (fingerprint 0x{:016x} vs "
                                      "0x{:016x}; this is rank {}): every rank must run the same zerocheck binary "
                                      "with the same options", r, all[static_cast<std::size_t>(r)], all[0], rank));
      }
    }
  }
  // Rank 0's refusal (or "") reaches every rank, which all throw it.
  void agree(std::string refusal) const {
    int length = static_cast<int>(refusal.size());
    MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD));
    refusal.resize(static_cast<std::size_t>(length));
    MPI_CHECK(MPI_Bcast(refusal.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (!refusal.empty()) throw ConfigError(refusal);
  }
  template <class F>
  auto guarded(const std::filesystem::path& out, F&& body) const {
    try {
      return body();
    } catch (const std::exception& e) {
      fmt::print(stderr, "zerocheck verify (rank {}): {}; ending the MPI job (finished items are in {})\n", rank,
                 e.what(), out.string());
      MPI_Abort(MPI_COMM_WORLD, 2);
      throw;
    }
  }
};

}  // namespace

std::optional<props::VerifyReport> run_verify_mpi(const props::VerifyOptions& opts) {
  const MpiJob mpi;
  const props::Stopwatch watch;
  const props::VerifyJob job(opts);
  mpi.check_same(job.fingerprint());
  // Rank 0 opens the journal (a --resume of another job is refused), and every rank learns it.
  std::unique_ptr<props::Journal> journal;
  std::string refusal;
  if (mpi.rank == 0) {
    try {
      journal = std::make_unique<props::Journal>(opts.out, job, opts.resume);
    } catch (const ZcError& e) {
      refusal = e.what();
    }
  }
  mpi.agree(refusal);
  return mpi.guarded(opts.out, [&]() -> std::optional<props::VerifyReport> {
    if (mpi.rank != 0) {
      props::Dispatch d;
      d.run = [&job](std::size_t i, int attempt) { return job.run(i, attempt); };
      serve(d, opts.jobs, opts.item_timeout_s, mpi.rank, opts.faults);
      return std::nullopt;
    }
    props::Dispatch d = props::verify_dispatch(job, *journal, opts.progress);
    if (opts.faults.die_rank == 0) {  // the coordinator itself dies once it has journaled die_after items
      d.land = [land = d.land, &opts, landed = 0](std::size_t i, const nlohmann::json& r) mutable {
        land(i, r);
        if (++landed >= opts.faults.die_after) std::raise(SIGKILL);
      };
    }
    coordinate(d, opts.jobs, opts.item_timeout_s, mpi.size);
    std::vector<nlohmann::json> results(job.size());
    for (const auto& [i, r] : journal->finished()) results[i] = r;
    return job.merge(results, watch.seconds(), mpi.size);
  });
}

std::optional<props::SoakReport> run_soak_mpi(const props::SoakOptions& opts,
                                              const std::function<void(const props::SoakReport&)>& progress) {
  const MpiJob mpi;
  const props::Stopwatch watch;
  props::SoakJob job(opts);
  mpi.check_same(job.fingerprint());
  return mpi.guarded(opts.out, [&]() -> std::optional<props::SoakReport> {
    const props::Dispatch d = props::soak_dispatch(job, opts, watch, mpi.size, progress);
    if (mpi.rank != 0) {  // a worker only runs items (d.run); rank 0 hands them out and lands them
      serve(d, opts.jobs, props::ChildPool::kItemTimeoutS, mpi.rank, {});
      return std::nullopt;
    }
    coordinate(d, opts.jobs, props::ChildPool::kItemTimeoutS, mpi.size);
    const props::SoakReport r = job.report(watch.seconds(), mpi.size);
    props::write_soak(r, opts.out);
    return r;
  });
}

}  // namespace zc::cli
