// SimComm: argument checks, then a rendezvous in ClusterState. Stats count every call on issue.
#include "sim/sim_comm.h"

#include "engine/errors.h"
#include "sim/cluster_state.h"

namespace zc::sim {

SimComm::SimComm(ClusterState& cluster, int global_rank, std::shared_ptr<Group> group,
                 int group_rank, int slot)
    : cluster_(cluster), global_rank_(global_rank), group_(std::move(group)),
      group_rank_(group_rank), slot_(slot) {}

SimComm::~SimComm() = default;

int SimComm::size() const { return group_->size; }
std::string SimComm::name() const { return group_->name; }

WorkPtr SimComm::all_reduce(const Tensor& inout, const AllReduceOptions& opts) {
  comm_check::defined_same_dtype("all_reduce", inout, inout);
  CallSig sig{CollectiveKind::all_reduce, inout.dtype(), inout.numel(), inout.numel(), opts.op, 0};
  return cluster_.issue(*this, sig, inout, inout, opts.async_op);
}

WorkPtr SimComm::reduce_scatter(const Tensor& out, const Tensor& in,
                                const ReduceScatterOptions& opts) {
  comm_check::reduce_scatter(out, in, size(), rank());
  CallSig sig{CollectiveKind::reduce_scatter, in.dtype(), in.numel(), out.numel(), opts.op, 0};
  return cluster_.issue(*this, sig, in, out, opts.async_op);
}

WorkPtr SimComm::all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions& opts) {
  comm_check::all_gather(out, in, size(), rank());
  CallSig sig{CollectiveKind::all_gather, in.dtype(), in.numel(), out.numel(), ReduceOp::sum, 0};
  return cluster_.issue(*this, sig, in, out, opts.async_op);
}

WorkPtr SimComm::reduce(const Tensor& inout, const ReduceOptions& opts) {
  comm_check::defined_same_dtype("reduce", inout, inout);
  comm_check::root("reduce", opts.root, size());
  CallSig sig{CollectiveKind::reduce, inout.dtype(), inout.numel(), inout.numel(), opts.op,
              opts.root};
  return cluster_.issue(*this, sig, inout, inout, opts.async_op);
}

WorkPtr SimComm::broadcast(const Tensor& inout, const BroadcastOptions& opts) {
  comm_check::defined_same_dtype("broadcast", inout, inout);
  comm_check::root("broadcast", opts.root, size());
  CallSig sig{CollectiveKind::broadcast, inout.dtype(), inout.numel(), inout.numel(),
              ReduceOp::sum, opts.root};
  return cluster_.issue(*this, sig, inout, inout, opts.async_op);
}

WorkPtr SimComm::all_to_all(const Tensor& out, const Tensor& in, const AllToAllOptions& opts) {
  comm_check::all_to_all(out, in, size());
  CallSig sig{CollectiveKind::all_to_all, in.dtype(), in.numel(), out.numel(), ReduceOp::sum, 0};
  return cluster_.issue(*this, sig, in, out, opts.async_op);
}

void SimComm::barrier() {
  CallSig sig{CollectiveKind::barrier, DType::f32, 0, 0, ReduceOp::sum, 0};
  cluster_.issue(*this, sig, Tensor(), Tensor(), false);
}

std::unique_ptr<Comm> SimComm::split(int color, int key) {
  if (color < kNoColor) {
    throw UsageError(fmt::format("split: color {} is negative; use kNoColor ({}) to opt out",
                                 color, kNoColor));
  }
  if (group_->size != static_cast<int>(group_->members.size())) {
    throw UsageError(fmt::format("split() on {} in a representative-rank run: the subgroups depend on "
                                 "the ranks not simulated; simulate every rank (Note [Representative "
                                 "ranks])", group_->name));
  }
  CallSig sig{CollectiveKind::split, DType::f32, 0, 0, ReduceOp::sum, 0};
  WorkPtr work = cluster_.issue(*this, sig, Tensor(), Tensor(), false, color, key);
  return cluster_.split_result(static_cast<const SimWork&>(*work));
}

}  // namespace zc::sim
