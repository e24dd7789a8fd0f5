// Reduction arithmetic for SimComm (Note [Reduction orders] in reduction.h).
#include "sim/reduction.h"

#include "engine/errors.h"

#include <cmath>

namespace zc::sim {

std::string_view reduction_order_name(ReductionOrder o) {
  return o == ReductionOrder::linear ? "linear" : "ring";
}

double combine(DType dtype, ReduceOp op, double a, double b) {
  if (op != ReduceOp::sum) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
    return op == ReduceOp::max ? std::max(a, b) : std::min(a, b);
  }
  if (dtype == DType::f64) return a + b;
  const float s = static_cast<float>(a) + static_cast<float>(b);
  switch (dtype) {
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(s));
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(s));
    default: return s;
  }
}

void reduce_range(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                  std::int64_t offset, std::int64_t count, int first, std::byte* out) {
  const int n = static_cast<int>(inputs.size());
  ZC_ASSERT(n >= 1 && first >= 0 && first < n, "ring start {} of {} ranks", first, n);
  for (std::int64_t i = 0; i < count; ++i) {
    double acc = load_as_f64(inputs[first], dtype, offset + i);
    for (int j = 1; j < n; ++j) {
      acc = combine(dtype, op, acc, load_as_f64(inputs[(first + j) % n], dtype, offset + i));
    }
    store_from_f64(out, dtype, i, acc);
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
