// `zerocheck verify-real --backend host|cuda`: MPI processes run the engine (HostDevice + MpiComm,
// or one GPU per process with CudaDevice + NcclComm); every rank also runs the same scenario on the
// simulator and compares its params and grads bit for bit; ranks compare hashes of what they hold.
// Rank 0 writes results.json and report.md; exit 1 on any mismatch.
#include "cli/verify_real.h"

#include "engine/errors.h"
#include "engine/host_device.h"
#include "props/scenarios.h"
#include "real/bootstrap.h"
#include "real/mpi_comm.h"
#ifdef ZC_HAVE_CUDA
#include "real/cuda_device.h"
#include "real/nccl_comm.h"
#endif

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace zc::cli {

namespace {

void write_reports(const VerifyRealOptions& opts, int world, const std::string& device,
                   const std::vector<props::BackendOutcome>& outcomes) {
  std::filesystem::create_directories(opts.out);
  nlohmann::json j;
  j["backend"] = opts.backend;
  j["device"] = device;
  j["world"] = world;
  j["seed"] = opts.seed;
  int failed = 0;
  std::string md = fmt::format("# zerocheck verify-real\n\nbackend `{}` on {}, {} MPI processes, seed {}\n\n"
                               "| # | scenario | matches simulator | ranks agree | seconds |\n|---|---|---|---|---|\n",
                               opts.backend, device, world, opts.seed);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const props::BackendOutcome& o = outcomes[i];
    const bool ok = o.sim_mismatch.empty() && o.ranks_agree;
    failed += !ok;
    j["scenarios"].push_back({{"id", i}, {"description", o.description}, {"matches_simulator", o.sim_mismatch.empty()},
                              {"ranks_agree", o.ranks_agree}, {"detail", o.sim_mismatch}, {"seconds", o.seconds}});
    md += fmt::format("| {} | {} | {} | {} | {:.2f} |\n", i, o.description,
                      o.sim_mismatch.empty() ? "yes" : "NO: " + o.sim_mismatch, o.ranks_agree ? "yes" : "NO", o.seconds);
  }
  j["passed"] = static_cast<int>(outcomes.size()) - failed;
  j["failed"] = failed;
  std::ofstream(opts.out + "/results.json") << j.dump(2) << "\n";
  std::ofstream(opts.out + "/report.md") << md;
  fmt::print("{}\n{} passed, {} failed\n", md, static_cast<int>(outcomes.size()) - failed, failed);
}

// The engine's device and communicator for this rank: the host and MPI, or this rank's GPU and NCCL.
struct Backend {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Comm> nccl;  // null for the host backend
  Comm* engine = nullptr;
};

// `world` is null for a single process started without a launcher (--backend cuda only).
Backend make_backend(const VerifyRealOptions& opts, const real::LaunchEnv& env, real::MpiComm* world) {
  Backend b;
  if (opts.backend == "host") {
    b.dev = std::make_unique<HostDevice>();
    b.engine = world;
    return b;
  }
#ifdef ZC_HAVE_CUDA
  real::GpuRank gpu;
  try {
    gpu = real::open_gpu_rank(env, world, std::chrono::milliseconds(opts.timeout_s * 1000));
  } catch (const BackendError& e) {
    throw BackendError(fmt::format("--backend cuda: {}; run on a GPU machine or use --backend host", e.what()));
  }
  b.engine = gpu.comm.get();
  b.nccl = std::move(gpu.comm);  // declared after dev: destroyed first
  b.dev = std::move(gpu.dev);
  return b;
#else
  (void)env;
  (void)world;
  throw NotImplementedError(
      "--backend cuda: this zerocheck was built without the GPU backend (CMake found no nvcc or nccl.h "
      "under /usr/local/cuda; the configure log's 'zerocheck GPU backend' line says which); rebuild on a "
      "machine with CUDA and NCCL, or use --backend host");
#endif
}

std::vector<props::BackendOutcome> run_scenarios(const VerifyRealOptions& opts, Backend& backend, int world_size,
                                                 int rank, Comm* host_world) {
  std::vector<props::BackendOutcome> outcomes;
  for (const props::NamedSpec& ns : props::real_backend_scenarios(world_size, opts.seed, opts.scenarios)) {
    outcomes.push_back(props::check_on_backend(ns, *backend.dev, *backend.engine, host_world));
    if (rank == 0) {
      fmt::print("[{}/{}] {} ... {}\n", outcomes.size(), opts.scenarios, ns.description,
                 outcomes.back().sim_mismatch.empty() && outcomes.back().ranks_agree ? "ok" : "MISMATCH");
      std::fflush(stdout);
    }
  }
  return outcomes;
}

int exit_code(const std::vector<props::BackendOutcome>& outcomes) {
  int rc = 0;
  for (const props::BackendOutcome& o : outcomes) rc |= !(o.sim_mismatch.empty() && o.ranks_agree);
  return rc;
}

}  // namespace

int run_verify_real(int argc, char** argv, const VerifyRealOptions& opts) {
  const real::LaunchEnv env = real::detect_launch_env();  // before MPI_Init: fail fast on disagreement
  if (opts.backend == "cuda" && env.source == "none") {
    // One process on one GPU, started without mpirun: no MPI at all (a bare GPU machine need not
    // have it); NCCL runs as a one-rank communicator.
    try {
      Backend backend = make_backend(opts, env, nullptr);
      const std::vector<props::BackendOutcome> outcomes = run_scenarios(opts, backend, 1, 0, nullptr);
      write_reports(opts, 1, backend.dev->name(), outcomes);
      return exit_code(outcomes);
    } catch (const ZcError& e) {
      fmt::print(stderr, "zerocheck verify-real: {}\n", e.what());
      return 2;
    }
  }
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    real::MpiComm world(MPI_COMM_WORLD, false, "world", std::chrono::milliseconds(opts.timeout_s * 1000));
    real::check_against_comm(env, world.rank(), world.size());
    Backend backend = make_backend(opts, env, &world);
    const std::vector<props::BackendOutcome> outcomes = run_scenarios(opts, backend, world.size(), world.rank(), &world);
    rc = exit_code(outcomes);
    if (world.rank() == 0) write_reports(opts, world.size(), backend.dev->name(), outcomes);
  } catch (const ZcError& e) {
    fmt::print(stderr, "zerocheck verify-real: {}\n", e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace zc::cli
