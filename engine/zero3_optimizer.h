// Zero3Optimizer: DeepSpeed's DeepSpeedZeroOptimizer_Stage3 (SPEC 5). Every param is padded to a
// multiple of the world and sharded; module hooks fetch a module's params before its forward and
// backward (NOT_AVAILABLE -> INFLIGHT -> AVAILABLE) and release them after, as DeepSpeed's
// PartitionedParameterCoordinator does: one coalesced all_gather per fetch, the recorded trace's
// prefetch once it is complete, releases by trace mode and persistence (Note [ZeRO-3's parameter
// coordinator] in zero3_optimizer.cpp). Grads are reduce-scattered in ipg buckets (divide by
// world first) and partition_grads copies into the rank's grad partition when micro_step_id == 0
// and adds otherwise; ranks whose slice is padding only skip.
// It is the tree's ParamCoordinator: ParamDict::get gathers a NOT_AVAILABLE param read in an
// eager forward through it, registered as external on the innermost module in forward.
// A param used by several modules (aliases, external params) keeps the set of its active users
// (DeepSpeed's ds_active_sub_modules) and is released only when none is left.
// Invariants: outside a forward/backward only shards and params the coordinator keeps (persistent
// ones, and those a complete trace reuses) are held; a param is released only when AVAILABLE;
// micro_step_id is 0 at the first reduction of a step; the step leaves exactly the persistent
// params gathered.
#pragma once

#include "engine/offload.h"
#include "engine/zero_optimizer.h"

#include <map>
#include <optional>

namespace zc {

class Zero3Optimizer final : public ZeroOptimizer, public ParamCoordinator {
 public:
  Zero3Optimizer(const Config& cfg, Module& model, Device& dev, Comm& comm, const Options& opts);
  ~Zero3Optimizer() override;

  std::string_view name() const override { return "DeepSpeedZeroOptimizer_Stage3"; }
  void clear_backward_seen_flag() override;
  void on_grad_ready(Parameter& p) override;
  void allreduce_gradients() override { independent_gradient_partition_epilogue(); }
  void zero_grad() override;
  std::vector<Tensor> averaged_gradients() override;
  std::vector<Tensor> master_partitions() override { return {master_}; }
  std::vector<double> gathered_grads() override;
  bool supports_coalescing() const override { return true; }
  void flush_coalesced_reduction() override;
  void backward_epilogue() override { release_backward_leftovers(); }
  // ---- ParamCoordinator ----
  const BugSet& bugs() const override { return opts_.bugs; }
  Module& current_module() override;
  // A param used by `module` although another module owns it: gathered in module's hooks too.
  // Recorded on the module (Module::add_external_param). UsageError for an unmanaged param.
  void register_external_parameter(Module& module, Parameter& p) override;
  void all_gather(Parameter& p) override;
  // Gathers every param (for full_params); leaves them as they were.
  std::optional<std::vector<double>> gathered_params() override;
  const OffloadStats* offload_stats() const override { return cpu_ ? &cpu_->stats() : nullptr; }
  std::int64_t partition_numel() const { return partition_numel_; }
  std::int64_t prefetched() const { return prefetched_; }  // gathers started ahead of use

 protected:
  StepPlan step_plan() const override;
  StepPrep prepare_step() override;
  double norm_sum_sq(const StepPrep& prep) override;
  void flatten_grads(StepPrep& prep) override;
  void skip_step() override;
  void update(const Tensor& grads32, double norm, double combined) override;
  void post_step() override;
  const BaseOptimizer& base_optimizer() const override { return *base_; }
  std::vector<double> gather_f32_partition(const Tensor& src) override;

 private:
  void reduce_ready_partitions_and_remove_grads(Parameter& p);
  void independent_gradient_partition_epilogue();
  struct Gather;
  struct Shard {
    Parameter* p = nullptr;
    std::int64_t numel = 0;
    std::int64_t shard_numel = 0;  // ceil(numel / world)
    std::int64_t offset = 0;       // position in the rank's flat partition
    bool persistent = false;       // ds_persist
    std::vector<const Module*> users;  // ds_active_sub_modules: modules fetched, not yet released
    std::shared_ptr<Gather> pending;   // the all_gather it is part of while INFLIGHT
    Tensor gather_buf;             // the full param while AVAILABLE (empty at world 1: ds_shard)
  };
  // One all_gather of one or more params (DeepSpeed's AllGatherHandle / AllGatherCoalescedHandle):
  // waiting for any of them makes them all AVAILABLE.
  struct Gather {
    WorkPtr work;
    Tensor in, flat;  // coalesced: this rank's shards in a row, and [world * their sum]
    std::vector<Shard*> params;
    MemCategory why = MemCategory::gathered_params;
    bool done = false;
  };
  struct Pending {
    WorkPtr work;
    std::vector<Shard*> params;
    Tensor in;   // [world * sum of shard_numel] the input: must live until the op completes
    Tensor out;  // [sum of shard_numel] reduce-scatter output, model dtype
  };

