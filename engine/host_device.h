// HostDevice: the Device on host memory, the reference every other backend must match bit for bit.
// MetaDevice: shapes only, no storage; validates shapes and counts FLOPs and bytes (the fake tensor).
#pragma once

#include "engine/device.h"

namespace zc {

class HostDevice final : public Device {
 public:
  // `tag` other than host makes this a stand-in for a GPU (Note [Emulated placement]).
  explicit HostDevice(Placement tag = Placement::host) : placement_(tag) {}
  Placement placement() const override { return placement_; }
  std::string name() const override { return placement_ == Placement::host ? "host" : "host-as-" + std::string(placement_name(placement_)); }

  void copy(const Tensor& dst, const Tensor& src) override;
  void copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols,
               std::int64_t dst_stride, std::int64_t src_stride) override;
  void fill(const Tensor& t, double value) override;
  void upload(const Tensor& dst, std::span<const std::byte> src) override;
  void download(std::span<std::byte> dst, const Tensor& src) override;
  // What calloc/free saw, per category (independent of memory()).
  const AllocatorStats* allocator_stats() const override { return alloc_stats_.get(); }
  void reset_allocator_peak() override { alloc_stats_->reset_peak(); }

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

 protected:
  Tensor do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) override;

 private:
  void on_or_cpu(const char* op, const Tensor& t) const;
  Placement placement_ = Placement::host;
  std::uint64_t next_storage_id_ = 0;
  std::shared_ptr<AllocatorStats> alloc_stats_ = std::make_shared<AllocatorStats>();
};

// Note [Emulated placement]
// HostDevice(Placement::cuda) computes in host memory exactly as HostDevice does, but tags its
// tensors `cuda` and, like CudaDevice, takes only its own tensors in every op except cast and copy,
// which also move data to and from host tensors (the CPU side of ZeRO-Offload). Running the engine
// on it shows, without a GPU, that the engine never hands a CPU tensor to a GPU op or to NCCL; the
// results are HostDevice's bits.

class MetaDevice final : public Device {
 public:
  Placement placement() const override { return Placement::meta; }
  std::string name() const override { return "meta"; }

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
  void bmm(const Tensor& out, const Tensor& a, const Tensor& b, const BmmShape& s, bool trans_a,
           bool trans_b, bool accumulate) override;
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
  MoeRoute moe_gate(const Tensor& weights, const Tensor& index, const Tensor& probs,
                    const Tensor& logits, std::int64_t capacity) override;
  void moe_gate_backward(const Tensor& dlogits, const Tensor& dweights, const Tensor& probs,
                         const Tensor& weights, const Tensor& index) override;
  void gather_rows(const Tensor& out, const Tensor& x, const Tensor& index) override;
  void index_add_rows(const Tensor& out, const Tensor& x, const Tensor& index) override;

 protected:
  Tensor do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) override;

 private:
  std::uint64_t next_storage_id_ = 0;
};

// Shape checks shared by every Device implementation; throw UsageError naming the op.
namespace device_check {
void same_numel(const char* op, const Tensor& a, const Tensor& b);
void same_dtype(const char* op, const Tensor& a, const Tensor& b);
void on(const char* op, const Tensor& t, Placement placement);
void f32_state(const char* op, const Tensor& t);
// The MoE ops' shapes (device.h): wide and wide2 [N, E], narrow and index [N, k] with 1 <= k <= E;
// indexed [M, D] with M indices into the rows of dense [*, D].
void moe_gate_shapes(const char* op, const Tensor& wide, const Tensor& wide2, const Tensor& narrow,
                     const Tensor& index);
void index_rows_shapes(const char* op, const Tensor& indexed, const Tensor& dense,
                       const Tensor& index);
struct MatmulDims {
  std::int64_t m, n, k;
};
MatmulDims matmul_dims(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                       bool trans_b);
std::int64_t row_len(const char* op, const Tensor& matrix, const Tensor& row);
std::int64_t rows(const char* op, const Tensor& matrix);  // dim 0 of a 2-D tensor
// copy_2d's arguments: same dtype, no overlap, and both views hold every element they name.
void copy_2d_extent(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols,
                    std::int64_t dst_stride, std::int64_t src_stride);
}  // namespace device_check

}  // namespace zc
