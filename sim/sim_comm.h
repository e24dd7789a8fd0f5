// SimComm: one rank's handle on one simulated group. Every call really reduces (Note [Reduction
// orders]), checks its arguments like every backend, and meets the other ranks at a rendezvous
// keyed by (group, sequence number) in ClusterState.
#pragma once

#include "engine/comm.h"

#include <memory>

namespace zc::sim {

class ClusterState;
struct Group;

class SimComm final : public Comm {
 public:
  // `slot`: the rank's place among the group's simulated members (= group_rank in a full run).
  SimComm(ClusterState& cluster, int global_rank, std::shared_ptr<Group> group, int group_rank,
          int slot);
  ~SimComm() override;

  int rank() const override { return group_rank_; }
  int size() const override;
  std::string name() const override;

  WorkPtr all_reduce(const Tensor& inout, const AllReduceOptions& opts = {}) override;
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in,
                         const ReduceScatterOptions& opts = {}) override;
  WorkPtr all_gather(const Tensor& out, const Tensor& in,
                     const AllGatherOptions& opts = {}) override;
  WorkPtr reduce(const Tensor& inout, const ReduceOptions& opts = {}) override;
  WorkPtr broadcast(const Tensor& inout, const BroadcastOptions& opts = {}) override;
  WorkPtr all_to_all(const Tensor& out, const Tensor& in,
                     const AllToAllOptions& opts = {}) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;

  // For ClusterState: the next sequence number on this group, and who we are.
  std::int64_t next_seq() { return seq_++; }
  int global_rank() const { return global_rank_; }
  int slot() const { return slot_; }
  const std::shared_ptr<Group>& group() const { return group_; }
  void count_op(CollectiveKind k, std::int64_t bytes) { count(k, bytes); }

 private:
  ClusterState& cluster_;
  int global_rank_;
  std::shared_ptr<Group> group_;
  int group_rank_;
  int slot_;
  std::int64_t seq_ = 0;
};

}  // namespace zc::sim
