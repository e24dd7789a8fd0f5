// Zero12Optimizer: construction, hooks, ipg buckets and reductions (SPEC 4). The step is in
// zero12_step.cpp.
//
// Note [Bucket reduction]
// DeepSpeed divides a bucket by the world size, then (use_multi_rank_bucket_allreduce, the
// default) all-reduces the per-destination slices together and each rank keeps the slices of its
// own partition; with it off, each destination's slices are reduced to their owner. Either way a
// rank ends with the reduced values of its partition. With overlap_comm the reduction is async:
// what follows it (copying own grads into grads_in_partition, dropping others) runs when it is
// waited, which is before the bucket buffer is written again, or at the epilogue.
#include "engine/zero12_optimizer.h"

#include "engine/decisions.h"
#include "engine/errors.h"

#include <algorithm>

namespace zc {

Zero12Optimizer::Zero12Optimizer(const Config& cfg, Module& model, Device& dev, Comm& comm,
                                 const Options& opts, ParamSelect select)
    : ZeroOptimizer(cfg, model, dev, comm, opts, select), world_(comm.size()), rank_(comm.rank()),
      partition_gradients_(cfg.zero.stage >= 2), overlap_(cfg.zero.overlap_comm),
      contiguous_(cfg.zero.contiguous_gradients || cfg.zero.offload_optimizer == OffloadDevice::cpu),
      use_accum_attr_(accum_dtype_ != dtype_), compact_(accum_dtype_ == DType::f32 && dtype_ != DType::f32),
      buffer_dtype_(use_accum_attr_ && !partition_gradients_ ? accum_dtype_ : dtype_),
      bucket_size_(cfg.zero.reduce_bucket_size),
      cpu_offload_(cfg.zero.offload_optimizer == OffloadDevice::cpu) {
  // DeepSpeed: "CPU-Offload requires contiguous gradients".
  if (cpu_offload_) cpu_.emplace(dev_, opts.cpu_device);
  has_hooks_ = partition_gradients_ || overlap_ || contiguous_ || use_accum_attr_;
  std::vector<std::int64_t> numels;
  for (Parameter* p : params_) numels.push_back(p->numel());
  // round_robin_gradients reorders the flat buffer only: reductions still walk the params in
  // their group order (DeepSpeed's bit16_groups), the partitions follow the buffer.
  layout_ = FlatLayout::build(numels, world_, true,
                              cfg.zero.round_robin_gradients ? FlatLayout::round_robin_order(num_params(), world_)
                                                             : std::vector<int>{});
  // align_dense_tensors (runtime/utils.py:994) pads the params' list with a zero tensor up to the
  // alignment, which lives while they are flattened.
  Tensor pad;
  if (layout_.padded > layout_.numel) {
    pad = dev_.alloc(dtype_, {layout_.padded - layout_.numel}, "align_dense_tensors.pad_tensor",
                     MemCategory::temporaries);
  }
  flat_ = dev_.alloc(dtype_, {layout_.padded}, "bit16_groups_flat",
                     MemCategory::params);  // [padded] model dtype
  pad = Tensor();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    Tensor view = flat_.narrow(layout_.offsets[i], p.numel());
    dev_.cast(view, p.data);
    p.data = view.view(p.shape);
  }
  const std::int64_t pn = layout_.partition_numel;
  if (cpu_offload_) {
    master_ = cpu_->alloc(DType::f32, {pn}, "single_partition_of_fp32_groups",
                          MemCategory::master);  // [pn] f32, CPU
    cpu_->to_cpu(master_, flat_.narrow(layout_.partition_start(rank_), pn));
    // Note [ZeRO-1/2 offload's staging buffers]
    bit16_buffer_cpu_ = cpu_->alloc(dtype_, {pn}, "param_buffer_of_bit16_for_cpu_offload",
                                    MemCategory::comm_buffers);
    if (select != ParamSelect::expert) {
      std::int64_t largest = 0;
      for (Parameter* p : model.named_parameters()) {
        if (p->requires_grad) largest = std::max(largest, p->numel());
      }
      temp_grad_cpu_ = cpu_->alloc(dtype_, {largest}, "temp_grad_buffer_for_cpu_offload",
                                   MemCategory::comm_buffers);
      temp_grad_gpu_ = dev_.alloc(dtype_, {largest}, "temp_grad_buffer_for_gpu_offload",
                                  MemCategory::comm_buffers);
    }
    fp32_grad_cpu_ = cpu_->alloc(DType::f32, {pn}, "single_partition_of_fp32_groups.grad",
                                   MemCategory::grads);
    base_ = std::make_unique<BaseOptimizer>(cfg.optimizer, cpu_->cpu(), pn, "optimizer",
                                            opts.adam_simd_width);  // DeepSpeedCPUAdam
  } else {
    master_ = dev_.alloc(DType::f32, {pn}, "single_partition_of_fp32_groups",
                         MemCategory::master);  // [pn] f32
    dev_.cast(master_, flat_.narrow(layout_.partition_start(rank_), pn));
    base_ = std::make_unique<BaseOptimizer>(cfg.optimizer, dev_, pn, "optimizer", opts.adam_simd_width);
    // initialize_optimizer_states (stage_1_and_2.py:934): a zero f32 gradient partition, attached
    // to the master and dropped again; it sets construction's peak (Note [Lazy optimizer state]).
    (void)dev_.alloc(DType::f32, {pn}, "initialize_optimizer_states.grad", MemCategory::temporaries);
  }
  is_in_partition_.assign(params_.size(), 0);
  partition_pos_.assign(params_.size(), -1);
  for (int i : layout_.params_in_partition(rank_)) {
    in_partition_.push_back(i);
    is_in_partition_[static_cast<std::size_t>(i)] = 1;
    partition_pos_[static_cast<std::size_t>(i)] = grads_in_partition_numel_;
    grads_in_partition_numel_ += params_[static_cast<std::size_t>(i)]->numel();
  }
  accum_.resize(in_partition_.size());
  already_reduced_.assign(params_.size(), 0);
  compact_src_.assign(params_.size(), Tensor());
  // setup_buckets (stage_1_and_2.py:3266) allocates reduce_bucket_size elements per buffer,
  // however small the model: measured on an H200, 2 x 0.93 GiB for GPT-2 medium at the default 5e8.
  bucket_capacity_ = bucket_size_;
  record(fmt::format("zero{} init: {} params, flat {} padded {} partition {}", cfg.zero.stage,
                     params_.size(), layout_.numel, layout_.padded, pn));
}

