// Device: the compute backend (HostDevice, MetaDevice here; CudaDevice in real/). Every op is one
// kernel with a fixed IEEE operation order, so the same inputs give the same bits on every backend:
// 16-bit operands are computed in f32 and rounded once on store; an f64 operand makes it f64.
// Scalars (alpha, lr, ...) are rounded to the compute type first. Tensors are handles: `const
// Tensor& out` is written through.
#pragma once

#include "engine/tensor.h"

#include <memory>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace zc {

// Which implementation's arithmetic an Adam step reproduces, bit for bit (the fidelity issue's
// point 1; decided by measuring the installed DeepSpeed 0.19.8 ops, see Note [DeepSpeed CPU Adam]).
enum class AdamKernel : std::uint8_t {
  // DeepSpeed's CPU kernel (csrc/includes/cpu_adam.h, csrc/adam/cpu_adam_impl.cpp): what
  // FusedAdam runs on the CPU accelerator and DeepSpeedCPUAdam runs under offload_optimizer.
  ds_cpu,
  // torch.optim.Adam / AdamW, single-tensor path on CPU (optimizer.params.torch_adam).
  torch_cpu,
};

// Note [DeepSpeed CPU Adam]
// DeepSpeed builds its CPU Adam with -O3 -march=native: a SIMD body over the first
// n & ~(simd_width - 1) elements of each tensor, with explicit FMA intrinsics, and a scalar tail
// over the rest, where g++ contracted mul+add into FMA with the other operand order. All f32:
//   L2 (!adamw, wd > 0): g = fma(p, wd, g)
//   body: m = fma(g, 1-b1, m*b1)      v = fma(g*g, 1-b2, v*b2)
//   tail: m = fma(m, b1, g*(1-b1))    v = fma(v, b2, (g*g)*(1-b2))
//   d = fma(sqrt(v), bc2, eps); u = m / d
//   decoupled (adamw, wd > 0): p = fma(p, -lr*wd, p)      (before the update)
//   p = fma(u, -lr/bc1, p)
// with bc1 = 1 - b1^t and bc2 = 1/sqrt(1 - b2^t) in f32, b^t a running f32 product (beta_pow
// here; DeepSpeed's Adam_Optimizer::IncrementStep). Measured against the installed op on every
// size 1..333 and both modes: 39,648 of 39,648 elements equal (tests/reference_test.cpp keeps
// measuring it). The tail's operand order was found by measurement, not read.
struct AdamParams {
  AdamKernel kernel = AdamKernel::ds_cpu;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adamw = true;
  bool bias_correction = true;
  std::int64_t step = 1;  // 1-based, after increment
  // ds_cpu: beta1^step and beta2^step as the kernel's running f32 products hold them.
  float beta1_pow = 0.9f;
  float beta2_pow = 0.999f;
  int simd_width = 16;  // ds_cpu: 16 for an AVX-512 build, 8 for AVX2
};

// PyTorch SGD: g += weight_decay * p; buf = first ? g : momentum * buf + (1 - dampening) * g;
// g = nesterov ? g + momentum * buf : buf (momentum > 0); p -= lr * g; every add-with-alpha one
// fused multiply-add, Note [PyTorch CPU SGD].
struct SgdParams {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = true;
};

// Note [PyTorch CPU SGD]
// torch.optim.SGD's single-tensor step on CPU, all f32. Each Tensor.add(x, alpha=a) is one fused
// multiply-add fma(x, a, self), in its vector body and its tail alike (measured against torch 2.10
// on this CPU, tests/data/cpu_optimizers.txt; mul-then-add misses those bits by an ulp):
//   wd != 0:        g = fma(p, wd, g)                       grad.add(param, alpha=wd)
//   momentum != 0:  buf = first ? g : fma(g, 1-dampening, buf*momentum)
//                   g = nesterov ? fma(buf, momentum, g) : buf
//   p = fma(g, -lr, p)                                      param.add_(grad, alpha=-lr)
// The scalars are Python doubles (-lr and 1 - dampening computed in f64), each rounded once to f32.

