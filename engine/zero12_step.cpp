// Zero12Optimizer: the partition epilogue and the optimizer step (SPEC 4).
#include "engine/errors.h"
#include "engine/zero12_optimizer.h"

#include <cmath>

namespace zc {

void Zero12Optimizer::independent_gradient_partition_epilogue() {
  reduce_ipg_grads();
  wait_all();
  std::fill(already_reduced_.begin(), already_reduced_.end(), 0);
  if (!cpu_offload_) {  // with offload the fp32 grads on the CPU are the averaged gradients
    accumulate_partition();
    if (boundary_) {
      build_averaged();
      // DeepSpeed clears all_grad_tensors after every boundary epilogue (stage_1_and_2.py
      // independent_gradient_partition_epilogue), so a later backward at the boundary starts afresh
      // and averaged_gradients holds only it: N implicit-boundary backwards keep the last one
      // (Note [Implicit boundary keeps the last backward]). Not with the compact fp32 buffer.
      if (!compact_) {
        for (Tensor& t : accum_) t = Tensor();
        accum_set_ = false;
      }
    }
  } else if (boundary_) {
    offload_grads_ready_ = true;  // even on a rank whose partition is all padding
  }
  release_ipg_buffers();
  for (Parameter* p : params_) p->grad = Tensor();  // _clear_param_grad_only: keep grad_accum
  epilogue_ran_ = true;
  record(fmt::format("zero epilogue: micro_step_id {} boundary {}", micro_step_id_, boundary_));
}

// Note [Implicit boundary keeps the last backward]
// With GA 1 and N backwards each at the boundary (no set_gradient_accumulation_boundary(False)),
// DeepSpeed 0.19.8's ZeRO-1/2 without offload rebuilds averaged_gradients at every boundary
// epilogue from an accumulator it has just cleared, so the step sees the last backward's gradient
// only; chunks 1..N-1 are dropped without a word. zerocheck does the same (the reference backend
// measured it), and the verifier names the cost: the property "N backwards sum" (PyTorch's
// semantics) fails there, reported as a hazard (H1) with its counterexample. The explicit form,
// GA > 1 with one backward per micro-step, and a 16-bit model with fp32 grad_accum_dtype (the
// compact fp32 grad-partition buffer, also measured) sum.

// The first epilogue after a boundary sets the partition accumulator; later ones add (SPEC 4).
void Zero12Optimizer::accumulate_partition() {
  for (std::size_t k = 0; k < in_partition_.size(); ++k) {
    Parameter& p = *params_[static_cast<std::size_t>(in_partition_[k])];
    Tensor& from = compact_src_[static_cast<std::size_t>(in_partition_[k])];  // the comm-dtype result
    const Tensor g = from.defined() ? from : p.grad.defined() ? p.grad.view({p.numel()}) : Tensor();
    from = Tensor();
    if (!accum_set_ && g.defined() && g.dtype() == accum_dtype_ && !compact_) {
      accum_[k] = g;  // get_all_grad_tensors: the grad itself, no copy (Note [averaged_gradients are views])
    } else if (!accum_set_) {
      accum_[k] = dev_.alloc(accum_dtype_, {p.numel()}, p.name + ".all_grad_tensors",
                             MemCategory::grads);
      if (g.defined()) {
        dev_.cast(accum_[k], g);
      } else {
        dev_.fill(accum_[k], 0.0);  // torch.zeros_like
      }
    } else if (g.defined()) {
      dev_.axpy(accum_[k], 1.0, g);
    }
  }
  accum_set_ = true;
}

// Note [averaged_gradients are views]
// DeepSpeed 0.19.8's boundary epilogue keeps the reduced grads where they are: all_grad_tensors
// are the params' grads themselves (get_all_grad_tensors, stage_1_and_2.py:2703; zeros only for a
// param without one), averaged_gradients this rank's slices of them (get_flat_partition with
// return_tensor_list, plus a zero tail where the partition is padding), and the step flattens
// them into one tensor (flatten_dense_tensors_aligned in step, :3013), after which the views are
// dropped (free_grad_in_param_list). The engine copied both (all_grad_tensors and a flat
// averaged_gradients at the epilogue): on llama-tiny ZeRO-1, 64,032 B of grads against
// DeepSpeed's 48,128. Later epilogues of an accumulation add into the first one's grads in place.
void Zero12Optimizer::build_averaged() {
  const std::int64_t start = layout_.partition_start(rank_);
  const std::int64_t end = start + layout_.partition_numel;
  averaged_parts_.clear();
  std::int64_t covered = 0;
  for (std::size_t k = 0; k < in_partition_.size(); ++k) {
    const int i = in_partition_[k];
    const std::int64_t off = layout_.offsets[static_cast<std::size_t>(i)];
    const std::int64_t lo = std::max(off, start);
    const std::int64_t hi = std::min(off + layout_.numels[static_cast<std::size_t>(i)], end);
    ZC_ASSERT(lo <= hi, "param {} in partition {} has no elements in it", i, rank_);
    ZC_ASSERT(lo - start == covered, "partition {}'s pieces are not contiguous at {}", rank_, lo - start);
    averaged_parts_.push_back(accum_[k].narrow(lo - off, hi - lo));
    covered += hi - lo;
  }
  if (covered < layout_.partition_numel) {
    Tensor tail = dev_.alloc(accum_dtype_, {layout_.partition_numel - covered}, "averaged_gradients.padding",
                             MemCategory::grads);
    dev_.fill(tail, 0.0);
    averaged_parts_.push_back(tail);
  }
}

Tensor Zero12Optimizer::flatten_averaged() {
  Tensor flat = dev_.alloc(accum_dtype_, {layout_.partition_numel}, "single_grad_partition_flat",
                           MemCategory::temporaries);
  copy_averaged_into(flat);
  return flat;
}

void Zero12Optimizer::copy_averaged_into(const Tensor& dst) {
  std::int64_t at = 0;
  for (const Tensor& t : averaged_parts_) {
    dev_.copy(dst.narrow(at, t.numel()), t);
    at += t.numel();
  }
}

void Zero12Optimizer::release_ipg_buffers() {
  if (contiguous_) {
    buffers_.clear();
    grads_in_partition_ = Tensor();
  }
  ready_for_gradients_ = false;
}

void Zero12Optimizer::reset_accumulators() {
  for (Tensor& t : accum_) t = Tensor();
  accum_set_ = false;
  averaged_parts_.clear();
  averaged_ = Tensor();
  if (cpu_offload_ && offload_grads_ready_) cpu_->cpu().fill(fp32_grad_cpu_, 0.0);
  offload_grads_ready_ = false;
}

void Zero12Optimizer::zero_grad() {
  for (Parameter* p : params_) {
    p->grad = Tensor();
    p->grad_accum = Tensor();
  }
  reset_accumulators();
}

// Note [Coverage at step time]
// FlatLayout::build asserts that the partitions cover every element; the layout is immutable
// after that, so asserting it again would re-read the same numbers and could never fail. What can
// be wrong by the step is what the step touches: it reads this rank's [partition_numel] grads,
// updates master_ and writes it back into flat_[partition_start, +partition_numel), which reaches
// the params only while each param's data is still its slice of flat_ (a param whose data was
// replaced, e.g. restored into the live module, would keep its old values without a word). So
// before each step those buffers are checked against the layout.
void Zero12Optimizer::check_partition_buffers() const {
  const std::int64_t pn = layout_.partition_numel;
  ZC_ASSERT(flat_.numel() == layout_.padded, "bit16_groups_flat holds {} elements, the layout {}",
            flat_.numel(), layout_.padded);
  ZC_ASSERT(master_.numel() == pn, "the fp32 master partition holds {} elements, the layout {}",
            master_.numel(), pn);
  const Tensor& grads = cpu_offload_ ? fp32_grad_cpu_ : averaged_;
  ZC_ASSERT(!grads.defined() || grads.numel() == pn, "the averaged gradients hold {} elements, the "
            "layout's partition {}", grads.numel(), pn);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& d = params_[i]->data;
    const std::int64_t at = flat_.offset_numel() + layout_.offsets[i];
    const bool view = d.storage() == flat_.storage() && d.offset_numel() == at;
    ZC_ASSERT(view && d.numel() == layout_.numels[i],
              "param {} ({}) is no longer its slice [{}, +{}) of bit16_groups_flat: the step would "
              "not reach it", i, params_[i]->name, layout_.offsets[i], layout_.numels[i]);
  }
}

