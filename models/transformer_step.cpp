// Transformer forward and explicit backward (transformer.h). Shapes: N = B * S tokens; token
// layout [N, width]; head layout [B, heads, S, dh]; query head h reads kv head h / rep, rep =
// heads / kv_heads. Each block's saved tensors are freed by its backward.
#include "engine/errors.h"
#include "models/params.h"
#include "models/transformer.h"

#include <cmath>

namespace zc {

namespace {

using model_params::act;
using model_params::data_of;

// Head (b, h)'s [rows, cols] matrix of a head-layout buffer with `heads` heads.
Tensor head(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t heads, std::int64_t rows,
            std::int64_t cols) {
  return t.narrow(((b * heads) + h) * rows * cols, rows * cols).view({rows, cols});
}

constexpr double kGeluC = 0.7978845608028654;  // gelu_new's sqrt(2 / pi), as device.h's gelu
constexpr double kGeluA = 0.044715;

// A forward intermediate autograd saves for the backward; without grad (a checkpointed layer's
// forward, Note [Gradient checkpointing]) it goes once its last forward use is past.
template <typename... T>
void unless_saved(bool grad, T&... t) {
  if (!grad) ((t = T()), ...);
}

}  // namespace

// Llama's eager attention takes its softmax in f32 (softmax(dtype=float32)); GPT-2's in the
// model dtype. Only 16-bit models keep a second copy.
bool Transformer::f32_softmax() const {
  return spec_.norm == NormKind::rmsnorm && dtype_size(dtype_) == 2;
}

// repeat_kv: [B, Hkv, S, dh] to [B, H, S, dh], kv head g copied to query heads g*rep ..
// g*rep + rep - 1.
Tensor Transformer::repeat_kv(Device& dev, const Tensor& t, const char* label) {
  const std::int64_t B = batch_, S = spec_.seq, H = spec_.heads, Hkv = spec_.kv_heads;
  const std::int64_t dh = spec_.head_dim(), rep = H / Hkv;
  Tensor out = act(dev, dtype_, {B * H * S * dh}, label);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      dev.copy(head(out, b, h, H, S, dh), head(t, b, h / rep, Hkv, S, dh));
    }
  }
  return out;
}

// Fused attention (Note [Attention memory]): head (b, h)'s probabilities [S, S], computed afresh
// (forward, and again in backward); `scores` keeps its scaled scores buffer for reuse.
Tensor Transformer::head_probs(Device& dev, const BlockActs& a, std::int64_t b, std::int64_t h,
                               Tensor& scores) {
  const std::int64_t S = spec_.seq, H = spec_.heads, Hkv = spec_.kv_heads, dh = spec_.head_dim();
  scores = act(dev, dtype_, {S, S}, "attn_head_scores");
  dev.matmul(scores, head(a.qh, b, h, H, S, dh), head(a.kh, b, h / (H / Hkv), Hkv, S, dh), false,
             true, false);
  dev.scale(scores, 1.0 / std::sqrt(static_cast<double>(dh)));
  Tensor p = act(dev, dtype_, {S, S}, "attn_head_probs");
  dev.causal_softmax(p, scores);
  return p;
}

std::int64_t Transformer::kv_div(const BlockActs& a) const {
  const std::int64_t per_head = batch_ * spec_.seq * spec_.head_dim();
  return a.kh.numel() == spec_.heads * per_head ? 1 : spec_.heads / spec_.kv_heads;
}

Tensor Transformer::attention_forward(Device& dev, BlockActs& a) {
  const std::int64_t B = batch_, S = spec_.seq, H = spec_.heads, Hkv = spec_.kv_heads;
  const std::int64_t dh = spec_.head_dim(), rep = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  Tensor oh = act(dev, dtype_, {B * H * S * dh}, "attn_oh");  // [B, H, S, dh]
  if (spec_.attention == AttentionMemory::materialised) {
    // Query head (b, h) is matrix b * H + h; its kv head is matrix index / kv_div(a).
    const std::int64_t kd = kv_div(a);
    Tensor scores = act(dev, dtype_, {B * H * S, S}, "attn_scores");  // [B*H*S, S]
    dev.bmm(scores, a.qh, a.kh, {B * H, S, dh, S, dh, 1, kd, 1}, false, true, false);
    dev.scale(scores, scale);
    if (f32_softmax()) {  // Llama's softmax(dtype=float32), then .to(dtype)
      a.p32 = act(dev, DType::f32, {B * H * S, S}, "attn_probs_f32");
      dev.causal_softmax(a.p32, scores);
      scores = Tensor();
      a.p = act(dev, dtype_, {B * H * S, S}, "attn_probs");
      dev.cast(a.p, a.p32);
      unless_saved(grad_, a.p32);
    } else {
      a.p = act(dev, dtype_, {B * H * S, S}, "attn_probs");
      dev.causal_softmax(a.p, scores);
      scores = Tensor();
    }
    dev.bmm(oh, a.p, a.vh, {B * H, S, S, S, dh, 1, kd, 1}, false, false, false);
  } else {  // fused: one head's [S, S] at a time, nothing kept (Note [Attention memory])
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        Tensor s;
        const Tensor p = head_probs(dev, a, b, h, s);
        dev.matmul(head(oh, b, h, H, S, dh), p, head(a.vh, b, h / rep, Hkv, S, dh), false, false,
                   false);
      }
    }
  }
  Tensor o = act(dev, dtype_, {B * S, H * dh}, "attn_o");  // [B, S, H, dh]
  dev.permute_0213(o, oh, B, H, S, dh);
  return o;
}

