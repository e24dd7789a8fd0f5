// Contrastive model and the GradCache step. Shapes: xq, xk [S, in]; Q, K [S, dim].
#include "models/contrastive.h"

#include "engine/errors.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace zc {

Contrastive::Contrastive(std::int64_t in, std::int64_t dim, LossKind loss, std::string name)
    : Model(std::move(name)), in_(in), dim_(dim), loss_(loss) {
  add_child<Mlp>(MlpSpec{{in, dim}, false, LossKind::linear}, "encoder");
  finalize_parameters();
}

nlohmann::json Contrastive::kind_args() const {
  return {{"in", in_}, {"dim", dim_},
          {"loss", loss_ == LossKind::linear ? "linear" : "cross_entropy"}};
}

std::string Contrastive::describe() const {
  return fmt::format("contrastive({}x{}, {})", in_, dim_, loss_ == LossKind::linear ? "bilinear" : "InfoNCE");
}

void Contrastive::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex, Rng& rng) {
  dtype_ = dtype;
  encoder().init_params(dev, dtype, domain, ex, rng);
}

HostBatch Contrastive::make_batch(Rng& rng, std::int64_t samples, DataDomain domain, const ExactSpec& ex) const {
  HostBatch hb;
  hb.samples = samples;
  for (const char* name : {"xq", "xk"}) {
    HostArray a{{samples, in_}, {}};
    for (std::int64_t i = 0; i < samples * in_; ++i) a.values.push_back(draw_value(rng, domain, ex));
    hb.arrays.emplace(name, std::move(a));
  }
  HostArray s{{samples, dim_}, {}};
  for (std::int64_t i = 0; i < samples; ++i) {
    const double v = domain == DataDomain::exact
                         ? std::ldexp(static_cast<double>(rng.range(-ex.max_k, ex.max_k) * ex.grad_multiple), -ex.scale_exp)
                         : 1.0;
    for (std::int64_t j = 0; j < dim_; ++j) s.values.push_back(v);
  }
  hb.arrays.emplace("s", std::move(s));
  return hb;
}

Tensor Contrastive::encode_pairs(Device& dev, const Batch& b, bool keep) {
  const std::int64_t S = b.samples;
  Tensor x = dev.alloc(dtype_, {2 * S, in_}, "pairs",
                       MemCategory::activations);  // [2S, in]: queries then keys
  dev.copy(x.narrow(0, S * in_), b.at("xq").view({S * in_}));
  dev.copy(x.narrow(S * in_, S * in_), b.at("xk").view({S * in_}));
  return keep ? encoder().forward_features(dev, x) : encoder().encode(dev, x);
}

double Contrastive::rep_grads(Device& dev, const Batch& full, Tensor& gq, Tensor& gk) {
  const std::int64_t S = full.samples;
  const Tensor reps = encode_pairs(dev, full, false);
  const Tensor Q = reps.narrow(0, S * dim_).view({S, dim_}), K = reps.narrow(S * dim_, S * dim_).view({S, dim_});
  gq = dev.alloc(dtype_, {S, dim_}, "dQ", MemCategory::activations);
  gk = dev.alloc(dtype_, {S, dim_}, "dK", MemCategory::activations);
  if (loss_ == LossKind::linear) {  // L = (1/S) sum_i s_i <q_i, k_i>
    const Tensor& s = full.at("s");
    dev.mul(gq, s, K);
    dev.mul(gk, s, Q);
    const double loss = dev.dot(gq, Q) / static_cast<double>(S);
    dev.div(gq, static_cast<double>(S));
    dev.div(gk, static_cast<double>(S));
    return loss;
  }
  // InfoNCE: logits = Q K^T, the positive of q_i is k_i.
  Tensor logits = dev.alloc(DType::f32, {S, S}, "logits", MemCategory::activations);
  dev.matmul(logits, Q, K, false, true, false);
  Tensor dlogits = dev.alloc(DType::f32, {S, S}, "dlogits", MemCategory::activations);
  Tensor rows = dev.alloc(DType::f32, {S}, "row_loss", MemCategory::temporaries);
  std::vector<double> positives(static_cast<std::size_t>(S));  // q_i's positive is k_i
  for (std::int64_t i = 0; i < S; ++i) positives[static_cast<std::size_t>(i)] = static_cast<double>(i);
  const Tensor labels = tensor_from_f64(dev, DType::f32, {S}, positives, "labels");
  dev.softmax_xent(dlogits, rows, logits, labels);
  dev.div(dlogits, static_cast<double>(S));
  dev.matmul(gq, dlogits, K, false, false, false);
  dev.matmul(gk, dlogits, Q, true, false, false);
  Tensor ones = dev.alloc(DType::f32, {S}, "ones", MemCategory::temporaries);
  dev.fill(ones, 1.0);
  return dev.dot(rows, ones) / static_cast<double>(S);
}

double Contrastive::forward(Device& dev, const Batch& batch) {
  run_pre_forward();
  const std::int64_t S = batch.samples;
  const Tensor reps = encode_pairs(dev, batch, true);
  grad_cache_ = dev.alloc(dtype_, {2 * S, dim_}, "grad_cache", MemCategory::activations);
  dev.copy(grad_cache_.narrow(0, S * dim_), batch.at("gq").view({S * dim_}));
  dev.copy(grad_cache_.narrow(S * dim_, S * dim_), batch.at("gk").view({S * dim_}));
  const double surrogate = dev.dot(grad_cache_, reps);
  run_post_forward();
  return surrogate;
}

void Contrastive::backward(Device& dev, double loss_scale, std::int64_t ga) {
  run_pre_backward();
  Tensor dy = dev.alloc(dtype_, grad_cache_.shape(), "drep", MemCategory::activations);
  loss_grad_ = Tensor();  // the loss's node has read its gradient
  dev.copy(dy, grad_cache_);
  dev.scale(dy, loss_scale);
  dev.div(dy, static_cast<double>(ga));
  encoder().backward_from(dev, dy);
  // No post-backward hook: DeepSpeed's fires only through an input that requires grad, and the model's input is data (Note [ZeRO-3's parameter coordinator]).
}

double gradcache_step(Engine& engine, Contrastive& model, Device& dev, const HostBatch& local,
                      int nchunks, DType dtype) {
  if (nchunks < 1 || local.samples % nchunks != 0) {
    throw UsageError(fmt::format("gradcache_step: {} samples do not split into {} chunks", local.samples, nchunks));
  }
  const Batch full = upload_batch(dev, local, dtype);
  Tensor gq, gk;
  const double loss = model.rep_grads(dev, full, gq, gk);
  const std::int64_t chunk = local.samples / nchunks;
  const std::int64_t dim = gq.dim(1);
  for (int c = 0; c < nchunks; ++c) {
    Batch b = upload_batch(dev, local.slice(c * chunk, chunk), dtype);
    b.tensors["gq"] = gq.narrow(c * chunk * dim, chunk * dim).view({chunk, dim});
    b.tensors["gk"] = gk.narrow(c * chunk * dim, chunk * dim).view({chunk, dim});
    // The explicit form (#7665): without it every chunk is at the boundary and DeepSpeed's ZeRO-1/2
    // keep only the last one (Note [Implicit boundary keeps the last backward]).
    engine.set_gradient_accumulation_boundary(c == nchunks - 1);
    engine.backward(engine.forward(b));
  }
  return loss;
}

}  // namespace zc
