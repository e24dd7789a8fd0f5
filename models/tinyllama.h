// TinyLlama: a small decoder-only transformer with explicit backward, for AutoTP and AutoSP.
// tok_emb [V,d] + pos_emb [S,d] (a learned stand-in for RoPE), L blocks of
//   x = x + Wo attn(rmsnorm(x) Wq^T, Wk^T, Wv^T)      (causal, H heads of dh = d / H)
//   x = x + Wdown relu(Wup rmsnorm(x))                  (d -> hidden -> d)
// then rmsnorm, lm_head [V,d] and the mean next-token cross-entropy over every token.
// Tensor parallelism (Megatron, AutoTP): built over a TP group of tp ranks, a rank holds heads
// [r H/tp, (r+1) H/tp) of Wq/Wk/Wv (rows) and of Wo (columns), and hidden units likewise of
// Wup (rows) / Wdown (columns); Wo and Wdown outputs are all-reduced in forward ("g"), the
// inputs of the column-parallel layers all-reduced in backward ("f"). Shards are slices of the
// same Rng draws as the non-parallel model. Sequence parallelism (Ulysses, AutoSP): built over
// an SP group of sp ranks, a rank holds every param and S/sp tokens of each sequence; around
// attention an all_to_all turns [S/sp tokens, H heads] into [S tokens, H/sp heads] and back.
// See Note [Ulysses loss scaling] in tinyllama.cpp for why the engine's divide-by-world
// reduction then gives the non-parallel gradient.
#pragma once

#include "engine/comm.h"
#include "engine/model.h"

namespace zc {

struct TinyLlamaSpec {
  std::int64_t vocab = 16;
  std::int64_t dim = 8;
  std::int64_t heads = 2;
  std::int64_t hidden = 16;
  std::int64_t seq = 8;
  int layers = 2;
  double eps = 1e-5;
};

// The groups a TinyLlama is built over; nullptr for none. At most one of them (TP x SP together
// is not built).
struct TinyLlamaGroups {
  Comm* tp = nullptr;
  Comm* sp = nullptr;
};

// One transformer block's params; its shapes are this rank's TP shards.
class LlamaBlock : public Module {
 public:
  LlamaBlock(std::string name, std::int64_t dim, std::int64_t qkv_local, std::int64_t hidden_local);
  LlamaBlock(const LlamaBlock&) = default;
  std::string kind() const override { return "llama_block"; }
  nlohmann::json kind_args() const override;
  Tensor& p(const char* local_name);  // read through ParamDict::get
  std::int64_t dim, qkv_local, hidden_local;

 protected:
  std::unique_ptr<Module> clone_impl() const override {
    return std::make_unique<LlamaBlock>(*this);
  }
};

class TinyLlama : public Model {
 public:
  explicit TinyLlama(TinyLlamaSpec spec, TinyLlamaGroups groups = {},
                     std::string name = "tinyllama");
  TinyLlama(const TinyLlama&) = default;  // shares the groups; blocks are reached via children()
  std::string kind() const override { return "tinyllama"; }
  nlohmann::json kind_args() const override;
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  // "ids" and "labels" [samples, S]: sequences of a fixed random bigram map with 1/4 noise;
  // labels are the next tokens. Cut them with sequence_shard() for an SP rank.
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  // The batch holds this rank's tokens: [B, S] without SP, [B, S/sp] with it.
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;
  ModelParallelism parallelism() const override;
  const TinyLlamaSpec& spec() const { return spec_; }
  int tp_size() const { return groups_.tp != nullptr ? groups_.tp->size() : 1; }
  int sp_size() const { return groups_.sp != nullptr ? groups_.sp->size() : 1; }

  // The axis of the non-parallel param a TP shard cuts: 0 (column-parallel Wq/Wk/Wv/Wup), 1
  // (row-parallel Wo/Wdown), -1 (replicated).
  static int tp_shard_axis(std::string_view local_name);
  // Reassembles per-TP-rank flat vectors (each in that rank's named_parameters() order) into the
  // non-parallel model's order; replicated params are taken from rank 0.
  static std::vector<double> gather_tp(const TinyLlamaSpec& spec,
                                       const std::vector<std::vector<double>>& per_rank);

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<TinyLlama>(*this); }

 private:
  struct BlockActs {       // saved by forward for backward; N = local tokens
    Tensor x, h1, rstd1;   // [N,d] [N,d] [N]
    Tensor q, k, v, p;     // head layout [B,S,Hl,dh] each; p [B*Hl*S, S] probabilities
    Tensor o;              // [N, qkv_local] attention output in token layout (Wo's input)
    Tensor x2, h2, rstd2;  // [N,d] [N,d] [N]
    Tensor u, r;           // [N, hidden_local] pre- and post-ReLU
  };
  LlamaBlock& block(std::size_t l) const { return static_cast<LlamaBlock&>(*children().at(l)); }
  Tensor& root_param(const char* local_name);
  void init_full(Device& dev, Parameter& p, Shape full, int axis, DataDomain domain,
                 const ExactSpec& ex, Rng& rng, double scale);
  Tensor block_forward(Device& dev, LlamaBlock& b, BlockActs& a, const Tensor& x);
  Tensor block_backward(Device& dev, LlamaBlock& b, BlockActs& a, const Tensor& dx3);
  Tensor attention_forward(Device& dev, BlockActs& a);
  void attention_backward(Device& dev, BlockActs& a, const Tensor& do_heads, Tensor& dq, Tensor& dk,
                          Tensor& dv);
  // Ulysses: token layout [B*S/sp, H*dh] <-> head layout [B*S, (H/sp)*dh]; identity without SP.
  Tensor to_heads(Device& dev, const Tensor& x);
  Tensor to_tokens(Device& dev, const Tensor& y);
  void tp_all_reduce(const Tensor& t);
  std::int64_t local_heads() const { return spec_.heads / tp_size() / sp_size(); }

  TinyLlamaSpec spec_;
  TinyLlamaGroups groups_;
  std::vector<BlockActs> acts_;
  Tensor ids_, pos_, labels_, xf_, hf_, rstdf_, dlogits_;
  std::int64_t batch_ = 0, seq_local_ = 0;
};

// The SP rank's part of a batch of [B, S] arrays: tokens [part * S/parts, (part+1) * S/parts).
HostBatch sequence_shard(const HostBatch& hb, int part, int parts);

}  // namespace zc
