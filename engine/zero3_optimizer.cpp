// Zero3Optimizer: partitioning at construction and the parameter coordinator (module hooks that
// gather and release params, with forward prefetch). Gradients and the step: zero3_grads.cpp.
#include "engine/zero3_optimizer.h"

#include "engine/decisions.h"
#include "engine/errors.h"

#include <algorithm>

namespace zc {

namespace {
constexpr std::int64_t kNeverFetched = -10'000'000'000;  // int(-1e10), the defaultdict's value
}  // namespace

Zero3Optimizer::Zero3Optimizer(const Config& cfg, Module& model, Device& dev, Comm& comm,
                               const Options& opts)
    : ZeroOptimizer(cfg, model, dev, comm, opts), world_(comm.size()), rank_(comm.rank()),
      overlap_(cfg.zero.overlap_comm), contiguous_(cfg.zero.contiguous_gradients),
      bucket_size_(cfg.zero.reduce_bucket_size) {
  const bool offload_opt = cfg.zero.offload_optimizer == OffloadDevice::cpu;
  const bool offload_par = cfg.zero.offload_param == OffloadDevice::cpu;
  if (offload_opt || offload_par) cpu_.emplace(dev_, opts.cpu_device);
  lay_out_shards(cfg.zero.stage3_param_persistence_threshold);
  const std::int64_t pn = std::max<std::int64_t>(partition_numel_, 1);
  Device& param_dev = offload_par ? cpu_->cpu() : dev_;
  // zero.Init's conversion of a model built outside it (partition_parameters.py:1204,
  // _zero_init_param): each param is broadcast from rank 0 once more (the engine's own
  // _broadcast_model did it already), then partitioned; the optimizer's set-up then places three
  // barriers (stage3.py:914, :765, :774).
  for (Shard& s : shards_) comm_.broadcast(s.p->data, {.root = 0});
  // Note [ZeRO-3's partitions are defragmented]: each param is partitioned into a tensor of its
  // own, its full data freed (_partition_param, partition_parameters.py:1777), and only then are
  // the partitions copied into one flat buffer and dropped (_create_fp16_partitions_with_
  // defragmentation, stage3.py; defragment, zero/utils.py:215). Construction's peak is the same
  // either way (the full params and a partition's worth), but at that peak DeepSpeed holds the
  // partitions as tensors the flat will replace, not as the flat.
  std::vector<Tensor> partitions;
  for (Shard& s : shards_) {
    Parameter& p = *s.p;
    const std::int64_t lo = decide::zero3_shard_real_begin<std::int64_t>(s.numel, world_, rank_);
    const std::int64_t len = decide::zero3_shard_real_numel<std::int64_t>(s.numel, world_, rank_);
    Tensor mine = param_dev.alloc(dtype_, {s.shard_numel}, p.name + ".ds_tensor", MemCategory::temporaries);
    if (len > 0) {
      if (offload_par) {
        cpu_->to_cpu(mine.narrow(0, len), p.data.view({s.numel}).narrow(lo, len));
      } else {
        dev_.copy(mine.narrow(0, len), p.data.view({s.numel}).narrow(lo, len));
      }
    }
    partitions.push_back(mine);
    p.data = Tensor();  // partitioned: the full tensor is freed
    p.ds_status = ZeroStatus::not_available;
  }
  Device& opt_dev = offload_opt ? cpu_->cpu() : dev_;
  inf_or_nan_tracker_ =
      opt_dev.alloc(DType::u8, {1}, "inf_or_nan_tracker", MemCategory::temporaries);
  comm_.barrier();  // _create_fp16_partitions_with_defragmentation
  fp16_partition_ = param_dev.alloc(dtype_, {pn}, "fp16_partitioned_groups_flat", MemCategory::params);
  for (std::size_t k = 0; k < shards_.size(); ++k) {
    Shard& s = shards_[k];
    const std::int64_t len = decide::zero3_shard_real_numel<std::int64_t>(s.numel, world_, rank_);
    Tensor mine = fp16_partition_.narrow(s.offset, s.shard_numel);
    if (len > 0) param_dev.copy(mine.narrow(0, len), partitions[k].narrow(0, len));
    s.p->ds_shard = mine;
    partitions[k] = Tensor();
  }
  master_ = opt_dev.alloc(DType::f32, {pn}, "fp32_partitioned_groups_flat", MemCategory::master);
  if (offload_opt == offload_par) {  // both on the CPU, or both on the device
    (offload_par ? cpu_->cpu() : dev_).cast(master_, fp16_partition_);
  } else if (offload_opt) {
    cpu_->to_cpu(master_, fp16_partition_);
  } else {  // params on the CPU, optimizer on the device: a real transfer up
    cpu_->to_device(master_, fp16_partition_);
  }
  comm_.barrier();  // _setup_for_real_optimizer, after the fp32 partitions
  base_ = std::make_unique<BaseOptimizer>(cfg.optimizer, opt_dev, pn, "optimizer",
                                          opts.adam_simd_width);
  // initialize_optimizer_states (stage3.py:1301): a zero f32 gradient buffer of the largest
  // sub-group (here the one partition) on DeepSpeed's self.device, which is the CPU under
  // offload_optimizer (stage3.py:333), dropped at its end; the states themselves come at the
  // first step (Note [Lazy optimizer state]).
  (void)opt_dev.alloc(DType::f32, {pn}, "initialize_optimizer_states.gradient_buffer", MemCategory::temporaries);
  comm_.barrier();  // and after the optimizer states
  grad_partition_ = dev_.alloc(accum_dtype_, {pn}, "grad_partitions", MemCategory::grads);
  if (offload_opt) fp32_grad_cpu_ = cpu_->alloc(DType::f32, {pn}, "fp32_grad_partition",
                                                MemCategory::grads);
  bucket_capacity_ = bucket_size_;  // reduce_bucket_size elements in the comm dtype: stage3.py:477, :782
  if (contiguous_) bucket_ = dev_.alloc(comm_dtype_, {bucket_capacity_}, "ipg_buffer",
                                        MemCategory::ipg_buckets);
  already_reduced_.assign(shards_.size(), 0);
  // create_reduce_and_remove_grad_hooks (stage3.py:1487-1531): each trainable param is gathered
  // (a single-param Init._all_gather, a call even at world 1) and partitioned again.
  for (Shard& s : shards_) {
    if (!s.p->requires_grad) continue;
    all_gather_params({&s}, MemCategory::gathered_params, false, GatherVia::init_one);
    release_param(s);
  }
  n_available_ = 0;
  most_recent_.assign(shards_.size(), kNeverFetched);
  micro_step_id_ = 0;  // SPEC 5: 0 at init for ZeRO-3
  check_external_params(model_);  // registered before the engine (DeepSpeed's zero.Init idiom)
  number_modules(model_);
  install_hooks(model_);
  model_.set_param_coordinator(this);
  record(fmt::format("zero3 init: {} params, partition {} elements, offload optimizer {} param {}",
                     shards_.size(), partition_numel_, offload_opt, offload_par));
}

// Each param's shard of the flat partition, in params_ order, and the indexes that find it.
void Zero3Optimizer::lay_out_shards(std::int64_t persistence_threshold) {
  for (Parameter* p : params_) {
    Shard s;
    s.p = p;
    s.numel = p->numel();
    s.shard_numel = decide::zero3_shard_numel<std::int64_t>(s.numel, world_);
    s.offset = partition_numel_;
    s.persistent = s.numel <= persistence_threshold;
    partition_numel_ += s.shard_numel;
    index_[p] = shards_.size();
    if (p->id >= 0) {
      if (index_by_id_.size() <= static_cast<std::size_t>(p->id)) index_by_id_.resize(p->id + 1, -1);
      index_by_id_[static_cast<std::size_t>(p->id)] = static_cast<std::int64_t>(shards_.size());
    }
    shards_.push_back(s);
  }
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

// The getter's param.all_gather() (parameter_offload.py:89): Init._all_gather of one param.
void Zero3Optimizer::all_gather(Parameter& p) {
  Shard& s = shard_of(p);
  if (p.ds_status == ZeroStatus::not_available) all_gather_params({&s}, MemCategory::gathered_params, false, GatherVia::init_one);
  if (p.ds_status == ZeroStatus::inflight) finish_gather(s);
}

void Zero3Optimizer::install_hooks(Module& m) {
  m.add_pre_forward_hook([this](Module& mm) {
    if (&mm == &model_) {  // _start_of_forward_hook, registered before the module hooks
      reset_step();
      fwd_stack_.clear();  // a forward that threw left its modules behind
    }
    fwd_stack_.push_back(&mm);
    fetch_sub_module(mm, true);
  }, this);
  m.add_post_forward_hook([this](Module& mm) {
    // FWD_MODULE_STACK.pop(); by identity, so a hand-driven hook out of order pops its own module
    auto it = std::find(fwd_stack_.rbegin(), fwd_stack_.rend(), &mm);
    if (it != fwd_stack_.rend()) fwd_stack_.erase(std::next(it).base());
    release_sub_module(mm, true);
  }, this);
  m.add_pre_backward_hook([this](Module& mm) { fetch_sub_module(mm, false); }, this);
  m.add_post_backward_hook([this](Module& mm) { release_sub_module(mm, false); }, this);
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
// f64, which holds the same small integers exactly in the same 8 bytes. What the trace drives
// (fetch, prefetch, release) is Note [ZeRO-3's parameter coordinator]; a module order that
// departs from the complete trace invalidates it, and the next forward records again.
void Zero3Optimizer::number_modules(const Module& m) {
  module_ids_.emplace(&m, static_cast<double>(module_ids_.size()));
  for (const auto& c : m.children()) number_modules(*c);
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
  clean_inflight();
  if (trace_mode_ != TraceMode::complete) {
    std::vector<double> modules;
    for (const Module* m : submodule_order_) modules.push_back(module_ids_.at(m));
    assert_ints_same_as_other_ranks(modules);
    if (trace_mode_ == TraceMode::record) {  // construct_parameter_trace_from_module_trace
      param_order_.clear();
      for (std::size_t step = 0; step < submodule_order_.size(); ++step) {
        std::vector<std::size_t> mine;
        for (Parameter* p : params_of(*submodule_order_[step])) mine.push_back(static_cast<std::size_t>(find_shard(*p)));
        std::sort(mine.begin(), mine.end());  // sorted by ds_id
        for (std::size_t k : mine) param_order_.push_back({k, static_cast<std::int64_t>(step)});
      }
      std::vector<double> ids, last_used;
      for (const ParamInTrace& e : param_order_) {
        ids.push_back(static_cast<double>(e.shard));
        last_used.push_back(static_cast<double>(e.step));
      }
      assert_ints_same_as_other_ranks(ids);
      assert_ints_same_as_other_ranks(last_used);
      trace_mode_ = TraceMode::complete;
    } else {
      trace_mode_ = TraceMode::record;
    }
  }
  queue_pos_ = 0;
  most_recent_.assign(shards_.size(), kNeverFetched);
  step_id_ = 0;
  n_available_ = 0;
}

// Note [ZeRO-3's parameter coordinator]
// DeepSpeed's PartitionedParameterCoordinator (partitioned_param_coordinator.py), modelled call
// for call, since its all_gathers are the engine's: every module's pre-forward and pre-backward
// hook fetches, its post-forward and post-backward hook releases.
//   - fetch (:353-490): the module's params that are NOT_AVAILABLE in one all_gather (one param:
//     into its own [ceil(numel/W) * W] buffer; several: one flat buffer of every rank's shards,
//     unpacked param by param, partition_parameters.py:1540-1602); none at world 1, where a param
//     is its shard. Then, once the trace is COMPLETE (the second forward on), the queue of
//     (param, step) entries recorded in the first forward and backward: the module's own entries
//     are discarded (a different order is a tracing error), and the next ones are prefetched in
//     one async all_gather while fewer than min(stage3_max_live_parameters - available,
//     stage3_prefetch_bucket_size) elements are chosen (the one that crosses the line included).
//   - release (:494-533): while recording, all the module's params, persistent ones included;
//     once COMPLETE, its non-persistent params that no module within stage3_max_reuse_distance
//     elements of the rest of the trace uses and no prefetch has claimed for a later step, a set
//     computed once per (module, step) and reused (functools.lru_cache); a param is released only
//     when AVAILABLE and used by no other active module. (DeepSpeed never releases a param it
//     marked is_external_param, which only a param returned from a module's forward becomes,
//     parameter_offload.py:386; zerocheck's modules return no params, so it is not modelled.)
//   - post-backward fires only through a grad-requiring positional input (parameter_offload.py
//     :505-517): the models do not run it for a module whose input is data (the root, a first
//     layer), and the backward epilogue releases those modules' params, persistent ones kept
//     (release_backward_leftovers, :554-566).
//   - the step partitions every param (release_and_reset_all) and then all-gathers the persistent
//     ones again (stage3.py:2841, Init._all_gather: one param: one call; more: one call per param,
//     none at world 1). At construction each trainable param is all-gathered once more and
//     partitioned (create_reduce_and_remove_grad_hooks, stage3.py:1504, a single-param gather).
// Counted as DeepSpeed's comm counter counts: each call's output, ceil(numel/W) * W elements of the
// model dtype per param.
void Zero3Optimizer::trace_prologue(Module& m) {
  if (trace_mode_ != TraceMode::complete) return;
  if (submodule_order_.size() <= static_cast<std::size_t>(step_id_) ||
      submodule_order_[static_cast<std::size_t>(step_id_)] != &m) {
    record(fmt::format("zero3: trace invalidated at step {} by module {}", step_id_, m.path()));
    invalidate_trace();
  }
}

void Zero3Optimizer::invalidate_trace() {
  trace_mode_ = TraceMode::invalid;
  submodule_order_.clear();  // _clear_trace_structures
  param_order_.clear();
  queue_pos_ = 0;
  most_recent_.assign(shards_.size(), kNeverFetched);
  clean_inflight();
}

void Zero3Optimizer::clean_inflight() {  // _clean_inflight_param_registry
  std::vector<std::shared_ptr<Gather>> gathers = std::move(inflight_);
  inflight_.clear();
  for (const auto& g : gathers) {
    if (!g->params.empty() && !g->done) finish_gather(*g->params.front());
    for (Shard* s : g->params) release_param(*s);
  }
}

void Zero3Optimizer::fetch_sub_module(Module& m, bool forward) {
  trace_prologue(m);
  if (trace_mode_ == TraceMode::record) submodule_order_.push_back(&m);
  if (!forward && std::find(active_backward_.begin(), active_backward_.end(), &m) == active_backward_.end()) {
    active_backward_.push_back(&m);
  }
  std::vector<Shard*> to_fetch;
  for (Parameter* p : params_of(m)) to_fetch.push_back(&shard_of(*p));
  std::vector<Shard*> missing;
  for (Shard* s : to_fetch) {
    if (s->p->ds_status == ZeroStatus::not_available) missing.push_back(s);
  }
  if (!missing.empty()) all_gather_params(missing, MemCategory::gathered_params, false, GatherVia::coordinator);
  for (Shard* s : to_fetch) {
    if (std::find(s->users.begin(), s->users.end(), &m) == s->users.end()) s->users.push_back(&m);
    if (s->p->ds_status == ZeroStatus::inflight) finish_gather(*s);
    ZC_ASSERT(s->p->ds_status == ZeroStatus::available, "{} not available after its fetch", s->p->name);
  }
  if (trace_mode_ == TraceMode::complete) {
    // Discard the module's own entries from the queue, unless a prefetch took them already.
    std::vector<std::size_t> need, discarded;
    for (Shard* s : to_fetch) {
      const auto k = static_cast<std::size_t>(s - shards_.data());
      if (most_recent_[k] < step_id_ && std::find(need.begin(), need.end(), k) == need.end()) need.push_back(k);
    }
    while (queue_pos_ < param_order_.size() && discarded.size() < need.size()) {
      const ParamInTrace& e = param_order_[queue_pos_++];
      most_recent_[e.shard] = e.step;
      if (std::find(discarded.begin(), discarded.end(), e.shard) == discarded.end()) discarded.push_back(e.shard);
    }
    std::sort(need.begin(), need.end());
    std::sort(discarded.begin(), discarded.end());
    if (need != discarded) {
      throw UsageError(fmt::format("rank {}: ZeRO-3 tracing error at step {}: module {} needs {} params the "
                                   "recorded trace does not have next; the module order changed within a "
                                   "forward/backward", rank_, step_id_, m.path(), need.size()));
    }
    const std::int64_t bucket = cfg_.zero.stage3_prefetch_bucket_size;
    if (bucket > 0) {
      const std::int64_t cap = std::min(cfg_.zero.stage3_max_live_parameters - n_available_, bucket);
      std::vector<Shard*> chosen;
      std::int64_t numel = 0;
      while (queue_pos_ < param_order_.size() && numel < cap) {
        const ParamInTrace& e = param_order_[queue_pos_++];
        Shard& s = shards_[e.shard];
        most_recent_[e.shard] = std::max(most_recent_[e.shard], e.step);
        if (s.p->ds_status == ZeroStatus::not_available &&
            std::find(chosen.begin(), chosen.end(), &s) == chosen.end()) {
          chosen.push_back(&s);
          numel += s.numel;
        }
      }
      if (numel > 0) {
        prefetched_ += static_cast<std::int64_t>(chosen.size());
        all_gather_params(chosen, MemCategory::prefetch, true, GatherVia::coordinator);
      }
    }
  }
  ++step_id_;
}

const std::vector<char>& Zero3Optimizer::params_to_release(Module& m, std::int64_t step) {
  auto [it, fresh] = release_memo_.try_emplace({&m, step});
  if (!fresh) return it->second;
  std::vector<char>& out = it->second;
  out.assign(shards_.size(), 0);
  for (Parameter* p : params_of(m)) {
    const auto k = static_cast<std::size_t>(find_shard(*p));
    if (!shards_[k].persistent && most_recent_[k] <= step) out[k] = 1;
  }
  std::int64_t traversed = 0;
  for (std::size_t t = static_cast<std::size_t>(step); t < submodule_order_.size(); ++t) {
    if (traversed >= cfg_.zero.stage3_max_reuse_distance) break;
    for (Parameter* p : params_of(*submodule_order_[t])) {
      const auto k = static_cast<std::size_t>(find_shard(*p));
      out[k] = 0;
      traversed += shards_[k].numel;
    }
  }
  return out;
}

void Zero3Optimizer::release_sub_module(Module& m, bool forward) {
  const std::vector<char>* memo = trace_mode_ == TraceMode::complete ? &params_to_release(m, step_id_) : nullptr;
  if (!forward) {
    auto it = std::find(active_backward_.begin(), active_backward_.end(), &m);
    if (it != active_backward_.end()) active_backward_.erase(it);
  }
  for (Parameter* p : params_of(m)) {
    Shard& s = shard_of(*p);
    std::erase(s.users, &m);
    const bool listed = memo == nullptr || (*memo)[static_cast<std::size_t>(&s - shards_.data())];
    if (listed) release_param(s);
  }
}

void Zero3Optimizer::release_backward_leftovers() {
  while (!active_backward_.empty()) {
    Module& m = *active_backward_.back();  // popitem(): the last inserted
    active_backward_.pop_back();
    for (Parameter* p : params_of(m)) {
      Shard& s = shard_of(*p);
      std::erase(s.users, &m);
      if (!s.persistent) release_param(s);
    }
  }
}

// __release_param: AVAILABLE and used by no active module -> partitioned.
void Zero3Optimizer::release_param(Shard& s) {
  Parameter& p = *s.p;
  if (p.ds_status != ZeroStatus::available || !s.users.empty()) return;
  p.data = Tensor();
  s.gather_buf = Tensor();
  p.ds_status = ZeroStatus::not_available;
  n_available_ -= s.numel;
}

// The params' shards into full params: one call for one param, one coalesced call (this rank's
// shards in a row, every rank's section in one flat buffer) for several; `via` says who asks
// (GatherVia in the header): whether world 1 issues a call, and whether the coordinator's count of
// available elements grows.
void Zero3Optimizer::all_gather_params(std::vector<Shard*> params, MemCategory why, bool async, GatherVia via) {
  std::sort(params.begin(), params.end());  // by ds_id (shards_ is in param order)
  for (Shard* s : params) {
    ZC_ASSERT(s->p->ds_status == ZeroStatus::not_available, "gather of {} in status {}", s->p->name,
              zero_status_name(s->p->ds_status));
    if (via == GatherVia::coordinator) n_available_ += s->numel;
  }
  if (via == GatherVia::init_many && params.size() > 1) {  // _allgather_params_coalesced: one call each
    for (Shard* s : params) all_gather_params({s}, why, async, via);
    return;
  }
  const bool offload = cfg_.zero.offload_param == OffloadDevice::cpu;
  if (world_ == 1 && via != GatherVia::init_one) {  // _no_gather_coalesced: the shard is the param
    for (Shard* s : params) {
      Parameter& p = *s->p;
      if (offload) {
        s->gather_buf = dev_.alloc(dtype_, {s->numel}, p.name + ".on_device", why);
        cpu_->to_device(s->gather_buf, p.ds_shard.narrow(0, s->numel));
        p.data = s->gather_buf.view(p.shape);
      } else {
        p.data = p.ds_shard.narrow(0, s->numel).view(p.shape);
      }
      p.ds_status = ZeroStatus::available;
    }
    return;
  }
  auto g = std::make_shared<Gather>();
  g->params = params;
  g->why = why;
  if (params.size() == 1) {  // _all_gather_sequential: straight into the param's buffer
    Shard& s = *params.front();
    Tensor src = s.p->ds_shard;
    if (offload) {
      src = dev_.alloc(dtype_, {s.shard_numel}, s.p->name + ".shard_on_device", MemCategory::comm_buffers);
      cpu_->to_device(src, s.p->ds_shard);
    }
    g->in = src;
    s.gather_buf = dev_.alloc(dtype_, {s.shard_numel * world_}, s.p->name + ".gathered", why);
    g->work = comm_.all_gather(s.gather_buf, src, {.async_op = true});
  } else {  // _all_gather_dtype: one flat buffer, gathered in place (Note [ZeRO-3's coalesced gather is in place])
    std::int64_t psz = 0;
    for (Shard* s : params) psz += s->shard_numel;
    g->flat = dev_.alloc(dtype_, {psz * world_}, "allgather_flat", MemCategory::comm_buffers);
    g->in = g->flat.narrow(psz * rank_, psz);
    std::int64_t at = 0;
    for (Shard* s : params) {
      Tensor dst = g->in.narrow(at, s->shard_numel);
      if (offload) {
        cpu_->to_device(dst, s->p->ds_shard);
      } else {
        dev_.copy(dst, s->p->ds_shard);
      }
      at += s->shard_numel;
    }
    g->work = comm_.all_gather(g->flat, g->in, {.async_op = true});
  }
  for (Shard* s : params) {
    s->pending = g;
    s->p->ds_status = ZeroStatus::inflight;
  }
  if (async) {
    inflight_.push_back(g);
  } else {
    finish_gather(*params.front());
  }
}

// Note [ZeRO-3's coalesced gather is in place]
// _all_gather_dtype (partition_parameters.py:1329-1361) allocates one flat buffer of every rank's
// shards, writes this rank's shards into its own slice (torch.cat(..., out=partitions[rank])) and
// all-gathers from that slice in place: no separate input buffer (the engine had one, 1/world of
// the flat more at each coalesced fetch). NCCL takes the in-place form as DeepSpeed passes it.

// Waits for the gather `s` is part of, and makes each of its params AVAILABLE (a coalesced
// gather's params are cut out of the flat buffer: the chunks of ranks whose shard is all real,
// then the partial one).
void Zero3Optimizer::finish_gather(Shard& s) {
  ZC_ASSERT(s.p->ds_status == ZeroStatus::inflight && s.pending, "finish_gather of {} in status {}",
            s.p->name, zero_status_name(s.p->ds_status));
  std::shared_ptr<Gather> g = s.pending;
  g->work->wait();
  g->done = true;
  const std::int64_t psz = g->in.numel();
  std::int64_t col = 0;
  for (Shard* t : g->params) {
    Parameter& p = *t->p;
    if (g->flat.defined()) {
      t->gather_buf = dev_.alloc(dtype_, {t->numel}, p.name + ".gathered", g->why);
      const std::int64_t full = t->numel / t->shard_numel;  // ranks whose chunk is all real
      dev_.copy_2d(t->gather_buf, g->flat.narrow(col, g->flat.numel() - col), full, t->shard_numel,
                   t->shard_numel, psz);
      const std::int64_t rest = t->numel - full * t->shard_numel;
      if (rest > 0) {
        dev_.copy(t->gather_buf.narrow(full * t->shard_numel, rest), g->flat.narrow(full * psz + col, rest));
      }
      col += t->shard_numel;
    }
    p.data = t->gather_buf.narrow(0, t->numel).view(p.shape);
    p.ds_status = ZeroStatus::available;
    t->pending.reset();
  }
  g->work.reset();
  g->in = Tensor();
  g->flat = Tensor();
  std::erase(inflight_, g);
}

// release_and_reset_all, at the start of every step: every param partitioned, persistent included.
void Zero3Optimizer::partition_all_parameters() {
  for (Shard& s : shards_) {
    if (s.p->ds_status == ZeroStatus::inflight) finish_gather(s);
    s.users.clear();
    release_param(s);
  }
  inflight_.clear();
}

// Note [A fetched persistent param is a gathered param]
// A persistent param is re-gathered by _post_step below and then stays gathered: persistent. But
// while the first step records the trace, every module's release partitions its persistent params
// too, and the next fetch gathers them again; those copies live from a fetch to a release, as any
// fetched param does, and count as gathered_params (prefetch when prefetched). Measured on
// DeepSpeed (llama-tiny, ZeRO-3, world 2): step 0's pre-backward fetch of a decoder layer holds its
// flat buffer and the params cut out of it at once, 11,904 B of each; the steps' gathered_params
// peak is those 11,904 B on both sides now (0 on the engine's, which counted them persistent).

// _post_step: persistent_parameters[0].all_gather(persistent_parameters) (Init._all_gather): one
// persistent param is a single gather at any world; several are one call each, none at world 1.
void Zero3Optimizer::gather_persistent_parameters() {
  std::vector<Shard*> persistent;
  for (Shard& s : shards_) {
    if (s.persistent && s.p->ds_status == ZeroStatus::not_available) persistent.push_back(&s);
  }
  if (persistent.empty()) return;
  all_gather_params(persistent, MemCategory::persistent, false,
                    persistent.size() == 1 ? GatherVia::init_one : GatherVia::init_many);
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