void Transformer::attention_backward(Device& dev, BlockActs& a, const Tensor& do_tok, Tensor& dq,
                                     Tensor& dk, Tensor& dv) {
  const std::int64_t B = batch_, S = spec_.seq, H = spec_.heads, Hkv = spec_.kv_heads;
  const std::int64_t dh = spec_.head_dim(), rep = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  Tensor doh = act(dev, dtype_, {B * H * S * dh}, "attn_doh");
  dev.permute_0213(doh, do_tok, B, S, H, dh);
  Tensor dqh = act(dev, dtype_, {B * H * S * dh}, "attn_dqh");
  Tensor dkh = act(dev, dtype_, {B * Hkv * S * dh}, "attn_dkh");
  Tensor dvh = act(dev, dtype_, {B * Hkv * S * dh}, "attn_dvh");
  // Per head: dP = dO V^T; dV += P^T dO; dS = softmax_backward(dP, P) / sqrt(dh); dQ = dS K;
  // dK += dS^T Q. A kv head sums over its rep query heads (accumulate after the first).
  auto one_head = [&](std::int64_t b, std::int64_t h, const Tensor& p, const Tensor& dp,
                      const Tensor& ds) {
    const std::int64_t g = h / rep;
    const bool acc = h % rep != 0;
    dev.matmul(dp, head(doh, b, h, H, S, dh), head(a.vh, b, g, Hkv, S, dh), false, true, false);
    dev.matmul(head(dvh, b, g, Hkv, S, dh), p, head(doh, b, h, H, S, dh), true, false, acc);
    dev.softmax_backward(ds, dp, p);
    dev.scale(ds, scale);
    dev.matmul(head(dqh, b, h, H, S, dh), ds, head(a.kh, b, g, Hkv, S, dh), false, false, false);
    dev.matmul(head(dkh, b, g, Hkv, S, dh), ds, head(a.qh, b, h, H, S, dh), true, false, acc);
  };
  if (spec_.attention == AttentionMemory::materialised) {  // one_head's steps, each over every head
    const std::int64_t kd = kv_div(a);
    // With K and V repeated (repeat_kv), their grads come per query head and are summed over each
    // kv head's rep copies afterwards, as expand's backward does.
    Tensor dkr = kd == 1 && rep > 1 ? act(dev, dtype_, {B * H * S * dh}, "attn_dk_rep") : dkh;
    Tensor dvr = kd == 1 && rep > 1 ? act(dev, dtype_, {B * H * S * dh}, "attn_dv_rep") : dvh;
    const std::int64_t od = kd == 1 ? 1 : rep;
    Tensor dp = act(dev, dtype_, {B * H * S, S}, "attn_dprobs");
    dev.bmm(dp, doh, a.vh, {B * H, S, dh, S, dh, 1, kd, 1}, false, true, false);
    dev.bmm(dvr, a.p, doh, {B * H, S, S, S, dh, 1, 1, od}, true, false, false);
    a.vh = Tensor();  // P V's backward has run: autograd frees what it saved (P: softmax's too)
    if (a.p32.defined()) a.p = Tensor();
    Tensor ds;
    if (a.p32.defined()) {  // the f32 softmax's backward: dP in f32, dS in f32, then cast
      Tensor dp32 = act(dev, DType::f32, {B * H * S, S}, "attn_dprobs_f32");
      dev.cast(dp32, dp);
      dp = Tensor();
      Tensor ds32 = act(dev, DType::f32, {B * H * S, S}, "attn_dscores_f32");
      dev.softmax_backward(ds32, dp32, a.p32);
      dp32 = Tensor();
      a.p32 = Tensor();  // autograd frees what softmax saved once its backward has run
      ds = act(dev, dtype_, {B * H * S, S}, "attn_dscores");
      dev.cast(ds, ds32);
    } else {
      ds = act(dev, dtype_, {B * H * S, S}, "attn_dscores");
      dev.softmax_backward(ds, dp, a.p);
      dp = a.p = Tensor();
    }
    {  // the scaling's backward is out of place, as autograd's mul (Llama) or div (GPT-2) is
      Tensor scaled = act(dev, dtype_, {B * H * S, S}, "attn_dscores_scaled");
      dev.copy(scaled, ds);
      ds = scaled;
    }
    dev.scale(ds, scale);
    dev.bmm(dqh, ds, a.kh, {B * H, S, S, S, dh, 1, kd, 1}, false, false, false);
    dev.bmm(dkr, ds, a.qh, {B * H, S, S, S, dh, 1, 1, od}, true, false, false);
    ds = Tensor();
    a.qh = a.kh = Tensor();
    if (dkr.numel() != dkh.numel()) {
      for (std::int64_t i = 0; i < B * Hkv; ++i) {  // kv head i sums query heads i*rep..: rows
        const std::int64_t w = S * dh;
        dev.sum_rows(dkh.narrow(i * w, w), dkr.narrow(i * rep * w, rep * w).view({rep, w}), false);
        dev.sum_rows(dvh.narrow(i * w, w), dvr.narrow(i * rep * w, rep * w).view({rep, w}), false);
      }
    }
  } else {  // recompute each head's probabilities (Note [Attention memory])
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        Tensor s;
        const Tensor p = head_probs(dev, a, b, h, s);
        Tensor dp = act(dev, dtype_, {S, S}, "attn_head_dprobs");
        one_head(b, h, p, dp, s);  // s is free again: it takes dS
      }
    }
    a.qh = a.kh = a.vh = Tensor();
  }
  dq = act(dev, dtype_, {B * S, H * dh}, "attn_dq");
  dk = act(dev, dtype_, {B * S, Hkv * dh}, "attn_dk");
  dv = act(dev, dtype_, {B * S, Hkv * dh}, "attn_dv");
  dev.permute_0213(dq, dqh, B, H, S, dh);
  dev.permute_0213(dk, dkh, B, Hkv, S, dh);
  dev.permute_0213(dv, dvh, B, Hkv, S, dh);
}

