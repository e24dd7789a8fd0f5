// What a `zerocheck verify` run found: invariants with their case counts and times, each known
// bug with how fast it was caught and its shrunk scenario, the Z3 proofs, the determinism
// self-check and the collective counts behind the report's plots. Plain data; the writers in
// reports/ turn it into report.md, report.html, results.json and junit.xml.
#pragma once

#include "props/proofs.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace zc::props {

struct InvariantResult {
  std::string name;         // "I1-coalesced-bit-exact", "sharded-parity", ...
  std::string explanation;  // one paragraph: what it checks and why it matters
  bool holds = true;
  int cases = 0;            // scenarios checked
  int discarded = 0;        // generated scenarios the invariant does not apply to
  double seconds = 0;
  // Set when it does not hold on the correct engine:
  std::string failure;          // the first diverging value, or the error
  nlohmann::json counterexample;  // the shrunk scenario (null when it holds)
  std::string scenario_file;    // where the counterexample was saved ("" when it holds)
  std::string reproduce;        // RapidCheck's reproduce string
  std::string ds_config_file;   // verify --config: the counterexample as a ds_config ("" otherwise)
  // verify --config: why the invariant does not apply to the user's config ("" when it does); such
  // an invariant ran no case and is reported n/a, not as holding.
  std::string not_applicable;
};

struct BugResult {
  std::string id;        // "B1"
  std::string summary;   // one line, from engine/known_bugs
  std::string expected_by;  // SPEC.md's "caught by" column
  bool caught = false;
  std::string by;        // the invariant that caught it ("" if none did)
  int cases_to_catch = 0;  // scenarios run before the first failure (the failing one included)
  double seconds = 0;      // until caught and shrunk
  int shrink_steps = 0;
  std::string failure;     // the shrunk counterexample's diverging value or error
  nlohmann::json scenario; // the shrunk scenario
  std::string scenario_file;
  std::string reproduce;
};

struct DeterminismResult {
  int runs = 0;
  int mismatches = 0;
  std::string detail;  // the first mismatch, if any
};

// Collectives issued per optimizer step, baseline (one reduction per backward) vs coalesced
// (one pass per step), for the report's plot.
struct CollectivePoint {
  int stage = 0;
  int n_backward = 0;
  double baseline = 0;
  double coalesced = 0;
};

struct VerifyReport {
  std::string profile;  // quick | default | thorough
  std::uint64_t seed = 0;
  int jobs = 1;         // work items at once per process
  int ranks = 1;        // MPI ranks the items were spread over (1: one process)
  double seconds = 0;   // wall time of the whole run
  std::string started;  // ISO 8601 UTC
  std::vector<InvariantResult> invariants;
  std::vector<BugResult> bugs;
  std::vector<ProofResult> proofs;
  DeterminismResult determinism;
  std::vector<CollectivePoint> collectives;
  std::vector<std::string> errors;  // work items that failed outright (a crash, an exception)
  // verify --against deepspeed: the DeepSpeed reference's campaigns (props/reference.h,
  // run_reference_campaigns; docs/deepspeed-reference.md: the `reference` object). Null when not run.
  nlohmann::json reference;
  // verify --config: {"path", "pinned" (the scenario fields the config decides), "not_checked",
  // "warnings"}. Null otherwise.
  nlohmann::json user_config;

  // No work item failed, every invariant holds, every known bug is caught, every proof gives its expected verdict,
  // the determinism check found no mismatch, and the DeepSpeed reference (when run) holds.
  bool passed() const;
};

nlohmann::json to_json(const VerifyReport& r);
VerifyReport report_from_json(const nlohmann::json& j);

}  // namespace zc::props