void Zero12Optimizer::share_staging_from(ZeroOptimizer& first) {
  if (auto* z = dynamic_cast<Zero12Optimizer*>(&first); z != nullptr && cpu_offload_) {
    temp_grad_cpu_ = z->temp_grad_cpu_;
    temp_grad_gpu_ = z->temp_grad_gpu_;
  }
}

bool Zero12Optimizer::has_gradient_for_reduction(int i) const {
  const Parameter& p = *params_[static_cast<std::size_t>(i)];
  return use_accum_attr_ ? p.grad_accum.defined() : p.grad.defined();
}

Tensor Zero12Optimizer::gradient_for_reduction(int i) {
  Parameter& p = *params_[static_cast<std::size_t>(i)];
  if (!use_accum_attr_) return p.grad;
  if (!p.grad_accum.defined()) return Tensor();
  Tensor g = dev_.alloc(buffer_dtype_, p.shape, p.name + ".grad_reduc",
                        MemCategory::grads);  // [shape] buffer dtype
  dev_.cast(g, p.grad_accum);
  return g;
}

void Zero12Optimizer::fill_grad_accum(Parameter& p) {
  if (!p.grad.defined()) return;
  if (!p.grad_accum.defined()) {
    p.grad_accum = dev_.alloc(accum_dtype_, p.shape, p.name + ".grad_accum", MemCategory::grads);
    dev_.cast(p.grad_accum, p.grad);
  } else {
    dev_.axpy(p.grad_accum, 1.0, p.grad);
  }
  p.grad = Tensor();
}

