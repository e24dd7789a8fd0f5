// Fuzz target: scenario_from_json, the verifier's scenario files. Oracles: an accepted scenario
// round-trips through to_json unchanged, and what the verifier derives from it before running
// (describe, ds_config, the exact-domain sizing, the Config that ds_config parses to) either
// works or refuses with a ZcError.
#include "engine/config.h"
#include "fuzz/fuzz_common.h"
#include "props/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::optional<nlohmann::json> j = zc::fuzz::parse_json(data, size);
  if (!j) return 0;
  return zc::fuzz::run_contract([&] {
    const zc::props::Scenario s = zc::props::scenario_from_json(*j);
    const nlohmann::json again = zc::props::to_json(s);
    zc::fuzz::check(zc::props::scenario_from_json(again) == s,
                    "scenario changed in a round trip: " + again.dump());
    (void)zc::props::describe(s);
    (void)zc::props::exact_infeasible(s);
    (void)zc::Config::from_json(zc::props::ds_config(s), s.world);
  });
}
