// SimDevice: a rank's HostDevice behind the race detector, and the clock that charges compute time.
//
// Note [Race detection]
// Every Device op names the tensors it reads and writes. Before it runs, each is checked against
// the rank's async collectives that are issued and not yet waited: writing an input or output
// buffer of one, or reading its output, is a DataRace naming the op, the buffer and the
// collective. The check follows happens-before (wait()), not the seeded completion time, so a
// race is reported on every schedule, not only on the unlucky ones.
#pragma once

#include "engine/device.h"

namespace zc::sim {

class ClusterState;

class SimDevice final : public Device {
 public:
  SimDevice(ClusterState& cluster, int rank, Device& inner);

  Placement placement() const override { return inner_.placement(); }
  const MemoryLedger& memory() const override { return inner_.memory(); }
  MemoryLedger& memory() override { return inner_.memory(); }
  const AllocatorStats* allocator_stats() const override { return inner_.allocator_stats(); }
  void reset_allocator_peak() override { inner_.reset_allocator_peak(); }
  std::string name() const override { return "sim:" + inner_.name(); }

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
  // The inner device allocates and counts (accounts_allocations_ is false here).
  Tensor do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) override;

 private:
  // Checks reads then writes, runs `body` on the inner device, then charges its cost.
  template <class Body>
  auto guarded(const char* op, std::initializer_list<const Tensor*> reads,
               std::initializer_list<const Tensor*> writes, Body&& body);

  ClusterState& cluster_;
  int rank_;
  Device& inner_;
};

}  // namespace zc::sim