void Zero12Optimizer::clear_backward_seen_flag() {
  if (epilogue_ran_) {
    for (Parameter* p : params_) p->grad_accum = Tensor();
  }
  epilogue_ran_ = false;
}

void Zero12Optimizer::setup_buckets() {
  if (ready_for_gradients_) return;
  micro_step_id_ += 1;
  if (contiguous_) {
    buffers_.clear();
    buffers_.push_back(dev_.alloc(buffer_dtype_, {bucket_capacity_}, "ipg_buffer_0",
                                  MemCategory::ipg_buckets));  // [cap] buffer dtype
    if (overlap_) buffers_.push_back(dev_.alloc(buffer_dtype_, {bucket_capacity_}, "ipg_buffer_1",
                                                MemCategory::ipg_buckets));
    bucket_index_ = 0;
  }
  ready_for_gradients_ = true;
}

void Zero12Optimizer::on_grad_ready(Parameter& p) {
  if (!has_hooks_) return;
  if (coalescing()) return;  // SPEC 6: grads accumulate locally in .grad while coalescing
  const auto it = std::find(params_.begin(), params_.end(), &p);
  ZC_ASSERT(it != params_.end(), "grad hook for unknown param {}", p.name);
  setup_buckets();
  if (use_accum_attr_) fill_grad_accum(p);
  if (partition_gradients_ || overlap_) {
    reduce_ready_partitions_and_remove_grads(static_cast<int>(it - params_.begin()));
  }
}

void Zero12Optimizer::reduce_ready_partitions_and_remove_grads(int i) {
  if (coalescing()) return;  // the coalescing guard (see Note [Flush order] in engine.cpp)
  if (partition_gradients_ || boundary_) reduce_independent_p_g_buckets_and_remove_grads(i);
}

void Zero12Optimizer::reduce_independent_p_g_buckets_and_remove_grads(int i) {
  Parameter& p = *params_[static_cast<std::size_t>(i)];
  const std::int64_t n = p.numel();
  if (n == 0) return;
  const decide::BucketAdd<std::int64_t> add = decide::add_to_bucket<std::int64_t>(bucket_elements_, n, bucket_size_, false);
  if (add.flush_before) {
    reduce_ipg_grads();
    if (contiguous_ && overlap_) bucket_index_ = 1 - bucket_index_;
  }
  ZC_ASSERT(bucket_elements_ == add.offset, "rank {}: param {} lands at {} of the bucket, the loop says {}", rank_,
            p.name, bucket_elements_, add.offset);
  if (already_reduced_[static_cast<std::size_t>(i)]) {
    throw UsageError(fmt::format(
        "rank {}: The parameter {} has already been reduced. Gradient computed twice for this "
        "partition. Multiple gradient reductions are currently not supported", rank_, p.name));
  }
  already_reduced_[static_cast<std::size_t>(i)] = 1;
  Tensor grad = gradient_for_reduction(i);
  if (!grad.defined()) {
    throw UsageError(fmt::format("rank {}: invalid to reduce param {} with a None gradient", rank_, p.name));
  }
  if (contiguous_ && add.oversize) {
    extra_large_ = i;  // reduced on its own, in place (oversize-param path)
    p.grad = grad;
  } else if (contiguous_) {
    wait_buffer(bucket_index_);
    Tensor slot = buffers_[static_cast<std::size_t>(bucket_index_)].narrow(add.offset, n);
    dev_.copy(slot, grad.view({n}));
    p.grad = slot.view(p.shape);
  } else {
    bucket_grads_.push_back(grad);
    p.grad = grad;
  }
  bucket_elements_ = add.elements_after;
  bucket_params_.push_back(i);
}

