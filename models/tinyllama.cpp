// TinyLlama forward and explicit backward, with Megatron TP and Ulysses SP. Shapes: N = B * S_l
// local tokens (S_l = S / sp); token layout [N, H_r * dh] (H_r: this rank's TP heads); head
// layout [B, S, Hl, dh] (Hl = H / tp / sp), on which attention runs per (batch, head).
//
// Note [Ulysses loss scaling]
// Each SP rank's loss is the mean over its own N tokens: L_r = (1/N) sum_{t in r} l_t. The
// global loss of the SP group is L = (1/sp) sum_r L_r (every rank holds N tokens). Rank r's
// backward starts from dL_r and crosses the all_to_all, so it also writes into other ranks'
// attention; its local param grad g_r is its share of d(sum_r L_r)/dtheta, and the shares sum
// to d(sum_r L_r)/dtheta = sp dL/dtheta. DeepSpeed all-reduces over the whole world and divides
// by the world size W = dp * sp: (1/W) sum_ranks g_r = (1/dp) sum_replicas dL/dtheta, the mean
// over every token of the global batch, which is the non-parallel gradient of the mean loss.
// So the SP model needs no extra scale, provided the engine's Comm is the whole world (not a
// group that leaves out the SP ranks) and every rank holds the same number of tokens.
#include "models/tinyllama.h"

#include "models/params.h"

#include "engine/errors.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace zc {

using model_params::data_of;
using model_params::param_of;

LlamaBlock::LlamaBlock(std::string name, std::int64_t d, std::int64_t qkv_l, std::int64_t hidden_l)
    : Module(std::move(name)), dim(d), qkv_local(qkv_l), hidden_local(hidden_l) {
  params().add("attn_norm", {d}, DType::f32);
  params().add("wq", {qkv_l, d}, DType::f32);
  params().add("wk", {qkv_l, d}, DType::f32);
  params().add("wv", {qkv_l, d}, DType::f32);
  params().add("wo", {d, qkv_l}, DType::f32);
  params().add("mlp_norm", {d}, DType::f32);
  params().add("w_up", {hidden_l, d}, DType::f32);
  params().add("w_down", {d, hidden_l}, DType::f32);
}

nlohmann::json LlamaBlock::kind_args() const {
  return {{"dim", dim}, {"qkv_local", qkv_local}, {"hidden_local", hidden_local}};
}

Tensor& LlamaBlock::p(const char* local_name) {
  return data_of(*this, local_name);
}

TinyLlama::TinyLlama(TinyLlamaSpec spec, TinyLlamaGroups groups, std::string name)
    : Model(std::move(name)), spec_(spec), groups_(groups) {
  if (groups_.tp != nullptr && groups_.sp != nullptr) {
    throw NotImplementedError(
        "tinyllama: tensor and sequence parallelism together are not built; "
        "pass one of TinyLlamaGroups::tp and ::sp");
  }
  const std::int64_t par = tp_size() * sp_size();
  if (spec_.dim % spec_.heads != 0 || spec_.heads % par != 0 || spec_.hidden % tp_size() != 0 ||
      spec_.seq % sp_size() != 0) {
    throw ConfigError(
        fmt::format("tinyllama: dim {} heads {} hidden {} seq {} do not split over tp {} "
                    "sp {}: heads must divide dim and be a multiple of tp * sp, hidden "
                    "of tp, seq of sp",
                    spec_.dim, spec_.heads, spec_.hidden, spec_.seq, tp_size(), sp_size()));
  }
  params().add("tok_emb", {spec_.vocab, spec_.dim}, DType::f32);
  params().add("pos_emb", {spec_.seq, spec_.dim}, DType::f32);
  for (int l = 0; l < spec_.layers; ++l) {
    add_child<LlamaBlock>(fmt::format("blocks.{}", l), spec_.dim, spec_.dim / tp_size(),
                          spec_.hidden / tp_size());
  }
  params().add("norm", {spec_.dim}, DType::f32);
  params().add("lm_head", {spec_.vocab, spec_.dim}, DType::f32);
  finalize_parameters();
}