Tensor Transformer::mlp_forward(Device& dev, Module& blk, BlockActs& a) {
  if (spec_.experts > 0) return moe_forward(dev, blk, a);  // transformer_moe.cpp
  const std::int64_t N = a.h2.dim(0), f = spec_.ffn;
  if (spec_.mlp == MlpKind::gelu) {
    // gelu_new's ops: 0.5 x (1 + tanh(c (x + a x^3))) (Note [Hugging Face's saved tensors]).
    a.u = linear(dev, blk, "w_fc", "b_fc", a.h2, f, "mlp_u");
    Tensor inner = act(dev, dtype_, {N, f}, "gelu_inner");
    dev.unary(inner, a.u, Unary::cube);
    dev.scale(inner, kGeluA);
    dev.add(inner, a.u, inner);
    dev.scale(inner, kGeluC);
    a.th = act(dev, dtype_, {N, f}, "gelu_tanh");
    dev.unary(a.th, inner, Unary::tanh);
    inner = Tensor();
    a.th1 = act(dev, dtype_, {N, f}, "gelu_one_plus_tanh");
    dev.fill(a.th1, 1.0);
    dev.add(a.th1, a.th1, a.th);
    unless_saved(grad_, a.th);
    a.xh = act(dev, dtype_, {N, f}, "gelu_half_x");
    dev.copy(a.xh, a.u);
    dev.scale(a.xh, 0.5);
    a.a = act(dev, dtype_, {N, f}, "mlp_act");
    dev.mul(a.a, a.xh, a.th1);
    unless_saved(grad_, a.u, a.xh, a.th1);
    return linear(dev, blk, "w_proj", "b_proj", a.a, spec_.dim, "mlp_out");
  }
  a.g = linear(dev, blk, "w_gate", nullptr, a.h2, f, "mlp_gate");
  a.s = act(dev, dtype_, {N, f}, "mlp_silu");
  dev.unary(a.s, a.g, Unary::silu);
  unless_saved(grad_, a.g);
  a.u = linear(dev, blk, "w_up", nullptr, a.h2, f, "mlp_up");
  a.a = act(dev, dtype_, {N, f}, "mlp_act");
  dev.mul(a.a, a.s, a.u);
  unless_saved(grad_, a.s, a.u);
  return linear(dev, blk, "w_down", nullptr, a.a, spec_.dim, "mlp_out");
}

