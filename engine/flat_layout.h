// The ZeRO-1/2 flat-group layout (SPEC 4): params laid end to end, the total padded to a multiple
// of 2 x world, cut into `world` equal partitions. A param belongs to a partition if it starts in
// it or straddles its start. Built from the templates in decisions.h; its coverage is asserted
// when built, and before each step the optimizer's buffers are checked against it (Note
// [Coverage at step time] in zero12_step.cpp): the layout itself is immutable after build.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace zc {

struct FlatLayout {
  std::vector<std::int64_t> offsets;  // per param: start in the flat buffer
  std::vector<int> order;             // the params in flat-buffer order (identity unless reordered)
  std::vector<std::int64_t> numels;   // per param
  std::int64_t numel = 0;             // sum of numels
  std::int64_t padded = 0;            // numel rounded up to 2 x world (or numel when unpadded)
  std::int64_t partition_numel = 0;   // padded / world
  int world = 1;

  // pad_to_2x_world: ZeRO-1/2 alignment; false for a single unpartitioned group (stage 0).
  // `order`, when given, is the params' order in the buffer, a permutation of their indices
  // (round_robin_gradients).
  static FlatLayout build(const std::vector<std::int64_t>& numels, int world, bool pad_to_2x_world,
                          std::vector<int> order = {});
  // DeepSpeed's _round_robin_reorder (stage_1_and_2.py): param i goes to bin i % world, and the
  // bins are laid out one after the other, so consecutive params belong to different ranks.
  static std::vector<int> round_robin_order(int num_params, int world);

  std::int64_t partition_start(int r) const;  // decide::partition_start
  // Indices of the params that belong to partition r, in buffer order.
  std::vector<int> params_in_partition(int r) const;
  // Every (partition id, offset within the param where that partition's slice begins) a param
  // touches, in ascending offset (DeepSpeed's param_to_partition_ids with grad_start_offset).
  std::vector<std::pair<int, std::int64_t>> partitions_of_param(int i) const;
  // Called by build(): every element of [0, padded) lies in exactly one partition and every
  // param element in exactly one partition slice. Throws InternalError otherwise.
  void check_coverage() const;
  // A buffer-ordered vector of `numel` or more elements (the padding is dropped) in param order.
  std::vector<double> to_param_order(const std::vector<double>& flat) const;
};

}  // namespace zc
