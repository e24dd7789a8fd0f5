// MetaDevice: the fake-tensor device. Every op validates its shapes exactly as HostDevice does and
// counts the FLOPs and bytes the real kernel would, but moves no data; reductions return 0.
#include "engine/errors.h"
#include "engine/host_device.h"

namespace zc {

using namespace device_check;

namespace {
void tally(DeviceCounters& c, std::int64_t flops, std::int64_t read, std::int64_t written) {
  c.kernels += 1;
  c.flops += flops;
  c.bytes_read += read;
  c.bytes_written += written;
}
void all_meta(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) on(op, *t, Placement::meta);
}
}  // namespace

// A Storage without data: the allocation's identity and lifetime, no bytes.
Tensor MetaDevice::do_alloc(DType dtype, Shape shape, std::string label, MemCategory) {
  const std::int64_t bytes = shape_numel(shape) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>();
  storage->bytes = bytes;
  storage->placement = Placement::meta;
  storage->id = next_storage_id_++;
  storage->name = std::move(label);
  counters_.bytes_allocated += bytes;
  return Tensor(dtype, std::move(shape), Placement::meta, std::move(storage));
}

void MetaDevice::copy(const Tensor& dst, const Tensor& src) {
  all_meta("copy", {&dst, &src});
  same_numel("copy", dst, src);
  same_dtype("copy", dst, src);
  tally(counters_, 0, src.nbytes(), dst.nbytes());
}
void MetaDevice::copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows,
                         std::int64_t cols, std::int64_t dst_stride, std::int64_t src_stride) {
  all_meta("copy_2d", {&dst, &src});
  copy_2d_extent(dst, src, rows, cols, dst_stride, src_stride);
  const std::int64_t bytes = rows * cols * dtype_size(src.dtype());
  tally(counters_, 0, bytes, bytes);
}
void MetaDevice::fill(const Tensor& t, double) {
  all_meta("fill", {&t});
  tally(counters_, 0, 0, t.nbytes());
}
void MetaDevice::upload(const Tensor& dst, std::span<const std::byte>) {
  throw UsageError(fmt::format("upload into meta tensor {}: meta tensors have no data",
                               dst.describe()));
}
void MetaDevice::download(std::span<std::byte>, const Tensor& src) {
  throw UsageError(fmt::format("download of meta tensor {}: meta tensors have no data; "
                               "run on a host or cuda device to read values", src.describe()));
}
void MetaDevice::cast(const Tensor& dst, const Tensor& src) {
  all_meta("cast", {&dst, &src});
  same_numel("cast", dst, src);
  tally(counters_, 0, src.nbytes(), dst.nbytes());
}
void MetaDevice::axpy(const Tensor& y, double, const Tensor& x) {
  all_meta("axpy", {&y, &x});
  same_numel("axpy", y, x);
  tally(counters_, 2 * y.numel(), x.nbytes() + y.nbytes(), y.nbytes());
}
void MetaDevice::scale(const Tensor& x, double) {
  all_meta("scale", {&x});
  tally(counters_, x.numel(), x.nbytes(), x.nbytes());
}
void MetaDevice::div(const Tensor& x, double) {
  all_meta("div", {&x});
  tally(counters_, x.numel(), x.nbytes(), x.nbytes());
}
void MetaDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  all_meta("add", {&out, &a, &b});
  same_numel("add", out, a);
  same_numel("add", out, b);
  tally(counters_, out.numel(), a.nbytes() + b.nbytes(), out.nbytes());
}
void MetaDevice::mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  all_meta("mul", {&out, &a, &b});
  same_numel("mul", out, a);
  same_numel("mul", out, b);
  tally(counters_, out.numel(), a.nbytes() + b.nbytes(), out.nbytes());
}
double MetaDevice::sum_sq(const Tensor& x) {
  all_meta("sum_sq", {&x});
  tally(counters_, 2 * x.numel(), x.nbytes(), 0);
  return 0.0;
}
double MetaDevice::max_abs(const Tensor& x) {
  all_meta("max_abs", {&x});
  tally(counters_, x.numel(), x.nbytes(), 0);
  return 0.0;
}
bool MetaDevice::has_inf_nan(const Tensor& x) {
  all_meta("has_inf_nan", {&x});
  tally(counters_, x.numel(), x.nbytes(), 0);
  return false;
}
double MetaDevice::dot(const Tensor& a, const Tensor& b) {
  all_meta("dot", {&a, &b});
  same_numel("dot", a, b);
  tally(counters_, 2 * a.numel(), a.nbytes() + b.nbytes(), 0);
  return 0.0;
}
void MetaDevice::softmax_xent(const Tensor& dlogits, const Tensor& row_loss, const Tensor& logits,
                              const Tensor& labels) {
  all_meta("softmax_xent", {&dlogits, &row_loss, &logits, &labels});
  same_numel("softmax_xent", dlogits, logits);
  if (logits.ndim() != 2 || labels.numel() != logits.dim(0) || row_loss.numel() != logits.dim(0)) {
    throw UsageError("softmax_xent: logits must be [B,C] with labels and row_loss [B]");
  }
  tally(counters_, 5 * logits.numel(), logits.nbytes() + labels.nbytes(), dlogits.nbytes());
}
void MetaDevice::log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                                 const Tensor& labels) {
  all_meta("log_softmax_nll", {&logp, &loss, &logits, &labels});
  same_numel("log_softmax_nll", logp, logits);
  if (logits.ndim() != 2 || labels.numel() != logits.dim(0) || loss.numel() != 1) {
    throw UsageError(
        "log_softmax_nll: logits must be [B,C] with labels [B] and a one-element loss");
  }
  tally(counters_, 4 * logits.numel() + logits.dim(0) + 1, logits.nbytes() + labels.nbytes(),
        logp.nbytes() + loss.nbytes());
}
void MetaDevice::nll_loss_backward(const Tensor& grad, const Tensor& labels, double) {
  all_meta("nll_loss_backward", {&grad, &labels});
  if (grad.ndim() != 2 || labels.numel() != grad.dim(0)) {
    throw UsageError("nll_loss_backward: grad must be [B,C] with labels [B]");
  }
  tally(counters_, grad.numel(), labels.nbytes(), grad.nbytes());
}
void MetaDevice::log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) {
  all_meta("log_softmax_backward", {&dx, &dout, &logp});
  same_numel("log_softmax_backward", dx, logp);
  same_numel("log_softmax_backward", dout, logp);
  tally(counters_, 4 * logp.numel(), logp.nbytes() + dout.nbytes(), dx.nbytes());
}
// Note [Meta mode]: balanced routing, row r to column r % C.
std::vector<std::int64_t> MetaDevice::argmax_rows(const Tensor& x) {
  all_meta("argmax_rows", {&x});
  if (x.ndim() != 2) throw UsageError(fmt::format("argmax_rows: {} must be 2-D", x.describe()));
  tally(counters_, x.numel(), x.nbytes(), 0);
  std::vector<std::int64_t> out(static_cast<std::size_t>(x.dim(0)));
  for (std::int64_t r = 0; r < x.dim(0); ++r) out[static_cast<std::size_t>(r)] = r % x.dim(1);
  return out;
}
void MetaDevice::scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) {
  all_meta("scale_rows", {&out, &x, &s});
  same_numel("scale_rows", out, x);
  tally(counters_, x.numel(), x.nbytes() + s.nbytes(), out.nbytes());
}
void MetaDevice::row_dot(const Tensor& out, const Tensor& a, const Tensor& c) {
  all_meta("row_dot", {&out, &a, &c});
  same_numel("row_dot", a, c);
  tally(counters_, 2 * a.numel(), a.nbytes() + c.nbytes(), out.nbytes());
}
void MetaDevice::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const AdamParams&) {
  all_meta("adam_step", {&param, &grad, &exp_avg, &exp_avg_sq});
  f32_state("adam_step", param);
  same_numel("adam_step", param, grad);
  same_numel("adam_step", param, exp_avg);
  same_numel("adam_step", param, exp_avg_sq);
  tally(counters_, 16 * param.numel(), 4 * param.nbytes(), 3 * param.nbytes());
}
void MetaDevice::sgd_step(const Tensor& param, const Tensor& grad, const Tensor&,
                          const SgdParams&) {
  all_meta("sgd_step", {&param, &grad});
  same_numel("sgd_step", param, grad);
  tally(counters_, 6 * param.numel(), 3 * param.nbytes(), 2 * param.nbytes());
}
void MetaDevice::matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                        bool trans_b, bool) {
  all_meta("matmul", {&out, &a, &b});
  const MatmulDims d = matmul_dims(out, a, b, trans_a, trans_b);
  tally(counters_, 2 * d.m * d.n * d.k, a.nbytes() + b.nbytes(), out.nbytes());
}
void MetaDevice::bmm(const Tensor& out, const Tensor& a, const Tensor& b, const BmmShape& s,
                     bool trans_a, bool trans_b, bool) {
  all_meta("bmm", {&out, &a, &b});
  bmm_meta_counts(out, a, b, s, trans_a, trans_b, counters_);
}
void MetaDevice::relu(const Tensor& out, const Tensor& x) {
  all_meta("relu", {&out, &x});
  same_numel("relu", out, x);
  tally(counters_, x.numel(), x.nbytes(), out.nbytes());
}
void MetaDevice::relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& x) {
  all_meta("relu_backward", {&grad_in, &grad_out, &x});
  same_numel("relu_backward", grad_in, grad_out);
  same_numel("relu_backward", grad_in, x);
  tally(counters_, x.numel(), x.nbytes() + grad_out.nbytes(), grad_in.nbytes());
}
void MetaDevice::add_row_vector(const Tensor& out, const Tensor& row) {
  all_meta("add_row_vector", {&out, &row});
  row_len("add_row_vector", out, row);
  tally(counters_, out.numel(), out.nbytes() + row.nbytes(), out.nbytes());
}
void MetaDevice::sum_rows(const Tensor& out, const Tensor& x, bool) {
  all_meta("sum_rows", {&out, &x});
  row_len("sum_rows", x, out);
  tally(counters_, x.numel(), x.nbytes(), out.nbytes());
}