Tensor Transformer::mlp_backward(Device& dev, Module& blk, BlockActs& a, const Tensor& dm) {
  if (spec_.experts > 0) return moe_backward(dev, blk, a, dm);
  const std::int64_t N = dm.dim(0), f = spec_.ffn;
  if (spec_.mlp == MlpKind::gelu) {  // back through mlp_forward's ops
    // Each op's saved tensors go as soon as its backward has run, as autograd frees them.
    Tensor da = linear_backward(dev, blk, "w_proj", "b_proj", dm, a.a, true);
    a.a = Tensor();
    Tensor dxh = act(dev, dtype_, {N, f}, "gelu_dhalf_x");
    Tensor dinner = act(dev, dtype_, {N, f}, "gelu_dinner");
    dev.mul(dxh, da, a.th1);
    dev.mul(dinner, da, a.xh);  // d(1 + t) = dt
    da = a.xh = a.th1 = Tensor();
    dev.unary_backward(dinner, dinner, a.th, Unary::tanh);
    a.th = Tensor();
    dev.scale(dinner, kGeluC);
    Tensor dcube = act(dev, dtype_, {N, f}, "gelu_dcube");
    dev.copy(dcube, dinner);
    dev.scale(dcube, kGeluA);
    dev.unary_backward(dcube, dcube, a.u, Unary::cube);
    a.u = Tensor();
    dev.scale(dxh, 0.5);
    Tensor du = act(dev, dtype_, {N, f}, "mlp_du");  // x's three uses: x + ..., x^3, 0.5 x
    dev.add(du, dinner, dcube);
    dev.add(du, du, dxh);
    dinner = dcube = dxh = Tensor();
    return linear_backward(dev, blk, "w_fc", "b_fc", du, a.h2, true);
  }
  Tensor da = linear_backward(dev, blk, "w_down", nullptr, dm, a.a, true);
  a.a = Tensor();
  Tensor dg = act(dev, dtype_, {N, f}, "mlp_dgate");
  Tensor du = act(dev, dtype_, {N, f}, "mlp_dup");
  dev.mul(dg, da, a.u);  // d silu(g)
  dev.mul(du, da, a.s);
  da = a.u = a.s = Tensor();
  dev.unary_backward(dg, dg, a.g, Unary::silu);
  a.g = Tensor();
  Tensor dh2 = linear_backward(dev, blk, "w_gate", nullptr, dg, a.h2, true);
  dg = Tensor();
  Tensor dh2_up = linear_backward(dev, blk, "w_up", nullptr, du, a.h2, true);
  dev.add(dh2, dh2, dh2_up);
  return dh2;
}

Tensor Transformer::block_forward(Device& dev, Module& blk, BlockActs& a, const Tensor& x) {
  blk.run_pre_forward();
  const std::int64_t B = batch_, S = spec_.seq, N = x.dim(0), d = spec_.dim;
  const std::int64_t H = spec_.heads, Hkv = spec_.kv_heads, dh = spec_.head_dim();
  a.h1 = norm_forward(dev, blk, "attn_norm", x, a.n1);
  unless_saved(grad_, a.n1.x, a.n1.mean, a.n1.rstd, a.n1.xn);
  Tensor q = linear(dev, blk, "wq", "bq", a.h1, H * dh, "q");
  Tensor k = linear(dev, blk, "wk", "bk", a.h1, Hkv * dh, "k");
  Tensor v = linear(dev, blk, "wv", "bv", a.h1, Hkv * dh, "v");
  if (spec_.pos == PositionKind::rotary) {
    dev.rope(q, q, S, H, spec_.rope_base, false);
    dev.rope(k, k, S, Hkv, spec_.rope_base, false);
  }
  a.qh = act(dev, dtype_, {B * H * S * dh}, "attn_qh");
  a.kh = act(dev, dtype_, {B * Hkv * S * dh}, "attn_kh");
  a.vh = act(dev, dtype_, {B * Hkv * S * dh}, "attn_vh");
  dev.permute_0213(a.qh, q, B, S, H, dh);
  dev.permute_0213(a.kh, k, B, S, Hkv, dh);
  dev.permute_0213(a.vh, v, B, S, Hkv, dh);
  q = k = v = Tensor();
  if (spec_.attention == AttentionMemory::materialised && H != Hkv) {  // repeat_kv
    a.kh = repeat_kv(dev, a.kh, "attn_k_rep");
    a.vh = repeat_kv(dev, a.vh, "attn_v_rep");
  }
  a.o = attention_forward(dev, a);
  Tensor attn = linear(dev, blk, "wo", "bo", a.o, d, "attn_out");
  // Without grad, what Hugging Face's attention module holds in locals goes when it returns (after
  // its o_proj); the probabilities it returns stay in the decoder layer's `_` until the layer
  // returns (block_forward's end).
  unless_saved(grad_, a.h1, a.qh, a.kh, a.vh, a.o);
  Tensor x2 = act(dev, dtype_, {N, d}, "x2");
  dev.add(x2, x, attn);
  // Llama's layer rebinds its attention output to the residual sum; GPT2Block keeps it
  // (attn_output) until the block returns.
  if (spec_.norm != NormKind::layernorm) attn = Tensor();
  a.h2 = norm_forward(dev, blk, "mlp_norm", x2, a.n2);
  unless_saved(grad_, a.n2.x, a.n2.mean, a.n2.rstd, a.n2.xn);
  Tensor m = mlp_forward(dev, blk, a);
  Tensor x3 = act(dev, dtype_, {N, d}, "x3");
  dev.add(x3, x2, m);
  if (!grad_) a = BlockActs{};  // the layer returns: its locals (the MLP's input, the probabilities) go
  blk.run_post_forward();
  return x3;
}

