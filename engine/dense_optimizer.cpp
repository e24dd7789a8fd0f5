// DenseOptimizer: boundary all-reduce and the unpartitioned (or ZeRO-1 bf16) optimizer step.
#include "engine/dense_optimizer.h"

#include "engine/errors.h"
#include "engine/torch_reductions.h"

#include <cmath>

namespace zc {

DenseOptimizer::DenseOptimizer(const Config& cfg, Module& model, Device& dev, Comm& comm,
                               const Options& opts, bool zero1_bf16_wrapper)
    : ZeroOptimizer(cfg, model, dev, comm, opts), partitioned_(zero1_bf16_wrapper),
      use_hp_(zero1_bf16_wrapper),
      unfused_(!zero1_bf16_wrapper && dtype_ != DType::f32 &&
               (cfg.optimizer.type == OptimizerType::sgd || cfg.optimizer.torch_adam)),
      world_(comm.size()), rank_(comm.rank()) {
  std::vector<std::int64_t> numels;
  for (Parameter* p : params_) numels.push_back(p->numel());
  layout_ = FlatLayout::build(numels, partitioned_ ? world_ : 1, partitioned_);
  if (!masters_are_params()) {  // Note [Stage 0 fp32: the params are the masters]
    flat_ = dev_.alloc(dtype_, {layout_.padded}, "bit16_groups_flat", MemCategory::params);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Parameter& p = *params_[i];
      Tensor view = flat_.narrow(layout_.offsets[i], p.numel());
      dev_.cast(view, p.data);
      p.data = view.view(p.shape);
    }
  }
  if (use_hp_) hp_ = dev_.alloc(DType::f32, {layout_.padded}, "fp32_groups_gradients_flat",
                                MemCategory::grads);
  const std::int64_t pn = layout_.partition_numel;
  const int part = partitioned_ ? rank_ : 0;
  if (!masters_are_params()) {
    master_ = dev_.alloc(DType::f32, {pn}, "fp32_groups_flat_partition", MemCategory::master);
    dev_.cast(master_, flat_.narrow(layout_.partition_start(part), pn));
  }
  // DeepSpeed steps a stage-0 fp32 model's params one tensor at a time (the torch optimizer over
  // model.parameters()), and FP16_UnfusedOptimizer its fp32 copies of them; FP16_Optimizer and
  // BF16_Optimizer step one flat fp32 tensor.
  BaseOptimizer::Segments segments;
  if (!partitioned_ && (dtype_ == DType::f32 || unfused_)) {
    for (std::size_t i = 0; i < params_.size(); ++i) segments.emplace_back(layout_.offsets[i], params_[i]->numel());
  }
  base_ = std::make_unique<BaseOptimizer>(cfg.optimizer, dev_, pn, "optimizer", opts.adam_simd_width, std::move(segments));
  if (!partitioned_ && dtype_ != DType::f32) {
    // FP16_Optimizer (fp16, and bf16 as DeepSpeed's DDP_BFLOAT16) and FP16_UnfusedOptimizer step
    // once with zero gradients at construction (initialize_optimizer_states in fused_optimizer.py
    // and unfused_optimizer.py): the step count becomes 1 and
    // weight decay acts once on the fp32 master, which is not copied back to the 16-bit params.
    // FP16_UnfusedOptimizer first gives every 16-bit param a zero .grad too (unfused_optimizer.py
    // :415), which FP16_Optimizer does not: one more params-sized tensor at construction's peak
    // (seen on an H200 by replaying torch's allocator trace at that peak).
    const Tensor lp_grads = unfused_ ? dev_.alloc(dtype_, {layout_.numel}, "initialize_optimizer_states.lp_grads",
                                                  MemCategory::temporaries)
                                     : Tensor();
    base_->step(master_, dev_.alloc(DType::f32, {pn}, "initialize_optimizer_states.grad",
                                    MemCategory::temporaries), /*engine_step=*/false);
  }
  record(fmt::format("{} init: {} params, {} elements", name(), params_.size(), layout_.numel));
}

// Note [Stage 0 fp32: the params are the masters]
// Without ZeRO and without a 16-bit model DeepSpeed wraps nothing: the torch optimizer steps the
// module's own params (engine.py _configure_optimizer; basic_optimizer over model.parameters()),
// so there is no fp32 master apart from them, and no flat copy of the params either. The engine
// steps each param where the model allocated it: no second copy in its ledger or a plan's
// (measured on DeepSpeed: its master category is 0 B in every stage-0 fp32 scenario, and its
// construction peak holds the params once, where a flat copy held them twice for a moment). The
// values are the same bits: the cast back from an fp32 master to fp32 params was the identity.
bool DenseOptimizer::masters_are_params() const { return !partitioned_ && dtype_ == DType::f32; }