void Zero12Optimizer::reduce_ipg_grads() {
  if (bucket_params_.empty()) return;
  Pending pend;
  if (contiguous_ && extra_large_ >= 0) {
    ZC_ASSERT(bucket_params_.size() == 1, "more than 1 param in ipg bucket with an extra-large param");
    Parameter& p = *params_[static_cast<std::size_t>(extra_large_)];
    pend = average_tensor(p.grad.view({p.numel()}), bucket_params_);
    extra_large_ = -1;
  } else if (contiguous_) {
    pend = average_tensor(buffers_[static_cast<std::size_t>(bucket_index_)].narrow(0, bucket_elements_),
                          bucket_params_);
    pend.buffer = bucket_index_;
  } else {
    // buffered_reduce_fallback: flatten, reduce, copy back into every grad.
    Tensor flat = dev_.alloc(buffer_dtype_, {bucket_elements_}, "reduce_fallback_flat",
                             MemCategory::comm_buffers);  // [elements] buffer dtype
    std::int64_t at = 0;
    std::vector<std::pair<Tensor, Tensor>> back;
    for (const Tensor& g : bucket_grads_) {
      Tensor slot = flat.narrow(at, g.numel());
      dev_.copy(slot, g.view({g.numel()}));
      back.emplace_back(g.view({g.numel()}), slot);
      at += g.numel();
    }
    pend = average_tensor(flat, bucket_params_, true);
    pend.copy_back.insert(pend.copy_back.end(), back.begin(), back.end());  // after flat's own cast back
  }
  bucket_params_.clear();
  bucket_grads_.clear();
  bucket_elements_ = 0;
  if (overlap_) {
    pending_.push_back(std::move(pend));
  } else {
    finish(pend);
  }
}

// Each param's slices by owning partition (in ascending offset), in bucket order; `at` is the
// slice's position in the bucket's flat buffer.
std::vector<Zero12Optimizer::Slice> Zero12Optimizer::bucket_slices(const std::vector<int>& params) const {
  std::vector<Slice> out;
  std::int64_t at = 0;
  for (int i : params) {
    const auto parts = layout_.partitions_of_param(i);
    const std::int64_t n = layout_.numels[static_cast<std::size_t>(i)];
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const std::int64_t lo = parts[k].second, hi = k + 1 < parts.size() ? parts[k + 1].second : n;
      out.push_back({parts[k].first, at + lo, hi - lo, i});
    }
    at += n;
  }
  return out;
}

