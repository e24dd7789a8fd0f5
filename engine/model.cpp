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

Batch upload_batch(Device& dev, const HostBatch& hb, DType dtype) {
  Batch b;
  b.samples = hb.samples;
  for (const auto& [name, a] : hb.arrays) {
    const DType dt = name == "labels" ? DType::f32 : dtype;
    b.tensors.emplace(name, tensor_from_f64(dev, dt, a.shape, a.values, "batch." + name));
  }
  return b;
}

double draw_value(Rng& rng, DataDomain domain, const ExactSpec& ex, double gaussian_scale) {
  if (domain == DataDomain::gaussian) return rng.normal() * gaussian_scale;
  const auto k = static_cast<double>(rng.range(-ex.max_k, ex.max_k));
  return std::ldexp(k, -ex.scale_exp);
}

void Model::init_param(Device& dev, Parameter& p, DType dtype, DataDomain domain,
                       const ExactSpec& ex, Rng& rng, double gaussian_scale) {
  std::vector<double> v(static_cast<std::size_t>(p.numel()));
  for (double& x : v) x = draw_value(rng, domain, ex, gaussian_scale);
  p.dtype = dtype;
  p.data = tensor_from_f64(dev, dtype, p.shape, v, p.name);
}

void Model::accumulate_prescribed_grad(Device& dev, Parameter& p, const Tensor& g, std::int64_t samples,
                                       double loss_scale, std::int64_t ga) {
  Tensor grad = dev.alloc(dtype_, {p.numel()}, "dp");  // [numel]
  dev.sum_rows(grad, g, false);
  dev.div(grad, static_cast<double>(samples));
  dev.scale(grad, loss_scale);
  dev.div(grad, static_cast<double>(ga));
  accumulate_grad(dev, p, grad);
}

}  // namespace zc