std::vector<Tensor> DenseOptimizer::master_partitions() {
  if (!masters_are_params()) return {master_};
  // The params as one flat f32 tensor, copied for whoever reads the masters (the step holds none).
  Tensor flat =
      dev_.alloc(DType::f32, {layout_.padded}, "params_as_masters", MemCategory::temporaries);
  dev_.fill(flat, 0.0);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    dev_.copy(flat.narrow(layout_.offsets[i], p.numel()), p.data.view({p.numel()}));
  }
  return {flat};
}

std::string_view DenseOptimizer::name() const {
  if (use_hp_) return "BF16_Optimizer";
  if (dtype_ == DType::f32) return "TorchOptimizer";
  return unfused_ ? "FP16_UnfusedOptimizer" : "FP16_Optimizer";
}

// Note [FP16_Optimizer's norm]: stage 0's 16-bit wrappers take the norm in torch and Python
// arithmetic, and hand get_global_norm a total that is then rooted in f64 (utils.py
// get_global_norm: sqrt(x ** 2) leaves x as it is). FP16_Optimizer (fused_optimizer.py step,
// utils.py get_flattened_grad_norm): torch's f32 norm of the flat fp32 grads, its .item() squared
// in Python floats, rounded into an f32 FloatTensor. FP16_UnfusedOptimizer (unfused_optimizer.py
// step, utils.py get_weight_norm): each param's f32 norm squared and summed as f32 tensors, in
// param order. The roundings move the norm off sqrt(sum of squares) by about an f32 ulp, which
// moves the clipped gradient f32(1 / combined) x g by an ulp: the optimizer-state comparison
// found it (the params, through Adam's first step, did not show it). An f32 norm here is the f32
// root of an exact sum, torch's norm on exact data; torch's own reduction order on gaussian data
// is not modelled. Returns the total; global_norm roots it in f64.
//
// Note [BF16_Optimizer's norm and clip]
// BF16_Optimizer (bf16_optimizer.py step) holds every param's fp32 grad on every rank once they are
// all-reduced, and takes the norm of all of them (get_grads_for_norm; utils.py
// get_global_norm_of_tensors): each param's f32 norm, the norms squared and summed as f32
// tensors in param order, the f32 root. Its only all_reduce would be over a model-parallel group:
// without one there is none, at any world (zerocheck used to all-reduce the partitions' sum of
// squares). Clipping multiplies the fp32 grads by the f32 max_norm / (norm + 1e-6) when it is
// below 1 (clip_tensors_by_global_norm), which torch computes as (norm + 1e-6).reciprocal() *
// max_norm (Tensor.__rtruediv__), two roundings; a norm that is not finite skips the step.
// Each param's f32 norm in torch's kernel, squared, and the squares summed as torch sums a stacked
// f32 tensor (Note [torch's f32 norm] in engine/torch_reductions.h): get_global_norm_of_tensors
// and clip_grad_norm_ both take it so. `grads`: each param's f32 grad, in param order.
float DenseOptimizer::torch_sum_of_norms_squared(const std::vector<Tensor>& grads) {
  std::vector<float> squares;
  for (const Tensor& g : grads) {
    const double sum_sq = dev_.sum_sq(g);  // the kernel's cost; its value only in meta mode (0)
    float norm = std::sqrt(static_cast<float>(sum_sq));
    if (!g.is_meta()) {
      const std::vector<double> v = to_f64(dev_, g);  // f32 values, exact
      const std::vector<float> f(v.begin(), v.end());
      norm = torch_norm2_f32(f);
    }
    squares.push_back(norm * norm);
  }
  return torch_sum_f32(squares);
}

double DenseOptimizer::norm_sum_sq(const StepPrep& prep) {
  if (use_hp_) return torch_sum_of_norms_squared(per_param(hp_));
  if (dtype_ == DType::f32) return ZeroOptimizer::norm_sum_sq(prep);
  if (!unfused_) {
    const float norm = std::sqrt(static_cast<float>(prep.where->sum_sq(prep.grads)));
    return static_cast<float>(static_cast<double>(norm) * norm);
  }
  float total = 0.0f;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = prep.grads.narrow(layout_.offsets[i], params_[i]->numel());
    const float norm = std::sqrt(static_cast<float>(prep.where->sum_sq(g)));
    total = total + norm * norm;
  }
  return total;
}

