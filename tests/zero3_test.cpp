// ZeRO-3 and offload behaviour beyond parity: what a rank holds outside forward/backward, that
// prefetch and persistence never change results, the all_gathers DeepSpeed issues over a run,
// micro_step_id over several steps, a release during a prefetch, external parameters, offload
// transfers, and the B3 chunk loss.
#include "engine/errors.h"
#include "engine/zero12_optimizer.h"
#include "engine/zero3_optimizer.h"
#include "models/mlp.h"
#include "models/synthetic.h"
#include "props/training_run.h"
#include "sim/sim_cluster.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fmt/ranges.h>

#include <functional>

namespace zc::props {
namespace {

nlohmann::json z3_config(std::int64_t persistence, std::int64_t prefetch) {
  return {{"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
          {"zero_optimization", {{"stage", 3}, {"reduce_bucket_size", 64},
                                 {"stage3_param_persistence_threshold", persistence},
                                 {"stage3_prefetch_bucket_size", prefetch}}}};
}

RunSpec mlp_spec(nlohmann::json cfg, int world) {
  RunSpec spec;
  spec.make_model = [] { return std::make_unique<Mlp>(MlpSpec{{6, 10, 7, 3}, true, LossKind::linear}); };
  spec.ds_config = std::move(cfg);
  spec.world = world;
  spec.steps = 3;
  spec.n_backward = 2;
  spec.micro_batch = 2;
  spec.domain = DataDomain::gaussian;
  spec.seed = 17;
  return spec;
}

std::vector<Module*> layers_of(Model& m) {
  std::vector<Module*> out;
  for (auto& c : m.children()) out.push_back(c.get());
  return out;
}

TEST(Zero3, OutsideForwardAndBackwardARankHoldsOnlyItsPartitions) {
  RunSpec spec = mlp_spec(z3_config(0, 0), 4);
  int checked = 0;
  spec.after_step = [&](int rank, int, Engine& e, double) {
    for (Parameter* p : e.model().named_parameters()) {
      EXPECT_EQ(p->ds_status, ZeroStatus::not_available) << p->name << " on rank " << rank;
      EXPECT_FALSE(p->data.defined()) << p->name;
      EXPECT_EQ(p->ds_shard.numel(), (p->numel() + 3) / 4) << p->name;
    }
    // Gathering a layer allocates exactly its full params; releasing frees them again. A layer's
    // weight and bias come in one coalesced all_gather whose flat buffer is cut into one tensor
    // per param of its own numel (DeepSpeed's torch.cat), and the flat buffer is freed.
    for (Module* layer : layers_of(e.model())) {
      const std::int64_t before = e.device().live_bytes();
      layer->run_pre_forward();
      std::int64_t gathered = 0;
      ASSERT_EQ(layer->params().size(), 2u);
      for (auto& [name, p] : layer->params()) {
        EXPECT_EQ(p->ds_status, ZeroStatus::available);
        gathered += p->numel() * dtype_size(p->dtype);
      }
      EXPECT_EQ(e.device().live_bytes() - before, gathered) << layer->name();
      layer->run_post_forward();
      EXPECT_EQ(e.device().live_bytes(), before) << layer->name() << " released";
    }
    ++checked;
  };
  const RunResult r = run_on_sim(spec);
  EXPECT_TRUE(r.ranks_agree) << r.disagreement;
  EXPECT_EQ(checked, 4 * 3);
}

TEST(Zero3, PrefetchAndPersistenceNeverChangeResults) {
  const RunResult plain = run_on_sim(mlp_spec(z3_config(0, 0), 3));
  std::int64_t prefetched = 0;
  RunSpec pre = mlp_spec(z3_config(0, 1'000'000), 3);
  pre.after_step = [&](int rank, int, Engine& e, double) {
    if (rank == 0) prefetched = dynamic_cast<Zero3Optimizer&>(e.optimizer()).prefetched();
  };
  const RunResult prefetch = run_on_sim(pre);
  RunSpec keep = mlp_spec(z3_config(30, 0), 3);  // biases and the last layer persist
  int persistent = 0;
  keep.after_step = [&](int rank, int step, Engine& e, double) {
    if (rank != 0 || step != 2) return;
    for (Parameter* p : e.model().named_parameters()) persistent += p->ds_status == ZeroStatus::available;
  };
  const RunResult persist = run_on_sim(keep);
  EXPECT_GT(prefetched, 0) << "prefetch must actually happen";
  EXPECT_GT(persistent, 0) << "some params must persist";
  for (std::size_t s = 0; s < plain.params.size(); ++s) {
    EXPECT_EQ(first_difference(prefetch.params[s], plain.params[s], DType::f32), "") << s;
    EXPECT_EQ(first_difference(persist.params[s], plain.params[s], DType::f32), "") << s;
    EXPECT_EQ(first_difference(prefetch.grads[s], plain.grads[s], DType::f32), "") << s;
    EXPECT_EQ(first_difference(persist.grads[s], plain.grads[s], DType::f32), "") << s;
  }
}

// ZeRO-3's all_gathers over a whole run (construction included), calls and output bytes on
// rank 0, against what DeepSpeed 0.19.8 issued on CPU/gloo for the same model and config:
// reference/deepspeed/gather_trace.py, which logs every collective of a plain training loop
// (2026-12-02). The run: SGD lr 0.125, micro-batch 2, reduce_bucket_size 1000, contiguous
// gradients, no overlap, f32; GA micro-steps of N forward/backward chunks, a step per micro-step.
struct GatherCase {
  std::vector<std::int64_t> dims = {};  // an MLP (ReLU between layers), or
  std::vector<std::int64_t> synthetic = {};  // a Synthetic model of these param sizes
  int world = 2, ga = 1, n = 1, steps = 2;
  nlohmann::json zero_extra = nlohmann::json::object();
  std::int64_t ds_calls = 0, ds_bytes = 0;  // DeepSpeed's, measured
};

OpStats z3_gathers(const GatherCase& c) {
  OpStats out;
  sim::SimCluster(c.world, 3).run([&](sim::RankContext& ctx) {
    nlohmann::json zero = {{"stage", 3}, {"contiguous_gradients", true}, {"overlap_comm", false}, {"reduce_bucket_size", 1000}};
    zero.update(c.zero_extra);
    Config cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", c.ga},
                                    {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.125}}}}},
                                    {"zero_allow_untested_optimizer", true}, {"zero_optimization", zero}}, c.world);
    std::unique_ptr<Model> model;
    if (c.dims.empty()) {
      std::vector<Shape> shapes;
      for (std::int64_t n : c.synthetic) shapes.push_back({n});
      model = std::make_unique<Synthetic>(shapes);
    } else {
      model = std::make_unique<Mlp>(MlpSpec{c.dims, c.dims.size() > 2, LossKind::linear});
    }
    Rng rng(1);
    model->init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(cfg, *model, ctx.device, ctx.world);
    Rng r(2);
    const Batch b = upload_batch(ctx.device, model->make_batch(r, 2, DataDomain::exact, {1, 0, 2}), DType::f32);
    for (int s = 0; s < c.steps; ++s) {
      for (int m = 0; m < c.ga; ++m) {
        for (int k = 0; k < c.n; ++k) e.backward(e.forward(b));
        e.step();
      }
    }
    if (ctx.rank == 0) out = ctx.world.stats()[CollectiveKind::all_gather];
  });
  return out;
}