Tensor Transformer::block_backward(Device& dev, Module& blk, BlockActs& a, const Tensor& dx3) {
  blk.run_pre_backward();
  const std::int64_t S = spec_.seq, H = spec_.heads, Hkv = spec_.kv_heads;
  Tensor dh2 = mlp_backward(dev, blk, a, dx3);
  a.h2 = Tensor();
  Tensor dx2 = norm_backward(dev, blk, "mlp_norm", std::move(dh2), a.n2);
  a.n2 = NormActs{};
  dev.add(dx2, dx2, dx3);
  Tensor dout = linear_backward(dev, blk, "wo", "bo", dx2, a.o, true);
  a.o = Tensor();
  Tensor dq, dk, dv;
  attention_backward(dev, a, dout, dq, dk, dv);
  dout = Tensor();
  if (spec_.pos == PositionKind::rotary) {  // the transposed rotation
    dev.rope(dq, dq, S, H, spec_.rope_base, true);
    dev.rope(dk, dk, S, Hkv, spec_.rope_base, true);
  }
  Tensor dh1 = linear_backward(dev, blk, "wq", "bq", dq, a.h1, true);
  Tensor dh1_k = linear_backward(dev, blk, "wk", "bk", dk, a.h1, true);
  Tensor dh1_v = linear_backward(dev, blk, "wv", "bv", dv, a.h1, true);
  a.h1 = Tensor();
  dev.add(dh1, dh1, dh1_k);
  dev.add(dh1, dh1, dh1_v);
  dq = dk = dv = dh1_k = dh1_v = Tensor();
  Tensor dx = norm_backward(dev, blk, "attn_norm", std::move(dh1), a.n1);
  dev.add(dx, dx, dx2);
  a = BlockActs{};  // autograd frees what the block saved once its backward has run
  blk.run_post_backward();
  return dx;
}

// CheckpointFunction.backward (Note [Gradient checkpointing]): the layer's forward again, with
// grad, from its saved input, then its backward; the saved input and the recomputed output live
// until that backward has run.
Tensor Transformer::checkpointed_block_backward(Device& dev, std::size_t l, const Tensor& dx3) {
  ZC_ASSERT(layer_inputs_.at(l).defined(), "layer {}'s checkpointed input is gone", l);
  const bool ds = spec_.checkpoint_function == CheckpointFunction::deepspeed;
  contiguous_.clear();  // deepspeed.checkpointing drops its buffer list at the first backward
  if (ds && spec_.ds_cpu_checkpointing) {  // t.data = t.saved_data.to(device); t.saved_data = None
    Tensor on_device = act(dev, dtype_, {layer_inputs_[l].numel()}, "ds_checkpoint_to_device");
    dev.copy(on_device, layer_inputs_[l]);
    layer_inputs_[l] = on_device;
  }
  BlockActs a;
  const Tensor recomputed = block_forward(dev, layer(l), a, layer_inputs_[l].view({batch_ * spec_.seq, spec_.dim}));
  Tensor dx = block_backward(dev, layer(l), a, dx3);
  layer_inputs_[l] = ds_arg_sizes_[l] = Tensor();
  return dx;
}

// deepspeed.checkpointing.checkpoint's forward (Note [Gradient checkpointing]): what it keeps of
// layer l's input x.
Tensor Transformer::ds_checkpoint_input(Device& dev, std::size_t l, const Tensor& x) {
  const std::int64_t n = x.numel();
  Device* keep_on = &dev;
  if (spec_.ds_cpu_checkpointing) {
    if (host_ == nullptr) {
      throw UsageError("activation_checkpointing.cpu_checkpointing keeps the layer inputs in host memory, and this "
                       "run has no host device (Model::set_host_device)");
    }
    if (dev.placement() == Placement::cuda) {
      throw NotImplementedError("activation_checkpointing.cpu_checkpointing on the CUDA backend: the copies to host "
                                "memory are not implemented there; plan it (meta mode) instead");
    }
    keep_on = host_;
  }
  if (!spec_.ds_partition_activations) {
    if (keep_on == &dev) return x;  // ctx.deepspeed_saved_tensors = args
    Tensor h = keep_on->alloc(dtype_, {n}, "ds_checkpoint_cpu", MemCategory::activations);
    dev.copy(h, x.view({n}));  // copy_to_device(args, cpu)
    return h;
  }
  // partition_activations: item.detach().contiguous().view(-1).narrow(...).clone(), the whole
  // input without a model-parallel group.
  Tensor part = act(dev, dtype_, {n}, "ds_checkpoint_partition");
  dev.copy(part, x.view({n}));
  if (spec_.ds_contiguous_memory_optimization) {
    if (contiguous_.empty()) {  // number_checkpoints buffers at once, at the first layer
      contiguous_next_ = 0;
      for (std::int64_t i = 0; i < spec_.ds_number_checkpoints; ++i) {
        contiguous_.push_back(keep_on->alloc(dtype_, {n}, "ds_contiguous_checkpoint", MemCategory::activations));
      }
    }
    // The offset runs on until a backward drops the list: a second forward without one takes the
    // next buffers, and past the last DeepSpeed's index fails.
    if (contiguous_next_ >= contiguous_.size()) {
      throw UsageError(fmt::format(
          "layer {}: deepspeed.checkpointing's {} contiguous buffers are used up (DeepSpeed raises IndexError here): "
          "a forward without a backward since the last one, or number_checkpoints below the checkpointed layers",
          l, contiguous_.size()));
    }
    Tensor slot = contiguous_.at(contiguous_next_++);
    dev.copy(slot, part);
    return slot;
  }
  if (keep_on == &dev) return part;
  Tensor h = keep_on->alloc(dtype_, {n}, "ds_checkpoint_cpu", MemCategory::activations);
  dev.copy(h, part);  // partition.cpu()
  return h;
}

