// SimpleMoE: x -> pre Linear -> an MoE layer with a top-1 gate -> linear loss. The gate is a
// Linear(dim, num_experts); token b goes to expert e_b = argmax of its logits (first on ties) and
// its output is l_b * expert(h_b), l_b the chosen logit (a linear gate value, where DeepSpeed
// multiplies by the softmax probability: this keeps the exact domain exact). Experts are spread
// over the expert-parallel group of ep_size ranks (num_experts / ep_size each, global ids
// ep_rank * local + k) and tokens travel by all_to_all with capacity = the local batch, so none
// is dropped. Expert params are marked is_expert: the engine reduces them over the
// expert-data-parallel group.
#pragma once

#include "engine/comm.h"
#include "models/mlp.h"

namespace zc {

struct MoeSpec {
  std::int64_t dim = 4;
  int num_experts = 4;
};

class SimpleMoE : public Model {
 public:
  // ep: the expert-parallel group (size ep_size; this rank is ep->rank()).
  SimpleMoE(MoeSpec spec, Comm& ep, std::string name = "simple_moe");
  // A copy shares the expert-parallel group; its layers are reached through children().
  SimpleMoE(const SimpleMoE&) = default;
  std::string kind() const override { return "simple_moe"; }
  nlohmann::json kind_args() const override;
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;
  int local_experts() const { return local_; }

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<SimpleMoE>(*this); }

 private:
  // children(): pre, gate, then this rank's local experts in order.
  Linear& pre() const { return static_cast<Linear&>(*children().at(0)); }
  Linear& gate() const { return static_cast<Linear&>(*children().at(1)); }
  Linear& expert(std::size_t k) const { return static_cast<Linear&>(*children().at(2 + k)); }

  // Sends rows[b] to the slot of token b in the block of expert route[b]; returns per local
  // expert the [ep * C, dim] rows it received (C = local batch).
  std::vector<Tensor> dispatch(Device& dev, const Tensor& rows);
  // The inverse: per local expert [ep * C, dim] rows back to their tokens: [C, dim].
  Tensor combine(Device& dev, const std::vector<Tensor>& per_expert);

  MoeSpec spec_;
  Comm& ep_;
  int local_;
  // Saved by forward for backward.
  Tensor x_, h_, logits_, l_, e_, coeff_;  // [B,d] [B,d] [B,X] [B] [B,d] [B,d]
  std::vector<Tensor> expert_in_;           // per local expert [ep*C, d]
  std::vector<std::int64_t> route_;
  std::int64_t batch_ = 0;
};

}  // namespace zc
