// CudaDevice's kernels. Each kernel is HostDevice's loop body (engine/host_device.cpp) with the
// loop index spread over threads; where the host loops sequentially (matmul's k, row sums, softmax
// denominators) one thread runs the same sequential loop, so every element sees the same IEEE
// operations in the same order. Built with --fmad=false -prec-div=true -prec-sqrt=true -ftz=false
// (real/CMakeLists.txt): no contraction, correctly rounded / and sqrt, subnormals kept.
// This file has no fmt and no engine headers beyond dtype.h: nvcc's front end cannot compile fmt's
// consteval format strings. The launchers at the bottom are what cuda_device.cpp calls.
#include "real/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace zc::real::kernels {

// The same conversions as dtype.h, with CUDA's round-to-nearest-even intrinsics. f64 -> 16-bit goes
// through f32 (two roundings), as load_as_f32 / store_from_f64 on the host do.
__device__ __forceinline__ float ld32(View v, std::int64_t i) {
  switch (v.t) {
    case DType::f32: return static_cast<const float*>(v.p)[i];
    case DType::f16: return __half2float(__ushort_as_half(static_cast<const unsigned short*>(v.p)[i]));
    case DType::bf16:
      return __bfloat162float(__ushort_as_bfloat16(static_cast<const unsigned short*>(v.p)[i]));
    case DType::f64: return __double2float_rn(static_cast<const double*>(v.p)[i]);
    case DType::u8: return static_cast<float>(static_cast<const unsigned char*>(v.p)[i]);
  }
  return 0.0f;
}
__device__ __forceinline__ double ld64(View v, std::int64_t i) {
  if (v.t == DType::f64) return static_cast<const double*>(v.p)[i];
  return static_cast<double>(ld32(v, i));
}
__device__ __forceinline__ void st32(View v, std::int64_t i, float x) {
  switch (v.t) {
    case DType::f32: static_cast<float*>(v.p)[i] = x; return;
    case DType::f16: static_cast<unsigned short*>(v.p)[i] = __half_as_ushort(__float2half_rn(x)); return;
    case DType::bf16:
      static_cast<unsigned short*>(v.p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      return;
    case DType::f64: static_cast<double*>(v.p)[i] = static_cast<double>(x); return;
    case DType::u8: {  // dtype.h's f32_to_u8: truncate, wrap modulo 256; NaN and inf store 0
      const bool ok = x > -9.2e18f && x < 9.2e18f;
      static_cast<unsigned char*>(v.p)[i] =
          ok ? static_cast<unsigned char>(static_cast<unsigned long long>(static_cast<long long>(x)) & 0xffu) : 0;
      return;
    }
  }
}
__device__ __forceinline__ void st64(View v, std::int64_t i, double x) {
  if (v.t == DType::f64) {
    static_cast<double*>(v.p)[i] = x;
  } else {
    st32(v, i, __double2float_rn(x));
  }
}
template <class T>
__device__ __forceinline__ T ld(View v, std::int64_t i) {
  if constexpr (std::is_same_v<T, double>) {
    return ld64(v, i);
  } else {
    return ld32(v, i);
  }
}
template <class T>
__device__ __forceinline__ void st(View v, std::int64_t i, T x) {
  if constexpr (std::is_same_v<T, double>) {
    st64(v, i, x);
  } else {
    st32(v, i, x);
  }
}
__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }
__device__ __forceinline__ float dsqrt(float x) { return __fsqrt_rn(x); }
__device__ __forceinline__ double dsqrt(double x) { return __dsqrt_rn(x); }
// std::max(a, b) as libstdc++ defines it: (a < b) ? b : a (so a NaN in b is dropped, as on the host).
template <class T>
__device__ __forceinline__ T host_max(T a, T b) {
  return (a < b) ? b : a;
}

// ---- launching ----------------------------------------------------------------------------------
constexpr int kThreads = 256;

template <class F>
__global__ void each_kernel(std::int64_t n, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    f(i);
  }
}

// f(i) for i in [0, n) on `stream`, one thread per index (grid-stride past 2^20 blocks).
template <class F>
void each(cudaStream_t stream, std::int64_t n, F f) {
  if (n <= 0) return;
  const std::int64_t blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, 1 << 20);
  each_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, f);
}

// ---- reductions (Note [Canonical reduction order]) ----------------------------------------------

__device__ __forceinline__ double combine(Combine c, double a, double b) {
  switch (c) {
    case Combine::sum: return a + b;
    case Combine::max_nan: return (isnan(a) || isnan(b)) ? nan("") : fmax(a, b);
    case Combine::max: return fmax(a, b);
  }
  return a;
}

