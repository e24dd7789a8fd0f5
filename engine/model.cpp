// Model data plumbing: host batches, upload, domain values.
#include "engine/model.h"

#include "engine/errors.h"

#include <cmath>

namespace zc {

std::string_view data_domain_name(DataDomain d) {
  return d == DataDomain::exact ? "exact" : "gaussian";
}

HostBatch HostBatch::slice(std::int64_t begin, std::int64_t count) const {
  ZC_ASSERT(begin >= 0 && count >= 0 && begin + count <= samples, "slice [{}, +{}) of {} samples",
            begin, count, samples);
  HostBatch out;
  out.samples = count;
  for (const auto& [name, a] : arrays) {
    const std::int64_t row = a.shape.size() <= 1 ? 1 : shape_numel(a.shape) / a.shape[0];
    HostArray s;
    s.shape = a.shape;
    s.shape[0] = count;
    s.values.assign(a.values.begin() + begin * row, a.values.begin() + (begin + count) * row);
    out.arrays.emplace(name, std::move(s));
  }
  return out;
}

const Tensor& Batch::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw UsageError(fmt::format("batch has no '{}' tensor", name));
  return it->second;
}

DType batch_array_dtype(const std::string& name, DType model_dtype) {
  return name == "labels" || name == "ids" ? DType::f64 : model_dtype;
}

Batch upload_batch(Device& dev, const HostBatch& hb, DType dtype) {
  Batch b;
  b.samples = hb.samples;
  const bool meta = dev.placement() == Placement::meta;
  for (const auto& [name, a] : hb.arrays) {
    const DType dt = batch_array_dtype(name, dtype);
    if (meta) {  // Note [Meta mode]: shapes only, whatever values the array holds
      b.tensors.emplace(name, dev.alloc(dt, a.shape, "batch." + name, MemCategory::activations));
      continue;
    }
    if (a.values.empty() && shape_numel(a.shape) > 0) {
      throw UsageError(fmt::format("batch array '{}' {} has no values (a meta batch): upload it to "
                                   "a meta device, or draw it with make_batch",
                                   name, shape_str(a.shape)));
    }
    b.tensors.emplace(name, tensor_from_f64(dev, dt, a.shape, a.values, "batch." + name,
                                            MemCategory::activations));
  }
  return b;
}

HostBatch Model::batch_shapes(std::int64_t) const {
  throw NotImplementedError(fmt::format(
      "model '{}' ({}) has no meta batch: meta mode (zerocheck plan) runs the transformer "
      "presets, Synthetic, MLP and module trees", name(), kind()));
}

double draw_value(Rng& rng, DataDomain domain, const ExactSpec& ex, double gaussian_scale) {
  if (domain == DataDomain::gaussian) return rng.normal() * gaussian_scale;
  const auto k = static_cast<double>(rng.range(-ex.max_k, ex.max_k));
  return std::ldexp(k, -ex.scale_exp);
}

void Model::init_param(Device& dev, Parameter& p, DType dtype, DataDomain domain,
                       const ExactSpec& ex, Rng& rng, double gaussian_scale) {
  p.dtype = dtype;
  if (dev.placement() == Placement::meta) {  // Note [Meta mode]: no values drawn or held
    p.data = dev.alloc(dtype, p.shape, p.name, MemCategory::params);
    return;
  }
  std::vector<double> v(static_cast<std::size_t>(p.numel()));
  for (double& x : v) x = draw_value(rng, domain, ex, gaussian_scale);
  p.data = tensor_from_f64(dev, dtype, p.shape, v, p.name, MemCategory::params);
}

void Model::accumulate_prescribed_grad(Device& dev, Parameter& p, const Tensor& g, std::int64_t samples,
                                       double loss_scale, std::int64_t ga, bool last_loss_reader) {
  // grads from its allocation: autograd hands it to AccumulateGrad (kept as .grad or added into
  // one), as the MLP's dW (Note [The MLP's activations, as autograd keeps them]).
  Tensor grad = dev.alloc(dtype_, {p.numel()}, "dp", MemCategory::grads);  // [numel]
  if (last_loss_reader) loss_grad_ = Tensor();
  dev.sum_rows(grad, g, false);
  dev.div(grad, static_cast<double>(samples));
  dev.scale(grad, loss_scale);
  dev.div(grad, static_cast<double>(ga));
  accumulate_grad(dev, p, std::move(grad));  // taken as .grad when p has none (AccumulateGrad)
}

// Note [Which autograd node hands a Linear its grads]
// The order of a Linear's weight and bias hooks decides where DeepSpeed's ipg buckets close
// (ZeRO-1/2 reduce a bucket when the next grad does not fit), so the engine fires them in
// DeepSpeed's order, which depends on the autograd node that computes them:
// - torch.nn.functional.linear (ZeRO-0/1/2): aten::linear runs addmm(bias, x, weight.t()) (a
//   3-d input flattened first). AddmmBackward hands the bias its grad directly and the weight's
//   goes through t()'s backward; torch's ready queue runs AccumulateGrad nodes ahead of any
//   other, so the bias's hook fires first. DeepSpeed's run shows it: gpt2-tiny's first ZeRO-1
//   bucket is the final norm's two params and the last projection's bias (192 B), then that
//   projection's weight alone (4,096 B).
// - Under ZeRO-3, zero.Init replaces torch.nn.functional.linear with zero3_linear_wrap
//   (runtime/zero/partition_parameters.py:412 _enable_mem_efficient_linear, while
//   `memory_efficient_linear` is true, its default): LinearFunctionForZeroStage3's backward
//   (runtime/zero/linear.py) returns the input's, the weight's and the bias's grads from one
//   node, and the weight's hook fires first. DeepSpeed's run shows it: the MLP [3,4,2] at ZeRO-3
//   with 4-element buckets peaks at 116 B of grads, as the engine does weight first; bias first
//   it reached 148.
// Both allocate the grads before either hook runs (the input's, the weight's, then the bias's).
void Model::accumulate_linear_grads(Device& dev, Parameter& weight, Tensor dw, Parameter* bias,
                                    Tensor db) {
  if (bias != nullptr && !zero3_linear_) accumulate_grad(dev, *bias, std::move(db));
  accumulate_grad(dev, weight, std::move(dw));
  if (bias != nullptr && zero3_linear_) accumulate_grad(dev, *bias, std::move(db));
}

}  // namespace zc
