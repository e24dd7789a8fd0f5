// Modules and parameters: a Module is a tree; each has a ParamDict (an ordered name -> Parameter
// map with a back-pointer to its owning module and an in_forward flag, as DeepSpeed's
// ZeROOrderedDict), pre/post forward and backward hooks, and its parameters' grad-ready hooks,
// fired in backward order as autograd fires them. Models write explicit backward code.
// Invariant I4 (SPEC 7): every copy of a tree (clone(), a subclass's copy constructor,
// serialize + deserialize in module_io.h) binds each ParamDict to its new module; see
// Note [Module copies].
#pragma once

#include "engine/device.h"
#include "engine/known_bugs.h"

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace zc {

class Module;

// ZeRO-3 parameter status (SPEC 5). `none` marks a param without ZeRO status (fake/meta params,
// and every param of stages 0-2): Python's param without a ds_status attribute.
enum class ZeroStatus : std::uint8_t { none, available, not_available, inflight };
std::string_view zero_status_name(ZeroStatus s);
// "none", "AVAILABLE", ... back to the status; throws UsageError naming an unknown one.
ZeroStatus parse_zero_status(std::string_view name);

struct Parameter {
  std::string name;         // dotted path from the root, e.g. "layers.1.weight"
  std::int64_t id = -1;     // position in the root's named_parameters() order
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = true;
  bool is_expert = false;   // an MoE expert param: reduced over the expert-data-parallel group
  Tensor data;        // [shape] model dtype; undefined while partitioned (ZeRO-3); meta if fake
  Tensor grad;        // [shape] model dtype; undefined = None
  Tensor grad_accum;  // [shape] grad_accum dtype, when it differs from the model dtype
  ZeroStatus ds_status = ZeroStatus::none;
  Tensor ds_shard;    // [shard_numel] this rank's ZeRO-3 shard
  std::int64_t numel() const { return shape_numel(shape); }
  // Python's hasattr(param, "ds_status").
  bool has_zero_status() const { return ds_status != ZeroStatus::none; }
};

// What a tree's ParamDicts need from the ZeRO-3 engine that partitions it: DeepSpeed's
// FWD_MODULE_STACK, register_external_parameter and param.all_gather(), and the engine's
// known-bug switches for the getter and the copy path. Zero3Optimizer installs itself on the
// root, so engine code reaches it without a global or a backend.
class ParamCoordinator {
 public:
  virtual ~ParamCoordinator() = default;
  virtual const BugSet& bugs() const = 0;
  // FWD_MODULE_STACK[-1]: the innermost module whose forward runs (the root outside forward).
  virtual Module& current_module() = 0;
  virtual void register_external_parameter(Module& module, Parameter& p) = 0;
  // NOT_AVAILABLE or INFLIGHT -> AVAILABLE, before returning.
  virtual void all_gather(Parameter& p) = 0;
};

// Installed on a root while the compile front end traces it (torch.compiler.is_compiling()).
struct TracingContext {
  BugSet bugs;  // the traced engine's switches (KnownBug::B6 is read in ParamDict::get)
};

// Note [Shared params]
// PyTorch ties weights (embedding and LM head) by registering one Parameter object in two
// modules' _parameters. Here a ParamDict owns its Parameters (unique_ptr), and that ownership is
// what I4's copy checks, ZeRO-3's index_ (one shard per Parameter*) and the grad-ready hook rest
// on, so a tied entry is a second kind of entry, an alias:
// - ParamDict::add_alias records (local name, param, owning module) apart from the owned items;
//   get() and contains() see both kinds, iteration (begin/end, size) sees owned params only, so
//   named_parameters()/finalize_parameters() list each param once, under its owner's path;
// - ZeRO-3 gathers an alias in the aliasing module's hooks too and counts active users per param
//   (DeepSpeed's ds_active_sub_modules): a release frees it only when no user is active;
// - the grad: a model accumulates a tied param's summed gradient into the one Parameter and
//   fires accumulate_grad once per backward (TreeModel's loss is prescribed per param, so its
//   aliases read the value and add no term: Note [Tree aliases]);
// - copies (Note [External params in copies]) and serialize remap an alias to the copy's param
//   and module by position; a subtree copy without the owner turns the alias into an owned
//   param, a copy of the original's (what deepcopy of that subtree gives: the tied Parameter is
//   copied once and the copied module holds it).
// External params (Module::add_external_param) cover the use of another module's param
// without the aliasing.
// Ordered name -> Parameter owned by one module, and aliases of other modules' params.
class ParamDict {
 public:
  explicit ParamDict(Module* owner) : owner_(owner) {}
  // The copy path (Note [Module copies]): every Parameter is copied into a new object (tensors
  // are handles: the copy views the same storage) and the dict is bound to `owner`.
  ParamDict(const ParamDict& other, Module* owner);
  ParamDict(const ParamDict&) = delete;
  ParamDict& operator=(const ParamDict&) = delete;

  Parameter& add(const std::string& local_name, Shape shape, DType dtype);
  // A tied entry (Note [Shared params]): `local_name` names `p`, which `owner`'s dict owns.
  struct Alias {
    std::string local;
    Parameter* param;  // not owned
    Module* owner;     // the module whose ParamDict owns `param`
  };
  Parameter& add_alias(const std::string& local_name, Parameter& p, Module& owner);
  const std::vector<Alias>& aliases() const { return aliases_; }
  std::vector<Alias>& aliases() { return aliases_; }
  // Turns alias `k` into an owned param, a copy of the aliased one (a copy without the owner).
  void own_alias(std::size_t k);
  // ZeROOrderedDict.__getitem__ (SPEC 7): a missing param returns nullptr; ds_status is read only
  // if the param has one (fake params have none); a NOT_AVAILABLE param read in an eager forward
  // (the owner's dict is in_forward and nothing is tracing) is registered as external on the
  // current module and all-gathered before it is returned. Model code reads params through it.
  Parameter* get(std::string_view local_name);
  bool contains(std::string_view local_name) const;
  Module* owner() const { return owner_; }
  // Set on every module's dict by the engine's forward for ZeRO-3 (DeepSpeed's _in_forward).
  bool in_forward() const { return in_forward_; }
  void set_in_forward(bool on) { in_forward_ = on; }
  std::size_t size() const { return items_.size(); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  Parameter* find(std::string_view local_name) const;
  void fetch_external(Parameter& p);

  Module* owner_;
  bool in_forward_ = false;
  std::vector<std::pair<std::string, std::unique_ptr<Parameter>>> items_;
  std::vector<Alias> aliases_;
};

using ModuleHook = std::function<void(Module&)>;
using GradReadyHook = std::function<void(Parameter&)>;

class Module {
 public:
  explicit Module(std::string name);
  virtual ~Module();
  Module& operator=(const Module&) = delete;

  // A deep copy of this subtree as a new root, of this module's own subclass (checked).
  std::unique_ptr<Module> clone() const;
  // The registry key deserialize rebuilds this module with, and the constructor arguments.
  virtual std::string kind() const { return "module"; }
  virtual nlohmann::json kind_args() const;

  const std::string& name() const { return name_; }
  std::string path() const;  // dotted path from the root ("" for the root)
  ParamDict& params() { return params_; }
  const ParamDict& params() const { return params_; }
  Module* parent() const { return parent_; }
  Module& root();
  const Module& root() const;
  const std::vector<std::unique_ptr<Module>>& children() const { return children_; }

  template <class M, class... Args>
  M& add_child(Args&&... args) {
    auto child = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *child;
    adopt(std::move(child));
    return ref;
  }
  Module& add_child(std::unique_ptr<Module> child);

  // Every parameter of the tree, depth first in registration order; ids follow this order.
  std::vector<Parameter*> named_parameters();
  // Assigns ids and dotted names from this (root) module; call once the tree is built.
  void finalize_parameters();

  // Hooks. Engines register (tagged with an owner, so they can remove theirs); models call
  // run_*() around their own forward/backward.
  void add_pre_forward_hook(ModuleHook h, const void* owner = nullptr) { pre_forward_.push_back({owner, std::move(h)}); }
  void add_post_forward_hook(ModuleHook h, const void* owner = nullptr) { post_forward_.push_back({owner, std::move(h)}); }
  void add_pre_backward_hook(ModuleHook h, const void* owner = nullptr) { pre_backward_.push_back({owner, std::move(h)}); }
  void add_post_backward_hook(ModuleHook h, const void* owner = nullptr) { post_backward_.push_back({owner, std::move(h)}); }
  // Removes every hook `owner` registered on this module and its descendants.
  void remove_hooks(const void* owner);
  void run_pre_forward();
  void run_post_forward();
  void run_pre_backward();
  void run_post_backward();
  // This module's ParamDict in_forward flag.
  bool in_forward() const { return params_.in_forward(); }
  // Sets the in_forward flag of every ParamDict of this subtree.
  void set_params_in_forward(bool on);

  // The ZeRO-3 coordinator and the tracing context live on the root (nullptr when none).
  void set_param_coordinator(ParamCoordinator* c);
  ParamCoordinator* param_coordinator() const { return root().coordinator_; }
  void set_tracing(const TracingContext* t);
  const TracingContext* tracing() const { return root().tracing_; }

  // DeepSpeed's module._external_params (register_external_parameter): params this module uses
  // although another module's ParamDict owns them; ZeRO-3 gathers and releases them in this
  // module's hooks too. Registering one twice keeps one entry. A copy refers to the copy's params,
  // never the original's (Note [External params in copies]).
  void add_external_param(Parameter& p);
  const std::vector<Parameter*>& external_params() const { return external_params_; }

  // The grad-ready hook lives on the root; accumulate_grad() fires it.
  void set_grad_ready_hook(GradReadyHook h) { root().grad_ready_ = std::move(h); }
  // p.grad = p.grad + g (or a copy of g when None), then fires the grad-ready hook: what
  // PyTorch's AccumulateGrad node and a post-accumulate-grad hook do.
  void accumulate_grad(Device& dev, Parameter& p, const Tensor& g);
  // The same, handing over a gradient the caller allocated for this and drops: when p has no
  // .grad and g is a whole allocation of p's dtype, g becomes p.grad (recategorized as grads),
  // as AccumulateGrad takes a gradient nothing else holds without copying it.
  void accumulate_grad(Device& dev, Parameter& p, Tensor&& g);

 protected:
  // The copy path every subclass's copy constructor goes through (Note [Module copies]).
  Module(const Module& other);
  // Each subclass returns a copy of its own type: `return std::make_unique<T>(*this);`.
  virtual std::unique_ptr<Module> clone_impl() const;

 private:
  void adopt(std::unique_ptr<Module> child);
  void collect(std::vector<Parameter*>& out);
  void rebind_external_params(const Module& original);
  void rebind_aliases(const Module& original, const std::map<const Parameter*, std::size_t>& pos,
                      const std::vector<Parameter*>& mine);


  std::string name_;
  Module* parent_ = nullptr;
  ParamDict params_;
  std::vector<std::unique_ptr<Module>> children_;
  std::vector<Parameter*> external_params_;  // not owned: params of other modules' ParamDicts
  // Set on an original while its children are copied, so a child's copy knows it is not the
  // outermost copy (Note [External params in copies]).
  mutable bool copying_children_ = false;
  using TaggedHook = std::pair<const void*, ModuleHook>;
  std::vector<TaggedHook> pre_forward_, post_forward_, pre_backward_, post_backward_;
  GradReadyHook grad_ready_;
  ParamCoordinator* coordinator_ = nullptr;  // root only
  const TracingContext* tracing_ = nullptr;  // root only
};

}  // namespace zc
