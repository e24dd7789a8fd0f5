// Properties of the simulated cluster over random worlds, sizes, dtypes, orders and seeds.
#include "engine/errors.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

namespace zc::sim {
namespace {

struct ExactCase {
  int world;
  std::int64_t count;
  DType dtype;
  ReductionOrder order;
  std::uint64_t seed;
  std::vector<std::vector<int>> values;  // [world][count], small integers
};

rc::Gen<ExactCase> exact_case() {
  return rc::gen::mapcat(
      rc::gen::tuple(rc::gen::inRange(1, 9), rc::gen::inRange<std::int64_t>(0, 200),
                     rc::gen::element(DType::f32, DType::f16, DType::bf16, DType::f64),
                     rc::gen::element(ReductionOrder::linear, ReductionOrder::ring, ReductionOrder::gloo),
                     rc::gen::arbitrary<std::uint64_t>()),
      [](const auto& t) {
        const auto [world, count, dtype, order, seed] = t;
        // |value| <= 16 and world <= 8: every partial sum is an integer below 2^8, exact in bf16.
        return rc::gen::map(
            rc::gen::container<std::vector<std::vector<int>>>(
                static_cast<std::size_t>(world),
                rc::gen::container<std::vector<int>>(static_cast<std::size_t>(count),
                                                     rc::gen::inRange(-16, 17))),
            [=](std::vector<std::vector<int>> v) {
              return ExactCase{world, count, dtype, order, seed, std::move(v)};
            });
      });
}

std::vector<double> as_doubles(const std::vector<int>& v) { return {v.begin(), v.end()}; }

RC_GTEST_PROP(SimProps, AllReduceOfExactValuesIsTheExactSumInEitherOrder, ()) {
  const ExactCase c = *exact_case();
  SimOptions opts;
  opts.order = c.order;
  std::vector<std::vector<double>> got(static_cast<std::size_t>(c.world));
  SimCluster(c.world, c.seed, opts).run([&](RankContext& ctx) {
    Tensor t = tensor_from_f64(ctx.device, c.dtype, {c.count}, as_doubles(c.values[ctx.rank]));
    ctx.world.all_reduce(t);
    got[static_cast<std::size_t>(ctx.rank)] = to_f64(ctx.device, t);
  });
  for (int r = 0; r < c.world; ++r) {
    for (std::int64_t i = 0; i < c.count; ++i) {
      double sum = 0;
      for (int s = 0; s < c.world; ++s) sum += c.values[s][i];
      RC_ASSERT(got[r][i] == sum);
    }
  }
}

RC_GTEST_PROP(SimProps, ReduceScatterThenAllGatherEqualsAllReduceBitForBit, ()) {
  const ExactCase c = *exact_case();
  SimOptions opts;
  opts.order = c.order;
  SimCluster(c.world, c.seed, opts).run([&](RankContext& ctx) {
    const std::int64_t shard = c.count / c.world;
    const std::int64_t n = shard * c.world;  // the divisible prefix
    std::vector<double> vals = as_doubles(c.values[ctx.rank]);
    vals.resize(static_cast<std::size_t>(n));
    Tensor a = tensor_from_f64(ctx.device, c.dtype, {n}, vals);
    Tensor b = tensor_from_f64(ctx.device, c.dtype, {n}, vals);
    ctx.world.all_reduce(a);
    Tensor part = ctx.device.alloc(c.dtype, {shard});
    ctx.world.reduce_scatter(part, b);
    ctx.world.all_gather(b, part);
    RC_ASSERT(to_bytes(ctx.device, a) == to_bytes(ctx.device, b));
  });
}

RC_GTEST_PROP(SimProps, ASeedRerunsToTheSameTraceAndScheduleHash, ()) {
  const int world = *rc::gen::inRange(1, 9);
  const int steps = *rc::gen::inRange(1, 6);
  const bool async_op = *rc::gen::arbitrary<bool>();
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  auto body = [&](RankContext& ctx) {
    for (int s = 0; s < steps; ++s) {
      Tensor g = ctx.device.alloc(DType::bf16, {17});
      ctx.device.fill(g, ctx.rng.uniform01());
      WorkPtr w = ctx.world.all_reduce(g, {.async_op = async_op});
      ctx.world.barrier();
      w->wait();
    }
  };
  const SimCluster cluster(world, seed);
  const SimResult a = cluster.run(body), b = cluster.run(body);
  RC_ASSERT(a.trace_hash == b.trace_hash);
  RC_ASSERT(a.schedule_hash == b.schedule_hash);
}

RC_GTEST_PROP(SimProps, AWriteRacesWithAPendingOutputExactlyWhenTheRangesOverlap, ()) {
  const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, 64);
  const std::int64_t out_lo = *rc::gen::inRange<std::int64_t>(0, n);
  const std::int64_t out_len = *rc::gen::inRange<std::int64_t>(1, n - out_lo + 1);
  const std::int64_t w_lo = *rc::gen::inRange<std::int64_t>(0, n);
  const std::int64_t w_len = *rc::gen::inRange<std::int64_t>(1, n - w_lo + 1);
  const bool overlap = w_lo < out_lo + out_len && out_lo < w_lo + w_len;
  bool raced = false;
  try {
    SimCluster(2, *rc::gen::arbitrary<std::uint64_t>()).run([&](RankContext& ctx) {
      Tensor buf = ctx.device.alloc(DType::f32, {n}, "flat");
      WorkPtr w = ctx.world.all_reduce(buf.narrow(out_lo, out_len), {.async_op = true});
      ctx.device.fill(buf.narrow(w_lo, w_len), 1.0);
      w->wait();
    });
  } catch (const DataRace&) {
    raced = true;
  }
  RC_ASSERT(raced == overlap);
}

}  // namespace
}  // namespace zc::sim
