// Loss scaling, the base optimizer and the clip factor.
#include "engine/optimizer.h"

#include "engine/errors.h"

#include <cmath>

namespace zc {

LossScaler::LossScaler(const Config& cfg) {
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
    if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      cur_scale_ = std::max(cur_scale_ / scale_factor_, min_scale_);
    } else {
      cur_hysteresis_ -= 1;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
    const std::int64_t stable = (cur_iter_ - last_overflow_iter_) - 1;
    if (stable > 0 && stable % scale_window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
      cur_scale_ *= scale_factor_;
    }
  }
  cur_iter_ += 1;
}

BaseOptimizer::BaseOptimizer(const OptimizerConfig& cfg, Device& dev, std::int64_t numel,
                             const std::string& label)
    : cfg_(cfg), dev_(dev) {
  state_a_ = dev.alloc(DType::f32, {numel}, label + ".exp_avg");
  if (cfg.type != OptimizerType::sgd) state_b_ = dev.alloc(DType::f32, {numel}, label + ".exp_avg_sq");
}

void BaseOptimizer::step(const Tensor& master, const Tensor& grad) {
  ++steps_;
  if (cfg_.type == OptimizerType::sgd) {
    SgdParams p{cfg_.lr, cfg_.momentum, cfg_.dampening, cfg_.weight_decay, cfg_.nesterov, steps_ == 1};
    dev_.sgd_step(master, grad, state_a_, p);
    return;
  }
  AdamParams p;
  p.lr = cfg_.lr;
  p.beta1 = cfg_.beta1;
  p.beta2 = cfg_.beta2;
  p.eps = cfg_.eps;
  p.weight_decay = cfg_.weight_decay;
  p.adamw = cfg_.adam_w_mode;
  p.bias_correction = cfg_.bias_correction;
  p.step = steps_;
  dev_.adam_step(master, grad, state_a_, state_b_, p);
}

double combined_unscale_factor(double loss_scale, double global_norm_scaled, double clip) {
  double combined = loss_scale;
  if (clip > 0.0) {
    const double c = ((global_norm_scaled / loss_scale) + 1e-6) / clip;  // norm is norm * scale
    if (c > 1.0) combined = c * loss_scale;
  }
  return combined;
}

}  // namespace zc
