// Zero3Optimizer: partitioning at construction and the parameter coordinator (module hooks that
// gather and release params, with forward prefetch). Gradients and the step: zero3_grads.cpp.
#include "engine/zero3_optimizer.h"

#include "engine/decisions.h"
#include "engine/errors.h"

#include <algorithm>

namespace zc {

Zero3Optimizer::Zero3Optimizer(const Config& cfg, Module& model, Device& dev, Comm& comm,
                               const Options& opts)
    : ZeroOptimizer(cfg, model, dev, comm, opts), world_(comm.size()), rank_(comm.rank()),
      overlap_(cfg.zero.overlap_comm), contiguous_(cfg.zero.contiguous_gradients),
      bucket_size_(cfg.zero.reduce_bucket_size) {
  const bool offload_opt = cfg.zero.offload_optimizer == OffloadDevice::cpu;
  const bool offload_par = cfg.zero.offload_param == OffloadDevice::cpu;
  if (offload_opt || offload_par) cpu_.emplace(dev_, opts.cpu_device);
  std::int64_t total = 0;
  for (Parameter* p : params_) {
    Shard s;
    s.p = p;
    s.numel = p->numel();
    s.shard_numel = decide::zero3_shard_numel<std::int64_t>(s.numel, world_);
    s.offset = partition_numel_;
    s.persistent = s.numel <= cfg.zero.stage3_param_persistence_threshold;
    partition_numel_ += s.shard_numel;
    total += s.numel;
    index_[p] = shards_.size();
    if (p->id >= 0) {
      if (index_by_id_.size() <= static_cast<std::size_t>(p->id)) index_by_id_.resize(p->id + 1, -1);
      index_by_id_[static_cast<std::size_t>(p->id)] = static_cast<std::int64_t>(shards_.size());
    }
    shards_.push_back(s);
  }
  const std::int64_t pn = std::max<std::int64_t>(partition_numel_, 1);
  fp16_partition_ = offload_par ? cpu_->alloc(dtype_, {pn}, "fp16_partitioned_groups_flat",
                                              MemCategory::params)
                                : dev_.alloc(dtype_, {pn}, "fp16_partitioned_groups_flat",
                                             MemCategory::params);
  // zero.Init's conversion of a model built outside it (partition_parameters.py:1204,
  // _zero_init_param): each param is broadcast from rank 0 once more (the engine's own
  // _broadcast_model did it already), then partitioned; the optimizer's set-up then places three
  // barriers (stage3.py:914, :765, :774).
  for (Shard& s : shards_) comm_.broadcast(s.p->data, {.root = 0});
  for (Shard& s : shards_) {
    Parameter& p = *s.p;
    const std::int64_t lo = decide::zero3_shard_real_begin<std::int64_t>(s.numel, world_, rank_);
    const std::int64_t len = decide::zero3_shard_real_numel<std::int64_t>(s.numel, world_, rank_);
    Tensor mine = fp16_partition_.narrow(s.offset, s.shard_numel);
    if (len > 0) {
      if (offload_par) {
        cpu_->to_cpu(mine.narrow(0, len), p.data.view({s.numel}).narrow(lo, len));
      } else {
        dev_.copy(mine.narrow(0, len), p.data.view({s.numel}).narrow(lo, len));
      }
    }
    p.ds_shard = mine;
    p.data = Tensor();  // partitioned: the full tensor is freed
    p.ds_status = ZeroStatus::not_available;
  }
  comm_.barrier();  // _create_fp16_partitions_with_defragmentation
  Device& opt_dev = offload_opt ? cpu_->cpu() : dev_;
  master_ = opt_dev.alloc(DType::f32, {pn}, "fp32_partitioned_groups_flat", MemCategory::master);
  if (offload_opt == offload_par) {  // both on the CPU, or both on the device
    (offload_par ? cpu_->cpu() : dev_).cast(master_, fp16_partition_);
  } else if (offload_opt) {
    cpu_->to_cpu(master_, fp16_partition_);
  } else {  // params on the CPU, optimizer on the device: a real transfer up
    cpu_->to_device(master_, fp16_partition_);
  }
  comm_.barrier();  // _setup_for_real_optimizer, after the fp32 partitions
  base_ = std::make_unique<BaseOptimizer>(cfg.optimizer, opt_dev, pn, "optimizer", opts.adam_simd_width);
  comm_.barrier();  // and after the optimizer states
  grad_partition_ = dev_.alloc(accum_dtype_, {pn}, "grad_partitions", MemCategory::grads);
  if (offload_opt) fp32_grad_cpu_ = cpu_->alloc(DType::f32, {pn}, "fp32_grad_partition",
                                                MemCategory::grads);
  bucket_capacity_ = std::max<std::int64_t>(1, std::min(bucket_size_, total));
  if (contiguous_) bucket_ = dev_.alloc(dtype_, {bucket_capacity_}, "ipg_buffer",
                                        MemCategory::ipg_buckets);
  already_reduced_.assign(shards_.size(), 0);
  micro_step_id_ = 0;  // SPEC 5: 0 at init for ZeRO-3
  check_external_params(model_);  // registered before the engine (DeepSpeed's zero.Init idiom)
  number_modules(model_);
  install_hooks(model_);
  model_.set_param_coordinator(this);
  record(fmt::format("zero3 init: {} params, partition {} elements, offload optimizer {} param {}",
                     shards_.size(), partition_numel_, offload_opt, offload_par));
}

Zero3Optimizer::~Zero3Optimizer() {
  model_.remove_hooks(this);
  model_.set_param_coordinator(nullptr);
}

std::int64_t Zero3Optimizer::find_shard(const Parameter& p) const {
  const auto id = static_cast<std::size_t>(p.id);
  if (p.id >= 0 && id < index_by_id_.size() && index_by_id_[id] >= 0 &&
      shards_[static_cast<std::size_t>(index_by_id_[id])].p == &p) {
    return index_by_id_[id];
  }
  auto it = index_.find(&p);  // a param whose id another module's param shares (copies)
  return it == index_.end() ? -1 : static_cast<std::int64_t>(it->second);
}

Zero3Optimizer::Shard& Zero3Optimizer::shard_of(const Parameter& p) {
  const std::int64_t k = find_shard(p);
  ZC_ASSERT(k >= 0, "param {} is not managed by ZeRO-3", p.name);
  return shards_[static_cast<std::size_t>(k)];
}

std::vector<Parameter*> Zero3Optimizer::params_of(Module& m) {
  std::vector<Parameter*> out;
  for (auto& [name, p] : m.params()) {
    if (find_shard(*p) >= 0) out.push_back(p.get());
  }
  for (const ParamDict::Alias& a : m.params().aliases()) {
    if (std::find(out.begin(), out.end(), a.param) == out.end()) out.push_back(a.param);
  }
  for (Parameter* p : m.external_params()) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

// The registration lives on the module (DeepSpeed's module._external_params), so copies of the
// tree carry it (Note [External params in copies]) and an engine built on one gathers it.
void Zero3Optimizer::register_external_parameter(Module& module, Parameter& p) {
  if (index_.count(&p) == 0) {
    throw UsageError(fmt::format("register_external_parameter: param '{}' is not a param of the "
                                 "model this ZeRO-3 engine partitions: register a param of the "
                                 "same module tree", p.name));
  }
  module.add_external_param(p);
}

void Zero3Optimizer::check_external_params(Module& m) {
  for (Parameter* p : m.external_params()) {
    if (index_.count(p) == 0) {
      throw UsageError(fmt::format("module '{}' has external param '{}' that is not a param of "
                                   "this model: register only params of the same module tree",
                                   m.path(), p->name));
    }
  }
  for (auto& c : m.children()) check_external_params(*c);
}

Module& Zero3Optimizer::current_module() {
  return fwd_stack_.empty() ? model_ : *fwd_stack_.back();
}

void Zero3Optimizer::all_gather(Parameter& p) {
  Shard& s = shard_of(p);
  if (p.ds_status == ZeroStatus::not_available) begin_gather(s, MemCategory::gathered_params);
  if (p.ds_status == ZeroStatus::inflight) finish_gather(s);
}

void Zero3Optimizer::install_hooks(Module& m) {
  m.add_pre_forward_hook([this](Module& mm) {
    if (&mm == &model_) {  // a new forward: the previous one's module order drives prefetch
      reset_step();
      last_fwd_order_ = std::move(fwd_order_);
      fwd_order_.clear();
      fwd_stack_.clear();  // a forward that threw left its modules behind
      for (Shard& s : shards_) s.active = 0;
    }
    fwd_order_.push_back(&mm);
    fwd_stack_.push_back(&mm);
    record_fetch(mm);
    fetch_module(mm);
    prefetch_after(mm);
  }, this);
  m.add_post_forward_hook([this](Module& mm) {
    // FWD_MODULE_STACK.pop(); by identity, so a hand-driven hook out of order pops its own module
    auto it = std::find(fwd_stack_.rbegin(), fwd_stack_.rend(), &mm);
    if (it != fwd_stack_.rend()) fwd_stack_.erase(std::next(it).base());
    release_module(mm);
  }, this);
  m.add_pre_backward_hook([this](Module& mm) {
    if (&mm == &model_) {
      for (Shard& s : shards_) s.active = 0;  // the forward released every user
    }
    record_fetch(mm);
    fetch_module(mm);
  }, this);
  m.add_post_backward_hook([this](Module& mm) { release_module(mm); }, this);
  for (auto& c : m.children()) install_hooks(*c);
}

// Note [ZeRO-3's trace checks]
// DeepSpeed's parameter coordinator records the order of module fetches (every module's pre-forward
// and pre-backward hook) in one forward/backward, and checks it is the same on every rank, at the
// root's next forward (reset_step, partitioned_param_coordinator.py:250-277, called from the root's
// forward pre-hook, parameter_offload.py:306). The trace starts INVALID. At the first forward it
// checks the (empty) module list and starts recording; at the second it checks the module list, then
// the param trace built from it (each recorded module's params, in fetch order: their ds_ids, then
// the fetch step each was last used at) and the trace is COMPLETE: later forwards check nothing.
// Each check (assert_ints_same_as_other_ranks, zero/utils.py:80-125) is two broadcasts from rank 0
// of int64 tensors, the list's length [1] and the list itself [n] (an empty list still broadcasts),
// and raises when a rank's list differs from rank 0's. DeepSpeed's tensors are int64; these are
// f64, which holds the same small integers exactly in the same 8 bytes. zerocheck does not model
// the COMPLETE trace's prefetch, nor a trace invalidated by a changed module order (DeepSpeed then
// records again); its fetches are the per-module ones below (the listed divergence
// stage3-collective-schedule covers the all_gathers).
void Zero3Optimizer::number_modules(const Module& m) {
  module_ids_.emplace(&m, static_cast<double>(module_ids_.size()));
  for (const auto& c : m.children()) number_modules(*c);
}

void Zero3Optimizer::record_fetch(Module& m) {
  if (trace_mode_ == TraceMode::record) submodule_order_.push_back(&m);
}

void Zero3Optimizer::assert_ints_same_as_other_ranks(const std::vector<double>& ints) {
  const auto n = static_cast<std::int64_t>(ints.size());
  Tensor len = dev_.alloc(DType::f64, {1}, "trace_check_length", MemCategory::temporaries);
  if (!len.is_meta()) write_f64(dev_, len, std::vector<double>{rank_ == 0 ? static_cast<double>(n) : -1.0});
  comm_.broadcast(len, {.root = 0});
  const double rank0_n = item(dev_, len, static_cast<double>(n));
  if (rank0_n != static_cast<double>(n)) {
    throw UsageError(fmt::format("ZeRO-3's trace check: rank 0 recorded {} module fetches or params, rank {} "
                                 "{}: every rank must run the same modules in the same order", rank0_n, rank_, n));
  }
  Tensor list = dev_.alloc(DType::f64, {n}, "trace_check_list", MemCategory::temporaries);
  if (list.is_meta()) {
    comm_.broadcast(list, {.root = 0});
    return;
  }
  write_f64(dev_, list, rank_ == 0 ? ints : std::vector<double>(ints.size(), -1.0));
  comm_.broadcast(list, {.root = 0});
  if (to_f64(dev_, list) != ints) {
    throw UsageError(fmt::format("ZeRO-3's trace check: rank {}'s module or param order differs from rank 0's: "
                                 "every rank must run the same modules in the same order", rank_));
  }
}

void Zero3Optimizer::reset_step() {
  if (trace_mode_ == TraceMode::complete) return;
  std::vector<double> modules;
  for (const Module* m : submodule_order_) modules.push_back(module_ids_.at(m));
  assert_ints_same_as_other_ranks(modules);
  if (trace_mode_ == TraceMode::record) {
    std::vector<double> ids, last_used;
    for (std::size_t step = 0; step < submodule_order_.size(); ++step) {
      for (Parameter* p : params_of(*submodule_order_[step])) {
        ids.push_back(static_cast<double>(find_shard(*p)));
        last_used.push_back(static_cast<double>(step));
      }
    }
    assert_ints_same_as_other_ranks(ids);
    assert_ints_same_as_other_ranks(last_used);
    trace_mode_ = TraceMode::complete;
  } else {
    trace_mode_ = TraceMode::record;
  }
  submodule_order_.clear();
}

// `why`: gathered_params for a module about to use it, prefetch ahead of use; a persistent
// param's buffer is counted as persistent either way (it is never released).
void Zero3Optimizer::begin_gather(Shard& s, MemCategory why) {
  Parameter& p = *s.p;
  ZC_ASSERT(p.ds_status == ZeroStatus::not_available, "gather of {} in status {}", p.name,
            zero_status_name(p.ds_status));
  Tensor src = p.ds_shard;
  if (cfg_.zero.offload_param == OffloadDevice::cpu) {  // bring the shard to the device first
    src = dev_.alloc(dtype_, {s.shard_numel}, p.name + ".shard_on_device",
                     MemCategory::comm_buffers);
    cpu_->to_device(src, p.ds_shard);
  }
  s.gather_buf = dev_.alloc(dtype_, {s.shard_numel * world_}, p.name + ".gathered",
                            s.persistent ? MemCategory::persistent : why);
  s.inflight = comm_.all_gather(s.gather_buf, src, {.async_op = true});
  p.ds_status = ZeroStatus::inflight;
}

void Zero3Optimizer::finish_gather(Shard& s) {
  Parameter& p = *s.p;
  ZC_ASSERT(p.ds_status == ZeroStatus::inflight && s.inflight, "finish_gather of {} in status {}",
            p.name, zero_status_name(p.ds_status));
  s.inflight->wait();
  s.inflight.reset();
  p.data = s.gather_buf.narrow(0, s.numel).view(p.shape);
  p.ds_status = ZeroStatus::available;
}

void Zero3Optimizer::fetch_module(Module& m) {
  for (Parameter* p : params_of(m)) {
    Shard& s = shard_of(*p);
    ++s.active;
    if (p->ds_status == ZeroStatus::available) continue;
    if (p->ds_status == ZeroStatus::not_available) begin_gather(s, MemCategory::gathered_params);
    finish_gather(s);
  }
}

void Zero3Optimizer::release(Shard& s) {
  Parameter& p = *s.p;
  if (s.persistent || p.ds_status == ZeroStatus::not_available) return;
  if (p.ds_status == ZeroStatus::inflight) {
    throw UsageError(fmt::format("releasing param {} while its all-gather is INFLIGHT: wait for "
                                 "the gather before release", p.name));
  }
  p.data = Tensor();
  s.gather_buf = Tensor();
  p.ds_status = ZeroStatus::not_available;
}

void Zero3Optimizer::release_module(Module& m) {
  // A param gathered outside the hooks (the getter's eager path) has no count: released here.
  for (Parameter* p : params_of(m)) {
    Shard& s = shard_of(*p);
    if (s.active > 0) --s.active;
    if (s.active == 0) release(s);
  }
  if (&m == &model_) {  // end of the model's forward/backward: no prefetch may stay in flight
    for (Shard& s : shards_) {
      if (s.p->ds_status == ZeroStatus::inflight) {
        finish_gather(s);
        release(s);
      }
    }
  }
}

// Starts the gathers of the modules that followed `m` in the previous forward, up to
// stage3_prefetch_bucket_size elements (DeepSpeed's trace-based prefetch, forward only).
void Zero3Optimizer::prefetch_after(Module& m) {
  std::int64_t budget = cfg_.zero.stage3_prefetch_bucket_size;
  if (budget <= 0) return;
  auto it = std::find(last_fwd_order_.begin(), last_fwd_order_.end(), &m);
  if (it == last_fwd_order_.end()) return;
  for (++it; it != last_fwd_order_.end() && budget > 0; ++it) {
    for (Parameter* p : params_of(**it)) {
      Shard& s = shard_of(*p);
      if (p->ds_status != ZeroStatus::not_available || s.numel > budget) continue;
      begin_gather(s, MemCategory::prefetch);
      budget -= s.numel;
      ++prefetched_;
    }
  }
}

// All-gathers a [partition_numel] tensor of every rank's flat partition and reassembles each
// param's full values, in param order (shard r of param p sits at r * pn + offset_p).
std::vector<double> Zero3Optimizer::gather_partitions(const Tensor& mine) {
  const std::int64_t pn = mine.numel();
  Tensor all = dev_.alloc(mine.dtype(), {pn * world_}, "gathered_partitions",
                          MemCategory::temporaries);
  comm_.all_gather(all, mine);
  const std::vector<double> v = to_f64(dev_, all);
  std::vector<double> out;
  for (const Shard& s : shards_) {
    for (std::int64_t i = 0; i < s.numel; ++i) {
      out.push_back(v[static_cast<std::size_t>((i / s.shard_numel) * pn + s.offset + i % s.shard_numel)]);
    }
  }
  return out;
}

std::vector<double> Zero3Optimizer::gather_f32_partition(const Tensor& src) {
  Tensor mine = dev_.alloc(DType::f32, {src.numel()}, "state_partition_copy", MemCategory::temporaries);
  dev_.cast(mine, src);  // from the CPU side too under offload_optimizer: a read-back
  return gather_partitions(mine);
}

std::optional<std::vector<double>> Zero3Optimizer::gathered_params() {
  if (cfg_.zero.offload_param != OffloadDevice::cpu) return gather_partitions(fp16_partition_);
  Tensor src = dev_.alloc(dtype_, {fp16_partition_.numel()}, "partition_on_device",
                          MemCategory::temporaries);
  cpu_->to_device(src, fp16_partition_);
  return gather_partitions(src);
}

}  // namespace zc
