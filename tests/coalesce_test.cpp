// coalesce_grad_reduction (SPEC 6): invariant I1 (coalesced == baseline, bit for bit in the exact
// domain, within a stated bound on gaussian data), I2 (ZeRO-3 micro_step_id is 0 at every
// flush), one reduction pass per coalesced step, and every failure mode with its message.
#include "engine/errors.h"
#include "models/synthetic.h"
#include "props/training_run.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>

#include <cmath>

namespace zc::props {
namespace {

struct Dt {
  DType dtype;
  bool accum32;
  std::string name() const { return std::string(dtype_name(dtype)) + (accum32 ? "acc32" : ""); }
};

nlohmann::json coalesce_config(int stage, bool contiguous, bool overlap, bool offload, Dt dt,
                               std::int64_t bucket, bool clip) {
  nlohmann::json j = {
      {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
      {"gradient_clipping", clip ? 0.5 : 0.0},
      {"zero_optimization", {{"stage", stage}, {"contiguous_gradients", contiguous},
                             {"overlap_comm", overlap}, {"reduce_bucket_size", bucket}}}};
  if (offload) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (dt.dtype == DType::f16) j["fp16"] = {{"enabled", true}, {"initial_scale_power", 4}};
  if (dt.dtype == DType::bf16) j["bf16"] = {{"enabled", true}};
  if (dt.accum32) j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  return j;
}

RunSpec coalesce_spec(nlohmann::json cfg, int world, int n, DataDomain domain, std::uint64_t seed) {
  RunSpec spec;
  spec.make_model = [] { return std::make_unique<Synthetic>(std::vector<Shape>{{5}, {3, 2}, {23}, {1}, {4}}); };
  spec.ds_config = std::move(cfg);
  spec.world = world;
  spec.steps = 3;
  spec.n_backward = n;
  spec.micro_batch = 2;
  spec.domain = domain;
  spec.exact.grad_multiple = world;
  spec.seed = seed;
  return spec;
}

// "" when every step's averaged grads, fp32 master partition and 16-bit params agree bit for bit.
std::string compare_runs(const RunResult& a, const RunResult& b, DType dt) {
  for (std::size_t s = 0; s < a.params.size(); ++s) {
    if (std::string d = first_difference(a.grads[s], b.grads[s], dt); !d.empty()) return fmt::format("step {} averaged grads: {}", s, d);
    if (std::string d = first_difference(a.masters[s], b.masters[s], DType::f32); !d.empty()) return fmt::format("step {} fp32 master: {}", s, d);
    if (std::string d = first_difference(a.params[s], b.params[s], dt); !d.empty()) return fmt::format("step {} 16-bit params: {}", s, d);
  }
  return "";
}

class CoalesceI1 : public ::testing::TestWithParam<std::tuple<int, int>> {};

// I1-coalesced-bit-exact over stage x contiguous x overlap x offload x dtype x bucket x world x
// N 1-6 x 3 steps, clipping on for odd N.
TEST_P(CoalesceI1, CoalescedEqualsBaselineBitForBitInTheExactDomain) {
  const auto [stage, dt_index] = GetParam();
  const Dt dts[] = {{DType::f32, false}, {DType::f16, false}, {DType::bf16, false}, {DType::bf16, true}};
  const Dt dt = dts[dt_index];
  if (stage == 1 && dt.accum32) GTEST_SKIP() << "ZeRO-1 + bf16 + fp32 accumulation is DeepSpeed's BF16_Optimizer, which refuses coalescing (tested below)";
  int cases = 0;
  for (bool contiguous : {false, true}) {
    for (bool overlap : {false, true}) {
      for (bool offload : {false, true}) {
        for (std::int64_t bucket : {8, 1000}) {
          for (int world : {1, 2, 3, 4, 8}) {
            for (int n = 1; n <= 6; ++n) {
              const nlohmann::json cfg = coalesce_config(stage, contiguous, overlap, offload, dt, bucket, n % 2 == 1);
              RunSpec base = coalesce_spec(cfg, world, n, DataDomain::exact, 3);
              RunSpec co = base;
              co.coalesce = true;
              const RunResult b = run_on_sim(base), c = run_on_sim(co);
              ASSERT_TRUE(c.ranks_agree) << c.disagreement;
              const std::string diff = compare_runs(c, b, dt.dtype);
              ASSERT_EQ(diff, "") << "stage " << stage << " " << dt.name() << " contiguous " << contiguous
                                  << " overlap " << overlap << " offload " << offload << " bucket " << bucket
                                  << " world " << world << " N " << n;
              ++cases;
            }
          }
        }
      }
    }
  }
  RecordProperty("cases", cases);
  EXPECT_GE(cases, 8 * 2 * 5 * 6);
}

INSTANTIATE_TEST_SUITE_P(StagesAndDtypes, CoalesceI1,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 1, 2, 3)));

TEST(CoalesceI2, Zero3MicroStepIdIsZeroAtEveryFlush) {
  RunSpec spec = coalesce_spec(coalesce_config(3, true, true, false, {DType::f32, false}, 8, false), 4, 3, DataDomain::exact, 5);
  spec.coalesce = true;
  spec.steps = 4;
  const RunResult r = run_on_sim(spec);
  EXPECT_EQ(r.flush_micro_step_ids, (std::vector<int>{0, 0, 0, 0}));
}

TEST(CoalesceI2, KnownBugB4BreaksI2AndFromStepTwoI1) {
  RunSpec spec = coalesce_spec(coalesce_config(3, true, true, false, {DType::f32, false}, 8, false), 4, 3, DataDomain::exact, 5);
  spec.steps = 3;
  const RunResult base = run_on_sim(spec);
  spec.coalesce = true;
  spec.bugs = BugSet{KnownBug::B4_z3_seen_flag_while_coalescing};
  const RunResult bug = run_on_sim(spec);
  EXPECT_EQ(bug.flush_micro_step_ids, (std::vector<int>{2, 2, 2})) << "micro_step_id reaches N-1 at the flush";
  EXPECT_EQ(first_difference(bug.grads[0], base.grads[0], DType::f32), "") << "step 1 adds into a zero buffer";
  EXPECT_NE(first_difference(bug.grads[1], base.grads[1], DType::f32), "") << "step 2 adds into step 1's stale buffer";
}

TEST(CoalesceI1, KnownBugB7LeavesGradsUnreduced) {
  RunSpec spec = coalesce_spec(coalesce_config(2, true, false, false, {DType::f32, false}, 8, false), 4, 2, DataDomain::exact, 5);
  const RunResult base = run_on_sim(spec);
  spec.coalesce = true;
  spec.bugs = BugSet{KnownBug::B7_flush_with_coalescing_set};
  const RunResult bug = run_on_sim(spec);
  EXPECT_NE(compare_runs(bug, base, DType::f32), "");
}

// One reduction pass per coalesced step: strictly fewer collectives than the baseline for N >= 2.
TEST(CoalesceCounts, OneReductionPassPerCoalescedStep) {
  std::string table = "| stage | N | reduce_bucket_size | baseline collectives | coalesced collectives |\n|---|---|---|---|---|\n";
  for (int stage : {1, 2, 3}) {
    for (int n : {1, 2, 4}) {
      for (std::int64_t bucket : {8, 1000}) {
        RunSpec spec = coalesce_spec(coalesce_config(stage, true, false, false, {DType::f32, false}, bucket, false), 4, n, DataDomain::exact, 5);
        spec.steps = 1;
        spec.collect_grads = false;
        const RunResult b = run_on_sim(spec);
        spec.coalesce = true;
        const RunResult c = run_on_sim(spec);
        const std::int64_t bc = b.comm[0].total_calls(), cc = c.comm[0].total_calls();
        table += fmt::format("| {} | {} | {} | {} | {} |\n", stage, n, bucket, bc, cc);
        if (n == 1 || stage == 1) {
          EXPECT_EQ(cc, bc) << "stage " << stage << " N " << n;
        } else {
          EXPECT_LT(cc, bc) << "stage " << stage << " N " << n << " bucket " << bucket;
        }
      }
    }
  }
  std::printf("%s", table.c_str());
}

// Gaussian data: coalesced and baseline sum the same N x W terms in two association orders.
// Stated bound per element: |c - b| <= 2 (B + W + N + 3) u S, u the dtype's unit roundoff and
// S = sum over ranks and chunks of the local gradient magnitudes / W (from the host data).
// Bit-identical for N = 1, world = 1 and stage 1.
TEST(CoalesceGaussian, WithinTheStatedBoundAndExactWhereTheOrdersAgree) {
  for (Dt dt : {Dt{DType::f32, false}, Dt{DType::bf16, false}, Dt{DType::f16, false}}) {
    double worst_ulps = 0;
    for (int stage : {1, 2, 3}) {
      for (int world : {1, 2, 4}) {
        for (int n : {1, 2, 4}) {
          RunSpec spec = coalesce_spec(coalesce_config(stage, true, false, false, dt, 16, false), world, n, DataDomain::gaussian, 9);
          spec.steps = 1;
          const RunResult b = run_on_sim(spec);
          RunSpec co = spec;
          co.coalesce = true;
          const RunResult c = run_on_sim(co);
          if (n == 1 || world == 1 || stage == 1) {
            EXPECT_EQ(first_difference(c.grads[0], b.grads[0], dt.dtype), "") << dt.name() << " stage " << stage << " world " << world << " n " << n;
            continue;
          }
          const std::unique_ptr<Model> model = spec.make_model();
          std::vector<double> S(b.grads[0].size(), 0.0);
          for (int k = 0; k < n; ++k) {
            const HostBatch hb = global_batch(spec, *model, 0, 0, k);
            std::size_t at = 0;
            for (const auto& [name, a] : hb.arrays) {
              const std::int64_t cols = a.shape[1];
              for (std::int64_t j = 0; j < cols; ++j) {
                for (std::int64_t r = 0; r < hb.samples; ++r) S[at + static_cast<std::size_t>(j)] += std::fabs(a.values[static_cast<std::size_t>(r * cols + j)]) / static_cast<double>(spec.micro_batch * world);
              }
              at += static_cast<std::size_t>(cols);
            }
          }
          for (double& x : S) x *= b.loss_scales[0];  // the averaged grads carry the loss scale
          const double u = std::ldexp(1.0, -dtype_mantissa_bits(dt.dtype));
          const double gamma = 2.0 * static_cast<double>(spec.micro_batch + world + n + 3) * u;
          for (std::size_t i = 0; i < S.size(); ++i) {
            const double err = std::fabs(c.grads[0][i] - b.grads[0][i]);
            ASSERT_LE(err, gamma * S[i]) << dt.name() << " element " << i;
            const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(b.grads[0][i]), 1e-30)) - dtype_mantissa_bits(dt.dtype) + 1);
            worst_ulps = std::max(worst_ulps, err / ulp);
          }
        }
      }
    }
    std::printf("coalesced vs baseline on gaussian data, %s: largest difference %.0f ulp\n", dt.name().c_str(), worst_ulps);
    RecordProperty(dt.name() + "_max_ulps", std::to_string(worst_ulps));
  }
}