double Transformer::forward(Device& dev, const Batch& batch) {
  run_pre_forward();
  grad_ = true;
  ids_ = batch.at("ids");
  labels_ = batch.at("labels");
  if (ids_.ndim() != 2 || ids_.dim(1) != spec_.seq || labels_.numel() != ids_.numel()) {
    throw UsageError(fmt::format("transformer: ids {} and labels must be [B, {}]",
                                 shape_str(ids_.shape()), spec_.seq));
  }
  batch_ = ids_.dim(0);
  const std::int64_t N = batch_ * spec_.seq, d = spec_.dim, V = spec_.vocab, S = spec_.seq;
  // The last step's loss graph goes before this forward (the caller drops its loss tensor).
  mask_ = rope_cs_ = position_ids_ = Tensor();
  Module& emb = embed();
  emb.run_pre_forward();
  Tensor x = act(dev, dtype_, {N, d}, "x0");
  dev.embedding(x, data_of(emb, "tok"), ids_.view({N}));
  if (spec_.pos == PositionKind::learned) {
    if (dev.placement() == Placement::meta) {
      positions_ = act(dev, DType::f32, {N}, "positions");
    } else {
      std::vector<double> pos(static_cast<std::size_t>(N));
      for (std::int64_t i = 0; i < N; ++i) pos[static_cast<std::size_t>(i)] = static_cast<double>(i % spec_.seq);
      positions_ = tensor_from_f64(dev, DType::f32, {N}, pos, "positions", MemCategory::activations);
    }
    // GPT2Model: inputs_embeds + position_embeds ([1, S, d], broadcast over the batch), both
    // held as locals until the model's forward returns.
    inputs_embeds_ = x;
    position_embeds_ = act(dev, dtype_, {S, d}, "position_embeds");
    dev.embedding(position_embeds_, data_of(emb, "pos"), positions_.narrow(0, S));
    x = act(dev, dtype_, {N, d}, "hidden_states");
    for (std::int64_t b = 0; b < batch_; ++b) {
      dev.add(x.narrow(b * S * d, S * d).view({S, d}), inputs_embeds_.narrow(b * S * d, S * d).view({S, d}),
              position_embeds_);
    }
  }
  emb.run_post_forward();
  // Hugging Face's model forward beside its layers (Note [Hugging Face's saved tensors]): the
  // eager causal mask [B, 1, S, S] in the model dtype (materialised attention only), and for Llama the position ids (int64
  // [1, S]; GPT-2's are positions_, which its position embedding keeps) and the rotary cos and sin
  // [1, S, dh] in the model dtype.
  if (spec_.pos == PositionKind::rotary) {
    position_ids_ = dev.alloc(DType::u8, {S * 8}, "position_ids", MemCategory::activations);
  }
  // Fused attention (FlashAttention-style, or sdpa's is_causal) needs no mask tensor.
  if (spec_.attention == AttentionMemory::materialised) mask_ = act(dev, dtype_, {batch_ * S * S}, "causal_mask");
  if (spec_.pos == PositionKind::rotary) rope_cs_ = act(dev, dtype_, {2 * S * spec_.head_dim()}, "rope_cos_sin");
  acts_.assign(static_cast<std::size_t>(spec_.layers), BlockActs{});
  if (spec_.blas_workspace_bytes > 0 && !forward_workspace_.defined()) {  // at the first matmul
    forward_workspace_ = dev.alloc(DType::u8, {spec_.blas_workspace_bytes}, "cublas_workspace.forward",
                                   MemCategory::temporaries);
  }
  layer_inputs_.assign(spec_.gradient_checkpointing ? acts_.size() : 0, Tensor());
  ds_arg_sizes_.assign(layer_inputs_.size(), Tensor());
  const bool ds_partition = spec_.checkpoint_function == CheckpointFunction::deepspeed && spec_.ds_partition_activations;
  for (std::size_t l = 0; l < acts_.size(); ++l) {
    if (!spec_.gradient_checkpointing) {
      x = block_forward(dev, layer(l), acts_[l], x);
      continue;
    }
    // Note [Gradient checkpointing]: the layer keeps its input and runs without grad.
    layer_inputs_[l] = spec_.checkpoint_function == CheckpointFunction::deepspeed ? ds_checkpoint_input(dev, l, x) : x;
    BlockActs none;
    struct NoGrad {  // grad_ comes back even when the layer throws
      bool& grad;
      explicit NoGrad(bool& g) : grad(g) { grad = false; }
      ~NoGrad() { grad = true; }
    } no_grad(grad_);
    x = block_forward(dev, layer(l), none, x);
    // torch.tensor(arg.size()) of each argument ([B, S, d], the mask's 4 dims, cos/sin 3 each, ids
    // 2): CPU tensors, host memory on a GPU; none without a host device.
    if (ds_partition && host_ != nullptr) {
      const std::int64_t dims = 3 + (mask_.defined() ? 4 : 0) + (rope_cs_.defined() ? 3 + 3 : 0) + (position_ids_.defined() ? 2 : 0);
      ds_arg_sizes_[l] = host_->alloc(DType::u8, {8 * dims}, "ds_checkpoint_sizes", MemCategory::activations);
    }
  }
  final_norm().run_pre_forward();
  hf_ = norm_forward(dev, final_norm(), "weight", x, normf_);
  x = Tensor();
  final_norm().run_post_forward();
  // The model's forward returns: its locals go, but what the checkpointed layers hold (the mask,
  // Llama's position ids and cos/sin) stays with them, and the rope's products save cos and sin
  // until their backward (the backward says until when).
  if (!spec_.gradient_checkpointing) mask_ = Tensor();
  if (!spec_.gradient_checkpointing || spec_.pos != PositionKind::rotary) position_ids_ = Tensor();
  inputs_embeds_ = position_embeds_ = Tensor();
  lm_head().run_pre_forward();
  Tensor logits = act(dev, dtype_, {N, V}, "logits");
  dev.matmul(logits, hf_, data_of(lm_head(), "weight"), false, true, false);
  lm_head().run_post_forward();
  // Hugging Face's loss (Note [Hugging Face's saved tensors]): the logits upcast to f32, their
  // log-softmax kept for the backward, nll_loss's mean. The model's output holds the logits
  // until the loss is taken.
  const DType loss_dtype = stats_dtype();
  Tensor up = logits;
  if (logits.dtype() != loss_dtype) {
    up = act(dev, loss_dtype, {N, V}, "logits_f32");
    dev.cast(up, logits);
  }
  // ForCausalLMLoss pads the labels by one ([B, S + 1] int64: an allocation of the forward, as
  // DeepSpeed's side counts it) and shifts them into a contiguous [B, S] int64 target, which
  // nll_loss keeps for its backward; its local `labels` holds the padded copy until it returns.
  Tensor padded_labels = dev.alloc(DType::u8, {batch_ * (S + 1) * 8}, "labels_padded", MemCategory::activations);
  target_ = dev.alloc(DType::u8, {N * 8}, "nll_loss_target", MemCategory::activations);
  logp_ = act(dev, loss_dtype, {N, V}, "log_softmax");
  // nll_loss_forward's output and total_weight (0-dim each, allocated in that order; the second
  // is the mean's divisor, which nll_loss keeps for its backward too). The output is the model's
  // loss: held here until the forward returns, when Engine::forward's 0-dim loss takes its place.
  Tensor loss = dev.alloc(loss_dtype, {1}, "nll_loss", MemCategory::temporaries);
  total_weight_ = act(dev, loss_dtype, {1}, "nll_loss_total_weight");
  dev.log_softmax_nll(logp_, loss, up, labels_.view({N}));
  up = logits = padded_labels = Tensor();
  run_post_forward();
  return item(dev, loss, 0.0);
}