TEST(Zero3, AllGathersAreDeepSpeedsCallForCallOverARun) {
  const std::vector<GatherCase> cases = {
      // 4 at construction, 2 + 2 coalesced fetches in the recording pass, 4 per step after it.
      {.dims = {3, 4, 2}, .steps = 3, .ds_calls = 20, .ds_bytes = 624},
      // The second micro-step's forward prefetches layer 1 in one call (layer 0 stayed: its
      // post-backward never fires and the epilogue keeps persistent params).
      {.dims = {3, 4, 2}, .ga = 2, .steps = 2, .ds_calls = 17, .ds_bytes = 560},
      // Non-persistent params: every later forward prefetches everything in one call.
      {.dims = {3, 4, 2, 2}, .n = 2, .zero_extra = {{"stage3_param_persistence_threshold", 0}}, .ds_calls = 15, .ds_bytes = 768},
      // No prefetch: a fetch per module in every forward, none in the complete trace's backward.
      {.dims = {3, 4, 2, 2}, .n = 2,
       .zero_extra = {{"stage3_param_persistence_threshold", 0}, {"stage3_prefetch_bucket_size", 0}},
       .ds_calls = 21, .ds_bytes = 768},
      // World 1: the construction's gathers are calls; the coordinator's are not; one persistent
      // param is re-gathered by a call after each step, several are not.
      {.synthetic = {3}, .world = 1, .ds_calls = 3, .ds_bytes = 36},
      {.synthetic = {3, 5, 7}, .world = 1, .ds_calls = 3, .ds_bytes = 60},
      {.synthetic = {3, 5}, .world = 2, .ga = 2, .n = 2, .ds_calls = 8, .ds_bytes = 200},
  };
  for (const GatherCase& c : cases) {
    const OpStats got = z3_gathers(c);
    EXPECT_EQ(got.calls, c.ds_calls) << fmt::format("dims [{}] synthetic [{}] world {} ga {} n {} steps {} zero {}",
                                                    fmt::join(c.dims, ","), fmt::join(c.synthetic, ","), c.world, c.ga,
                                                    c.n, c.steps, c.zero_extra.dump());
    EXPECT_EQ(got.bytes, c.ds_bytes) << fmt::format("dims [{}] synthetic [{}] world {}", fmt::join(c.dims, ","),
                                                    fmt::join(c.synthetic, ","), c.world);
  }
}