// Each path casts to the communication dtype where DeepSpeed's does (Note [The communication
// dtype]): gradient_reduction_w_predivide and the fallback's allreduce_bucket before they scale,
// the reduce_scatter path after its division, which runs on the bucket in its own dtype.
// pend.reduced is the result in the comm dtype (what the compact fp32 partition adds); a cast
// result is cast back into `flat` once the reduction completes. The bucket all-reduce keeps its
// chunks instead (Note [The bucket all-reduce's flat]): each casts its own flat.
Zero12Optimizer::Pending Zero12Optimizer::average_tensor(const Tensor& flat, std::vector<int> params, bool fallback) {
  Pending pend;
  pend.params = std::move(params);
  const double w = static_cast<double>(averaging_world_);
  const bool cast = flat.dtype() != comm_dtype_;
  auto keep = [&](const Tensor& red) {
    pend.reduced = red;
    if (cast) pend.copy_back.emplace_back(flat, red);
  };
  if (!fallback && !cfg_.zero.reduce_scatter) {  // gradient_reduction_w_predivide
    const Tensor red = comm_image(flat, "gradient_reduction_w_predivide_comm");
    const double f = cfg_.gradient_predivide_factor;
    if (cfg_.prescale_gradients) {
      dev_.div(red, w);
    } else if (f != 1.0) {
      dev_.scale(red, 1.0 / f);
    }
    pend.works.push_back(comm_.all_reduce(red, {.op = ReduceOp::sum, .async_op = overlap_}));
    if (!cfg_.prescale_gradients && f != w) pend.post_scale = red;
    keep(red);
    return pend;
  }
  if (fallback) {  // buffered_reduce_fallback -> allreduce_bucket(divide=True)
    const Tensor red = comm_image(flat, "allreduce_bucket_comm");
    dev_.div(red, w);
    pend.works.push_back(comm_.all_reduce(red, {.op = ReduceOp::sum, .async_op = overlap_}));
    keep(red);
    return pend;
  }
  dev_.div(flat, w);  // gradient_average: pre-divide by the dp world, in the bucket's dtype
  if (cfg_.zero.use_multi_rank_bucket_allreduce) {
    // rank_and_offsets: each param's slices by owning partition, in bucket order; a slice joins the
    // previous one when both go to the same partition (not for this rank's own slices under the
    // compact fp32 buffer, which each get an output). Then allreduce_and_scatter: a chunk closes as
    // soon as its elements exceed reduce_bucket_size, the last one at the end.
    pend.bucket = flat;
    std::vector<Slice> entries;
    for (const Slice& sl : bucket_slices(pend.params)) {
      const bool has_output = compact_ && sl.dst == rank_;
      if (!entries.empty() && !has_output && entries.back().dst == sl.dst) {
        entries.back().numel += sl.numel;
      } else {
        entries.push_back(sl);
      }
    }
    std::vector<Slice> chunk;
    std::int64_t count = 0;
    for (const Slice& e : entries) {
      chunk.push_back(e);
      count += e.numel;
      if (count > bucket_size_) {
        allreduce_chunk(pend, std::move(chunk), count);
        chunk.clear();
        count = 0;
      }
    }
    if (!chunk.empty()) allreduce_chunk(pend, std::move(chunk), count);
    return pend;
  }
  const Tensor red = comm_image(flat, "allreduce_bucket_comm");
  keep(red);
  // Per destination, in order of first appearance: reduce the owner's slices to the owner.
  std::vector<std::pair<int, std::vector<Tensor>>> per_dst;
  for (const Slice& sl : bucket_slices(pend.params)) {
    auto it = std::find_if(per_dst.begin(), per_dst.end(), [&](const auto& e) { return e.first == sl.dst; });
    if (it == per_dst.end()) it = per_dst.insert(per_dst.end(), {sl.dst, {}});
    it->second.push_back(red.narrow(sl.at, sl.numel));
  }
  for (auto& [dst, slices] : per_dst) {
    std::int64_t total = 0;
    for (const Tensor& s : slices) total += s.numel();
    Tensor tmp = dev_.alloc(comm_dtype_, {total}, "reduce_to_owner", MemCategory::comm_buffers);  // [total] comm dtype
    std::int64_t off = 0;
    for (const Tensor& s : slices) {
      dev_.copy(tmp.narrow(off, s.numel()), s);
      off += s.numel();
    }
    comm_.reduce(tmp, {.op = ReduceOp::sum, .root = dst});
    if (dst == rank_) {
      off = 0;
      for (const Tensor& s : slices) {
        dev_.copy(s, tmp.narrow(off, s.numel()));
        off += s.numel();
      }
    }
  }
  return pend;
}

// Note [The bucket all-reduce's flat]
// DeepSpeed's allreduce_and_copy_with_multiple_ranks (stage_1_and_2.py:1516) hands a chunk's slices
// to allreduce_bucket (:2359), which flattens them into a new buffer in the bucket's dtype and casts
// that where the communication dtype differs; after the all-reduce each slice this rank owns is
// copied back from the result (and the compact fp32 partition adds it), the others keep their
// divided, unreduced values, and the flat goes when the call returns. The engine does the same,
// one chunk at a time without overlap_comm. A chunk of one slice is not copied: torch's
// _flatten_dense_tensors returns the tensor itself, so it is reduced in the bucket (cast, where the
// dtypes differ). With overlap_comm the all-reduce is asynchronous and reads its input after
// issue, so each chunk's flat lives until the bucket's reduction is waited, but it is counted free
// at issue, where DeepSpeed lets go of it (on a GPU the caching allocator holds the block for the
// reduction stream, record_stream, and no longer counts it allocated).
void Zero12Optimizer::allreduce_chunk(Pending& pend, std::vector<Slice> slices, std::int64_t numel) {
  Chunk c;
  if (slices.size() == 1) {
    // torch's _flatten_dense_tensors of one tensor is a view of it: reduced in the bucket itself.
    c.flat = pend.bucket.narrow(slices.front().at, numel);
  } else {
    c.flat = dev_.alloc(pend.bucket.dtype(), {numel}, "allreduce_bucket_flat",
                        MemCategory::comm_buffers);  // [chunk] bucket dtype
    std::int64_t off = 0;
    for (const Slice& sl : slices) {
      dev_.copy(c.flat.narrow(off, sl.numel), pend.bucket.narrow(sl.at, sl.numel));
      off += sl.numel;
    }
  }
  c.comm = comm_image(c.flat, "allreduce_bucket_comm");
  c.slices = std::move(slices);
  WorkPtr work = comm_.all_reduce(c.comm, {.op = ReduceOp::sum, .async_op = overlap_});
  if (overlap_) {
    // Counted free as DeepSpeed lets go of them, kept until the wait (Note [Stream-ordered free]).
    if (c.slices.size() > 1) c.flat.storage()->release_accounting();
    if (c.comm.storage() != c.flat.storage()) c.comm.storage()->release_accounting();
    pend.works.push_back(std::move(work));
    pend.chunks.push_back(std::move(c));
    return;
  }
  if (work) work->wait();
  complete_chunk(pend.bucket, c);
}

