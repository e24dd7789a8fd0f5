// The collective conformance table, in the spirit of nccl-tests: every op x dtype x count
// (including counts not divisible by the world) x in-place/out-of-place x reduce op x root, on
// inputs crafted so every output is exactly predictable, compared bit for bit. Written against
// Comm and Device only, so the same table runs unchanged on SimComm, MpiComm and NcclComm.
// The in-place axis exists only for reduce_scatter and all_gather: all_reduce, reduce and
// broadcast take one inout tensor in Comm (no out-of-place form), so their cases are all in
// place, and all_to_all has no in-place form. An out-of-place case also checks that its input
// came back unchanged.
#pragma once

#include "engine/comm.h"
#include "engine/device.h"

#include <string>
#include <vector>

namespace zc::conformance {

struct Case {
  CollectiveKind kind = CollectiveKind::all_reduce;
  DType dtype = DType::f32;
  std::int64_t count = 0;  // elements per rank: the buffer for all_reduce/reduce/broadcast,
                           // the output shard for reduce_scatter, the input for all_gather,
                           // and per-peer chunk for all_to_all
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  bool in_place = false;  // out is this rank's slice of in (or in of out); always true for the
                          // inout ops, never for all_to_all
  bool async_op = false;
  std::string name() const;  // "all_reduce f16 count=7 sum in-place async"
};

// Every case for a group of `world` ranks.
std::vector<Case> table(int world);

// Rank `rank`'s input element i: a small integer in [-5, 5], so sums over up to 8 ranks fit the
// mantissa of every dtype (bf16's 8 bits included) and every output is exact.
double input_value(int rank, std::int64_t i, DType dtype = DType::f32);

// Runs one case on this rank and checks its output bit for bit against the exact expectation.
// Returns "" on success, else a message naming the case, rank, element and both bit patterns.
// Every rank of the group must call it with the same case.
std::string run_case(Comm& comm, Device& dev, const Case& c);

}  // namespace zc::conformance