// One block of kReduceBlock threads per leaf block: leaves padded with `pad`, stride-halving tree.
template <class Term>
__global__ void block_tree_kernel(std::int64_t n, Term term, Combine c, double pad, double* partials) {
  __shared__ double s[kReduceBlock];
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kReduceBlock + threadIdx.x;
  s[threadIdx.x] = i < n ? term(i) : pad;
  __syncthreads();
  for (unsigned w = kReduceBlock / 2; w >= 1; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] = combine(c, s[threadIdx.x], s[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

// One level of the tree over partials in global memory: p[i] = p[i] + p[i + half].
__global__ void tree_level_kernel(double* p, std::int64_t half, Combine c) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < half) p[i] = combine(c, p[i], p[i + half]);
}

// The last levels, width <= kReduceBlock (a power of two), in one block's shared memory.
__global__ void tree_final_kernel(double* p, unsigned width, Combine c) {
  __shared__ double s[kReduceBlock];
  if (threadIdx.x < width) s[threadIdx.x] = p[threadIdx.x];
  __syncthreads();
  for (unsigned w = width / 2; w >= 1; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] = combine(c, s[threadIdx.x], s[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) p[0] = s[0];
}

// The leaf blocks of a reduction: kind 0 sum of squares, 1 dot, 2 |x|, 3 non-finite indicator.
void reduce_blocks(cudaStream_t s, int kind, View x, View y, std::int64_t n, Combine c, double* p,
                   unsigned grid) {
  switch (kind) {
    case 0:
      block_tree_kernel<<<grid, kReduceBlock, 0, s>>>(
          n, [=] __device__(std::int64_t i) { const double v = ld64(x, i); return v * v; }, c, 0.0, p);
      break;
    case 1:
      block_tree_kernel<<<grid, kReduceBlock, 0, s>>>(
          n, [=] __device__(std::int64_t i) { return ld64(x, i) * ld64(y, i); }, c, 0.0, p);
      break;
    case 2:
      block_tree_kernel<<<grid, kReduceBlock, 0, s>>>(
          n, [=] __device__(std::int64_t i) { return fabs(ld64(x, i)); }, c, 0.0, p);
      break;
    default:
      block_tree_kernel<<<grid, kReduceBlock, 0, s>>>(
          n, [=] __device__(std::int64_t i) { return isfinite(ld64(x, i)) ? 0.0 : 1.0; }, c, 0.0, p);
      break;
  }
}

// ---- elementwise bodies, one function template per op (extended lambdas need a named enclosing
// function that is not itself a lambda) ----
template <class T>
void cast_k(cudaStream_t s, View d, View x, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st<T>(d, i, ld<T>(x, i)); });
}
template <class T>
void axpy_k(cudaStream_t s, View y, T a, View x, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st<T>(y, i, ld<T>(y, i) + a * ld<T>(x, i)); });
}
template <class T>
void scale_k(cudaStream_t s, View x, T a, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st<T>(x, i, a * ld<T>(x, i)); });
}
template <class T>
void div_k(cudaStream_t s, View x, T d, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st<T>(x, i, ld<T>(x, i) / d); });
}
template <class T>
void add_k(cudaStream_t s, View o, View a, View b, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st<T>(o, i, ld<T>(a, i) + ld<T>(b, i)); });
}
template <class T>
void mul_k(cudaStream_t s, View o, View a, View b, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st<T>(o, i, ld<T>(a, i) * ld<T>(b, i)); });
}
void fill_k(cudaStream_t s, View t, double v, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st64(t, i, v); });
}
template <class T>
void relu_k(cudaStream_t s, View o, View x, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) {
    const T v = ld<T>(x, i);
    st<T>(o, i, v > T(0) ? v : T(0));
  });
}
template <class T>
void relu_backward_k(cudaStream_t s, View gi, View go, View x, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) { st<T>(gi, i, ld<T>(x, i) > T(0) ? ld<T>(go, i) : T(0)); });
}
template <class T>
void add_row_vector_k(cudaStream_t s, View o, View row, std::int64_t numel, std::int64_t n) {
  each(s, numel, [=] __device__(std::int64_t i) { st<T>(o, i, ld<T>(o, i) + ld<T>(row, i % n)); });
}
template <class T>
void sum_rows_k(cudaStream_t s, View o, View x, std::int64_t rows, std::int64_t n, bool accumulate) {
  each(s, n, [=] __device__(std::int64_t j) {
    T acc = 0;
    for (std::int64_t i = 0; i < rows; ++i) acc = acc + ld<T>(x, i * n + j);
    st<T>(o, j, accumulate ? ld<T>(o, j) + acc : acc);
  });
}
template <class T>
void scale_rows_k(cudaStream_t s, View o, View x, View sc, std::int64_t numel, std::int64_t cols) {
  each(s, numel, [=] __device__(std::int64_t i) { st<T>(o, i, ld<T>(sc, i / cols) * ld<T>(x, i)); });
}
template <class T>
void row_dot_k(cudaStream_t s, View o, View a, View c, std::int64_t rows, std::int64_t cols) {
  each(s, rows, [=] __device__(std::int64_t r) {
    T acc = 0;
    for (std::int64_t j = 0; j < cols; ++j) acc = acc + ld<T>(a, r * cols + j) * ld<T>(c, r * cols + j);
    st<T>(o, r, acc);
  });
}
// Row r's max and sum_c exp(x - max) (ascending c): softmax_xent's and log_softmax_nll's start.
template <class T>
__device__ __forceinline__ void row_max_denom(View x, std::int64_t r, std::int64_t cols, T& mx, T& denom) {
  mx = -std::numeric_limits<T>::infinity();
  for (std::int64_t c = 0; c < cols; ++c) mx = host_max(mx, ld<T>(x, r * cols + c));
  denom = 0;
  for (std::int64_t c = 0; c < cols; ++c) denom = denom + dexp(ld<T>(x, r * cols + c) - mx);
}
template <class T>
void softmax_xent_k(cudaStream_t s, View dl, View loss, View logits, View labels, std::int64_t rows,
                    std::int64_t cols) {
  each(s, rows, [=] __device__(std::int64_t r) {
    const auto label = static_cast<std::int64_t>(ld32(labels, r));  // checked on the host
    T mx, denom;
    row_max_denom(logits, r, cols, mx, denom);
    const T log_denom = dlog(denom);
    for (std::int64_t c = 0; c < cols; ++c) {
      const T p = dexp(ld<T>(logits, r * cols + c) - mx) / denom;
      st<T>(dl, r * cols + c, c == label ? p - T(1) : p);
    }
    st<T>(loss, r, log_denom - (ld<T>(logits, r * cols + label) - mx));
  });
}
template <class T>
void log_softmax_nll_k(cudaStream_t s, View logp, View loss, View logits, View labels, std::int64_t rows,
                       std::int64_t cols) {
  each(s, rows, [=] __device__(std::int64_t r) {
    const auto label = static_cast<std::int64_t>(ld32(labels, r));  // checked on the host
    T mx, denom;
    row_max_denom(logits, r, cols, mx, denom);
    const T log_denom = dlog(denom);
    for (std::int64_t c = 0; c < cols; ++c) st<T>(logp, r * cols + c, (ld<T>(logits, r * cols + c) - mx) - log_denom);
  });
  // nll_loss's mean, HostDevice's order: one thread over the rows (B reads, not B x C).
  each(s, 1, [=] __device__(std::int64_t) {
    T sum = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      sum = sum - ld<T>(logp, r * cols + static_cast<std::int64_t>(ld32(labels, r)));
    }
    st<T>(loss, 0, sum / static_cast<T>(rows));
  });
}
template <class T>
void nll_loss_backward_k(cudaStream_t s, View grad, View labels, double value, std::int64_t rows, std::int64_t cols) {
  const T v = static_cast<T>(value);
  each(s, rows * cols, [=] __device__(std::int64_t e) {
    const std::int64_t r = e / cols, c = e % cols;
    st<T>(grad, e, c == static_cast<std::int64_t>(ld32(labels, r)) ? v : T(0));
  });
}
template <class T>
void log_softmax_backward_k(cudaStream_t s, View dx, View dout, View logp, std::int64_t rows, std::int64_t cols) {
  each(s, rows, [=] __device__(std::int64_t r) {
    T sum = 0;
    for (std::int64_t c = 0; c < cols; ++c) sum = sum + ld<T>(dout, r * cols + c);
    for (std::int64_t c = 0; c < cols; ++c) {
      st<T>(dx, r * cols + c, ld<T>(dout, r * cols + c) - dexp(ld<T>(logp, r * cols + c)) * sum);
    }
  });
}
void argmax_rows_k(cudaStream_t s, std::int64_t* out, View x, std::int64_t rows, std::int64_t cols) {
  each(s, rows, [=] __device__(std::int64_t r) {
    double best = ld64(x, r * cols);
    std::int64_t arg = 0;
    for (std::int64_t c = 1; c < cols; ++c) {
      const double v = ld64(x, r * cols + c);
      if (v > best) {
        best = v;
        arg = c;
      }
    }
    out[r] = arg;
  });
}
template <class T>
void embedding_k(cudaStream_t s, View o, View table, View ids, std::int64_t n, std::int64_t dim) {
  each(s, n * dim, [=] __device__(std::int64_t e) {
    const std::int64_t i = e / dim, j = e % dim;
    const auto id = static_cast<std::int64_t>(ld64(ids, i));  // checked on the host
    st<T>(o, i * dim + j, ld<T>(table, id * dim + j));
  });
}
template <class T>
void embedding_backward_k(cudaStream_t s, View dt, View dout, View ids, std::int64_t n, std::int64_t dim,
                          std::int64_t table_numel) {
  each(s, table_numel, [=] __device__(std::int64_t i) { st<T>(dt, i, T(0)); });
  // One thread per column j walks the ids in ascending order: each element of dtable receives its
  // additions in the host's order, and no two threads write the same element.
  each(s, dim, [=] __device__(std::int64_t j) {
    for (std::int64_t i = 0; i < n; ++i) {
      const auto id = static_cast<std::int64_t>(ld64(ids, i));
      st<T>(dt, id * dim + j, ld<T>(dt, id * dim + j) + ld<T>(dout, i * dim + j));
    }
  });
}
template <class T>
void rmsnorm_k(cudaStream_t s, View o, View rstd, View x, View w, T e, std::int64_t rows, std::int64_t dim) {
  each(s, rows, [=] __device__(std::int64_t r) {
    T ss = 0;
    for (std::int64_t j = 0; j < dim; ++j) ss = ss + ld<T>(x, r * dim + j) * ld<T>(x, r * dim + j);
    const T inv = T(1) / dsqrt(ss / static_cast<T>(dim) + e);
    st<T>(rstd, r, inv);
    for (std::int64_t j = 0; j < dim; ++j) st<T>(o, r * dim + j, (ld<T>(x, r * dim + j) * inv) * ld<T>(w, j));
  });
}
template <class T>
void rmsnorm_backward_k(cudaStream_t s, View dx, View dw, View dout, View x, View w, View rstd,
                        std::int64_t rows, std::int64_t dim) {
  each(s, dim, [=] __device__(std::int64_t j) {
    T acc = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      acc = acc + ld<T>(dout, r * dim + j) * ld<T>(x, r * dim + j) * ld<T>(rstd, r);
    st<T>(dw, j, acc);
  });
  each(s, rows, [=] __device__(std::int64_t r) {
    const T inv = ld<T>(rstd, r);
    T c = 0;
    for (std::int64_t j = 0; j < dim; ++j) c = c + ld<T>(dout, r * dim + j) * ld<T>(w, j) * ld<T>(x, r * dim + j);
    const T k = inv * inv * c / static_cast<T>(dim);
    for (std::int64_t j = 0; j < dim; ++j)
      st<T>(dx, r * dim + j, inv * (ld<T>(w, j) * ld<T>(dout, r * dim + j) - ld<T>(x, r * dim + j) * k));
  });
}
template <class T>
void layernorm_k(cudaStream_t s, View o, View mean, View rstd, View x, View w, View b, T e, std::int64_t rows,
                 std::int64_t dim) {
  each(s, rows, [=] __device__(std::int64_t r) {
    T sum = 0;
    for (std::int64_t j = 0; j < dim; ++j) sum = sum + ld<T>(x, r * dim + j);
    const T mu = sum / static_cast<T>(dim);
    T ss = 0;
    for (std::int64_t j = 0; j < dim; ++j) {
      const T c = ld<T>(x, r * dim + j) - mu;
      ss = ss + c * c;
    }
    const T inv = T(1) / dsqrt(ss / static_cast<T>(dim) + e);
    st<T>(mean, r, mu);
    st<T>(rstd, r, inv);
    for (std::int64_t j = 0; j < dim; ++j)
      st<T>(o, r * dim + j, ((ld<T>(x, r * dim + j) - mu) * inv) * ld<T>(w, j) + ld<T>(b, j));
  });
}
template <class T>
void layernorm_backward_k(cudaStream_t s, View dx, View dw, View db, View dout, View x, View w, View mean,
                          View rstd, std::int64_t rows, std::int64_t dim) {
  each(s, dim, [=] __device__(std::int64_t j) {
    T aw = 0, ab = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const T xhat = (ld<T>(x, r * dim + j) - ld<T>(mean, r)) * ld<T>(rstd, r);
      aw = aw + ld<T>(dout, r * dim + j) * xhat;
      ab = ab + ld<T>(dout, r * dim + j);
    }
    st<T>(dw, j, aw);
    st<T>(db, j, ab);
  });
  each(s, rows, [=] __device__(std::int64_t r) {
    T c1 = 0, c2 = 0;
    for (std::int64_t j = 0; j < dim; ++j) {
      const T g = ld<T>(dout, r * dim + j) * ld<T>(w, j);
      c1 = c1 + g;
      c2 = c2 + g * ((ld<T>(x, r * dim + j) - ld<T>(mean, r)) * ld<T>(rstd, r));
    }
    const T m1 = c1 / static_cast<T>(dim), m2 = c2 / static_cast<T>(dim), inv = ld<T>(rstd, r);
    for (std::int64_t j = 0; j < dim; ++j) {
      const T g = ld<T>(dout, r * dim + j) * ld<T>(w, j);
      const T xhat = (ld<T>(x, r * dim + j) - ld<T>(mean, r)) * ld<T>(rstd, r);
      st<T>(dx, r * dim + j, inv * ((g - m1) - xhat * m2));
    }
  });
}
// Note [Transcendentals]: the f64 function, rounded once to the compute type.
template <class T>
__device__ __forceinline__ T tanh64(T x) {
  return static_cast<T>(tanh(static_cast<double>(x)));
}
template <class T>
__device__ __forceinline__ T exp64(T x) {
  return static_cast<T>(exp(static_cast<double>(x)));
}
template <class T>
void gelu_k(cudaStream_t s, View o, View x, std::int64_t n) {
  const T c = static_cast<T>(0.79788456080286535588), a = static_cast<T>(0.044715);
  each(s, n, [=] __device__(std::int64_t i) {
    const T v = ld<T>(x, i);
    const T t = tanh64(c * (v + a * ((v * v) * v)));
    st<T>(o, i, (T(0.5) * v) * (T(1) + t));
  });
}
template <class T>
void gelu_backward_k(cudaStream_t s, View dx, View dout, View x, std::int64_t n) {
  const T c = static_cast<T>(0.79788456080286535588), a = static_cast<T>(0.044715);
  each(s, n, [=] __device__(std::int64_t i) {
    const T v = ld<T>(x, i);
    const T t = tanh64(c * (v + a * ((v * v) * v)));
    const T d = T(0.5) * (T(1) + t) + ((T(0.5) * v) * (T(1) - t * t)) * (c * (T(1) + (T(3) * a) * (v * v)));
    st<T>(dx, i, ld<T>(dout, i) * d);
  });
}
template <class T>
void swiglu_k(cudaStream_t s, View o, View gate, View up, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) {
    const T g = ld<T>(gate, i);
    const T sg = T(1) / (T(1) + exp64(-g));
    st<T>(o, i, (g * sg) * ld<T>(up, i));
  });
}
template <class T>
void swiglu_backward_k(cudaStream_t s, View dgate, View dup, View dout, View gate, View up, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) {
    const T g = ld<T>(gate, i), u = ld<T>(up, i), d = ld<T>(dout, i);
    const T sg = T(1) / (T(1) + exp64(-g));
    st<T>(dup, i, d * (g * sg));
    st<T>(dgate, i, (d * u) * (sg * (T(1) + g * (T(1) - sg))));
  });
}
template <class T>
void unary_k(cudaStream_t s, View o, View x, int f, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) {
    const T v = ld<T>(x, i);
    T y = (v * v) * v;  // cube
    if (f == 0) y = tanh64(v);
    if (f == 1) y = v / (T(1) + exp64(-v));
    st<T>(o, i, y);
  });
}
template <class T>
void unary_backward_k(cudaStream_t s, View dx, View dout, View saved, int f, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) {
    const T v = ld<T>(saved, i);
    T d = T(3) * (v * v);  // cube
    if (f == 0) d = T(1) - v * v;
    if (f == 1) {
      const T sg = T(1) / (T(1) + exp64(-v));
      d = sg * (T(1) + v * (T(1) - sg));
    }
    st<T>(dx, i, ld<T>(dout, i) * d);
  });
}
// One thread per (row, i < dh/2): both halves of every head at that frequency.
template <class T>
void rope_k(cudaStream_t s, View o, View x, std::int64_t rows, std::int64_t heads, std::int64_t dh,
            std::int64_t seq, double base, bool inverse) {
  const std::int64_t half = dh / 2, width = heads * dh;
  each(s, rows * half, [=] __device__(std::int64_t k) {
    const std::int64_t r = k / half, i = k % half;
    const double angle = static_cast<double>(r % seq) *
                         pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
    const T cs = static_cast<T>(cos(angle));
    const T sn = static_cast<T>(inverse ? -sin(angle) : sin(angle));
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t lo = r * width + h * dh + i, hi = lo + half;
      const T x1 = ld<T>(x, lo), x2 = ld<T>(x, hi);
      st<T>(o, lo, x1 * cs - x2 * sn);
      st<T>(o, hi, x2 * cs + x1 * sn);
    }
  });
}
template <class T>
void causal_softmax_k(cudaStream_t s, View o, View x, std::int64_t rows, std::int64_t cols) {
  each(s, rows, [=] __device__(std::int64_t r) {
    const std::int64_t seen = r % cols + 1;
    T mx = -std::numeric_limits<T>::infinity();
    for (std::int64_t j = 0; j < seen; ++j) mx = host_max(mx, ld<T>(x, r * cols + j));
    T denom = 0;
    for (std::int64_t j = 0; j < seen; ++j) denom = denom + dexp(ld<T>(x, r * cols + j) - mx);
    for (std::int64_t j = 0; j < cols; ++j)
      st<T>(o, r * cols + j, j < seen ? dexp(ld<T>(x, r * cols + j) - mx) / denom : T(0));
  });
}
template <class T>
void softmax_backward_k(cudaStream_t s, View dx, View dout, View p, std::int64_t rows, std::int64_t cols) {
  each(s, rows, [=] __device__(std::int64_t r) {
    T acc = 0;
    for (std::int64_t j = 0; j < cols; ++j) acc = acc + ld<T>(p, r * cols + j) * ld<T>(dout, r * cols + j);
    for (std::int64_t j = 0; j < cols; ++j)
      st<T>(dx, r * cols + j, ld<T>(p, r * cols + j) * (ld<T>(dout, r * cols + j) - acc));
  });
}
void permute_k(cudaStream_t s, void* dst, const void* src, int esize, std::int64_t a, std::int64_t b,
               std::int64_t c, std::int64_t d) {
  each(s, a * b * c * d, [=] __device__(std::int64_t from) {
    const std::int64_t id = from % d, ic = (from / d) % c, ib = (from / (d * c)) % b, ia = from / (d * c * b);
    const std::int64_t to = ((ia * c + ic) * b + ib) * d + id;
    switch (esize) {
      case 2: static_cast<std::uint16_t*>(dst)[to] = static_cast<const std::uint16_t*>(src)[from]; break;
      case 4: static_cast<std::uint32_t*>(dst)[to] = static_cast<const std::uint32_t*>(src)[from]; break;
      default: static_cast<std::uint64_t*>(dst)[to] = static_cast<const std::uint64_t*>(src)[from]; break;
    }
  });
}