void DenseOptimizer::on_grad_ready(Parameter& p) {
  have_grads_ = true;
  if (!use_hp_ || !p.grad.defined()) return;
  const auto it = std::find(params_.begin(), params_.end(), &p);
  ZC_ASSERT(it != params_.end(), "grad hook for unknown param {}", p.name);
  const std::size_t i = static_cast<std::size_t>(it - params_.begin());
  dev_.axpy(hp_.narrow(layout_.offsets[i], p.numel()), 1.0, p.grad.view({p.numel()}));
  p.grad = Tensor();  // accumulate_hp_grads_and_remove_lp
}

void DenseOptimizer::allreduce_gradients() {
  if (boundary_) buffered_allreduce();
}

// Note [Stage 0 post-scaling]
// DeepSpeed's allreduce_bucket (runtime/engine.py, postscale_gradients, the default) sums first
// and then multiplies by 1/W (tensor.mul_(1. / W): f32(1/W) for an f32 or 16-bit bucket), which
// is Device::scale(x, 1/W). Dividing each rank's value by W before the sum gave other bits at
// W = 3 on random data (the reference's gaussian row: every stage-0 world-3 scenario). In the
// exact domain nothing changes: where the sum s has s/W representable, s * f32(1/3) is within
// 2^-25 relative of it, under half an ulp, and W a power of two is exact. prescale_gradients
// multiplies by f32(1/W) before the sum instead; gradient_predivide_factor f multiplies by
// f32(1/f) before and by f32(f/W) after (not when f == W), as allreduce_bucket does.
// In the communication dtype (Note [The communication dtype]): BF16_Optimizer's fp32 grads are
// reduced in bf16 unless the config says otherwise.
void DenseOptimizer::allreduce_bucket(const Tensor& bucket) {
  const Tensor t = comm_image(bucket, "allreduce_bucket_comm");
  const double w = static_cast<double>(world_), f = cfg_.gradient_predivide_factor;
  if (cfg_.prescale_gradients) {
    dev_.scale(t, 1.0 / w);
    comm_.all_reduce(t);
  } else {
    if (f != 1.0) dev_.scale(t, 1.0 / f);
    comm_.all_reduce(t);
    if (f != w) dev_.scale(t, f / w);
  }
  if (bucket.dtype() != t.dtype()) dev_.cast(bucket, t);
}

void DenseOptimizer::buffered_allreduce() {
  if (use_hp_) {
    for (std::int64_t at = 0; at < layout_.padded; at += kMemoryOptAllreduceSize) {
      allreduce_bucket(hp_.narrow(at, std::min(kMemoryOptAllreduceSize, layout_.padded - at)));
    }
  } else {
    // Every rank reduces every param: a None grad becomes zeros (DeepSpeed does the same).
    std::size_t i = 0;
    while (i < params_.size()) {
      std::int64_t total = 0;
      std::size_t j = i;
      while (j < params_.size() && (j == i || total + params_[j]->numel() <= kMemoryOptAllreduceSize)) {
        total += params_[j++]->numel();
      }
      // engine.allreduce_bucket's flatten: a buffer for this call, freed when it returns.
      Tensor flat = dev_.alloc(dtype_, {total}, "allreduce_bucket",
                               MemCategory::comm_buffers);  // [total] model dtype
      std::int64_t at = 0;
      for (std::size_t k = i; k < j; ++k) {
        Parameter& p = *params_[k];
        if (!p.grad.defined()) p.grad = dev_.alloc(dtype_, p.shape, p.name + ".grad",
                                                   MemCategory::grads);
        dev_.copy(flat.narrow(at, p.numel()), p.grad.view({p.numel()}));
        at += p.numel();
      }
      allreduce_bucket(flat);
      at = 0;
      for (std::size_t k = i; k < j; ++k) {
        dev_.copy(params_[k]->grad.view({params_[k]->numel()}), flat.narrow(at, params_[k]->numel()));
        at += params_[k]->numel();
      }
      i = j;
    }
  }
  reduced_ = true;
  have_grads_ = true;
}