TEST(Zero3, MicroStepIdFollowsTheSpecOverSeveralSteps) {
  std::vector<int> seen;
  sim::SimCluster(2, 3).run([&](sim::RankContext& ctx) {
    Config cfg = Config::from_json({{"optimizer", {{"type", "Adam"}}}, {"train_micro_batch_size_per_gpu", 2}, {"zero_optimization", {{"stage", 3}}}}, 2);
    Synthetic model(std::vector<Shape>{{5}, {3}});
    Rng rng(1);
    model.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(cfg, model, ctx.device, ctx.world);
    for (int step = 0; step < 3; ++step) {
      for (int k = 0; k < 3; ++k) {
        e.set_gradient_accumulation_boundary(k == 2);
        Rng r(static_cast<std::uint64_t>(step * 10 + k));
        const Engine::Loss loss = e.forward(upload_batch(ctx.device, model.make_batch(r, 2, DataDomain::exact, {1, 0, 2}), DType::f32));
        if (ctx.rank == 0) seen.push_back(e.micro_step_id());  // the value partition_grads will use
        e.backward(loss);
      }
      e.step();
      if (ctx.rank == 0) seen.push_back(e.micro_step_id());
    }
  });
  // 0 at init; +1 at each forward after an epilogue; 0 again after step().
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0}));
}

// Note [ZeRO-3's trace checks], counted by hand for an MLP of 3 Linear layers (6 params, 171
// elements) at world 2, 3 steps of 2 backwards: construction broadcasts every param twice (the
// engine's model broadcast and zero.Init's, 2 x 171 x 4 B) and places 3 barriers; the first
// forward checks the empty module list (8 B, 0 B); the second checks the 8 recorded fetches (the
// root and 3 layers, forward and backward: 8 B, 64 B), then the 12 param entries twice (8 B, 96 B
// each); later forwards check nothing. DeepSpeed's counts for the same pattern are checked against
// DeepSpeed itself by the reference tests (label deepspeed).
TEST(Zero3, TraceChecksAreDeepSpeedsBroadcasts) {
  const RunResult r = run_on_sim(mlp_spec(z3_config(0, 0), 2));
  ASSERT_TRUE(r.ranks_agree) << r.disagreement;
  for (int rank = 0; rank < 2; ++rank) {
    const CommStats& init = r.comm_after_init.at(static_cast<std::size_t>(rank));
    EXPECT_EQ(init[CollectiveKind::broadcast].calls, 12);
    EXPECT_EQ(init[CollectiveKind::broadcast].bytes, 2 * 171 * 4);
    EXPECT_EQ(init[CollectiveKind::barrier].calls, 3);
    const CommStats& all = r.comm.at(static_cast<std::size_t>(rank));
    EXPECT_EQ(all[CollectiveKind::broadcast].calls - init[CollectiveKind::broadcast].calls, 2 + 6);
    EXPECT_EQ(all[CollectiveKind::broadcast].bytes - init[CollectiveKind::broadcast].bytes, 8 + 0 + 8 + 64 + 2 * (8 + 96));
    EXPECT_EQ(all[CollectiveKind::barrier].calls, 3);
  }
}

