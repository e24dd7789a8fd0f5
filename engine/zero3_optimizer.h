// Zero3Optimizer: DeepSpeed's DeepSpeedZeroOptimizer_Stage3 (SPEC 5). Every param is padded to a
// multiple of the world and sharded; module hooks all-gather a module's params before its forward
// and backward (NOT_AVAILABLE -> INFLIGHT -> AVAILABLE) and release them after, except persistent
// params (numel <= stage3_param_persistence_threshold). Grads are reduce-scattered in ipg buckets
// (divide by world first) and partition_grads copies into the rank's grad partition when
// micro_step_id == 0 and adds otherwise; ranks whose slice is padding only skip.
// It is the tree's ParamCoordinator: ParamDict::get gathers a NOT_AVAILABLE param read in an
// eager forward through it, registered as external on the innermost module in forward.
// A param used by several modules (aliases, external params) counts its active users
// (DeepSpeed's ds_active_sub_modules) and is released when the last one releases it.
// Invariants: outside a module's forward/backward only shards and persistent params are held; a
// param is released only when AVAILABLE; micro_step_id is 0 at the first reduction of a step.
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
  void skip_step() override;
  void update(const Tensor& grads32, double norm, double combined) override;
  const BaseOptimizer& base_optimizer() const override { return *base_; }
  std::vector<double> gather_f32_partition(const Tensor& src) override;

 private:
  void reduce_ready_partitions_and_remove_grads(Parameter& p);
  void independent_gradient_partition_epilogue();
  struct Shard {
    Parameter* p = nullptr;
    std::int64_t numel = 0;
    std::int64_t shard_numel = 0;  // ceil(numel / world)
    std::int64_t offset = 0;       // position in the rank's flat partition
    bool persistent = false;
    int active = 0;                // modules whose hooks fetched it and have not released it
    WorkPtr inflight;              // the pending gather while INFLIGHT
    Tensor gather_buf;             // [shard_numel * world] model dtype
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
  void record_fetch(Module& m);
  void number_modules(const Module& m);
  void assert_ints_same_as_other_ranks(const std::vector<double>& ints);
  void fetch_module(Module& m);
  void release_module(Module& m);
  void prefetch_after(Module& m);
  void begin_gather(Shard& s, MemCategory why);
  void finish_gather(Shard& s);
  void release(Shard& s);
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
  std::map<const Parameter*, std::size_t> index_;
  std::vector<std::int64_t> index_by_id_;  // Parameter::id -> shard, -1: none (index_'s fast path)
  // The shard index of p, or -1 when ZeRO-3 does not manage p.
  std::int64_t find_shard(const Parameter& p) const;
  std::optional<CpuSpace> cpu_;  // offload_optimizer / offload_param
  Tensor fp16_partition_;  // [partition_numel] model dtype: every param's ds_shard is a view
  Tensor master_;          // [partition_numel] f32 (cpu with offload_optimizer)
  Tensor grad_partition_;  // [partition_numel] accum dtype ("__param_id_to_grad_partition")
  Tensor fp32_grad_cpu_;   // [partition_numel] f32, offload_optimizer only
  std::unique_ptr<BaseOptimizer> base_;
  std::int64_t bucket_capacity_ = 0;
  Tensor bucket_;          // [capacity] model dtype (contiguous_gradients)
  std::int64_t bucket_elements_ = 0;
  std::vector<Shard*> bucket_params_;
  std::vector<char> already_reduced_;
  std::vector<Pending> pending_;
  std::vector<Module*> fwd_order_, last_fwd_order_;  // module pre-forward order, for prefetch
  std::vector<Module*> fwd_stack_;  // FWD_MODULE_STACK: modules whose forward is running
  bool epilogue_ran_ = false;
  bool any_partitioned_grads_ = false;
  std::int64_t prefetched_ = 0;
  // The trace DeepSpeed records and checks across ranks (Note [ZeRO-3's trace checks]).
  enum class TraceMode { invalid, record, complete };
  TraceMode trace_mode_ = TraceMode::invalid;
  std::map<const Module*, double> module_ids_;  // DeepSpeed's ds_id: the module's pre-order index
  std::vector<Module*> submodule_order_;  // fetches recorded in RECORD mode (forward and backward)
};

}  // namespace zc
