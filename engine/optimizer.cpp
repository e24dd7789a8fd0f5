// Loss scaling, the base optimizer and the clip factor.
#include "engine/optimizer.h"

#include "engine/errors.h"

#include <cmath>

namespace zc {

// Note [Loss scalers]
// DeepSpeed 0.19.8 has two dynamic loss scalers, and both update before the unscale:
//   - ZeRO-1/2/3 (stage_1_and_2.py:722, stage3.py:524) build loss_scaler.py's DynamicLossScaler
//     with raise_error_at_min_scale left True: an overflow spends the hysteresis first, then
//     halves, clamped to min_loss_scale; one that would halve a scale already at the minimum
//     raises "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
//     (loss_scaler.py:257). hysteresis and consecutive_hysteresis act here only.
//   - stage 0's FP16_Optimizer and FP16_UnfusedOptimizer (fused_optimizer.py:404,
//     unfused_optimizer.py:277) keep their own: every overflow halves, clamped, never raises, and
//     the config's hysteresis is not read.
// Both double the scale after loss_scale_window clean iterations, and the step unscales with the
// scale after that update (stage_1_and_2.py:3047 then unscale_and_clip_grads reads
// self.loss_scale; stage3.py _loss_scale_update_and_overflow_cleanup; fused_optimizer.py
// _update_scale(False) before unscale_and_clip_grads): the step that doubles the scale divides
// its gradients by the doubled one (zero_optimizer.cpp step_param_groups). From the source only:
// DeepSpeed refuses fp16 on this CPU, so no reference run checks it.
LossScaler::LossScaler(const Config& cfg, LossScalerKind kind) : kind_(kind) {
  const Fp16Config& f = cfg.fp16;
  dynamic_ = f.enabled && f.loss_scale == 0.0;
  if (!f.enabled) {
    cur_scale_ = 1.0;  // bf16 and fp32 do not scale
  } else if (!dynamic_) {
    cur_scale_ = f.loss_scale;
  } else {
    cur_scale_ = std::ldexp(1.0, f.initial_scale_power);
    min_scale_ = f.min_loss_scale;
    scale_window_ = f.loss_scale_window;
    delayed_shift_ = f.hysteresis;
    cur_hysteresis_ = f.hysteresis;
    consecutive_hysteresis_ = f.consecutive_hysteresis;
  }
}

void LossScaler::update_scale(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (kind_ == LossScalerKind::fp16_optimizer || delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      if (kind_ == LossScalerKind::dynamic_loss_scaler && cur_scale_ == min_scale_) {
        throw TrainingError(fmt::format(
            "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run. (DeepSpeed's "
            "DynamicLossScaler, loss_scaler.py:257: the fp16 gradients overflowed at iteration {} with the loss scale "
            "at fp16.min_loss_scale {}; lower min_loss_scale, or find the overflow's source)", cur_iter_, min_scale_));
      }
      cur_scale_ = std::max(cur_scale_ / scale_factor_, min_scale_);
    } else {
      cur_hysteresis_ -= 1;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (kind_ == LossScalerKind::dynamic_loss_scaler && consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
    const std::int64_t stable = (cur_iter_ - last_overflow_iter_) - 1;
    if (stable > 0 && stable % scale_window_ == 0) {
      if (kind_ == LossScalerKind::dynamic_loss_scaler && !consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
      cur_scale_ *= scale_factor_;
    }
  }
  cur_iter_ += 1;
}

BaseOptimizer::BaseOptimizer(const OptimizerConfig& cfg, Device& dev, std::int64_t numel,
                             const std::string& label, int adam_simd_width, Segments segments)
    : cfg_(cfg), dev_(dev), adam_simd_width_(adam_simd_width), segments_(std::move(segments)) {
  if (adam_simd_width_ < 1 || (adam_simd_width_ & (adam_simd_width_ - 1)) != 0) {
    throw ConfigError(fmt::format("adam_simd_width {} is not a power of two (16 models an AVX-512 build, 8 AVX2)",
                                  adam_simd_width_));
  }
  if (segments_.empty()) segments_.emplace_back(0, numel);
  for (const auto& [off, len] : segments_) {
    ZC_ASSERT(off >= 0 && len >= 0 && off + len <= numel, "optimizer segment [{}, +{}) outside [0, {})", off, len, numel);
  }
  numel_ = numel;
  label_ = label;
}

// Note [Lazy optimizer state]: torch's optimizers and DeepSpeed's CPU Adam create a tensor's
// state at its first step (`if len(state) == 0`), and DeepSpeed 0.19.8's ZeRO-1/2/3 wrappers no
// longer step at construction (initialize_optimizer_states, stage_1_and_2.py:934 and
// stage3.py:1301, only attach a zero gradient), so the states appear in the first step's memory,
// not construction's (measured on an H200: DeepSpeed's construction peak for GPT-2 medium at
// ZeRO-1 is params + master + one f32 gradient partition, 3.31 GiB; the states' 2.64 GiB come at
// the first step). FP16_Optimizer and BF16_Optimizer's dummy step at construction still creates
// them there.
// torch.optim.SGD at momentum 0 keeps no momentum_buffer (measured on DeepSpeed's reference: no
// optimizer state allocation in its steps), so nothing is allocated for it.
void BaseOptimizer::create_states() {
  if (cfg_.type == OptimizerType::sgd) {
    if (cfg_.momentum != 0) {
      state_a_ = dev_.alloc(DType::f32, {numel_}, label_ + ".momentum_buffer", MemCategory::optimizer_states);
    }
    return;
  }
  state_a_ = dev_.alloc(DType::f32, {numel_}, label_ + ".exp_avg", MemCategory::optimizer_states);
  state_b_ = dev_.alloc(DType::f32, {numel_}, label_ + ".exp_avg_sq", MemCategory::optimizer_states);
}

Tensor BaseOptimizer::state(OptimizerState what) const {
  ZC_ASSERT(what != OptimizerState::fp32_master, "the master is the wrapper's, not the base optimizer's");
  if (cfg_.type == OptimizerType::sgd) return what == OptimizerState::exp_avg ? state_a_ : Tensor();
  return what == OptimizerState::exp_avg ? state_a_ : state_b_;
}

double scheduled_lr(const OptimizerConfig& cfg, std::int64_t engine_step) {
  const LrSchedule& s = cfg.schedule;
  if (s.type == LrScheduleType::none) return cfg.lr;
  const double min_lr = s.warmup_min_lr;
  const double delta = s.warmup_max_lr.value_or(cfg.lr) - min_lr;
  const std::int64_t it = engine_step - 1;  // last_batch_iteration while this step runs
  if (it < 0) return min_lr;
  const std::int64_t warmup = std::max<std::int64_t>(2, s.warmup_num_steps);
  double gamma = 1.0;
  if (it < warmup) {
    gamma = s.linear ? static_cast<double>(it) / static_cast<double>(warmup)
                     : (1.0 / std::log(static_cast<double>(warmup))) * std::log(static_cast<double>(it + 1));
  } else if (s.type == LrScheduleType::warmup_decay) {
    gamma = std::max(0.0, static_cast<double>(s.total_num_steps - it) /
                              std::max(1.0, static_cast<double>(s.total_num_steps - warmup)));
  }
  return min_lr + delta * gamma;
}

void BaseOptimizer::step(const Tensor& master, const Tensor& grad, bool engine_step) {
  std::vector<Tensor> grads;
  for (const auto& [off, len] : segments_) grads.push_back(grad.narrow(off, len));
  step(master, grads, engine_step);
}

void BaseOptimizer::step(const Tensor& master, const std::vector<Tensor>& segment_grads, bool engine_step) {
  std::vector<Tensor> masters;
  for (const auto& [off, len] : segments_) masters.push_back(master.narrow(off, len));
  step(masters, segment_grads, engine_step);
}

void BaseOptimizer::step(const std::vector<Tensor>& segment_masters,
                         const std::vector<Tensor>& segment_grads, bool engine_step) {
  ZC_ASSERT(segment_grads.size() == segments_.size() && segment_masters.size() == segments_.size(),
            "{} grads and {} masters for {} segments", segment_grads.size(), segment_masters.size(),
            segments_.size());
  if (steps_ == 0) create_states();
  ++steps_;
  const double lr = engine_step ? scheduled_lr(cfg_, engine_steps_++) : cfg_.lr;
  if (cfg_.type == OptimizerType::sgd) {
    SgdParams p{lr, cfg_.momentum, cfg_.dampening, cfg_.weight_decay, cfg_.nesterov, steps_ == 1};
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      const auto& [off, len] = segments_[i];
      const Tensor momentum = state_a_.defined() ? state_a_.narrow(off, len) : Tensor();
      dev_.sgd_step(segment_masters[i], segment_grads[i], momentum, p);
    }
    return;
  }
  AdamParams p;
  p.kernel = cfg_.torch_adam ? AdamKernel::torch_cpu : AdamKernel::ds_cpu;
  p.lr = lr;
  p.beta1 = cfg_.beta1;
  p.beta2 = cfg_.beta2;
  p.eps = cfg_.eps;
  p.weight_decay = cfg_.weight_decay;
  p.adamw = cfg_.adam_w_mode;
  p.bias_correction = cfg_.bias_correction;
  p.step = steps_;
  p.simd_width = adam_simd_width_;
  // IncrementStep: pow(beta, 1) = beta at the first step, a running f32 product after.
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  beta1_pow_ = steps_ == 1 ? b1 : beta1_pow_ * b1;
  beta2_pow_ = steps_ == 1 ? b2 : beta2_pow_ * b2;
  p.beta1_pow = beta1_pow_;
  p.beta2_pow = beta2_pow_;
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    const auto& [off, len] = segments_[i];
    dev_.adam_step(segment_masters[i], segment_grads[i], state_a_.narrow(off, len),
                   state_b_.narrow(off, len), p);
  }
}

double combined_unscale_factor(double loss_scale, double global_norm_scaled, double clip, DType compute) {
  if (compute == DType::f32) {  // torch ops on an f32 norm tensor; Python scalars become f32
    float combined = static_cast<float>(loss_scale);
    if (clip > 0.0) {
      float c = static_cast<float>(global_norm_scaled) / static_cast<float>(loss_scale);
      c = (c + static_cast<float>(1e-6)) / static_cast<float>(clip);
      if (c < 1.0f) c = 1.0f;  // torch.clamp(min=1.0); NaN stays NaN
      combined = c * static_cast<float>(loss_scale);
    }
    return static_cast<double>(combined);
  }
  double combined = loss_scale;
  if (clip > 0.0) {
    const double c = ((global_norm_scaled / loss_scale) + 1e-6) / clip;  // norm is norm * scale
    if (c > 1.0) combined = c * loss_scale;
  }
  return combined;
}

}  // namespace zc