// The own slices back into the bucket from the comm-dtype result; under the compact fp32 buffer
// where that dtype is not the bucket's, each own slice's result is kept for the epilogue to add.
void Zero12Optimizer::complete_chunk(const Tensor& bucket, const Chunk& c) {
  const bool compact_from_comm = compact_ && c.comm.dtype() != buffer_dtype_;
  std::int64_t off = 0;
  for (const Slice& sl : c.slices) {
    if (sl.dst == rank_) {
      const Tensor synced = c.comm.narrow(off, sl.numel);
      const Tensor dst = bucket.narrow(sl.at, sl.numel);
      // A one-slice chunk in the bucket's dtype was reduced in place.
      if (synced.storage() != dst.storage()) copy_or_cast(dst, synced);
      if (compact_from_comm) {
        const auto [src, n] = partition_slice(sl.param);
        ZC_ASSERT(n == sl.numel, "param {}'s own slice is {} elements, its chunk slice {}", sl.param, n, sl.numel);
        keep_comm_result(sl.param, synced, src);
      }
    }
    off += sl.numel;
  }
}

void Zero12Optimizer::copy_or_cast(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) {
    dev_.copy(dst, src);
  } else {
    dev_.cast(dst, src);
  }
}

// A copy of param i's comm-dtype result (`result` holds its elements from `at` on), so that the
// comm image it came from is freed now, as DeepSpeed frees it once added; the copy lives until the
// epilogue adds it (a ledger difference of the param's numel x 4 bytes, under grads). Only this
// rank's slice of it is read for the step; the rest is zeroed where `result` does not cover it.
void Zero12Optimizer::keep_comm_result(int i, const Tensor& result, std::int64_t at) {
  Parameter& p = *params_[static_cast<std::size_t>(i)];
  Tensor keep = dev_.alloc(accum_dtype_, {p.numel()}, p.name + ".reduced_comm", MemCategory::grads);
  if (result.numel() < p.numel()) dev_.fill(keep, 0.0);
  dev_.cast(keep.narrow(at, result.numel()), result);
  compact_src_[static_cast<std::size_t>(i)] = keep;
}

void Zero12Optimizer::finish(Pending& pend) {
  for (const WorkPtr& w : pend.works) {
    if (w) w->wait();
  }
  if (pend.post_scale.defined()) {
    dev_.scale(pend.post_scale, cfg_.gradient_predivide_factor / static_cast<double>(averaging_world_));
    pend.post_scale = Tensor();
  }
  for (const Chunk& c : pend.chunks) complete_chunk(pend.bucket, c);
  pend.chunks.clear();
  for (auto& [dst, src] : pend.copy_back) copy_or_cast(dst, src);
  // The compact fp32 partition adds the reduction's comm-dtype result, not its cast back.
  const bool compact_from_comm = compact_ && pend.reduced.defined() && pend.reduced.dtype() != buffer_dtype_;
  std::int64_t at = 0;
  for (int i : pend.params) {
    Parameter& p = *params_[static_cast<std::size_t>(i)];
    const bool mine = is_in_partition_[static_cast<std::size_t>(i)] != 0;
    if (compact_from_comm && mine) keep_comm_result(i, pend.reduced.narrow(at, p.numel()), 0);
    at += p.numel();
    if (partition_gradients_ && !mine) {
      p.grad = Tensor();  // other ranks own it
    } else if (contiguous_ && mine) {
      copy_grads_in_partition(i);
    }
  }
}

