// The simulator's reductions, in a stated order, rounding to the dtype after every combine exactly
// as a GPU ring step does (16-bit: computed in f32, stored rounded). Pure functions over byte
// buffers, so tests can craft inputs whose two orders round differently.
#pragma once

#include "engine/comm.h"
#include "engine/dtype.h"

#include <cstddef>
#include <span>
#include <vector>

namespace zc::sim {

// Note [Reduction orders]
// linear: element i = ((x_0 + x_1) + x_2) + ... + x_{n-1}, group rank order.
// ring:   NCCL's ring order for one loop of one channel: the reduced range is cut into n chunks of
//         ceil(count / n) elements; chunk c starts at rank (c + 1) % n and travels the ring, so
//         its sum is ((x_{c+1} + x_{c+2}) + ...) + x_c. reduce_scatter's chunk c is rank c's
//         output; reduce ends at the root. Real NCCL splits by channel and step size too; this is
//         the order of its single-channel, single-loop case.
// gloo:   gloo's ring allreduce (gloo/allreduce.cc, ring()), which torch.distributed's gloo
//         backend runs for all_reduce and reduce_scatter_tensor (the allreduce of the input,
//         each rank keeping its chunk) on CPU tensors, and so DeepSpeed on CPUs. The buffer of B
//         bytes is cut into G = roundup(max(ceil(B / 1 MiB), 2n), n) segments of
//         roundup(ceil(B / G), element size) bytes, G / n consecutive segments per block; block
//         b is sent first by rank b - 1 and travels down the ring, so its sum is
//         ((x_{b-1} + x_{b-2}) + ...) + x_b (ranks mod n). reduce (gloo/reduce.cc, any root) has
//         the same chains over blocks sized the other way round: segments of
//         roundup(min(ceil(B / 2n), 1 MiB), element size) bytes, G = roundup(max(ceil(B /
//         segment), 2n), n) (the two agree up to 2n MiB). Measured against torch 2.10's gloo:
//         reference/deepspeed/measure_gloo.py, tests/data/gloo_reductions.bin.
enum class ReductionOrder : std::uint8_t { linear, ring, gloo };
std::string_view reduction_order_name(ReductionOrder o);

// Sums are computed in the dtype's arithmetic: f32 with one rounding per combine for 16-bit
// types, f64 for f64. NaN propagates through max and min.
// out[i] = reduction over the n inputs of element (offset + i), i < count, accumulated starting at
// rank `first` and going around the ring (first, first+1, ..., first-1 mod n; with step -1
// first, first-1, ..., first+1 mod n).
void reduce_range(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                  std::int64_t offset, std::int64_t count, int first, std::byte* out,
                  int step = 1);

// The whole-buffer reductions, as the collectives compute them.
void all_reduce_into(DType dtype, ReduceOp op, ReductionOrder order,
                     std::span<const std::byte* const> inputs, std::int64_t count, std::byte* out);
void reduce_scatter_into(DType dtype, ReduceOp op, ReductionOrder order,
                         std::span<const std::byte* const> inputs, std::int64_t out_count,
                         int out_rank, std::byte* out);
void reduce_to_root_into(DType dtype, ReduceOp op, ReductionOrder order,
                         std::span<const std::byte* const> inputs, std::int64_t count, int root,
                         std::byte* out);

}  // namespace zc::sim
