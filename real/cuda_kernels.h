// The launchers of CudaDevice's kernels (real/cuda_device.cu). Each enqueues its kernel(s) on
// stream `s` and returns cudaGetLastError(); cuda_device.cpp checks the result and does every
// argument check first. `f64`: compute in double (some operand is f64), else in float, exactly
// HostDevice's with_compute. Scalars arrive as double and are rounded to the compute type here,
// as HostDevice does.
#pragma once

#include "engine/optimizer_math.h"  // DsCpuAdamScalars (no fmt: nvcc compiles this header)
#include "engine/device.h"     // DType, kReduceBlock

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zc::real::kernels {

// A tensor as a kernel sees it: base pointer (already at the view's offset) and dtype.
struct View {
  void* p;
  DType t;
};

enum class Combine : int { sum, max_nan, max };
inline constexpr int kTile = 16;  // matmul tile edge


cudaError_t cast(cudaStream_t s, bool f64, View d, View x, std::int64_t n);
cudaError_t axpy(cudaStream_t s, bool f64, View y, double alpha, View x, std::int64_t n);
cudaError_t scale(cudaStream_t s, bool f64, View x, double alpha, std::int64_t n);
cudaError_t div(cudaStream_t s, bool f64, View x, double divisor, std::int64_t n);
cudaError_t add(cudaStream_t s, bool f64, View o, View a, View b, std::int64_t n);
cudaError_t mul(cudaStream_t s, bool f64, View o, View a, View b, std::int64_t n);
cudaError_t fill(cudaStream_t s, View t, double v, std::int64_t n);
cudaError_t relu(cudaStream_t s, bool f64, View o, View x, std::int64_t n);
cudaError_t relu_backward(cudaStream_t s, bool f64, View gi, View go, View x, std::int64_t n);
cudaError_t add_row_vector(cudaStream_t s, bool f64, View o, View row, std::int64_t numel, std::int64_t n);
cudaError_t sum_rows(cudaStream_t s, bool f64, View o, View x, std::int64_t rows, std::int64_t n, bool accumulate);
cudaError_t scale_rows(cudaStream_t s, bool f64, View o, View x, View sc, std::int64_t numel, std::int64_t cols);
cudaError_t row_dot(cudaStream_t s, bool f64, View o, View a, View c, std::int64_t rows, std::int64_t cols);
cudaError_t softmax_xent(cudaStream_t s, bool f64, View dl, View loss, View logits, View labels, std::int64_t rows,
                         std::int64_t cols);
cudaError_t argmax_rows(cudaStream_t s, std::int64_t* out, View x, std::int64_t rows, std::int64_t cols);
cudaError_t embedding(cudaStream_t s, bool f64, View o, View table, View ids, std::int64_t n, std::int64_t dim);
cudaError_t embedding_backward(cudaStream_t s, bool f64, View dt, View dout, View ids, std::int64_t n,
                               std::int64_t dim, std::int64_t table_numel);
cudaError_t rmsnorm(cudaStream_t s, bool f64, View o, View rstd, View x, View w, double eps, std::int64_t rows,
                    std::int64_t dim);
cudaError_t rmsnorm_backward(cudaStream_t s, bool f64, View dx, View dw, View dout, View x, View w, View rstd,
                             std::int64_t rows, std::int64_t dim);
cudaError_t causal_softmax(cudaStream_t s, bool f64, View o, View x, std::int64_t rows, std::int64_t cols);
cudaError_t softmax_backward(cudaStream_t s, bool f64, View dx, View dout, View p, std::int64_t rows,
                             std::int64_t cols);
cudaError_t permute_0213(cudaStream_t s, void* dst, const void* src, int esize, std::int64_t a, std::int64_t b,
                         std::int64_t c, std::int64_t d);
cudaError_t layernorm(cudaStream_t s, bool f64, View o, View mean, View rstd, View x, View w, View b, double eps,
                      std::int64_t rows, std::int64_t dim);
cudaError_t layernorm_backward(cudaStream_t s, bool f64, View dx, View dw, View db, View dout, View x, View w,
                               View mean, View rstd, std::int64_t rows, std::int64_t dim);
cudaError_t gelu(cudaStream_t s, bool f64, View o, View x, std::int64_t n);
cudaError_t gelu_backward(cudaStream_t s, bool f64, View dx, View dout, View x, std::int64_t n);
cudaError_t swiglu(cudaStream_t s, bool f64, View o, View gate, View up, std::int64_t n);
cudaError_t swiglu_backward(cudaStream_t s, bool f64, View dgate, View dup, View dout, View gate, View up,
                            std::int64_t n);
cudaError_t log_softmax_nll(cudaStream_t s, bool f64, View logp, View loss, View logits, View labels,
                            std::int64_t rows, std::int64_t cols);
cudaError_t nll_loss_backward(cudaStream_t s, bool f64, View grad, View labels, double value, std::int64_t rows,
                              std::int64_t cols);
cudaError_t log_softmax_backward(cudaStream_t s, bool f64, View dx, View dout, View logp, std::int64_t rows,
                                 std::int64_t cols);
// f: the Unary's value (engine/device.h): 0 tanh, 1 silu, 2 cube.
cudaError_t unary(cudaStream_t s, bool f64, View o, View x, int f, std::int64_t n);
cudaError_t unary_backward(cudaStream_t s, bool f64, View dx, View dout, View saved, int f, std::int64_t n);
cudaError_t rope(cudaStream_t s, bool f64, View o, View x, std::int64_t rows, std::int64_t heads, std::int64_t dh,
                 std::int64_t seq, double base, bool inverse);
// DeepSpeed's CPU Adam (Note [DeepSpeed CPU Adam]): elements at index >= body take the tail's order.
cudaError_t adam(cudaStream_t s, float* p, View g, float* m, float* v, DsCpuAdamScalars a, std::int64_t body,
                 std::int64_t n);
// torch.optim.SGD (engine/optimizer_math.h); buf is null without momentum.
cudaError_t sgd(cudaStream_t s, float* p, View g, float* buf, TorchSgdScalars a, std::int64_t n);
cudaError_t matmul(cudaStream_t s, bool f64, View out, View a, View b, bool ta, bool tb, bool accumulate,
                   std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb);
// Note [Canonical reduction order] over n terms (kind 0: x^2, 1: x*y, 2: |x| with NaN winning,
// 3: 1 if non-finite). `partials` holds `width` = bit_ceil(blocks) doubles; the result is left in
// partials[0].
cudaError_t reduce(cudaStream_t s, int kind, View x, View y, std::int64_t n, double* partials, std::int64_t width);

}  // namespace zc::real::kernels
