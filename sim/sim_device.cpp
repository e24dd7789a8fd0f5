// SimDevice: forwards every op to the rank's HostDevice after the race checks of Note [Race
// detection], and charges the op's FLOPs and bytes to the rank's simulated clock.
#include "sim/sim_device.h"

#include "sim/cluster_state.h"

namespace zc::sim {

SimDevice::SimDevice(ClusterState& cluster, int rank, Device& inner)
    : cluster_(cluster), rank_(rank), inner_(inner) {
  accounts_allocations_ = false;  // the inner device's ledger counts
}

template <class Body>
auto SimDevice::guarded(const char* op, std::initializer_list<const Tensor*> reads,
                        std::initializer_list<const Tensor*> writes, Body&& body) {
  cluster_.before_device_op(rank_, op);
  for (const Tensor* t : reads) cluster_.check_read(rank_, op, *t);
  for (const Tensor* t : writes) cluster_.check_write(rank_, op, *t);
  const DeviceCounters before = inner_.counters();
  struct Charge {  // charges even when body returns a value
    SimDevice& self;
    const DeviceCounters& before;
    ~Charge() {  // on_device_op is noexcept: it only advances the clock
      const DeviceCounters& after = self.inner_.counters();
      self.counters_ = after;
      self.cluster_.on_device_op(self.rank_, after.flops - before.flops,
                                 (after.bytes_read - before.bytes_read) +
                                     (after.bytes_written - before.bytes_written));
    }
  } charge{*this, before};
  return body();
}

Tensor SimDevice::do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) {
  return guarded("alloc", {}, {}, [&] {
    return inner_.alloc(dtype, std::move(shape), std::move(label), category);
  });
}
void SimDevice::copy(const Tensor& dst, const Tensor& src) {
  guarded("copy", {&src}, {&dst}, [&] { inner_.copy(dst, src); });
}
void SimDevice::copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols,
                        std::int64_t dst_stride, std::int64_t src_stride) {
  guarded("copy_2d", {&src}, {&dst},
          [&] { inner_.copy_2d(dst, src, rows, cols, dst_stride, src_stride); });
}
void SimDevice::bmm(const Tensor& out, const Tensor& a, const Tensor& b, const BmmShape& s,
                    bool trans_a, bool trans_b, bool accumulate) {
  guarded("bmm", {&a, &b, &out}, {&out},
          [&] { inner_.bmm(out, a, b, s, trans_a, trans_b, accumulate); });
}
void SimDevice::fill(const Tensor& t, double value) {
  guarded("fill", {}, {&t}, [&] { inner_.fill(t, value); });
}
void SimDevice::upload(const Tensor& dst, std::span<const std::byte> src) {
  guarded("upload", {}, {&dst}, [&] { inner_.upload(dst, src); });
}
void SimDevice::download(std::span<std::byte> dst, const Tensor& src) {
  guarded("download", {&src}, {}, [&] { inner_.download(dst, src); });
}
void SimDevice::cast(const Tensor& dst, const Tensor& src) {
  guarded("cast", {&src}, {&dst}, [&] { inner_.cast(dst, src); });
}
void SimDevice::axpy(const Tensor& y, double alpha, const Tensor& x) {
  guarded("axpy", {&x, &y}, {&y}, [&] { inner_.axpy(y, alpha, x); });
}
void SimDevice::scale(const Tensor& x, double alpha) {
  guarded("scale", {&x}, {&x}, [&] { inner_.scale(x, alpha); });
}
void SimDevice::div(const Tensor& x, double divisor) {
  guarded("div", {&x}, {&x}, [&] { inner_.div(x, divisor); });
}
void SimDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  guarded("add", {&a, &b}, {&out}, [&] { inner_.add(out, a, b); });
}
void SimDevice::mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  guarded("mul", {&a, &b}, {&out}, [&] { inner_.mul(out, a, b); });
}
double SimDevice::sum_sq(const Tensor& x) {
  return guarded("sum_sq", {&x}, {}, [&] { return inner_.sum_sq(x); });
}
double SimDevice::max_abs(const Tensor& x) {
  return guarded("max_abs", {&x}, {}, [&] { return inner_.max_abs(x); });
}
bool SimDevice::has_inf_nan(const Tensor& x) {
  return guarded("has_inf_nan", {&x}, {}, [&] { return inner_.has_inf_nan(x); });
}
double SimDevice::dot(const Tensor& a, const Tensor& b) {
  return guarded("dot", {&a, &b}, {}, [&] { return inner_.dot(a, b); });
}
void SimDevice::log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                                const Tensor& labels) {
  guarded("log_softmax_nll", {&logits, &labels}, {&logp, &loss},
          [&] { inner_.log_softmax_nll(logp, loss, logits, labels); });
}
void SimDevice::nll_loss_backward(const Tensor& grad, const Tensor& labels, double value) {
  guarded("nll_loss_backward", {&labels}, {&grad}, [&] { inner_.nll_loss_backward(grad, labels, value); });
}
void SimDevice::log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) {
  guarded("log_softmax_backward", {&dout, &logp}, {&dx}, [&] { inner_.log_softmax_backward(dx, dout, logp); });
}
void SimDevice::softmax_xent(const Tensor& dlogits, const Tensor& row_loss, const Tensor& logits,
                             const Tensor& labels) {
  guarded("softmax_xent", {&logits, &labels}, {&dlogits, &row_loss},
          [&] { inner_.softmax_xent(dlogits, row_loss, logits, labels); });
}
MoeRoute SimDevice::moe_gate(const Tensor& weights, const Tensor& index, const Tensor& probs,
                             const Tensor& logits, std::int64_t capacity) {
  return guarded("moe_gate", {&logits}, {&weights, &index, &probs},
                 [&] { return inner_.moe_gate(weights, index, probs, logits, capacity); });
}
void SimDevice::moe_gate_backward(const Tensor& dlogits, const Tensor& dweights,
                                  const Tensor& probs, const Tensor& weights, const Tensor& index) {
  guarded("moe_gate_backward", {&dweights, &probs, &weights, &index}, {&dlogits},
          [&] { inner_.moe_gate_backward(dlogits, dweights, probs, weights, index); });
}
void SimDevice::gather_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  guarded("gather_rows", {&x, &index}, {&out}, [&] { inner_.gather_rows(out, x, index); });
}
void SimDevice::index_add_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  guarded("index_add_rows", {&out, &x, &index}, {&out},
          [&] { inner_.index_add_rows(out, x, index); });
}
std::vector<std::int64_t> SimDevice::argmax_rows(const Tensor& x) {
  return guarded("argmax_rows", {&x}, {}, [&] { return inner_.argmax_rows(x); });
}
void SimDevice::scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) {
  guarded("scale_rows", {&x, &s}, {&out}, [&] { inner_.scale_rows(out, x, s); });
}
void SimDevice::row_dot(const Tensor& out, const Tensor& a, const Tensor& c) {
  guarded("row_dot", {&a, &c}, {&out}, [&] { inner_.row_dot(out, a, c); });
}
void SimDevice::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                          const Tensor& exp_avg_sq, const AdamParams& p) {
  guarded("adam_step", {&param, &grad, &exp_avg, &exp_avg_sq}, {&param, &exp_avg, &exp_avg_sq},
          [&] { inner_.adam_step(param, grad, exp_avg, exp_avg_sq, p); });
}
void SimDevice::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                         const SgdParams& p) {
  guarded("sgd_step", {&param, &grad, &momentum_buf}, {&param, &momentum_buf},
          [&] { inner_.sgd_step(param, grad, momentum_buf, p); });
}
void SimDevice::matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                       bool trans_b, bool accumulate) {
  guarded("matmul", {&a, &b, &out}, {&out},
          [&] { inner_.matmul(out, a, b, trans_a, trans_b, accumulate); });
}
void SimDevice::relu(const Tensor& out, const Tensor& x) {
  guarded("relu", {&x}, {&out}, [&] { inner_.relu(out, x); });
}
void SimDevice::relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& x) {
  guarded("relu_backward", {&grad_out, &x}, {&grad_in},
          [&] { inner_.relu_backward(grad_in, grad_out, x); });
}
void SimDevice::add_row_vector(const Tensor& out, const Tensor& row) {
  guarded("add_row_vector", {&out, &row}, {&out}, [&] { inner_.add_row_vector(out, row); });
}
void SimDevice::sum_rows(const Tensor& out, const Tensor& x, bool accumulate) {
  guarded("sum_rows", {&x, &out}, {&out}, [&] { inner_.sum_rows(out, x, accumulate); });
}