// Transformer ops: the same shape checks as HostDevice (ids are not read: a meta id has no value).
void MetaDevice::embedding(const Tensor& out, const Tensor& table, const Tensor& ids) {
  all_meta("embedding", {&out, &table, &ids});
  if (table.ndim() != 2 || out.numel() != ids.numel() * table.dim(1)) {
    throw UsageError(fmt::format("embedding: out {} does not fit {} ids of table {}", out.describe(),
                                 ids.numel(), table.describe()));
  }
  tally(counters_, 0, out.nbytes() + ids.nbytes(), out.nbytes());
}
void MetaDevice::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  all_meta("embedding_backward", {&dtable, &dout, &ids});
  if (dtable.ndim() != 2 || dout.numel() != ids.numel() * dtable.dim(1)) {
    throw UsageError(fmt::format("embedding_backward: dout {} does not fit {} ids of table {}",
                                 dout.describe(), ids.numel(), dtable.describe()));
  }
  tally(counters_, dout.numel(), dout.nbytes() + ids.nbytes(), dtable.nbytes());
}
void MetaDevice::rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                         double) {
  all_meta("rmsnorm", {&out, &rstd, &x, &w});
  same_numel("rmsnorm", out, x);
  row_len("rmsnorm", x, w);
  if (rstd.numel() != x.dim(0)) throw UsageError("rmsnorm: rstd must have one value per row");
  tally(counters_, 4 * x.numel(), x.nbytes() + w.nbytes(), out.nbytes() + rstd.nbytes());
}
void MetaDevice::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                  const Tensor& x, const Tensor& w, const Tensor& rstd) {
  all_meta("rmsnorm_backward", {&dx, &dw, &dout, &x, &w, &rstd});
  same_numel("rmsnorm_backward", dx, x);
  same_numel("rmsnorm_backward", dout, x);
  same_numel("rmsnorm_backward", dw, w);
  row_len("rmsnorm_backward", x, w);
  tally(counters_, 8 * x.numel(), 2 * x.nbytes() + w.nbytes() + rstd.nbytes(),
        dx.nbytes() + dw.nbytes());
}
void MetaDevice::causal_softmax(const Tensor& out, const Tensor& x) {
  all_meta("causal_softmax", {&out, &x});
  same_numel("causal_softmax", out, x);
  if (x.ndim() != 2) throw UsageError(fmt::format("causal_softmax: {} must be 2-D", x.describe()));
  tally(counters_, 4 * x.numel(), x.nbytes(), out.nbytes());
}
void MetaDevice::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) {
  all_meta("softmax_backward", {&dx, &dout, &p});
  same_numel("softmax_backward", dx, p);
  same_numel("softmax_backward", dout, p);
  if (p.ndim() != 2) throw UsageError(fmt::format("softmax_backward: {} must be 2-D", p.describe()));
  tally(counters_, 4 * p.numel(), p.nbytes() + dout.nbytes(), dx.nbytes());
}
void MetaDevice::permute_0213(const Tensor& out, const Tensor& x, std::int64_t a, std::int64_t b,
                              std::int64_t c, std::int64_t d) {
  all_meta("permute_0213", {&out, &x});
  same_numel("permute_0213", out, x);
  same_dtype("permute_0213", out, x);
  if (a * b * c * d != x.numel()) {
    throw UsageError(fmt::format("permute_0213: [{},{},{},{}] does not cover {}", a, b, c, d, x.describe()));
  }
  tally(counters_, 0, x.nbytes(), out.nbytes());
}