// stage_1_and_2.py: the norm is all-reduced as one f32 element (get_grad_norm_direct's .float(),
// the offload path's FloatTensor) and the combined scale is torch arithmetic on that f32 tensor
// (unscale_and_clip_grads); the f32 copy is single_grad_partition, made after the norm. The local
// sum of squares is taken with the inf/NaN test, before the overflow all-reduce, where DeepSpeed's
// step takes the whole norm after check_overflow (scaled_global_norm): the values are the same,
// only this rank's device ops come in another order (kept from the MoE split step).
StepPlan Zero12Optimizer::step_plan() const {
  const bool check = checks_grad_overflow(cfg_);
  return StepPlan{.overflow = check ? OverflowCheck::all_reduce : OverflowCheck::none,
                  .skip_on_invalid_norm = check,
                  .sum_sq_before_overflow = true,
                  .fp32_grads_before_norm = false,
                  .norm_partitioned = true,
                  .norm_dtype = DType::f32,
                  // get_grad_norm_direct roots an f32 tensor (`.pow(1. / 2)`); under offload
                  // complete_grad_norm_calculation_for_cpu_offload roots a Python float.
                  .torch_root = !cpu_offload_,
                  .combined_dtype = DType::f32,
                  .fp32_grads_label = "single_grad_partition"};
}

