// PerturbingDevice: a HostDevice that gets one op slightly wrong: after the named op it flips one
// bit of element 0 of the op's output (the last mantissa bit, or a bit worth about 2^-4 of the value
// for the exp/log/tanh/sin ops, whose conformance bound is wider), or moves a returned value by one ulp. The
// negative control for the Device conformance table: each op's cases must catch it.
#pragma once

#include "engine/host_device.h"

#include <cmath>
#include <cstring>
#include <string>

namespace zc::conformance {

class PerturbingDevice final : public Device {
 public:
  explicit PerturbingDevice(std::string op) : op_(std::move(op)) { accounts_allocations_ = false; }
  Placement placement() const override { return Placement::host; }
  std::string name() const override { return "host-perturbed:" + op_; }
  const MemoryLedger& memory() const override { return inner_.memory(); }
  MemoryLedger& memory() override { return inner_.memory(); }
  const AllocatorStats* allocator_stats() const override { return inner_.allocator_stats(); }

  void copy(const Tensor& dst, const Tensor& src) override { inner_.copy(dst, src); hit("copy", dst); }
  void copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols, std::int64_t dst_stride,
               std::int64_t src_stride) override {
    inner_.copy_2d(dst, src, rows, cols, dst_stride, src_stride);
    hit("copy_2d", dst);
  }
  void fill(const Tensor& t, double value) override { inner_.fill(t, value); hit("fill", t); }
  void upload(const Tensor& dst, std::span<const std::byte> src) override { inner_.upload(dst, src); hit("upload_download", dst); }
  void download(std::span<std::byte> dst, const Tensor& src) override { inner_.download(dst, src); }
  void cast(const Tensor& dst, const Tensor& src) override { inner_.cast(dst, src); hit("cast", dst); }
  void axpy(const Tensor& y, double alpha, const Tensor& x) override { inner_.axpy(y, alpha, x); hit("axpy", y); }
  void scale(const Tensor& x, double alpha) override { inner_.scale(x, alpha); hit("scale", x); }
  void div(const Tensor& x, double divisor) override { inner_.div(x, divisor); hit("div", x); }
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override { inner_.add(out, a, b); hit("add", out); }
  void mul(const Tensor& out, const Tensor& a, const Tensor& b) override { inner_.mul(out, a, b); hit("mul", out); }
  double sum_sq(const Tensor& x) override { return nudge("sum_sq", inner_.sum_sq(x)); }
  double max_abs(const Tensor& x) override { return nudge("max_abs", inner_.max_abs(x)); }
  bool has_inf_nan(const Tensor& x) override { return inner_.has_inf_nan(x) != (op_ == "has_inf_nan"); }
  double dot(const Tensor& a, const Tensor& b) override { return nudge("dot", inner_.dot(a, b)); }
  void adam_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamParams& p) override {
    inner_.adam_step(param, grad, m, v, p);
    hit("adam_step", param);
  }
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdParams& p) override {
    inner_.sgd_step(param, grad, buf, p);
    hit("sgd_step", param);
  }
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, bool acc) override {
    inner_.matmul(out, a, b, ta, tb, acc);
    hit("matmul", out);
  }
  void relu(const Tensor& out, const Tensor& x) override { inner_.relu(out, x); hit("relu", out); }
  void relu_backward(const Tensor& gi, const Tensor& go, const Tensor& x) override { inner_.relu_backward(gi, go, x); hit("relu_backward", gi); }
  void add_row_vector(const Tensor& out, const Tensor& row) override { inner_.add_row_vector(out, row); hit("add_row_vector", out); }
  void sum_rows(const Tensor& out, const Tensor& x, bool acc) override { inner_.sum_rows(out, x, acc); hit("sum_rows", out); }
  void softmax_xent(const Tensor& dl, const Tensor& loss, const Tensor& logits, const Tensor& labels) override {
    inner_.softmax_xent(dl, loss, logits, labels);
    hit("softmax_xent", dl);
  }
  std::vector<std::int64_t> argmax_rows(const Tensor& x) override {
    std::vector<std::int64_t> a = inner_.argmax_rows(x);
    if (op_ == "argmax_rows" && !a.empty()) a[0] = a[0] == 0 ? 1 : 0;
    return a;
  }
  void scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) override { inner_.scale_rows(out, x, s); hit("scale_rows", out); }
  void row_dot(const Tensor& out, const Tensor& a, const Tensor& c) override { inner_.row_dot(out, a, c); hit("row_dot", out); }
  void embedding(const Tensor& out, const Tensor& table, const Tensor& ids) override { inner_.embedding(out, table, ids); hit("embedding", out); }
  void embedding_backward(const Tensor& dt, const Tensor& dout, const Tensor& ids) override {
    inner_.embedding_backward(dt, dout, ids);
    hit("embedding_backward", dt);
  }
  void layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w,
                 const Tensor& b, double eps) override {
    inner_.layernorm(out, mean, rstd, x, w, b, eps);
    hit("layernorm", out);
  }
  void layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x,
                          const Tensor& w, const Tensor& mean, const Tensor& rstd) override {
    inner_.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
    hit("layernorm_backward", dx);
  }
  void gelu(const Tensor& out, const Tensor& x) override { inner_.gelu(out, x); hit("gelu", out); }
  void gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) override {
    inner_.gelu_backward(dx, dout, x);
    hit("gelu_backward", dx);
  }
  void swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) override {
    inner_.swiglu(out, gate, up);
    hit("swiglu", out);
  }
  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up) override {
    inner_.swiglu_backward(dgate, dup, dout, gate, up);
    hit("swiglu_backward", dgate);
  }
  void log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                       const Tensor& labels) override {
    inner_.log_softmax_nll(logp, loss, logits, labels);
    hit("log_softmax_nll", logp);
  }
  void nll_loss_backward(const Tensor& grad, const Tensor& labels, double value) override {
    inner_.nll_loss_backward(grad, labels, value);
    hit("nll_loss_backward", grad);
  }
  void log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) override {
    inner_.log_softmax_backward(dx, dout, logp);
    hit("log_softmax_backward", dx);
  }
  void unary(const Tensor& out, const Tensor& x, Unary f) override {
    inner_.unary(out, x, f);
    hit("unary", out);
  }
  void unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved, Unary f) override {
    inner_.unary_backward(dx, dout, saved, f);
    hit("unary_backward", dx);
  }
  void rope(const Tensor& out, const Tensor& x, std::int64_t seq, std::int64_t heads, double base,
            bool inverse) override {
    inner_.rope(out, x, seq, heads, base, inverse);
    hit("rope", out);
  }
  void rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) override {
    inner_.rmsnorm(out, rstd, x, w, eps);
    hit("rmsnorm", out);
  }
  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                        const Tensor& rstd) override {
    inner_.rmsnorm_backward(dx, dw, dout, x, w, rstd);
    hit("rmsnorm_backward", dx);
  }
  void causal_softmax(const Tensor& out, const Tensor& x) override { inner_.causal_softmax(out, x); hit("causal_softmax", out); }
  void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) override {
    inner_.softmax_backward(dx, dout, p);
    hit("softmax_backward", dx);
  }
  void permute_0213(const Tensor& out, const Tensor& x, std::int64_t a, std::int64_t b, std::int64_t c,
                    std::int64_t d) override {
    inner_.permute_0213(out, x, a, b, c, d);
    hit("permute_0213", out);
  }

  MoeRoute moe_gate(const Tensor& weights, const Tensor& index, const Tensor& probs, const Tensor& logits,
                    std::int64_t capacity) override {
    MoeRoute r = inner_.moe_gate(weights, index, probs, logits, capacity);
    hit("moe_gate", weights);
    return r;
  }
  void moe_gate_backward(const Tensor& dlogits, const Tensor& dweights, const Tensor& probs, const Tensor& weights,
                         const Tensor& index) override {
    inner_.moe_gate_backward(dlogits, dweights, probs, weights, index);
    hit("moe_gate_backward", dlogits);
  }
  void gather_rows(const Tensor& out, const Tensor& x, const Tensor& index) override {
    inner_.gather_rows(out, x, index);
    hit("gather_rows", out);
  }
  void index_add_rows(const Tensor& out, const Tensor& x, const Tensor& index) override {
    inner_.index_add_rows(out, x, index);
    hit("index_add_rows", out);
  }

 protected:
  Tensor do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) override {
    return inner_.alloc(dtype, std::move(shape), std::move(label), category);
  }

 private:
  void hit(const char* op, const Tensor& t) {
    if (op_ != op || t.numel() == 0) return;
    const bool wide = op_ == "softmax_xent" || op_ == "log_softmax_nll" || op_ == "log_softmax_backward" || op_ == "causal_softmax" || op_ == "gelu" || op_ == "gelu_backward" ||
                      op_ == "swiglu" || op_ == "swiglu_backward" || op_ == "unary" || op_ == "unary_backward" || op_ == "rope" || op_ == "moe_gate" ||
                      op_ == "moe_gate_backward";
    const int bit = wide ? dtype_mantissa_bits(t.dtype()) - 5 : 0;
    std::uint64_t bits = 0;
    std::memcpy(&bits, t.raw(), static_cast<std::size_t>(dtype_size(t.dtype())));
    bits ^= std::uint64_t{1} << bit;
    std::memcpy(t.raw(), &bits, static_cast<std::size_t>(dtype_size(t.dtype())));
  }
  double nudge(const char* op, double v) { return op_ == op ? std::nextafter(v, INFINITY) : v; }

  std::string op_;
  HostDevice inner_;
};

}  // namespace zc::conformance
