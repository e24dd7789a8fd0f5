// Reduction arithmetic for SimComm (Note [Reduction orders] in reduction.h).
#include "sim/reduction.h"

#include "engine/errors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>

namespace zc::sim {

std::string_view reduction_order_name(ReductionOrder o) {
  switch (o) {
    case ReductionOrder::linear: return "linear";
    case ReductionOrder::ring: return "ring";
    case ReductionOrder::gloo: return "gloo";
  }
  return "?";
}

namespace {

// One dtype's storage: how an element is loaded into the compute type T and rounded back.
template <class T, class Stored, T (*Load)(Stored), Stored (*Store)(T)>
struct Format {
  using Compute = T;
  static T load(const std::byte* base, std::int64_t i) {
    Stored s;
    std::memcpy(&s, base + i * static_cast<std::int64_t>(sizeof(Stored)), sizeof(Stored));
    return Load(s);
  }
  static void store(std::byte* base, std::int64_t i, T v) {
    const Stored s = Store(v);
    std::memcpy(base + i * static_cast<std::int64_t>(sizeof(Stored)), &s, sizeof(Stored));
  }
  static T round(T v) { return Load(Store(v)); }  // the rounding of one combine
};
template <class T> T same(T v) { return v; }
using F64 = Format<double, double, same<double>, same<double>>;
using F32 = Format<float, float, same<float>, same<float>>;
using F16 = Format<float, std::uint16_t, f16_bits_to_f32, f32_to_f16_bits>;
using BF16 = Format<float, std::uint16_t, bf16_bits_to_f32, f32_to_bf16_bits>;
using U8 = Format<float, std::uint8_t, u8_to_f32, f32_to_u8>;

// One combine of an accumulator with an input, as the op and the dtype define it.
template <class F, ReduceOp Op>
inline typename F::Compute combine(typename F::Compute a, typename F::Compute x) {
  if constexpr (Op == ReduceOp::sum) {
    return F::round(a + x);
  } else {
    if (std::isnan(a) || std::isnan(x)) return std::isnan(a) ? a : x;
    return Op == ReduceOp::max ? std::max(a, x) : std::min(a, x);
  }
}

// Rank-outer, element-inner, one tile at a time: each element sees the same sequence of combines
// as an element-by-element loop would, so the result is identical, but each pass is straight over
// memory (and the op is a template argument, so the element loop has no branch and vectorizes).
// The accumulator is one tile on the stack, which stays in L1 across the ranks' passes. A full
// tile's length is a compile-time constant: -O2's vectorizer (GCC's very-cheap cost model) takes
// only loops whose trip count needs no scalar epilogue.
constexpr std::int64_t kTile = 512;  // elements: 2-4 KiB, small beside a fiber's stack

template <class F, ReduceOp Op, class Len>
void reduce_tile(std::span<const std::byte* const> inputs, std::int64_t base, Len len, int first,
                 int step, typename F::Compute* a, std::byte* out, std::int64_t out_at) {
  const int n = static_cast<int>(inputs.size());
  for (std::int64_t i = 0; i < len; ++i) a[i] = F::load(inputs[first], base + i);
  for (int j = 1; j < n; ++j) {
    const std::byte* in = inputs[((first + step * j) % n + n) % n];
    for (std::int64_t i = 0; i < len; ++i) a[i] = combine<F, Op>(a[i], F::load(in, base + i));
  }
  for (std::int64_t i = 0; i < len; ++i) F::store(out, out_at + i, a[i]);
}

template <class F, ReduceOp Op>
void reduce_range_op(std::span<const std::byte* const> inputs, std::int64_t offset,
                     std::int64_t count, int first, int step, std::byte* out) {
  typename F::Compute a[kTile];
  std::int64_t t0 = 0;
  for (; t0 + kTile <= count; t0 += kTile) {
    reduce_tile<F, Op>(inputs, offset + t0, std::integral_constant<std::int64_t, kTile>{}, first,
                       step, a, out, t0);
  }
  if (t0 < count) reduce_tile<F, Op>(inputs, offset + t0, count - t0, first, step, a, out, t0);
}

template <class F>
void reduce_range_as(ReduceOp op, std::span<const std::byte* const> inputs, std::int64_t offset,
                     std::int64_t count, int first, int step, std::byte* out) {
  switch (op) {
    case ReduceOp::sum: return reduce_range_op<F, ReduceOp::sum>(inputs, offset, count, first, step, out);
    case ReduceOp::max: return reduce_range_op<F, ReduceOp::max>(inputs, offset, count, first, step, out);
    case ReduceOp::min: return reduce_range_op<F, ReduceOp::min>(inputs, offset, count, first, step, out);
  }
}

// gloo's blocks (Note [Reduction orders]): elements per block for `count` elements of `esize`
// bytes over n ranks. allreduce (gloo/allreduce.cc) fixes the number of segments first, reduce
// (gloo/reduce.cc) the segment size; both then give each rank's block G / n segments.
std::int64_t gloo_block_elements(std::int64_t count, std::int64_t esize, int n, bool reduce) {
  constexpr std::int64_t kMaxSegmentBytes = 1024 * 1024;  // gloo's options' default
  const auto round_up = [](std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; };
  const std::int64_t bytes = count * esize;
  std::int64_t segments = 0, seg_bytes = 0;
  if (reduce) {
    const std::int64_t max_seg = esize * (kMaxSegmentBytes / esize);
    seg_bytes = round_up(std::min((bytes + 2 * n - 1) / (2 * n), max_seg), esize);
    segments = round_up(std::max<std::int64_t>((bytes + seg_bytes - 1) / seg_bytes, 2 * n), n);
  } else {
    const std::int64_t max_seg = esize * std::max<std::int64_t>(1, kMaxSegmentBytes / esize);
    segments = round_up(std::max<std::int64_t>((bytes + max_seg - 1) / max_seg, 2 * n), n);
    seg_bytes = round_up((bytes + segments - 1) / segments, esize);
  }
  return seg_bytes / esize * (segments / n);
}

// Elements [lo, hi) of the gloo order's result.
void gloo_range(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                std::int64_t count, std::int64_t lo, std::int64_t hi, std::byte* out,
                bool reduce = false) {
  if (hi <= lo) return;
  const int n = static_cast<int>(inputs.size());
  const std::int64_t block = gloo_block_elements(count, dtype_size(dtype), n, reduce);
  for (std::int64_t b = lo / block; b * block < hi; ++b) {
    const std::int64_t from = std::max(lo, b * block), to = std::min(hi, (b + 1) * block);
    reduce_range(dtype, op, inputs, from, to - from, static_cast<int>((b - 1 + n) % n),
                 out + (from - lo) * dtype_size(dtype), -1);
  }
}

}  // namespace

void reduce_range(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                  std::int64_t offset, std::int64_t count, int first, std::byte* out, int step) {
  const int n = static_cast<int>(inputs.size());
  ZC_ASSERT(n >= 1 && first >= 0 && first < n, "ring start {} of {} ranks", first, n);
  ZC_ASSERT(step == 1 || step == -1, "ring step {}", step);
  switch (dtype) {
    case DType::f64: return reduce_range_as<F64>(op, inputs, offset, count, first, step, out);
    case DType::f32: return reduce_range_as<F32>(op, inputs, offset, count, first, step, out);
    case DType::f16: return reduce_range_as<F16>(op, inputs, offset, count, first, step, out);
    case DType::bf16: return reduce_range_as<BF16>(op, inputs, offset, count, first, step, out);
    case DType::u8: return reduce_range_as<U8>(op, inputs, offset, count, first, step, out);
  }
}

void all_reduce_into(DType dtype, ReduceOp op, ReductionOrder order,
                     std::span<const std::byte* const> inputs, std::int64_t count, std::byte* out) {
  const int n = static_cast<int>(inputs.size());
  if (order == ReductionOrder::linear) {
    reduce_range(dtype, op, inputs, 0, count, 0, out);
    return;
  }
  if (order == ReductionOrder::gloo) {
    gloo_range(dtype, op, inputs, count, 0, count, out);
    return;
  }
  const std::int64_t chunk = (count + n - 1) / n;
  for (int c = 0; c < n; ++c) {
    const std::int64_t lo = std::min(count, c * chunk);
    const std::int64_t hi = std::min(count, lo + chunk);
    reduce_range(dtype, op, inputs, lo, hi - lo, (c + 1) % n, out + lo * dtype_size(dtype));
  }
}

void reduce_scatter_into(DType dtype, ReduceOp op, ReductionOrder order,
                         std::span<const std::byte* const> inputs, std::int64_t out_count,
                         int out_rank, std::byte* out) {
  const int n = static_cast<int>(inputs.size());
  if (order == ReductionOrder::gloo) {  // the allreduce of the whole input, this rank's chunk
    gloo_range(dtype, op, inputs, n * out_count, out_rank * out_count, (out_rank + 1) * out_count,
               out);
    return;
  }
  const int first = order == ReductionOrder::linear ? 0 : (out_rank + 1) % n;
  reduce_range(dtype, op, inputs, out_rank * out_count, out_count, first, out);
}

void reduce_to_root_into(DType dtype, ReduceOp op, ReductionOrder order,
                         std::span<const std::byte* const> inputs, std::int64_t count, int root,
                         std::byte* out) {
  const int n = static_cast<int>(inputs.size());
  if (order == ReductionOrder::gloo) {  // gloo's reduce: allreduce's chains, its own blocks
    gloo_range(dtype, op, inputs, count, 0, count, out, true);
    return;
  }
  const int first = order == ReductionOrder::linear ? 0 : (root + 1) % n;
  reduce_range(dtype, op, inputs, 0, count, first, out);
}

}  // namespace zc::sim