void Transformer::backward(Device& dev, double loss_scale, std::int64_t ga) {
  ZC_ASSERT(acts_.size() == static_cast<std::size_t>(spec_.layers) && logp_.defined(),
            "backward without forward");
  run_pre_backward();
  const std::int64_t N = batch_ * spec_.seq, V = spec_.vocab;
  Module& head_m = lm_head();
  head_m.run_pre_backward();
  // As autograd runs Hugging Face's loss backward, in the loss dtype: nll_loss's gradient (the
  // mean over this rank's tokens of the loss DeepSpeed scaled by loss_scale / ga), then
  // log_softmax's, three [N, V] live at once; then the cast to the model's dtype.
  Tensor dlogp = act(dev, logp_.dtype(), {N, V}, "nll_loss_grad");
  loss_grad_ = Tensor();  // NllLossBackward0 has read the loss's gradient
  dev.nll_loss_backward(dlogp, labels_.view({N}),
                        -(loss_scale / static_cast<double>(ga)) / static_cast<double>(N));
  target_ = total_weight_ = Tensor();
  Tensor dlogits = act(dev, logp_.dtype(), {N, V}, "log_softmax_grad");
  dev.log_softmax_backward(dlogits, dlogp, logp_);
  dlogp = logp_ = Tensor();
  if (dlogits.dtype() != dtype_) {
    Tensor down = act(dev, dtype_, {N, V}, "dlogits_model_dtype");
    dev.cast(down, dlogits);
    dlogits = down;
  }
  // Autograd's thread takes its cuBLAS workspace at its first matmul, the LM head's.
  if (spec_.blas_workspace_bytes > 0 && !backward_workspace_.defined()) {
    backward_workspace_ = dev.alloc(DType::u8, {spec_.blas_workspace_bytes},
                                    "cublas_workspace.autograd", MemCategory::temporaries);
  }
  // The LM head's weight grad (grads from its allocation, as linear_backward's); with tied
  // embeddings it waits for the embedding's part, and the one Parameter gets their sum once (Note
  // [Shared params]): a temporary then, as autograd's buffer before the sum.
  Tensor dhead = dev.alloc(dtype_, {V, spec_.dim}, "dlm_head",
                           spec_.tied_embeddings ? MemCategory::temporaries : MemCategory::grads);
  dev.matmul(dhead, dlogits, hf_, true, false, false);
  Tensor dhf = act(dev, dtype_, {N, spec_.dim}, "dhf");
  dev.matmul(dhf, dlogits, data_of(head_m, "weight"), false, false, false);
  dlogits = Tensor();
  hf_ = Tensor();  // the LM head's node has run: its saved input goes before its weight's hook
  if (!spec_.tied_embeddings) {
    accumulate_grad(dev, *head_m.params().get("weight"), std::move(dhead));
  }
  head_m.run_post_backward();
  final_norm().run_pre_backward();
  Tensor dx = norm_backward(dev, final_norm(), "weight", std::move(dhf), normf_);
  normf_ = NormActs{};
  final_norm().run_post_backward();
  for (std::size_t l = acts_.size(); l-- > 0;) {
    dx = spec_.gradient_checkpointing ? checkpointed_block_backward(dev, l, dx)
                                      : block_backward(dev, layer(l), acts_[l], dx);
  }
  // Layer 0's backward has run. What the layers kept beside their inputs goes now: the rope's
  // saved cos and sin without checkpointing; under torch's checkpoint what Hugging Face passes
  // positionally (GPT-2's mask: a saved input); under deepspeed.checkpointing every argument
  // (positional only, ctx.deepspeed_saved_tensors, cleared by each layer's backward). What
  // Hugging Face passes torch's checkpoint by keyword (Llama's mask, position ids, cos and sin;
  // GPT-2's position ids) stays in the checkpoints' run_function until the loss graph goes, at
  // the next forward.
  const bool torch_ckpt = spec_.gradient_checkpointing && spec_.checkpoint_function == CheckpointFunction::torch_reentrant;
  if (!torch_ckpt) {
    rope_cs_ = mask_ = position_ids_ = Tensor();
  } else if (spec_.pos == PositionKind::learned) {
    mask_ = Tensor();
  }
  Module& emb = embed();
  emb.run_pre_backward();
  // The embeddings' grads as linear_backward's: grads from their allocation; tied, the token
  // embedding's with the LM head's added where autograd's buffer sums them (not measured apart).
  Tensor dtok = dev.alloc(dtype_, {V, spec_.dim}, "dtok_emb",
                          spec_.tied_embeddings ? MemCategory::temporaries : MemCategory::grads);
  dev.embedding_backward(dtok, dx, ids_.view({N}));
  if (spec_.tied_embeddings) dev.add(dtok, dtok, dhead);
  if (spec_.pos == PositionKind::learned) {
    Tensor dpos = dev.alloc(dtype_, {spec_.positions, spec_.dim}, "dpos_emb", MemCategory::grads);
    dev.embedding_backward(dpos, dx, positions_);
    accumulate_grad(dev, *emb.params().get("pos"), std::move(dpos));
  }
  accumulate_grad(dev, *emb.params().get("tok"), std::move(dtok));
  if (!torch_ckpt) positions_ = Tensor();  // the position embedding's ids go with its backward
  // The batch's ids and labels are the caller's: autograd's hold on them (the embedding's saved
  // indices) ends here, and a loop frees its batch after the backward (DeepSpeed's measured
  // memory, issue 41: the model held them until the next forward, 256 B above it at world 2).
  ids_ = labels_ = Tensor();
  // No post-backward hook for the embedding or the model: DeepSpeed's fires only through an input
  // that requires grad, and theirs are token ids (Note [ZeRO-3's parameter coordinator]).
}

}  // namespace zc
