// The DeepSpeed reference's throughput after warm-up (make bench-deepspeed): scenarios compared per
// second at world 2 and 4, each a fresh deepspeed.initialize in the reused worker pool, beside the
// simulator's own run of the same scenarios (the ratio says what the reference costs). Needs the
// environment scripts/ds-env.sh makes.
#include "props/reference.h"

#include <benchmark/benchmark.h>

namespace zc::props {
namespace {

ReferencePools& pools() {
  static ReferencePools p(reference_env());
  return p;
}

// A fixed mix: every stage, fp32 and bf16, SGD and AdamW, two steps of N = 2 on a small Synthetic model.
std::vector<Scenario> mix(int world) {
  std::vector<Scenario> out;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* dtype : {"f32", "bf16"}) {
      Scenario s;
      s.world = world;
      s.stage = stage;
      s.dtype = dtype;
      s.contiguous = stage > 0;
      s.shape = {64, 32, 17};
      s.n = 2;
      s.steps = 2;
      s.optimizer = stage % 2 == 0 ? "SGD" : "AdamW";
      s.lr = stage % 2 == 0 ? 0.125 : 1e-3;
      out.push_back(s);
    }
  }
  return out;
}

void BM_CompareWithDeepSpeed(benchmark::State& state) {
  const std::vector<Scenario> scenarios = mix(static_cast<int>(state.range(0)));
  compare_with_deepspeed(scenarios.front(), pools());  // warm-up: the pool starts, DeepSpeed imports
  std::size_t i = 0;
  for (auto _ : state) {
    const ReferenceComparison c = compare_with_deepspeed(scenarios[i++ % scenarios.size()], pools());
    benchmark::DoNotOptimize(c.hash);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CompareWithDeepSpeed)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->MinTime(20.0)->UseRealTime();

// The baseline in the same run: the simulator alone on the same scenarios.
void BM_SimulatorAlone(benchmark::State& state) {
  const std::vector<Scenario> scenarios = mix(static_cast<int>(state.range(0)));
  std::size_t i = 0;
  for (auto _ : state) {
    const RunResult r = run_on_sim(to_run_spec(scenarios[i++ % scenarios.size()], {}, {}));
    benchmark::DoNotOptimize(r.params.size());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SimulatorAlone)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace zc::props

BENCHMARK_MAIN();
