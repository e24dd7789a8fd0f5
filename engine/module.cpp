// Module tree, ParamDict and grad accumulation.
#include "engine/module.h"

#include "engine/errors.h"

namespace zc {

std::string_view zero_status_name(ZeroStatus s) {
  switch (s) {
    case ZeroStatus::none: return "none";
    case ZeroStatus::available: return "AVAILABLE";
    case ZeroStatus::not_available: return "NOT_AVAILABLE";
    case ZeroStatus::inflight: return "INFLIGHT";
  }
  return "?";
}

Parameter& ParamDict::add(const std::string& local_name, Shape shape, DType dtype) {
  if (get(local_name) != nullptr) {
    throw UsageError(fmt::format("parameter '{}' registered twice", local_name));
  }
  auto p = std::make_unique<Parameter>();
  p->name = local_name;
  p->shape = std::move(shape);
  p->dtype = dtype;
  Parameter& ref = *p;
  items_.emplace_back(local_name, std::move(p));
  return ref;
}

Parameter* ParamDict::get(std::string_view local_name) {
  for (auto& [name, p] : items_) {
    if (name == local_name) return p.get();
  }
  return nullptr;
}

Module::Module(std::string name) : name_(std::move(name)), params_(this) {}
Module::~Module() = default;

std::string Module::path() const {
  if (parent_ == nullptr) return "";
  const std::string up = parent_->path();
  return up.empty() ? name_ : up + "." + name_;
}

Module& Module::root() {
  Module* m = this;
  while (m->parent_ != nullptr) m = m->parent_;
  return *m;
}

void Module::adopt(std::unique_ptr<Module> child) {
  child->parent_ = this;
  children_.push_back(std::move(child));
}

void Module::collect(std::vector<Parameter*>& out) {
  for (auto& [name, p] : params_) out.push_back(p.get());
  for (auto& c : children_) c->collect(out);
}

std::vector<Parameter*> Module::named_parameters() {
  std::vector<Parameter*> out;
  collect(out);
  return out;
}

void Module::finalize_parameters() {
  ZC_ASSERT(parent_ == nullptr, "finalize_parameters() is called on the root");
  std::int64_t id = 0;
  // Names and ids through a depth-first walk that mirrors collect().
  std::function<void(Module&)> walk = [&](Module& m) {
    const std::string prefix = m.path();
    for (auto& [local, p] : m.params_) {
      p->name = prefix.empty() ? local : prefix + "." + local;
      p->id = id++;
    }
    for (auto& c : m.children_) walk(*c);
  };
  walk(*this);
}

void Module::run_pre_forward() {
  in_forward_ = true;
  for (auto& [owner, h] : pre_forward_) h(*this);
}
void Module::run_post_forward() {
  for (auto& [owner, h] : post_forward_) h(*this);
  in_forward_ = false;
}
void Module::run_pre_backward() {
  for (auto& [owner, h] : pre_backward_) h(*this);
}
void Module::run_post_backward() {
  for (auto& [owner, h] : post_backward_) h(*this);
}

void Module::remove_hooks(const void* owner) {
  for (auto* list : {&pre_forward_, &post_forward_, &pre_backward_, &post_backward_}) {
    std::erase_if(*list, [&](const TaggedHook& h) { return h.first == owner; });
  }
  for (auto& c : children_) c->remove_hooks(owner);
}

void Module::accumulate_grad(Device& dev, Parameter& p, const Tensor& g) {
  ZC_ASSERT(g.numel() == p.numel(), "grad of {} has {} elements, param has {}", p.name, g.numel(),
            p.numel());
  if (!p.requires_grad) return;
  if (!p.grad.defined()) {
    p.grad = dev.alloc(p.dtype, p.shape, p.name + ".grad");
    dev.cast(p.grad, g);
  } else {
    dev.axpy(p.grad, 1.0, g);
  }
  Module& r = root();
  if (r.grad_ready_) r.grad_ready_(p);
}

}  // namespace zc
