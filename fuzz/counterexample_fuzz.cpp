// Fuzz target: saved_case_from_json, the counterexample files `zerocheck replay` reads. Oracle: an
// accepted file round-trips through to_json with every field unchanged.
#include "fuzz/fuzz_common.h"
#include "props/verify.h"

namespace {

bool same(const zc::props::SavedCase& a, const zc::props::SavedCase& b) {
  return a.scenario == b.scenario && a.invariant == b.invariant && a.bugs == b.bugs &&
         a.holds == b.holds && a.trace_hash == b.trace_hash && a.failure == b.failure &&
         a.reproduce == b.reproduce && a.rc_seed == b.rc_seed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::optional<nlohmann::json> j = zc::fuzz::parse_json(data, size);
  if (!j) return 0;
  return zc::fuzz::run_contract([&] {
    const zc::props::SavedCase c = zc::props::saved_case_from_json(*j);
    const nlohmann::json again = zc::props::to_json(c);
    zc::fuzz::check(same(zc::props::saved_case_from_json(again), c),
                    "counterexample changed in a round trip: " + again.dump());
  });
}
