// Zero3Optimizer: ipg buckets, reduce-scatter (divide by world first), partition_grads, the
// epilogue and the step (SPEC 5).
#include "engine/decisions.h"
#include "engine/errors.h"
#include "engine/zero3_optimizer.h"

#include <algorithm>

namespace zc {

void Zero3Optimizer::clear_backward_seen_flag() {
  // DeepSpeed defers the micro_step_id increment to the next forward, so every phase of one
  // backward (reentrant checkpointing) sees the same value.
  if (epilogue_ran_) micro_step_id_ += 1;
  epilogue_ran_ = false;
}

void Zero3Optimizer::on_grad_ready(Parameter& p) {
  if (coalescing()) {  // SPEC 6: grads accumulate locally in .grad
    // KnownBug::B4: the historical hook still marked the backward as seen, so each forward
    // inside the block advanced micro_step_id and the flush added into last step's buffer.
    if (opts_.bugs.has(KnownBug::B4_z3_seen_flag_while_coalescing)) epilogue_ran_ = true;
    return;
  }
  reduce_ready_partitions_and_remove_grads(p);
}

void Zero3Optimizer::reduce_ready_partitions_and_remove_grads(Parameter& p) {
  if (coalescing()) return;  // the coalescing guard (see Note [Flush order] in engine.cpp)
  reduce_independent_p_g_buckets_and_remove_grads(shard_of(p));
}

// SPEC 6's flush at stage 3: reduce every param with a grad, in model order, then the epilogue.
void Zero3Optimizer::flush_coalesced_reduction() {
  for (Parameter* p : model_.named_parameters()) {
    if (p->requires_grad && p->grad.defined()) reduce_ready_partitions_and_remove_grads(*p);
  }
  independent_gradient_partition_epilogue();
}

void Zero3Optimizer::reduce_independent_p_g_buckets_and_remove_grads(Shard& s) {
  Parameter& p = *s.p;
  const decide::BucketAdd<std::int64_t> add = decide::add_to_bucket<std::int64_t>(bucket_elements_, s.numel, bucket_size_, true);
  if (add.flush_before) reduce_and_partition_ipg_grads();
  ZC_ASSERT(bucket_elements_ == add.offset, "rank {}: param {} lands at {} of the bucket, the loop says {}", rank_,
            p.name, bucket_elements_, add.offset);
  const auto idx = static_cast<std::size_t>(find_shard(p));
  if (already_reduced_[idx]) {
    throw UsageError(fmt::format("rank {}: The parameter {} has already been reduced. Gradient "
                                 "computed twice for this partition.", rank_, p.name));
  }
  already_reduced_[idx] = 1;
  if (!p.grad.defined()) throw UsageError(fmt::format("rank {}: reduce of param {} with a None gradient", rank_, p.name));
  if (contiguous_ && !add.oversize) {  // else the oversize-param path: reduced from its own .grad
    Tensor slot = bucket_.narrow(add.offset, s.numel);
    dev_.cast(slot, p.grad.view({s.numel}));  // into the communication dtype (param.grad.data = the slot)
    p.grad = slot.view(p.shape);
  }
  bucket_params_.push_back(&s);
  bucket_elements_ = add.elements_after;
}

// reduce_scatter_coalesced: section r of the input holds every param's r-th chunk (zero-padded),
// so one reduce-scatter leaves each rank its chunks. Divided by the world first.
void Zero3Optimizer::reduce_and_partition_ipg_grads() {
  if (bucket_params_.empty()) return;
  std::vector<Shard*> params = bucket_params_;
  std::sort(params.begin(), params.end(), [](Shard* a, Shard* b) { return a->p->id < b->p->id; });
  std::int64_t chunks = 0;
  for (Shard* s : params) chunks += s->shard_numel;
  // __avg_scatter_grads: each gradient in the communication dtype (the ipg bucket's already are;
  // another is cast, g.to(communication_data_type), a tensor held until the call returns), then
  // interleaved into one flat input in that dtype.
  Tensor in = dev_.alloc(comm_dtype_, {chunks * world_}, "reduce_scatter_in",
                         MemCategory::comm_buffers);  // [world * chunks]
  std::vector<Tensor> cast_grads;
  // Per param, two strided copies whatever the world: the ranks whose chunk is full, then the
  // one with a partial chunk (the rest of the chunks stay zero padding).
  std::int64_t col = 0;  // the param's offset within each rank's section
  for (Shard* s : params) {
    Tensor g = s->p->grad.view({s->numel});
    if (g.dtype() != comm_dtype_) {
      cast_grads.push_back(dev_.alloc(comm_dtype_, {s->numel}, s->p->name + ".grad_comm", MemCategory::comm_buffers));
      dev_.cast(cast_grads.back(), g);
      g = cast_grads.back();
    }
    const std::int64_t full = s->numel / s->shard_numel;  // ranks whose chunk is all real
    ZC_ASSERT(decide::zero3_shard_real_numel<std::int64_t>(s->numel, world_, 0) ==
                  std::min(s->numel, s->shard_numel), "{}: rank 0's chunk", s->p->name);
    dev_.copy_2d(in.narrow(col, in.numel() - col), g, full, s->shard_numel,
                 decide::shard_start<std::int64_t>(chunks, 1), s->shard_numel);
    if (full < world_) {
      const std::int64_t lo = decide::zero3_shard_real_begin<std::int64_t>(s->numel, world_, static_cast<int>(full));
      const std::int64_t len = decide::zero3_shard_real_numel<std::int64_t>(s->numel, world_, static_cast<int>(full));
      if (len > 0) {
        dev_.copy(in.narrow(decide::shard_start<std::int64_t>(chunks, full) + col, len), g.narrow(lo, len));
      }
    }
    col += s->shard_numel;
  }
  dev_.div(in, static_cast<double>(world_));
  Pending pend;
  pend.params = std::move(params);
  pend.in = in;  // a real backend reads it asynchronously: keep it alive until the wait
  if (cfg_.zero.reduce_scatter) {
    // In place, as reduce_scatter_coalesced calls it (coalesced_collectives.py: the output is this
    // rank's chunk of the flat input): no buffer of its own.
    pend.out = in.narrow(decide::shard_start<std::int64_t>(chunks, rank_), chunks);
    pend.work = comm_.reduce_scatter(pend.out, in, {.op = ReduceOp::sum, .async_op = overlap_});
  } else {  // all-reduce the whole bucket and keep this rank's section
    pend.work = comm_.all_reduce(in, {.op = ReduceOp::sum, .async_op = overlap_});
    pend.out = in.narrow(decide::shard_start<std::int64_t>(chunks, rank_), chunks);
  }
  for (Shard* s : pend.params) s->p->grad = Tensor();  // copied into the input above
  bucket_params_.clear();
  bucket_elements_ = 0;
  if (overlap_) {
    // DeepSpeed issues the reduce-scatter on its reduction stream and lets go of its flat input
    // (the output is a view of it) at once (stage3.py __reduce_and_partition_ipg_grads), so torch
    // counts it free here, not at the epilogue's wait (Note [Stream-ordered free]). The engine
    // keeps it until the wait.
    pend.in.storage()->release_accounting();
    pending_.push_back(std::move(pend));
  } else {
    finish(pend);
  }
}

void Zero3Optimizer::finish(Pending& pend) {
  if (pend.work) pend.work->wait();
  partition_grads(pend.params, pend.out);
}

void Zero3Optimizer::wait_all() {
  for (Pending& p : pending_) finish(p);
  pending_.clear();
}

// SPEC 5: micro_step_id == 0 -> the grad partition is a copy; otherwise it accumulates. A rank
// whose slice of a param is padding only skips it.
void Zero3Optimizer::partition_grads(const std::vector<Shard*>& params, const Tensor& out) {
  std::int64_t at = 0;
  for (Shard* s : params) {
    Tensor part = out.narrow(at, s->shard_numel);
    at += s->shard_numel;
    if (decide::zero3_shard_real_numel<std::int64_t>(s->numel, world_, rank_) == 0) continue;  // padding only
    Tensor buf = grad_partition_.narrow(s->offset, s->shard_numel);
    // DeepSpeed casts the partition to grad_accum_dtype before it adds it: a separate rounding
    // unless the cast only widens a 16-bit result to f32.
    if (micro_step_id_ != 0 && part.dtype() != buf.dtype() && !(is_16bit(part.dtype()) && buf.dtype() == DType::f32)) {
      Tensor c = dev_.alloc(buf.dtype(), {s->shard_numel}, "grad_partition_cast", MemCategory::temporaries);
      dev_.cast(c, part);
      part = c;
    }
    if (micro_step_id_ == 0) {
      dev_.cast(buf, part);
    } else {
      dev_.axpy(buf, 1.0, part);
    }
    if (cpu_ && cfg_.zero.offload_optimizer == OffloadDevice::cpu && boundary_) {
      cpu_->to_cpu(fp32_grad_cpu_.narrow(s->offset, s->shard_numel), buf);
    }
  }
  any_partitioned_grads_ = true;
}

void Zero3Optimizer::independent_gradient_partition_epilogue() {
  reduce_and_partition_ipg_grads();
  wait_all();
  std::fill(already_reduced_.begin(), already_reduced_.end(), 0);
  epilogue_ran_ = true;
  record(fmt::format("zero3 epilogue: micro_step_id {} boundary {}", micro_step_id_, boundary_));
}

// stage3.py: the norm is a double tensor (get_norm_dtype()), or a FloatTensor under
// offload_optimizer, and the combined scale is torch arithmetic on it (unscale_and_clip_grads);
// the f32 copy is made after the norm. Only fp16 tests for overflow (a one-byte all_reduce MAX);
// a bf16 norm that is not finite is stepped on.
StepPlan Zero3Optimizer::step_plan() const {
  const DType dt = cfg_.zero.offload_optimizer == OffloadDevice::cpu ? DType::f32 : DType::f64;
  // _overflow_check_and_loss_scale_update: fp16 only, whatever bf16.check_grad_overflow says.
  return StepPlan{.overflow = cfg_.fp16.enabled ? OverflowCheck::all_reduce : OverflowCheck::none,
                  .sum_sq_before_overflow = false,
                  .fp32_grads_before_norm = false,
                  .norm_partitioned = true,
                  .norm_dtype = dt,
                  .torch_root = true,  // `total_norm ** (1. / norm_type)` on a tensor, both paths
                  .combined_dtype = dt,
                  .fp32_grads_label = "fp32_grad"};
}

StepPrep Zero3Optimizer::prepare_step() {
  wait_all();
  partition_all_parameters();  // stage3.py:2878, before the overflow check: a skipped step too
  micro_step_id_ = 0;      // _pre_step: the next forward must not count the last backward
  epilogue_ran_ = false;
  if (!any_partitioned_grads_) {
    throw UsageError(fmt::format("rank {}: step() at an accumulation boundary without reduced "
                                 "gradients ({}): call backward() at the boundary first", rank_, name()));
  }
  if (cfg_.zero.offload_optimizer == OffloadDevice::cpu) {
    return StepPrep{.grads = fp32_grad_cpu_, .where = &cpu_->cpu()};
  }
  return StepPrep{.grads = grad_partition_, .where = &dev_, .flatten_later = true};
}

// _prepare_fp32_grad_for_sub_group (stage3.py:2686): flatten(averaged_gradients) is torch.cat of
// the params' partitions, a copy in the model dtype where there are two or more (one is returned
// as it is), and .to(f32) casts that copy; in f32 the copy is the step's fp32 grads. The 16-bit
// copy goes once cast (the engine drops prep.grads before the update, with nothing allocated
// between).
void Zero3Optimizer::flatten_grads(StepPrep& prep) {
  if (shards_.size() < 2) return;
  Tensor flat = dev_.alloc(prep.grads.dtype(), prep.grads.shape(), "averaged_gradients_flat",
                           MemCategory::grads);  // [partition] model dtype
  dev_.copy(flat, prep.grads);
  prep.grads = flat;
  prep.grads_are_fp32_copies = flat.dtype() == DType::f32;
}

// stage3.py step's norm (get_grad_norm_direct, :2455) reads averaged_gradients, each param's
// partition of the flat, as ZeRO-1/2's does: one f64 copy a param and its 0-dim norm, the list
// going when the function returns (Note [ZeRO-1/2's gradient norm, as DeepSpeed allocates it]).
// Under offload_optimizer the norm is the CPU side's.
double Zero3Optimizer::norm_sum_sq(const StepPrep& prep) {
  if (cfg_.zero.offload_optimizer == OffloadDevice::cpu) return ZeroOptimizer::norm_sum_sq(prep);
  std::vector<Tensor> pieces, norms;
  pieces.reserve(shards_.size());
  for (const Shard& s : shards_) pieces.push_back(prep.grads.narrow(s.offset, s.shard_numel));
  return sum_sq_by_piece_f64(dev_, pieces, norms);
}

void Zero3Optimizer::skip_step() {
  global_grad_norm_ = Tensor();  // _global_grad_norm = float("inf") (stage3.py:2829)
  zero_grad();
  any_partitioned_grads_ = false;
  if (cfg_.zero.offload_optimizer == OffloadDevice::cpu) cpu_->cpu().fill(fp32_grad_cpu_, 0.0);
}

void Zero3Optimizer::update(const Tensor& grads32, double norm, double combined) {
  const bool offload_opt = cfg_.zero.offload_optimizer == OffloadDevice::cpu;
  // `self._global_grad_norm = scaled_global_grad_norm / self.loss_scale` (stage3.py:2897), before
  // the optimizer steps; the last step's goes when the engine's step ends (as ZeRO-1/2's).
  if (!offload_opt) {
    last_global_grad_norm_ = global_grad_norm_;
    global_grad_norm_ = dev_.alloc(step_plan().norm_dtype, {1}, "_global_grad_norm", MemCategory::temporaries);  // 0-dim
  }
  base_->step(master_, grads32);
  if (cfg_.zero.offload_param == OffloadDevice::cpu) {
    if (offload_opt) {
      cpu_->cpu().cast(fp16_partition_, master_);  // both on the CPU
    } else {
      cpu_->to_cpu(fp16_partition_, master_);  // updated on the device, params kept on the CPU
    }
  } else if (offload_opt) {
    cpu_->to_device(fp16_partition_, master_);
  } else {
    dev_.cast(fp16_partition_, master_);
  }
  if (offload_opt) cpu_->cpu().fill(fp32_grad_cpu_, 0.0);
  any_partitioned_grads_ = false;
  record(fmt::format("step {}: norm {:.9g} combined scale {:.9g}", base_->steps(), norm, combined));
}

// _post_step, after _release_sub_group freed the fp32 grads (Note [ZeRO-3's parameter
// coordinator]): at the step's end the persistent params are gathered again, the step's fp32 grad
// partition already gone (measured on DeepSpeed: llama-tiny's step-0 peak is 9,467 B lower than
// with the two at once).
void Zero3Optimizer::post_step() {
  gather_persistent_parameters();
  last_global_grad_norm_ = Tensor();  // step() has returned: the engine takes the new norm
}

void Zero3Optimizer::zero_grad() {
  for (Shard& s : shards_) s.p->grad = Tensor();
  micro_step_id_ = 0;
  epilogue_ran_ = false;  // or the next forward would count the last backward
}

std::vector<Tensor> Zero3Optimizer::averaged_gradients() {
  if (!any_partitioned_grads_) return {};
  return {cfg_.zero.offload_optimizer == OffloadDevice::cpu ? fp32_grad_cpu_ : grad_partition_};
}

std::vector<double> Zero3Optimizer::gathered_grads() {
  Tensor mine = dev_.alloc(accum_dtype_, {grad_partition_.numel()}, "grad_partition_copy",
                           MemCategory::temporaries);
  if (any_partitioned_grads_) dev_.copy(mine, grad_partition_);
  return gather_partitions(mine);
}

}  // namespace zc
