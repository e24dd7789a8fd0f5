// Comm's shared parts: names, stats, and the argument checks every backend runs first.
#include "engine/comm.h"

#include "engine/errors.h"

namespace zc {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::string_view collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce: return "reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::all_to_all: return "all_to_all";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::split: return "split";
  }
  return "?";
}

std::int64_t CommStats::total_calls() const {
  std::int64_t n = 0;
  for (const OpStats& s : by_kind) n += s.calls;
  return n;
}

std::int64_t CommStats::total_bytes() const {
  std::int64_t n = 0;
  for (const OpStats& s : by_kind) n += s.bytes;
  return n;
}

std::string CommStats::to_string() const {
  std::string out;
  for (int k = 0; k < kCollectiveKinds; ++k) {
    if (by_kind[k].calls == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {} calls {} B", collective_name(static_cast<CollectiveKind>(k)),
                       by_kind[k].calls, by_kind[k].bytes);
  }
  return out.empty() ? "no collectives" : out;
}

void Comm::count(CollectiveKind k, std::int64_t bytes) {
  OpStats& s = stats_.by_kind[static_cast<int>(k)];
  s.calls += 1;
  s.bytes += bytes;
}

namespace comm_check {

void defined_same_dtype(std::string_view op, const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) throw UsageError(fmt::format("{}: undefined tensor", op));
  if (a.dtype() != b.dtype()) {
    throw UsageError(fmt::format("{}: input is {} but output is {}; collectives do not cast",
                                 op, dtype_name(b.dtype()), dtype_name(a.dtype())));
  }
}

// The one overlap a collective allows between its buffers: the small one is exactly this rank's
// slice of the big one (NCCL's in-place form). Any other overlap is undefined behaviour in NCCL and
// MPI, so every backend refuses it.
void in_place_form(std::string_view op, const Tensor& small, const Tensor& big, int rank) {
  if (!small.overlaps(big)) return;
  if (small.storage() == big.storage() && small.byte_begin() == big.byte_begin() + rank * small.nbytes()) return;
  throw UsageError(fmt::format("{}: {} overlaps {} but is not rank {}'s slice of it (the only in-place form); "
                               "use separate buffers", op, small.describe(), big.describe(), rank));
}

void reduce_scatter(const Tensor& out, const Tensor& in, int size, int rank) {
  defined_same_dtype("reduce_scatter", out, in);
  if (in.numel() != out.numel() * size) {
    throw UsageError(fmt::format(
        "reduce_scatter: input has {} elements, expected world ({}) x output ({}) = {}",
        in.numel(), size, out.numel(), out.numel() * size));
  }
  in_place_form("reduce_scatter", out, in, rank);
}

void all_gather(const Tensor& out, const Tensor& in, int size, int rank) {
  defined_same_dtype("all_gather", out, in);
  if (out.numel() != in.numel() * size) {
    throw UsageError(fmt::format(
        "all_gather: output has {} elements, expected world ({}) x input ({}) = {}",
        out.numel(), size, in.numel(), in.numel() * size));
  }
  in_place_form("all_gather", in, out, rank);
}

void all_to_all(const Tensor& out, const Tensor& in, int size) {
  defined_same_dtype("all_to_all", out, in);
  if (in.numel() != out.numel() || in.numel() % size != 0) {
    throw UsageError(fmt::format(
        "all_to_all: input ({}) and output ({}) must have equal sizes divisible by world ({})",
        in.numel(), out.numel(), size));
  }
  if (in.numel() > 0 && out.overlaps(in)) {
    throw UsageError(fmt::format("all_to_all: output {} overlaps input {}; all_to_all has no in-place form, "
                                 "use separate buffers", out.describe(), in.describe()));
  }
}

void root(std::string_view op, int root, int size) {
  if (root < 0 || root >= size) {
    throw UsageError(fmt::format("{}: root {} is outside the group of {} ranks", op, root, size));
  }
}

}  // namespace comm_check

}  // namespace zc