// Transformer ops II: HostDevice's shape checks, FLOPs and bytes, no data.
void MetaDevice::layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                           const Tensor& x, const Tensor& w, const Tensor& b, double) {
  all_meta("layernorm", {&out, &mean, &rstd, &x, &w, &b});
  same_numel("layernorm", out, x);
  const std::int64_t r = rows("layernorm", x);
  row_len("layernorm", x, w);
  row_len("layernorm", x, b);
  if (mean.numel() != r || rstd.numel() != r) {
    throw UsageError(fmt::format("layernorm: mean {} and rstd {} must have {} rows",
                                 mean.describe(), rstd.describe(), r));
  }
  tally(counters_, 8 * x.numel(), x.nbytes() + w.nbytes() + b.nbytes(),
        out.nbytes() + mean.nbytes() + rstd.nbytes());
}
void MetaDevice::layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                    const Tensor& dout, const Tensor& x, const Tensor& w,
                                    const Tensor& mean, const Tensor& rstd) {
  all_meta("layernorm_backward", {&dx, &dw, &db, &dout, &x, &w, &mean, &rstd});
  same_numel("layernorm_backward", dx, x);
  same_numel("layernorm_backward", dout, x);
  same_numel("layernorm_backward", dw, w);
  same_numel("layernorm_backward", db, w);
  const std::int64_t r = rows("layernorm_backward", x);
  row_len("layernorm_backward", x, w);
  if (mean.numel() != r || rstd.numel() != r) {
    throw UsageError("layernorm_backward: mean and rstd must have one value per row");
  }
  tally(counters_, 12 * x.numel(), 2 * x.nbytes() + w.nbytes() + mean.nbytes() + rstd.nbytes(),
        dx.nbytes() + dw.nbytes() + db.nbytes());
}
void MetaDevice::gelu(const Tensor& out, const Tensor& x) {
  all_meta("gelu", {&out, &x});
  same_numel("gelu", out, x);
  tally(counters_, 10 * x.numel(), x.nbytes(), out.nbytes());
}
void MetaDevice::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  all_meta("gelu_backward", {&dx, &dout, &x});
  same_numel("gelu_backward", dx, dout);
  same_numel("gelu_backward", dx, x);
  tally(counters_, 16 * x.numel(), x.nbytes() + dout.nbytes(), dx.nbytes());
}
void MetaDevice::unary(const Tensor& out, const Tensor& x, Unary f) {
  all_meta(unary_name(f), {&out, &x});
  same_numel(unary_name(f), out, x);
  tally(counters_, unary_flops(f, false) * x.numel(), x.nbytes(), out.nbytes());
}
void MetaDevice::unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved,
                                Unary f) {
  all_meta(unary_name(f), {&dx, &dout, &saved});
  same_numel(unary_name(f), dx, dout);
  same_numel(unary_name(f), dx, saved);
  tally(counters_, unary_flops(f, true) * dx.numel(), dout.nbytes() + saved.nbytes(), dx.nbytes());
}
void MetaDevice::swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  all_meta("swiglu", {&out, &gate, &up});
  same_numel("swiglu", out, gate);
  same_numel("swiglu", out, up);
  tally(counters_, 6 * out.numel(), gate.nbytes() + up.nbytes(), out.nbytes());
}
void MetaDevice::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                 const Tensor& gate, const Tensor& up) {
  all_meta("swiglu_backward", {&dgate, &dup, &dout, &gate, &up});
  for (const Tensor* t : {&dup, &dout, &gate, &up}) same_numel("swiglu_backward", dgate, *t);
  tally(counters_, 10 * dout.numel(), dout.nbytes() + gate.nbytes() + up.nbytes(),
        dgate.nbytes() + dup.nbytes());
}
void MetaDevice::rope(const Tensor& out, const Tensor& x, std::int64_t seq, std::int64_t heads,
                      double, bool) {
  all_meta("rope", {&out, &x});
  same_numel("rope", out, x);
  if (x.ndim() != 2 || heads < 1 || seq < 1 || x.dim(1) % heads != 0 ||
      (x.dim(1) / heads) % 2 != 0) {
    throw UsageError(fmt::format("rope: {} must be [R, heads * dh] with {} heads of an even dh and "
                                 "seq {} >= 1", x.describe(), heads, seq));
  }
  tally(counters_, 6 * x.numel(), x.nbytes(), out.nbytes());
}

