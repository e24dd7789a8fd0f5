// The seeds' invariants on any DeepSpeed (`verify --against deepspeed==X.Y.Z | deepspeed@DIR`), the
// release bisect (`bisect`), and the replay of a seed counterexample.
#pragma once

#include "cli/verify.h"

#include <filesystem>
#include <string>

namespace zc::cli {

// verify against a release or tree: every seed invariant (or those --only names, by id or name),
// a table on stdout and <out>/deepspeed-seeds.json. 0 when every one holds or is not applicable.
int run_verify_deepspeed_target(const VerifyCliOptions& o);

struct BisectOptions {
  std::string against = "deepspeed";
  std::string invariant;
  std::string releases;  // "A..B" (either side may be empty); default 0.14.0..newest
  bool json = false;
  bool all = false;      // every release in the range (the matrix), not a bisection
  int cases = 6;         // per release, for the randomized invariants
  std::uint64_t seed = 20261129;
  std::string out = "reports/bisect";
};
int run_bisect(const BisectOptions& o);

// A file with "deepspeed_seed": rerun its case on its DeepSpeed (on `target` instead, when not
// empty). False when the file is not one.
bool replay_seed_case(const std::filesystem::path& file, int& exit_code, const std::string& target = "");

}  // namespace zc::cli
