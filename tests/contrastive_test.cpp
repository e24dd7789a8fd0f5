// GradCache-style Contrastive training: N chunked backward() calls per step SUM their gradients,
// so chunking changes nothing in the exact domain, and InfoNCE training makes progress.
#include "models/contrastive.h"
#include "props/training_run.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>

namespace zc {
namespace {

struct ContrastiveRun {
  std::vector<std::vector<double>> params;  // [step] rank 0
  std::vector<std::vector<double>> grads;   // [step] rank 0
  std::vector<double> losses;
};

ContrastiveRun train(int world, int stage, int nchunks, LossKind loss, DataDomain domain, int steps,
                     std::int64_t local_batch) {
  ContrastiveRun out;
  // Exact runs use SGD with a power-of-two learning rate, so params stay exactly representable
  // dyadic values from step to step (Adam's sqrt and division would not).
  const nlohmann::json optimizer = domain == DataDomain::exact
                                       ? nlohmann::json{{"type", "SGD"}, {"params", {{"lr", 0.0625}}}}
                                       : nlohmann::json{{"type", "Adam"}, {"params", {{"lr", 0.05}}}};
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", local_batch},
                      {"optimizer", optimizer},
                      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 20}}},
                      {"zero_allow_untested_optimizer", true}};
  sim::SimCluster(world, 4).run([&](sim::RankContext& ctx) {
    const Config cfg = Config::from_json(j, world);
    Contrastive model(6, 4, loss);
    Rng init = Rng(4).split(7);
    ExactSpec ex{1, 0, world};
    model.init_params(ctx.device, DType::f32, domain, ex, init);
    Engine engine(cfg, model, ctx.device, ctx.world);
    for (int s = 0; s < steps; ++s) {
      Rng data = Rng(4).split(100 + static_cast<std::uint64_t>(s));
      const HostBatch global = model.make_batch(data, local_batch * world, domain, ex);
      const double l = gradcache_step(engine, model, ctx.device,
                                      global.slice(ctx.rank * local_batch, local_batch), nchunks, DType::f32);
      const std::vector<double> g = engine.full_grads();
      engine.step();
      if (ctx.rank == 0) {
        out.losses.push_back(l);
        out.grads.push_back(g);
        out.params.push_back(engine.full_params());
      }
    }
  });
  return out;
}

TEST(Contrastive, ChunkedGradCacheEqualsOneFullBackwardBitForBit) {
  for (int stage : {1, 2}) {
    const ContrastiveRun one = train(2, stage, 1, LossKind::linear, DataDomain::exact, 3, 8);
    const ContrastiveRun four = train(2, stage, 4, LossKind::linear, DataDomain::exact, 3, 8);
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(props::first_difference(four.grads[s], one.grads[s], DType::f32), "") << "stage " << stage << " step " << s;
      EXPECT_EQ(props::first_difference(four.params[s], one.params[s], DType::f32), "") << "stage " << stage << " step " << s;
    }
    bool nonzero = false;
    for (double g : one.grads[0]) nonzero |= g != 0.0;
    EXPECT_TRUE(nonzero) << "the test must move gradients";
  }
}

TEST(Contrastive, InfoNceLossFallsWithFourChunks) {
  const ContrastiveRun r = train(2, 2, 4, LossKind::cross_entropy, DataDomain::gaussian, 40, 8);
  const double first = (r.losses[0] + r.losses[1] + r.losses[2]) / 3;
  const double last = (r.losses[37] + r.losses[38] + r.losses[39]) / 3;
  EXPECT_LT(last, 0.9 * first) << first << " -> " << last;
}

}  // namespace
}  // namespace zc
