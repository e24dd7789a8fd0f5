// TinyLlama with AutoTP (Megatron tensor parallelism) and AutoSP (Ulysses sequence parallelism):
// the explicit backward against f64 central finite differences, f32 against the f64 model, the
// TP and SP models against the unsharded one (model level in f64, engine level in f32), falling
// loss, and compile() checking the model's parallel layout (Note [Parallel passes]).
//
// Note [TinyLlama bounds]
// - Finite differences (f64): central difference with h = 2^-17 has truncation error
//   h^2 |f'''| / 6 and rounding error ~ 2^-53 |L| / h; with |L| ~ 3 and |f'''| = O(10) both are
//   below 1e-9, so |g - fd| <= 1e-7 leaves two orders of margin; a wrong backward term is O(1e-2).
// - f32 vs f64 and the parallel runs: every dot product has at most K = 16 terms, and recursive
//   summation errs by at most (K-1) u sum|terms| (u = 2^-24 in f32), so one op errs by < 2^4 u
//   relative to its terms. TP and SP change only the order of sums (the row-parallel partials
//   added by all_reduce, the "f" input grads summed across TP ranks, the SP ranks' grads summed by
//   the engine), so every run is within the f32-vs-f64 error of the exact result, and two runs
//   within twice that. Allowing a further 2^4 for the composition of the ~16 dependent layers
//   (norms, attention, residuals: O(1) condition at these sizes, not a proof) gives 2^8 u =
//   2^-16 of max|g| (of the loss for losses). A sharding bug (a wrong slice, a missed all_reduce,
//   a wrong loss scale) moves grads by O(max|g|), 2^16 times more.
// - f64 parallel vs unsharded: the same argument with u = 2^-53 gives 2^-45.
#include "engine/engine.h"
#include "engine/errors.h"
#include "engine/host_device.h"
#include "models/mlp.h"
#include "models/tinyllama.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace zc {
namespace {

constexpr std::uint64_t kSeed = 5;
// Note [TinyLlama bounds]: relative to max|g| (or to the loss).
const double kF32Bound = std::ldexp(1.0, -16);
const double kF64Bound = std::ldexp(1.0, -45);

TinyLlamaSpec small_spec(std::int64_t heads) {
  TinyLlamaSpec s;
  s.heads = heads;
  return s;
}

HostBatch batch_of(const TinyLlamaSpec& spec, std::int64_t samples, std::uint64_t stream) {
  Rng rng = Rng(kSeed).split(stream);
  return TinyLlama(spec).make_batch(rng, samples, DataDomain::gaussian, {});
}

void init(TinyLlama& m, Device& dev, DType dtype) {
  Rng rng = Rng(kSeed).split(7);
  m.init_params(dev, dtype, DataDomain::gaussian, {}, rng);
}

std::vector<double> grads_of(Device& dev, TinyLlama& m) {
  std::vector<double> out;
  for (Parameter* p : m.named_parameters()) {
    const std::vector<double> g = to_f64(dev, p->grad);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

struct PlainRun {
  double loss = 0;
  std::vector<double> grads;  // named_parameters() order of the unsharded model
};

// One forward and backward of the unsharded model on the host.
PlainRun run_plain(const TinyLlamaSpec& spec, DType dtype, const HostBatch& hb) {
  HostDevice dev;
  TinyLlama m(spec);
  init(m, dev, dtype);
  PlainRun r;
  r.loss = m.forward(dev, upload_batch(dev, hb, dtype));
  m.backward(dev, 1.0, 1);
  r.grads = grads_of(dev, m);
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max_i |a_i - b_i|, and the index where it is reached.
std::pair<double, std::size_t> max_diff(const std::vector<double>& a,
                                        const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::pair<double, std::size_t> worst{0.0, 0};
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(a[i] - b[i]);
    if (!(d <= worst.first)) worst = {d, i};
  }
  return worst;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& ref, double rel_bound,
                  const std::string& what) {
  const double scale = max_abs(ref);
  const auto [d, i] = max_diff(got, ref);
  EXPECT_LE(d, rel_bound * scale) << what << ": element " << i << " " << got[i] << " vs " << ref[i]
                                  << ", bound " << rel_bound << " x max|g| " << scale;
  std::printf("[ measured ] %s: max |diff| %.3g = %.3g x max|g| (bound %.3g)\n", what.c_str(), d,
              d / scale, rel_bound);
}

TEST(TinyLlama, GradientsMatchF64FiniteDifferences) {
  const TinyLlamaSpec spec = small_spec(2);
  const HostBatch hb = batch_of(spec, 2, 1);
  HostDevice dev;
  TinyLlama m(spec);
  init(m, dev, DType::f64);
  const Batch b = upload_batch(dev, hb, DType::f64);
  m.forward(dev, b);
  m.backward(dev, 1.0, 1);
  const double h = std::ldexp(1.0, -17);
  double worst = 0;
  std::int64_t checked = 0;
  for (Parameter* p : m.named_parameters()) {
    std::vector<double> v = to_f64(dev, p->data);
    const std::vector<double> g = to_f64(dev, p->grad);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double keep = v[i];
      v[i] = keep + h;
      write_f64(dev, p->data, v);
      const double up = m.forward(dev, b);
      v[i] = keep - h;
      write_f64(dev, p->data, v);
      const double down = m.forward(dev, b);
      v[i] = keep;
      write_f64(dev, p->data, v);
      const double fd = (up - down) / (2 * h);
      ASSERT_LE(std::abs(fd - g[i]), 1e-7)
          << p->name << "[" << i << "]: backward " << g[i] << " fd " << fd;
      worst = std::max(worst, std::abs(fd - g[i]));
      ++checked;
    }
  }
  std::printf("[ measured ] %lld params, max |backward - fd| %.3g (bound 1e-7)\n",
              static_cast<long long>(checked), worst);
}

TEST(TinyLlama, F32GradientsMatchTheF64Model) {
  const TinyLlamaSpec spec = small_spec(2);
  const HostBatch hb = batch_of(spec, 2, 1);
  HostDevice dev;
  TinyLlama m32(spec), m64(spec);
  init(m32, dev, DType::f32);
  init(m64, dev, DType::f64);
  const std::vector<Parameter*> p32 = m32.named_parameters(), p64 = m64.named_parameters();
  for (std::size_t i = 0; i < p32.size(); ++i) dev.cast(p64[i]->data, p32[i]->data);  // same values
  const double l32 = m32.forward(dev, upload_batch(dev, hb, DType::f32));
  m32.backward(dev, 1.0, 1);
  const double l64 = m64.forward(dev, upload_batch(dev, hb, DType::f64));
  m64.backward(dev, 1.0, 1);
  EXPECT_LE(std::abs(l32 - l64), kF32Bound * l64);
  expect_close(grads_of(dev, m32), grads_of(dev, m64), kF32Bound, "f32 vs f64 grads");
}

// Model-level TP over a world of `tp` ranks in f64: gathered grads against the unsharded model.
TEST(TinyLlama, TensorParallelMatchesTheUnshardedModelInF64) {
  const TinyLlamaSpec spec = small_spec(2);
  const HostBatch hb = batch_of(spec, 2, 1);
  const PlainRun ref = run_plain(spec, DType::f64, hb);
  const int tp = 2;
  std::vector<std::vector<double>> per_rank(tp);
  std::vector<double> losses(tp);
  sim::SimCluster(tp, kSeed).run([&](sim::RankContext& ctx) {
    std::unique_ptr<Comm> group = ctx.world.split(0, ctx.rank);
    TinyLlama m(spec, TinyLlamaGroups{.tp = group.get()});
    init(m, ctx.device, DType::f64);
    losses[static_cast<std::size_t>(ctx.rank)] =
        m.forward(ctx.device, upload_batch(ctx.device, hb, DType::f64));
    m.backward(ctx.device, 1.0, 1);
    per_rank[static_cast<std::size_t>(ctx.rank)] = grads_of(ctx.device, m);
  });
  for (double l : losses) EXPECT_LE(std::abs(l - ref.loss), kF64Bound * ref.loss);
  expect_close(TinyLlama::gather_tp(spec, per_rank), ref.grads, kF64Bound, "tp 2 f64 grads");
}

// Model-level Ulysses in f64: each rank holds S/sp tokens; grads summed over the ranks and divided
// by sp (the engine's divide-by-world average) against the unsharded model.
TEST(TinyLlama, UlyssesMatchesTheUnshardedModelInF64) {
  for (int sp : {2, 4}) {
    const TinyLlamaSpec spec = small_spec(4);
    const HostBatch hb = batch_of(spec, 2, 1);
    const PlainRun ref = run_plain(spec, DType::f64, hb);
    std::vector<std::vector<double>> per_rank(static_cast<std::size_t>(sp));
    std::vector<double> losses(static_cast<std::size_t>(sp));
    sim::SimCluster(sp, kSeed).run([&](sim::RankContext& ctx) {
      std::unique_ptr<Comm> group = ctx.world.split(0, ctx.rank);
      TinyLlama m(spec, TinyLlamaGroups{.sp = group.get()});
      init(m, ctx.device, DType::f64);
      const HostBatch mine = sequence_shard(hb, ctx.rank, sp);
      losses[static_cast<std::size_t>(ctx.rank)] =
          m.forward(ctx.device, upload_batch(ctx.device, mine, DType::f64));
      m.backward(ctx.device, 1.0, 1);
      per_rank[static_cast<std::size_t>(ctx.rank)] = grads_of(ctx.device, m);
    });
    std::vector<double> avg(ref.grads.size(), 0.0);
    double loss = 0;
    for (int r = 0; r < sp; ++r) {
      for (std::size_t i = 0; i < avg.size(); ++i)
        avg[i] += per_rank[static_cast<std::size_t>(r)][i];
      loss += losses[static_cast<std::size_t>(r)];
    }
    // Controls: one rank's share alone, or the shares summed without the divide-by-world, are
    // far from the unsharded gradient (Note [Ulysses loss scaling]).
    EXPECT_GT(max_diff(per_rank[0], ref.grads).first, 0.0625 * max_abs(ref.grads)) << "sp " << sp;
    EXPECT_GT(max_diff(avg, ref.grads).first, 0.0625 * max_abs(ref.grads)) << "sp " << sp;
    for (double& g : avg) g /= sp;
    EXPECT_LE(std::abs(loss / sp - ref.loss), kF64Bound * ref.loss) << "sp " << sp;
    expect_close(avg, ref.grads, kF64Bound, fmt::format("sp {} f64 grads", sp));
  }
}

// ---- under the Engine (f32) ----

struct EngineRun {
  std::vector<double> losses;  // [step] the global mean loss
  std::vector<double> grads0;  // the averaged grads of step 0, unsharded order
};

nlohmann::json engine_config(int stage, int tp, std::int64_t micro_batch = 2) {
  return {{"train_micro_batch_size_per_gpu", micro_batch},
          {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.02}}}}},
          {"zero_optimization", {{"stage", stage}}},
          {"tensor_parallel", {{"autotp_size", tp}}}};
}