// Note [Meta mode]: no values, so no per-choice table either: the route carries its sizes
// (tokens, k, experts, capacity) and empty expert/slot tables; the model allocates the slot
// tables' memory from the sizes (Transformer::moe_slot_tables). Building a balanced table here
// cost a quarter of a Mixtral plan's time and nothing read it.
MoeRoute MetaDevice::moe_gate(const Tensor& weights, const Tensor& index, const Tensor& probs,
                              const Tensor& logits, std::int64_t capacity) {
  all_meta("moe_gate", {&weights, &index, &probs, &logits});
  moe_gate_shapes("moe_gate", logits, probs, weights, index);
  const std::int64_t N = logits.dim(0), E = logits.dim(1), k = index.dim(1);
  tally(counters_, 6 * logits.numel(), logits.nbytes(),
        probs.nbytes() + weights.nbytes() + index.nbytes());
  return MoeRoute{N, k, E, capacity, {}, {}};
}
void MetaDevice::moe_gate_backward(const Tensor& dlogits, const Tensor& dweights,
                                   const Tensor& probs, const Tensor& weights,
                                   const Tensor& index) {
  all_meta("moe_gate_backward", {&dlogits, &dweights, &probs, &weights, &index});
  moe_gate_shapes("moe_gate_backward", probs, dlogits, dweights, index);
  same_numel("moe_gate_backward", weights, dweights);
  tally(counters_, 4 * probs.numel(),
        probs.nbytes() + dweights.nbytes() + weights.nbytes() + index.nbytes(), dlogits.nbytes());
}
void MetaDevice::gather_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  all_meta("gather_rows", {&out, &x, &index});
  index_rows_shapes("gather_rows", out, x, index);
  tally(counters_, 0, index.nbytes() + out.numel() * dtype_size(x.dtype()), out.nbytes());
}
void MetaDevice::index_add_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  all_meta("index_add_rows", {&out, &x, &index});
  index_rows_shapes("index_add_rows", x, out, index);
  tally(counters_, x.numel(), x.nbytes() + index.nbytes() + out.nbytes(), out.nbytes());
}

}  // namespace zc