StepPrep Zero12Optimizer::prepare_step() {
  micro_step_id_ = -1;
  check_partition_buffers();  // paired with FlatLayout::build (Note [Coverage at step time])
  if (!(cpu_offload_ ? offload_grads_ready_ : !averaged_parts_.empty())) {
    throw UsageError(fmt::format("rank {}: step() at an accumulation boundary without reduced "
                                 "gradients ({}, {} params): call backward() at the boundary first",
                                 rank_, name(), params_.size()));
  }
  // Under offload the step reads the master's .grad in place (stage_1_and_2.py step:
  // single_grad_partition = single_partition_of_fp32_groups[i].grad); flatten_grads keeps the
  // norms.
  if (cpu_offload_) {
    return StepPrep{.grads = fp32_grad_cpu_, .where = &cpu_->cpu(), .flatten_later = true};
  }
  // The norm reads the per-param pieces; the flat is made after it (flatten_grads).
  return StepPrep{.where = &dev_, .flatten_later = true};
}

// Note [ZeRO-1/2's gradient norm, as DeepSpeed allocates it]
// stage_1_and_2.py step takes the norm before it flattens the partition's grads: get_grad_norm_direct
// (:2648) copies each param's piece of averaged_gradients into get_norm_dtype() (double, on a GPU as
// on the CPU) for torch.linalg.vector_norm, keeps each piece's 0-dim norm in a list (the padding
// piece is skipped), then stacks them, squares and sums; the list goes when the function returns.
// Each copy lives until its norm is taken: the largest piece's, 8 bytes an element, is the step's
// peak of temporaries where the partition is one large param (a Llama-2 7B embedding slice at 64
// ranks is 0.78 GiB of it). Only then does step() keep `_global_grad_norm` (a 0-dim f32 that lives
// until the next step replaces it) and flatten the pieces (single_grad_partition, which is the flat
// itself in fp32). The value is the sum of the pieces' squares in f64, rounded to f32 once, as
// before; DeepSpeed's sqrt-then-square of each piece differs from it only below f64's last bits.
double Zero12Optimizer::norm_sum_sq(const StepPrep& prep) {
  if (cpu_offload_) return ZeroOptimizer::norm_sum_sq(prep);
  grad_norms_.clear();
  const std::size_t pieces = std::min(averaged_parts_.size(), in_partition_.size());  // not the padding
  return sum_sq_by_piece_f64(dev_, std::span(averaged_parts_).first(pieces), grad_norms_);
}

bool Zero12Optimizer::grads_have_inf_nan(const StepPrep& prep) {
  if (cpu_offload_) return ZeroOptimizer::grads_have_inf_nan(prep);
  return std::any_of(averaged_parts_.begin(), averaged_parts_.end(),
                     [&](const Tensor& t) { return dev_.has_inf_nan(t); });
}

