// Schedule::decoupled (Note [Decoupled schedule] in sim/sim_cluster.h): the interleaved run's
// clocks, traces and counts from ranks that run to their end in turn, on one thread or two, and
// the errors it still names (mismatch, deadlock, race, the lowest failing rank) or refuses to run.
#include "engine/errors.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>

#include <cmath>

namespace zc::sim {
namespace {

using Body = std::function<void(RankContext&)>;

SimOptions options(Schedule schedule, int threads = 1) {
  SimOptions o;
  o.meta = true;
  o.schedule = schedule;
  o.threads = threads;
  o.cost.gpus_per_node = 4;  // worlds past 4 cross the network: collectives take longer
  return o;
}

Tensor meta(RankContext& ctx, std::int64_t n, const char* label) {
  return ctx.device.alloc(DType::f32, {n}, label, MemCategory::unattributed);
}

// Ranks whose compute differs (rank r's buffers are r + 1 times rank 0's), with async gathers and
// reduce-scatters overlapping compute, blocking all-reduces and barriers, and a clock sample per
// round: the waits, and so the clocks, depend on the other ranks.
void program(RankContext& ctx) {
  const std::int64_t W = ctx.world_size, r = ctx.rank;
  for (int round = 0; round < 5; ++round) {
    const std::int64_t n = 4096 * (round + 1);
    Tensor work = meta(ctx, (r + 1) * (1 << 18), "work");
    Tensor shard = meta(ctx, n, "shard"), gathered = meta(ctx, n * W, "gathered");
    WorkPtr gather = ctx.world.all_gather(gathered, shard, {.async_op = true});
    ctx.device.fill(work, 1.0);
    ctx.device.axpy(work, 0.5, work);
    Tensor flag = meta(ctx, 1000, "flag");
    ctx.world.all_reduce(flag);
    gather->wait();
    Tensor grads = meta(ctx, n * W, "grads"), part = meta(ctx, n, "part");
    WorkPtr rs = ctx.world.reduce_scatter(part, grads, {.async_op = true});
    ctx.device.scale(work, 2.0);
    if (round % 2 == 1) ctx.world.barrier();
    rs->wait();
    ctx.sample_clock();
  }
  Tensor tail = meta(ctx, (W - r) * (1 << 16), "tail");  // compute after the last collective
  ctx.device.fill(tail, 0.0);
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({std::abs(a), std::abs(b), 1.0}); }

void expect_same_run(const SimResult& a, const SimResult& b, const std::string& what) {
  EXPECT_EQ(a.trace_hash, b.trace_hash) << what;
  ASSERT_EQ(a.rank_time_us.size(), b.rank_time_us.size()) << what;
  for (std::size_t i = 0; i < a.rank_time_us.size(); ++i) {
    EXPECT_TRUE(close(a.rank_time_us[i], b.rank_time_us[i])) << what << " rank " << i << ": "
                                                            << a.rank_time_us[i] << " vs " << b.rank_time_us[i];
    EXPECT_EQ(a.rank_compute_us[i], b.rank_compute_us[i]) << what << " rank " << i;
    EXPECT_EQ(a.rank_comm_us[i], b.rank_comm_us[i]) << what << " rank " << i;
    EXPECT_TRUE(close(a.rank_wait_us[i], b.rank_wait_us[i])) << what << " rank " << i;
    ASSERT_EQ(a.clock_samples[i].size(), b.clock_samples[i].size()) << what << " rank " << i;
    for (std::size_t s = 0; s < a.clock_samples[i].size(); ++s) {
      const RankTiming &x = a.clock_samples[i][s], &y = b.clock_samples[i][s];
      EXPECT_TRUE(close(x.now_us, y.now_us)) << what << " rank " << i << " sample " << s << ": " << x.now_us
                                             << " vs " << y.now_us;
      EXPECT_EQ(x.compute_us, y.compute_us) << what << " rank " << i << " sample " << s;
      EXPECT_EQ(x.comm_us, y.comm_us) << what << " rank " << i << " sample " << s;
      EXPECT_TRUE(close(x.wait_us, y.wait_us)) << what << " rank " << i << " sample " << s;
    }
  }
}

TEST(SimDecoupled, GivesTheInterleavedClocksTraceHashesAndCounts) {
  for (int world : {1, 2, 3, 5, 8, 9}) {
    const SimResult inter = SimCluster(world, 11, options(Schedule::interleaved)).run(program);
    ASSERT_EQ(inter.clock_samples.size(), static_cast<std::size_t>(world));
    ASSERT_EQ(inter.clock_samples[0].size(), 5u);
    if (world > 1) {  // the clocks depend on the other ranks: the slowest rank sets the pace
      EXPECT_GT(inter.rank_wait_us[0], 0.0) << "world " << world;
      EXPECT_NE(inter.rank_time_us[0], inter.rank_compute_us[0] + inter.rank_comm_us[0]);
    }
    for (int threads : {1, 2}) {
      const SimResult dec = SimCluster(world, 11, options(Schedule::decoupled, threads)).run(program);
      expect_same_run(inter, dec, fmt::format("world {} threads {}", world, threads));
      EXPECT_EQ(dec.scheduler_steps, 0);
    }
  }
}

TEST(SimDecoupled, ThreadsDoNotChangeABit) {
  const SimResult one = SimCluster(7, 3, options(Schedule::decoupled, 1)).run(program);
  const SimResult two = SimCluster(7, 3, options(Schedule::decoupled, 2)).run(program);
  EXPECT_EQ(one.trace_hash, two.trace_hash);
  EXPECT_EQ(one.rank_time_us, two.rank_time_us);
  EXPECT_EQ(one.rank_wait_us, two.rank_wait_us);
}

template <class E>
std::string error_of(const SimOptions& o, int world, const Body& body) {
  try {
    SimCluster(world, 1, o).run(body);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception: ") + e.what();
  }
  return "no exception";
}

TEST(SimDecoupled, AMismatchNamesBothRanksAndCalls) {
  const std::string e = error_of<CollectiveMismatch>(options(Schedule::decoupled, 2), 4, [](RankContext& ctx) {
    Tensor t = meta(ctx, ctx.rank == 2 ? 8 : 16, "t");
    ctx.world.all_reduce(t);
  });
  EXPECT_NE(e.find("collective mismatch on group world seq 0"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 called all_reduce(16 -> 16 x f32, sum, meta)"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 2 called all_reduce(8 -> 8 x f32, sum, meta)"), std::string::npos) << e;
}

TEST(SimDecoupled, ASkippedCollectiveIsADeadlockNamingIt) {
  auto skip = [](int who) {
    return [who](RankContext& ctx) {
      Tensor t = meta(ctx, 4, "t");
      ctx.world.all_reduce(t);
      if (ctx.rank != who) ctx.world.barrier();
    };
  };
  const std::string later = error_of<Deadlock>(options(Schedule::decoupled, 2), 5, skip(3));
  EXPECT_NE(later.find("rank 3 never issued barrier() on group world seq 1, which rank 0 issued"),
            std::string::npos) << later;
  // The first rank skips it: the others issue a collective it never did.
  const std::string first = error_of<Deadlock>(options(Schedule::decoupled, 2), 5, skip(0));
  EXPECT_NE(first.find("rank 1 issued barrier() on group world seq 1, which rank 0 never issued"),
            std::string::npos) << first;
}

TEST(SimDecoupled, WritingAPendingOutputIsStillARace) {
  const std::string e = error_of<DataRace>(options(Schedule::decoupled, 2), 3, [](RankContext& ctx) {
    Tensor in = meta(ctx, 4, "in"), out = meta(ctx, 12, "out");
    WorkPtr w = ctx.world.all_gather(out, in, {.async_op = true});
    if (ctx.rank == 1) ctx.device.fill(out, 0.0);
    w->wait();
  });
  EXPECT_NE(e.find("rank 1: fill writes"), std::string::npos) << e;
  EXPECT_NE(e.find("call wait() on that Work"), std::string::npos) << e;
}

TEST(SimDecoupled, TheLowestFailingRankIsReportedWhateverTheThreads) {
  for (int threads : {1, 2}) {
    const std::string e = error_of<RankFailure>(options(Schedule::decoupled, threads), 8, [](RankContext& ctx) {
      Tensor t = meta(ctx, 4, "t");
      ctx.world.all_reduce(t);
      if (ctx.rank == 3 || ctx.rank == 6) throw ConfigError(fmt::format("rank {} refuses", ctx.rank));
    });
    EXPECT_NE(e.find("rank 3 failed: ConfigError: rank 3 refuses"), std::string::npos) << e;
  }
}

TEST(SimDecoupled, WhatItCannotRunIsRefusedWithTheReason) {
  SimOptions data = options(Schedule::decoupled);
  data.meta = false;
  EXPECT_NE(error_of<UsageError>(data, 2, program).find("needs SimOptions::meta"), std::string::npos);
  SimOptions faulty = options(Schedule::decoupled);
  faulty.faults.push_back(Fault{FaultKind::crash, 1, 0});
  EXPECT_NE(error_of<UsageError>(faulty, 2, program).find("a fault needs the interleaved scheduler"),
            std::string::npos);
  const std::string split = error_of<RankFailure>(options(Schedule::decoupled), 4, [](RankContext& ctx) {
    ctx.world.split(ctx.rank % 2, ctx.rank);
  });
  EXPECT_NE(split.find("split() on world under SimOptions::schedule = decoupled"), std::string::npos) << split;
  EXPECT_NE(split.find("declare the run's splits (SimOptions::declared_split)"), std::string::npos) << split;
}

// MoE's layout: blocks of `ep` consecutive ranks (split 0) and the ranks at one index of their
// blocks (split 1). Each block all_to_alls, each index group all_reduces, and the world too, in an
// order where a rank's two groups overlap in time: the clocks depend on Note [Stream order].
SplitArgs block_split(int nth, int rank, int ep) {
  return nth == 0 ? SplitArgs{rank / ep, rank} : SplitArgs{rank % ep, rank};
}
Body moe_program(int ep) {
  return [ep](RankContext& ctx) {
    const int r = ctx.rank;
    const SplitArgs a = block_split(0, r, ep), b = block_split(1, r, ep);
    std::unique_ptr<Comm> block = ctx.world.split(a.color, a.key), index = ctx.world.split(b.color, b.key);
    for (int round = 0; round < 3; ++round) {
      Tensor work = meta(ctx, (r % 3 + 1) * (1 << 17), "work");
      ctx.device.fill(work, 1.0);
      Tensor send = meta(ctx, 1024 * ep, "send"), recv = meta(ctx, 1024 * ep, "recv");
      WorkPtr a2a = block->all_to_all(recv, send, {.async_op = true});
      Tensor grads = meta(ctx, 8192 * (round + 1), "grads");
      WorkPtr ar = index->all_reduce(grads, {.async_op = true});
      ctx.device.scale(work, 2.0);
      a2a->wait();
      Tensor flag = meta(ctx, 64, "flag");
      ctx.world.all_reduce(flag);
      ar->wait();
      ctx.sample_clock();
    }
  };
}
SimOptions moe_options(Schedule schedule, int threads, int ep) {
  SimOptions o = options(schedule, threads);
  o.declared_split = [ep](const std::string&, int nth, int parent_rank) { return block_split(nth, parent_rank, ep); };
  return o;
}

// Note [Decoupled schedule]: declared splits give the interleaved run's groups, clocks, traces and
// counts, on one thread or two; the subgroups without rank 0 are fixed by their lowest rank.
TEST(SimDecoupled, DeclaredSplitsGiveTheInterleavedRun) {
  for (const auto& [world, ep] : {std::pair{4, 2}, std::pair{8, 4}, std::pair{12, 4}, std::pair{16, 8}}) {
    const SimResult inter = SimCluster(world, 5, moe_options(Schedule::interleaved, 1, ep)).run(moe_program(ep));
    for (int threads : {1, 2}) {
      const SimResult dec = SimCluster(world, 5, moe_options(Schedule::decoupled, threads, ep)).run(moe_program(ep));
      expect_same_run(inter, dec, fmt::format("world {} ep {} threads {}", world, ep, threads));
    }
  }
}

TEST(SimDecoupled, ASplitThatIsNotTheDeclaredOneIsAMismatch) {
  SimOptions o = moe_options(Schedule::decoupled, 2, 2);
  const std::string e = error_of<CollectiveMismatch>(o, 4, [](RankContext& ctx) {
    ctx.world.split(ctx.rank == 3 ? 0 : ctx.rank / 2, ctx.rank);
  });
  EXPECT_NE(e.find("split mismatch on group world seq 0: rank 3 called split(color 0, key 3), the run's "
                   "declared split gives it color 1, key 3"), std::string::npos) << e;
}

TEST(SimDecoupled, ASubgroupCollectiveItsLowestRankSkippedIsADeadlock) {
  const std::string e = error_of<Deadlock>(moe_options(Schedule::decoupled, 2, 2), 4, [](RankContext& ctx) {
    std::unique_ptr<Comm> block = ctx.world.split(ctx.rank / 2, ctx.rank);
    if (ctx.rank != 2) block->barrier();  // rank 2 leads block 1 (ranks 2 and 3)
  });
  EXPECT_NE(e.find("rank 3 issued barrier() on group world.c1 seq 0, which rank 2 never issued"),
            std::string::npos) << e;
}

// Group leaders run in parallel waves, so a split of a subgroup by its leader, which would create
// groups while other leaders run, is refused with the reason (the first rank's splits are not).
TEST(SimDecoupled, ASubgroupSplitInAWaveOfLeadersIsRefused) {
  SimOptions o = moe_options(Schedule::decoupled, 2, 2);
  o.declared_split = [](const std::string& parent, int, int parent_rank) {
    return parent == "world" ? SplitArgs{parent_rank / 2, parent_rank} : SplitArgs{0, parent_rank};
  };
  const std::string e = error_of<RankFailure>(o, 6, [](RankContext& ctx) {
    std::unique_ptr<Comm> block = ctx.world.split(ctx.rank / 2, ctx.rank);
    block->split(0, ctx.rank);
  });
  EXPECT_NE(e.find("split() of group world.c1 by its lowest rank while other group leaders run"), std::string::npos)
      << e;
}

// Note [Stream order]: ranks that issue two groups' collectives in opposite orders wait on each
// other's streams, as two NCCL streams would: a deadlock, naming what each stream runs first.
TEST(SimStreamOrder, OppositeOrdersOnTwoGroupsAreADeadlock) {
  SimOptions o = options(Schedule::interleaved);
  o.meta = false;
  try {
    SimCluster(2, 1, o).run([](RankContext& ctx) {
      std::unique_ptr<Comm> alone = ctx.world.split(0, ctx.rank);  // both ranks: a second group
      Tensor a = ctx.device.alloc(DType::f32, {4}, "a", MemCategory::unattributed);
      Tensor b = ctx.device.alloc(DType::f32, {4}, "b", MemCategory::unattributed);
      if (ctx.rank == 0) {
        WorkPtr x = ctx.world.all_reduce(a, {.async_op = true});
        WorkPtr y = alone->all_reduce(b, {.async_op = true});
        y->wait();
        x->wait();
      } else {
        WorkPtr y = alone->all_reduce(b, {.async_op = true});
        WorkPtr x = ctx.world.all_reduce(a, {.async_op = true});
        x->wait();
        y->wait();
      }
    });
    ADD_FAILURE() << "no deadlock";
  } catch (const Deadlock& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("every member issued it, but rank 1's stream first runs group world.c0 seq 0"),
              std::string::npos) << m;
  }
}

}  // namespace
}  // namespace zc::sim
