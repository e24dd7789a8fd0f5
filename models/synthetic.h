// Synthetic: parameters of given shapes and a loss that is linear in them,
// L = (1/B) sum_s <g_s, p>, so dL/dp = mean of the caller's prescribed per-sample gradients g_s.
// For exact plumbing tests: what the engine reduces is exactly what the caller wrote.
#pragma once

#include "engine/model.h"

namespace zc {

class Synthetic : public Model {
 public:
  explicit Synthetic(std::vector<Shape> shapes, std::string name = "synthetic");
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;

 private:
  std::vector<Shape> shapes_;
  std::vector<Parameter*> ps_;
  const Batch* batch_ = nullptr;
  Batch held_;
};

}  // namespace zc
