// The historical defects of the systems zerocheck models (SPEC.md section 9), each switchable back
// on per engine through Options::bugs. Never a global: two engines in one process can differ.
// Each switch guards one small branch at the place where the bug lived; grep for its enumerator.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zc {

enum class KnownBug : std::uint8_t {
  B1_autosp_backward_gate = 1,     // DeepCompile hooks gated on `active and not autotp`
  B2_destroy_cleanup_gate,         // destroy() cleans up the runtime under deepcompile_active alone
  B3_offload_copy_gate,            // CPU-offload accumulate gated on GA > 1: drops chunks at GA = 1
  B4_z3_seen_flag_while_coalescing,  // ZeRO-3 backward-seen flag set while coalescing
  B5_copy_drops_owner,             // module copy loses the ParamDict owner
  B6_fake_param_status,            // ParamDict reads ds_status of a fake param while tracing
  B7_flush_with_coalescing_set,    // coalesce flush runs before the coalescing flag is cleared
  B8_allreduce_gate_parallel_passes,  // allreduce gate misses parallelization-only passes
};
inline constexpr int kKnownBugCount = 8;

struct KnownBugInfo {
  KnownBug id;
  std::string_view code;      // "B1"
  std::string_view summary;   // one line
  std::string_view caught_by; // the invariant(s) that must catch it
};

const std::vector<KnownBugInfo>& known_bugs();
const KnownBugInfo& known_bug_info(KnownBug b);

// The set switched on for one engine.
class BugSet {
 public:
  BugSet() = default;
  BugSet(std::initializer_list<KnownBug> bugs) {
    for (KnownBug b : bugs) set(b);
  }
  bool has(KnownBug b) const { return bits_.test(static_cast<std::size_t>(b)); }
  void set(KnownBug b, bool on = true) { bits_.set(static_cast<std::size_t>(b), on); }
  bool none() const { return bits_.none(); }
  std::string str() const;  // "B3,B7" or "none"
  // "B3,B7" -> set; throws ConfigError naming an unknown code.
  static BugSet parse(std::string_view codes);
  bool operator==(const BugSet&) const = default;

 private:
  std::bitset<16> bits_;
};

}  // namespace zc
