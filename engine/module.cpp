// Module tree, ParamDict (ZeROOrderedDict's getter), module copies and grad accumulation.
#include "engine/module.h"

#include "engine/errors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <typeinfo>

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

ZeroStatus parse_zero_status(std::string_view name) {
  for (ZeroStatus s : {ZeroStatus::none, ZeroStatus::available, ZeroStatus::not_available,
                       ZeroStatus::inflight}) {
    if (zero_status_name(s) == name) return s;
  }
  throw UsageError(fmt::format("unknown ds_status '{}': expected none, AVAILABLE, NOT_AVAILABLE "
                               "or INFLIGHT", name));
}

namespace {

const BugSet kNoBugs;

// param.ds_status, as Python reads the attribute: a param without ZeRO status raises.
ZeroStatus read_ds_status(const Parameter& p, const Module& owner) {
  if (!p.has_zero_status()) {
    throw UsageError(fmt::format("AttributeError: param '{}' of module '{}' has no attribute "
                                 "'ds_status': it is a fake (meta) param without ZeRO status; "
                                 "check has_zero_status() before reading ds_status", p.name,
                                 owner.path().empty() ? "<root>" : owner.path()));
  }
  return p.ds_status;
}

}  // namespace

ParamDict::ParamDict(const ParamDict& other, Module* owner)
    : owner_(owner), in_forward_(other.in_forward_), aliases_(other.aliases_) {
  // Aliases keep the original's pointers until the outermost copy remaps them (Module's copy).
  for (const auto& [name, p] : other.items_) {
    items_.emplace_back(name, std::make_unique<Parameter>(*p));
  }
}

Parameter& ParamDict::add_alias(const std::string& local_name, Parameter& p, Module& owner) {
  if (contains(local_name)) {
    throw UsageError(fmt::format("parameter '{}' registered twice", local_name));
  }
  ZC_ASSERT(&owner != owner_, "module '{}' aliases its own param '{}'", owner.path(), p.name);
  aliases_.push_back({local_name, &p, &owner});
  return p;
}

void ParamDict::own_alias(std::size_t k) {
  ZC_ASSERT(k < aliases_.size(), "alias {} of {}", k, aliases_.size());
  const Alias a = aliases_[k];
  aliases_.erase(aliases_.begin() + static_cast<std::ptrdiff_t>(k));
  items_.emplace_back(a.local, std::make_unique<Parameter>(*a.param));
}