nlohmann::json TinyLlama::kind_args() const {
  return {{"vocab", spec_.vocab},   {"dim", spec_.dim}, {"heads", spec_.heads},
          {"hidden", spec_.hidden}, {"seq", spec_.seq}, {"layers", spec_.layers}};
}

std::string TinyLlama::describe() const {
  return fmt::format(
      "tinyllama(vocab {}, dim {}, {} heads, hidden {}, seq {}, {} layers, tp {}, sp {})",
      spec_.vocab, spec_.dim, spec_.heads, spec_.hidden, spec_.seq, spec_.layers, tp_size(),
      sp_size());
}

ModelParallelism TinyLlama::parallelism() const {
  return ModelParallelism{true, tp_size(), true, sp_size()};
}

Tensor& TinyLlama::root_param(const char* local_name) {
  return data_of(*this, local_name);
}

int TinyLlama::tp_shard_axis(std::string_view local_name) {
  if (local_name == "wq" || local_name == "wk" || local_name == "wv" || local_name == "w_up")
    return 0;
  if (local_name == "wo" || local_name == "w_down") return 1;
  return -1;
}

namespace {
std::string_view local_of(const std::string& dotted) {
  const std::size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? std::string_view(dotted)
                                  : std::string_view(dotted).substr(dot + 1);
}
}  // namespace

// Draws the non-parallel param's values (the same Rng draws at any tp) and keeps this rank's slice.
void TinyLlama::init_full(Device& dev, Parameter& p, Shape full, int axis, DataDomain domain,
                          const ExactSpec& ex, Rng& rng, double scale) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(full)));  // [full] row-major
  for (double& x : v) x = scale == 0.0 ? 1.0 : draw_value(rng, domain, ex, scale);
  std::vector<double> mine;  // [p.shape]
  const int r = groups_.tp != nullptr ? groups_.tp->rank() : 0;
  if (axis < 0) {
    mine = v;
  } else {
    const std::int64_t rows = full[0], cols = full[1];
    const std::int64_t r0 = axis == 0 ? r * p.shape[0] : 0, c0 = axis == 1 ? r * p.shape[1] : 0;
    for (std::int64_t i = r0; i < r0 + p.shape[0]; ++i) {
      for (std::int64_t j = c0; j < c0 + p.shape[1]; ++j)
        mine.push_back(v[static_cast<std::size_t>(i * cols + j)]);
    }
    ZC_ASSERT(r0 + p.shape[0] <= rows && c0 + p.shape[1] <= cols,
              "{}: shard outside the full param", p.name);
  }
  ZC_ASSERT(static_cast<std::int64_t>(mine.size()) == p.numel(), "{}: shard of {} values for {}",
            p.name, mine.size(), p.numel());
  p.dtype = dtype_;
  p.data = tensor_from_f64(dev, dtype_, p.shape, mine, p.name);
}

void TinyLlama::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                            Rng& rng) {
  dtype_ = dtype;
  const std::int64_t d = spec_.dim, h = spec_.hidden, V = spec_.vocab;
  const double gd = 1.0 / std::sqrt(static_cast<double>(d)),
               gh = 1.0 / std::sqrt(static_cast<double>(h));
  init_full(dev, param_of(*this, "tok_emb"), {V, d}, -1, domain, ex, rng, 1.0);
  init_full(dev, param_of(*this, "pos_emb"), {spec_.seq, d}, -1, domain, ex, rng, 0.5);
  for (std::size_t l = 0; l < children().size(); ++l) {
    LlamaBlock& b = block(l);
    init_full(dev, param_of(b, "attn_norm"), {d}, -1, domain, ex, rng, 0.0);  // gains start at 1
    for (const char* n : {"wq", "wk", "wv"})
      init_full(dev, param_of(b, n), {d, d}, 0, domain, ex, rng, gd);
    init_full(dev, param_of(b, "wo"), {d, d}, 1, domain, ex, rng, gd);
    init_full(dev, param_of(b, "mlp_norm"), {d}, -1, domain, ex, rng, 0.0);
    init_full(dev, param_of(b, "w_up"), {h, d}, 0, domain, ex, rng, gd);
    init_full(dev, param_of(b, "w_down"), {d, h}, 1, domain, ex, rng, gh);
  }
  init_full(dev, param_of(*this, "norm"), {d}, -1, domain, ex, rng, 0.0);
  init_full(dev, param_of(*this, "lm_head"), {V, d}, -1, domain, ex, rng, gd);
}