// Adam as DeepSpeed's CPU kernel computes it (engine/optimizer_math.h), f32 states; any grad dtype.
void adam_k(cudaStream_t s, float* pw, View g_, float* m, float* v, DsCpuAdamScalars a, std::int64_t body,
            std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) {
    float p = pw[i], mi = m[i], vi = v[i];
    ds_cpu_adam_element(a, i >= body, ld32(g_, i), p, mi, vi);
    m[i] = mi;
    v[i] = vi;
    pw[i] = p;
  });
}
void sgd_k(cudaStream_t s, float* pw, View g_, float* buf, TorchSgdScalars a, std::int64_t n) {
  each(s, n, [=] __device__(std::int64_t i) {
    float p = pw[i], b = a.use_momentum ? buf[i] : 0.0f;
    torch_sgd_element(a, ld32(g_, i), p, b);
    if (a.use_momentum) buf[i] = b;
    pw[i] = p;
  });
}

// out[i,j] = (acc ? out : 0) + sum_k a[i,k] b[k,j] in ascending k: 16x16 shared-memory tiles, each
// thread one output element, adding only the tile's real k (no padded zero products).
template <class T>
__global__ void matmul_kernel(View out, View a, View b, bool ta, bool tb, bool accumulate, std::int64_t m,
                              std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb) {
  __shared__ T as[kTile][kTile];
  __shared__ T bs[kTile][kTile];
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kTile + threadIdx.x;
  T acc = 0;
  for (std::int64_t k0 = 0; k0 < k; k0 += kTile) {
    const std::int64_t ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    as[threadIdx.y][threadIdx.x] = (i < m && ka < k) ? ld<T>(a, ta ? ka * lda + i : i * lda + ka) : T(0);
    bs[threadIdx.y][threadIdx.x] = (kb < k && j < n) ? ld<T>(b, tb ? j * ldb + kb : kb * ldb + j) : T(0);
    __syncthreads();
    const int kmax = static_cast<int>(k - k0 < kTile ? k - k0 : kTile);
    for (int kk = 0; kk < kmax; ++kk) acc = acc + as[threadIdx.y][kk] * bs[kk][threadIdx.x];
    __syncthreads();
  }
  if (i < m && j < n) {
    const std::int64_t o = i * n + j;
    st<T>(out, o, accumulate ? ld<T>(out, o) + acc : acc);
  }
}