// What a device has done: kernels launched, FLOPs and bytes moved. The meta device's only output.
struct DeviceCounters {
  std::int64_t kernels = 0;
  std::int64_t flops = 0;
  std::int64_t bytes_read = 0;
  std::int64_t bytes_written = 0;
  std::int64_t bytes_allocated = 0;  // cumulative bytes allocated
};

// The pointwise functions a Hugging Face layer applies op by op, so that each result is a tensor
// autograd keeps (models/transformer.h, Note [Hugging Face's saved tensors]).
enum class Unary : std::uint8_t { tanh, silu, cube };
const char* unary_name(Unary f);
// Arithmetic per element of Unary f's forward or backward, for the FLOP counters of every backend.
std::int64_t unary_flops(Unary f, bool backward);

// A top-k routing on the host (Device::moe_gate): per token n and choice j (row-major [N*k]),
// the expert, or -1 when capacity dropped it, and its slot in that expert's capacity buffer
// (-1 when dropped). A meta device's route has the sizes and empty tables (Note [Meta mode]).
struct MoeRoute {
  std::int64_t tokens = 0, k = 0, experts = 0, capacity = 0;
  std::vector<std::int64_t> expert, slot;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Placement placement() const = 0;
  virtual std::string name() const = 0;

  // ---- memory ----
  // A new zero-filled tensor; `label` names it in error messages and race reports, `category`
  // says what it is for (memory.h; the engine and the models always name one). The device's
  // ledger counts it until the last view is gone.
  Tensor alloc(DType dtype, Shape shape, std::string label = {},
               MemCategory category = MemCategory::unattributed);
  // The allocation behind `t` (the whole of it) is now `category`, named `label`: the ledger and
  // the allocator's count move its bytes from the old category to the new one, the total
  // unchanged. What torch's AccumulateGrad does when it makes a fresh gradient the param's .grad
  // (Module::accumulate_grad's moving form).
  void recategorize(const Tensor& t, MemCategory category, std::string label);
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // same dtype and numel
  // A strided block copy (same dtype, no overlap): dst[r * dst_stride + c] = src[r * src_stride +
  // c] for r < rows, c < cols; both views must hold their last row's elements.
  virtual void copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols,
                       std::int64_t dst_stride, std::int64_t src_stride) = 0;
  virtual void fill(const Tensor& t, double value) = 0;
  virtual void upload(const Tensor& dst, std::span<const std::byte> src) = 0;  // host bytes in
  virtual void download(std::span<std::byte> dst, const Tensor& src) = 0;      // host bytes out

  // ---- elementwise arithmetic (same numel; dtypes may differ) ----
  virtual void cast(const Tensor& dst, const Tensor& src) = 0;
  virtual void axpy(const Tensor& y, double alpha, const Tensor& x) = 0;  // y = y + alpha * x
  virtual void scale(const Tensor& x, double alpha) = 0;                  // x = alpha * x
  virtual void div(const Tensor& x, double divisor) = 0;  // x = x / divisor (IEEE division)
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;  // out = a + b
  virtual void mul(const Tensor& out, const Tensor& a, const Tensor& b) = 0;  // out = a * b

  // ---- reductions ----
  // Sum of squares in f64, in the canonical order of Note [Canonical reduction order].
  virtual double sum_sq(const Tensor& x) = 0;
  virtual double max_abs(const Tensor& x) = 0;  // NaN if any element is NaN
  virtual bool has_inf_nan(const Tensor& x) = 0;
  // sum_i a[i] * b[i] in f64, in the canonical order (each product exact in f64 for 16/32-bit).
  virtual double dot(const Tensor& a, const Tensor& b) = 0;

  // ---- optimizer updates (param, grad and states of equal numel; states f32) ----
  virtual void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, const AdamParams& p) = 0;
  virtual void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                        const SgdParams& p) = 0;

  // ---- model ops ----
  // out[m,n] = (accumulate ? out : 0) + sum_k op(a)[m,k] * op(b)[k,n], f32 sum in ascending k.
  virtual void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                      bool trans_b, bool accumulate) = 0;
  // Batched matmul over contiguous stacks of matrices (attention's per-head products, grouped-
  // query attention's shared kv heads): a holds matrices of a_rows x a_cols, b of b_rows x b_cols,
  // out of m x n (matmul's shapes after the transposes). For i = 0, 1, ..., batches - 1 in order:
  //   matmul(out[i / out_div], a[i / a_div], b[i / b_div], trans_a, trans_b,
  //          accumulate || i % out_div != 0)
  // so out_div > 1 sums consecutive products into one output matrix. This default is that loop
  // (every backend's matmul, so the bits are matmul's); the meta and simulated devices count it as
  // one op.
  struct BmmShape {
    std::int64_t batches = 1;
    std::int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
    std::int64_t a_div = 1, b_div = 1, out_div = 1;
  };
  virtual void bmm(const Tensor& out, const Tensor& a, const Tensor& b, const BmmShape& s,
                   bool trans_a, bool trans_b, bool accumulate);
  // out = x > 0 ? x : +0: NaN gives 0 (torch.relu keeps NaN).
  virtual void relu(const Tensor& out, const Tensor& x) = 0;
  // grad_in = x > 0 ? grad_out : 0
  virtual void relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& x) = 0;
  virtual void add_row_vector(const Tensor& out, const Tensor& row) = 0;  // out[m,n] += row[n]
  // out[n] = (accumulate ? out[n] : 0) + sum_m x[m,n], ascending m
  virtual void sum_rows(const Tensor& out, const Tensor& x, bool accumulate) = 0;
  // MoE routing and combining. argmax_rows returns, per row of x [B,C], the first index of the
  // largest value (read back to the host, like .item()). scale_rows: out[b,:] = s[b] * x[b,:].
  // row_dot: out[b] = sum_j a[b,j] * c[b,j] (f32, ascending j).
  virtual std::vector<std::int64_t> argmax_rows(const Tensor& x) = 0;
  virtual void scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) = 0;
  virtual void row_dot(const Tensor& out, const Tensor& a, const Tensor& c) = 0;
  // Row-wise softmax cross-entropy: logits [B,C], labels [B] (class ids as floats). Writes the
  // per-row loss [B] and dlogits = softmax - onehot [B,C]; max-subtracted exp in f32 math, or in
  // f64 when any operand is f64 (the f64 reference models): per row, denom = sum_c exp(x[c] - max)
  // (ascending c), softmax = exp(x[c] - max) / denom, loss = log(denom) - (x[label] - max).
  virtual void softmax_xent(const Tensor& dlogits, const Tensor& row_loss, const Tensor& logits,
                            const Tensor& labels) = 0;
  // Hugging Face's loss op by op, as torch's cross_entropy runs it (log_softmax, then nll_loss;
  // models/transformer.h, Note [Hugging Face's saved tensors]). log_softmax_nll, per row of logits
  // [B,C] with labels [B], in softmax_xent's arithmetic: logp = (x - max) - log(denom) [B,C]; then
  // nll_loss's mean into the one-element `loss`: sum_b -logp[b, label_b] (ascending b) / B, with
  // no per-row tensor, as nll_loss makes none.
  virtual void log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                               const Tensor& labels) = 0;
  // nll_loss's backward: grad [B,C] = 0, but grad[b, labels[b]] = value.
  virtual void nll_loss_backward(const Tensor& grad, const Tensor& labels, double value) = 0;
  // log_softmax's backward: dx[b,c] = dout[b,c] - exp(logp[b,c]) * s_b, s_b = sum_c dout[b,c]
  // (ascending c).
  virtual void log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) = 0;

  // ---- transformer ops (TinyLlama). Computed in f64 if any operand is f64, else in f32. ----
  // out[n,:] = table[ids[n],:]; ids [N] (token ids as floats), table [V,D], out [N,D].
  virtual void embedding(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;
  // dtable [V,D] = 0, then dtable[ids[n],:] += dout[n,:] for ascending n.
  virtual void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) = 0;
  // RMSNorm over rows of x [N,D]: rstd[n] = 1 / sqrt(sum_j x[n,j]^2 / D + eps) (ascending j);
  // out[n,j] = (x[n,j] * rstd[n]) * w[j], rstd[n] as computed (before its store rounds it). rstd
  // [N] is kept for the backward.
  virtual void rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                       double eps) = 0;
  // c[n] = sum_j dout[n,j] * w[j] * x[n,j] (ascending j);
  // dx[n,j] = rstd[n] * (w[j] * dout[n,j] - x[n,j] * (rstd[n]^2 * c[n] / D));
  // dw[j] = sum_n dout[n,j] * x[n,j] * rstd[n] (ascending n, overwrites dw).
  virtual void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                const Tensor& x, const Tensor& w, const Tensor& rstd) = 0;
  // Causal softmax over the rows of x [R,S]; row r is query position i = r % S and sees keys
  // j <= i: out[r,j] = exp(x[r,j] - max) / sum_{j' <= i} exp(x[r,j'] - max) (ascending j'),
  // out[r,j] = 0 for j > i.
  virtual void causal_softmax(const Tensor& out, const Tensor& x) = 0;
  // Softmax backward over rows of p [R,S]: dx[r,j] = p[r,j] * (dout[r,j] - sum_k p[r,k] dout[r,k])
  // (ascending k).
  virtual void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) = 0;
  // out[a,c,b,d] = x[a,b,c,d] for x contiguous [A,B,C,D] (torch's permute(0,2,1,3)); a copy.
  virtual void permute_0213(const Tensor& out, const Tensor& x, std::int64_t a, std::int64_t b,
                            std::int64_t c, std::int64_t d) = 0;

  // ---- transformer ops II (the presets of models/transformer.h: GPT-2, Llama-2). In the compute
  // type as above; tanh, exp, cos and sin are evaluated in f64 and rounded once to the compute
  // type, on every backend (Note [Transcendentals]). ----
  // LayerNorm over rows of x [N,D]: mean[n] = (sum_j x[n,j]) / D; var[n] = (sum_j (x[n,j] -
  // mean[n])^2) / D (sums ascending j); rstd[n] = 1 / sqrt(var[n] + eps);
  // out[n,j] = ((x[n,j] - mean[n]) * rstd[n]) * w[j] + b[j], mean and rstd as computed (before
  // their stores round them). mean and rstd [N] are kept for the backward.
  virtual void layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                         const Tensor& w, const Tensor& b, double eps) = 0;
  // xhat = (x[n,j] - mean[n]) * rstd[n], g = dout[n,j] * w[j]; c1[n] = sum_j g, c2[n] =
  // sum_j g * xhat (ascending j); dx[n,j] = rstd[n] * ((g - c1[n] / D) - xhat * (c2[n] / D));
  // dw[j] = sum_n dout[n,j] * xhat, db[j] = sum_n dout[n,j] (ascending n; both overwritten).
  virtual void layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                  const Tensor& dout, const Tensor& x, const Tensor& w,
                                  const Tensor& mean, const Tensor& rstd) = 0;
  // GELU, tanh form (GPT-2's gelu_new, torch's approximate="tanh"), elementwise: with
  // c = 0.7978845608028654 (sqrt(2/pi) rounded to f64) and a = 0.044715, each rounded to the
  // compute type, u = c * (x + a * ((x * x) * x)), t = tanh(u): out = (0.5 * x) * (1 + t).
  virtual void gelu(const Tensor& out, const Tensor& x) = 0;
  // dx = dout * (0.5 * (1 + t) + ((0.5 * x) * (1 - t * t)) * (c * (1 + (3 * a) * (x * x)))).
  virtual void gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) = 0;
  // SwiGLU (Llama's MLP), elementwise: s = 1 / (1 + exp(-gate)), out = (gate * s) * up.
  virtual void swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  // dup = dout * (gate * s); dgate = (dout * up) * (s * (1 + gate * (1 - s))).
  virtual void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                               const Tensor& gate, const Tensor& up) = 0;
  // out = f(x), elementwise, in the compute type as above (torch's tanh, silu and pow(x, 3)):
  // tanh: tanh(x); silu: x / (1 + exp(-x)); cube: (x * x) * x.
  virtual void unary(const Tensor& out, const Tensor& x, Unary f) = 0;
  // Its backward from what autograd keeps, `saved`: tanh keeps its output y, dx = dout * (1 - y * y);
  // silu keeps x, dx = dout * (s * (1 + x * (1 - s))) with s = 1 / (1 + exp(-x)); cube keeps x,
  // dx = dout * (3 * (x * x)) (torch rounds x^2 and 3 x^2 to a 16-bit dtype between its ops; here
  // they stay in the compute type).
  virtual void unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved,
                              Unary f) = 0;
  // Rotary position embedding (Llama's rotate_half form) without a table: x, out [R, heads * dh]
  // in token layout, row r at position p = r % seq. For each head and i < dh / 2: the angle
  // p * base^(-2i/dh) in f64, cs = cos and sn = sin of it rounded to the compute type (sn negated
  // when `inverse`: the transposed rotation, which is the backward); then
  // out[i] = x[i] * cs - x[i + dh/2] * sn and out[i + dh/2] = x[i + dh/2] * cs + x[i] * sn, both
  // read before either is stored (out may be x).
  virtual void rope(const Tensor& out, const Tensor& x, std::int64_t seq, std::int64_t heads,
                    double base, bool inverse) = 0;

  // ---- MoE top-k routing (the Mixtral-style blocks of models/transformer.h, Note [MoE routing]
  // there). In f32, or f64 if any operand is f64; exp in f64 rounded once (Note [Transcendentals]).
  // The default implementations read their operands back, compute on the host and write the
  // results (a host round trip, as DeepSpeed's gating reads its expert counts back); HostDevice
  // and CudaDevice use them (CudaDevice has no kernels for these four yet), MetaDevice overrides
  // them with shapes and balanced routing (Note [Meta mode]).
  //
  // moe_gate, per row n of logits [N,E], k = index.dim(1): probs[n,:] = softmax(logits[n,:])
  // (max-subtracted, denominator summed in ascending e); e_0..e_k-1 the k largest probs, largest
  // first (first index on ties; a NaN is never chosen over a number). Capacity then drops choices
  // in DeepSpeed's order (moe_assign_slots). weights[n,j] = probs[n,e_j] / s_n for a kept choice,
  // 0 for a dropped one, s_n = max(sum of the kept probs[n,e_j] (ascending j), epsilon of the
  // compute type) (DeepSpeed's clamp); index[n,j] = e_j, or -1 when dropped (ids as floats).
  // Returns the routing to the host.
  virtual MoeRoute moe_gate(const Tensor& weights, const Tensor& index, const Tensor& probs,
                            const Tensor& logits, std::int64_t capacity);
  // dlogits [N,E] from dweights [N,k], through the kept choices (index >= 0): with s_n as above,
  // c_n = sum_j dweights[n,j] * weights[n,j] (kept j ascending; 0 when s_n was clamped),
  // dp[e_j] = (dweights[n,j] - c_n) / s_n, dp = 0 elsewhere; then dlogits[n,e] = probs[n,e] *
  // (dp[e] - t_n), t_n = sum_e probs[n,e] * dp[e] (ascending e).
  virtual void moe_gate_backward(const Tensor& dlogits, const Tensor& dweights, const Tensor& probs,
                                 const Tensor& weights, const Tensor& index);
  // out [M,D]: out[m,:] = x[index[m],:], zeros where index[m] < 0 (index [M], ids as floats).
  virtual void gather_rows(const Tensor& out, const Tensor& x, const Tensor& index);
  // out [N,D]: out[index[m],:] += x[m,:] for ascending m (each sum rounded on store), rows with
  // index[m] < 0 skipped.
  virtual void index_add_rows(const Tensor& out, const Tensor& x, const Tensor& index);

  const DeviceCounters& counters() const { return counters_; }
  // This device's memory by category: live bytes, high-water marks, the composition at the peak
  // (memory.h). The meta device counts what it would hold, byte for byte what a host run holds.
  virtual const MemoryLedger& memory() const { return *ledger_; }
  virtual MemoryLedger& memory() { return *ledger_; }
  // Bytes of this device's storage still referenced by some tensor.
  std::int64_t live_bytes() const { return memory().live_total(); }
  // The allocator's own accounting, where the backend keeps one apart from memory() (HostDevice);
  // null otherwise.
  virtual const AllocatorStats* allocator_stats() const { return nullptr; }
  // Starts new high-water marks from what is live now, in memory() and the allocator's stats.
  void reset_peak() {
    memory().reset_peak();
    reset_allocator_peak();
  }
  virtual void reset_allocator_peak() {}

 protected:
  // The backend's allocation: a fresh Storage of exactly numel * dtype_size bytes, zero-filled.
  virtual Tensor do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) = 0;
  // False for a device that forwards to another one's alloc (and its ledger).
  bool accounts_allocations_ = true;
  // One kernel launched, with its FLOPs and bytes (every backend counts alike).
  void count_kernel(std::int64_t flops, std::int64_t read, std::int64_t written) {
    counters_.kernels += 1;
    counters_.flops += flops;
    counters_.bytes_read += read;
    counters_.bytes_written += written;
  }
  DeviceCounters counters_;
  std::shared_ptr<MemoryLedger> ledger_ = std::make_shared<MemoryLedger>();
};