void Zero12Optimizer::wait_buffer(int index) {
  // FIFO: everything issued before the last reduction of this buffer completes first.
  std::size_t last = pending_.size();
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    if (pending_[k].buffer == index) last = k;
  }
  if (last == pending_.size()) return;
  for (std::size_t k = 0; k <= last; ++k) finish(pending_[k]);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(last + 1));
}

void Zero12Optimizer::wait_all() {
  for (Pending& p : pending_) finish(p);
  pending_.clear();
}

void Zero12Optimizer::wait_reduction_stream() { wait_all(); }

// SPEC 6's flush at stage 1/2: wait on the reduction stream, set up the buckets (micro_step_id
// -1 -> 0 for the whole block), reduce every param with a grad in group order, run the epilogue.
void Zero12Optimizer::flush_coalesced_reduction() {
  wait_reduction_stream();
  setup_buckets();
  for (int i = 0; i < num_params(); ++i) {
    if (has_gradient_for_reduction(i)) reduce_ready_partitions_and_remove_grads(i);
  }
  independent_gradient_partition_epilogue();
}

std::pair<std::int64_t, std::int64_t> Zero12Optimizer::partition_slice(int i) const {
  const std::int64_t start = layout_.partition_start(rank_), end = start + layout_.partition_numel;
  const std::int64_t off = layout_.offsets[static_cast<std::size_t>(i)];
  const std::int64_t lo = std::max(off, start);
  const std::int64_t hi = std::min(off + layout_.numels[static_cast<std::size_t>(i)], end);
  return {lo - off, hi - lo};
}

// Offload (SPEC 4): accumulate in the CPU buffer when earlier backwards of this step exist
// (micro_step_id > 0) or later ones will come (not at the boundary); at the boundary copy the
// partition's slice into the fp32 grad on the CPU. KnownBug::B3 is the historical outer gate
// `gradient_accumulation_steps > 1`, which drops backward chunks 1..N-1 when GA = 1.
void Zero12Optimizer::async_accumulate_grad_in_cpu_via_gpu(int i) {
  Parameter& p = *params_[static_cast<std::size_t>(i)];
  auto it = accumulated_grads_in_cpu_.find(i);
  if (it == accumulated_grads_in_cpu_.end()) {
    it = accumulated_grads_in_cpu_.emplace(i, cpu_->alloc(dtype_, {p.numel()}, p.name + ".accumulated_grads_in_cpu",
                                                  MemCategory::grads)).first;
  }
  if (micro_step_id_ > 0) {  // bring the running sum back and add this backward's grad
    // into the kept buffer (Note [ZeRO-1/2 offload's staging buffers]), as DeepSpeed copies
    Tensor tmp = temp_grad_gpu_.narrow(0, p.numel());
    cpu_->to_device(tmp, it->second);
    dev_.axpy(p.grad.view({p.numel()}), 1.0, tmp);
  }
  cpu_->to_cpu(it->second, p.grad.view({p.numel()}));
}

// set_norm_for_param_grad_in_gpu and the compact path (stage_1_and_2.py:1873, :2152): the piece
// of this rank's partition in get_norm_dtype() (f64, beside the grad), and its 0-dim norm, kept in
// norm_for_param_grads until the step's reset_cpu_buffers; the copy goes once the norm is taken.
// Memory only: the step's norm is the same sum of squares, taken from the fp32 partition
// (ZeroOptimizer::norm_sum_sq).
void Zero12Optimizer::keep_offload_piece_norm(int i, const Tensor& piece) {
  Tensor f64 = dev_.alloc(DType::f64, {piece.numel()}, "norm_for_param_grads.f64_piece",
                          MemCategory::temporaries);
  dev_.cast(f64, piece);
  Tensor norm = dev_.alloc(DType::f64, {1}, "norm_for_param_grads",
                           MemCategory::temporaries);  // 0-dim f64
  norm_for_param_grads_[i] = norm;
}

