// ZeroOptimizer's shared parts and the choice of wrapper, as DeepSpeed's
// _do_optimizer_sanity_check / _configure_zero_optimizer make it.
#include "engine/zero_optimizer.h"

#include "engine/dense_optimizer.h"
#include "engine/errors.h"
#include "engine/zero12_optimizer.h"
#include "engine/zero3_optimizer.h"

#include <cmath>

namespace zc {

double ZeroOptimizer::sum_sq_by_piece_f64(Device& dev, std::span<const Tensor> pieces, std::vector<Tensor>& norms) {
  double sum_sq = 0.0;
  for (const Tensor& g : pieces) {
    Tensor wide = dev.alloc(DType::f64, {g.numel()}, "grad_norm_f64", MemCategory::temporaries);  // [piece] f64
    dev.cast(wide, g);
    const double piece = dev.sum_sq(wide);
    sum_sq += piece;
    Tensor norm = dev.alloc(DType::f64, {1}, "grad_norm_piece", MemCategory::temporaries);  // 0-dim f64
    dev.fill(norm, std::sqrt(piece));
    norms.push_back(norm);
  }
  // torch.stack(norms).pow(2).sum(): the stack goes once squared, the squares once summed.
  const auto k = static_cast<std::int64_t>(norms.size());
  Tensor stacked = dev.alloc(DType::f64, {k}, "grad_norm_stack", MemCategory::temporaries);  // [pieces] f64
  Tensor squared = dev.alloc(DType::f64, {k}, "grad_norm_pow", MemCategory::temporaries);   // [pieces] f64
  stacked = Tensor();
  Tensor summed = dev.alloc(DType::f64, {1}, "grad_norm_sum", MemCategory::temporaries);  // 0-dim f64
  squared = Tensor();
  return sum_sq;
}

ZeroOptimizer::ZeroOptimizer(const Config& cfg, Module& model, Device& dev, Comm& comm,
                             const Options& opts, ParamSelect select)
    : cfg_(cfg), model_(model), dev_(dev), comm_(comm), opts_(opts),
      dtype_(cfg.model_dtype()), accum_dtype_(cfg.accumulation_dtype()),
      comm_dtype_(cfg.comm_dtype()),
      averaging_world_(comm.size()),
      scaler_(cfg, cfg.zero.stage == 0 ? LossScalerKind::fp16_optimizer : LossScalerKind::dynamic_loss_scaler) {
  for (Parameter* p : model.named_parameters()) {
    if (!p->requires_grad) continue;
    if (select == ParamSelect::dense && p->is_expert) continue;
    if (select == ParamSelect::expert && !p->is_expert) continue;
    params_.push_back(p);
  }
  // Note [FusedAdam's buffer, before the wrapper]
  // DeepSpeed's FusedAdam keeps a one-element IntTensor (fused_adam.py __init__:
  // _dummy_overflow_buf) on the device for its life; DeepSpeedCPUAdam (offload_optimizer) and
  // torch's optimizers do not. The engine builds that basic optimizer before its ZeRO wrapper
  // (engine.py _configure_optimizer), so the buffer is there while the wrapper flattens the params
  // (a ZeRO-1 [1] param at world 3: construction's peak 52 B with it, 48 after), and MoE's expert
  // group is a param group of the same optimizer: one buffer, the dense wrapper's.
  const OptimizerConfig& oc = cfg.optimizer;
  if (select != ParamSelect::expert && oc.type != OptimizerType::sgd && !oc.torch_adam &&
      cfg.zero.offload_optimizer != OffloadDevice::cpu) {
    // [4] u8: the bytes of one i32 (the engine has no integer dtype); nothing reads it.
    fused_adam_buf_ = dev.alloc(DType::u8, {4}, "_dummy_overflow_buf", MemCategory::temporaries);
    dev.fill(fused_adam_buf_, 0.0);
  }
}

bool checks_grad_overflow(const Config& cfg) {
  return cfg.fp16.enabled || (cfg.bf16.enabled && cfg.bf16.check_grad_overflow);
}

// Note [Step sequence]
// Every wrapper's step is one sequence, DeepSpeed's: (1) this rank's inf/NaN test of the grads
// and (2) one all-reduce MAX of it as a one-byte flag, as StepPlan::overflow says; (3) the loss scaler's
// update; (4) on overflow, drop the grads and skip; (5) the global norm from each rank's sum of
// squares; (6) the combined unscale-and-clip factor from the loss scale before the update; (7)
// the grads in f32 divided by it and the base optimizer's step. The wrappers differ only in
// where the grads live (prepare_step), in what they do after the update (update), and in the
// StepPlan: DenseOptimizer (FP16_Optimizer, BF16_Optimizer), Zero12Optimizer
// (DeepSpeedZeroOptimizer) and Zero3Optimizer (DeepSpeedZeroOptimizer_Stage3) each say there
// which DeepSpeed file each of its parameters follows. Every step below is a device op or a
// collective in the order the rank issues it, so the order is part of the sequence.
bool ZeroOptimizer::step_param_groups(const std::vector<ZeroOptimizer*>& groups) {
  ZC_ASSERT(!groups.empty(), "a step over no param groups");
  ZeroOptimizer& lead = *groups[0];
  const StepPlan plan = lead.step_plan();
  const bool check = plan.overflow != OverflowCheck::none;
  std::vector<StepPrep> preps;
  bool local_overflow = false;
  for (ZeroOptimizer* g : groups) {
    ZC_ASSERT(g->step_plan() == plan, "param groups {} and {} step differently", lead.name(),
              g->name());
    StepPrep& prep = preps.emplace_back(g->prepare_step());
    ZC_ASSERT((prep.grads.defined() || prep.flatten_later) && prep.where != nullptr, "{} prepared no grads",
              g->name());
    const bool mine = check && g->grads_have_inf_nan(prep);  // every group tests its own
    local_overflow = local_overflow || mine;
    if (plan.sum_sq_before_overflow) prep.local_sum_sq = g->norm_sum_sq(prep);
  }
  const bool overflow = plan.overflow == OverflowCheck::all_reduce ? lead.any_rank_overflow(local_overflow)
                                                                   : local_overflow;
  const double prev_scale = lead.scaler_.cur_scale();
  for (ZeroOptimizer* g : groups) g->scaler_.update_scale(overflow);
  if (overflow) {
    // A lone group records the skip; the MoE path (several groups) never has.
    if (groups.size() == 1) {
      lead.record(fmt::format("step skipped: overflow, loss scale {} -> {}", prev_scale,
                              lead.scaler_.cur_scale()));
    }
    for (ZeroOptimizer* g : groups) g->skip_step();
    return false;
  }
  auto make_fp32 = [&](ZeroOptimizer& g, StepPrep& prep) {
    if (prep.flatten_later) {
      g.flatten_grads(prep);
      prep.flatten_later = false;
      ZC_ASSERT(prep.grads.defined(), "{} flattened no grads", g.name());
    }
    if (prep.grads_are_fp32_copies) {
      prep.grads32 = prep.grads;
      return;
    }
    const std::string label(plan.fp32_grads_label);
    prep.grads32 = prep.where->alloc(DType::f32, prep.grads.shape(), label,
                                     MemCategory::grads);  // [partition_numel]
    prep.where->cast(prep.grads32, prep.grads);
  };
  for (std::size_t i = 0; i < groups.size(); ++i) {
    StepPrep& prep = preps[i];
    if (plan.fp32_grads_before_norm) make_fp32(*groups[i], prep);
    if (!plan.sum_sq_before_overflow) prep.local_sum_sq = groups[i]->norm_sum_sq(prep);
  }
  // MoE's groups each reduce their own sum (Note [MoE's gradient norm]); otherwise the groups'
  // sums are added in group order and reduced once.
  auto summed = [&preps] {
    double sum_sq = preps[0].local_sum_sq;
    for (std::size_t i = 1; i < preps.size(); ++i) sum_sq = sum_sq + preps[i].local_sum_sq;
    return sum_sq;
  };
  const double norm = groups.size() > 1 && plan.norm_partitioned
                          ? moe_global_norm(groups, preps, plan)
                          : lead.global_norm(summed(), plan.norm_partitioned, plan.norm_dtype, plan.torch_root);
  // is_invalid_grad_norm: overflow, the step is skipped. DeepSpeed updates the loss scale after
  // this test, with the overflow; here it was updated without it, which differs only for a
  // dynamic (fp16) scale, whose finite grads cannot give an f32 norm that is not finite.
  if ((plan.clip_by_coefficient || plan.skip_on_invalid_norm) && !std::isfinite(norm)) {
    lead.record(fmt::format("step skipped: gradient norm {}", norm));
    for (ZeroOptimizer* g : groups) g->skip_step();
    return false;
  }
  if (plan.clip_by_coefficient) {
    // max_norm / (global_norm + eps) on an f32 tensor is Tensor.__rtruediv__: reciprocal() * max_norm.
    const float coef = (1.0f / (static_cast<float>(norm) + static_cast<float>(1e-6))) *
                       static_cast<float>(lead.cfg_.gradient_clipping);
    const bool clip = lead.cfg_.gradient_clipping > 0.0 && coef < 1.0f;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      StepPrep& prep = preps[i];
      if (!plan.fp32_grads_before_norm) make_fp32(*groups[i], prep);
      if (clip) prep.where->scale(prep.grads32, static_cast<double>(coef));
      prep.grads = Tensor();  // the wrappers drop their 16-bit grads before the optimizer steps
      groups[i]->update(prep.grads32, norm, clip ? 1.0 / static_cast<double>(coef) : 1.0);
      prep.grads32 = Tensor();  // _release_sub_group: the fp32 grads go before _post_step
      groups[i]->post_step();
    }
    return true;
  }
  // The scale after this step's update (Note [Loss scalers]): doubled at a window's end.
  const double combined = combined_unscale_factor(lead.scaler_.cur_scale(), norm, lead.cfg_.gradient_clipping,
                                                  plan.combined_dtype);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    StepPrep& prep = preps[i];
    if (!plan.fp32_grads_before_norm) make_fp32(*groups[i], prep);
    prep.where->scale(prep.grads32, 1.0 / combined);
    prep.grads = Tensor();  // as above
    groups[i]->update(prep.grads32, norm, combined);
    prep.grads32 = Tensor();  // as above
    groups[i]->post_step();
  }
  return true;
}

