// TreeModel: decoding the code, and the node-by-node linear forward and backward (tree.h).
#include "models/tree.h"

#include "engine/errors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace zc {

TreeModel::TreeModel(std::vector<std::int64_t> code, std::string name)
    : Model(std::move(name)), code_(std::move(code)) {
  std::size_t next = 0;
  build(*this, next, 0);
  if (named_parameters().empty()) params().add("weight", {1}, DType::f32);
  finalize_parameters();
  for (Parameter* p : named_parameters()) numels_.push_back(p->numel());
}

void TreeModel::build(Module& node, std::size_t& next, int depth) {
  const std::int64_t v = next < code_.size() ? std::max<std::int64_t>(code_[next], 0) : 0;
  ++next;
  const std::int64_t w = (v / 3) % 16, b = (v / 48) % 8;
  if (w > 0) node.params().add("weight", {w}, DType::f32);
  if (b > 0) node.params().add("bias", {2, b}, DType::f32);
  for (std::int64_t c = 0; c < v % 3 && depth < kMaxDepth && nodes_ < kMaxNodes; ++c) {
    ++nodes_;
    build(node.add_child<TreeNode>(fmt::format("n{}", c)), next, depth + 1);
  }
}

nlohmann::json TreeModel::kind_args() const { return {{"code", code_}}; }

std::string TreeModel::describe() const {
  std::string code;
  for (std::int64_t v : code_) code += (code.empty() ? "" : ",") + std::to_string(v);
  return fmt::format("tree(code [{}]: {} nodes, {} params)", code, nodes_, numels_.size());
}

void TreeModel::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                            Rng& rng) {
  dtype_ = dtype;
  for (Parameter* p : named_parameters()) init_param(dev, *p, dtype, domain, ex, rng, 1.0);
}

HostBatch TreeModel::make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                                const ExactSpec& ex) const {
  HostBatch hb;
  hb.samples = samples;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    HostArray g{{samples, numels_[i]}, {}};
    for (std::int64_t k = 0; k < samples * numels_[i]; ++k) {
      g.values.push_back(
          domain == DataDomain::exact
              ? std::ldexp(static_cast<double>(rng.range(-ex.max_k, ex.max_k) * ex.grad_multiple),
                           -ex.scale_exp)
              : rng.normal());
    }
    hb.arrays.emplace(fmt::format("g{}", i), std::move(g));
  }
  return hb;
}

double TreeModel::node_forward(Device& dev, Module& m) {
  m.run_pre_forward();
  double loss = 0;
  for (const auto& entry : m.params()) {
    const Parameter& p = *m.params().get(entry.first);
    const Tensor& g = held_.at(fmt::format("g{}", p.id));  // [B, numel]
    Tensor mean = dev.alloc(dtype_, {p.numel()}, "g_mean");  // [numel]
    dev.sum_rows(mean, g, false);
    loss += dev.dot(mean, p.data) / static_cast<double>(held_.samples);
  }
  for (const auto& c : m.children()) loss += node_forward(dev, *c);
  m.run_post_forward();
  return loss;
}

double TreeModel::forward(Device& dev, const Batch& batch) {
  held_ = batch;
  return node_forward(dev, *this);
}

// The reverse of the forward: children last to first, then the node's params last to first.
void TreeModel::node_backward(Device& dev, Module& m, double loss_scale, std::int64_t ga) {
  m.run_pre_backward();
  for (auto c = m.children().rbegin(); c != m.children().rend(); ++c) {
    node_backward(dev, **c, loss_scale, ga);
  }
  std::vector<std::string> names;
  for (const auto& entry : m.params()) names.push_back(entry.first);
  for (auto n = names.rbegin(); n != names.rend(); ++n) {
    Parameter& p = *m.params().get(*n);
    const Tensor& g = held_.at(fmt::format("g{}", p.id));
    Tensor grad = dev.alloc(dtype_, {p.numel()}, "dp");  // [numel]
    dev.sum_rows(grad, g, false);
    dev.div(grad, static_cast<double>(held_.samples));
    dev.scale(grad, loss_scale);
    dev.div(grad, static_cast<double>(ga));
    accumulate_grad(dev, p, grad);
  }
  m.run_post_backward();
}

void TreeModel::backward(Device& dev, double loss_scale, std::int64_t ga) {
  node_backward(dev, *this, loss_scale, ga);
}

}  // namespace zc
