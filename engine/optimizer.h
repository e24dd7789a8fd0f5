// The pieces of an optimizer step shared by every ZeRO stage: DeepSpeed's dynamic loss scaler,
// the base optimizer (Adam/AdamW/SGD) over an f32 flat partition with its states, and the
// unscale-and-clip factor (SPEC 4: combined = loss_scale * max(1, (norm/loss_scale + 1e-6)/clip)).
#pragma once

#include "engine/config.h"
#include "engine/device.h"

#include <utility>
#include <vector>

namespace zc {

// Which of DeepSpeed's two dynamic loss scalers (Note [Loss scalers] in engine/optimizer.cpp).
enum class LossScalerKind : std::uint8_t {
  dynamic_loss_scaler,  // ZeRO-1/2/3: runtime/fp16/loss_scaler.py DynamicLossScaler
  fp16_optimizer,       // stage 0: FP16_Optimizer's and FP16_UnfusedOptimizer's own _update_scale
};

// DeepSpeed's dynamic loss scale, or a static scale.
class LossScaler {
 public:
  explicit LossScaler(const Config& cfg, LossScalerKind kind = LossScalerKind::dynamic_loss_scaler);
  double cur_scale() const { return cur_scale_; }
  bool dynamic() const { return dynamic_; }
  // Halves on overflow (DynamicLossScaler: after `hysteresis` overflows), clamped to
  // min_loss_scale, and doubles after `loss_scale_window` clean iterations. DynamicLossScaler
  // throws TrainingError at an overflow it would halve with the scale already at its minimum.
  void update_scale(bool overflow);
  int cur_hysteresis() const { return cur_hysteresis_; }

 private:
  LossScalerKind kind_;
  bool dynamic_;
  double cur_scale_;
  double min_scale_ = 1.0;
  double scale_factor_ = 2.0;
  int scale_window_ = 1000;
  int delayed_shift_ = 2;
  int cur_hysteresis_ = 2;
  bool consecutive_hysteresis_ = false;
  std::int64_t cur_iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
};

// A flat f32 state an optimizer keeps per element, as DeepSpeed's safe_get_full_fp32_param and
// safe_get_full_optimizer_state name them. SGD's momentum buffer is its exp_avg slot.
enum class OptimizerState { fp32_master, exp_avg, exp_avg_sq };

// The base optimizer on one f32 flat tensor (a partition of the master params). `segments`
// ({offset, length}) are the tensors DeepSpeed's optimizer steps one by one (each param at stage 0
// in fp32, else the whole flat partition); a kernel's vector tail is per tensor.
class BaseOptimizer {
 public:
  using Segments = std::vector<std::pair<std::int64_t, std::int64_t>>;
  BaseOptimizer(const OptimizerConfig& cfg, Device& dev, std::int64_t numel, const std::string& label,
                int adam_simd_width, Segments segments = {});
  // master -= update(grad); grad is f32 [numel], already unscaled and clipped. An engine step
  // (`engine_step`) takes the scheduled learning rate and advances the schedule; FP16_Optimizer's
  // dummy step at construction runs before DeepSpeed builds the scheduler, at the config's lr.
  void step(const Tensor& master, const Tensor& grad, bool engine_step = true);
  // The same step with each segment's grad its own tensor ([length] f32, in segment order).
  void step(const Tensor& master, const std::vector<Tensor>& segment_grads, bool engine_step = true);
  // The same step with each segment's master its own tensor too: the torch optimizer over a
  // stage-0 fp32 model's params, which steps them and their .grad tensors where they are.
  void step(const std::vector<Tensor>& segment_masters, const std::vector<Tensor>& segment_grads,
            bool engine_step = true);
  std::int64_t steps() const { return steps_; }
  const Tensor& exp_avg() const { return state_a_; }
  const Tensor& exp_avg_sq() const { return state_b_; }
  // exp_avg or exp_avg_sq as DeepSpeed's optimizer keeps it: undefined where it keeps none (SGD
  // has no exp_avg_sq, and no momentum buffer at momentum 0: torch.optim.SGD's momentum_buffer
  // stays None, and so no memory), and before the first step, which creates them (Note [Lazy
  // optimizer state]).
  Tensor state(OptimizerState what) const;

 private:
  void create_states();
  OptimizerConfig cfg_;
  Device& dev_;
  Tensor state_a_;  // [numel] f32: Adam exp_avg, or SGD momentum buffer
  Tensor state_b_;  // [numel] f32: Adam exp_avg_sq
  std::int64_t numel_ = 0;
  std::string label_;
  std::int64_t steps_ = 0;  // 0: the states are not created yet
  std::int64_t engine_steps_ = 0;  // applied engine steps: the lr schedule's position
  int adam_simd_width_;
  Segments segments_;
  // DeepSpeed's Adam_Optimizer::IncrementStep: beta^step as a running f32 product.
  float beta1_pow_ = 1.0f;
  float beta2_pow_ = 1.0f;
};

// The factor every gradient is divided by before the update (the gradient is then multiplied by
// 1/combined rounded to f32; for an f32 combined that is f32's own division). DeepSpeed computes it
// with torch ops on its norm tensor: f32 at ZeRO-1/2 and at ZeRO-3 under offload_optimizer
// (stage_1_and_2.py and stage3.py unscale_and_clip_grads), f64 at ZeRO-3 otherwise (the norm is
// a double tensor there).
// The learning rate of applied engine step `engine_step` (0-based) under cfg.schedule, as
// DeepSpeed computes it: the scheduler sets min_lr at construction (last_batch_iteration -1) and
// steps after each applied step, so step k runs at get_lr() for iteration k - 1. Python's float
// arithmetic in its order (double, no FMA); the kernels take the result as f32, as DeepSpeed's do.
double scheduled_lr(const OptimizerConfig& cfg, std::int64_t engine_step);

double combined_unscale_factor(double loss_scale, double global_norm_scaled, double clip, DType compute = DType::f64);

}  // namespace zc