void ZeroOptimizer::begin_coalescing() {
  ZC_ASSERT(!coalescing_, "{}: coalescing entered twice", name());
  coalescing_ = true;
}

void ZeroOptimizer::flush_coalesced_reduction() {
  ZC_ASSERT(false, "coalesce flush with optimizer {}, which does not support coalescing", name());
}

void ZeroOptimizer::register_external_parameter(Module&, Parameter&) {}

std::vector<double> ZeroOptimizer::gathered_state(OptimizerState what) {
  const Tensor src = what == OptimizerState::fp32_master ? master_partitions().at(0)
                                                         : base_optimizer().state(what);
  if (!src.defined()) return {};
  return gather_f32_partition(src);
}

std::vector<double> ZeroOptimizer::gather_flat_partition(const FlatLayout& layout, int part,
                                                         bool partitioned, const Tensor& src) {
  Tensor full = dev_.alloc(DType::f32, {layout.padded}, "gathered_state", MemCategory::temporaries);
  Tensor mine = full.narrow(layout.partition_start(part), layout.partition_numel);
  dev_.cast(mine, src);  // from the CPU side too: a read-back, not an offload transfer
  if (partitioned && comm_.size() > 1) comm_.all_gather(full, mine);
  return layout.to_param_order(to_f64(dev_, full));
}

