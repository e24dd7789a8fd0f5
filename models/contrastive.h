// Contrastive: a GradCache-style model. An encoder (an MLP) maps queries and keys to
// representations; the loss is over the whole batch of pairs. GradCache computes it in three
// passes so that activations of only one chunk live at a time: (1) encode every chunk without
// keeping activations, (2) compute the loss and its gradient with respect to every
// representation, (3) for each of N chunks, forward the chunk again and backward the cached
// representation gradients: N backward() calls per step, whose parameter gradients must SUM.
// Losses: InfoNCE over in-batch negatives (gaussian domain), or a bilinear alignment
// L = (1/S) sum_i s_i <q_i, k_i> whose representation gradients are exact (exact domain).
#pragma once

#include "engine/engine.h"
#include "models/mlp.h"

namespace zc {

class Contrastive : public Model {
 public:
  Contrastive(std::int64_t in, std::int64_t dim, LossKind loss, std::string name = "contrastive");
  Contrastive(const Contrastive&) = default;  // the encoder is reached through children()
  std::string kind() const override { return "contrastive"; }
  nlohmann::json kind_args() const override;
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  // xq, xk: [S, in]; s: [S, dim] (bilinear coefficients, each row one value). The positive of
  // query i is key i of the same (local) batch.
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  // A chunk forward: batch holds xq, xk and the cached representation grads gq, gk [S, dim];
  // the loss is the surrogate <gq, Q> + <gk, K>, whose backward is exactly the cached grads.
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;

  // GradCache passes 1 and 2 over a whole (local) batch: the true loss, and dL/dQ, dL/dK.
  double rep_grads(Device& dev, const Batch& full, Tensor& gq, Tensor& gk);

 protected:
  std::unique_ptr<Module> clone_impl() const override {
    return std::make_unique<Contrastive>(*this);
  }

 private:
  Tensor encode_pairs(Device& dev, const Batch& b, bool keep);  // [2S, dim]: Q rows then K rows
  Mlp& encoder() const { return static_cast<Mlp&>(*children().at(0)); }
  std::int64_t in_, dim_;
  LossKind loss_;
  Tensor grad_cache_;  // [2S, dim] the chunk's cached representation grads
};

// One GradCache training micro-step on `local` (this rank's batch) in `nchunks` chunks: N
// forward + backward calls through the engine. Returns the full-batch loss.
double gradcache_step(Engine& engine, Contrastive& model, Device& dev, const HostBatch& local,
                      int nchunks, DType dtype);

}  // namespace zc
