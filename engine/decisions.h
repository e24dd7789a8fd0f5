// Decisions written once, proved once (DESIGN.md): gating predicates and partition arithmetic as
// small templates over their value type. The engine instantiates them with bool and int64_t; the
// Z3 proofs in props/ instantiate the same templates with z3::expr, so a proof is about the code
// that runs. Keep them free of branches on the value type: only && || ! + - * / %, comparisons and
// if_then_else (a ?: for bool and integers, z3::ite for z3::expr, found by argument-dependent
// lookup). tests/tidy_test.cpp fails when a template here is not both called by the engine and
// instantiated by a proof.
#pragma once

#include <cstdint>

namespace zc::decide {

// `c ? a : b` for the engine's value types. props/proofs.cpp declares the z3::expr overload.
template <class T>
T if_then_else(bool c, T a, T b) {
  return c ? a : b;
}

// ---- backward all-reduce (SPEC 2) ------------------------------------------------------------

// Engine::_backward_epilogue: all-reduce unless disabled or inside no_sync / coalesce.
template <class Bool>
Bool runs_backward_allreduce(Bool enable_backward_allreduce, Bool inside_no_sync) {
  return enable_backward_allreduce && !inside_no_sync;
}

// Engine::allreduce_gradients skips reduction when DeepCompile owns it: an active DeepCompile
// backend that is not a parallelization-only pass set. bug_b8 is the historical gate that forgot
// the parallelization-only case (KnownBug::B8), so AutoSP grads were never reduced.
template <class Bool>
Bool skips_allreduce_for_deepcompile(Bool deepcompile_active, Bool parallelization_pass_only,
                                     Bool bug_b8) {
  return deepcompile_active && (bug_b8 || !parallelization_pass_only);
}

// ---- ZeRO-1/2 flat-group partitioning (SPEC 4) ---------------------------------------------------

// The flat group is padded to a multiple of 2 x world (DeepSpeed's nccl_start_alignment_factor 2).
template <class Int>
Int zero12_padded_numel(Int numel, Int world) {
  const Int align = 2 * world;
  return ((numel + align - 1) / align) * align;
}

template <class Int>
Int zero12_partition_numel(Int numel, Int world) {
  return zero12_padded_numel(numel, world) / world;
}

// Where rank r's equal-sized partition (ZeRO-1/2) or shard (ZeRO-3) starts.
template <class Int>
Int shard_start(Int shard_numel, Int rank) {
  return rank * shard_numel;
}

template <class Int>
Int partition_start(Int numel, Int world, Int rank) {
  return shard_start(zero12_partition_numel(numel, world), rank);
}

// A param [offset, offset + numel), numel >= 1, touches the partitions first..last (DeepSpeed's
// param_to_partition_ids); each starts its slice of the param this far into the param.
template <class Int>
Int first_partition_touched(Int offset, Int partition_numel) {
  return offset / partition_numel;
}
template <class Int>
Int last_partition_touched(Int offset, Int numel, Int partition_numel) {
  return (offset + numel - 1) / partition_numel;
}
template <class Int>
Int slice_begin_in_param(Int offset, Int partition_start) {
  return if_then_else(partition_start > offset, partition_start - offset, offset - offset);
}

// A param [offset, offset + numel) belongs to partition [start, end) if it starts inside it or
// straddles its start (DeepSpeed's get_partition_info).
template <class Int, class Bool = bool>
Bool param_in_partition(Int offset, Int numel, Int start, Int end) {
  return (start <= offset && offset < end) || (offset < start && start < offset + numel);
}

// The ipg bucket flushes before a param when it would pass reduce_bucket_size (SPEC 4); ZeRO-3
// also requires the bucket to hold something. A param larger than the bucket then sits alone.
template <class Int, class Bool = bool>
Bool flushes_bucket_before(Int bucket_elements, Int numel, Int bucket_size, Bool require_nonempty) {
  return bucket_elements + numel > bucket_size && (!require_nonempty || bucket_elements > 0);
}

// One turn of the reducers' bucket loop (Zero12Optimizer and Zero3Optimizer's
// reduce_independent_p_g_buckets_and_remove_grads): whether the bucket flushes before the param,
// where the param lands in its bucket, whether it is the oversize path (a param larger than the
// bucket, reduced from its own .grad instead of a slot of the contiguous buffer), and how many
// elements the bucket holds after it.
template <class Int, class Bool = bool>
struct BucketAdd {
  Bool flush_before;
  Int offset;  // the param's first element within its bucket
  Bool oversize;
  Int elements_after;
};
template <class Int, class Bool = bool>
BucketAdd<Int, Bool> add_to_bucket(Int bucket_elements, Int numel, Int bucket_size, Bool require_nonempty) {
  const Bool flush = flushes_bucket_before<Int, Bool>(bucket_elements, numel, bucket_size, require_nonempty);
  const Int offset = if_then_else(flush, bucket_elements - bucket_elements, bucket_elements);
  return {flush, offset, numel > bucket_size, offset + numel};
}

// ---- ZeRO-3 per-param partitioning (SPEC 5) ------------------------------------------------------

template <class Int>
Int zero3_shard_numel(Int numel, Int world) {
  return (numel + world - 1) / world;
}

// The real (non-padding) elements of rank r's shard of a param: [begin, begin + numel) of the
// param; numel 0 where the shard is padding only.
template <class Int>
Int zero3_shard_real_begin(Int numel, Int world, Int rank) {
  const Int start = shard_start(zero3_shard_numel(numel, world), rank);
  return if_then_else(start < numel, start, numel);
}
template <class Int>
Int zero3_shard_real_numel(Int numel, Int world, Int rank) {
  const Int begin = zero3_shard_real_begin(numel, world, rank), end = begin + zero3_shard_numel(numel, world);
  return if_then_else(end < numel, end, numel) - begin;
}

// ---- DeepCompile (SPEC 3): backend selection, hooks and cleanup --------------------------------

// The compile request: which passes, the deepcompile flag, the ZeRO stage and autotp_size > 1, as
// Engine::compile() gathers them.
template <class Bool, class Int>
struct CompileFacts {
  Bool pass_z1, pass_z3, pass_autosp, pass_autotp;
  Bool deepcompile;
  Int stage;
  Bool autotp_size_ok;
};

// autotp combined with any other pass is a NotImplemented error.
template <class Bool, class Int>
Bool compile_is_error(const CompileFacts<Bool, Int>& f) {
  return f.pass_autotp && (f.pass_z1 || f.pass_z3 || f.pass_autosp);
}
template <class Bool, class Int>
Bool selects_autotp(const CompileFacts<Bool, Int>& f) {
  return f.deepcompile && f.pass_autotp && !compile_is_error(f) && f.autotp_size_ok;
}
// autosp runs on ZeRO 0/1 only; elsewhere it falls back to no DeepCompile backend.
template <class Bool, class Int>
Bool selects_autosp(const CompileFacts<Bool, Int>& f) {
  return f.deepcompile && f.pass_autosp && !f.pass_autotp && f.stage <= 1;
}
// Otherwise the z1/z2/z3 backend of the ZeRO stage; only these load and init the runtime.
template <class Bool, class Int>
Bool selects_zero_backend(const CompileFacts<Bool, Int>& f) {
  return f.deepcompile && !f.pass_autosp && !f.pass_autotp && f.stage >= 1;
}
template <class Bool, class Int>
Bool deepcompile_active(const CompileFacts<Bool, Int>& f) {
  return selects_autotp(f) || selects_autosp(f) || selects_zero_backend(f);
}
template <class Bool, class Int>
Bool uses_parallelization_pass_only(const CompileFacts<Bool, Int>& f) {
  return f.pass_autosp || f.pass_autotp;
}
// The runtime is initialised (get_handle, then init) exactly when a ZeRO backend is installed.
template <class Bool, class Int>
Bool runtime_initialized(const CompileFacts<Bool, Int>& f) {
  return selects_zero_backend(f);
}
// Backward prologue/epilogue hooks. bug_b1: the pre-fix gate `active and not autotp`.
template <class Bool, class Int>
Bool runs_deepcompile_hooks(const CompileFacts<Bool, Int>& f, Bool bug_b1) {
  return deepcompile_active(f) && ((bug_b1 && !f.pass_autotp) || (!bug_b1 && !uses_parallelization_pass_only(f)));
}
// destroy(): cleanup only if the runtime was initialised. bug_b2: upstream's `deepcompile_active`.
template <class Bool, class Int>
Bool destroy_cleans_up_runtime(const CompileFacts<Bool, Int>& f, Bool bug_b2) {
  return (bug_b2 && deepcompile_active(f)) || (!bug_b2 && runtime_initialized(f));
}

}  // namespace zc::decide