bool ZeroOptimizer::any_rank_overflow(bool local) {
  Tensor flag = dev_.alloc(DType::u8, {1}, "overflow_flag", MemCategory::temporaries);  // [1] u8
  dev_.fill(flag, local ? 1.0 : 0.0);
  comm_.all_reduce(flag, {.op = ReduceOp::max});
  return item(dev_, flag, 0.0) != 0.0;  // meta: no overflow
}

double ZeroOptimizer::norm_root(double sum_sq, DType dtype, bool torch_root) const {
  if (dtype != DType::f32) return std::sqrt(sum_sq);
  const float x = static_cast<float>(sum_sq);
  return static_cast<double>(torch_root ? torch_sqrt_f32(x, opts_.torch_sqrt) : std::sqrt(x));
}

// Note [MoE's gradient norm]
// DeepSpeed's ZeRO-1/2 with MoE (stage_1_and_2.py scaled_global_norm) takes each param group's
// norm over the whole data-parallel world (get_grad_norm_direct: one all_reduce SUM of the
// group's partition squares, the root in f32), averages an expert group's norm over its
// expert-data-parallel group (_average_expert_grad_norms: norm * 1.0 / size in f32, one
// all_reduce SUM there), and combines the groups' norms as the root of their sum of squares
// (combine_grad_norm_groups: torch.linalg.vector_norm over the f32 norms, taken here in f64 and
// rounded to f32). groups[0] is the dense group, the rest expert groups (Engine's order).
double ZeroOptimizer::moe_global_norm(const std::vector<ZeroOptimizer*>& groups,
                                      const std::vector<StepPrep>& preps, const StepPlan& plan) {
  ZeroOptimizer& lead = *groups[0];
  double sum_sq = 0.0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    double n = lead.global_norm(preps[i].local_sum_sq, true, plan.norm_dtype, plan.torch_root);
    if (i > 0) {
      ZeroOptimizer& g = *groups[i];
      Tensor t = g.dev_.alloc(DType::f32, {1}, "expert_norm", MemCategory::temporaries);  // [1]
      g.dev_.fill(t, static_cast<double>(static_cast<float>(n) / static_cast<float>(g.comm_.size())));
      g.comm_.all_reduce(t);
      n = item(g.dev_, t, 0.0);  // meta: a norm of 0
    }
    const auto f = static_cast<double>(static_cast<float>(n));
    sum_sq += f * f;
  }
  return static_cast<double>(static_cast<float>(std::sqrt(sum_sq)));
}

