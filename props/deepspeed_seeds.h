// The seeds' invariants on DeepSpeed alone (reference/deepspeed/seed_checks.py), for any DeepSpeed
// the reference runs (props/deepspeed_target.h), and the release bisect over them. A verdict is
// DeepSpeed's behaviour only: no comparison with zerocheck's simulator. Randomized invariants are
// RapidCheck properties over the probe's scenario (stage, offload, GA, backward count, steps,
// flags, bucket, data seed): a failure is shrunk by RapidCheck and saved with its reproduce string
// and a one-line replay (`zerocheck replay FILE`).
#pragma once

#include "props/reference_pool.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace zc::props {

enum class SeedVerdict : std::uint8_t { holds, fails, not_applicable, not_runnable };
const char* to_string(SeedVerdict v);

// One scenario of a seed probe; args() is what the probe receives.
struct SeedCase {
  int stage = 0;
  bool offload = false;
  int ga = 1;
  int n = 1;
  int steps = 1;
  bool contiguous = true;
  bool overlap = false;
  std::int64_t bucket = 500000000;
  int seed = 0;
  std::string passes;  // I3: "autosp" | "autotp"
  int world = 0;       // 0: the invariant's own world
  nlohmann::json args() const;
  static SeedCase from_args(const nlohmann::json& j);
  bool operator==(const SeedCase&) const = default;
};

struct SeedInvariant {
  std::string id;     // "I1" ... "MB"
  std::string name;   // "I1-coalesced-bit-exact", ...
  std::string probe;  // seed_checks.py's probe
  std::string what;   // one line
  std::string seed_doc;  // the seed it comes from
  int world = 2;  // the fixed cases' world; a campaign draws 1 or 2
  // Fixed cases (run in order, each once) or, when empty, a RapidCheck campaign over these ranges.
  std::vector<SeedCase> fixed;
  int min_stage = 0, max_stage = 3;
};

const std::vector<SeedInvariant>& seed_invariants();
// By id ("I4", case-insensitive) or name; ConfigError listing them when none matches.
const SeedInvariant& find_seed_invariant(const std::string& name);

struct SeedResult {
  std::string target;     // the DeepSpeed ("deepspeed==0.15.1", ...)
  std::string invariant;  // SeedInvariant::name
  SeedVerdict verdict = SeedVerdict::holds;
  std::string summary;    // the failing case's or the n/a reason's one line
  int cases = 0;
  int shrink_steps = 0;
  double seconds = 0;
  std::optional<SeedCase> counterexample;
  std::string reproduce;  // RapidCheck's reproduce string of the counterexample
  std::string saved;      // the counterexample file
  nlohmann::json to_json() const;
};

// One case on DeepSpeed.
SeedResult check_seed_case(ReferencePools& pools, const SeedInvariant& inv, const SeedCase& c,
                           const std::filesystem::path& scratch);
// The invariant over `cases` cases from `seed` (fixed cases: all of them); a failure is shrunk and
// saved under out/ (created) as <invariant>.json.
SeedResult check_seed_invariant(ReferencePools& pools, const SeedInvariant& inv, int cases, std::uint64_t seed,
                                const std::filesystem::path& out);

// Note [Release bisect]: the releases are assumed to fall into not applicable, then fails, then
// holds (the feature appears, is broken, is fixed). first_good is found by bisection on "holds",
// evaluating each release at most once; a release that is not runnable is stepped over to its
// nearest runnable neighbour. last_bad is the release just before first_good when it fails. The
// boundary's neighbours (one each side, when they exist) are evaluated too, and `monotone` is false
// with a note when any evaluated release contradicts the assumed order.
struct Bisection {
  std::string invariant;
  std::optional<std::string> last_bad, first_good;
  std::map<std::string, SeedResult> verdicts;  // every release evaluated
  std::vector<std::string> order;              // in the order they were evaluated
  bool monotone = true;
  std::string note;
  nlohmann::json to_json() const;
};
// every_release: evaluate them all first (the matrix), so that a history with several boundaries
// (fixed, broken again, fixed again) is seen and reported as not monotone.
Bisection bisect_releases(const std::string& invariant, const std::vector<std::string>& releases,
                          const std::function<SeedResult(const std::string&)>& verdict_of, bool every_release = false);

}  // namespace zc::props
