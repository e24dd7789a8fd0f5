// SimpleMoE forward and explicit backward. Shapes: x, h, e, y [B, d]; logits [B, X]; l [B].
// Dispatch buffers are [ep, local, C, d] with C = B: token b sits in slot b of its expert's block.
#include "models/moe.h"

#include "engine/errors.h"

#include <nlohmann/json.hpp>

namespace zc {

SimpleMoE::SimpleMoE(MoeSpec spec, Comm& ep, std::string name)
    : Model(std::move(name)), spec_(spec), ep_(ep) {
  if (spec_.num_experts % ep_.size() != 0) {
    throw ConfigError(fmt::format("moe: {} experts do not split over ep_size {}", spec_.num_experts, ep_.size()));
  }
  local_ = spec_.num_experts / ep_.size();
  add_child<Linear>("pre", spec_.dim, spec_.dim);
  add_child<Linear>("gate", spec_.dim, spec_.num_experts);
  for (int k = 0; k < local_; ++k) {
    const int global = ep_.rank() * local_ + k;
    Linear& e = add_child<Linear>(fmt::format("experts.{}", global), spec_.dim, spec_.dim);
    e.weight().is_expert = true;
    e.bias().is_expert = true;
  }
  finalize_parameters();
}

nlohmann::json SimpleMoE::kind_args() const {
  return {{"dim", spec_.dim}, {"num_experts", spec_.num_experts}};
}

std::string SimpleMoE::describe() const {
  return fmt::format("simple_moe(dim {}, {} experts, ep_size {})", spec_.dim, spec_.num_experts, ep_.size());
}

void SimpleMoE::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex, Rng& rng) {
  dtype_ = dtype;
  const double g = 1.0 / std::sqrt(static_cast<double>(spec_.dim));
  Rng pre_rng = rng.split(1), gate_rng = rng.split(2);
  for (Linear* l : {&pre(), &gate()}) {
    Rng& r = l == &pre() ? pre_rng : gate_rng;
    init_param(dev, l->weight(), dtype, domain, ex, r, g);
    init_param(dev, l->bias(), dtype, domain, ex, r, g);
  }
  for (int k = 0; k < local_; ++k) {  // by global expert id: the same values at any ep_size
    Rng r = rng.split(100 + static_cast<std::uint64_t>(ep_.rank() * local_ + k));
    init_param(dev, expert(static_cast<std::size_t>(k)).weight(), dtype, domain, ex, r, g);
    init_param(dev, expert(static_cast<std::size_t>(k)).bias(), dtype, domain, ex, r, g);
  }
}

HostBatch SimpleMoE::make_batch(Rng& rng, std::int64_t samples, DataDomain domain, const ExactSpec& ex) const {
  HostBatch hb;
  hb.samples = samples;
  HostArray x{{samples, spec_.dim}, {}}, c{{samples, spec_.dim}, {}};
  for (std::int64_t i = 0; i < samples * spec_.dim; ++i) {
    x.values.push_back(draw_value(rng, domain, ex));
    c.values.push_back(domain == DataDomain::exact
                           ? std::ldexp(static_cast<double>(rng.range(-ex.max_k, ex.max_k) * ex.grad_multiple), -ex.scale_exp)
                           : rng.normal());
  }
  hb.arrays.emplace("x", std::move(x));
  hb.arrays.emplace("c", std::move(c));
  return hb;
}