HostBatch TinyLlama::make_batch(Rng& rng, std::int64_t samples, DataDomain,
                                const ExactSpec&) const {
  // A fixed "teacher" bigram map, the same for every batch: next = perm[cur], or a uniform
  // token with probability 1/4. Ids are small integers: exact in every dtype.
  Rng teacher(0x11a3a);
  std::vector<std::int64_t> perm(static_cast<std::size_t>(spec_.vocab));
  for (std::int64_t i = 0; i < spec_.vocab; ++i)
    perm[static_cast<std::size_t>(i)] = teacher.range(0, spec_.vocab - 1);
  HostBatch hb;
  hb.samples = samples;
  HostArray ids{{samples, spec_.seq}, {}}, labels{{samples, spec_.seq}, {}};
  for (std::int64_t b = 0; b < samples; ++b) {
    std::int64_t cur = rng.range(0, spec_.vocab - 1);
    for (std::int64_t t = 0; t < spec_.seq; ++t) {
      const std::int64_t next = rng.range(0, 3) == 0 ? rng.range(0, spec_.vocab - 1)
                                                     : perm[static_cast<std::size_t>(cur)];
      ids.values.push_back(static_cast<double>(cur));
      labels.values.push_back(static_cast<double>(next));
      cur = next;
    }
  }
  hb.arrays.emplace("ids", std::move(ids));
  hb.arrays.emplace("labels", std::move(labels));
  return hb;
}

HostBatch sequence_shard(const HostBatch& hb, int part, int parts) {
  HostBatch out;
  out.samples = hb.samples;
  for (const auto& [name, a] : hb.arrays) {
    if (a.shape.size() != 2 || a.shape[1] % parts != 0) {
      throw UsageError(fmt::format("sequence_shard: '{}' {} is not [B, S] with S a multiple of {}",
                                   name, shape_str(a.shape), parts));
    }
    const std::int64_t S = a.shape[1], Sl = S / parts;
    HostArray s{{a.shape[0], Sl}, {}};
    for (std::int64_t b = 0; b < a.shape[0]; ++b) {
      const auto first = a.values.begin() + b * S + part * Sl;
      s.values.insert(s.values.end(), first, first + Sl);
    }
    out.arrays.emplace(name, std::move(s));
  }
  return out;
}

void TinyLlama::tp_all_reduce(const Tensor& t) {
  if (groups_.tp != nullptr && groups_.tp->size() > 1)
    groups_.tp->all_reduce(t, {.op = ReduceOp::sum});
}

Tensor TinyLlama::to_heads(Device& dev, const Tensor& x) {
  const std::int64_t sp = sp_size();
  if (sp == 1) return x;
  const std::int64_t B = batch_, Sl = seq_local_, w = local_heads() * (spec_.dim / spec_.heads);
  Tensor send = dev.alloc(dtype_, {sp * B * Sl * w}, "ulysses_heads_send",
                          MemCategory::activations);  // [sp, B*Sl, Hl*dh]
  dev.permute_0213(send, x, 1, B * Sl, sp, w);
  Tensor recv = dev.alloc(dtype_, {sp * B * Sl * w}, "ulysses_heads_recv",
                          MemCategory::activations);  // [src, B, Sl, Hl*dh]
  groups_.sp->all_to_all(recv, send);
  Tensor out = dev.alloc(dtype_, {B * sp * Sl, w}, "ulysses_heads",
                         MemCategory::activations);  // [B, S, Hl*dh]
  dev.permute_0213(out, recv, 1, sp, B, Sl * w);
  return out;
}