// A world of dp * tp * sp ranks (tp or sp 1): TP or SP groups of consecutive ranks, data-parallel
// replicas across them. TP: each rank's Engine gets its data-parallel split (the ranks of its TP
// rank). SP: the Engine gets the whole world (Note [Ulysses loss scaling]). Each step draws a
// fresh global batch of 2 * dp sequences; replica k trains on sequences [2k, 2k + 2). compile()
// selects autotp / autosp. With `reference` the same training runs on one rank with all 2 * dp.
EngineRun run_engine(const TinyLlamaSpec& spec, int tp, int sp, int stage, int steps, int dp = 1,
                     bool reference = false) {
  const int group = tp * sp, W = reference ? 1 : dp * group;
  const std::int64_t micro = reference ? 2 * dp : 2;
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(W)),
      grads(static_cast<std::size_t>(W));
  sim::SimCluster(W, kSeed).run([&](sim::RankContext& ctx) {
    std::unique_ptr<Comm> g = ctx.world.split(ctx.rank / group, ctx.rank);
    std::unique_ptr<Comm> dp_group = ctx.world.split(ctx.rank % group, ctx.rank);
    TinyLlamaGroups groups;
    if (tp > 1 && !reference) groups.tp = g.get();
    if (sp > 1 && !reference) groups.sp = g.get();
    TinyLlama m(spec, groups);
    init(m, ctx.device, DType::f32);
    Comm& engine_comm = sp > 1 ? ctx.world : *dp_group;
    const int tp_cfg = reference ? 1 : tp;
    Engine e(Config::from_json(engine_config(stage, tp_cfg, micro), engine_comm.size()), m,
             ctx.device, engine_comm);
    if (tp_cfg > 1) e.compile(CompileConfig{true, {"autotp"}});
    if (sp > 1 && !reference) e.compile(CompileConfig{true, {"autosp"}});
    const auto r = static_cast<std::size_t>(ctx.rank);
    for (int s = 0; s < steps; ++s) {
      HostBatch hb = batch_of(spec, 2 * dp, 100 + static_cast<std::uint64_t>(s))
                         .slice((ctx.rank / group) * micro, micro);
      if (sp > 1 && !reference) hb = sequence_shard(hb, ctx.rank % sp, sp);
      const Engine::Loss loss = e.forward(upload_batch(ctx.device, hb, DType::f32));
      e.backward(loss);
      if (s == 0) grads[r] = e.full_grads();
      e.step();
      losses[r].push_back(loss.value);
    }
  });
  EngineRun out;
  const int tp_ranks = reference ? 1 : tp;
  out.grads0 = tp_ranks > 1 ? TinyLlama::gather_tp(spec, {grads.begin(), grads.begin() + tp_ranks})
                            : grads[0];
  for (int s = 0; s < steps; ++s) {
    double l = 0;  // the mean over every rank's local mean (TP ranks of a replica hold the same)
    for (const std::vector<double>& rank_losses : losses)
      l += rank_losses[static_cast<std::size_t>(s)];
    out.losses.push_back(l / W);
  }
  return out;
}

