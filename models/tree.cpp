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
  for (const auto& entry : node.params()) built_.emplace_back(node.path(), entry.first);
  add_external_use(node, (v / 384) % 8);
  add_alias(node, (v / 3072) % 8);
  for (std::int64_t c = 0; c < v % 3 && depth < kMaxDepth && nodes_ < kMaxNodes; ++c) {
    ++nodes_;
    build(node.add_child<TreeNode>(fmt::format("n{}", c)), next, depth + 1);
  }
}

// Note [Tree external params]
// u = (v / 384) % 8 > 0 makes a node read, in its forward and through the owner's ParamDict::get,
// a param of an earlier node in preorder that is not its ancestor: u picks the ((u - 1) / 2)-th
// latest such param (cyclically), and an even u also declares the use with
// Engine::register_external_parameter (registered_external_uses()); an odd u leaves ZeRO-3 to
// discover it in the getter's eager-forward path. Ancestors are excluded because their params
// are gathered for the whole of their forward: the getter would not gather (nor register) one,
// so these uses would exercise nothing; tied uses of ancestors' params are aliases (Note [Tree
// aliases]), which ZeRO-3's active-user counts keep gathered.
// The read checks that the value is there and does not enter the loss, so the prescribed
// gradients (and prescribed_grad_oracle) are the same with or without external uses.
void TreeModel::add_external_use(Module& node, std::int64_t u) {
  if (u <= 0) return;
  const std::string me = node.path();
  std::vector<std::size_t> candidates;  // indices into built_, earlier nodes only
  for (std::size_t i = 0; i < built_.size(); ++i) {
    const std::string& owner = built_[i].first;
    const bool ancestor_or_self = owner.empty() || owner == me || me.starts_with(owner + ".");
    if (!ancestor_or_self) candidates.push_back(i);
  }
  if (candidates.empty()) return;
  const auto pick = static_cast<std::size_t>((u - 1) / 2) % candidates.size();
  const auto& [owner, local] = built_[candidates[candidates.size() - 1 - pick]];
  uses_.push_back({me, owner, local, u % 2 == 0});
}

// Note [Tree aliases]
// a = (v / 3072) % 8 > 0 registers in the node's ParamDict an alias "tied" of the (a - 1)-th
// latest param (cyclically) of an earlier node in preorder, the node's ancestors included: a tied
// weight (Note [Shared params]). The loss stays prescribed per param (L above): a param's
// gradient is its own g however many modules alias it, so the owner accumulates it once, the
// grad-ready hook fires once per param, and prescribed_grad_oracle needs no change. The aliasing
// node reads the value through its own ParamDict in its forward, so ZeRO-3 gathers and releases
// it in that node's hooks; an owner (or alias user) checks after its children ran, and before
// its backward accumulates, that its tied params are still gathered: a descendant's release must
// not free a param its ancestor still uses (ZeRO-3 counts active users).
void TreeModel::add_alias(Module& node, std::int64_t a) {
  if (a <= 0) return;
  const std::string me = node.path();
  std::vector<std::size_t> candidates;  // indices into built_, other nodes only
  for (std::size_t i = 0; i < built_.size(); ++i) {
    if (built_[i].first != me) candidates.push_back(i);
  }
  if (candidates.empty()) return;
  const auto pick = static_cast<std::size_t>(a - 1) % candidates.size();
  const auto& [owner_path, local] = built_[candidates[candidates.size() - 1 - pick]];
  Module& owner = module_at(owner_path);
  Parameter* p = owner.params().get(local);
  ZC_ASSERT(p != nullptr, "tree alias of missing param {}.{}", owner_path, local);
  node.params().add_alias("tied", *p, owner);
  tied_.emplace_back(owner_path, local);
}

// The aliased params m owns or aliases are gathered: their data is there.
void TreeModel::check_tied_gathered(const Module& m, std::string_view when) const {
  const std::string me = m.path();
  auto check = [&](const Parameter& p, const std::string& user) {
    if (p.has_zero_status() && (p.ds_status != ZeroStatus::available || !p.data.defined())) {
      throw UsageError(fmt::format("tied param '{}' is {} {} of module '{}', which still uses it: "
                                   "a release by another of its users freed it (count the "
                                   "active users of a shared param)", p.name,
                                   zero_status_name(p.ds_status), when, user));
    }
  };
  for (const auto& [owner, local] : tied_) {
    if (owner != me) continue;
    for (const auto& [name, p] : m.params()) {
      if (name == local) check(*p, me);
    }
  }
  for (const ParamDict::Alias& a : m.params().aliases()) check(*a.param, me);
}

// m's aliases, read through m's own ParamDict while m is the innermost module in forward.
void TreeModel::read_aliases(Device& dev, Module& m) {
  for (const ParamDict::Alias& a : m.params().aliases()) {
    ExternalRead r{"", m.path(), a.param->ds_status, {}, dev.live_bytes(), 0, 0};
    const Parameter* p = m.params().get(a.local);
    ZC_ASSERT(p == a.param, "alias '{}' of module '{}' resolves elsewhere", a.local, m.path());
    r.param = p->name;
    r.status_read = p->ds_status;
    r.live_read = dev.live_bytes();
    if (!p->data.defined() || p->data.numel() != p->numel()) {
      throw UsageError(fmt::format("module '{}' read its tied param '{}' in its forward but it "
                                   "has no data (ds_status {}): gather aliases in the aliasing "
                                   "module's hooks", m.path(), p->name,
                                   zero_status_name(p->ds_status)));
    }
    alias_reads_.push_back(std::move(r));
  }
}

