// Zero12Optimizer: the partition epilogue and the optimizer step (SPEC 4).
#include "engine/errors.h"
#include "engine/zero12_optimizer.h"

#include <cmath>

namespace zc {

void Zero12Optimizer::independent_gradient_partition_epilogue() {
  reduce_ipg_grads();
  wait_all();
  std::fill(already_reduced_.begin(), already_reduced_.end(), 0);
  accumulate_partition();
  if (boundary_) build_averaged();
  release_ipg_buffers();
  for (Parameter* p : params_) p->grad = Tensor();  // _clear_param_grad_only: keep grad_accum
  epilogue_ran_ = true;
  record(fmt::format("zero epilogue: micro_step_id {} boundary {}", micro_step_id_, boundary_));
}

// The first epilogue of a step sets the partition accumulator; later ones add (SPEC 4).
void Zero12Optimizer::accumulate_partition() {
  for (std::size_t k = 0; k < in_partition_.size(); ++k) {
    Parameter& p = *params_[static_cast<std::size_t>(in_partition_[k])];
    if (!accum_set_) {
      accum_[k] = dev_.alloc(accum_dtype_, {p.numel()}, p.name + ".all_grad_tensors");
      if (p.grad.defined()) dev_.cast(accum_[k], p.grad.view({p.numel()}));
    } else if (p.grad.defined()) {
      dev_.axpy(accum_[k], 1.0, p.grad.view({p.numel()}));
    }
  }
  accum_set_ = true;
}

// averaged_gradients = this rank's flat partition of the accumulators, zero-padded tail.
void Zero12Optimizer::build_averaged() {
  const std::int64_t start = layout_.partition_start(rank_);
  const std::int64_t end = start + layout_.partition_numel;
  averaged_ = dev_.alloc(accum_dtype_, {layout_.partition_numel}, "averaged_gradients");
  for (std::size_t k = 0; k < in_partition_.size(); ++k) {
    const int i = in_partition_[k];
    const std::int64_t off = layout_.offsets[static_cast<std::size_t>(i)];
    const std::int64_t lo = std::max(off, start);
    const std::int64_t hi = std::min(off + layout_.numels[static_cast<std::size_t>(i)], end);
    ZC_ASSERT(lo <= hi, "param {} in partition {} has no elements in it", i, rank_);
    dev_.copy(averaged_.narrow(lo - start, hi - lo), accum_[k].narrow(lo - off, hi - lo));
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
  averaged_ = Tensor();
}

void Zero12Optimizer::zero_grad() {
  for (Parameter* p : params_) {
    p->grad = Tensor();
    p->grad_accum = Tensor();
  }
  reset_accumulators();
}

bool Zero12Optimizer::step() {
  micro_step_id_ = -1;
  layout_.check_coverage();  // paired with FlatLayout::build
  if (!averaged_.defined()) {
    throw UsageError("step() at an accumulation boundary without reduced gradients: call "
                     "backward() at the boundary first");
  }
  const bool check = cfg_.fp16.enabled || (cfg_.bf16.enabled && cfg_.bf16.check_grad_overflow);
  overflow_ = check && any_rank_overflow({averaged_});
  const double prev_scale = scaler_.cur_scale();
  scaler_.update_scale(overflow_);
  if (overflow_) {
    record(fmt::format("step skipped: overflow, loss scale {} -> {}", prev_scale, scaler_.cur_scale()));
    zero_grad();
    return false;
  }
  const double norm = global_norm(dev_.sum_sq(averaged_), true);
  const double combined = combined_unscale_factor(prev_scale, norm, cfg_.gradient_clipping);
  const std::int64_t pn = layout_.partition_numel;
  Tensor grad32 = dev_.alloc(DType::f32, {pn}, "single_grad_partition");  // [pn] f32
  dev_.cast(grad32, averaged_);
  dev_.scale(grad32, 1.0 / combined);
  base_->step(master_, grad32);
  Tensor mine = flat_.narrow(rank_ * pn, pn);
  dev_.cast(mine, master_);
  reset_accumulators();
  comm_.all_gather(flat_, mine);  // every rank's updated partition, in place
  record(fmt::format("step {}: norm {:.9g} combined scale {:.9g}", base_->steps(), norm, combined));
  return true;
}

std::vector<Tensor> Zero12Optimizer::averaged_gradients() {
  if (!averaged_.defined()) return {};
  return {averaged_};
}

std::vector<double> Zero12Optimizer::gathered_grads() {
  const std::int64_t pn = layout_.partition_numel;
  Tensor full = dev_.alloc(accum_dtype_, {layout_.padded}, "gathered_grads");  // [padded]
  Tensor mine = full.narrow(rank_ * pn, pn);
  if (averaged_.defined()) dev_.copy(mine, averaged_);
  comm_.all_gather(full, mine);
  std::vector<double> v = to_f64(dev_, full);
  v.resize(static_cast<std::size_t>(layout_.numel));
  return v;
}

}  // namespace zc