std::vector<Tensor> SimpleMoE::dispatch(Device& dev, const Tensor& rows) {
  const std::int64_t C = batch_, d = spec_.dim, E = ep_.size(), L = local_;
  Tensor send = dev.alloc(dtype_, {E * L * C * d}, "moe_dispatch_send",
                          MemCategory::activations);  // [E, L, C, d]
  for (std::int64_t b = 0; b < C; ++b) {
    const std::int64_t slot = (route_[static_cast<std::size_t>(b)] * C + b) * d;  // route = dst*L + k
    dev.copy(send.narrow(slot, d), rows.narrow(b * d, d));
  }
  Tensor recv = dev.alloc(dtype_, {E * L * C * d}, "moe_dispatch_recv",
                          MemCategory::activations);  // [src, L, C, d]
  ep_.all_to_all(recv, send);
  std::vector<Tensor> per_expert;
  for (std::int64_t k = 0; k < L; ++k) {
    Tensor in = dev.alloc(dtype_, {E * C, d}, "moe_expert_in",
                          MemCategory::activations);  // [src * C, d]
    for (std::int64_t src = 0; src < E; ++src) {
      dev.copy(in.narrow(src * C * d, C * d), recv.narrow(((src * L + k) * C) * d, C * d));
    }
    per_expert.push_back(in);
  }
  return per_expert;
}

Tensor SimpleMoE::combine(Device& dev, const std::vector<Tensor>& per_expert) {
  const std::int64_t C = batch_, d = spec_.dim, E = ep_.size(), L = local_;
  Tensor send = dev.alloc(dtype_, {E * L * C * d}, "moe_combine_send",
                          MemCategory::activations);  // [src, L, C, d]
  for (std::int64_t k = 0; k < L; ++k) {
    for (std::int64_t src = 0; src < E; ++src) {
      dev.copy(send.narrow(((src * L + k) * C) * d, C * d), per_expert[static_cast<std::size_t>(k)].view({E * C * d}).narrow(src * C * d, C * d));
    }
  }
  Tensor recv = dev.alloc(dtype_, {E * L * C * d}, "moe_combine_recv",
                          MemCategory::activations);  // [dst, L, C, d]
  ep_.all_to_all(recv, send);
  Tensor out = dev.alloc(dtype_, {C, d}, "moe_out", MemCategory::activations);
  for (std::int64_t b = 0; b < C; ++b) {
    dev.copy(out.narrow(b * d, d), recv.narrow((route_[static_cast<std::size_t>(b)] * C + b) * d, d));
  }
  return out;
}

double SimpleMoE::forward(Device& dev, const Batch& batch) {
  run_pre_forward();
  x_ = batch.at("x");
  coeff_ = batch.at("c");
  batch_ = batch.samples;
  const std::int64_t B = batch_, d = spec_.dim, X = spec_.num_experts;
  h_ = dev.alloc(dtype_, {B, d}, "moe_h", MemCategory::activations);
  dev.matmul(h_, x_, pre().weight().data, false, true, false);
  dev.add_row_vector(h_, pre().bias().data);
  logits_ = dev.alloc(dtype_, {B, X}, "gate_logits", MemCategory::activations);
  dev.matmul(logits_, h_, gate().weight().data, false, true, false);
  dev.add_row_vector(logits_, gate().bias().data);
  route_ = dev.argmax_rows(logits_);
  l_ = dev.alloc(dtype_, {B}, "gate_value", MemCategory::activations);
  for (std::int64_t b = 0; b < B; ++b) dev.copy(l_.narrow(b, 1), logits_.narrow(b * X + route_[static_cast<std::size_t>(b)], 1));
  expert_in_ = dispatch(dev, h_);
  std::vector<Tensor> outs;
  for (int k = 0; k < local_; ++k) {
    Linear& e = expert(static_cast<std::size_t>(k));
    Tensor y = dev.alloc(dtype_, {ep_.size() * B, d}, "expert_out", MemCategory::activations);
    dev.matmul(y, expert_in_[static_cast<std::size_t>(k)], e.weight().data, false, true, false);
    dev.add_row_vector(y, e.bias().data);
    outs.push_back(y);
  }
  e_ = combine(dev, outs);
  Tensor y = dev.alloc(dtype_, {B, d}, "moe_y", MemCategory::activations);
  dev.scale_rows(y, e_, l_);
  const double loss = dev.dot(coeff_, y) / static_cast<double>(B);
  run_post_forward();
  return loss;
}