// FP16_UnfusedOptimizer.step (unfused_optimizer.py) gives each fp32 param copy its grad,
// `p.grad.to(float32)`, tensor by tensor: no flat 16-bit copy first. Its overflow test and norm
// read the 16-bit grads, whose values the f32 copies hold exactly. Stage 0's FP16_Optimizer
// flattens the 16-bit grads first (fused_optimizer.py step: _flatten_dense_tensors).
Tensor DenseOptimizer::grads_flat() {
  if (use_hp_) return hp_;
  Tensor g = grads_are_fp32_copies() ? dev_.alloc(DType::f32, {layout_.padded}, "fp32_grad", MemCategory::grads)
                         : dev_.alloc(accum_dtype_, {layout_.padded}, "grads_flat", MemCategory::grads);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i]->grad.defined()) {
      dev_.cast(g.narrow(layout_.offsets[i], params_[i]->numel()), params_[i]->grad.view({params_[i]->numel()}));
    }
  }
  return g;
}

// FP16_Optimizer (runtime/fp16/fused_optimizer.py step; stage 0's bf16 too) flattens the grads
// into fp32 (fp32_groups_flat[i].grad) before it takes their norm, and BF16_Optimizer
// (runtime/bf16_optimizer.py) takes the norm of its fp32 grads: the f32 copy comes first. The norm
// is all-reduced only when the optimizer state is partitioned (the ZeRO-1 wrapper: one f32
// element). The combined scale is f64: FP16_Optimizer.unscale_and_clip_grads is Python float
// arithmetic on get_global_norm's float.
//
// BF16_Optimizer (the ZeRO-1 wrapper) is different (Note [BF16_Optimizer's norm and clip]).
StepPlan DenseOptimizer::step_plan() const {
  // FP16_Optimizer.step always tests its 16-bit grads, on this rank only (CheckOverflow.has_overflow
  // all-reduces nothing without an mpu, MoE or zero_reduce_scatter); BF16_Optimizer tests nothing
  // but its norm (clip_by_coefficient).
  const OverflowCheck overflow = !use_hp_ && is_16bit(dtype_) ? OverflowCheck::local : OverflowCheck::none;
  return StepPlan{.overflow = overflow,
                  .sum_sq_before_overflow = false,
                  .fp32_grads_before_norm = true,
                  .norm_partitioned = false,
                  .norm_dtype = use_hp_ ? DType::f32 : DType::f64,
                  // get_global_norm_of_tensors: `.pow(1. / norm_type)`; FP16_Optimizer: math.sqrt.
                  .torch_root = use_hp_,
                  .combined_dtype = DType::f64,
                  .clip_by_coefficient = use_hp_,
                  .fp32_grads_label = "fp32_grad"};
}

void DenseOptimizer::require_grads() const {
  if (!have_grads_) {
    throw UsageError(fmt::format("rank {}: step() without gradients ({}): call backward() first", rank_, name()));
  }
}

// Unreduced grads (a skipped reduction, as KnownBug::B8 skips it) are stepped on as they are,
// as DeepSpeed's stage-0 optimizers would: every rank then diverges.
StepPrep DenseOptimizer::prepare_step() {
  micro_step_id_ = -1;
  require_grads();
  const std::int64_t start = layout_.partition_start(partitioned_ ? rank_ : 0);
  // this rank's slice of the reduced grads
  return StepPrep{.grads = grads_flat().narrow(start, layout_.partition_numel), .where = &dev_,
                  .grads_are_fp32_copies = grads_are_fp32_copies()};
}