Tensor TinyLlama::to_tokens(Device& dev, const Tensor& y) {
  const std::int64_t sp = sp_size();
  if (sp == 1) return y;
  const std::int64_t B = batch_, Sl = seq_local_, w = local_heads() * (spec_.dim / spec_.heads);
  Tensor send = dev.alloc(dtype_, {sp * B * Sl * w}, "ulysses_tokens_send",
                          MemCategory::activations);  // [sp, B, Sl*Hl*dh]
  dev.permute_0213(send, y, 1, B, sp, Sl * w);
  Tensor recv = dev.alloc(dtype_, {sp * B * Sl * w}, "ulysses_tokens_recv",
                          MemCategory::activations);  // [src, B*Sl, Hl*dh]
  groups_.sp->all_to_all(recv, send);
  Tensor out = dev.alloc(dtype_, {B * Sl, sp * w}, "ulysses_tokens",
                         MemCategory::activations);  // [B*Sl, H*dh]
  dev.permute_0213(out, recv, 1, sp, B * Sl, w);
  return out;
}

// Causal attention on the head layout [B, S, Hl, dh]: per (b, h) scores = q k^T / sqrt(dh).
Tensor TinyLlama::attention_forward(Device& dev, BlockActs& a) {
  const std::int64_t B = batch_, S = spec_.seq, Hl = local_heads(), dh = spec_.dim / spec_.heads;
  Tensor qh = dev.alloc(dtype_, {B * Hl * S * dh}, "attn_qh", MemCategory::activations),
         kh = dev.alloc(dtype_, {B * Hl * S * dh}, "attn_kh", MemCategory::activations),
         vh = dev.alloc(dtype_, {B * Hl * S * dh}, "attn_vh",
                        MemCategory::activations);  // [B, Hl, S, dh] each
  dev.permute_0213(qh, a.q, B, S, Hl, dh);
  dev.permute_0213(kh, a.k, B, S, Hl, dh);
  dev.permute_0213(vh, a.v, B, S, Hl, dh);
  Tensor scores = dev.alloc(dtype_, {B * Hl * S, S}, "attn_scores",
                            MemCategory::activations);  // [B*Hl*S, S]
  for (std::int64_t bh = 0; bh < B * Hl; ++bh) {
    dev.matmul(scores.narrow(bh * S * S, S * S).view({S, S}),
               qh.narrow(bh * S * dh, S * dh).view({S, dh}),
               kh.narrow(bh * S * dh, S * dh).view({S, dh}), false, true, false);
  }
  dev.scale(scores, 1.0 / std::sqrt(static_cast<double>(dh)));
  a.p = dev.alloc(dtype_, {B * Hl * S, S}, "attn_probs", MemCategory::activations);
  dev.causal_softmax(a.p, scores);
  Tensor oh = dev.alloc(dtype_, {B * Hl * S * dh}, "attn_oh",
                        MemCategory::activations);  // [B, Hl, S, dh]
  for (std::int64_t bh = 0; bh < B * Hl; ++bh) {
    dev.matmul(oh.narrow(bh * S * dh, S * dh).view({S, dh}),
               a.p.narrow(bh * S * S, S * S).view({S, S}),
               vh.narrow(bh * S * dh, S * dh).view({S, dh}), false, false, false);
  }
  Tensor o = dev.alloc(dtype_, {B * S, Hl * dh}, "attn_o",
                       MemCategory::activations);  // [B, S, Hl, dh]
  dev.permute_0213(o, oh, B, Hl, S, dh);
  return o;
}