  void install_hooks(Module& m);
  // PartitionedParameterCoordinator.reset_step's trace checks (Note [ZeRO-3's trace checks]).
  void reset_step();
  void number_modules(const Module& m);
  void assert_ints_same_as_other_ranks(const std::vector<double>& ints);
  // Note [ZeRO-3's parameter coordinator]
  void trace_prologue(Module& m);
  void invalidate_trace();
  void fetch_sub_module(Module& m, bool forward);
  void release_sub_module(Module& m, bool forward);
  void release_backward_leftovers();
  const std::vector<char>& params_to_release(Module& m, std::int64_t step);
  // Who asks for a gather, which decides the world-1 call and the count of available elements:
  enum class GatherVia : std::uint8_t {
    coordinator,  // all_gather_coalesced: no call at world 1; counted in __n_available_params
    init_one,     // Init._all_gather of one param (_allgather_params_sequential): a call at any world
    init_many,    // Init._all_gather of several (_allgather_params_coalesced): one call each, none at world 1
  };
  void all_gather_params(std::vector<Shard*> params, MemCategory why, bool async, GatherVia via);
  // `why` is what the gathered buffers count as (Note [A fetched persistent param is a gathered
  // param]): gathered_params or prefetch for the coordinator's fetches, persistent for _post_step's.
  void finish_gather(Shard& s);
  void release_param(Shard& s);
  void partition_all_parameters();
  void gather_persistent_parameters();
  void clean_inflight();
  void reduce_independent_p_g_buckets_and_remove_grads(Shard& s);
  void reduce_and_partition_ipg_grads();
  void finish(Pending& pend);
  void partition_grads(const std::vector<Shard*>& params, const Tensor& out);
  void wait_all();
  Shard& shard_of(const Parameter& p);
  std::vector<double> gather_partitions(const Tensor& mine);
  // its own managed params, then its aliases and external ones (Note [Shared params])
  std::vector<Parameter*> params_of(Module& m);
  void check_external_params(Module& m);

  int world_, rank_;
  bool overlap_, contiguous_;
  std::int64_t bucket_size_, partition_numel_ = 0;
  std::vector<Shard> shards_;
  Tensor global_grad_norm_;       // step()'s _global_grad_norm: 0-dim, in the norm's dtype, to the next step
  Tensor last_global_grad_norm_;  // the last step's, which the engine holds until its step ends
  std::map<const Parameter*, std::size_t> index_;
  std::vector<std::int64_t> index_by_id_;  // Parameter::id -> shard, -1: none (index_'s fast path)
  // The shard index of p, or -1 when ZeRO-3 does not manage p.
  std::int64_t find_shard(const Parameter& p) const;
  void lay_out_shards(std::int64_t persistence_threshold);
  std::optional<CpuSpace> cpu_;  // offload_optimizer / offload_param
  Tensor fp16_partition_;  // [partition_numel] model dtype: every param's ds_shard is a view
  // DeepSpeed's overflow flag (stage3.py:335, a 1-element bool on the optimizer's device, held for
  // the optimizer's life): its byte, which every figure after construction counts.
  Tensor inf_or_nan_tracker_;
  Tensor master_;          // [partition_numel] f32 (cpu with offload_optimizer)
  Tensor grad_partition_;  // [partition_numel] accum dtype ("__param_id_to_grad_partition")
  Tensor fp32_grad_cpu_;   // [partition_numel] f32, offload_optimizer only
  std::unique_ptr<BaseOptimizer> base_;
  std::int64_t bucket_capacity_ = 0;
  Tensor bucket_;          // [capacity] communication dtype (contiguous_gradients)
  std::int64_t bucket_elements_ = 0;
  std::vector<Shard*> bucket_params_;
  std::vector<char> already_reduced_;
  std::vector<Pending> pending_;
  std::vector<Module*> fwd_stack_;  // FWD_MODULE_STACK: modules whose forward is running
  bool epilogue_ran_ = false;
  bool any_partitioned_grads_ = false;
  std::int64_t prefetched_ = 0;
  // The trace DeepSpeed records, checks across ranks and prefetches from (Note [ZeRO-3's trace
  // checks], Note [ZeRO-3's parameter coordinator]).
  enum class TraceMode { invalid, record, complete };
  TraceMode trace_mode_ = TraceMode::invalid;
  std::map<const Module*, double> module_ids_;  // DeepSpeed's ds_id: the module's pre-order index
  std::vector<Module*> submodule_order_;  // fetches recorded in RECORD mode (forward and backward)
  struct ParamInTrace {
    std::size_t shard = 0;
    std::int64_t step = 0;  // step_id_last_used_at
  };
  std::vector<ParamInTrace> param_order_;  // frozen at RECORD -> COMPLETE
  std::size_t queue_pos_ = 0;              // __param_queue: param_order_[queue_pos_..]
  std::vector<std::int64_t> most_recent_;  // __most_recent_step_id_param_fetched_for, by shard
  std::int64_t step_id_ = 0;
  std::int64_t n_available_ = 0;           // __n_available_params (full numels)
  std::vector<Module*> active_backward_;   // __active_backward_submodules, in insertion order
  std::map<std::pair<const Module*, std::int64_t>, std::vector<char>> release_memo_;  // lru_cache
  std::vector<std::shared_ptr<Gather>> inflight_;  // __inflight_param_registry's handles
};

}  // namespace zc
