// torch's CPU float32 reductions that DeepSpeed's BF16_Optimizer norm goes through, bit for bit
// (Note [torch's f32 norm]).
//
// Note [torch's f32 norm]
// get_global_norm_of_tensors (deepspeed/runtime/utils.py) takes each param's `t.float().norm(2)`,
// then `torch.stack(norms).pow(2).sum()` and its square root. On torch 2.10.0's CPU build the
// AVX-512 compilation registers no kernel for norm_stub and sum_stub (REGISTER_DISPATCH gives
// nullptr there), so an AVX-512 CPU runs the AVX2 kernels, whose Vectorized<float> has 8 lanes:
//   norm(2) of a contiguous f32 vector (ReduceOpsKernel.cpp, norm_two_reduce_step): 8 f32 lane
//     accumulators over the first n - n % 8 elements, element d + j to lane j, each step a rounded
//     square then a rounded add (not fused); the lanes folded left to right into lane 0; the
//     n % 8 tail added to it in order, its first 4 * floor(m / 4) elements as rounded squares
//     and rounded adds and the last m % 4 as one fused multiply-add each (the tail loop as g++
//     vectorised it); a float32 sqrt.
//   sum of k f32 values (SumKernel.cpp, cascade_sum): below 8 values, four partials (values
//     0-3 start them, values 4.. go into partial 0 in order, then partial 0 + 1 + 2 + 3); from 8
//     to 31, k / 8 vectors summed lane-wise, then 0 + the scalar tail in order + lanes 0..7 in
//     order. From 32 values on the cascade has further levels, which are not modelled here: the
//     sum is then left to right (the reference's scenarios have at most 7 params).
// Measured against the installed torch (randn and dyadic data, n = 1..40 and up to 257, 2,000
// tensors each: 0 mismatches); the DEFAULT capability (ATEN_CPU_CAPABILITY=default) compiles
// the tail differently and is not what this models. The plain model, sqrtf of the exact sum of
// squares, differs from torch in 10-30 % of random tensors (and failed
// DeepSpeedReference.Bf16OptimizerNormAndClipAreDeepSpeedsBitForBit on one machine's data).
//
// Note [torch's f32 sqrt on a CPU]
// DeepSpeed takes the root of a global gradient norm with a torch op on a tensor: `.pow(1. /
// norm_type)` (runtime/utils.py clip_grad_norm_ and get_global_norm_of_tensors,
// stage_1_and_2.py get_grad_norm_direct) or `**(1. / norm_type)` (stage3.py
// complete_grad_norm_calculation_for_cpu_offload). pow with 0.5 is torch's sqrt kernel, which on a
// CPU is MKL's vector sqrt (vsSqrt, "HA" accuracy). MKL picks its code by CPU: on the AMD EPYC CPUs
// these machines have it runs mkl_vml_kernel_sSqrt_EXHAynn (torch 2.10.0's MKL 2024.2), which is
// not correctly rounded (16.5 % of 20,000 random values land on the other neighbour, up to 0.75
// ulp off). Read from its machine code, per element with no fused multiply-add:
//   y = rsqrtps(x); g = x * y; h = y * 0.5; r = 0.5 - g * h; g1 = g * r + g; h1 = h * r + h;
//   d = x - g1 * g1; sqrt = d * h1 + g1
// (two Goldschmidt steps from the 12-bit reciprocal square root). rsqrtps's table is the CPU's
// own (AMD's and Intel's differ), so the model runs the instruction on the CPU it runs on: like
// DeepSpeed on the reference, it is a model of this machine. It matched torch on all 20,000 values
// and on the two scenarios the reference soak found (a clip coefficient one ulp apart). Zero,
// infinities, NaN, negatives and subnormals go to MKL's rare-value path, which is not modelled
// (norms there are 0 or not finite: the correctly rounded root). Which kernel torch runs on a
// machine is measured, not assumed (props/reference_pool.cpp probe_torch_sqrt); on a GPU, and
// with Python's float arithmetic, the root is correctly rounded. f64 roots (ZeRO-3 without
// offload: a double tensor) go through MKL's dSqrt, a table-driven kernel not modelled here.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZC_HAVE_RSQRTPS 1
#endif

namespace zc {

// How torch computes an f32 tensor's square root where DeepSpeed runs (Note [torch's f32 sqrt on
// a CPU]): correctly rounded (CUDA, Python floats, CPUs whose MKL kernel rounds correctly), or
// MKL's SSE kernel on this CPU.
enum class TorchSqrt : std::uint8_t { correctly_rounded, mkl_sse };

// Whether this build can run the mkl_sse model (it needs the CPU's rsqrtps).
constexpr bool torch_sqrt_mkl_sse_available() {
#ifdef ZC_HAVE_RSQRTPS
  return true;
#else
  return false;
#endif
}

// MKL's mkl_vml_kernel_sSqrt_EXHAynn on this CPU, element by element (Note [torch's f32 sqrt on a
// CPU]); the correctly rounded root where the model does not apply.
inline float mkl_sse_sqrt_f32(float x) {
#ifdef ZC_HAVE_RSQRTPS
  if (!(std::isnormal(x) && x > 0.0f)) return std::sqrt(x);  // MKL's rare-value path
  const float y = _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss(x)));
  const float g = x * y, h = y * 0.5f;
  const float r = 0.5f - g * h;
  const float g1 = g * r + g, h1 = h * r + h;
  const float d = x - g1 * g1;
  return d * h1 + g1;
#else
  return std::sqrt(x);
#endif
}

inline float torch_sqrt_f32(float x, TorchSqrt kind) {
  return kind == TorchSqrt::mkl_sse ? mkl_sse_sqrt_f32(x) : std::sqrt(x);
}

inline float torch_norm2_f32(std::span<const float> x) {
  constexpr std::size_t kLanes = 8;
  const std::size_t n = x.size(), body = n - n % kLanes;
  float lanes[kLanes] = {};
  for (std::size_t d = 0; d < body; d += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) {
      const float sq = x[d + j] * x[d + j];
      lanes[j] = lanes[j] + sq;
    }
  }
  float acc = lanes[0];
  for (std::size_t j = 1; j < kLanes; ++j) acc = acc + lanes[j];
  const std::size_t m = n - body, grouped = m - m % 4;
  for (std::size_t i = 0; i < m; ++i) {
    const float v = x[body + i];
    if (i < grouped) {
      const float sq = v * v;
      acc = acc + sq;
    } else {
      acc = std::fma(v, v, acc);
    }
  }
  return std::sqrt(acc);
}

inline float torch_sum_f32(std::span<const float> s) {
  const std::size_t k = s.size();
  if (k == 0) return 0.0f;
  float total;
  if (k < 8) {
    float p[4] = {};
    const std::size_t rows = k / 4;
    for (std::size_t c = 0; c < 4 * rows; ++c) p[c] = p[c] + s[c];
    for (std::size_t i = 4 * rows; i < k; ++i) p[0] = p[0] + s[i];
    total = ((p[0] + p[1]) + p[2]) + p[3];
  } else if (k < 32) {
    float lanes[8] = {};
    const std::size_t vectors = k / 8;
    for (std::size_t v = 0; v < vectors; ++v) {
      for (std::size_t j = 0; j < 8; ++j) lanes[j] = lanes[j] + s[8 * v + j];
    }
    total = 0.0f;
    for (std::size_t i = 8 * vectors; i < k; ++i) total = total + s[i];
    for (float lane : lanes) total = total + lane;
  } else {  // not modelled (see the Note): left to right
    total = 0.0f;
    for (float v : s) total = total + v;
  }
  return 0.0f + total;
}

}  // namespace zc