void TinyLlama::attention_backward(Device& dev, BlockActs& a, const Tensor& do_heads, Tensor& dq,
                                   Tensor& dk, Tensor& dv) {
  const std::int64_t B = batch_, S = spec_.seq, Hl = local_heads(), dh = spec_.dim / spec_.heads;
  const std::int64_t n = B * Hl * S * dh;
  Tensor qh = dev.alloc(dtype_, {n}, "attn_qh", MemCategory::activations);
  Tensor kh = dev.alloc(dtype_, {n}, "attn_kh", MemCategory::activations);
  Tensor vh = dev.alloc(dtype_, {n}, "attn_vh", MemCategory::activations);
  Tensor doh = dev.alloc(dtype_, {n}, "attn_doh", MemCategory::activations);
  dev.permute_0213(qh, a.q, B, S, Hl, dh);
  dev.permute_0213(kh, a.k, B, S, Hl, dh);
  dev.permute_0213(vh, a.v, B, S, Hl, dh);
  dev.permute_0213(doh, do_heads, B, S, Hl, dh);
  Tensor dp = dev.alloc(dtype_, {B * Hl * S, S}, "attn_dprobs", MemCategory::activations);
  Tensor dqh = dev.alloc(dtype_, {n}, "attn_dqh", MemCategory::activations);
  Tensor dkh = dev.alloc(dtype_, {n}, "attn_dkh", MemCategory::activations);
  Tensor dvh = dev.alloc(dtype_, {n}, "attn_dvh", MemCategory::activations);  // [B, Hl, S, dh]
  auto mat = [&](const Tensor& t, std::int64_t bh, std::int64_t cols) {
    return t.narrow(bh * S * cols, S * cols).view({S, cols});
  };
  for (std::int64_t bh = 0; bh < B * Hl; ++bh) {
    dev.matmul(mat(dp, bh, S), mat(doh, bh, dh), mat(vh, bh, dh), false, true, false);    // dO V^T
    dev.matmul(mat(dvh, bh, dh), mat(a.p, bh, S), mat(doh, bh, dh), true, false, false);  // P^T dO
  }
  Tensor ds = dev.alloc(dtype_, {B * Hl * S, S}, "attn_dscores", MemCategory::activations);
  dev.softmax_backward(ds, dp, a.p);
  dev.scale(ds, 1.0 / std::sqrt(static_cast<double>(dh)));
  for (std::int64_t bh = 0; bh < B * Hl; ++bh) {
    dev.matmul(mat(dqh, bh, dh), mat(ds, bh, S), mat(kh, bh, dh), false, false, false);  // dS K
    dev.matmul(mat(dkh, bh, dh), mat(ds, bh, S), mat(qh, bh, dh), true, false, false);   // dS^T Q
  }
  dq = dev.alloc(dtype_, {B * S, Hl * dh}, "attn_dq", MemCategory::activations);
  dk = dev.alloc(dtype_, {B * S, Hl * dh}, "attn_dk", MemCategory::activations);
  dv = dev.alloc(dtype_, {B * S, Hl * dh}, "attn_dv", MemCategory::activations);
  dev.permute_0213(dq, dqh, B, Hl, S, dh);
  dev.permute_0213(dk, dkh, B, Hl, S, dh);
  dev.permute_0213(dv, dvh, B, Hl, S, dh);
}

Tensor TinyLlama::block_forward(Device& dev, LlamaBlock& b, BlockActs& a, const Tensor& x) {
  b.run_pre_forward();
  const std::int64_t N = x.dim(0), d = spec_.dim, ql = b.qkv_local, hl = b.hidden_local;
  a.x = x;
  a.h1 = dev.alloc(dtype_, {N, d}, "h1", MemCategory::activations);
  a.rstd1 = dev.alloc(dtype_, {N}, "rstd1", MemCategory::activations);
  dev.rmsnorm(a.h1, a.rstd1, x, b.p("attn_norm"), spec_.eps);
  Tensor q = dev.alloc(dtype_, {N, ql}, "q", MemCategory::activations);
  Tensor k = dev.alloc(dtype_, {N, ql}, "k", MemCategory::activations);
  Tensor v = dev.alloc(dtype_, {N, ql}, "v", MemCategory::activations);
  dev.matmul(q, a.h1, b.p("wq"), false, true, false);
  dev.matmul(k, a.h1, b.p("wk"), false, true, false);
  dev.matmul(v, a.h1, b.p("wv"), false, true, false);
  a.q = to_heads(dev, q);
  a.k = to_heads(dev, k);
  a.v = to_heads(dev, v);
  a.o = to_tokens(dev, attention_forward(dev, a));
  Tensor attn = dev.alloc(dtype_, {N, d}, "attn_out", MemCategory::activations);
  dev.matmul(attn, a.o, b.p("wo"), false, true, false);
  tp_all_reduce(attn);  // "g": row-parallel partial sums
  a.x2 = dev.alloc(dtype_, {N, d}, "x2", MemCategory::activations);
  dev.add(a.x2, x, attn);
  a.h2 = dev.alloc(dtype_, {N, d}, "h2", MemCategory::activations);
  a.rstd2 = dev.alloc(dtype_, {N}, "rstd2", MemCategory::activations);
  dev.rmsnorm(a.h2, a.rstd2, a.x2, b.p("mlp_norm"), spec_.eps);
  a.u = dev.alloc(dtype_, {N, hl}, "mlp_u", MemCategory::activations);
  dev.matmul(a.u, a.h2, b.p("w_up"), false, true, false);
  a.r = dev.alloc(dtype_, {N, hl}, "mlp_r", MemCategory::activations);
  dev.relu(a.r, a.u);
  Tensor m = dev.alloc(dtype_, {N, d}, "mlp_out", MemCategory::activations);
  dev.matmul(m, a.r, b.p("w_down"), false, true, false);
  tp_all_reduce(m);  // "g"
  Tensor x3 = dev.alloc(dtype_, {N, d}, "x3", MemCategory::activations);
  dev.add(x3, a.x2, m);
  b.run_post_forward();
  return x3;
}

