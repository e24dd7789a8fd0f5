// Synthetic model: prescribed gradients, fired in reverse registration order like a real backward.
#include "models/synthetic.h"

#include "engine/errors.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace zc {

Synthetic::Synthetic(std::vector<Shape> shapes, std::string name)
    : Model(std::move(name)), shapes_(std::move(shapes)) {
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    params().add(fmt::format("p{}", i), shapes_[i], DType::f32);
  }
  finalize_parameters();
}

nlohmann::json Synthetic::kind_args() const { return {{"shapes", shapes_}}; }

Parameter& Synthetic::param(std::size_t i) {
  Parameter* p = params().get(fmt::format("p{}", i));
  ZC_ASSERT(p != nullptr, "synthetic param p{} is missing", i);
  return *p;
}

std::string Synthetic::describe() const {
  std::string s;
  for (const Shape& sh : shapes_) s += (s.empty() ? "" : ",") + shape_str(sh);
  return fmt::format("synthetic({})", s);
}

void Synthetic::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex, Rng& rng) {
  dtype_ = dtype;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    init_param(dev, param(i), dtype, domain, ex, rng, 1.0);
  }
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

HostBatch Synthetic::batch_shapes(std::int64_t samples) const {
  HostBatch hb;
  hb.samples = samples;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    hb.arrays.emplace(fmt::format("g{}", i), HostArray{{samples, shape_numel(shapes_[i])}, {}});
  }
  return hb;
}

// Note [Synthetic's memory, as autograd keeps it]
// The twin's forward (reference/deepspeed/twin.py SyntheticTwin: per param, mean = g.sum(0) / B,
// then (p * mean).sum()) allocates the column sum (freed once divided), the mean (which the
// product saves for p's gradient: an activation until that gradient is made), and the product
// (freed once summed). The engine allocates the same buffers for the same spans; its backward
// still computes each gradient from the held batch, in the order whose bits DeepSpeed's match,
// and hands it to the param as AccumulateGrad does, freeing that param's mean after it.
double Synthetic::forward(Device& dev, const Batch& batch) {
  run_pre_forward();
  held_ = batch;
  means_.assign(shapes_.size(), Tensor());
  double loss = 0;
  // The twin's 0-dim tensors: each term (p * mean).sum(), held until the next one replaces it, and
  // the running loss (the first term, then loss + term); the engine's loss tensor follows.
  Tensor running, term;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    const Tensor& g = held_.at(fmt::format("g{}", i));  // [B, numel]
    const Parameter& p = param(i);
    Tensor mean = dev.alloc(dtype_, {p.numel()}, "g_mean", MemCategory::activations);
    {
      Tensor sum = dev.alloc(dtype_, {p.numel()}, "g_sum", MemCategory::temporaries);
      dev.sum_rows(sum, g, false);
      dev.copy(mean, sum);
    }
    loss += dev.dot(mean, p.data) / static_cast<double>(batch.samples);
    dev.div(mean, static_cast<double>(batch.samples));
    {
      Tensor prod = dev.alloc(dtype_, {p.numel()}, "p_times_mean", MemCategory::temporaries);
      dev.mul(prod, p.data.view({p.numel()}), mean);
      // before prod is freed
      Tensor sum = dev.alloc(dtype_, {1}, "loss.term", MemCategory::temporaries);
      prod = Tensor();
      term = sum;
    }
    running = running.defined() ? dev.alloc(dtype_, {1}, "loss", MemCategory::temporaries) : term;
    means_[i] = mean;
  }
  run_post_forward();
  return loss;
}

void Synthetic::backward(Device& dev, double loss_scale, std::int64_t ga) {
  run_pre_backward();
  for (std::size_t i = shapes_.size(); i-- > 0;) {
    const Tensor& g = held_.at(fmt::format("g{}", i));
    Parameter& p = param(i);
    // The loss is the terms' sum: each term's node reads its gradient, the first term's last.
    accumulate_prescribed_grad(dev, p, g, held_.samples, loss_scale, ga,
                               /*last_loss_reader=*/i == 0);
    if (i < means_.size()) means_[i] = Tensor();  // its MulBackward has run
  }
  held_ = Batch{};  // the graph is freed: the batch is the caller's alone (freed after the backward)
  // No post-backward hook: DeepSpeed's fires only through an input that requires grad, and the model's input is data (Note [ZeRO-3's parameter coordinator]).
}

}  // namespace zc
