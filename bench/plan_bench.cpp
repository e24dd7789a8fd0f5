// zerocheck plan at scale (Google Benchmark; `make bench-plan`): the Llama-2 7B ZeRO-3 step in meta
// mode, simulating every rank at 64 to 8,192 ranks (decoupled schedule; at 64 and 1,024 also the
// interleaved scheduler, mode 2) and representative ranks at 65,536. Figures:
// wall seconds per plan, milliseconds per simulated rank, and the ratio of that to the 64-rank
// run's in the same process (how far per-rank cost grows with the world).
#include "plan/plan.h"

#include <benchmark/benchmark.h>

#include <chrono>

namespace {

using Clock = std::chrono::steady_clock;

// mode: 0 every rank under the decoupled schedule (the plan's default), 1 representative ranks,
// 2 every rank under the interleaved scheduler (Note [Decoupled schedule]).
zc::plan::PlanOptions zero3_7b(int world, int mode) {
  const bool representative = mode == 1;
  zc::plan::PlanOptions o;
  o.ds_config = {{"train_micro_batch_size_per_gpu", 1},
                 {"bf16", {{"enabled", true}}},
                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}}}}},
                 {"zero_optimization", {{"stage", 3}, {"overlap_comm", true}}}};
  o.model = zc::transformer_preset("llama-2-7b");
  o.world = world;
  o.ranks = representative ? zc::plan::PlanOptions::Ranks::representative : zc::plan::PlanOptions::Ranks::all;
  o.schedule = mode == 2 ? zc::sim::Schedule::interleaved : zc::sim::Schedule::decoupled;
  return o;
}

double seconds(const zc::plan::PlanOptions& o, const zc::plan::Hardware& hw) {
  const auto t0 = Clock::now();
  const zc::plan::PlanResult r = zc::plan::run_plan(o, hw);
  benchmark::DoNotOptimize(r.step_us);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void PlanLlama7bZero3(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  const bool rep = mode == 1;
  const zc::plan::Hardware hw = zc::plan::load_hardware(zc::plan::default_hardware_path());
  const double base = seconds(zero3_7b(64, 0), hw) / 64;  // per simulated rank, same run
  double total = 0;
  for (auto _ : state) {
    const double s = seconds(zero3_7b(world, mode), hw);
    total += s;
    state.SetIterationTime(s);
  }
  const double per_plan = total / static_cast<double>(state.iterations());
  const double simulated = rep ? static_cast<double>(zc::plan::representative_ranks(world).size()) : world;
  state.counters["seconds"] = per_plan;
  state.counters["ms_per_simulated_rank"] = per_plan / simulated * 1e3;
  state.counters["x_per_rank_cost_at_64"] = per_plan / simulated / base;
}
BENCHMARK(PlanLlama7bZero3)->Args({64, 0})->Args({512, 0})->Args({1024, 0})->Args({4096, 0})
    ->Args({8192, 0})->Args({65536, 1})->Args({64, 2})->Args({1024, 2})->Iterations(1)->UseManualTime()
    ->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();
