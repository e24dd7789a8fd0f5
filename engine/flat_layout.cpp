// FlatLayout arithmetic, through the decide:: templates the Z3 proofs instantiate.
#include "engine/flat_layout.h"

#include "engine/decisions.h"
#include "engine/errors.h"

namespace zc {

FlatLayout FlatLayout::build(const std::vector<std::int64_t>& numels, int world, bool pad, std::vector<int> order) {
  ZC_ASSERT(world >= 1, "world {}", world);
  FlatLayout l;
  l.world = world;
  l.numels = numels;
  if (order.empty()) {
    for (std::size_t i = 0; i < numels.size(); ++i) order.push_back(static_cast<int>(i));
  }
  ZC_ASSERT(order.size() == numels.size(), "an order of {} params for {}", order.size(), numels.size());
  l.order = std::move(order);
  l.offsets.assign(numels.size(), -1);
  for (int i : l.order) {
    ZC_ASSERT(i >= 0 && static_cast<std::size_t>(i) < numels.size() && l.offsets[static_cast<std::size_t>(i)] < 0,
              "the layout order is not a permutation (param {})", i);
    const std::int64_t n = numels[static_cast<std::size_t>(i)];
    ZC_ASSERT(n >= 0, "negative param numel {}", n);
    l.offsets[static_cast<std::size_t>(i)] = l.numel;
    l.numel += n;
  }
  const std::int64_t w = world;
  l.padded = pad ? decide::zero12_padded_numel<std::int64_t>(l.numel, w) : l.numel;
  l.partition_numel = pad ? decide::zero12_partition_numel<std::int64_t>(l.numel, w) : l.numel;
  if (!pad) ZC_ASSERT(world == 1, "an unpadded layout has one partition");
  l.check_coverage();
  return l;
}

std::vector<int> FlatLayout::round_robin_order(int num_params, int world) {
  std::vector<int> out;
  for (int bin = 0; bin < world; ++bin) {
    for (int i = bin; i < num_params; i += world) out.push_back(i);
  }
  return out;
}

std::vector<int> FlatLayout::params_in_partition(int r) const {
  std::vector<int> out;
  const std::int64_t start = partition_start(r), end = start + partition_numel;
  for (int i : order) {
    const auto k = static_cast<std::size_t>(i);
    if (decide::param_in_partition<std::int64_t>(offsets[k], numels[k], start, end)) out.push_back(i);
  }
  return out;
}

std::vector<double> FlatLayout::to_param_order(const std::vector<double>& flat) const {
  ZC_ASSERT(static_cast<std::int64_t>(flat.size()) >= numel, "a buffer of {} elements for a layout of {}", flat.size(), numel);
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(numel));
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    const auto from = flat.begin() + offsets[i];
    out.insert(out.end(), from, from + numels[i]);
  }
  return out;
}

// Unpadded (one partition, world 1) only rank 0 exists, whose start is 0 either way.
std::int64_t FlatLayout::partition_start(int r) const { return decide::partition_start<std::int64_t>(numel, world, r); }

std::vector<std::pair<int, std::int64_t>> FlatLayout::partitions_of_param(int i) const {
  std::vector<std::pair<int, std::int64_t>> out;
  const std::int64_t off = offsets[static_cast<std::size_t>(i)];
  const std::int64_t n = numels[static_cast<std::size_t>(i)];
  if (n == 0 || partition_numel == 0) return out;
  const auto first = static_cast<int>(decide::first_partition_touched(off, partition_numel));
  const auto last = static_cast<int>(decide::last_partition_touched(off, n, partition_numel));
  for (int p = first; p <= last; ++p) out.emplace_back(p, decide::slice_begin_in_param(off, partition_start(p)));
  return out;
}

void FlatLayout::check_coverage() const {
  ZC_ASSERT(padded >= numel && partition_numel * world == padded, "partitions {} x {} != padded {}",
            partition_numel, world, padded);
  std::int64_t covered = 0;
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    std::int64_t slice_sum = 0;
    const auto parts = partitions_of_param(static_cast<int>(i));
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const std::int64_t lo = parts[k].second;
      const std::int64_t hi = k + 1 < parts.size() ? parts[k + 1].second : numels[i];
      ZC_ASSERT(lo < hi, "param {} slice [{}, {}) of partition {} is empty", i, lo, hi, parts[k].first);
      slice_sum += hi - lo;
    }
    ZC_ASSERT(slice_sum == numels[i], "param {}: slices cover {} of {} elements", i, slice_sum, numels[i]);
    covered += slice_sum;
  }
  ZC_ASSERT(covered == numel, "params cover {} of {} elements", covered, numel);
}

}  // namespace zc