void SimpleMoE::backward(Device& dev, double loss_scale, std::int64_t ga) {
  run_pre_backward();
  const std::int64_t B = batch_, d = spec_.dim, X = spec_.num_experts;
  Tensor dy = dev.alloc(dtype_, {B, d}, "moe_dy", MemCategory::activations);
  loss_grad_ = Tensor();  // the loss's node has read its gradient
  dev.copy(dy, coeff_);
  dev.div(dy, static_cast<double>(B));
  dev.scale(dy, loss_scale);
  dev.div(dy, static_cast<double>(ga));
  Tensor de = dev.alloc(dtype_, {B, d}, "moe_de", MemCategory::activations);  // d(l e)/de = l
  dev.scale_rows(de, dy, l_);
  Tensor dl = dev.alloc(dtype_, {B}, "moe_dl", MemCategory::activations);  // d(l e)/dl = e
  dev.row_dot(dl, dy, e_);
  Tensor dlogits = dev.alloc(dtype_, {B, X}, "dlogits", MemCategory::activations);
  for (std::int64_t b = 0; b < B; ++b) dev.copy(dlogits.narrow(b * X + route_[static_cast<std::size_t>(b)], 1), dl.narrow(b, 1));
  // Experts: dY arrives where their inputs came from.
  const std::vector<Tensor> dys = dispatch(dev, de);
  std::vector<Tensor> dxs;
  for (int k = local_ - 1; k >= 0; --k) {
    Linear& e = expert(static_cast<std::size_t>(k));
    e.run_pre_backward();
    const Tensor& dY = dys[static_cast<std::size_t>(k)];
    Tensor dw = dev.alloc(dtype_, e.weight().shape, "dW", MemCategory::temporaries);
    dev.matmul(dw, dY, expert_in_[static_cast<std::size_t>(k)], true, false, false);
    Tensor db = dev.alloc(dtype_, e.bias().shape, "db", MemCategory::temporaries);
    dev.sum_rows(db, dY, false);
    accumulate_grad(dev, e.weight(), dw);
    accumulate_grad(dev, e.bias(), db);
    e.run_post_backward();
  }
  for (int k = 0; k < local_; ++k) {
    Tensor dx = dev.alloc(dtype_, {ep_.size() * B, d}, "expert_dx", MemCategory::activations);
    dev.matmul(dx, dys[static_cast<std::size_t>(k)], expert(static_cast<std::size_t>(k)).weight().data,
               false, false, false);
    dxs.push_back(dx);
  }
  Tensor dh = combine(dev, dxs);
  // Gate: logits = h Wg^T + bg.
  Tensor dwg = dev.alloc(dtype_, gate().weight().shape, "dWg", MemCategory::temporaries);
  dev.matmul(dwg, dlogits, h_, true, false, false);
  Tensor dbg = dev.alloc(dtype_, gate().bias().shape, "dbg", MemCategory::temporaries);
  dev.sum_rows(dbg, dlogits, false);
  dev.matmul(dh, dlogits, gate().weight().data, false, false, true);
  accumulate_grad(dev, gate().weight(), dwg);
  accumulate_grad(dev, gate().bias(), dbg);
  // Pre: h = x Wp^T + bp.
  Tensor dwp = dev.alloc(dtype_, pre().weight().shape, "dWp", MemCategory::temporaries);
  dev.matmul(dwp, dh, x_, true, false, false);
  Tensor dbp = dev.alloc(dtype_, pre().bias().shape, "dbp", MemCategory::temporaries);
  dev.sum_rows(dbp, dh, false);
  accumulate_grad(dev, pre().weight(), dwp);
  accumulate_grad(dev, pre().bias(), dbp);
  // No post-backward hook: DeepSpeed's fires only through an input that requires grad, and the model's input is data (Note [ZeRO-3's parameter coordinator]).
}

}  // namespace zc