Module& TreeModel::module_at(const std::string& path) {
  Module* m = this;
  std::size_t start = 0;
  while (start < path.size()) {
    const std::size_t dot = std::min(path.find('.', start), path.size());
    const std::string_view part = std::string_view(path).substr(start, dot - start);
    Module* next = nullptr;
    for (const auto& c : m->children()) {
      if (c->name() == part) next = c.get();
    }
    ZC_ASSERT(next != nullptr, "tree '{}' has no module '{}'", name(), path);
    m = next;
    start = dot + 1;
  }
  return *m;
}

std::vector<std::pair<Module*, Parameter*>> TreeModel::registered_external_uses() {
  std::vector<std::pair<Module*, Parameter*>> out;
  for (const ExternalUse& u : uses_) {
    if (!u.registered) continue;
    Parameter* p = module_at(u.owner).params().get(u.local);
    ZC_ASSERT(p != nullptr, "tree external use of missing param {}.{}", u.owner, u.local);
    out.emplace_back(&module_at(u.user), p);
  }
  return out;
}

// m's uses of other nodes' params, while m is the innermost module in forward.
void TreeModel::read_external(Device& dev, Module& m) {
  const std::string me = m.path();
  for (const ExternalUse& u : uses_) {
    if (u.user != me) continue;
    ParamDict& dict = module_at(u.owner).params();
    ExternalRead r{"", me, {}, {}, dev.live_bytes(), 0, 0};
    for (const auto& [local, p] : dict) {
      if (local == u.local) r.status_before = p->ds_status;  // the raw field, not the getter
    }
    const Parameter* p = dict.get(u.local);
    ZC_ASSERT(p != nullptr, "tree external use of missing param {}.{}", u.owner, u.local);
    r.param = p->name;
    r.status_read = p->ds_status;
    r.live_read = dev.live_bytes();
    if (!p->data.defined() || p->data.numel() != p->numel()) {
      throw UsageError(fmt::format("module '{}' read external param '{}' in its forward but it "
                                   "has no data (ds_status {}): read it through its owner's "
                                   "ParamDict::get, or register it with "
                                   "register_external_parameter", me, p->name,
                                   zero_status_name(p->ds_status)));
    }
    reads_.push_back(std::move(r));
  }
}

nlohmann::json TreeModel::kind_args() const { return {{"code", code_}}; }

std::string TreeModel::describe() const {
  std::string code;
  for (std::int64_t v : code_) code += (code.empty() ? "" : ",") + std::to_string(v);
  return fmt::format("tree(code [{}]: {} nodes, {} params, {} external uses, {} aliases)", code,
                     nodes_, numels_.size(), uses_.size(), tied_.size());
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

HostBatch TreeModel::batch_shapes(std::int64_t samples) const {
  HostBatch hb;
  hb.samples = samples;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    hb.arrays.emplace(fmt::format("g{}", i), HostArray{{samples, numels_[i]}, {}});
  }
  return hb;
}

double TreeModel::node_forward(Device& dev, Module& m) {
  m.run_pre_forward();
  double loss = 0;
  for (const auto& entry : m.params()) {
    const Parameter& p = *m.params().get(entry.first);
    const Tensor& g = held_.at(fmt::format("g{}", p.id));  // [B, numel]
    Tensor mean = dev.alloc(dtype_, {p.numel()}, "g_mean", MemCategory::temporaries);  // [numel]
    dev.sum_rows(mean, g, false);
    loss += dev.dot(mean, p.data) / static_cast<double>(held_.samples);
  }
  const std::size_t first_read = reads_.size();
  read_external(dev, m);
  const std::size_t end_read = reads_.size();
  const std::size_t first_alias = alias_reads_.size();
  read_aliases(dev, m);
  const std::size_t end_alias = alias_reads_.size();
  for (const auto& c : m.children()) loss += node_forward(dev, *c);
  check_tied_gathered(m, "after the forward of the children");
  m.run_post_forward();
  for (std::size_t i = first_read; i < end_read; ++i) reads_[i].live_after = dev.live_bytes();
  for (std::size_t i = first_alias; i < end_alias; ++i) {
    alias_reads_[i].live_after = dev.live_bytes();
  }
  return loss;
}

double TreeModel::forward(Device& dev, const Batch& batch) {
  held_ = batch;
  reads_.clear();
  alias_reads_.clear();
  return node_forward(dev, *this);
}

// The reverse of the forward: children last to first, then the node's params last to first.
void TreeModel::node_backward(Device& dev, Module& m, double loss_scale, std::int64_t ga) {
  m.run_pre_backward();
  for (auto c = m.children().rbegin(); c != m.children().rend(); ++c) {
    node_backward(dev, **c, loss_scale, ga);
  }
  check_tied_gathered(m, "after the backward of the children");
  std::vector<std::string> names;
  for (const auto& entry : m.params()) names.push_back(entry.first);
  for (auto n = names.rbegin(); n != names.rend(); ++n) {
    Parameter& p = *m.params().get(*n);
    const Tensor& g = held_.at(fmt::format("g{}", p.id));
    accumulate_prescribed_grad(dev, p, g, held_.samples, loss_scale, ga, --loss_readers_left_ == 0);
  }
  // The root has no post-backward hook: DeepSpeed's fires only through an input that requires grad, and the root's input is data (Note [ZeRO-3's parameter coordinator]).
  if (&m != this) m.run_post_backward();
}

void TreeModel::backward(Device& dev, double loss_scale, std::int64_t ga) {
  // The loss is a sum of a term per param: each term's node reads the loss's gradient.
  loss_readers_left_ = static_cast<std::int64_t>(named_parameters().size());
  node_backward(dev, *this, loss_scale, ga);
}

}  // namespace zc
