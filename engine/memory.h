// Memory accounting: every allocation a Device makes carries a category, and each Device keeps a
// MemoryLedger of live bytes and high-water marks per category and in total, with the composition
// at the total's peak and (when enabled) a bounded timeline. Invariants: live bytes never go
// negative; the peak of the total is at least the sum of the categories' live bytes at any event;
// the composition at the peak sums to the peak.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zc {

// What an allocation is for, in DeepSpeed's vocabulary. The engine and the models name one at
// every alloc site (a tidy test enforces it); `unattributed` is for tests and tools only.
enum class MemCategory : std::uint8_t {
  params,            // model params in the model dtype (16-bit under mixed precision), ZeRO-3 shards
  grads,             // .grad, accumulators, averaged_gradients, grad partitions
  master,            // fp32 master params
  optimizer_states,  // exp_avg, exp_avg_sq, momentum buffers
  ipg_buckets,       // the ipg buffers gradients are reduced from (and stage 0's allreduce bucket)
  comm_buffers,      // reduce-scatter / reduce / all-gather staging buffers
  gathered_params,   // ZeRO-3 full params all-gathered for the module in use
  prefetch,          // ZeRO-3 full params all-gathered ahead of their module
  persistent,        // ZeRO-3 params kept whole (stage3_param_persistence_threshold)
  activations,       // what forward keeps for backward, and backward's activation grads
  temporaries,       // short-lived: casts, flags, norms, a weight's grad before accumulation
  unattributed,      // tests and tools
};
inline constexpr std::size_t kMemCategories = 12;
std::string_view mem_category_name(MemCategory c);  // "params", "grads", ...
// Throws UsageError naming the unknown name and the known ones.
MemCategory parse_mem_category(std::string_view name);

using MemBytes = std::array<std::int64_t, kMemCategories>;
std::int64_t mem_total(const MemBytes& b);

// One point of a ledger's timeline: after allocation/free #event, the live bytes per category.
struct MemSample {
  std::int64_t event = 0;
  MemBytes live{};
  std::string label;  // the allocation that moved it ("" for a free)
};

// One training step's memory on a device, as reference/deepspeed/gpu_memory.py reads torch's: the
// peak within the step, and the live bytes after its first forward and after its optimizer step.
struct StepMemory {
  std::int64_t peak = 0, after_forward = 0, after_step = 0;
};

class MemoryLedger {
 public:
  void on_alloc(MemCategory c, std::int64_t bytes, const std::string& label);
  void on_free(MemCategory c, std::int64_t bytes);

  const MemBytes& live() const { return live_; }
  std::int64_t live_total() const { return live_total_; }
  // Each category's own high-water mark (they need not peak together).
  const MemBytes& peak() const { return peak_; }
  std::int64_t peak_total() const { return peak_total_; }
  // The live bytes per category when the total last reached peak_total(), and what allocation
  // brought it there.
  const MemBytes& at_peak() const { return at_peak_; }
  const std::string& peak_label() const { return peak_label_; }
  std::int64_t events() const { return events_; }
  std::int64_t allocations() const { return allocations_; }

  // Starts a new high-water mark from the live bytes now (e.g. after construction, so that a
  // step's peak is the step's own).
  void reset_peak();
  // A second high-water mark of the total, restarted on its own (one step's peak, as torch's
  // reset_peak_memory_stats before each step), leaving peak_total() alone.
  void reset_window_peak() { window_peak_ = live_total_; }
  std::int64_t window_peak() const { return window_peak_; }
  // Keeps up to `max_samples` timeline points; when full, every second point is dropped and the
  // sampling stride doubles, so the timeline always spans the whole run. 0 turns it off.
  void enable_timeline(std::size_t max_samples);
  const std::vector<MemSample>& timeline() const { return timeline_; }
  // Every later allocation and free is counted in `also` too (nullptr: no longer): one ledger fed
  // by two devices is their memory as one (Note [The device and the CPU as one memory] in
  // props/training_run.cpp). A copy of the ledger forwards nothing.
  void also_count_in(std::shared_ptr<MemoryLedger> also) { also_ = std::move(also); }

  MemoryLedger() = default;
  MemoryLedger(const MemoryLedger& o) { *this = o; }
  MemoryLedger& operator=(const MemoryLedger& o);

 private:
  void sample(const std::string& label);
  MemBytes live_{}, peak_{}, at_peak_{};
  std::int64_t live_total_ = 0, peak_total_ = 0, window_peak_ = 0;
  std::string peak_label_;
  std::int64_t events_ = 0, allocations_ = 0;
  std::size_t max_samples_ = 0;
  std::int64_t stride_ = 1;
  std::vector<MemSample> timeline_;
  std::shared_ptr<MemoryLedger> also_;
};

// A backend allocator's own count of the bytes it holds, kept where it really allocates and frees
// (HostDevice: around calloc and free), apart from the Device's ledger: the independent measure a
// ledger, and a meta run's ledger, are checked against.
struct AllocatorStats {
  MemBytes live{}, peak{}, at_peak{};
  std::int64_t live_total = 0, peak_total = 0;
  // The label of the latest allocation without a category (tests and tools only; in a training
  // run, a missed attribution), so that a difference from meta mode can name it.
  std::string unattributed_label;
  void on_alloc(MemCategory c, std::int64_t bytes, std::string_view label = {});
  void on_free(MemCategory c, std::int64_t bytes);
  void reset_peak();
};

// "1.25 GiB", "512 B": binary units, two decimals.
std::string format_bytes(std::int64_t bytes);

}  // namespace zc
