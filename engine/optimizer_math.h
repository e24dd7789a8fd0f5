// The per-element arithmetic of the optimizer kernels that zerocheck reproduces bit for bit, shared
// by HostDevice and CudaDevice (nvcc compiles this header: no fmt, no exceptions). Every fused
// multiply-add is an explicit fmaf, never a contraction: the project builds with
// -ffp-contract=off and nvcc with --fmad=false.
#pragma once

#include "engine/device.h"

#include <cmath>

#if defined(__CUDACC__)
#define ZC_HD __host__ __device__
#else
#define ZC_HD
#endif

namespace zc {

// The scalars DeepSpeed's Adam_Optimizer derives once per step (update_state and Step_AVX's
// prologue), in f32: Note [DeepSpeed CPU Adam].
struct DsCpuAdamScalars {
  float b1, b2, b1m1, b2m1, eps, wd, bc2, step_size, w_decay;
  bool adamw;
};

inline DsCpuAdamScalars ds_cpu_adam_scalars(const AdamParams& p) {
  DsCpuAdamScalars k{};
  k.b1 = static_cast<float>(p.beta1);
  k.b2 = static_cast<float>(p.beta2);
  k.b1m1 = 1.0f - k.b1;
  k.b2m1 = 1.0f - k.b2;
  k.eps = static_cast<float>(p.eps);
  k.wd = static_cast<float>(p.weight_decay);
  const float lr = static_cast<float>(p.lr);
  float bc1 = 1.0f;
  k.bc2 = 1.0f;
  if (p.bias_correction) {
    bc1 = 1.0f - p.beta1_pow;
    k.bc2 = 1.0f / std::sqrt(1.0f - p.beta2_pow);
  }
  k.step_size = -1.0f * lr / bc1;
  k.w_decay = -1.0f * lr * k.wd;
  k.adamw = p.adamw;
  return k;
}

// One element. `tail`: the element lies past the SIMD body (index >= n & ~(simd_width - 1)).
ZC_HD inline void ds_cpu_adam_element(const DsCpuAdamScalars& k, bool tail, float g, float& p, float& m,
                                      float& v) {
  if (k.wd > 0.0f && !k.adamw) g = fmaf(p, k.wd, g);
  if (tail) {
    m = fmaf(m, k.b1, g * k.b1m1);
    v = fmaf(v, k.b2, (g * g) * k.b2m1);
  } else {
    m = fmaf(g, k.b1m1, m * k.b1);
    v = fmaf(g * g, k.b2m1, v * k.b2);
  }
  const float d = fmaf(sqrtf(v), k.bc2, k.eps);
  const float u = m / d;
  if (k.wd > 0.0f && k.adamw) p = fmaf(p, k.w_decay, p);
  p = fmaf(u, k.step_size, p);
}

// torch.optim.SGD's single-tensor step on CPU, one element (measured against torch 2.10 on this
// CPU: every add-with-alpha is a fused multiply-add in its vector body and its tail alike):
//   wd:        g = fma(p, wd, g)                       grad.add(param, alpha=wd)
//   momentum:  buf = first ? g : fma(g, 1-dampening, buf*momentum)
//              g = nesterov ? fma(buf, momentum, g) : buf
//   p = fma(g, -lr, p)                                 param.add_(grad, alpha=-lr)
// Every scalar is computed in f64 (Python) and rounded to f32 once, as ATen does.
struct TorchSgdScalars {
  float neg_lr, wd, momentum, one_minus_dampening;
  bool use_momentum, first_step, nesterov;
};

inline TorchSgdScalars torch_sgd_scalars(const SgdParams& p) {
  return {static_cast<float>(-p.lr), static_cast<float>(p.weight_decay), static_cast<float>(p.momentum),
          static_cast<float>(1.0 - p.dampening), p.momentum != 0.0, p.first_step, p.nesterov};
}

ZC_HD inline void torch_sgd_element(const TorchSgdScalars& k, float g, float& p, float& buf) {
  if (k.wd != 0.0f) g = fmaf(p, k.wd, g);
  if (k.use_momentum) {
    buf = k.first_step ? g : fmaf(g, k.one_minus_dampening, buf * k.momentum);
    g = k.nesterov ? fmaf(buf, k.momentum, g) : buf;
  }
  p = fmaf(g, k.neg_lr, p);
}

}  // namespace zc