double TinyLlama::forward(Device& dev, const Batch& batch) {
  run_pre_forward();
  ids_ = batch.at("ids");
  labels_ = batch.at("labels");
  if (ids_.ndim() != 2 || ids_.dim(1) * sp_size() != spec_.seq) {
    throw UsageError(
        fmt::format("tinyllama: ids {} must be [B, {}] (seq {} over sp {}): cut SP batches "
                    "with sequence_shard()",
                    shape_str(ids_.shape()), spec_.seq / sp_size(), spec_.seq, sp_size()));
  }
  batch_ = ids_.dim(0);
  seq_local_ = ids_.dim(1);
  const std::int64_t N = batch_ * seq_local_, d = spec_.dim, V = spec_.vocab;
  const std::int64_t first = (groups_.sp != nullptr ? groups_.sp->rank() : 0) * seq_local_;
  std::vector<double> pos;  // [N] global positions of this rank's tokens
  for (std::int64_t i = 0; i < N; ++i) pos.push_back(static_cast<double>(first + i % seq_local_));
  pos_ = tensor_from_f64(dev, dtype_, {N}, pos, "positions");
  Tensor x = dev.alloc(dtype_, {N, d}, "x0", MemCategory::activations);
  Tensor pe = dev.alloc(dtype_, {N, d}, "pos_x", MemCategory::activations);
  dev.embedding(x, root_param("tok_emb"), ids_);
  dev.embedding(pe, root_param("pos_emb"), pos_);
  dev.add(x, x, pe);
  acts_.assign(children().size(), BlockActs{});
  for (std::size_t l = 0; l < children().size(); ++l) x = block_forward(dev, block(l), acts_[l], x);
  xf_ = x;
  hf_ = dev.alloc(dtype_, {N, d}, "hf", MemCategory::activations);
  rstdf_ = dev.alloc(dtype_, {N}, "rstdf", MemCategory::activations);
  dev.rmsnorm(hf_, rstdf_, xf_, root_param("norm"), spec_.eps);
  Tensor logits = dev.alloc(dtype_, {N, V}, "logits", MemCategory::activations);
  dev.matmul(logits, hf_, root_param("lm_head"), false, true, false);
  const DType loss_dtype = dtype_ == DType::f64 ? DType::f64 : DType::f32;
  dlogits_ = dev.alloc(dtype_, {N, V}, "dlogits", MemCategory::activations);
  Tensor rows = dev.alloc(loss_dtype, {N}, "row_loss", MemCategory::temporaries);
  Tensor ones = dev.alloc(loss_dtype, {N}, "ones", MemCategory::temporaries);
  dev.softmax_xent(dlogits_, rows, logits, labels_.view({N}));
  dev.fill(ones, 1.0);
  const double loss = dev.dot(rows, ones) / static_cast<double>(N);
  run_post_forward();
  return loss;
}

