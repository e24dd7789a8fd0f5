// Zero12Optimizer: DeepSpeed's DeepSpeedZeroOptimizer for stages 1 and 2 (SPEC 4), one flat group.
// Invariants: each param's grad is reduced at most once per epilogue cycle ("gradient computed
// twice" otherwise); a bucket buffer is written only after its previous reduction was waited; the
// partition accumulator is set by the first epilogue of a step and added to by later ones.
#pragma once

#include "engine/flat_layout.h"
#include "engine/offload.h"
#include "engine/zero_optimizer.h"

#include <map>
#include <optional>

namespace zc {

class Zero12Optimizer final : public ZeroOptimizer {
 public:
  Zero12Optimizer(const Config& cfg, Module& model, Device& dev, Comm& comm, const Options& opts,
                  ParamSelect select = ParamSelect::all);

  std::string_view name() const override { return "DeepSpeedZeroOptimizer"; }
  void clear_backward_seen_flag() override;
  void share_staging_from(ZeroOptimizer& first) override;
  void on_grad_ready(Parameter& p) override;
  void allreduce_gradients() override;
  void backward_epilogue() override;
  void zero_grad() override;
  std::vector<Tensor> averaged_gradients() override;
  std::vector<Tensor> master_partitions() override { return {master_}; }
  std::vector<double> gathered_grads() override;
  bool supports_coalescing() const override { return true; }
  void flush_coalesced_reduction() override;

  const FlatLayout& layout() const { return layout_; }
  const OffloadStats* offload_stats() const override { return cpu_ ? &cpu_->stats() : nullptr; }

 protected:
  StepPlan step_plan() const override;
  StepPrep prepare_step() override;
  double norm_sum_sq(const StepPrep& prep) override;
  bool grads_have_inf_nan(const StepPrep& prep) override;
  void flatten_grads(StepPrep& prep) override;
  void skip_step() override;
  void update(const Tensor& grads32, double norm, double combined) override;
  const BaseOptimizer& base_optimizer() const override { return *base_; }
  std::vector<double> gather_f32_partition(const Tensor& src) override {
    return gather_flat_partition(layout_, rank_, true, src);
  }

 private:
  // DeepSpeed's names for the steps of the coalesce flush (SPEC 6).
  void setup_buckets();
  void reduce_ready_partitions_and_remove_grads(int i);
  void independent_gradient_partition_epilogue();
  void wait_reduction_stream();
  bool has_gradient_for_reduction(int i) const;
  int num_params() const { return static_cast<int>(params_.size()); }
  struct Slice {
    int dst;  // owning partition
    std::int64_t at, numel;
    int param;  // the param it is a slice of (merged slices: the first one's)
  };
  // One allreduce_and_scatter chunk (Note [The bucket all-reduce's flat]): its slices copied into
  // a flat of their own, that flat's comm-dtype image (the flat itself where the dtypes agree), and
  // the slices with their positions in the bucket, in flat order.
  struct Chunk {
    Tensor flat, comm;
    std::vector<Slice> slices;
  };
  struct Pending {  // an issued reduction and what to do once it completes
    std::vector<WorkPtr> works;
    std::vector<Chunk> chunks;  // the bucket all-reduce's, completed once `works` are waited
    Tensor bucket;              // what the chunks' own slices are copied back into
    std::vector<int> params;
    int buffer = -1;  // ipg buffer index, -1 when not a bucket buffer
    std::vector<std::pair<Tensor, Tensor>> copy_back;  // (destination, source) after wait
    Tensor post_scale;  // reduce_scatter false: scaled after the sum (Note [Stage 0 post-scaling])
    Tensor reduced;     // the result in the comm dtype, in bucket order (Note [The communication dtype])
  };

  void reduce_gradients();  // stage 1 at the boundary
  void reduce_independent_p_g_buckets_and_remove_grads(int i);
  void reduce_ipg_grads();
  // Reduce as DeepSpeed's path does: `fallback` (buffered_reduce_fallback, the non-contiguous
  // path): pre-divide by the world, one all_reduce; reduce_scatter false
  // (gradient_reduction_w_predivide): one all_reduce, then the post-scaling of Note [Stage 0
  // post-scaling] once it completes; else pre-divide and average_tensor's slices
  // per owning partition, all-reduced in chunks that close once past reduce_bucket_size
  // (allreduce_and_scatter), or reduced to each owner (use_multi_rank_bucket_allreduce false).
  Pending average_tensor(const Tensor& flat, std::vector<int> params, bool fallback = false);
  std::vector<Slice> bucket_slices(const std::vector<int>& params) const;
  // Issue one chunk's all-reduce; without overlap_comm it completes (and is freed) here.
  void allreduce_chunk(Pending& pend, std::vector<Slice> slices, std::int64_t numel);
  void complete_chunk(const Tensor& bucket, const Chunk& c);
  void copy_or_cast(const Tensor& dst, const Tensor& src);
  void keep_comm_result(int i, const Tensor& result, std::int64_t at);
  void finish(Pending& p);
  void wait_buffer(int index);
  void wait_all();
  void copy_grads_in_partition(int i);
  void async_accumulate_grad_in_cpu_via_gpu(int i);
  void async_inplace_copy_grad_to_fp32_buffer_from_gpu(int i);
  std::pair<std::int64_t, std::int64_t> partition_slice(int i) const;  // (offset in param, length)
  Tensor gradient_for_reduction(int i);
  void fill_grad_accum(Parameter& p);
  void accumulate_partition();
  void build_averaged();
  Tensor flatten_averaged();  // [partition_numel] accum dtype: averaged_parts_ in one tensor, for the step
  void copy_averaged_into(const Tensor& dst);  // averaged_parts_ end to end into dst [partition_numel]
  void release_ipg_buffers();
  void reset_accumulators();
  void check_partition_buffers() const;  // Note [Coverage at step time]

