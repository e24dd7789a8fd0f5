// Modules and parameters: a Module is a tree; each has a ParamDict (an ordered name -> Parameter
// map with a back-pointer to its owning module and an in_forward flag, as DeepSpeed's
// ZeROOrderedDict), pre/post forward and backward hooks, and its parameters' grad-ready hooks,
// fired in backward order as autograd fires them. Models write explicit backward code.
#pragma once

#include "engine/device.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zc {

class Module;

// ZeRO-3 parameter status (SPEC 5). `none` marks a param without ZeRO status (fake/meta params,
// and every param of stages 0-2).
enum class ZeroStatus : std::uint8_t { none, available, not_available, inflight };
std::string_view zero_status_name(ZeroStatus s);

struct Parameter {
  std::string name;         // dotted path from the root, e.g. "layers.1.weight"
  std::int64_t id = -1;     // position in the root's named_parameters() order
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = true;
  bool is_expert = false;   // an MoE expert param: reduced over the expert-data-parallel group
  Tensor data;        // [shape] model dtype; undefined while partitioned (ZeRO-3)
  Tensor grad;        // [shape] model dtype; undefined = None
  Tensor grad_accum;  // [shape] grad_accum dtype, when it differs from the model dtype
  ZeroStatus ds_status = ZeroStatus::none;
  Tensor ds_shard;    // [shard_numel] this rank's ZeRO-3 shard
  std::int64_t numel() const { return shape_numel(shape); }
};

// Ordered name -> Parameter owned by one module.
class ParamDict {
 public:
  explicit ParamDict(Module* owner) : owner_(owner) {}
  ParamDict(const ParamDict&) = delete;
  ParamDict& operator=(const ParamDict&) = delete;

  Parameter& add(const std::string& local_name, Shape shape, DType dtype);
  // The param called `local_name`, or nullptr (SPEC 7: a missing param returns none).
  Parameter* get(std::string_view local_name);
  Module* owner() const { return owner_; }
  void set_owner(Module* owner) { owner_ = owner; }
  std::size_t size() const { return items_.size(); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  Module* owner_;
  std::vector<std::pair<std::string, std::unique_ptr<Parameter>>> items_;
};

using ModuleHook = std::function<void(Module&)>;
using GradReadyHook = std::function<void(Parameter&)>;

class Module {
 public:
  explicit Module(std::string name);
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }
  std::string path() const;  // dotted path from the root ("" for the root)
  ParamDict& params() { return params_; }
  const ParamDict& params() const { return params_; }
  Module* parent() const { return parent_; }
  Module& root();
  const std::vector<std::unique_ptr<Module>>& children() const { return children_; }

  template <class M, class... Args>
  M& add_child(Args&&... args) {
    auto child = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *child;
    adopt(std::move(child));
    return ref;
  }

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
  bool in_forward() const { return in_forward_; }

  // The grad-ready hook lives on the root; accumulate_grad() fires it.
  void set_grad_ready_hook(GradReadyHook h) { root().grad_ready_ = std::move(h); }
  // p.grad = p.grad + g (or a copy of g when None), then fires the grad-ready hook: what
  // PyTorch's AccumulateGrad node and a post-accumulate-grad hook do.
  void accumulate_grad(Device& dev, Parameter& p, const Tensor& g);

 private:
  void adopt(std::unique_ptr<Module> child);
  void collect(std::vector<Parameter*>& out);

  std::string name_;
  Module* parent_ = nullptr;
  ParamDict params_;
  std::vector<std::unique_ptr<Module>> children_;
  using TaggedHook = std::pair<const void*, ModuleHook>;
  std::vector<TaggedHook> pre_forward_, post_forward_, pre_backward_, post_backward_;
  GradReadyHook grad_ready_;
  bool in_forward_ = false;
};

}  // namespace zc