// On each of 2 simulated ranks: an Mlp{4, 4, 4} under ZeRO-3 with these zero_optimization keys,
// its engine and one exact batch, handed to `body`.
void on_small_z3_mlp(nlohmann::json zero, const std::function<void(sim::RankContext&, Engine&, Mlp&, const Batch&)>& body) {
  zero["stage"] = 3;
  sim::SimCluster(2, 1).run([&](sim::RankContext& ctx) {
    Config cfg = Config::from_json({{"optimizer", {{"type", "Adam"}}}, {"train_micro_batch_size_per_gpu", 2}, {"zero_optimization", zero}}, 2);
    Mlp model(MlpSpec{{4, 4, 4}, false, LossKind::linear});
    Rng rng(1);
    model.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(cfg, model, ctx.device, ctx.world);
    Rng r(2);
    const Batch b = upload_batch(ctx.device, model.make_batch(r, 2, DataDomain::exact, {1, 0, 2}), DType::f32);
    body(ctx, e, model, b);
  });
}

// A rank whose recorded fetches differ from rank 0's is named at the next forward's check. The
// MLP's params are persistent (the threshold below), so rank 1's extra fetch gathers nothing and
// the ranks meet at the check itself.
TEST(Zero3, ARankThatRecordsAnotherModuleOrderIsNamed) {
  try {
    on_small_z3_mlp({{"stage3_param_persistence_threshold", 100000}},
                    [](sim::RankContext& ctx, Engine& e, Mlp& model, const Batch& b) {
      e.backward(e.forward(b));  // the first forward starts recording
      if (ctx.rank == 1) {       // a module rank 0 does not run
        Module& layer = *layers_of(model)[0];
        layer.run_pre_forward();
        layer.run_post_forward();
      }
      e.backward(e.forward(b));  // the second checks the recording
    });
    FAIL() << "accepted";
  } catch (const RankFailure& f) {
    EXPECT_NE(std::string(f.what()).find("rank 1 failed: UsageError: ZeRO-3's trace check: rank 0 recorded 6 module fetches or params, "
                                         "rank 1 7: every rank must run the same modules in the same order"),
              std::string::npos) << f.what();
  }
}

// DeepSpeed's __release_param acts on AVAILABLE params only (partitioned_param_coordinator.py
// :624-630): a param whose prefetch is in flight stays INFLIGHT through a release, and the next
// fetch that waits for the prefetch makes every param of that one all_gather AVAILABLE.
TEST(Zero3, AReleaseOfAnInflightParamLeavesItsPrefetchToTheNextFetch) {
  on_small_z3_mlp({{"stage3_prefetch_bucket_size", 100000}, {"stage3_param_persistence_threshold", 0}},
                  [](sim::RankContext&, Engine& e, Mlp& model, const Batch& b) {
    e.backward(e.forward(b));  // records the trace; the next forward's is COMPLETE
    std::vector<Module*> layers = layers_of(model);
    Parameter& w1 = *layers[1]->params().get("weight");
    model.run_pre_forward();  // the root's fetch prefetches every later use in one all_gather
    EXPECT_EQ(w1.ds_status, ZeroStatus::inflight);
    layers[1]->run_post_forward();  // out of order, while layer 1's params are in flight
    EXPECT_EQ(w1.ds_status, ZeroStatus::inflight) << "an INFLIGHT param is not released";
    layers[0]->run_pre_forward();  // waits for the prefetch: layer 1's params come with it
    EXPECT_EQ(w1.ds_status, ZeroStatus::available);
    EXPECT_EQ(w1.data.numel(), w1.numel());
  });
}