void SimDevice::embedding(const Tensor& out, const Tensor& table, const Tensor& ids) {
  guarded("embedding", {&table, &ids}, {&out}, [&] { inner_.embedding(out, table, ids); });
}
void SimDevice::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  guarded("embedding_backward", {&dout, &ids}, {&dtable},
          [&] { inner_.embedding_backward(dtable, dout, ids); });
}
void SimDevice::rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                        double eps) {
  guarded("rmsnorm", {&x, &w}, {&out, &rstd}, [&] { inner_.rmsnorm(out, rstd, x, w, eps); });
}
void SimDevice::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                 const Tensor& x, const Tensor& w, const Tensor& rstd) {
  guarded("rmsnorm_backward", {&dout, &x, &w, &rstd}, {&dx, &dw},
          [&] { inner_.rmsnorm_backward(dx, dw, dout, x, w, rstd); });
}
void SimDevice::causal_softmax(const Tensor& out, const Tensor& x) {
  guarded("causal_softmax", {&x}, {&out}, [&] { inner_.causal_softmax(out, x); });
}
void SimDevice::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) {
  guarded("softmax_backward", {&dout, &p}, {&dx}, [&] { inner_.softmax_backward(dx, dout, p); });
}
void SimDevice::permute_0213(const Tensor& out, const Tensor& x, std::int64_t a, std::int64_t b,
                             std::int64_t c, std::int64_t d) {
  guarded("permute_0213", {&x}, {&out}, [&] { inner_.permute_0213(out, x, a, b, c, d); });
}

