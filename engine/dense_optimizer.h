// DenseOptimizer: stage 0's optimizers (a plain fp32 optimizer; FP16_Optimizer for fp16 and, as
// DeepSpeed's DDP_BFLOAT16, for bf16: 16-bit .grad accumulation and a dummy step at construction)
// and the BF16_Optimizer wrapper that DeepSpeed uses for ZeRO-1 + bf16 + fp32 gradient
// accumulation without offload. Grads are all-reduced at the accumulation boundary in buckets
// (engine.buffered_allreduce_fallback); the wrapper's bf16 grads are accumulated in an fp32 flat
// buffer by the grad hooks and the 16-bit grads dropped.
#pragma once

#include "engine/flat_layout.h"
#include "engine/zero_optimizer.h"

namespace zc {

class DenseOptimizer final : public ZeroOptimizer {
 public:
  // zero1_bf16_wrapper: the ZeRO-1 BF16_Optimizer (optimizer state partitioned over the world).
  DenseOptimizer(const Config& cfg, Module& model, Device& dev, Comm& comm, const Options& opts,
                 bool zero1_bf16_wrapper);

  std::string_view name() const override;
  void on_grad_ready(Parameter& p) override;
  void allreduce_gradients() override;
  bool step() override;
  void zero_grad() override;
  std::vector<Tensor> averaged_gradients() override;
  std::vector<Tensor> master_partitions() override;
  std::vector<double> gathered_grads() override;

 protected:
  StepPlan step_plan() const override;
  StepPrep prepare_step() override;
  void update(const Tensor& grads32, double norm, double combined) override;
  double norm_sum_sq(const StepPrep& prep) override;
  const BaseOptimizer& base_optimizer() const override { return *base_; }
  std::vector<double> gather_f32_partition(const Tensor& src) override {
    return gather_flat_partition(layout_, partitioned_ ? rank_ : 0, partitioned_, src);
  }

 private:
  void require_grads() const;  // a UsageError naming step() without backward()
  // The base optimizer's step on grads32 ([partition_numel] f32, unscaled and clipped), the
  // 16-bit params' refresh, and the trace record ending in `how`.
  void finish_step(const Tensor& grads32, std::string_view how);
  Tensor grads_flat();  // [padded] accumulation dtype: the reduced grads, flattened
  float torch_sum_of_norms_squared(const std::vector<Tensor>& grads);
  float clip_grad_norm_coef(const std::vector<Tensor>& grads);  // DeepSpeed's clip_grad_norm_ (fp32, no ZeRO)
  std::vector<Tensor> per_param(const Tensor& flat) const;  // each param's slice of a flat at the layout's offsets
  void buffered_allreduce();
  // engine.allreduce_bucket: the sum and its scaling (Note [Stage 0 post-scaling]).
  void allreduce_bucket(const Tensor& t);

  bool partitioned_;
  bool use_hp_;  // the ZeRO-1 BF16_Optimizer wrapper: fp32 "hp" grads accumulated by hooks
  // A 16-bit stage-0 model whose base optimizer is not DeepSpeed's FusedAdam (SGD, torch_adam):
  // FP16_UnfusedOptimizer (engine.py _configure_fp16_optimizer), which steps fp32 copies of the
  // params one by one and takes the norm per param. Else FP16_Optimizer, over one flat tensor.
  bool unfused_;
  // FP16_UnfusedOptimizer without partitioning: grads_flat() is the fp32 copies' grads themselves.
  bool grads_are_fp32_copies() const { return unfused_ && !partitioned_; }
  int world_, rank_;
  FlatLayout layout_;
  Tensor flat_;    // [padded] model dtype; params are views (none when masters_are_params())
  Tensor hp_;      // [padded] f32 when use_hp_
  Tensor master_;  // [partition_numel] f32 (none when masters_are_params(): the params are)
  bool masters_are_params() const;
  std::unique_ptr<BaseOptimizer> base_;
  bool reduced_ = false;
  bool have_grads_ = false;  // a backward produced grads since the last step
};

// engine.buffered_allreduce_fallback's bucket: DeepSpeed's MEMORY_OPT_ALLREDUCE_SIZE elements.
inline constexpr std::int64_t kMemoryOptAllreduceSize = 500'000'000;

}  // namespace zc
