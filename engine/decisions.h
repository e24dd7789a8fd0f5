// Decisions written once, proved once (DESIGN.md): gating predicates and partition arithmetic as
// small templates over their value type. The engine instantiates them with bool and int64_t; the
// Z3 proofs in props/ instantiate the same templates with z3::expr, so a proof is about the code
// that runs. Keep them free of branches on the value type: only && || ! + - * / % and comparisons.
#pragma once

#include <cstdint>

namespace zc::decide {

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
  const Int align = Int(2) * world;
  return ((numel + align - Int(1)) / align) * align;
}

template <class Int>
Int zero12_partition_numel(Int numel, Int world) {
  return zero12_padded_numel(numel, world) / world;
}

template <class Int>
Int partition_start(Int numel, Int world, Int rank) {
  return rank * zero12_partition_numel(numel, world);
}

// A param [offset, offset + numel) belongs to partition [start, end) if it starts inside it or
// straddles its start (DeepSpeed's get_partition_info).
template <class Int, class Bool = bool>
Bool param_in_partition(Int offset, Int numel, Int start, Int end) {
  return (start <= offset && offset < end) || (offset < start && start < offset + numel);
}

// ---- ZeRO-3 per-param partitioning (SPEC 5) ------------------------------------------------------

template <class Int>
Int zero3_shard_numel(Int numel, Int world) {
  return (numel + world - Int(1)) / world;
}

}  // namespace zc::decide