// ---- launchers --------------------------------------------------------------------------------
#define ZC_F64_OR_F32(fn, ...)   \
  do {                           \
    if (f64) {                   \
      fn<double>(__VA_ARGS__);   \
    } else {                     \
      fn<float>(__VA_ARGS__);    \
    }                            \
  } while (0)

cudaError_t cast(cudaStream_t s, bool f64, View d, View x, std::int64_t n) {
  ZC_F64_OR_F32(cast_k, s, d, x, n);
  return cudaGetLastError();
}
cudaError_t axpy(cudaStream_t s, bool f64, View y, double alpha, View x, std::int64_t n) {
  if (f64) {
    axpy_k<double>(s, y, alpha, x, n);
  } else {
    axpy_k<float>(s, y, static_cast<float>(alpha), x, n);
  }
  return cudaGetLastError();
}
cudaError_t scale(cudaStream_t s, bool f64, View x, double alpha, std::int64_t n) {
  if (f64) {
    scale_k<double>(s, x, alpha, n);
  } else {
    scale_k<float>(s, x, static_cast<float>(alpha), n);
  }
  return cudaGetLastError();
}
cudaError_t div(cudaStream_t s, bool f64, View x, double divisor, std::int64_t n) {
  if (f64) {
    div_k<double>(s, x, divisor, n);
  } else {
    div_k<float>(s, x, static_cast<float>(divisor), n);
  }
  return cudaGetLastError();
}
cudaError_t add(cudaStream_t s, bool f64, View o, View a, View b, std::int64_t n) {
  ZC_F64_OR_F32(add_k, s, o, a, b, n);
  return cudaGetLastError();
}
cudaError_t mul(cudaStream_t s, bool f64, View o, View a, View b, std::int64_t n) {
  ZC_F64_OR_F32(mul_k, s, o, a, b, n);
  return cudaGetLastError();
}
cudaError_t fill(cudaStream_t s, View t, double v, std::int64_t n) {
  fill_k(s, t, v, n);
  return cudaGetLastError();
}
cudaError_t relu(cudaStream_t s, bool f64, View o, View x, std::int64_t n) {
  ZC_F64_OR_F32(relu_k, s, o, x, n);
  return cudaGetLastError();
}
cudaError_t relu_backward(cudaStream_t s, bool f64, View gi, View go, View x, std::int64_t n) {
  ZC_F64_OR_F32(relu_backward_k, s, gi, go, x, n);
  return cudaGetLastError();
}
cudaError_t add_row_vector(cudaStream_t s, bool f64, View o, View row, std::int64_t numel, std::int64_t n) {
  ZC_F64_OR_F32(add_row_vector_k, s, o, row, numel, n);
  return cudaGetLastError();
}
cudaError_t sum_rows(cudaStream_t s, bool f64, View o, View x, std::int64_t rows, std::int64_t n, bool accumulate) {
  ZC_F64_OR_F32(sum_rows_k, s, o, x, rows, n, accumulate);
  return cudaGetLastError();
}
cudaError_t scale_rows(cudaStream_t s, bool f64, View o, View x, View sc, std::int64_t numel, std::int64_t cols) {
  ZC_F64_OR_F32(scale_rows_k, s, o, x, sc, numel, cols);
  return cudaGetLastError();
}
cudaError_t row_dot(cudaStream_t s, bool f64, View o, View a, View c, std::int64_t rows, std::int64_t cols) {
  ZC_F64_OR_F32(row_dot_k, s, o, a, c, rows, cols);
  return cudaGetLastError();
}
cudaError_t softmax_xent(cudaStream_t s, bool f64, View dl, View loss, View logits, View labels, std::int64_t rows,
                         std::int64_t cols) {
  ZC_F64_OR_F32(softmax_xent_k, s, dl, loss, logits, labels, rows, cols);
  return cudaGetLastError();
}
cudaError_t argmax_rows(cudaStream_t s, std::int64_t* out, View x, std::int64_t rows, std::int64_t cols) {
  argmax_rows_k(s, out, x, rows, cols);
  return cudaGetLastError();
}
cudaError_t embedding(cudaStream_t s, bool f64, View o, View table, View ids, std::int64_t n, std::int64_t dim) {
  ZC_F64_OR_F32(embedding_k, s, o, table, ids, n, dim);
  return cudaGetLastError();
}
cudaError_t embedding_backward(cudaStream_t s, bool f64, View dt, View dout, View ids, std::int64_t n,
                               std::int64_t dim, std::int64_t table_numel) {
  ZC_F64_OR_F32(embedding_backward_k, s, dt, dout, ids, n, dim, table_numel);
  return cudaGetLastError();
}
cudaError_t rmsnorm(cudaStream_t s, bool f64, View o, View rstd, View x, View w, double eps, std::int64_t rows,
                    std::int64_t dim) {
  if (f64) {
    rmsnorm_k<double>(s, o, rstd, x, w, eps, rows, dim);
  } else {
    rmsnorm_k<float>(s, o, rstd, x, w, static_cast<float>(eps), rows, dim);
  }
  return cudaGetLastError();
}
cudaError_t rmsnorm_backward(cudaStream_t s, bool f64, View dx, View dw, View dout, View x, View w, View rstd,
                             std::int64_t rows, std::int64_t dim) {
  ZC_F64_OR_F32(rmsnorm_backward_k, s, dx, dw, dout, x, w, rstd, rows, dim);
  return cudaGetLastError();
}
cudaError_t layernorm(cudaStream_t s, bool f64, View o, View mean, View rstd, View x, View w, View b, double eps,
                      std::int64_t rows, std::int64_t dim) {
  if (f64) {
    layernorm_k<double>(s, o, mean, rstd, x, w, b, eps, rows, dim);
  } else {
    layernorm_k<float>(s, o, mean, rstd, x, w, b, static_cast<float>(eps), rows, dim);
  }
  return cudaGetLastError();
}
cudaError_t layernorm_backward(cudaStream_t s, bool f64, View dx, View dw, View db, View dout, View x, View w,
                               View mean, View rstd, std::int64_t rows, std::int64_t dim) {
  ZC_F64_OR_F32(layernorm_backward_k, s, dx, dw, db, dout, x, w, mean, rstd, rows, dim);
  return cudaGetLastError();
}
cudaError_t gelu(cudaStream_t s, bool f64, View o, View x, std::int64_t n) {
  ZC_F64_OR_F32(gelu_k, s, o, x, n);
  return cudaGetLastError();
}
cudaError_t gelu_backward(cudaStream_t s, bool f64, View dx, View dout, View x, std::int64_t n) {
  ZC_F64_OR_F32(gelu_backward_k, s, dx, dout, x, n);
  return cudaGetLastError();
}
cudaError_t swiglu(cudaStream_t s, bool f64, View o, View gate, View up, std::int64_t n) {
  ZC_F64_OR_F32(swiglu_k, s, o, gate, up, n);
  return cudaGetLastError();
}
cudaError_t swiglu_backward(cudaStream_t s, bool f64, View dgate, View dup, View dout, View gate, View up,
                            std::int64_t n) {
  ZC_F64_OR_F32(swiglu_backward_k, s, dgate, dup, dout, gate, up, n);
  return cudaGetLastError();
}
cudaError_t log_softmax_nll(cudaStream_t s, bool f64, View logp, View loss, View logits, View labels,
                            std::int64_t rows, std::int64_t cols) {
  ZC_F64_OR_F32(log_softmax_nll_k, s, logp, loss, logits, labels, rows, cols);
  return cudaGetLastError();
}
cudaError_t nll_loss_backward(cudaStream_t s, bool f64, View grad, View labels, double value, std::int64_t rows,
                              std::int64_t cols) {
  ZC_F64_OR_F32(nll_loss_backward_k, s, grad, labels, value, rows, cols);
  return cudaGetLastError();
}
cudaError_t log_softmax_backward(cudaStream_t s, bool f64, View dx, View dout, View logp, std::int64_t rows,
                                 std::int64_t cols) {
  ZC_F64_OR_F32(log_softmax_backward_k, s, dx, dout, logp, rows, cols);
  return cudaGetLastError();
}
cudaError_t unary(cudaStream_t s, bool f64, View o, View x, int f, std::int64_t n) {
  ZC_F64_OR_F32(unary_k, s, o, x, f, n);
  return cudaGetLastError();
}
cudaError_t unary_backward(cudaStream_t s, bool f64, View dx, View dout, View saved, int f, std::int64_t n) {
  ZC_F64_OR_F32(unary_backward_k, s, dx, dout, saved, f, n);
  return cudaGetLastError();
}
cudaError_t rope(cudaStream_t s, bool f64, View o, View x, std::int64_t rows, std::int64_t heads, std::int64_t dh,
                 std::int64_t seq, double base, bool inverse) {
  ZC_F64_OR_F32(rope_k, s, o, x, rows, heads, dh, seq, base, inverse);
  return cudaGetLastError();
}
cudaError_t causal_softmax(cudaStream_t s, bool f64, View o, View x, std::int64_t rows, std::int64_t cols) {
  ZC_F64_OR_F32(causal_softmax_k, s, o, x, rows, cols);
  return cudaGetLastError();
}
cudaError_t softmax_backward(cudaStream_t s, bool f64, View dx, View dout, View p, std::int64_t rows,
                             std::int64_t cols) {
  ZC_F64_OR_F32(softmax_backward_k, s, dx, dout, p, rows, cols);
  return cudaGetLastError();
}
cudaError_t permute_0213(cudaStream_t s, void* dst, const void* src, int esize, std::int64_t a, std::int64_t b,
                         std::int64_t c, std::int64_t d) {
  permute_k(s, dst, src, esize, a, b, c, d);
  return cudaGetLastError();
}
cudaError_t adam(cudaStream_t s, float* p, View g, float* m, float* v, DsCpuAdamScalars a, std::int64_t body,
                 std::int64_t n) {
  adam_k(s, p, g, m, v, a, body, n);
  return cudaGetLastError();
}
cudaError_t sgd(cudaStream_t s, float* p, View g, float* buf, TorchSgdScalars a, std::int64_t n) {
  sgd_k(s, p, g, buf, a, n);
  return cudaGetLastError();
}
cudaError_t matmul(cudaStream_t s, bool f64, View out, View a, View b, bool ta, bool tb, bool accumulate,
                   std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb) {
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>((m + kTile - 1) / kTile));
  const dim3 block(kTile, kTile);
  if (f64) {
    matmul_kernel<double><<<grid, block, 0, s>>>(out, a, b, ta, tb, accumulate, m, n, k, lda, ldb);
  } else {
    matmul_kernel<float><<<grid, block, 0, s>>>(out, a, b, ta, tb, accumulate, m, n, k, lda, ldb);
  }
  return cudaGetLastError();
}

