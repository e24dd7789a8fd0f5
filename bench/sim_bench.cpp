// Simulator benchmarks (Google Benchmark). Every figure is a ratio against a baseline measured in
// the same run, because these machines are shared and noisy:
//   - SimAllReduce / SimReduceScatter: one collective over world 8 ranks, against a plain memcpy
//     of the same total bytes (world x buffer), timed in the same iteration. "x_memcpy" is
//     (collective time) / (memcpy time).
//   - SchedulerCost: the scheduler's cost per rank per collective (a 1-element all_reduce) at
//     worlds 8 to 4096, with cluster start-up measured separately and subtracted.
//   - SchedulerCostDecoupled: the same for a meta all_reduce under Schedule::decoupled, against the
//     interleaved scheduler on the same meta program.
#include "sim/sim_cluster.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using zc::sim::RankContext;
using zc::sim::SimCluster;
using zc::sim::SimOptions;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Times `reps` collectives of `numel` f32 per rank (after one warm-up), and a memcpy of
// world * numel * 4 bytes `reps` times, in the same process and iteration.
template <class Issue>
void bench_collective(benchmark::State& state, Issue issue) {
  const int world = 8;
  const std::int64_t numel = state.range(0);
  const int reps = 4;
  const std::size_t total_bytes = static_cast<std::size_t>(world * numel * 4);
  std::vector<char> src(total_bytes, 1), dst(total_bytes);
  double sim_s = 0, copy_s = 0;
  SimOptions opts;
  for (auto _ : state) {
    double t_coll = 0;
    SimCluster(world, 1, opts).run([&](RankContext& ctx) {
      zc::Tensor in = ctx.device.alloc(zc::DType::f32, {numel});
      zc::Tensor out = ctx.device.alloc(zc::DType::f32, {numel / world});
      issue(ctx, in, out);
      ctx.world.barrier();
      const auto t0 = Clock::now();  // every rank passes the barrier before rank 0 measures
      for (int r = 0; r < reps; ++r) issue(ctx, in, out);
      ctx.world.barrier();
      if (ctx.rank == 0) t_coll = seconds_since(t0);
    });
    const auto t1 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      std::memcpy(dst.data(), src.data(), total_bytes);
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
    copy_s += seconds_since(t1);
    sim_s += t_coll;
    state.SetIterationTime(t_coll);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * reps *
                          static_cast<std::int64_t>(total_bytes));
  state.counters["x_memcpy"] = sim_s / copy_s;
  state.counters["memcpy_GBps"] =
      static_cast<double>(state.iterations()) * reps * static_cast<double>(total_bytes) / copy_s / 1e9;
}

void SimAllReduce(benchmark::State& state) {
  bench_collective(state, [](RankContext& ctx, zc::Tensor& in, zc::Tensor&) {
    ctx.world.all_reduce(in);
  });
}
void SimReduceScatter(benchmark::State& state) {
  bench_collective(state, [](RankContext& ctx, zc::Tensor& in, zc::Tensor& out) {
    ctx.world.reduce_scatter(out, in);
  });
}
BENCHMARK(SimAllReduce)->Arg(1 << 12)->Arg(1 << 16)->Arg(1 << 20)->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(SimReduceScatter)->Arg(1 << 12)->Arg(1 << 16)->Arg(1 << 20)->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The scheduler's cost per rank per collective: (run with C all_reduces - run with none) / (world
// x C). Small fiber stacks so that 4096 ranks fit comfortably.
void SchedulerCost(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int collectives = world >= 1024 ? 64 : 32;
  SimOptions opts;
  opts.fiber_stack_bytes = 64 * 1024;
  auto run = [&](int count) {
    const auto t0 = Clock::now();
    SimCluster(world, 3, opts).run([&](RankContext& ctx) {
      zc::Tensor t = ctx.device.alloc(zc::DType::f32, {1});
      for (int i = 0; i < count; ++i) ctx.world.all_reduce(t);
    });
    return seconds_since(t0);
  };
  double setup_s = 0, total_s = 0;
  for (auto _ : state) {
    setup_s += run(0);
    const double t = run(collectives);
    total_s += t;
    state.SetIterationTime(t);
  }
  const double per = (total_s - setup_s) / static_cast<double>(state.iterations()) /
                     (static_cast<double>(world) * collectives);
  state.counters["ns_per_rank_collective"] = per * 1e9;
  state.counters["setup_us_per_rank"] =
      setup_s / static_cast<double>(state.iterations()) / world * 1e6;
}
BENCHMARK(SchedulerCost)->Arg(8)->Arg(64)->Arg(256)->Arg(1024)->Arg(4096)->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The same per rank per collective under Schedule::decoupled (Note [Decoupled schedule]), the
// schedule meta runs (zerocheck plan) use: a meta all_reduce, one thread and two, the replay of
// the clocks included, no trace events kept (as the plan runs). "x_interleaved_meta" divides it by the interleaved scheduler's cost for the
// same meta program in the same run.
void SchedulerCostDecoupled(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const int collectives = 64;
  auto run = [&](int count, zc::sim::Schedule schedule) {
    SimOptions opts;
    opts.meta = true;
    opts.fiber_stack_bytes = 64 * 1024;
    opts.schedule = schedule;
    opts.threads = threads;
    opts.limits.max_trace_events_kept = 0;  // as zerocheck plan runs (the hash covers every event)
    const auto t0 = Clock::now();
    SimCluster(world, 3, opts).run([&](RankContext& ctx) {
      zc::Tensor t = ctx.device.alloc(zc::DType::f32, {1});
      for (int i = 0; i < count; ++i) ctx.world.all_reduce(t);
    });
    return seconds_since(t0);
  };
  double per = 0, inter = 0;
  for (auto _ : state) {
    const double setup = run(0, zc::sim::Schedule::decoupled);
    const double t = run(collectives, zc::sim::Schedule::decoupled);
    state.SetIterationTime(t);
    per += (t - setup) / (static_cast<double>(world) * collectives);
    const double isetup = run(0, zc::sim::Schedule::interleaved);
    inter += (run(collectives, zc::sim::Schedule::interleaved) - isetup) / (static_cast<double>(world) * collectives);
  }
  state.counters["ns_per_rank_collective"] = per / static_cast<double>(state.iterations()) * 1e9;
  state.counters["interleaved_meta_ns"] = inter / static_cast<double>(state.iterations()) * 1e9;
  state.counters["x_interleaved_meta"] = per / inter;
}
BENCHMARK(SchedulerCostDecoupled)->Args({1024, 1})->Args({4096, 1})->Args({4096, 2})->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
