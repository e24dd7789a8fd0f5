// `zerocheck verify-real --backend host`: MPI processes run the engine; every rank also runs the
// same scenario on the simulator and compares its params and grads bit for bit; ranks compare
// hashes of what they hold. Rank 0 writes results.json and report.md; exit 1 on any mismatch.
#include "cli/verify_real.h"

#include "engine/errors.h"
#include "engine/host_device.h"
#include "props/scenarios.h"
#include "real/bootstrap.h"
#include "real/mpi_comm.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace zc::cli {

namespace {

std::uint64_t hash_values(const std::vector<std::vector<double>>& steps) {
  std::uint64_t h = 0;
  for (const auto& v : steps) h = mix64(h, hash_data(v.data(), v.size() * sizeof(double)));
  return h;
}

struct Outcome {
  std::string description;
  std::string sim_mismatch;  // "" when bit-identical
  bool ranks_agree = true;
  double seconds = 0;
};

Outcome check_scenario(const props::NamedSpec& ns, real::MpiComm& world) {
  Outcome o;
  o.description = ns.description;
  const auto t0 = std::chrono::steady_clock::now();
  HostDevice dev;
  const props::RankRecord got = props::train_rank(ns.spec, world.rank(), dev, world, nullptr);
  const props::RunResult sim = props::run_on_sim(ns.spec);
  for (std::size_t s = 0; s < sim.params.size() && o.sim_mismatch.empty(); ++s) {
    std::string d = props::first_difference(got.params[s], sim.params[s], DType::f64);
    if (d.empty()) d = props::first_difference(got.grads[s], sim.grads[s], DType::f64);
    if (d.empty() && world.rank() == 0) d = props::first_difference(got.masters[s], sim.masters[s], DType::f32);
    if (!d.empty()) o.sim_mismatch = fmt::format("rank {} step {}: {}", world.rank(), s, d);
  }
  // Cross-rank agreement: every rank's hash of its params and grads, min == max over the world.
  const std::uint64_t h = mix64(hash_values(got.params), hash_values(got.grads));
  Tensor lo = tensor_from_f64(dev, DType::f64, {2}, std::vector<double>{static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)});
  Tensor hi = tensor_from_f64(dev, DType::f64, {2}, std::vector<double>{static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)});
  world.all_reduce(lo, {.op = ReduceOp::min});
  world.all_reduce(hi, {.op = ReduceOp::max});
  o.ranks_agree = to_f64(dev, lo) == to_f64(dev, hi);
  Tensor bad = tensor_from_f64(dev, DType::f64, {1}, std::vector<double>{o.sim_mismatch.empty() ? 0.0 : 1.0});
  world.all_reduce(bad, {.op = ReduceOp::max});
  if (o.sim_mismatch.empty() && to_f64(dev, bad)[0] != 0.0) o.sim_mismatch = "another rank differs from the simulator";
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

void write_reports(const VerifyRealOptions& opts, int world, const std::vector<Outcome>& outcomes) {
  std::filesystem::create_directories(opts.out);
  nlohmann::json j;
  j["backend"] = opts.backend;
  j["world"] = world;
  j["seed"] = opts.seed;
  int failed = 0;
  std::string md = fmt::format("# zerocheck verify-real\n\nbackend `{}`, {} MPI processes, seed {}\n\n"
                               "| # | scenario | matches simulator | ranks agree | seconds |\n|---|---|---|---|---|\n",
                               opts.backend, world, opts.seed);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
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

}  // namespace

int run_verify_real(int argc, char** argv, const VerifyRealOptions& opts) {
  if (opts.backend != "host") {
    throw NotImplementedError(fmt::format("--backend {}: the CUDA + NCCL backend is not built yet "
                                          "(issue 'Real backend on GPUs'); use --backend host", opts.backend));
  }
  const real::LaunchEnv env = real::detect_launch_env();  // before MPI_Init: fail fast on disagreement
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    real::MpiComm world(MPI_COMM_WORLD, false, "world", std::chrono::milliseconds(opts.timeout_s * 1000));
    real::check_against_comm(env, world.rank(), world.size());
    std::vector<Outcome> outcomes;
    for (const props::NamedSpec& ns : props::real_backend_scenarios(world.size(), opts.seed, opts.scenarios)) {
      outcomes.push_back(check_scenario(ns, world));
      if (world.rank() == 0) {
        fmt::print("[{}/{}] {} ... {}\n", outcomes.size(), opts.scenarios, ns.description,
                   outcomes.back().sim_mismatch.empty() && outcomes.back().ranks_agree ? "ok" : "MISMATCH");
        std::fflush(stdout);
      }
    }
    for (const Outcome& o : outcomes) rc |= !(o.sim_mismatch.empty() && o.ranks_agree);
    if (world.rank() == 0) write_reports(opts, world.size(), outcomes);
  } catch (const ZcError& e) {
    fmt::print(stderr, "zerocheck verify-real: {}\n", e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace zc::cli