// A complete trace that a module order departs from is invalidated, not an error
// (trace_prologue, partitioned_param_coordinator.py:202-219): the prefetch in flight is waited
// and released, the fetch goes on, and the next forward records the trace again.
TEST(Zero3, AModuleOrderThatLeavesTheTraceInvalidatesItAndTheNextForwardRecordsAgain) {
  on_small_z3_mlp({{"stage3_prefetch_bucket_size", 100000}, {"stage3_param_persistence_threshold", 0}},
                  [](sim::RankContext& ctx, Engine& e, Mlp& model, const Batch& b) {
    e.backward(e.forward(b));  // records
    std::vector<Module*> layers = layers_of(model);
    Parameter& w0 = *layers[0]->params().get("weight");
    Parameter& w1 = *layers[1]->params().get("weight");
    model.run_pre_forward();  // COMPLETE: prefetches every later use
    EXPECT_EQ(w0.ds_status, ZeroStatus::inflight);
    layers[1]->run_pre_forward();  // the trace expects layer 0 here
    EXPECT_EQ(w1.ds_status, ZeroStatus::available);
    EXPECT_EQ(w0.ds_status, ZeroStatus::not_available) << "the prefetch is waited and released";
    layers[1]->run_post_forward();
    model.run_post_forward();
    const std::int64_t gathers = ctx.world.stats()[CollectiveKind::all_gather].calls;
    e.backward(e.forward(b));  // records again: one fetch per module, forward and backward
    EXPECT_EQ(ctx.world.stats()[CollectiveKind::all_gather].calls - gathers, 4);
    e.step();
  });
}

TEST(Zero3, AnExternalParameterIsGatheredByTheModuleThatUsesIt) {
  sim::SimCluster(2, 1).run([&](sim::RankContext& ctx) {
    Config cfg = Config::from_json({{"optimizer", {{"type", "Adam"}}}, {"train_micro_batch_size_per_gpu", 2}, {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 0}}}}, 2);
    Mlp model(MlpSpec{{4, 4, 4}, false, LossKind::linear});
    Rng rng(1);
    model.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(cfg, model, ctx.device, ctx.world);
    std::vector<Module*> layers = layers_of(model);
    Parameter& tied = *layers[0]->params().get("weight");
    e.register_external_parameter(*layers[1], tied);
    layers[1]->run_pre_forward();
    EXPECT_EQ(tied.ds_status, ZeroStatus::available);
    EXPECT_EQ(tied.data.numel(), 16);
    layers[1]->run_post_forward();
    EXPECT_EQ(tied.ds_status, ZeroStatus::not_available);
  });
}

// Offload: with the fixed gate, N backward chunks at GA 1 give the same result as no offload;
// with B3 (the historical `GA > 1` gate), every chunk but the last is lost.
RunSpec offload_spec(int stage, bool offload, int n, BugSet bugs) {
  RunSpec spec;
  spec.make_model = [] { return std::make_unique<Synthetic>(std::vector<Shape>{{7}, {3, 3}, {2}}); };
  spec.ds_config = {{"optimizer", {{"type", "Adam"}}}, {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 10}}}};
  if (offload) spec.ds_config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  spec.world = 2;
  spec.steps = 2;
  spec.n_backward = n;
  spec.exact.grad_multiple = 2;
  spec.bugs = bugs;
  spec.seed = 8;
  return spec;
}

TEST(Offload, MatchesNoOffloadBitForBitForEveryStageAndChunkCount) {
  for (int stage : {1, 2, 3}) {
    for (int n = 1; n <= 4; ++n) {
      const RunResult off = run_on_sim(offload_spec(stage, true, n, {}));
      const RunResult on = run_on_sim(offload_spec(stage, false, n, {}));
      for (std::size_t s = 0; s < off.params.size(); ++s) {
        EXPECT_EQ(first_difference(off.params[s], on.params[s], DType::f32), "") << "stage " << stage << " n " << n;
        EXPECT_EQ(first_difference(off.grads[s], on.grads[s], DType::f32), "") << "stage " << stage << " n " << n;
      }
    }
  }
}

