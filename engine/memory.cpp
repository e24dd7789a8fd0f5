// MemoryLedger: live bytes and high-water marks per category, the composition at the peak and a
// bounded, decimating timeline.
#include "engine/memory.h"

#include "engine/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace zc {

namespace {
constexpr std::array<std::string_view, kMemCategories> kNames = {
    "params",          "grads",   "master",     "optimizer_states", "ipg_buckets",  "comm_buffers",
    "gathered_params", "prefetch", "persistent", "activations",      "temporaries", "unattributed",
};
static_assert(static_cast<std::size_t>(MemCategory::unattributed) + 1 == kMemCategories,
              "kMemCategories counts every MemCategory");
}  // namespace

std::string_view mem_category_name(MemCategory c) {
  return kNames.at(static_cast<std::size_t>(c));
}

MemCategory parse_mem_category(std::string_view name) {
  for (std::size_t i = 0; i < kMemCategories; ++i) {
    if (kNames[i] == name) return static_cast<MemCategory>(i);
  }
  throw UsageError(fmt::format("unknown memory category '{}'; known: {}", name,
                               fmt::join(kNames, ", ")));
}

std::int64_t mem_total(const MemBytes& b) {
  std::int64_t t = 0;
  for (std::int64_t v : b) t += v;
  return t;
}

void MemoryLedger::on_alloc(MemCategory c, std::int64_t bytes, const std::string& label) {
  ZC_ASSERT(bytes >= 0, "allocation of {} bytes", bytes);
  const std::size_t k = static_cast<std::size_t>(c);
  live_[k] += bytes;
  live_total_ += bytes;
  ++events_;
  ++allocations_;
  if (live_[k] > peak_[k]) peak_[k] = live_[k];
  window_peak_ = std::max(window_peak_, live_total_);
  if (live_total_ > peak_total_) {
    peak_total_ = live_total_;
    at_peak_ = live_;
    peak_label_ = label;
  }
  sample(label);
  if (also_) also_->on_alloc(c, bytes, label);
}

void MemoryLedger::on_free(MemCategory c, std::int64_t bytes) {
  const std::size_t k = static_cast<std::size_t>(c);
  ZC_ASSERT(live_[k] >= bytes && live_total_ >= bytes,
            "free of {} bytes of {} with {} live: a free without its allocation", bytes,
            mem_category_name(c), live_[k]);
  live_[k] -= bytes;
  live_total_ -= bytes;
  ++events_;
  sample({});
  if (also_) also_->on_free(c, bytes);
}

MemoryLedger& MemoryLedger::operator=(const MemoryLedger& o) {
  if (this == &o) return *this;
  live_ = o.live_, peak_ = o.peak_, at_peak_ = o.at_peak_;
  live_total_ = o.live_total_, peak_total_ = o.peak_total_, window_peak_ = o.window_peak_;
  peak_label_ = o.peak_label_;
  events_ = o.events_, allocations_ = o.allocations_;
  max_samples_ = o.max_samples_, stride_ = o.stride_;
  timeline_ = o.timeline_;
  also_.reset();  // a snapshot forwards nothing
  return *this;
}

void MemoryLedger::reset_peak() {
  peak_ = live_;
  at_peak_ = live_;
  peak_total_ = live_total_;
  peak_label_ = "(reset)";
}

void MemoryLedger::enable_timeline(std::size_t max_samples) {
  max_samples_ = max_samples;
  stride_ = 1;
  timeline_.clear();
  if (max_samples_ > 0) timeline_.reserve(max_samples_);
}

void MemoryLedger::sample(const std::string& label) {
  if (max_samples_ == 0 || events_ % stride_ != 0) return;
  if (timeline_.size() >= max_samples_) {  // decimate: keep every second point
    std::size_t w = 0;
    for (std::size_t r = 1; r < timeline_.size(); r += 2) timeline_[w++] = std::move(timeline_[r]);
    timeline_.resize(w);
    stride_ *= 2;
    if (events_ % stride_ != 0) return;
  }
  timeline_.push_back(MemSample{events_, live_, label});
}

void AllocatorStats::on_alloc(MemCategory c, std::int64_t bytes, std::string_view label) {
  const std::size_t k = static_cast<std::size_t>(c);
  if (c == MemCategory::unattributed) unattributed_label = label.empty() ? std::string_view("(no label)") : label;
  live[k] += bytes;
  live_total += bytes;
  peak[k] = std::max(peak[k], live[k]);
  if (live_total > peak_total) {
    peak_total = live_total;
    at_peak = live;
  }
}

void AllocatorStats::on_free(MemCategory c, std::int64_t bytes) {
  live[static_cast<std::size_t>(c)] -= bytes;
  live_total -= bytes;
}

void AllocatorStats::reset_peak() {
  peak = live;
  at_peak = live;
  peak_total = live_total;
}

std::string format_bytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (b < 1024.0 * 1024) return fmt::format("{:.2f} KiB", b / 1024);
  if (b < 1024.0 * 1024 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
}

}  // namespace zc
