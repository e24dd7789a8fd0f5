// Synthetic: parameters of given shapes and a loss that is linear in them,
// L = (1/B) sum_s <g_s, p>, so dL/dp = mean of the caller's prescribed per-sample gradients g_s.
// For exact plumbing tests: what the engine reduces is exactly what the caller wrote.
#pragma once

#include "engine/model.h"

namespace zc {

class Synthetic : public Model {
 public:
  explicit Synthetic(std::vector<Shape> shapes, std::string name = "synthetic");
  Synthetic(const Synthetic&) = default;  // the Module copy path: see Note [Module copies]
  std::string kind() const override { return "synthetic"; }
  nlohmann::json kind_args() const override;
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  HostBatch batch_shapes(std::int64_t samples) const override;
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<Synthetic>(*this); }

 private:
  // Param i ("p{i}"), read through ParamDict::get (SPEC 7).
  Parameter& param(std::size_t i);
  std::vector<Shape> shapes_;
  Batch held_;
  std::vector<Tensor> means_;  // each param's batch mean, kept for backward as the twin's autograd keeps it
};

}  // namespace zc
