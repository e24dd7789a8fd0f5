// zerocheck plan at scale (Google Benchmark; `make bench-plan`): the Llama-2 7B ZeRO-3 step in meta
// mode, simulating every rank at 64 to 4,096 ranks and representative ranks at 65,536. Figures:
// wall seconds per plan, milliseconds per simulated rank, and the ratio of that to the 64-rank
// run's in the same process (how far per-rank cost grows with the world).
#include "plan/plan.h"

#include <benchmark/benchmark.h>

#include <chrono>

namespace {

using Clock = std::chrono::steady_clock;

zc::plan::PlanOptions zero3_7b(int world, bool representative) {
  zc::plan::PlanOptions o;
  o.ds_config = {{"train_micro_batch_size_per_gpu", 1},
                 {"bf16", {{"enabled", true}}},
                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}}}}},
                 {"zero_optimization", {{"stage", 3}, {"overlap_comm", true}}}};
  o.model = zc::transformer_preset("llama-2-7b");
  o.world = world;
  o.ranks = representative ? zc::plan::PlanOptions::Ranks::representative : zc::plan::PlanOptions::Ranks::all;
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
  const bool rep = state.range(1) != 0;
  const zc::plan::Hardware hw = zc::plan::load_hardware(zc::plan::default_hardware_path());
  const double base = seconds(zero3_7b(64, false), hw) / 64;  // per simulated rank, same run
  double total = 0;
  for (auto _ : state) {
    const double s = seconds(zero3_7b(world, rep), hw);
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
    ->Args({65536, 1})->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();
