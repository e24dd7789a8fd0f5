// MLP and SimpleModel: stacks of Linear layers (each a child module with weight [out,in] and bias
// [out]), optional ReLU between layers, and a loss: cross-entropy (gaussian domain) or a linear
// loss L = sum(c * out) / B whose output gradient c / B is exact (exact domain). SimpleModel is
// DeepSpeed's unit-test model: nlayers Linear(hidden, hidden) with no activation.
#pragma once

#include "engine/model.h"

namespace zc {

enum class LossKind : std::uint8_t { linear, cross_entropy };

struct MlpSpec {
  std::vector<std::int64_t> dims;  // [in, h1, ..., out]
  bool relu = false;
  LossKind loss = LossKind::linear;
};

// Params are read through ParamDict::get (SPEC 7), so ZeRO-3's getter semantics apply.
class Linear : public Module {
 public:
  Linear(std::string name, std::int64_t in, std::int64_t out);
  Linear(const Linear&) = default;  // the Module copy path: see Note [Module copies]
  std::string kind() const override { return "linear"; }
  nlohmann::json kind_args() const override;
  Parameter& weight() { return *params().get("weight"); }  // [out, in]
  Parameter& bias() { return *params().get("bias"); }      // [out]
  std::int64_t in_features, out_features;

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<Linear>(*this); }
};

class Mlp : public Model {
 public:
  explicit Mlp(MlpSpec spec, std::string name = "mlp");
  Mlp(const Mlp&) = default;  // layers are reached through children(): nothing to rebind
  std::string kind() const override { return "mlp"; }
  nlohmann::json kind_args() const override;
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  HostBatch batch_shapes(std::int64_t samples) const override;
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;
  const MlpSpec& spec() const { return spec_; }

  // Forward without keeping activations for backward (GradCache's first pass).
  Tensor encode(Device& dev, const Tensor& x);
  // Forward that keeps activations for backward_from; returns the output [B, out].
  Tensor forward_features(Device& dev, const Tensor& x);
  // Backward from a given output gradient dy [B, out] (already scaled).
  void backward_from(Device& dev, Tensor dy);
  std::size_t num_layers() const { return children().size(); }
  Linear& layer(std::size_t l) const { return static_cast<Linear&>(*children().at(l)); }

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<Mlp>(*this); }

 private:
  Tensor layer_forward(Device& dev, Linear& l, const Tensor& x, bool kept);
  MlpSpec spec_;
  std::vector<Tensor> acts_;     // acts_[l] = input of layer l (relu's result); acts_.back() = output, until forward returns
  Tensor coeff_, dlogits_;       // linear loss coefficients / cross-entropy dlogits
  Shape out_shape_;              // the last forward's output shape [B, out]
  std::int64_t batch_ = 0;
};

// DeepSpeed's SimpleModel(hidden_dim, nlayers): nlayers x Linear(hidden, hidden), no activation.
MlpSpec simple_model_spec(std::int64_t hidden, int nlayers, LossKind loss);

}  // namespace zc