// An fp32 model without ZeRO and with clipping has no wrapper: DeepSpeed's engine clips the fp32
// grads itself (engine.py _take_model_step: clip_fp32_gradients) and steps the torch optimizer;
// nothing is tested for overflow and there is no loss scale. Every other case is a wrapper's step.
//
// Note [Stage 0 fp32: the torch optimizer steps the .grad tensors]
// That model's optimizer is torch's over model.parameters() (no wrapper): it steps each param with
// its own .grad, and clip_grad_norm_ multiplies each .grad in place. No flat or f32 copy of the
// grads exists (measured on DeepSpeed: grads peak at the .grad tensors themselves, where the
// engine's two copies made it three times that), and no norm is taken without clipping.
bool DenseOptimizer::step() {
  if (!masters_are_params()) return step_param_groups({this});
  require_grads();
  micro_step_id_ = -1;
  std::vector<Tensor> grads;
  for (Parameter* p : params_) {
    // Reduced grads are all defined (buffered_allreduce gives a missing one zeros); an unreduced
    // step (KnownBug::B8) steps a missing one as zeros, as grads_flat() did.
    if (!p->grad.defined()) {
      p->grad = dev_.alloc(dtype_, p->shape, p->name + ".grad", MemCategory::grads);
      dev_.fill(p->grad, 0.0);
    }
    grads.push_back(p->grad.view({p->numel()}));
  }
  std::string how = "torch optimizer, no norm (unclipped)";
  if (cfg_.gradient_clipping > 0.0) {
    const float coef = clip_grad_norm_coef(grads);
    for (const Tensor& g : grads) dev_.scale(g, static_cast<double>(coef));
    how = fmt::format("clip_grad_norm_ coef {:.9g}", coef);
  }
  std::vector<Tensor> masters;
  for (Parameter* p : params_) masters.push_back(p->data.view({p->numel()}));
  base_->step(masters, grads);
  zero_grad();
  record(fmt::format("step {}: {}", base_->steps(), how));
  return true;
}

std::vector<Tensor> DenseOptimizer::per_param(const Tensor& flat) const {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) out.push_back(flat.narrow(layout_.offsets[i], params_[i]->numel()));
  return out;
}

void DenseOptimizer::update(const Tensor& grads32, double norm, double combined) {
  finish_step(grads32, fmt::format("norm {:.9g} combined scale {:.9g}", norm, combined));
}

void DenseOptimizer::finish_step(const Tensor& grads32, std::string_view how) {
  ZC_ASSERT(!masters_are_params(), "{}: a stage-0 fp32 model steps in step(), not as a param group",
            name());
  const std::int64_t pn = layout_.partition_numel;
  base_->step(master_, grads32);
  Tensor mine = flat_.narrow(layout_.partition_start(partitioned_ ? rank_ : 0), pn);
  dev_.cast(mine, master_);
  zero_grad();
  if (partitioned_ && comm_.size() > 1) comm_.all_gather(flat_, mine);  // as zero12_step.cpp: none at world 1
  record(fmt::format("step {}: {}", base_->steps(), how));
}

// DeepSpeed's runtime/utils.py clip_grad_norm_, as the engine calls it for an fp32 model without
// ZeRO (engine.py clip_fp32_gradients), all in f32 torch ops: per param ||g|| and the sum of their
// squares as torch takes them (torch_sum_of_norms_squared), the root (`.pow(1. / norm_type)`:
// Note [torch's f32 sqrt on a CPU]), divided by the data-parallel world and SUM-all-reduced (one
// f32 element, at world 1 too), then coef = clip / (norm + 1e-6), min(1, coef); every gradient is
// multiplied by coef, even when it is 1.
float DenseOptimizer::clip_grad_norm_coef(const std::vector<Tensor>& grads) {
  const float total = torch_sum_of_norms_squared(grads);
  const float scaled = torch_sqrt_f32(total, opts_.torch_sqrt) * 1.0f / static_cast<float>(world_);
  Tensor t = dev_.alloc(DType::f32, {1}, "clip_total_norm", MemCategory::temporaries);  // [1] f32
  dev_.fill(t, static_cast<double>(scaled));
  comm_.all_reduce(t);
  const float avg = static_cast<float>(item(dev_, t, 0.0));  // meta: a norm of 0
  const float coef = static_cast<float>(cfg_.gradient_clipping) / (avg + static_cast<float>(1e-6));
  return std::min(1.0f, coef);
}

void DenseOptimizer::zero_grad() {
  for (Parameter* p : params_) {
    p->grad = Tensor();
    p->grad_accum = Tensor();
  }
  if (use_hp_) dev_.fill(hp_, 0.0);
  reduced_ = false;
  have_grads_ = false;
}

std::vector<Tensor> DenseOptimizer::averaged_gradients() {
  if (!reduced_) return {};
  const std::int64_t pn = layout_.partition_numel;
  return {grads_flat().narrow(layout_.partition_start(partitioned_ ? rank_ : 0), pn)};
}

std::vector<double> DenseOptimizer::gathered_grads() {
  // The gradients the engine holds, reduced or not (an unreduced buffer under KnownBug::B8 is what
  // the step uses).
  std::vector<double> v = to_f64(dev_, grads_flat());
  v.resize(static_cast<std::size_t>(layout_.numel));
  return v;
}

}  // namespace zc