Tensor TinyLlama::block_backward(Device& dev, LlamaBlock& b, BlockActs& a, const Tensor& dx3) {
  b.run_pre_backward();
  const std::int64_t N = dx3.dim(0), d = spec_.dim, ql = b.qkv_local, hl = b.hidden_local;
  // MLP: m = relu(h2 Wup^T) Wdown^T.
  Tensor dwd = dev.alloc(dtype_, {d, hl}, "dW_down", MemCategory::temporaries);
  Tensor dr = dev.alloc(dtype_, {N, hl}, "dr", MemCategory::activations);
  dev.matmul(dwd, dx3, a.r, true, false, false);
  dev.matmul(dr, dx3, b.p("w_down"), false, false, false);
  dev.relu_backward(dr, dr, a.u);
  Tensor dwu = dev.alloc(dtype_, {hl, d}, "dW_up", MemCategory::temporaries);
  Tensor dh2 = dev.alloc(dtype_, {N, d}, "dh2", MemCategory::activations);
  dev.matmul(dwu, dr, a.h2, true, false, false);
  dev.matmul(dh2, dr, b.p("w_up"), false, false, false);
  tp_all_reduce(dh2);  // "f": the column-parallel input's grad
  Tensor dx2 = dev.alloc(dtype_, {N, d}, "dx2", MemCategory::activations);
  Tensor dg2 = dev.alloc(dtype_, {d}, "dmlp_norm", MemCategory::temporaries);
  dev.rmsnorm_backward(dx2, dg2, dh2, a.x2, b.p("mlp_norm"), a.rstd2);
  dev.add(dx2, dx2, dx3);
  accumulate_grad(dev, param_of(b, "w_down"), dwd);
  accumulate_grad(dev, param_of(b, "w_up"), dwu);
  accumulate_grad(dev, param_of(b, "mlp_norm"), dg2);
  // Attention: attn = o Wo^T.
  Tensor dwo = dev.alloc(dtype_, {d, ql}, "dWo", MemCategory::temporaries);
  Tensor dout = dev.alloc(dtype_, {N, ql}, "do", MemCategory::activations);
  dev.matmul(dwo, dx2, a.o, true, false, false);
  dev.matmul(dout, dx2, b.p("wo"), false, false, false);
  Tensor dq, dk, dv;
  attention_backward(dev, a, to_heads(dev, dout), dq, dk, dv);
  dq = to_tokens(dev, dq);
  dk = to_tokens(dev, dk);
  dv = to_tokens(dev, dv);
  Tensor dwq = dev.alloc(dtype_, {ql, d}, "dWq", MemCategory::temporaries);
  Tensor dwk = dev.alloc(dtype_, {ql, d}, "dWk", MemCategory::temporaries);
  Tensor dwv = dev.alloc(dtype_, {ql, d}, "dWv", MemCategory::temporaries);
  Tensor dh1 = dev.alloc(dtype_, {N, d}, "dh1", MemCategory::activations);
  dev.matmul(dwq, dq, a.h1, true, false, false);
  dev.matmul(dwk, dk, a.h1, true, false, false);
  dev.matmul(dwv, dv, a.h1, true, false, false);
  dev.matmul(dh1, dq, b.p("wq"), false, false, false);
  dev.matmul(dh1, dk, b.p("wk"), false, false, true);
  dev.matmul(dh1, dv, b.p("wv"), false, false, true);
  tp_all_reduce(dh1);  // "f"
  Tensor dx = dev.alloc(dtype_, {N, d}, "dx", MemCategory::activations);
  Tensor dg1 = dev.alloc(dtype_, {d}, "dattn_norm", MemCategory::temporaries);
  dev.rmsnorm_backward(dx, dg1, dh1, a.x, b.p("attn_norm"), a.rstd1);
  dev.add(dx, dx, dx2);
  accumulate_grad(dev, param_of(b, "wo"), dwo);
  accumulate_grad(dev, param_of(b, "wv"), dwv);
  accumulate_grad(dev, param_of(b, "wk"), dwk);
  accumulate_grad(dev, param_of(b, "wq"), dwq);
  accumulate_grad(dev, param_of(b, "attn_norm"), dg1);
  b.run_post_backward();
  return dx;
}