double ZeroOptimizer::global_norm(double local_sum_sq, bool partitioned, DType reduce_dtype,
                                  bool torch_root) {
  if (!partitioned) return norm_root(local_sum_sq, reduce_dtype, torch_root);
  ZC_ASSERT(reduce_dtype == DType::f32 || reduce_dtype == DType::f64, "norm reduced in {}", dtype_name(reduce_dtype));
  Tensor t = dev_.alloc(reduce_dtype, {1}, "total_norm", MemCategory::temporaries);  // [1]
  dev_.fill(t, local_sum_sq);                              // rounded once to reduce_dtype
  comm_.all_reduce(t);
  const double sum = item(dev_, t, 0.0);  // meta: a norm of 0
  return norm_root(sum, reduce_dtype, torch_root);
}

Tensor ZeroOptimizer::comm_image(const Tensor& t, std::string_view label) {
  if (t.dtype() == comm_dtype_) return t;
  Tensor c = dev_.alloc(comm_dtype_, t.shape(), std::string(label), MemCategory::comm_buffers);  // [t] comm dtype
  dev_.cast(c, t);
  return c;
}

void ZeroOptimizer::record(std::string_view what) {
  if (opts_.trace != nullptr) opts_.trace->record("engine", what);
}

std::unique_ptr<ZeroOptimizer> make_zero_optimizer(const Config& cfg, Module& model, Device& dev,
                                                   Comm& comm, const Options& opts,
                                                   ParamSelect select) {
  const int stage = cfg.zero.stage;
  if (select != ParamSelect::all && (stage == 0 || stage == 3)) {
    throw NotImplementedError(fmt::format("MoE expert params with ZeRO stage {} are not modelled; use "
                                          "stage 1 or 2", stage));
  }
  if (select != ParamSelect::all) {  // DeepSpeed's asserts (stage_1_and_2.py _configure_moe_settings)
    // DeepSpeed turns contiguous_gradients on under offload_optimizer (stage_1_and_2.py:300).
    if (stage == 2 && !cfg.zero.contiguous_gradients && cfg.zero.offload_optimizer != OffloadDevice::cpu) {
      throw ConfigError("MoE at ZeRO stage 2 needs zero_optimization.contiguous_gradients true: DeepSpeed asserts "
                        "\"Contiguous Gradients in ZeRO Stage 2 must be set to True for MoE\" (stage_1_and_2.py "
                        "_configure_moe_settings)");
    }
    if (!cfg.zero.reduce_scatter) {
      throw ConfigError("MoE needs zero_optimization.reduce_scatter true: DeepSpeed asserts \"Reduce Scatter in ZeRO "
                        "Stage 2 must be set to True for MoE\" (stage_1_and_2.py _configure_moe_settings)");
    }
  }
  if (stage >= 3) return std::make_unique<Zero3Optimizer>(cfg, model, dev, comm, opts);
  if (stage == 0) return std::make_unique<DenseOptimizer>(cfg, model, dev, comm, opts, false);
  // DeepSpeed: ZeRO-1 + bf16 + fp32 grad accumulation without offload uses BF16_Optimizer.
  if (cfg.uses_bf16_optimizer()) {
    if (select != ParamSelect::all) {
      throw NotImplementedError("MoE with ZeRO-1 + bf16 + fp32 accumulation (BF16_Optimizer) is not modelled");
    }
    return std::make_unique<DenseOptimizer>(cfg, model, dev, comm, opts, true);
  }
  return std::make_unique<Zero12Optimizer>(cfg, model, dev, comm, opts, select);
}

}  // namespace zc
