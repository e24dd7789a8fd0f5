// Note [NCCL tuning model]: the tuning table and the choice, against figures worked by hand from
// NCCL 2.30.7's src/graph/tuning.cc (each expectation's arithmetic is written beside it).
#include "sim/cost_model.h"
#include "sim/nccl_tuning.h"

#include <gtest/gtest.h>

namespace zc::sim {
namespace {

// 8 Hopper GPUs on one NVLink node, rings and trees of 4 channels at 10 GB/s each.
NcclComm one_node_of_eight() {
  NcclComm c;
  c.ranks = 8;
  c.nodes = 1;
  c.comp_cap = 90;
  c.ring = {4, 10.0f, 10.0f, 0.0f, true, true};
  c.tree = c.ring;
  return c;
}

TEST(NcclTuning, AllReduceTableOnOneNodeFollowsTuningCc) {
  const NcclComm c = one_node_of_eight();
  const NcclTuning t = nccl_tune(c);
  const auto ar = NcclFunc::all_reduce;
  // Ring: busBw = 4 x 10; x nRanks / nsteps = 8 / 14. Latency: base + 14 steps x NVLink's.
  EXPECT_FLOAT_EQ(t.bandwidth(ar, NcclAlgo::ring, NcclProto::simple), 40.0f * 8 / 14);
  EXPECT_FLOAT_EQ(t.latency(ar, NcclAlgo::ring, NcclProto::simple), 8.4f + 14 * 3.4f);
  EXPECT_FLOAT_EQ(t.bandwidth(ar, NcclAlgo::ring, NcclProto::ll), 20.0f * 8 / 14);  // min(141, 40 x .5)
  EXPECT_FLOAT_EQ(t.latency(ar, NcclAlgo::ring, NcclProto::ll), 6.6f + 14 * 0.6f);
  EXPECT_FLOAT_EQ(t.bandwidth(ar, NcclAlgo::ring, NcclProto::ll128), 36.8f * 8 / 14);  // 40 x .92
  EXPECT_FLOAT_EQ(t.latency(ar, NcclAlgo::ring, NcclProto::ll128), 14.0f + 14 * 1.9f);
  // Tree all_reduce: min(40 x .92, 4 x 38.7) x .5; latency base + 2 x (7 x NVLink's).
  EXPECT_FLOAT_EQ(t.bandwidth(ar, NcclAlgo::tree, NcclProto::simple), 36.8f * .5f);
  EXPECT_FLOAT_EQ(t.latency(ar, NcclAlgo::tree, NcclProto::simple), 8.4f + 2 * (7 * 4.0f));
  EXPECT_NEAR(t.bandwidth(ar, NcclAlgo::tree, NcclProto::ll), 36.8 / 3.8 * .5, 1e-5);
  EXPECT_NEAR(t.bandwidth(ar, NcclAlgo::tree, NcclProto::ll128), 36.8 * 7 / 9 * .5, 1e-5);
  // No NVLS without NVLink SHARP, no NVLS tree on one node, no PAT for all_reduce.
  EXPECT_EQ(t.bandwidth(ar, NcclAlgo::nvls, NcclProto::simple), 0.0f);
  EXPECT_EQ(t.bandwidth(ar, NcclAlgo::nvls_tree, NcclProto::simple), 0.0f);
  EXPECT_EQ(t.bandwidth(ar, NcclAlgo::pat, NcclProto::simple), 0.0f);
}

TEST(NcclTuning, ChoosesLeastTimeByMessageSize) {
  const NcclComm c = one_node_of_eight();
  const NcclTuning t = nccl_tune(c);
  // 1 KiB: ring LL 15.0 + 1024 / 11428.6 = 15.09 us beats tree LL 15.2 + 1024 / (4842 x .9).
  const NcclChoice small = nccl_choose(c, t, NcclFunc::all_reduce, 1024);
  EXPECT_EQ(small.str(), "Ring/LL");
  EXPECT_NEAR(small.time_us, 15.0 + 1024 / (1000 * 20.0 * 8 / 14), 1e-3);
  // 1 MiB: ring LL128 40.6 + 1048576 / 21028.6 = 90.46 us beats ring Simple 101.9 and LL 106.8.
  const NcclChoice mid = nccl_choose(c, t, NcclFunc::all_reduce, 1 << 20);
  EXPECT_EQ(mid.str(), "Ring/LL128");
  EXPECT_NEAR(mid.time_us, 40.6 + (1 << 20) / (1000 * 36.8 * 8 / 14), 1e-2);
  // Without LL128 (a path NCCL does not allow it on), Simple takes the megabyte.
  NcclComm no128 = c;
  no128.ll128 = false;
  EXPECT_EQ(nccl_choose(no128, nccl_tune(no128), NcclFunc::all_reduce, 1 << 20).str(), "Ring/Simple");
}

TEST(NcclTuning, AcrossNodesTreesCutTheLatencyRingsPayPerNode) {
  // 64 nodes of 8: the ring's all_reduce pays 2 x 63 network steps, the tree 2 x log2(64).
  NcclComm c = one_node_of_eight();
  c.ranks = 512;
  c.nodes = 64;
  const NcclTuning t = nccl_tune(c);
  const auto ar = NcclFunc::all_reduce;
  // Ring Simple: base 8.4 + (1022 - 126) x max(3.4, 1 us x 3) + 126 x 14 (network Ring/Simple).
  EXPECT_FLOAT_EQ(t.latency(ar, NcclAlgo::ring, NcclProto::simple), 8.4f + 896 * 3.4f + 126 * 14.0f);
  // Tree Simple: 8.4 + 2 x (7 x 4.0 + 6 x 14).
  EXPECT_FLOAT_EQ(t.latency(ar, NcclAlgo::tree, NcclProto::simple), 8.4f + 2 * (7 * 4.0f + 6 * 14.0f));
  // Small all_reduces go to the tree; all_gather has no tree, so a ring (PAT needs one GPU per node).
  EXPECT_EQ(nccl_choose(c, t, ar, 4096).algo, NcclAlgo::tree);
  EXPECT_EQ(nccl_choose(c, t, NcclFunc::all_gather, 4096).algo, NcclAlgo::ring);
  EXPECT_EQ(t.bandwidth(NcclFunc::all_gather, NcclAlgo::pat, NcclProto::simple), 0.0f);
  // One GPU per node: PAT is allowed, and its log latency wins at scale.
  NcclComm one = c;
  one.ranks = one.nodes = 64;
  const NcclTuning tp = nccl_tune(one);
  // PAT: base 8 + log2(64) x ((network Tree/Simple 14) / 3.5) + 64 x 2.8; bw 4 x 10 x .75.
  EXPECT_FLOAT_EQ(tp.latency(NcclFunc::all_gather, NcclAlgo::pat, NcclProto::simple),
                  8.0f + 6 * (14.0f / 3.5f) + 64 * 2.8f);
  EXPECT_FLOAT_EQ(tp.bandwidth(NcclFunc::all_gather, NcclAlgo::pat, NcclProto::simple), 30.0f);
  EXPECT_EQ(nccl_choose(one, tp, NcclFunc::all_gather, 1 << 20).algo, NcclAlgo::pat);
}

TEST(NcclTuning, NvlsOnOneNodeAndItsBandwidth) {
  NcclComm c = one_node_of_eight();
  c.nvls = true;
  c.nvls_graph = {16, 40.0f, 40.0f, 0.0f, true, false};
  const NcclTuning t = nccl_tune(c);
  // busBw/channel = min(40 x .85 (Hopper) x 15/16 x 2 for all_reduce = 63.75, bwInter 40): the
  // graph's inter bandwidth caps it even on one node; x 16 channels; x 8/14.
  EXPECT_NEAR(t.bandwidth(NcclFunc::all_reduce, NcclAlgo::nvls, NcclProto::simple), 16 * 40 * 8.0 / 14, 1e-3);
  EXPECT_FLOAT_EQ(t.latency(NcclFunc::all_reduce, NcclAlgo::nvls, NcclProto::simple), 25.0f);
  // all_gather: x (ppn - 1) / ppn instead, and no conversion to algorithm bandwidth.
  EXPECT_NEAR(t.bandwidth(NcclFunc::all_gather, NcclAlgo::nvls, NcclProto::simple),
              16 * (40 * .85 * 15 / 16 * 7 / 8), 1e-3);
  EXPECT_EQ(nccl_choose(c, t, NcclFunc::all_reduce, std::int64_t{1} << 30).algo, NcclAlgo::nvls);
  EXPECT_EQ(nccl_choose(c, t, NcclFunc::all_reduce, 1024).algo, NcclAlgo::ring);
}

TEST(NcclTuning, CostModelUsesNcclWhereGivenAndTheRingElsewhere) {
  CostModel m;
  const double ring = m.collective_us(CollectiveKind::all_reduce, 1 << 20, 8, 1);
  EXPECT_FALSE(m.cost(CollectiveKind::all_reduce, 1 << 20, 8, 1).nccl.has_value());
  auto node = std::make_shared<NcclNode>();
  node->ring_one_node = node->tree_one_node = {4, 10.0f, 10.0f, 0.0f, true, true};
  m.nccl = node;
  const CollectiveCost c = m.cost(CollectiveKind::all_reduce, 1 << 20, 8, 1);
  ASSERT_TRUE(c.nccl.has_value());
  EXPECT_EQ(c.nccl->str(), "Ring/LL128");
  EXPECT_NE(c.us, ring);
  // all_to_all is send/recv in NCCL, outside its tuning: the ring formula still.
  EXPECT_FALSE(m.cost(CollectiveKind::all_to_all, 1 << 20, 8, 1).nccl.has_value());
  EXPECT_EQ(m.cost(CollectiveKind::all_reduce, 1 << 20, 1, 1).us, 0.0);
}

}  // namespace
}  // namespace zc::sim
