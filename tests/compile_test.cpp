// compile() and the DeepCompile runtime (SPEC 3): invariant I3 over stage 0-3 x every subset of
// passes x deepcompile on/off x the lifecycle (compile, N forward/backward, step, destroy) — the
// runtime is never loaded when only autosp/autotp are in use, and no call but loading precedes
// init — with B1 and B2 each breaking it; B8 breaking cross-rank consistency; a loader that
// refuses; and compiled z1/z3 engines whose reduction, handed to the runtime's executor, runs once
// per backward and gives the uncompiled engine's bits (the same reduction, not a second schedule).
#include "engine/errors.h"
#include "models/synthetic.h"
#include "props/training_run.h"
#include "real/deepcompile_loader.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace zc::props {
namespace {

std::vector<std::string> passes_of(int mask) {
  std::vector<std::string> out;
  const char* names[] = {"z1", "z3", "autosp", "autotp"};
  for (int b = 0; b < 4; ++b) {
    if (mask & (1 << b)) out.push_back(names[b]);
  }
  return out;
}

// "" when the lifecycle kept I3; else what broke it.
std::string i3_violation(int stage, int mask, bool deepcompile, BugSet bugs) {
  std::string violation;
  sim::SimCluster(2, 1).run([&](sim::RankContext& ctx) {
    real::PluginLoader loader;
    Options opts;
    opts.bugs = bugs;
    opts.deepcompile_loader = &loader;
    Config cfg = Config::from_json({{"optimizer", {{"type", "Adam"}}}, {"train_micro_batch_size_per_gpu", 1}, {"tensor_parallel", {{"autotp_size", 2}}},
                                    {"zero_optimization", {{"stage", stage}}}}, 2);
    Synthetic model(std::vector<Shape>{{3}});
    Rng rng(1);
    model.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(cfg, model, ctx.device, ctx.world, opts);
    bool compiled = true;
    try {
      e.compile(CompileConfig{deepcompile, passes_of(mask)});
    } catch (const NotImplementedError&) {
      compiled = false;  // autotp with other passes: refused, and nothing may be loaded
    }
    if (compiled) {
      for (int k = 0; k < 2; ++k) {
        Rng r(static_cast<std::uint64_t>(k));
        e.backward(e.forward(upload_batch(ctx.device, model.make_batch(r, 1, DataDomain::exact, {1, 0, 2}), DType::f32)));
      }
      e.step();
      e.destroy();
    }
    if (ctx.rank != 0 || !loader.loaded()) return;
    const bool parallel_only = (mask & 12) != 0;
    const std::vector<std::string>& calls = loader.get_handle().calls();
    if (parallel_only) violation = fmt::format("runtime loaded with passes {}", fmt::join(passes_of(mask), ","));
    if (violation.empty() && calls.size() > 1 && calls[1].rfind("init(", 0) != 0) {
      violation = fmt::format("'{}' before init", calls[1]);
    }
  });
  return violation;
}

int count_violations(BugSet bugs, std::string* example) {
  int n = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    for (int mask = 0; mask < 16; ++mask) {
      for (bool dc : {false, true}) {
        const std::string v = i3_violation(stage, mask, dc, bugs);
        if (!v.empty() && ++n == 1 && example) *example = fmt::format("stage {} passes [{}] deepcompile {}: {}", stage, fmt::join(passes_of(mask), ","), dc, v);
      }
    }
  }
  return n;
}

TEST(CompileI3, RuntimeNeverLoadedForParallelPassesAndNothingPrecedesInit) {
  std::string example;
  EXPECT_EQ(count_violations({}, &example), 0) << example;
}

TEST(CompileI3, KnownBugsB1AndB2EachBreakIt) {
  std::string e1, e2;
  EXPECT_GT(count_violations(BugSet{KnownBug::B1_autosp_backward_gate}, &e1), 0);
  EXPECT_NE(e1.find("autosp"), std::string::npos) << e1;
  EXPECT_GT(count_violations(BugSet{KnownBug::B2_destroy_cleanup_gate}, &e2), 0);
  EXPECT_NE(e2.find("autosp"), std::string::npos) << e2;
}

RunSpec compiled_spec(int stage, std::vector<std::string> passes, BugSet bugs) {
  RunSpec spec;
  spec.make_model = [] { return std::make_unique<Synthetic>(std::vector<Shape>{{5}, {3, 2}, {11}}); };
  spec.ds_config = {{"optimizer", {{"type", "Adam"}}}, {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 8}}}};
  spec.world = 4;
  spec.steps = 2;
  spec.n_backward = 2;
  spec.exact.grad_multiple = 4;
  spec.seed = 3;
  spec.bugs = bugs;
  spec.compile = CompileConfig{true, std::move(passes)};
  spec.make_loader = real::plugin_loaders();
  return spec;
}