void SimDevice::layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                          const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  guarded("layernorm", {&x, &w, &b}, {&out, &mean, &rstd},
          [&] { inner_.layernorm(out, mean, rstd, x, w, b, eps); });
}
void SimDevice::layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                   const Tensor& dout, const Tensor& x, const Tensor& w,
                                   const Tensor& mean, const Tensor& rstd) {
  guarded("layernorm_backward", {&dout, &x, &w, &mean, &rstd}, {&dx, &dw, &db},
          [&] { inner_.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd); });
}
void SimDevice::gelu(const Tensor& out, const Tensor& x) {
  guarded("gelu", {&x}, {&out}, [&] { inner_.gelu(out, x); });
}
void SimDevice::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  guarded("gelu_backward", {&dout, &x}, {&dx}, [&] { inner_.gelu_backward(dx, dout, x); });
}
void SimDevice::swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  guarded("swiglu", {&gate, &up}, {&out}, [&] { inner_.swiglu(out, gate, up); });
}
void SimDevice::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                const Tensor& gate, const Tensor& up) {
  guarded("swiglu_backward", {&dout, &gate, &up}, {&dgate, &dup},
          [&] { inner_.swiglu_backward(dgate, dup, dout, gate, up); });
}
void SimDevice::unary(const Tensor& out, const Tensor& x, Unary f) {
  guarded(unary_name(f), {&x}, {&out}, [&] { inner_.unary(out, x, f); });
}
void SimDevice::unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved, Unary f) {
  guarded(unary_name(f), {&dout, &saved}, {&dx}, [&] { inner_.unary_backward(dx, dout, saved, f); });
}
void SimDevice::rope(const Tensor& out, const Tensor& x, std::int64_t seq, std::int64_t heads,
                     double base, bool inverse) {
  guarded("rope", {&x}, {&out}, [&] { inner_.rope(out, x, seq, heads, base, inverse); });
}

}  // namespace zc::sim