  int world_, rank_;
  bool partition_gradients_, overlap_, contiguous_, use_accum_attr_, has_hooks_;
  // DeepSpeed 0.19.8's compact fp32 grad-partition buffer (_use_compact_grad_partition_buffer: a
  // 16-bit model with fp32 grad_accum_dtype): every reduction adds into one fp32 partition that
  // only step() clears, so implicit-boundary backwards SUM there, with or without offload.
  bool compact_;
  // _gradient_reduction_buffer_dtype: the ipg buffers hold grad_accum_dtype at stage 1 with a
  // separate accumulator (grad_accum read as it is), else the model dtype.
  DType buffer_dtype_;
  // By param: this backward's reduced grad in the comm dtype, where the compact partition adds it
  // instead of the cast-back grad (comm dtype != buffer dtype).
  std::vector<Tensor> compact_src_;
  std::int64_t bucket_size_;
  FlatLayout layout_;
  Tensor flat_;    // [padded] model dtype; every param's data is a view
  Tensor master_;  // [partition_numel] f32: this rank's master partition
  std::unique_ptr<BaseOptimizer> base_;
  std::vector<int> in_partition_;        // param indices in this rank's partition
  std::vector<char> is_in_partition_;    // by param index
  std::vector<std::int64_t> partition_pos_;  // by param index: offset in grads_in_partition
  std::int64_t grads_in_partition_numel_ = 0;
  Tensor grads_in_partition_;            // [sum of numels in partition] model dtype
  std::vector<Tensor> accum_;            // per in_partition_ param, accum dtype ("all_grad_tensors")
  bool accum_set_ = false;
  // Note [averaged_gradients are views]: this rank's partition as views of accum_ (and a zero tail
  // where the partition is padding), set at the boundary; flattened into averaged_ by the step.
  std::vector<Tensor> averaged_parts_;
  std::vector<Tensor> grad_norms_;  // get_grad_norm_direct's all_norms: 0-dim f64 each, norm to flatten
  Tensor global_grad_norm_;         // _global_grad_norm: 0-dim f32, from a step to the next
  Tensor last_global_grad_norm_;    // the last step's, which the engine holds until its step ends
  Tensor scaled_global_norm_;       // step()'s scaled_global_grad_norm: 0-dim f32, to its return
  Tensor averaged_;                      // [partition_numel] accum dtype, from prepare_step to update
  // The ipg bucket.
  std::int64_t bucket_capacity_ = 0;     // reduce_bucket_size, as DeepSpeed allocates it
  std::vector<Tensor> buffers_;          // 1, or 2 with contiguous + overlap_comm
  int bucket_index_ = 0;
  std::int64_t bucket_elements_ = 0;
  std::vector<int> bucket_params_;
  std::vector<Tensor> bucket_grads_;     // non-contiguous path
  int extra_large_ = -1;
  std::vector<char> already_reduced_;
  std::vector<Pending> pending_;         // overlap_comm: FIFO of issued reductions
  bool ready_for_gradients_ = false;
  bool epilogue_ran_ = false;
  // CPU offload (offload_optimizer): master, optimizer state and fp32 grads live on the CPU.
  bool cpu_offload_ = false;
  std::optional<CpuSpace> cpu_;
  Tensor fp32_grad_cpu_;                     // [partition_numel] f32 on the CPU
  // Note [ZeRO-1/2 offload's staging buffers]
  // DeepSpeed keeps three for the optimizer's life (stage_1_and_2.py:567-575, :653-661): the
  // updated partition in the model dtype on the CPU (param_buffer_of_bit16_for_cpu_offload_groups,
  // one per group: the step casts the fp32 master into it, then copies it to the device), and the
  // largest param's numel in the model dtype, once on the CPU (temp_grad_buffer_for_cpu_offload,
  // pinned and never read) and once on the device (temp_grad_buffer_for_gpu_offload, where a
  // backward after the first brings a param's CPU running sum back). One largest-param pair for
  // the whole model: the instance that is not MoE's expert group holds it.
  Tensor bit16_buffer_cpu_;  // [partition_numel] model dtype on the CPU
  Tensor temp_grad_cpu_;     // [largest param numel] model dtype on the CPU
  Tensor temp_grad_gpu_;     // [largest param numel] model dtype on the device
  std::map<int, Tensor> accumulated_grads_in_cpu_;  // per param: [numel] model dtype on the CPU
  std::map<int, Tensor> norm_for_param_grads_;      // per param: its piece's 0-dim f64 norm
  void keep_offload_piece_norm(int i, const Tensor& piece);
  bool offload_grads_ready_ = false;
};

}  // namespace zc