// What this shows, and what it does not: a compiled z1/z3 engine skips its own backward
// all-reduce (deepcompile_active) and the runtime's end_backward() runs the engine's ZeRO
// reduction through the executor compile() handed it. The reduction is the engine's own code, so
// equal bits show the hand-off neither drops nor repeats a reduction (the collective counts match
// too); they do not show that DeepCompile's own schedule (z1/z3 reducing per gradient inside the
// compiled backward graph) gives the same bits, because no such schedule is modelled.
TEST(Compile, ZeroBackendsHandTheEngineReductionToTheRuntimeOncePerBackward) {
  for (int stage : {1, 2, 3}) {
    RunSpec spec = compiled_spec(stage, {stage == 3 ? "z3" : "z1"}, {});
    int end_backwards = 0;  // rank 0's, at the end of the run
    spec.after_step = [&](int rank, int, Engine& e, double) {
      if (rank != 0) return;
      const std::vector<std::string>& calls = e.options().deepcompile_loader->get_handle().calls();
      end_backwards = static_cast<int>(std::count(calls.begin(), calls.end(), "end_backward"));
    };
    const RunResult compiled = run_on_sim(spec);
    EXPECT_EQ(end_backwards, spec.steps * spec.n_backward) << "stage " << stage;
    spec.compile.reset();
    spec.after_step = nullptr;
    const RunResult plain = run_on_sim(spec);
    ASSERT_TRUE(compiled.ranks_agree) << compiled.disagreement;
    for (std::size_t s = 0; s < plain.params.size(); ++s) {
      EXPECT_EQ(first_difference(compiled.params[s], plain.params[s], DType::f32), "") << "stage " << stage;
      EXPECT_EQ(first_difference(compiled.grads[s], plain.grads[s], DType::f32), "") << "stage " << stage;
    }
    for (std::size_t r = 0; r < plain.engine_comm.size(); ++r) {
      EXPECT_EQ(compiled.engine_comm[r].to_string(), plain.engine_comm[r].to_string())
          << "stage " << stage << " rank " << r;
    }
  }
}

// AutoSP runs on ZeRO 0/1. With B8 the stage-0 engine steps on unreduced grads (ranks diverge);
// the stage-1 engine has no averaged gradients at all and says so.
TEST(Compile, KnownBugB8LeavesParallelPassGradsUnreduced) {
  const RunResult ok = run_on_sim(compiled_spec(0, {"autosp"}, {}));
  EXPECT_TRUE(ok.ranks_agree) << ok.disagreement;
  const RunResult bug = run_on_sim(compiled_spec(0, {"autosp"}, BugSet{KnownBug::B8_allreduce_gate_parallel_passes}));
  EXPECT_FALSE(bug.ranks_agree) << "with B8 each rank steps on its own gradient";
  try {
    run_on_sim(compiled_spec(1, {"autosp"}, BugSet{KnownBug::B8_allreduce_gate_parallel_passes}));
    FAIL() << "stage 1 stepped without reduced gradients";
  } catch (const RankFailure& f) {
    EXPECT_NE(std::string(f.what()).find("without reduced gradients"), std::string::npos) << f.what();
  }
}

// At world 1 a stage-0 reduction changes nothing (the sum of one rank, / 1), so B8 does no harm
// there: the engine reports the gradients it holds, which equal the reduced ones bit for bit.
TEST(Compile, KnownBugB8IsHarmlessOnOneStageZeroRank) {
  RunSpec ok = compiled_spec(0, {"autosp"}, {});
  RunSpec bug = compiled_spec(0, {"autosp"}, BugSet{KnownBug::B8_allreduce_gate_parallel_passes});
  ok.world = bug.world = 1;
  const RunResult a = run_on_sim(ok), b = run_on_sim(bug);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t s = 0; s < a.grads.size(); ++s) {
    EXPECT_EQ(first_difference(a.grads[s], b.grads[s], DType::f32), "") << "step " << s;
    EXPECT_EQ(first_difference(a.params[s], b.params[s], DType::f32), "") << "step " << s;
  }
  EXPECT_NE(a.sim.trace_hash, b.sim.trace_hash) << "the reduction is skipped all the same";
}

TEST(Compile, ARefusingLoaderStopsOnlyTheZeroBackends) {
  RunSpec sp = compiled_spec(1, {"autosp"}, {});
  sp.make_loader = [] { return std::make_unique<real::RefusingLoader>(); };
  EXPECT_TRUE(run_on_sim(sp).ranks_agree) << "AutoSP never needs the runtime";
  RunSpec z1 = compiled_spec(1, {"z1"}, {});
  z1.make_loader = sp.make_loader;
  try {
    run_on_sim(z1);
    FAIL() << "z1 compiled without a runtime";
  } catch (const RankFailure& f) {
    EXPECT_NE(std::string(f.what()).find("the DeepCompile runtime cannot be built on this accelerator"), std::string::npos) << f.what();
  }
}

TEST(Compile, BackendErrorsNameTheProblem) {
  sim::SimCluster(1, 1).run([&](sim::RankContext& ctx) {
    Synthetic model(std::vector<Shape>{{3}});
    Rng rng(1);
    model.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(Config::from_json({{"optimizer", {{"type", "Adam"}}}, {"train_micro_batch_size_per_gpu", 1}}, 1), model, ctx.device, ctx.world);
    EXPECT_THROW(e.compile(CompileConfig{true, {"autotp", "z1"}}), NotImplementedError);
    try {
      e.compile(CompileConfig{true, {"autotp"}});
      ADD_FAILURE() << "autotp with autotp_size 1 accepted";
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find("autotp needs 'tensor_parallel.autotp_size' > 1"), std::string::npos);
    }
    EXPECT_THROW(e.compile(CompileConfig{true, {"z2"}}), ConfigError);
  });
}

}  // namespace
}  // namespace zc::props