void Zero12Optimizer::async_inplace_copy_grad_to_fp32_buffer_from_gpu(int i) {
  Parameter& p = *params_[static_cast<std::size_t>(i)];
  const auto [src, n] = partition_slice(i);
  const std::int64_t dest = layout_.offsets[static_cast<std::size_t>(i)] + src - layout_.partition_start(rank_);
  Tensor piece = p.grad.view({p.numel()}).narrow(src, n);
  keep_offload_piece_norm(i, piece);
  if (piece.dtype() != DType::f32) {  // src_tensor.to(master dtype), on the device (:1898-1899)
    Tensor f32 = dev_.alloc(DType::f32, {n}, "offload_grad_piece.f32", MemCategory::temporaries);
    dev_.cast(f32, piece);
    piece = f32;
  }
  cpu_->to_cpu(fp32_grad_cpu_.narrow(dest, n), piece);
  p.grad = Tensor();
  offload_grads_ready_ = true;
}

void Zero12Optimizer::copy_grads_in_partition(int i) {
  Parameter& p = *params_[static_cast<std::size_t>(i)];
  if (cpu_offload_ && compact_) {  // every backward adds into the fp32 partition (see compact_)
    const auto [src, n] = partition_slice(i);
    const std::int64_t dest = layout_.offsets[static_cast<std::size_t>(i)] + src - layout_.partition_start(rank_);
    Tensor& from = compact_src_[static_cast<std::size_t>(i)];
    const Tensor source = from.defined() ? from : p.grad.view({p.numel()});
    if (boundary_) keep_offload_piece_norm(i, source.narrow(src, n));
    Tensor piece = cpu_->alloc(source.dtype(), {n}, "compact_grad_partition_piece", MemCategory::grads);
    cpu_->to_cpu(piece, source.narrow(src, n));
    from = Tensor();
    cpu_->cpu().axpy(fp32_grad_cpu_.narrow(dest, n), 1.0, piece);
    p.grad = Tensor();
    if (boundary_) offload_grads_ready_ = true;
    return;
  }
  if (cpu_offload_) {
    const bool accumulate = opts_.bugs.has(KnownBug::B3_offload_copy_gate)
                                ? cfg_.gradient_accumulation_steps > 1
                                : (micro_step_id_ > 0 || !boundary_);
    if (accumulate) async_accumulate_grad_in_cpu_via_gpu(i);
    if (boundary_) async_inplace_copy_grad_to_fp32_buffer_from_gpu(i);
    return;
  }
  if (!grads_in_partition_.defined()) {
    grads_in_partition_ = dev_.alloc(dtype_, {std::max<std::int64_t>(grads_in_partition_numel_, 1)},
                                     "grads_in_partition",
                                     MemCategory::grads);  // [sum numel in partition] model dtype
  }
  Tensor slot = grads_in_partition_.narrow(partition_pos_[static_cast<std::size_t>(i)], p.numel());
  dev_.cast(slot, p.grad.view({p.numel()}));  // the ipg buffer's dtype may be grad_accum_dtype (ZeRO-1)
  p.grad = slot.view(p.shape);
}

void Zero12Optimizer::reduce_gradients() {
  if (!overlap_) {
    for (int i = 0; i < num_params(); ++i) {
      if (has_gradient_for_reduction(i)) reduce_ready_partitions_and_remove_grads(i);
    }
  }
  independent_gradient_partition_epilogue();
}

void Zero12Optimizer::allreduce_gradients() {
  if (partition_gradients_) {
    independent_gradient_partition_epilogue();
  } else if (boundary_) {
    reduce_gradients();
  }
}

void Zero12Optimizer::backward_epilogue() {
  if (use_accum_attr_) {
    for (Parameter* p : params_) fill_grad_accum(*p);
  }
}

}  // namespace zc
