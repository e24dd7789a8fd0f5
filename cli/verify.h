// `zerocheck verify` (the main job) and `zerocheck replay FILE`.
#pragma once

#include "cli/hf_options.h"

#include <cstdint>
#include <string>
#include <vector>

namespace zc::cli {

struct VerifyCliOptions {
  std::string profile = "default";
  std::uint64_t seed = 20261129;
  std::string out = "reports/out";
  int jobs = 0;  // 0 = one per core
  std::vector<std::string> only;
  std::vector<std::string> bugs;
  bool no_proofs = false;
  std::string against;        // "deepspeed": also run the DeepSpeed reference campaigns
  int deepspeed_cases = 100;  // scenarios the comparison draws
  int seed_cases = 6;         // --against a release or tree: cases per randomized seed invariant
  std::string deepspeed_i3 = "all";  // I3 on DeepSpeed: all | off | the probe's runs ("autosp:0,autotp:0")
  std::string resume;         // a directory of an interrupted run: finish it (its journal.jsonl)
  std::string budget;         // "10m", "90s", "8h": a soak run of that long instead of the profile
  bool out_given = false;     // --out was on the command line
  double item_timeout_s = 7200;  // a work item still running after this is killed and reported
  std::string config;         // --config: the invariants around this ds_config (props/user_config.h)
  HfCliArgs hf;               // with --config: the Trainer's options and the client optimizer
};
int run_verify_cli(const VerifyCliOptions& o);

struct ReplayOptions {
  std::string file;
  std::string trace;  // Chrome/Perfetto timeline of the run ("" = none)
  bool rapidcheck = false;  // also rerun through RapidCheck's reproduce string
  // "deepspeed", "deepspeed==X.Y.Z" or "deepspeed@DIR": also run the scenario on that DeepSpeed
  // (Note [A counterexample on DeepSpeed]); a DeepSpeed counterexample reruns on it instead of its own.
  std::string against;
};
int run_replay(const ReplayOptions& o);

}  // namespace zc::cli