double mean_of_last(const std::vector<double>& v, std::size_t n) {
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

void expect_loss_falls(const EngineRun& run, const std::string& what) {
  const double last = mean_of_last(run.losses, 5);
  EXPECT_LT(last, 0.8 * run.losses.front()) << what;
  std::printf("[ measured ] %s: loss %.4f -> %.4f (mean of the last 5 of %zu steps)\n",
              what.c_str(), run.losses.front(), last, run.losses.size());
}

TEST(TinyLlama, LossFallsTrainingOneRank) {
  const EngineRun run = run_engine(small_spec(2), 1, 1, 1, 30);
  expect_loss_falls(run, "one rank");
}

TEST(TinyLlama, AutoTpEngineMatchesOneRankAndLossFalls) {
  const TinyLlamaSpec spec = small_spec(2);
  for (int stage : {0, 1}) {
    for (int dp : {1, 2}) {
      const EngineRun ref = run_engine(spec, 1, 1, stage, 30, dp, true);
      const EngineRun tp = run_engine(spec, 2, 1, stage, 30, dp);
      const std::string what = fmt::format("autotp 2 x dp {} stage {}", dp, stage);
      EXPECT_LE(std::abs(tp.losses[0] - ref.losses[0]), kF32Bound * ref.losses[0]) << what;
      expect_close(tp.grads0, ref.grads0, kF32Bound, what + " grads");
      expect_loss_falls(tp, what);
    }
  }
}

TEST(TinyLlama, AutoSpEngineMatchesOneRankAndLossFalls) {
  const TinyLlamaSpec spec = small_spec(4);
  for (int stage : {0, 1}) {
    for (int dp : {1, 2}) {
      const EngineRun ref = run_engine(spec, 1, 1, stage, 30, dp, true);
      for (int sp : {2, 4}) {
        const EngineRun run = run_engine(spec, 1, sp, stage, 30, dp);
        const std::string what = fmt::format("autosp {} x dp {} stage {}", sp, dp, stage);
        EXPECT_LE(std::abs(run.losses[0] - ref.losses[0]), kF32Bound * ref.losses[0]) << what;
        expect_close(run.grads0, ref.grads0, kF32Bound, what + " grads");
        expect_loss_falls(run, what);
      }
    }
  }
}

// compile() against the model's layout (Note [Parallel passes]).
TEST(TinyLlama, CompileRefusesAModelBuiltWithoutTheGroupAndLeavesOthersAlone) {
  sim::SimCluster(1, kSeed).run([&](sim::RankContext& ctx) {
    TinyLlama m(small_spec(2));
    init(m, ctx.device, DType::f32);
    Engine tp(Config::from_json(engine_config(1, 2), 1), m, ctx.device, ctx.world);
    try {
      tp.compile(CompileConfig{true, {"autotp"}});
      ADD_FAILURE() << "autotp accepted a model built without a TP group";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("built over a tensor-parallel group of 1 rank(s)"),
                std::string::npos)
          << e.what();
    }
    Engine sp(Config::from_json(engine_config(1, 1), 1), m, ctx.device, ctx.world);
    try {
      sp.compile(CompileConfig{true, {"autosp"}});
      ADD_FAILURE() << "autosp accepted a model built without an SP group";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("sequence-parallel group of 1 rank(s)"),
                std::string::npos)
          << e.what();
    }
    Mlp mlp(MlpSpec{{4, 4}, false, LossKind::linear});
    Rng rng(1);
    mlp.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine plain(Config::from_json(engine_config(1, 2), 1), mlp, ctx.device, ctx.world);
    plain.compile(CompileConfig{true, {"autotp"}});  // nothing to rewrite: left as it is
    EXPECT_TRUE(plain.deepcompile_active());
  });
}

}  // namespace
}  // namespace zc
