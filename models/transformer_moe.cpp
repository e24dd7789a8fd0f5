// The Mixtral-style MoE block of transformer.h (Note [MoE routing]): router, top-2 gate with
// DeepSpeed's capacity, dispatch by all_to_all in DeepSpeed's [E, C, d] layout, SwiGLU experts,
// combine, and the explicit backward of all of it. Shapes: N local tokens, E experts, k = 2, C
// slots per expert, L = E / ep local experts, d model width, f expert width.
#include "engine/errors.h"
#include "models/params.h"
#include "models/transformer.h"

namespace zc {

namespace {

using model_params::act;
using model_params::data_of;
using model_params::param_of;

std::string expert_param(int e, const char* w) { return fmt::format("expert{}_{}", e, w); }

}  // namespace

void Transformer::moe_slot_tables(Device& dev, BlockActs& a, const MoeRoute& r) {
  const std::int64_t slots = r.experts * r.capacity;
  if (dev.placement() == Placement::meta) {  // Note [Meta mode]: the tables' memory, no values
    a.slot_token = act(dev, DType::f32, {slots}, "moe_slot_token");
    a.slot_choice = act(dev, DType::f32, {slots}, "moe_slot_choice");
    return;
  }
  std::vector<double> token(static_cast<std::size_t>(slots), -1.0), choice = token;
  for (std::size_t i = 0; i < r.expert.size(); ++i) {
    if (r.expert[i] < 0) continue;
    const auto at = static_cast<std::size_t>(r.expert[i] * r.capacity + r.slot[i]);
    token[at] = static_cast<double>(static_cast<std::int64_t>(i) / r.k);
    choice[at] = static_cast<double>(i);
  }
  a.slot_token = tensor_from_f64(dev, DType::f32, {slots}, token, "moe_slot_token",
                                 MemCategory::activations);
  a.slot_choice = tensor_from_f64(dev, DType::f32, {slots}, choice, "moe_slot_choice",
                                  MemCategory::activations);
}

// [E*C, d] = [ep, L, C, d]: block j goes to expert-parallel rank j, which receives it as block
// (this rank) of [src, L, C, d]. The same call brings the experts' results back.
Tensor Transformer::moe_exchange(Device& dev, const Tensor& t, const char* label) {
  if (ep_ == nullptr || ep_->size() == 1) return t;
  Tensor out = act(dev, dtype_, t.shape(), label);
  ep_->all_to_all(out.view({out.numel()}), t.view({t.numel()}));
  return out;
}

Tensor Transformer::moe_forward(Device& dev, Module& blk, BlockActs& a) {
  const std::int64_t N = a.h2.dim(0), d = spec_.dim, f = spec_.ffn, E = spec_.experts;
  const std::int64_t k = spec_.top_k, C = spec_.capacity(N), L = local_experts(), P = ep_size();
  const int first = (ep_ == nullptr ? 0 : ep_->rank()) * static_cast<int>(L);
  Tensor logits = act(dev, dtype_, {N, E}, "moe_router_logits");
  dev.matmul(logits, a.h2, data_of(blk, "router"), false, true, false);
  a.probs = act(dev, dtype_, {N, E}, "moe_probs");
  a.weights = act(dev, dtype_, {N, k}, "moe_weights");
  a.index = act(dev, DType::f32, {N, k}, "moe_index");
  const MoeRoute route = dev.moe_gate(a.weights, a.index, a.probs, logits, C);
  logits = Tensor();
  moe_slot_tables(dev, a, route);
  a.slot_w = act(dev, dtype_, {E * C, 1}, "moe_slot_weight");
  dev.gather_rows(a.slot_w, a.weights.view({N * k, 1}), a.slot_choice);
  Tensor send = act(dev, dtype_, {E * C, d}, "moe_dispatch");
  dev.gather_rows(send, a.h2, a.slot_token);
  const Tensor recv = moe_exchange(dev, send, "moe_dispatch_recv");  // [src, L, C, d]
  send = Tensor();
  Tensor back = act(dev, dtype_, {E * C, d}, "moe_expert_out");  // [src, L, C, d]
  a.ein.assign(static_cast<std::size_t>(L), Tensor());
  a.eg = a.es = a.eu = a.ea = a.ein;
  for (std::int64_t i = 0; i < L; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const int e = first + static_cast<int>(i);
    a.ein[u] = act(dev, dtype_, {P * C, d}, "moe_expert_in");
    dev.copy_2d(a.ein[u], recv.view({recv.numel()}).narrow(i * C * d, recv.numel() - i * C * d), P,
                C * d, C * d, L * C * d);
    // Mixtral's expert MLP as Hugging Face writes it: w2(silu(w1 x) * w3 x), silu then the product
    // (Note [Hugging Face's saved tensors]).
    a.eg[u] = act(dev, dtype_, {P * C, f}, "moe_expert_gate");
    dev.matmul(a.eg[u], a.ein[u], data_of(blk, expert_param(e, "w_gate").c_str()), false, true, false);
    a.es[u] = act(dev, dtype_, {P * C, f}, "moe_expert_silu");
    dev.unary(a.es[u], a.eg[u], Unary::silu);
    if (!grad_) a.eg[u] = Tensor();  // without grad (a checkpointed layer) each goes after its last use
    a.eu[u] = act(dev, dtype_, {P * C, f}, "moe_expert_up");
    dev.matmul(a.eu[u], a.ein[u], data_of(blk, expert_param(e, "w_up").c_str()), false, true, false);
    a.ea[u] = act(dev, dtype_, {P * C, f}, "moe_expert_act");
    dev.mul(a.ea[u], a.es[u], a.eu[u]);
    if (!grad_) a.es[u] = a.eu[u] = Tensor();
    Tensor y = act(dev, dtype_, {P * C, d}, "moe_expert_y");
    dev.matmul(y, a.ea[u], data_of(blk, expert_param(e, "w_down").c_str()), false, true, false);
    if (!grad_) a.ea[u] = a.ein[u] = Tensor();
    dev.copy_2d(back.view({back.numel()}).narrow(i * C * d, back.numel() - i * C * d), y, P, C * d,
                L * C * d, C * d);
  }
  a.y_slots = moe_exchange(dev, back, "moe_combine_recv");  // [E, C, d], this rank's tokens
  back = Tensor();
  Tensor ys = act(dev, dtype_, {E * C, d}, "moe_weighted");
  dev.scale_rows(ys, a.y_slots, a.slot_w);
  Tensor out = act(dev, dtype_, {N, d}, "mlp_out");
  dev.fill(out, 0.0);
  dev.index_add_rows(out, ys, a.slot_token);
  return out;
}

Tensor Transformer::moe_backward(Device& dev, Module& blk, BlockActs& a, const Tensor& dm) {
  const std::int64_t N = dm.dim(0), d = spec_.dim, E = spec_.experts, k = spec_.top_k;
  const std::int64_t C = a.slot_token.numel() / E, L = local_experts(), P = ep_size();
  const int first = (ep_ == nullptr ? 0 : ep_->rank()) * static_cast<int>(L);
  // out[n] = sum over n's slots of slot_w * y: the slots' grads, and the weights'.
  Tensor dys = act(dev, dtype_, {E * C, d}, "moe_dys");
  dev.gather_rows(dys, dm, a.slot_token);
  Tensor dslot_w = act(dev, dtype_, {E * C, 1}, "moe_dslot_weight");
  dev.row_dot(dslot_w, dys, a.y_slots);
  Tensor dweights = act(dev, dtype_, {N, k}, "moe_dweights");
  dev.fill(dweights, 0.0);
  dev.index_add_rows(dweights.view({N * k, 1}), dslot_w, a.slot_choice);
  dslot_w = Tensor();
  Tensor dy = act(dev, dtype_, {E * C, d}, "moe_dy");
  dev.scale_rows(dy, dys, a.slot_w);
  dys = Tensor();
  const Tensor drecv = moe_exchange(dev, dy, "moe_dy_recv");  // [src, L, C, d]
  dy = Tensor();
  Tensor dback = act(dev, dtype_, {E * C, d}, "moe_dexpert_in");  // [src, L, C, d]
  for (std::int64_t i = L; i-- > 0;) {
    const auto u = static_cast<std::size_t>(i);
    const int e = first + static_cast<int>(i);
    Tensor dY = act(dev, dtype_, {P * C, d}, "moe_expert_dy");
    dev.copy_2d(dY, drecv.view({drecv.numel()}).narrow(i * C * d, drecv.numel() - i * C * d), P,
                C * d, C * d, L * C * d);
    const std::string wd = expert_param(e, "w_down"), wg = expert_param(e, "w_gate");
    const std::string wu = expert_param(e, "w_up");
    Tensor da = linear_backward(dev, blk, wd.c_str(), nullptr, dY, a.ea[u], true);
    Tensor dg = act(dev, dtype_, a.eg[u].shape(), "moe_expert_dgate");
    Tensor du = act(dev, dtype_, a.eu[u].shape(), "moe_expert_dup");
    dev.mul(dg, da, a.eu[u]);  // d silu(g)
    dev.mul(du, da, a.es[u]);
    da = Tensor();
    dev.unary_backward(dg, dg, a.eg[u], Unary::silu);
    Tensor din = linear_backward(dev, blk, wg.c_str(), nullptr, dg, a.ein[u], true);
    Tensor din_up = linear_backward(dev, blk, wu.c_str(), nullptr, du, a.ein[u], true);
    dev.add(din, din, din_up);
    dev.copy_2d(dback.view({dback.numel()}).narrow(i * C * d, dback.numel() - i * C * d), din, P,
                C * d, L * C * d, C * d);
    a.ein[u] = a.eg[u] = a.es[u] = a.eu[u] = a.ea[u] = Tensor();
  }
  const Tensor dslots = moe_exchange(dev, dback, "moe_dslots");  // [E, C, d], this rank's tokens
  dback = Tensor();
  Tensor dh2 = act(dev, dtype_, {N, d}, "moe_dh2");
  dev.fill(dh2, 0.0);
  dev.index_add_rows(dh2, dslots, a.slot_token);
  // The router: logits = h2 Wr^T.
  Tensor dlogits = act(dev, dtype_, {N, E}, "moe_dlogits");
  dev.moe_gate_backward(dlogits, dweights, a.probs, a.weights, a.index);
  Parameter& wr = param_of(blk, "router");
  Tensor dwr = model_params::grad_buf(dev, dtype_, wr.shape, "dW");
  dev.matmul(dwr, dlogits, a.h2, true, false, false);
  dev.matmul(dh2, dlogits, wr.data, false, false, true);
  accumulate_grad(dev, wr, std::move(dwr));
  return dh2;
}

}  // namespace zc