void Zero12Optimizer::flatten_grads(StepPrep& prep) {
  grad_norms_.clear();  // get_grad_norm_direct has returned
  // step()'s scaled_global_grad_norm (combine_grad_norm_groups' result) lives until step() returns;
  // _global_grad_norm = it / prev_scale replaces the last step's, which the engine's own
  // _global_grad_norm still holds until its step() ends. Under offload both are on the CPU
  // (complete_grad_norm_calculation_for_cpu_offload's torch.tensor(..., device=self.device)).
  Device& at = cpu_offload_ ? cpu_->cpu() : dev_;
  scaled_global_norm_ = at.alloc(DType::f32, {1}, "scaled_global_grad_norm",
                                 MemCategory::temporaries);  // 0-dim
  last_global_grad_norm_ = global_grad_norm_;
  global_grad_norm_ = at.alloc(DType::f32, {1}, "_global_grad_norm",
                               MemCategory::temporaries);  // 0-dim f32
  if (cpu_offload_) {  // the fp32 partition's grad itself, unscaled in place
    prep.grads_are_fp32_copies = true;
    return;
  }
  averaged_ = flatten_averaged();
  prep.grads = averaged_;
  // An fp32 flat is the step's fp32 grads itself (`.to(float32)` returns it).
  prep.grads_are_fp32_copies = averaged_.dtype() == DType::f32;
}

void Zero12Optimizer::skip_step() {
  grad_norms_.clear();
  scaled_global_norm_ = last_global_grad_norm_ = Tensor();
  global_grad_norm_ = Tensor();  // _global_grad_norm = float("inf")
  norm_for_param_grads_.clear();  // reset_cpu_buffers on overflow (stage_1_and_2.py:3057)
  ZeroOptimizer::skip_step();
}

void Zero12Optimizer::update(const Tensor& grads32, double, double combined) {
  const std::int64_t pn = layout_.partition_numel;
  // stage_1_and_2.py step releases the 16-bit grads once single_grad_partition holds them
  // (free_grad_in_param_list, averaged_gradients[i] = None), before the optimizer steps: at the
  // first step, where Adam creates its states, that sets the peak (seen on an H200). The params'
  // grads are views of grads_in_partition (copy_grads_in_partition), which goes with them.
  for (Parameter* p : params_) p->grad = Tensor();
  // Under offload grads32 is the fp32 partition's grad itself, which the reset zeroes: after.
  if (!cpu_offload_) reset_accumulators();
  base_->step(master_, grads32);
  if (cpu_offload_) reset_accumulators();
  Tensor mine = flat_.narrow(layout_.partition_start(rank_), pn);
  if (cpu_offload_) {  // through the bit16 buffer, as DeepSpeed does (stage_1_and_2.py:3094-3096)
    cpu_->cpu().cast(bit16_buffer_cpu_, master_);
    cpu_->to_device(mine, bit16_buffer_cpu_);
    norm_for_param_grads_.clear();  // reset_cpu_buffers, before the all-gather (:3149-3150)
  } else {
    dev_.cast(mine, master_);
  }
  // Every rank's updated partition, in place; a world of one already holds it, and DeepSpeed
  // skips the gather there (runtime/utils.py:1012-1015, all_gather_into_tensor_dp_groups).
  if (comm_.size() > 1) comm_.all_gather(flat_, mine);
  record(fmt::format("step {}: combined scale {:.9g}", base_->steps(), combined));
  scaled_global_norm_ = last_global_grad_norm_ = Tensor();  // step() has returned
}

std::vector<Tensor> Zero12Optimizer::averaged_gradients() {
  if (cpu_offload_) return offload_grads_ready_ ? std::vector<Tensor>{fp32_grad_cpu_} : std::vector<Tensor>{};
  return averaged_parts_;
}

std::vector<double> Zero12Optimizer::gathered_grads() {
  const std::int64_t pn = layout_.partition_numel;
  const DType dt = cpu_offload_ ? DType::f32 : accum_dtype_;
  Tensor full = dev_.alloc(dt, {layout_.padded}, "gathered_grads",
                           MemCategory::temporaries);  // [padded]
  Tensor mine = full.narrow(layout_.partition_start(rank_), pn);
  if (cpu_offload_ && offload_grads_ready_) {
    cpu_->to_device(mine, fp32_grad_cpu_);
  } else if (!cpu_offload_) {
    copy_averaged_into(mine);
  }
  comm_.all_gather(full, mine);
  return layout_.to_param_order(to_f64(dev_, full));
}

}  // namespace zc
