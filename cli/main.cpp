// zerocheck's command line (CLI11). Subcommands that exist today: demo. verify, replay, run,
// prove and verify-real arrive with their issues; until then CLI11 rejects them by name.
#include "cli/demo.h"
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

  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) {
      demo.ring = order == "ring";
      return zc::cli::run_demo(demo);
    }
  } catch (const zc::ZcError& e) {
    fmt::print(stderr, "zerocheck: {}\n", e.what());
    return 2;
  }
  return 0;
}
