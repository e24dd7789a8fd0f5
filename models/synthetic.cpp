// Synthetic model: prescribed gradients, fired in reverse registration order like a real backward.
#include "models/synthetic.h"

#include "engine/errors.h"

#include <cmath>

namespace zc {

Synthetic::Synthetic(std::vector<Shape> shapes, std::string name)
    : Model(std::move(name)), shapes_(std::move(shapes)) {
  for (std::size_t i = 0; i < shapes_.size(); ++i) ps_.push_back(&params().add(fmt::format("p{}", i), shapes_[i], DType::f32));
  finalize_parameters();
}

std::string Synthetic::describe() const {
  std::string s;
  for (const Shape& sh : shapes_) s += (s.empty() ? "" : ",") + shape_str(sh);
  return fmt::format("synthetic({})", s);
}

void Synthetic::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex, Rng& rng) {
  dtype_ = dtype;
  for (Parameter* p : ps_) init_param(dev, *p, dtype, domain, ex, rng, 1.0);
}

HostBatch Synthetic::make_batch(Rng& rng, std::int64_t samples, DataDomain domain, const ExactSpec& ex) const {
  HostBatch hb;
  hb.samples = samples;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    const std::int64_t n = shape_numel(shapes_[i]);
    HostArray g{{samples, n}, {}};
    for (std::int64_t k = 0; k < samples * n; ++k) {
      g.values.push_back(domain == DataDomain::exact
                             ? std::ldexp(static_cast<double>(rng.range(-ex.max_k, ex.max_k) * ex.grad_multiple), -ex.scale_exp)
                             : rng.normal());
    }
    hb.arrays.emplace(fmt::format("g{}", i), std::move(g));
  }
  return hb;
}

double Synthetic::forward(Device& dev, const Batch& batch) {
  run_pre_forward();
  held_ = batch;
  double loss = 0;
  for (std::size_t i = 0; i < ps_.size(); ++i) {
    const Tensor& g = held_.at(fmt::format("g{}", i));  // [B, numel]
    Tensor mean = dev.alloc(dtype_, {ps_[i]->numel()});
    dev.sum_rows(mean, g, false);
    loss += dev.dot(mean, ps_[i]->data) / static_cast<double>(batch.samples);
  }
  run_post_forward();
  return loss;
}

void Synthetic::backward(Device& dev, double loss_scale, std::int64_t ga) {
  run_pre_backward();
  for (std::size_t i = ps_.size(); i-- > 0;) {
    const Tensor& g = held_.at(fmt::format("g{}", i));
    Tensor grad = dev.alloc(dtype_, {ps_[i]->numel()}, "dp");  // [numel]
    dev.sum_rows(grad, g, false);
    dev.div(grad, static_cast<double>(held_.samples));
    dev.scale(grad, loss_scale);
    dev.div(grad, static_cast<double>(ga));
    accumulate_grad(dev, *ps_[i], grad);
  }
  run_post_backward();
}

}  // namespace zc