// The averaged gradient of step `step` had it seen its last backward chunk alone, from the data
// alone: the loss-scaled global-batch mean of the chunk's prescribed per-sample gradients
// (Synthetic's arrays g0, g1, ... in parameter order), GA 1.
std::vector<double> last_chunk_grad(const RunSpec& spec, int step, double loss_scale) {
  const std::unique_ptr<Model> model = spec.make_model();
  const HostBatch hb = global_batch(spec, *model, step, 0, spec.n_backward - 1);
  std::vector<double> out;
  for (int id = 0; hb.arrays.contains(fmt::format("g{}", id)); ++id) {
    const HostArray& a = hb.arrays.at(fmt::format("g{}", id));
    const std::int64_t cols = a.shape[1];
    for (std::int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (std::int64_t r = 0; r < hb.samples; ++r) sum += a.values[static_cast<std::size_t>(r * cols + j)];
      out.push_back(sum * loss_scale / static_cast<double>(hb.samples));
    }
  }
  return out;
}

// Stage 2 reduces every backward, so chunks 1..N-1 must be saved to the CPU buffer; the B3 gate
// never saves them at GA 1, and the step sees exactly the last chunk's gradient (the fixed gate
// sums all N, as the oracle does). (Stage 1 with the explicit boundary reduces once, at the last
// chunk, from grads that already summed in .grad, so B3 cannot show there.)
TEST(Offload, KnownBugB3DropsEveryChunkButTheLast) {
  const BugSet b3{KnownBug::B3_offload_copy_gate};
  for (int stage : {2}) {  // a loop, so stage 3 joins if it ever shares the gate
    const RunResult one_ok = run_on_sim(offload_spec(stage, false, 1, {}));
    const RunResult one_bug = run_on_sim(offload_spec(stage, true, 1, b3));
    EXPECT_EQ(first_difference(one_bug.grads[0], one_ok.grads[0], DType::f32), "") << "N = 1 is unaffected";
    for (int n = 2; n <= 4; ++n) {
      const RunSpec spec = offload_spec(stage, true, n, b3);
      const RunResult bug = run_on_sim(spec);
      const RunResult ok = run_on_sim(offload_spec(stage, true, n, {}));
      ASSERT_EQ(bug.grads.size(), static_cast<std::size_t>(spec.steps));
      for (int s = 0; s < spec.steps; ++s) {
        const std::size_t k = static_cast<std::size_t>(s);
        const std::vector<double> last = last_chunk_grad(spec, s, bug.loss_scales[k]);
        const std::vector<double> all = prescribed_grad_oracle(spec, 1, ok.loss_scales[k], s).value;
        ASSERT_NE(first_difference(last, all, DType::f64), "") << "the data must tell the last chunk from the sum";
        EXPECT_EQ(first_difference(bug.grads[k], last, DType::f32), "")
            << "with B3 the step sees the last chunk only: stage " << stage << " n " << n << " step " << s;
        EXPECT_EQ(first_difference(ok.grads[k], all, DType::f32), "")
            << "the fixed gate sums every chunk: stage " << stage << " n " << n << " step " << s;
      }
    }
  }
}

TEST(Offload, TransfersAreRealCountedCopies) {
  RunSpec spec = offload_spec(3, true, 2, {});
  spec.ds_config["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  std::vector<OffloadStats> after;  // rank 0, after each step
  spec.after_step = [&](int rank, int, Engine& e, double) {
    if (rank == 0) after.push_back(*dynamic_cast<Zero3Optimizer&>(e.optimizer()).offload_stats());
  };
  run_on_sim(spec);
  ASSERT_EQ(after.size(), 2u);
  // The second step alone (construction's copies excluded) moves grads to the CPU and params back.
  EXPECT_GT(after[1].transfers, after[0].transfers);
  EXPECT_GT(after[1].to_cpu_bytes, after[0].to_cpu_bytes);
  EXPECT_GT(after[1].to_device_bytes, after[0].to_device_bytes);
}

}  // namespace
}  // namespace zc::props
