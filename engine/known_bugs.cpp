// The known-bug table and BugSet's text form.
#include "engine/known_bugs.h"

#include "engine/errors.h"

namespace zc {

const std::vector<KnownBugInfo>& known_bugs() {
  static const std::vector<KnownBugInfo> table = {
      {KnownBug::B1_autosp_backward_gate, "B1",
       "AutoSP backward gate `deepcompile_active and not autotp` loads the DeepCompile runtime", "I3"},
      {KnownBug::B2_destroy_cleanup_gate, "B2",
       "destroy() calls runtime cleanup under deepcompile_active alone", "I3"},
      {KnownBug::B3_offload_copy_gate, "B3",
       "CPU-offload copy gate `GA > 1` drops backward chunks 1..N-1 at GA = 1", "I1, parity"},
      {KnownBug::B4_z3_seen_flag_while_coalescing, "B4",
       "ZeRO-3 seen-flag set while coalescing: micro_step_id != 0 at flush, stale add", "I2, I1"},
      {KnownBug::B5_copy_drops_owner, "B5", "module copy drops the ParamDict owner", "I4"},
      {KnownBug::B6_fake_param_status, "B6",
       "ParamDict reads ds_status of a fake param while tracing", "I4"},
      {KnownBug::B7_flush_with_coalescing_set, "B7",
       "coalesce flush runs with coalescing still set (flag cleared after, not before)", "I1"},
      {KnownBug::B8_allreduce_gate_parallel_passes, "B8",
       "allreduce_gradients gate misses parallelization-only passes (AutoSP grads never reduced)",
       "parity, cross-rank consistency"},
  };
  return table;
}

const KnownBugInfo& known_bug_info(KnownBug b) {
  for (const KnownBugInfo& info : known_bugs()) {
    if (info.id == b) return info;
  }
  ZC_ASSERT(false, "known bug {} has no table entry", static_cast<int>(b));
  return known_bugs().front();
}

std::string BugSet::str() const {
  std::string out;
  for (const KnownBugInfo& info : known_bugs()) {
    if (!has(info.id)) continue;
    if (!out.empty()) out += ",";
    out += info.code;
  }
  return out.empty() ? "none" : out;
}

BugSet BugSet::parse(std::string_view codes) {
  BugSet set;
  if (codes.empty() || codes == "none") return set;
  std::size_t at = 0;
  while (at <= codes.size()) {
    const std::size_t comma = std::min(codes.find(',', at), codes.size());
    const std::string_view code = codes.substr(at, comma - at);
    bool found = false;
    for (const KnownBugInfo& info : known_bugs()) {
      if (info.code == code) {
        set.set(info.id);
        found = true;
      }
    }
    if (!found) {
      throw ConfigError(fmt::format("unknown known-bug code '{}': use B1..B{}", code,
                                    kKnownBugCount));
    }
    at = comma + 1;
  }
  return set;
}

}  // namespace zc