// Note [Transcendentals]
// tanh, exp, cos and sin have no correctly rounded implementation that every backend shares. The
// ops that need them evaluate the function in f64 and round the result once to the compute type:
// for f32 compute, two backends then differ only where their f64 results straddle an f32 rounding
// boundary (the conformance table states the bound); on the host every evaluation is glibc's.

// Note [Canonical reduction order]
// A reduction over n elements is defined as: leaves in blocks of kReduceBlock; inside a block a
// stride-halving tree over the block padded with zeros to kReduceBlock; then the same stride-halving
// tree over the block partials padded with zeros to a power of two. This is the shared-memory
// reduction a GPU kernel does, so CudaDevice reproduces it bit for bit, with no atomics.
inline constexpr std::int64_t kReduceBlock = 1024;
static_assert((kReduceBlock & (kReduceBlock - 1)) == 0, "reduction blocks are a power of two");

// DeepSpeed's capacity order (top2gating's locations; topkgating's): every token's first choice
// in ascending n takes the next slot of its expert, then every second choice, and so on; a choice
// whose slot would be >= capacity is dropped (expert and slot -1). capacity <= 0 never drops.
void moe_assign_slots(MoeRoute& r);

// What the default bmm's loop of matmuls counts, after checking its shapes (MetaDevice counts it
// without the loop).
void bmm_meta_counts(const Tensor& out, const Tensor& a, const Tensor& b,
                     const Device::BmmShape& s, bool trans_a, bool trans_b, DeviceCounters& c);

// ---- host-side conveniences built on upload/download (tests, props, reports) ----
std::vector<std::byte> to_bytes(Device& dev, const Tensor& t);
std::vector<double> to_f64(Device& dev, const Tensor& t);  // exact for every dtype
// A one-element tensor's value read back to the host (torch's .item()), what the engine's
// data-dependent decisions read; `meta_value` for a meta tensor (Note [Meta mode] in model.h).
double item(Device& dev, const Tensor& t, double meta_value);
// Rounds each value once to `dtype` (via f32 for 16-bit) and uploads.
void write_f64(Device& dev, const Tensor& t, std::span<const double> values);
Tensor tensor_from_f64(Device& dev, DType dtype, Shape shape, std::span<const double> values,
                       std::string label = {},
                       MemCategory category = MemCategory::unattributed);

}  // namespace zc
