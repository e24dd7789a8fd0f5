// Engine step throughput on the simulator: SimpleModel(hidden 64, 2 layers), ZeRO-2 with
// overlap_comm, cross-entropy on gaussian data, 10 steps per iteration. Reported as steps per
// second of wall time, and as a ratio to the same model on one simulated rank, measured in the
// same iteration (the per-rank work is identical, so the ratio is the cost of the extra ranks:
// about the world size for a perfectly serial simulator).
#include "models/mlp.h"
#include "props/training_run.h"

#include <benchmark/benchmark.h>

#include <chrono>

namespace {

using Clock = std::chrono::steady_clock;

double train_seconds(int world, int steps) {
  zc::props::RunSpec spec;
  spec.make_model = [] {
    return std::make_unique<zc::Mlp>(zc::simple_model_spec(64, 2, zc::LossKind::cross_entropy));
  };
  spec.ds_config = {{"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}}},
                    {"zero_optimization", {{"stage", 2}, {"overlap_comm", true}, {"reduce_bucket_size", 4096}}}};
  spec.world = world;
  spec.steps = steps;
  spec.micro_batch = 8;
  spec.domain = zc::DataDomain::gaussian;
  spec.collect_grads = false;
  spec.sim.fiber_stack_bytes = 128 * 1024;
  const auto t0 = Clock::now();
  zc::props::run_on_sim(spec);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void EngineStep(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int steps = 10;
  double t_world = 0, t_one = 0;
  for (auto _ : state) {
    const double t = train_seconds(world, steps);
    t_one += train_seconds(1, steps);
    t_world += t;
    state.SetIterationTime(t);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["steps_per_s"] = iters * steps / t_world;
  state.counters["x_one_rank"] = t_world / t_one;
}
BENCHMARK(EngineStep)->Arg(8)->Arg(16)->Arg(32)->Arg(64)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
