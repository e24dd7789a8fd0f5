// The verify job: every invariant over generated scenarios on the correct engine, then every
// known bug switched on against the suite (caught, shrunk, saved, replayed), the Z3 proofs, the
// determinism self-check and the collective counts for the report. Work items run in forked
// child processes (--jobs at a time), so a crash in one is reported, never fatal, and two cores
// give two items at once.
#pragma once

#include "props/invariants.h"
#include "props/verify_report.h"

#include <filesystem>
#include <functional>
#include <optional>

namespace zc::props {

struct Profile {
  std::string name;
  int cases = 300;        // scenarios per invariant on the correct engine
  int bug_cases = 300;    // scenarios per invariant while hunting one known bug
  unsigned proof_timeout_ms = 240000;  // per proof; the f32 exact-domain lemma takes 30-50 s on 2 cores
};
// quick | default | thorough; ConfigError for anything else.
Profile profile_named(const std::string& name);

struct VerifyOptions {
  Profile profile = profile_named("default");
  std::uint64_t seed = 20261129;
  std::filesystem::path out = "reports/out";
  int jobs = 1;
  std::vector<std::string> only;  // invariant names (and bug campaigns through them); empty = all
  std::vector<std::string> bugs;  // known bugs to hunt ("B3"); empty = all
  bool proofs = true;
  bool engine_items = true;       // the invariants, bug hunts and collective counts (false: --only deepspeed)
  int deepspeed_cases = 0;        // > 0: also run the DeepSpeed reference campaigns (--against deepspeed)
  RunHooks hooks;
  std::string started;  // the wall-clock start for the report (the caller's clock; ISO 8601 UTC)
  // Called as work items finish: (finished item, done, total).
  std::function<void(const std::string&, int, int)> progress;
};

VerifyReport run_verify(const VerifyOptions& opts);

// One RapidCheck campaign of an invariant: `cases` scenarios, or until one fails; the failure is
// shrunk. With `reproduce` (RapidCheck's reproduce string) it reruns exactly that case.
struct Campaign {
  bool failed = false;
  int cases = 0;       // scenarios run before the first failure (it included), or all
  int discarded = 0;
  double seconds = 0;
  int shrink_steps = 0;
  Scenario counterexample;  // shrunk
  Verdict verdict;          // of the shrunk counterexample
  std::string reproduce;
  std::string error;        // RapidCheck gave up or errored
};
Campaign run_campaign(const Invariant& inv, const CheckContext& ctx, int cases, std::uint64_t seed,
                      const std::string& reproduce = "");

// A saved counterexample: the scenario, the invariant, the bugs switched on, the verdict and
// trace hash it gave, and RapidCheck's reproduce string.
struct SavedCase {
  Scenario scenario;
  std::string invariant;
  BugSet bugs;
  bool holds = false;
  std::uint64_t trace_hash = 0;
  std::string failure;
  std::string reproduce;
  std::uint64_t rc_seed = 0;
};
nlohmann::json to_json(const SavedCase& c);
SavedCase saved_case_from_json(const nlohmann::json& j);
void save_case(const SavedCase& c, const std::filesystem::path& file);
SavedCase load_case(const std::filesystem::path& file);

}  // namespace zc::props
