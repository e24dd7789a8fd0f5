// Reduction arithmetic for SimComm (Note [Reduction orders] in reduction.h).
#include "sim/reduction.h"

#include "engine/errors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

namespace zc::sim {

std::string_view reduction_order_name(ReductionOrder o) {
  return o == ReductionOrder::linear ? "linear" : "ring";
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

// Rank-outer, element-inner: each element sees the same sequence of combines as an element-by-
// element loop would, so the result is identical, but each pass is straight over memory (and
// the op is a template argument, so the element loop has no branch and vectorizes).
template <class F, ReduceOp Op>
void reduce_range_op(std::span<const std::byte* const> inputs, std::int64_t offset,
                     std::int64_t count, int first, std::byte* out) {
  using T = typename F::Compute;
  const int n = static_cast<int>(inputs.size());
  const std::unique_ptr<T[]> acc(new T[static_cast<std::size_t>(count)]);  // every element set below
  T* a = acc.get();
  for (std::int64_t i = 0; i < count; ++i) a[i] = F::load(inputs[first], offset + i);
  for (int j = 1; j < n; ++j) {
    const std::byte* in = inputs[(first + j) % n];
    for (std::int64_t i = 0; i < count; ++i) a[i] = combine<F, Op>(a[i], F::load(in, offset + i));
  }
  for (std::int64_t i = 0; i < count; ++i) F::store(out, i, a[i]);
}

template <class F>
void reduce_range_as(ReduceOp op, std::span<const std::byte* const> inputs, std::int64_t offset,
                     std::int64_t count, int first, std::byte* out) {
  switch (op) {
    case ReduceOp::sum: return reduce_range_op<F, ReduceOp::sum>(inputs, offset, count, first, out);
    case ReduceOp::max: return reduce_range_op<F, ReduceOp::max>(inputs, offset, count, first, out);
    case ReduceOp::min: return reduce_range_op<F, ReduceOp::min>(inputs, offset, count, first, out);
  }
}

}  // namespace

void reduce_range(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                  std::int64_t offset, std::int64_t count, int first, std::byte* out) {
  const int n = static_cast<int>(inputs.size());
  ZC_ASSERT(n >= 1 && first >= 0 && first < n, "ring start {} of {} ranks", first, n);
  switch (dtype) {
    case DType::f64: return reduce_range_as<F64>(op, inputs, offset, count, first, out);
    case DType::f32: return reduce_range_as<F32>(op, inputs, offset, count, first, out);
    case DType::f16: return reduce_range_as<F16>(op, inputs, offset, count, first, out);
    case DType::bf16: return reduce_range_as<BF16>(op, inputs, offset, count, first, out);
  }
}

void all_reduce_into(DType dtype, ReduceOp op, ReductionOrder order,
                     std::span<const std::byte* const> inputs, std::int64_t count, std::byte* out) {
  const int n = static_cast<int>(inputs.size());
  if (order == ReductionOrder::linear) {
    reduce_range(dtype, op, inputs, 0, count, 0, out);
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
  const int first = order == ReductionOrder::linear ? 0 : (out_rank + 1) % n;
  reduce_range(dtype, op, inputs, out_rank * out_count, out_count, first, out);
}

void reduce_to_root_into(DType dtype, ReduceOp op, ReductionOrder order,
                         std::span<const std::byte* const> inputs, std::int64_t count, int root,
                         std::byte* out) {
  const int n = static_cast<int>(inputs.size());
  const int first = order == ReductionOrder::linear ? 0 : (root + 1) % n;
  reduce_range(dtype, op, inputs, 0, count, first, out);
}

}  // namespace zc::sim
