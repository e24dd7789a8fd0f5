// zerocheck's command line (CLI11). Subcommands that exist today: demo, run, verify-real, prove.
// verify and replay arrive with their issue; until then CLI11 rejects them by name.
#include "cli/demo.h"
#include "cli/prove.h"
#include "cli/run.h"
#include "cli/verify_real.h"
#include "engine/errors.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

int main(int argc, char** argv) {
  CLI::App app{"zerocheck: a ZeRO engine, a deterministic simulated cluster and a verifier"};
  app.require_subcommand(1);

  zc::cli::DemoOptions demo;
  std::string order = "linear";
  CLI::App* demo_cmd = app.add_subcommand("demo", "Run the simulated cluster's demo");
  demo_cmd->add_option("--world-size", demo.world_size, "Ranks")->check(CLI::Range(1, 8192));
  demo_cmd->add_option("--seed", demo.seed, "Root seed");
  demo_cmd->add_option("--shard-numel", demo.shard_numel, "Elements per rank's shard")
      ->check(CLI::Range(1, 1 << 24));
  demo_cmd->add_option("--order", order, "Reduction order")
      ->check(CLI::IsMember({"linear", "ring"}));

  zc::cli::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Train a model on the simulated cluster with a ds_config.json");
  run_cmd->add_option("--config", run.config_path, "DeepSpeed ds_config.json")->required()->check(CLI::ExistingFile);
  run_cmd->add_option("--model", run.model, "simple | mlp | synthetic")
      ->check(CLI::IsMember({"simple", "mlp", "synthetic"}));
  run_cmd->add_option("--world-size", run.world_size, "Simulated ranks")->check(CLI::Range(1, 8192));
  run_cmd->add_option("--steps", run.steps, "Optimizer steps")->check(CLI::Range(1, 100000));
  run_cmd->add_option("--hidden", run.hidden, "Hidden size")->check(CLI::Range(1, 1 << 14));
  run_cmd->add_option("--layers", run.layers, "Linear layers")->check(CLI::Range(1, 64));
  run_cmd->add_option("--micro-batch", run.micro_batch, "Override train_micro_batch_size_per_gpu");
  run_cmd->add_option("--seed", run.seed, "Root seed");
  run_cmd->add_option("--domain", run.domain, "gaussian | exact")->check(CLI::IsMember({"gaussian", "exact"}));

  zc::cli::VerifyRealOptions vr;
  CLI::App* vr_cmd = app.add_subcommand("verify-real", "Run seeded scenarios on MPI processes (under mpirun) and compare with the simulator");
  vr_cmd->add_option("--backend", vr.backend, "host (MPI on CPUs) | cuda (not built yet)")->check(CLI::IsMember({"host", "cuda"}));
  vr_cmd->add_option("--scenarios", vr.scenarios, "Number of seeded scenarios")->check(CLI::Range(1, 10000));
  vr_cmd->add_option("--seed", vr.seed, "Scenario seed");
  vr_cmd->add_option("--out", vr.out, "Report directory (rank 0 writes results.json and report.md)");
  vr_cmd->add_option("--timeout-s", vr.timeout_s, "Seconds a collective may take before the job ends")->check(CLI::Range(1, 86400));

  unsigned prove_timeout_s = 60;
  CLI::App* prove_cmd = app.add_subcommand("prove", "Run the Z3 proofs over the engine's decisions and arithmetic");
  prove_cmd->add_option("--timeout-s", prove_timeout_s, "Per-proof solver timeout")->check(CLI::Range(1, 3600));

  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) {
      demo.ring = order == "ring";
      return zc::cli::run_demo(demo);
    }
    if (run_cmd->parsed()) return zc::cli::run_training(run);
    if (vr_cmd->parsed()) return zc::cli::run_verify_real(argc, argv, vr);
    if (prove_cmd->parsed()) return zc::cli::run_prove(prove_timeout_s * 1000);
  } catch (const zc::ZcError& e) {
    fmt::print(stderr, "zerocheck: {}\n", e.what());
    return 2;
  }
  return 0;
}