Parameter& ParamDict::add(const std::string& local_name, Shape shape, DType dtype) {
  if (contains(local_name)) {
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

Parameter* ParamDict::find(std::string_view local_name) const {
  for (const auto& [name, p] : items_) {
    if (name == local_name) return p.get();
  }
  for (const Alias& a : aliases_) {
    if (a.local == local_name) return a.param;
  }
  return nullptr;
}

bool ParamDict::contains(std::string_view local_name) const { return find(local_name) != nullptr; }

Parameter* ParamDict::get(std::string_view local_name) {
  Parameter* p = find(local_name);
  if (p == nullptr) return nullptr;  // SPEC 7: a missing param returns none
  if (owner_ == nullptr) {
    throw UsageError(fmt::format("ParamDict holding param '{}' has no owning module (a module copy "
                                 "dropped it, as Python's default reduce of ZeROOrderedDict did): "
                                 "copy modules with clone() or their copy constructor", p->name));
  }
  const Module& root = owner_->root();
  const TracingContext* tracing = root.tracing();
  const ParamCoordinator* coordinator = root.param_coordinator();
  const BugSet& bugs = tracing != nullptr      ? tracing->bugs
                       : coordinator != nullptr ? coordinator->bugs()
                                                : kNoBugs;
  // As ZeROOrderedDict reads self._parent_module._parameters._in_forward: through the owner.
  const bool eager_forward = owner_->params().in_forward() && tracing == nullptr;
  // KnownBug::B6: the getter read param.ds_status without asking whether the param has one, so a
  // fake param of a traced copy raised AttributeError.
  const bool reads_status = p->has_zero_status() || bugs.has(KnownBug::B6_fake_param_status);
  if (reads_status && read_ds_status(*p, *owner_) == ZeroStatus::not_available && eager_forward) {
    fetch_external(*p);
  }
  return p;
}

// register_external_parameter(FWD_MODULE_STACK[-1], param); param.all_gather()
void ParamDict::fetch_external(Parameter& p) {
  ParamCoordinator* c = owner_->param_coordinator();
  if (c == nullptr) {
    throw UsageError(fmt::format("param '{}' is NOT_AVAILABLE in a forward, but no ZeRO-3 engine "
                                 "coordinates this module tree: gather it through the engine that "
                                 "partitioned it", p.name));
  }
  c->register_external_parameter(c->current_module(), p);
  c->all_gather(p);
  ZC_ASSERT(p.ds_status == ZeroStatus::available && p.data.defined(),
            "external param {} still {} after all_gather", p.name, zero_status_name(p.ds_status));
}

Module::Module(std::string name) : name_(std::move(name)), params_(this) {}
Module::~Module() = default;

// Note [Module copies]
// clone(), a subclass's copy constructor and serialize + deserialize all give a new tree whose
// ParamDicts are bound to the new modules, never to null or to the original (I4). Everything
// an engine installed stays with the original: hooks, the grad-ready hook, the ZeRO-3
// coordinator and any tracing context; the copy is a root of its own. Parameters are new
// objects with the same fields; their tensors are handles, so a copy views the original's
// storage until something assigns it new tensors (trace() gives every param a meta tensor) and
// the original is never written. Subclasses that need a child reach it through children(), so
// the default member-wise copy is right for them. External-param registrations live on the
// module, as DeepSpeed's do, and are copied: see Note [External params in copies].
namespace {

// The owner a copy of `original`'s ParamDict gets. KnownBug::B5: before ZeROOrderedDict had a
// __reduce__, Python's default reduce rebuilt the dict without its parent module.
Module* copy_owner(const Module& original, Module* copy) {
  const ParamCoordinator* c = original.param_coordinator();
  if (c != nullptr && c->bugs().has(KnownBug::B5_copy_drops_owner)) return nullptr;
  return copy;
}

// Note [External params in copies]
// As deepcopy's memo does for DeepSpeed's module._external_params, a copy's external params are
// the copy's own Parameter objects: the one copied from the param the original registered. A
// module's copy constructor runs inside its parent's, so only the outermost copy knows the whole
// copied tree: inner copies keep the original's pointers and the outermost one maps every entry
// of its tree to the copy's param by position, and drops an entry whose param lies outside the
// copied subtree (deepcopy would make an orphan param no module owns; either way the copy never
// points at the original). The ZeRO-3 engine of the original keeps its own registrations; the
// copy has no coordinator until an engine is built on it, which then gathers these.
class CopyingChildren {
 public:
  explicit CopyingChildren(bool& flag) : flag_(flag) { flag_ = true; }
  ~CopyingChildren() { flag_ = false; }
  CopyingChildren(const CopyingChildren&) = delete;
  CopyingChildren& operator=(const CopyingChildren&) = delete;

 private:
  bool& flag_;
};

void each_param(const Module& m, const std::function<void(const Parameter&)>& f) {
  for (const auto& entry : m.params()) f(*entry.second);
  for (const auto& c : m.children()) each_param(*c, f);
}

void each_module(Module& m, const std::function<void(Module&)>& f) {
  f(m);
  for (const auto& c : m.children()) each_module(*c, f);
}

}  // namespace

Module::Module(const Module& other)
    : name_(other.name_), params_(other.params_, copy_owner(other, this)),
      external_params_(other.external_params_) {
  {
    const CopyingChildren scope(other.copying_children_);
    for (const auto& c : other.children_) adopt(c->clone());
  }
  const bool outermost = other.parent_ == nullptr || !other.parent_->copying_children_;
  if (outermost) rebind_external_params(other);
}

void Module::rebind_external_params(const Module& original) {
  std::map<const Parameter*, std::size_t> position;  // original's param -> preorder position
  each_param(original, [&](const Parameter& p) { position.emplace(&p, position.size()); });
  std::vector<Parameter*> mine;  // [position] this copy's params
  collect(mine);
  ZC_ASSERT(mine.size() == position.size(), "a copy of '{}' has {} params, the original {}",
            original.path(), mine.size(), position.size());
  each_module(*this, [&](Module& m) {
    std::vector<Parameter*> rebound;
    for (Parameter* p : m.external_params_) {
      auto it = position.find(p);
      if (it != position.end()) rebound.push_back(mine[it->second]);
    }
    m.external_params_ = std::move(rebound);
  });
  rebind_aliases(original, position, mine);
}

// An alias in a copy names the copy's param and module at the original's positions; one whose
// owner lies outside the copied subtree becomes an owned param of the copy (Note [Shared params]).
void Module::rebind_aliases(const Module& original,
                            const std::map<const Parameter*, std::size_t>& pos,
                            const std::vector<Parameter*>& mine) {
  std::map<const Module*, Module*> copy_of;  // original's module -> this copy's
  std::function<void(const Module&, Module&)> pair = [&](const Module& o, Module& c) {
    copy_of.emplace(&o, &c);
    for (std::size_t i = 0; i < o.children_.size(); ++i) pair(*o.children_[i], *c.children_[i]);
  };
  pair(original, *this);
  each_module(*this, [&](Module& m) {
    std::vector<ParamDict::Alias>& aliases = m.params_.aliases();
    for (std::size_t k = aliases.size(); k-- > 0;) {
      auto it = pos.find(aliases[k].param);
      if (it == pos.end()) {
        m.params_.own_alias(k);
        continue;
      }
      aliases[k].param = mine[it->second];
      aliases[k].owner = copy_of.at(aliases[k].owner);
    }
  });
}

void Module::add_external_param(Parameter& p) {
  if (std::find(external_params_.begin(), external_params_.end(), &p) == external_params_.end()) {
    external_params_.push_back(&p);
  }
}

std::unique_ptr<Module> Module::clone_impl() const {
  return std::unique_ptr<Module>(new Module(*this));
}

std::unique_ptr<Module> Module::clone() const {
  std::unique_ptr<Module> copy = clone_impl();
  const Module& made = *copy;
  ZC_ASSERT(typeid(made) == typeid(*this), "module '{}' of kind '{}' is a subclass without its own "
            "clone_impl(): add `return std::make_unique<T>(*this);`", path(), kind());
  return copy;
}

nlohmann::json Module::kind_args() const { return nlohmann::json::object(); }

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

const Module& Module::root() const {
  const Module* m = this;
  while (m->parent_ != nullptr) m = m->parent_;
  return *m;
}

void Module::adopt(std::unique_ptr<Module> child) {
  ZC_ASSERT(child->coordinator_ == nullptr && child->tracing_ == nullptr,
            "module '{}' joins a tree while it is a coordinated or traced root", child->name_);
  child->parent_ = this;
  children_.push_back(std::move(child));
}

Module& Module::add_child(std::unique_ptr<Module> child) {
  Module& ref = *child;
  adopt(std::move(child));
  return ref;
}

void Module::set_param_coordinator(ParamCoordinator* c) {
  ZC_ASSERT(parent_ == nullptr, "the param coordinator is installed on the root, not on '{}'",
            path());
  ZC_ASSERT(c == nullptr || coordinator_ == nullptr,
            "a second param coordinator on one module tree");
  coordinator_ = c;
}

void Module::set_tracing(const TracingContext* t) {
  ZC_ASSERT(parent_ == nullptr, "the tracing context is installed on the root, not on '{}'",
            path());
  tracing_ = t;
}

void Module::set_params_in_forward(bool on) {
  params_.set_in_forward(on);
  for (auto& c : children_) c->set_params_in_forward(on);
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
  for (auto& [owner, h] : pre_forward_) h(*this);
}
void Module::run_post_forward() {
  for (auto& [owner, h] : post_forward_) h(*this);
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

void Module::accumulate_grad(Device& dev, Parameter& p, Tensor&& g) {
  const bool whole = g.defined() && g.byte_begin() == 0 && g.nbytes() == g.storage()->bytes;
  if (!p.requires_grad || p.grad.defined() || g.dtype() != p.dtype || !whole || g.storage().use_count() != 1) {
    accumulate_grad(dev, p, static_cast<const Tensor&>(g));
    return;
  }
  ZC_ASSERT(g.numel() == p.numel(), "grad of {} has {} elements, param has {}", p.name, g.numel(), p.numel());
  dev.recategorize(g, MemCategory::grads, p.name + ".grad");
  p.grad = g.view(p.shape);
  g = Tensor();
  Module& r = root();
  if (r.grad_ready_) r.grad_ready_(p);
}

void Module::accumulate_grad(Device& dev, Parameter& p, const Tensor& g) {
  ZC_ASSERT(g.numel() == p.numel(), "grad of {} has {} elements, param has {}", p.name, g.numel(),
            p.numel());
  if (!p.requires_grad) return;
  if (!p.grad.defined()) {
    p.grad = dev.alloc(p.dtype, p.shape, p.name + ".grad", MemCategory::grads);
    dev.cast(p.grad, g);
  } else {
    dev.axpy(p.grad, 1.0, g);
  }
  Module& r = root();
  if (r.grad_ready_) r.grad_ready_(p);
}

}  // namespace zc