cudaError_t reduce(cudaStream_t s, int kind, View x, View y, std::int64_t n, double* partials, std::int64_t width) {
  const Combine c = kind <= 1 ? Combine::sum : kind == 2 ? Combine::max_nan : Combine::max;
  // Padding: zeros, as the host pads; 0 is also the identity of max |x| and of "any non-finite".
  cudaError_t rc = cudaMemsetAsync(partials, 0, static_cast<std::size_t>(width) * sizeof(double), s);
  if (rc != cudaSuccess) return rc;
  const std::int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  reduce_blocks(s, kind, x, y, n, c, partials, static_cast<unsigned>(blocks));
  if ((rc = cudaGetLastError()) != cudaSuccess) return rc;
  std::int64_t w = width;
  for (; w > kReduceBlock; w /= 2) {
    const std::int64_t half = w / 2;
    tree_level_kernel<<<static_cast<unsigned>((half + 255) / 256), 256, 0, s>>>(partials, half, c);
    if ((rc = cudaGetLastError()) != cudaSuccess) return rc;
  }
  if (w > 1) tree_final_kernel<<<1, static_cast<unsigned>(w), 0, s>>>(partials, static_cast<unsigned>(w), c);
  return cudaGetLastError();
}

}  // namespace zc::real::kernels