// ---- failure modes ------------------------------------------------------------------------------

template <class Body>
void on_engine(nlohmann::json cfg, Options opts, Body body) {
  sim::SimCluster(2, 1).run([&](sim::RankContext& ctx) {
    cfg["train_micro_batch_size_per_gpu"] = 2;
    if (!cfg.contains("optimizer")) cfg["optimizer"] = {{"type", "Adam"}};  // Note [No optimizer]
    const Config c = Config::from_json(cfg, 2);
    Synthetic model(std::vector<Shape>{{4}, {3}});
    Rng rng(1);
    model.init_params(ctx.device, c.model_dtype(), DataDomain::exact, {}, rng);
    Engine e(c, model, ctx.device, ctx.world, opts);
    body(e, model, ctx);
  });
}

template <class E, class F>
void expect_throw_with(F f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

Batch small_batch(Model& m, Device& dev, DType dt, std::uint64_t seed) {
  Rng r(seed);
  return upload_batch(dev, m.make_batch(r, 2, DataDomain::exact, {1, 0, 2}), dt);
}

TEST(CoalesceErrors, EachMisuseIsRefusedWithItsMessage) {
  on_engine({{"zero_optimization", {{"stage", 2}}}}, {}, [](Engine& e, Model& m, sim::RankContext& ctx) {
    expect_throw_with<UsageError>([&] { e.coalesce_grad_reduction([&] { e.step(); }); }, "step() inside no_sync() or coalesce_grad_reduction()");
    EXPECT_FALSE(e.coalescing());
    EXPECT_FALSE(e.inside_no_sync());
    expect_throw_with<UsageError>([&] { e.coalesce_grad_reduction([&] { e.no_sync([] {}); }); }, "incompatible with gradient partitioning");
    // The engine is usable after a body threw: a normal step works.
    e.backward(e.forward(small_batch(m, ctx.device, DType::f32, 1)));
    e.step();
    EXPECT_EQ(e.global_steps(), 1);
  });
  on_engine({{"zero_optimization", {{"stage", 1}}}}, {}, [](Engine& e, Model&, sim::RankContext&) {
    expect_throw_with<UsageError>([&] { e.no_sync([&] { e.coalesce_grad_reduction([] {}); }); }, "cannot be nested inside another no_sync context");
    expect_throw_with<UsageError>([&] { e.coalesce_grad_reduction([&] { e.no_sync([] {}); }); }, "reentry is unsupported");
  });
  on_engine({{"zero_optimization", {{"stage", 0}}}}, {}, [](Engine& e, Model&, sim::RankContext&) {
    expect_throw_with<NotImplementedError>([&] { e.coalesce_grad_reduction([] {}); }, "requires ZeRO stage 1/2/3, got stage 0");
  });
  Options pipe;
  pipe.pipeline = true;
  on_engine({{"zero_optimization", {{"stage", 2}}}}, pipe, [](Engine& e, Model&, sim::RankContext&) {
    expect_throw_with<NotImplementedError>([&] { e.coalesce_grad_reduction([] {}); }, "not supported under pipeline parallelism");
  });
  on_engine({{"bf16", {{"enabled", true}}}, {"data_types", {{"grad_accum_dtype", "fp32"}}}, {"zero_optimization", {{"stage", 1}}}}, {},
            [](Engine& e, Model&, sim::RankContext&) {
    expect_throw_with<NotImplementedError>([&] { e.coalesce_grad_reduction([] {}); }, "optimizer wrapper BF16_Optimizer");
    expect_throw_with<NotImplementedError>([&] { e.coalesce_grad_reduction([] {}); }, "use ZeRO stage 2");
    // SPEC 6 order: the wrapper check comes before the nesting check.
    expect_throw_with<NotImplementedError>([&] { e.no_sync([&] { e.coalesce_grad_reduction([] {}); }); }, "optimizer wrapper BF16_Optimizer");
  });
}

TEST(CoalesceScope, FullGradsInsideAreLocalAndTheBoundaryIsRestored) {
  on_engine({{"zero_optimization", {{"stage", 2}}}}, {}, [](Engine& e, Model& m, sim::RankContext& ctx) {
    e.set_gradient_accumulation_boundary(false);
    std::vector<double> inside;
    e.coalesce_grad_reduction([&] {
      e.backward(e.forward(small_batch(m, ctx.device, DType::f32, 10 + static_cast<std::uint64_t>(ctx.rank))));
      inside = e.full_grads();  // local: no collective, so ranks may differ
    });
    EXPECT_FALSE(e.is_gradient_accumulation_boundary()) << "the saved explicit boundary comes back";
    // The local grad is this rank's own batch mean, unreduced.
    Rng r(10 + static_cast<std::uint64_t>(ctx.rank));
    const HostBatch hb = m.make_batch(r, 2, DataDomain::exact, {1, 0, 2});
    const auto& g0 = hb.arrays.at("g0").values;
    for (int j = 0; j < 4; ++j) EXPECT_EQ(inside[static_cast<std::size_t>(j)], (g0[static_cast<std::size_t>(j)] + g0[static_cast<std::size_t>(4 + j)]) / 2) << j;
    std::vector<double> after = e.full_grads();  // reduced now
    Rng r0(10), r1(11);
    const HostBatch h0 = m.make_batch(r0, 2, DataDomain::exact, {1, 0, 2}), h1 = m.make_batch(r1, 2, DataDomain::exact, {1, 0, 2});
    for (int j = 0; j < 4; ++j) {
      const double a = (h0.arrays.at("g0").values[static_cast<std::size_t>(j)] + h0.arrays.at("g0").values[static_cast<std::size_t>(4 + j)]) / 2;
      const double b = (h1.arrays.at("g0").values[static_cast<std::size_t>(j)] + h1.arrays.at("g0").values[static_cast<std::size_t>(4 + j)]) / 2;
      EXPECT_EQ(after[static_cast<std::size_t>(j)], (a + b) / 2) << j;
    }
  });
}

}  // namespace
}  // namespace zc::props
