// CudaDevice: the Device on one GPU. Every op is a CUDA kernel with the operation order of
// HostDevice written out element for element, built with --fmad=false, IEEE division and sqrt and
// no flush-to-zero, so it gives HostDevice's bits (Note [Canonical reduction order] for the
// reductions: one 1024-thread block per leaf block, shared-memory stride-halving trees, no atomics).
// The exceptions are the ops that call exp/log (softmax_xent, causal_softmax), where CUDA's expf
// and logf are within 2 and 1 ulp, not correctly rounded; device_conformance.h states their bounds.
//
// Kernels run in order on the device's compute stream; ops that return a value (sum_sq, max_abs,
// has_inf_nan, dot, argmax_rows) and download() synchronise with it. Memory comes from the
// stream-ordered allocator (cudaMallocAsync/cudaFreeAsync on the compute stream). cast() and copy()
// also move data between this GPU and host tensors (the CPU side of ZeRO-Offload).
//
// This header has no CUDA include, so the CLI and tests need no CUDA compiler; built only when CMake
// finds nvcc and nccl.h (ZC_HAVE_CUDA).
#pragma once

#include "engine/device.h"

#include <memory>
#include <string>

namespace zc::real {

// How many GPUs this process can use; 0 with the reason in *why (no driver, no device, ...).
int cuda_device_count(std::string* why = nullptr);

class CudaDevice final : public Device {
 public:
  // Binds this thread to GPU `index` (cudaSetDevice) and creates the compute stream.
  explicit CudaDevice(int index = 0);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  Placement placement() const override { return Placement::cuda; }
  std::string name() const override;  // "cuda:0 (NVIDIA H200)"
  int index() const;
  std::string gpu_name() const;
  void* stream() const;  // the compute stream, a cudaStream_t
  void synchronize();    // waits for the compute stream, raising any kernel error

  // What cudaMallocAsync and the storage deleters' cudaFreeAsync saw, per category: the
  // independent measure a meta run's ledger is checked against (Note [GPU memory measures]).
  const AllocatorStats* allocator_stats() const override;
  void reset_allocator_peak() override;
  // The stream-ordered pool's own high-water mark of bytes in use (cudaMemPoolAttrUsedMemHigh)
  // since the last reset_allocator_peak(): the driver's count, which includes the reductions'
  // scratch buffers and the pool's rounding, so it is at least allocator_stats()->peak_total.
  std::int64_t pool_used_high() const;

  void copy(const Tensor& dst, const Tensor& src) override;
  void copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols,
               std::int64_t dst_stride, std::int64_t src_stride) override;
  void fill(const Tensor& t, double value) override;
  void upload(const Tensor& dst, std::span<const std::byte> src) override;
  void download(std::span<std::byte> dst, const Tensor& src) override;

  void cast(const Tensor& dst, const Tensor& src) override;
  void axpy(const Tensor& y, double alpha, const Tensor& x) override;
  void scale(const Tensor& x, double alpha) override;
  void div(const Tensor& x, double divisor) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void mul(const Tensor& out, const Tensor& a, const Tensor& b) override;

  double sum_sq(const Tensor& x) override;
  double max_abs(const Tensor& x) override;
  bool has_inf_nan(const Tensor& x) override;
  double dot(const Tensor& a, const Tensor& b) override;

  void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const AdamParams& p) override;
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                const SgdParams& p) override;

  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
              bool accumulate) override;
  void relu(const Tensor& out, const Tensor& x) override;
  void relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& x) override;
  void add_row_vector(const Tensor& out, const Tensor& row) override;
  void sum_rows(const Tensor& out, const Tensor& x, bool accumulate) override;
  void softmax_xent(const Tensor& dlogits, const Tensor& row_loss, const Tensor& logits,
                    const Tensor& labels) override;
  void log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                       const Tensor& labels) override;
  void nll_loss_backward(const Tensor& grad, const Tensor& labels, double value) override;
  void log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) override;
  std::vector<std::int64_t> argmax_rows(const Tensor& x) override;
  void scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) override;
  void row_dot(const Tensor& out, const Tensor& a, const Tensor& c) override;
  void embedding(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) override;
  void rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
               double eps) override;
  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& rstd) override;
  void causal_softmax(const Tensor& out, const Tensor& x) override;
  void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) override;
  void permute_0213(const Tensor& out, const Tensor& x, std::int64_t a, std::int64_t b,
                    std::int64_t c, std::int64_t d) override;
  void layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                 const Tensor& w, const Tensor& b, double eps) override;
  void layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                          const Tensor& x, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd) override;
  void gelu(const Tensor& out, const Tensor& x) override;
  void gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) override;
  void swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                       const Tensor& gate, const Tensor& up) override;
  void unary(const Tensor& out, const Tensor& x, Unary f) override;
  void unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved, Unary f) override;
  void rope(const Tensor& out, const Tensor& x, std::int64_t seq, std::int64_t heads, double base,
            bool inverse) override;

  struct State;  // device index, stream, allocator bookkeeping (shared with storage deleters)

 protected:
  Tensor do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) override;

 private:
  double reduce(const Tensor& x, const Tensor* y, int kind);
  void check_ids(const char* op, const Tensor& ids, std::int64_t limit);
  std::shared_ptr<State> st_;
};

}  // namespace zc::real