void TinyLlama::backward(Device& dev, double loss_scale, std::int64_t ga) {
  ZC_ASSERT(acts_.size() == children().size() && dlogits_.defined(), "backward without forward");
  run_pre_backward();
  const std::int64_t N = batch_ * seq_local_, d = spec_.dim, V = spec_.vocab;
  Tensor dlogits = dev.alloc(dtype_, {N, V}, "dlogits_scaled", MemCategory::activations);
  loss_grad_ = Tensor();  // the loss's node has read its gradient
  dev.copy(dlogits, dlogits_);
  dev.div(dlogits,
          static_cast<double>(N));  // mean over this rank's tokens (Note [Ulysses loss scaling])
  dev.scale(dlogits, loss_scale);
  dev.div(dlogits, static_cast<double>(ga));
  Tensor dhead = dev.alloc(dtype_, {V, d}, "dlm_head", MemCategory::temporaries);
  Tensor dhf = dev.alloc(dtype_, {N, d}, "dhf", MemCategory::activations);
  dev.matmul(dhead, dlogits, hf_, true, false, false);
  dev.matmul(dhf, dlogits, root_param("lm_head"), false, false, false);
  Tensor dx = dev.alloc(dtype_, {N, d}, "dxf", MemCategory::activations);
  Tensor dgf = dev.alloc(dtype_, {d}, "dnorm", MemCategory::temporaries);
  dev.rmsnorm_backward(dx, dgf, dhf, xf_, root_param("norm"), rstdf_);
  accumulate_grad(dev, param_of(*this, "lm_head"), dhead);
  accumulate_grad(dev, param_of(*this, "norm"), dgf);
  for (std::size_t l = children().size(); l-- > 0;)
    dx = block_backward(dev, block(l), acts_[l], dx);
  Tensor dpos = dev.alloc(dtype_, {spec_.seq, d}, "dpos_emb", MemCategory::temporaries),
         dtok = dev.alloc(dtype_, {V, d}, "dtok_emb", MemCategory::temporaries);
  dev.embedding_backward(dpos, dx, pos_);
  dev.embedding_backward(dtok, dx, ids_);
  accumulate_grad(dev, param_of(*this, "pos_emb"), dpos);
  accumulate_grad(dev, param_of(*this, "tok_emb"), dtok);
  // No post-backward hook: DeepSpeed's fires only through an input that requires grad, and the model's input (token ids) is data (Note [ZeRO-3's parameter coordinator]).
}

std::vector<double> TinyLlama::gather_tp(const TinyLlamaSpec& spec,
                                         const std::vector<std::vector<double>>& per_rank) {
  TinyLlama full(spec);
  const auto tp = static_cast<std::int64_t>(per_rank.size());
  std::vector<std::size_t> at(per_rank.size(), 0);  // read position in each rank's vector
  std::vector<double> out;
  for (Parameter* p : full.named_parameters()) {
    const int axis = tp_shard_axis(local_of(p->name));
    const std::int64_t rows = p->shape[0], cols = p->shape.size() > 1 ? p->shape[1] : 1;
    std::vector<double> v(static_cast<std::size_t>(p->numel()));
    for (std::int64_t r = 0; r < (axis < 0 ? 1 : tp); ++r) {
      const std::int64_t lr = axis == 0 ? rows / tp : rows, lc = axis == 1 ? cols / tp : cols;
      const std::vector<double>& src = per_rank[static_cast<std::size_t>(r)];
      std::size_t& pos = at[static_cast<std::size_t>(r)];
      ZC_ASSERT(pos + static_cast<std::size_t>(lr * lc) <= src.size(),
                "gather_tp: rank {} is short at {}", r, p->name);
      for (std::int64_t i = 0; i < lr; ++i) {
        for (std::int64_t j = 0; j < lc; ++j) {
          const std::int64_t gi = axis == 0 ? r * lr + i : i, gj = axis == 1 ? r * lc + j : j;
          v[static_cast<std::size_t>(gi * cols + gj)] = src[pos++];
        }
      }
    }
    if (axis < 0) {
      for (std::size_t r = 1; r < per_rank.size(); ++r)
        at[r] += static_cast<std::size_t>(p->numel());
    }
    out.insert(out.end(), v.begin(), v.end());
  }
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    ZC_ASSERT(at[r] == per_rank[r].size(), "gather_tp: rank {} has {} values, used {}", r,
              per_rank[r].size(), at[r]);
  }
  return out;
}

}  // namespace zc
