// ParamDict get semantics (SPEC 7), module copies, serialize + deserialize, tracing, and
// invariant I4 with its known bugs B5 (a copy drops the ParamDict owner) and B6 (the getter
// reads ds_status of a fake param while tracing).
#include "engine/engine.h"
#include "engine/errors.h"
#include "engine/host_device.h"
#include "engine/module_io.h"
#include "engine/tracing.h"
#include "models/contrastive.h"
#include "models/mlp.h"
#include "models/moe.h"
#include "models/registry.h"
#include "models/synthetic.h"
#include "models/tree.h"
#include "props/module_checks.h"
#include "props/training_run.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>

#include <fstream>

namespace zc::props {
namespace {

// ZeRO-3 with every param partitioned and no prefetch, so live bytes show each gather alone.
Config z3_cfg(int world) {
  return Config::from_json({{"optimizer", {{"type", "Adam"}}}, {"train_micro_batch_size_per_gpu", 2},
                            {"zero_optimization",
                             {{"stage", 3},
                              {"stage3_param_persistence_threshold", 0},
                              {"stage3_prefetch_bucket_size", 0}}}},
                           world);
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Module "a"'s forward reads module "b"'s weight, a tied weight DeepSpeed discovers in the
// getter. Each forward records what the read of b.weight did to b.weight and the live bytes.
class TiedPair : public Model {
 public:
  TiedPair() : Model("tied") {
    add_child<Linear>("a", 4, 4);
    add_child<Linear>("b", 4, 4);
    finalize_parameters();
  }
  Linear& a() { return static_cast<Linear&>(*children()[0]); }
  Linear& b() { return static_cast<Linear&>(*children()[1]); }
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override {
    dtype_ = dtype;
    for (Parameter* p : named_parameters()) init_param(dev, *p, dtype, domain, ex, rng, 1.0);
  }
  HostBatch make_batch(Rng&, std::int64_t samples, DataDomain, const ExactSpec&) const override {
    return HostBatch{samples, {}};
  }
  double forward(Device& dev, const Batch&) override {
    run_pre_forward();
    live_start = dev.live_bytes();
    a().run_pre_forward();
    Parameter& raw = *b().params().begin()->second;  // b.weight, without the getter
    status_before = raw.ds_status;
    live_before = dev.live_bytes();
    Parameter* w = b().params().get("weight");
    status_read = w->ds_status;
    data_read = w->data.defined();
    live_read = dev.live_bytes();
    a().run_post_forward();
    status_after = raw.ds_status;
    live_after = dev.live_bytes();
    run_post_forward();
    return 0.0;
  }
  void backward(Device&, double, std::int64_t) override {}
  std::string describe() const override { return "tied pair"; }

  ZeroStatus status_before{}, status_read{}, status_after{};
  bool data_read = false;
  std::int64_t live_start = 0, live_before = 0, live_read = 0, live_after = 0;
};

TEST(ParamDictGet, AMissingNameIsNull) {
  Mlp m(MlpSpec{{3, 2}, false, LossKind::linear});
  EXPECT_EQ(m.layer(0).params().get("nope"), nullptr);
  EXPECT_EQ(m.params().get("weight"), nullptr) << "the root holds no params of its own";
  EXPECT_NE(m.layer(0).params().get("weight"), nullptr);
}

TEST(ParamDictGet, InAZero3EagerForwardAPartitionedParamIsGatheredAndRegisteredExternal) {
  const int world = 3;  // 16 elements pad to 18: the gather holds the padded size
  sim::SimCluster(world, 1).run([&](sim::RankContext& ctx) {
    TiedPair model;
    Rng rng(1);
    model.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(z3_cfg(world), model, ctx.device, ctx.world);
    const Batch batch{2, {}};
    e.forward(batch);
    EXPECT_EQ(model.status_before, ZeroStatus::not_available);
    EXPECT_EQ(model.status_read, ZeroStatus::available) << "the getter all-gathers it";
    EXPECT_TRUE(model.data_read);
    EXPECT_EQ(model.live_read - model.live_before, 18 * 4) << "the padded size, f32";
    EXPECT_EQ(model.status_after, ZeroStatus::not_available) << "released with a's post-forward";
    EXPECT_EQ(model.live_after, model.live_start) << "a's params and the external one are freed";
    // Registered as external on "a" (the innermost module in forward): a's pre-forward now
    // gathers it, so the next read finds it AVAILABLE.
    e.forward(batch);
    EXPECT_EQ(model.status_before, ZeroStatus::available);
    EXPECT_EQ(model.live_read, model.live_before);
    EXPECT_EQ(model.status_after, ZeroStatus::not_available);
    EXPECT_EQ(model.live_after, model.live_start);
  });
}

TEST(ParamDictGet, OutsideAForwardAPartitionedParamIsReturnedAsItIs) {
  sim::SimCluster(2, 1).run([&](sim::RankContext& ctx) {
    TiedPair model;
    Rng rng(1);
    model.init_params(ctx.device, DType::f32, DataDomain::exact, {}, rng);
    Engine e(z3_cfg(2), model, ctx.device, ctx.world);
    const std::int64_t live = ctx.device.live_bytes();
    Parameter* w = model.b().params().get("weight");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->ds_status, ZeroStatus::not_available);
    EXPECT_FALSE(w->data.defined());
    EXPECT_EQ(ctx.device.live_bytes(), live);
  });
}

TEST(ParamDictGet, AFakeParamIsReturnedWithoutReadingItsStatusUnlessB6) {
  Mlp m(MlpSpec{{3, 2}, false, LossKind::linear});
  make_params_fake(m);
  Parameter* w = m.layer(0).params().get("weight");
  ASSERT_NE(w, nullptr);
  EXPECT_FALSE(w->has_zero_status());
  EXPECT_TRUE(w->data.is_meta());
  m.set_params_in_forward(true);
  TracingContext tracing;
  tracing.bugs.set(KnownBug::B6_fake_param_status);
  m.set_tracing(&tracing);
  try {
    m.layer(0).params().get("weight");
    ADD_FAILURE() << "B6 read the status of a fake param";
  } catch (const UsageError& err) {
    EXPECT_TRUE(
        has(err.what(), "'layers.0.weight' of module 'layers.0' has no attribute 'ds_status'"))
        << err.what();
  }
  m.set_tracing(nullptr);
}

TEST(ModuleCopies, CloneKeepsTheSubclassAndRebindsEveryOwner) {
  TreeModel t({2 + 3 * 5, 1 + 3 * 2 + 48, 3 * 4});
  ASSERT_EQ(t.num_nodes(), 4);  // root (2 children) -> n0 (1 child) -> n0.n0; n1 past the code
  const std::unique_ptr<Module> c = t.clone();
  ASSERT_NE(dynamic_cast<TreeModel*>(c.get()), nullptr);
  std::function<void(const Module&, const Module&)> walk = [&](const Module& o, const Module& k) {
    EXPECT_EQ(k.params().owner(), &k) << k.path();
    EXPECT_EQ(o.params().owner(), &o) << o.path();
    ASSERT_EQ(o.children().size(), k.children().size());
    for (std::size_t i = 0; i < o.children().size(); ++i) walk(*o.children()[i], *k.children()[i]);
  };
  walk(t, *c);
}

// A subclass that forgot clone_impl() would be sliced to its base: clone() refuses.
class Forgetful : public Synthetic {
 public:
  Forgetful() : Synthetic(std::vector<Shape>{{2}}) {}
};

TEST(ModuleCopies, ASubclassWithoutCloneImplIsAnError) {
  Forgetful f;
  EXPECT_THROW(f.clone(), InternalError);
}

TEST(ModuleCopies, SerializeDeserializeIsBitExactAndRebuildsTheSubclasses) {
  sim::SimCluster(1, 1).run([&](sim::RankContext& ctx) {
    Mlp m(MlpSpec{{3, 4, 2}, true, LossKind::linear});
    Rng rng(5);
    m.init_params(ctx.device, DType::bf16, DataDomain::gaussian, {}, rng);
    const nlohmann::json j = serialize_module(m, ctx.device);
    const std::unique_ptr<Module> d = deserialize_module(j, model_registry(), ctx.device);
    auto* mlp = dynamic_cast<Mlp*>(d.get());
    ASSERT_NE(mlp, nullptr);
    EXPECT_EQ(mlp->dtype(), DType::bf16);
    EXPECT_EQ(serialize_module(*d, ctx.device), j);
    EXPECT_EQ(mlp->layer(1).params().owner(), &mlp->layer(1));
    EXPECT_EQ(dynamic_cast<Linear*>(d->children()[0].get())->in_features, 3);
    nlohmann::json bad = j;
    bad["kind"] = "transformer";
    EXPECT_THROW(deserialize_module(bad, model_registry(), ctx.device), UsageError);
  });
}

// torch's AccumulateGrad makes a fresh gradient that nothing else holds the param's .grad without
// copying it (Note [The MLP's activations, as autograd keeps them]): the moving form of
// accumulate_grad hands the allocation over and the ledger moves its bytes to grads, the total
// unchanged. A gradient someone else still holds, a view of part of an allocation, another dtype,
// or a param that already has a .grad is copied or added as before.
TEST(ModuleGrads, AFreshWholeGradientBecomesTheGradWithoutACopy) {
  HostDevice dev;
  Synthetic m(std::vector<Shape>{{3}});
  Rng rng(1);
  m.init_params(dev, DType::f32, DataDomain::exact, {}, rng);
  Parameter& p = *m.named_parameters().at(0);
  const MemoryLedger& led = dev.memory();
  const auto live = [&](MemCategory c) { return led.live()[static_cast<std::size_t>(c)]; };
  const std::int64_t total = led.live_total();

  Tensor g = dev.alloc(DType::f32, {3}, "dW", MemCategory::temporaries);
  dev.fill(g, 2.0);
  const Storage* storage = g.storage().get();
  m.accumulate_grad(dev, p, std::move(g));
  ASSERT_TRUE(p.grad.defined());
  EXPECT_EQ(p.grad.storage().get(), storage) << "the gradient was copied";
  EXPECT_EQ(p.grad.storage()->name, p.name + ".grad");
  EXPECT_EQ(live(MemCategory::grads), 12);
  EXPECT_EQ(live(MemCategory::temporaries), 0);
  EXPECT_EQ(led.live_total(), total + 12);
  EXPECT_EQ(to_f64(dev, p.grad), (std::vector<double>{2, 2, 2}));

  Tensor more = dev.alloc(DType::f32, {3}, "dW", MemCategory::temporaries);  // p has a .grad: added
  dev.fill(more, 3.0);
  m.accumulate_grad(dev, p, std::move(more));
  EXPECT_EQ(p.grad.storage().get(), storage);
  EXPECT_EQ(to_f64(dev, p.grad), (std::vector<double>{5, 5, 5}));
  more = Tensor();
  EXPECT_EQ(led.live_total(), total + 12);

  const auto copied = [&](Tensor fresh, const char* why) {
    p.grad = Tensor();
    const Storage* before = fresh.storage().get();
    m.accumulate_grad(dev, p, std::move(fresh));
    ASSERT_TRUE(p.grad.defined()) << why;
    EXPECT_NE(p.grad.storage().get(), before) << why << ": taken, not copied";
    EXPECT_EQ(p.grad.storage()->category, MemCategory::grads) << why;
  };
  Tensor held = dev.alloc(DType::f32, {3}, "dW", MemCategory::temporaries);
  const Tensor other_holder = held;
  copied(std::move(held), "a gradient another tensor still holds");
  Tensor big = dev.alloc(DType::f32, {6}, "dW", MemCategory::temporaries);
  copied(big.narrow(0, 3), "a view of part of an allocation");
  copied(dev.alloc(DType::f64, {3}, "dW", MemCategory::temporaries), "another dtype");
}

// Found by fuzz/module_fuzz.cpp under UBSan: nlohmann's get<int64_t> cast a float argument (1e300
// is undefined behaviour, 2.5 silently became 2); module JSON has integers only, so floats are
// refused before anything is read.
TEST(ModuleCopies, DeserializeRefusesAFloatWhereSerializeWritesIntegers) {
  HostDevice dev;
  const nlohmann::json good = serialize_module(Linear("lin", 2, 3), dev);
  for (const double bad : {2.5, 1e300}) {
    nlohmann::json j = good;
    j["args"]["in"] = bad;
    try {
      deserialize_module(j, model_registry(), dev);
      ADD_FAILURE() << "in = " << bad << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("the root.args.in is"), std::string::npos) << e.what();
    }
  }
  EXPECT_NE(deserialize_module(good, model_registry(), dev), nullptr);
}

// Found by fuzz/module_fuzz.cpp under ASan: a tensor's shape was allocated before its bytes were
// counted, so [444444888800173, 2] asked calloc for 1.8 PB; shapes past 2^60 elements overflowed.
TEST(ModuleCopies, DeserializeChecksTensorBytesBeforeAllocating) {
  HostDevice dev;
  Synthetic m(std::vector<Shape>{{3}});
  Rng rng(1);
  m.init_params(dev, DType::f16, DataDomain::exact, {}, rng);
  nlohmann::json j = serialize_module(m, dev);
  j["params"][0]["data"]["shape"] = {444444888800173, 2};
  try {
    deserialize_module(j, model_registry(), dev);
    ADD_FAILURE() << "a 1.8 PB tensor was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 6 bytes for f16 [444444888800173,2]"),
              std::string::npos) << e.what();
  }
  const std::int64_t big = std::int64_t{1} << 40;
  j["params"][0]["data"] = {{"dtype", "f16"}, {"shape", {big, big}}, {"placement", "meta"}};
  EXPECT_THROW(deserialize_module(j, model_registry(), dev), UsageError);
}

// Found by fuzz/module_fuzz.cpp (10-million campaign, 2.5 million executions): an alias at the
// position of the module's own param reached ParamDict::add_alias's internal assertion.
TEST(ModuleCopies, DeserializeRefusesAnAliasOfTheModulesOwnParam) {
  HostDevice dev;
  std::ifstream in(std::string(ZC_SOURCE_DIR) + "/fuzz/corpus/module/regress-self-alias.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  try {
    deserialize_module(j, model_registry(), dev);
    ADD_FAILURE() << "a module aliasing its own param was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("which is its own param"), std::string::npos) << e.what();
  }
}

// That walk recurses, so it refuses nesting deeper than any module tree's before it goes on.
TEST(ModuleCopies, DeserializeRefusesJsonNestedDeeperThanAnyModuleTree) {
  HostDevice dev;
  nlohmann::json j = serialize_module(Linear("lin", 2, 3), dev);
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 1000; ++i) deep = nlohmann::json::array({deep});
  j["args"]["extra"] = deep;
  try {
    deserialize_module(j, model_registry(), dev);
    ADD_FAILURE() << "1000 levels of nesting were accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("nests deeper than 256 levels"), std::string::npos)
        << e.what();
  }
}

// Every Module subclass in models/ clones to its own kind, and serializes back to the same JSON.
TEST(ModuleCopies, EveryModelKindClonesAndRoundTrips) {
  sim::SimCluster(2, 1).run([&](sim::RankContext& ctx) {
    std::vector<std::unique_ptr<Model>> models;
    models.push_back(std::make_unique<Mlp>(MlpSpec{{3, 4, 2}, true, LossKind::cross_entropy}));
    models.push_back(std::make_unique<Synthetic>(std::vector<Shape>{{3}, {2, 2}}));
    models.push_back(std::make_unique<Contrastive>(3, 2, LossKind::linear));
    models.push_back(std::make_unique<SimpleMoE>(MoeSpec{2, 4}, ctx.world));
    models.push_back(std::make_unique<TreeModel>(std::vector<std::int64_t>{17, 55, 12}));
    const ModuleEnv env{&ctx.world};
    for (auto& m : models) {
      Rng rng(4);
      m->init_params(ctx.device, DType::f16, DataDomain::exact, {}, rng);
      const std::unique_ptr<Module> c = m->clone();
      const Module& original = *m;  // typeid of a named reference: no evaluated operand (clang's -Wpotentially-evaluated-expression)
      const Module& copy = *c;
      EXPECT_EQ(typeid(copy), typeid(original)) << m->kind();
      const nlohmann::json j = serialize_module(*m, ctx.device);
      EXPECT_EQ(serialize_module(*c, ctx.device), j) << m->kind();
      const std::unique_ptr<Module> d = deserialize_module(j, model_registry(), ctx.device, env);
      const Module& loaded = *d;
      EXPECT_EQ(typeid(loaded), typeid(original)) << m->kind();
      EXPECT_EQ(serialize_module(*d, ctx.device), j) << m->kind();
    }
  });
}

TEST(Tracing, RunsForwardOnFakeParamsAndLeavesTheOriginalAlone) {
  Mlp m(MlpSpec{{3, 4, 2}, true, LossKind::linear});
  HostDevice host;
  Rng rng(2);
  m.init_params(host, DType::f32, DataDomain::exact, {}, rng);
  const Tensor before = m.layer(0).weight().data;
  const TracedModel t = trace(m, {.samples = 3});
  EXPECT_GT(t.counters.flops, 0);
  EXPECT_TRUE(dynamic_cast<Mlp&>(*t.model).layer(0).weight().data.is_meta());
  EXPECT_FALSE(m.layer(0).weight().data.is_meta());
  EXPECT_EQ(m.layer(0).weight().data.storage(), before.storage());
  EXPECT_EQ(t.model->tracing(), nullptr) << "the context lives only for the traced forward";
}

// Tree codes with external uses (models/tree.h, Note [Tree external params]): a root with two
// leaves; n0 owns "weight" [7], and n1 owns "weight" [4] and reads n0.weight in its forward,
// discovered by the getter (u = 1) or registered with the engine (u = 2).
std::vector<std::int64_t> external_tree(std::int64_t u) { return {2, 3 * 7, 384 * u + 3 * 4}; }

// Trains `steps` steps of the tree under ZeRO-3 (every param partitioned, no prefetch) on
// `world` ranks and returns rank 0's external reads of each step's forward.
std::vector<std::vector<TreeModel::ExternalRead>> external_reads(std::vector<std::int64_t> code,
                                                                 int world, int steps) {
  RunSpec spec;
  spec.world = world;
  spec.ds_config = {{"optimizer", {{"type", "Adam"}}}, {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 0},
                                           {"stage3_prefetch_bucket_size", 0}}}};
  spec.make_model = [code] { return std::make_unique<TreeModel>(code); };
  spec.steps = steps;
  spec.collect_grads = false;
  spec.exact.grad_multiple = world;
  spec.after_init = [](int, Engine& e) {
    for (auto [m, p] : dynamic_cast<TreeModel&>(e.model()).registered_external_uses()) {
      e.register_external_parameter(*m, *p);
    }
  };
  std::vector<std::vector<TreeModel::ExternalRead>> out;
  spec.after_step = [&](int rank, int, Engine& e, double) {
    if (rank == 0) out.push_back(dynamic_cast<TreeModel&>(e.model()).external_reads());
  };
  run_on_sim(spec);
  return out;
}

TEST(TreeExternal, TheCodeDecodesUsesOfEarlierNonAncestorParams) {
  const TreeModel t(external_tree(1));
  ASSERT_EQ(t.external_uses().size(), 1u);
  EXPECT_EQ(t.external_uses()[0].user, "n1");
  EXPECT_EQ(t.external_uses()[0].owner, "n0");
  EXPECT_EQ(t.external_uses()[0].local, "weight");
  EXPECT_FALSE(t.external_uses()[0].registered);
  EXPECT_TRUE(TreeModel(external_tree(2)).external_uses()[0].registered);
  // A child never uses its ancestor's params, and the first node with params has nothing to use.
  EXPECT_TRUE(TreeModel({1 + 3 * 2 + 384, 384 * 3 + 3 * 4}).external_uses().empty());
}

TEST(TreeExternal, AZero3EagerForwardRegistersTheParamOnTheUserAndGathersIt) {
  const auto reads = external_reads(external_tree(1), 3, 2);  // 7 elements pad to 9 on 3 ranks
  ASSERT_EQ(reads.size(), 2u);
  ASSERT_EQ(reads[0].size(), 1u);
  const TreeModel::ExternalRead& first = reads[0][0];
  EXPECT_EQ(first.param, "n0.weight");
  EXPECT_EQ(first.user, "n1");
  EXPECT_EQ(first.status_before, ZeroStatus::not_available);
  EXPECT_EQ(first.status_read, ZeroStatus::available) << "the getter all-gathers it";
  EXPECT_EQ(first.live_read - first.live_before, 9 * 4) << "the padded size, f32";
  // n1's post-forward releases it, and n1's own weight [4] (6 padded, gathered before the read).
  EXPECT_EQ(first.live_after - first.live_before, -6 * 4);
  // Registered on n1 by the first forward: n1's pre-forward gathers it from then on.
  ASSERT_EQ(reads[1].size(), 1u);
  EXPECT_EQ(reads[1][0].status_before, ZeroStatus::available);
  EXPECT_EQ(reads[1][0].live_read, reads[1][0].live_before);
}

TEST(TreeExternal, ARegisteredUseIsGatheredByTheUsersHooksFromTheFirstForward) {
  const auto reads = external_reads(external_tree(2), 3, 1);
  ASSERT_EQ(reads.size(), 1u);
  ASSERT_EQ(reads[0].size(), 1u);
  EXPECT_EQ(reads[0][0].status_before, ZeroStatus::available);
  EXPECT_EQ(reads[0][0].live_read, reads[0][0].live_before);
}

TEST(TreeExternal, CopiesReferToTheirOwnParamsAndASubtreeCopyDropsOutsideOnes) {
  TreeModel t({2, 3 * 7, 3 * 4 + 2 + 384 * 2});  // n1 uses n0.weight and has two children
  Module& n0 = *t.children()[0];
  Module& n1 = *t.children()[1];
  Module& leaf = *n1.children()[1];
  leaf.add_external_param(*n1.params().get("weight"));  // inside n1's subtree
  n1.add_external_param(*n0.params().get("weight"));    // outside it
  const std::vector<Parameter*> before = n1.external_params();
  auto check = [&](const Module& copy, const std::string& what) {
    const Module& c1 = *copy.children()[1];
    ASSERT_EQ(c1.external_params().size(), 1u) << what;
    EXPECT_EQ(c1.external_params()[0], copy.children()[0]->params().begin()->second.get()) << what;
    ASSERT_EQ(c1.children()[1]->external_params().size(), 1u) << what;
    EXPECT_EQ(c1.children()[1]->external_params()[0], c1.params().begin()->second.get()) << what;
  };
  check(*t.clone(), "clone");
  check(TreeModel(t), "copy construction");
  HostDevice dev;
  Rng rng(1);
  t.init_params(dev, DType::f32, DataDomain::exact, {}, rng);
  check(*deserialize_module(serialize_module(t, dev), model_registry(), dev), "round trip");
  const std::unique_ptr<Module> sub = n1.clone();
  EXPECT_TRUE(sub->external_params().empty()) << "n0.weight is outside the copied subtree";
  ASSERT_EQ(sub->children()[1]->external_params().size(), 1u);
  EXPECT_EQ(sub->children()[1]->external_params()[0], sub->params().begin()->second.get());
  EXPECT_EQ(n1.external_params(), before) << "the original is unchanged";
}

TEST(I4, HoldsForTreesWithExternalParamsAtEveryStage) {
  for (std::int64_t u : {1, 2}) {
    for (int stage = 0; stage <= 3; ++stage) {
      const I4Case c{3, stage, "tree", external_tree(u), 5, {}};
      EXPECT_EQ(i4_violation(c), "") << describe(c);
    }
  }
}

TEST(I4, KnownBugsB5AndB6StillBreakItWithExternalParams) {
  const I4Case b5{2, 3, "tree", external_tree(1), 3, {KnownBug::B5_copy_drops_owner}};
  EXPECT_TRUE(has(i4_violation(b5), "ParamDict owner is null")) << i4_violation(b5);
  const I4Case b6{2, 3, "tree", external_tree(2), 3, {KnownBug::B6_fake_param_status}};
  EXPECT_TRUE(has(i4_violation(b6), "trace: failed")) << i4_violation(b6);
}

// Tree codes with an alias (Note [Tree aliases]): n0 owns "weight" [7]; a node with a = 1 aliases
// the latest earlier param as "tied". In ancestor_alias_tree the user is n0's child n0.n0
// (weight [4]), so n0 still uses its weight when n0.n0's post-forward releases the alias; in
// sibling_alias_tree it is n1, after n0's forward. a = 0 gives the same trees without the alias.
std::vector<std::int64_t> ancestor_alias_tree(std::int64_t a = 1) { return {1, 22, 3072 * a + 12}; }
std::vector<std::int64_t> sibling_alias_tree(std::int64_t a = 1) { return {2, 21, 3072 * a + 12}; }

struct AliasRun {
  RunResult result;
  std::vector<std::vector<TreeModel::ExternalRead>> reads;  // [step] rank 0's alias reads
  std::vector<std::int64_t> live_after_step;                // [step] rank 0's live bytes
  bool all_released = true;  // every param NOT_AVAILABLE after every step, on every rank
};

AliasRun train_alias_tree(std::vector<std::int64_t> code, int world, int stage = 3) {
  RunSpec spec;
  spec.world = world;
  spec.ds_config = {{"optimizer", {{"type", "Adam"}}}, {"zero_optimization", {{"stage", stage},
                                           {"stage3_param_persistence_threshold", 0},
                                           {"stage3_prefetch_bucket_size", 0}}}};
  spec.make_model = [code] { return std::make_unique<TreeModel>(code); };
  spec.steps = 2;
  spec.exact.grad_multiple = world;
  AliasRun out;
  spec.after_step = [&](int rank, int, Engine& e, double) {
    for (Parameter* p : e.model().named_parameters()) {
      if (stage == 3 && p->ds_status != ZeroStatus::not_available) out.all_released = false;
    }
    if (rank != 0) return;
    out.reads.push_back(dynamic_cast<TreeModel&>(e.model()).alias_reads());
    out.live_after_step.push_back(e.device().live_bytes());
  };
  out.result = run_on_sim(spec);
  return out;
}

TEST(TreeAliases, TheCodeDecodesAnAliasOfAnEarlierParamThatNamedParametersListsOnce) {
  TreeModel t(ancestor_alias_tree());
  EXPECT_EQ(t.num_aliases(), 1);
  Module& n0 = *t.children()[0];
  Module& user = *n0.children()[0];
  ASSERT_EQ(user.params().aliases().size(), 1u);
  EXPECT_EQ(user.params().aliases()[0].owner, &n0);
  EXPECT_EQ(user.params().get("tied"), n0.params().get("weight"));
  EXPECT_EQ(user.params().size(), 1u) << "iteration sees the owned weight only";
  ASSERT_EQ(t.named_parameters().size(), 2u);
  EXPECT_EQ(t.named_parameters()[0]->name, "n0.weight");
  EXPECT_THROW(user.params().add("tied", {1}, DType::f32), UsageError);
  EXPECT_EQ(TreeModel(ancestor_alias_tree(0)).num_aliases(), 0);
}

TEST(TreeAliases, Zero3KeepsATiedParamGatheredWhileEitherUserIsActive) {
  for (int world : {2, 3}) {
    const AliasRun run = train_alias_tree(ancestor_alias_tree(), world);
    ASSERT_EQ(run.reads.size(), 2u);
    for (std::size_t step = 0; step < run.reads.size(); ++step) {
      const auto& reads = run.reads[step];
      ASSERT_EQ(reads.size(), 1u);
      EXPECT_EQ(reads[0].param, "n0.weight");
      EXPECT_EQ(reads[0].user, "n0.n0");
      EXPECT_EQ(reads[0].status_before, ZeroStatus::available) << "gathered by both users";
      EXPECT_EQ(reads[0].live_read, reads[0].live_before);
      // In the recording forward n0.n0's post-forward frees only its own weight [4] (padded to
      // the world); n0.weight stays for n0, which checks it after its children (TreeModel throws
      // otherwise). Once the trace is complete, stage3_max_reuse_distance (1e9 elements by
      // default) keeps the weight for its use in the backward: nothing is freed.
      const std::int64_t padded = (4 + world - 1) / world * world;
      EXPECT_EQ(reads[0].live_after - reads[0].live_before, step == 0 ? -padded * 4 : 0)
          << "world " << world << " step " << step;
    }
    EXPECT_TRUE(run.all_released);
    // Live bytes return to those of the same tree without the alias: shards only.
    const AliasRun plain = train_alias_tree(ancestor_alias_tree(0), world);
    EXPECT_EQ(run.live_after_step, plain.live_after_step) << "world " << world;
  }
}

TEST(TreeAliases, Zero3GradsEqualTheOracleAndASingleRankRunBitForBit) {
  for (const auto& code : {ancestor_alias_tree(), sibling_alias_tree()}) {
    for (int world : {2, 3}) {
      RunSpec spec;
      spec.world = world;
      spec.ds_config = {{"optimizer", {{"type", "Adam"}}}, {"zero_optimization", {{"stage", 3},
                                               {"stage3_param_persistence_threshold", 0}}}};
      spec.make_model = [code] { return std::make_unique<TreeModel>(code); };
      spec.steps = 2;
      spec.exact.grad_multiple = world;
      const RunResult got = run_on_sim(spec);
      const RunResult ref = run_on_sim(single_rank_reference(spec));
      ASSERT_TRUE(got.ranks_agree) << got.disagreement;
      for (std::size_t s = 0; s < got.grads.size(); ++s) {
        const int step = static_cast<int>(s);
        const auto oracle = prescribed_grad_oracle(spec, 1, got.loss_scales[s], step).value;
        EXPECT_EQ(first_difference(got.grads[s], oracle, DType::f32), "") << "step " << s;
        EXPECT_EQ(first_difference(got.grads[s], ref.grads[s], DType::f32), "") << "step " << s;
        EXPECT_EQ(first_difference(got.params[s], ref.params[s], DType::f32), "") << "step " << s;
      }
    }
  }
}

TEST(TreeAliases, CopiesRemapTheAliasAndASubtreeCopyWithoutTheOwnerOwnsIt) {
  TreeModel t(ancestor_alias_tree());
  Module& n0 = *t.children()[0];
  Module& user = *n0.children()[0];
  Parameter* const original = n0.params().get("weight");
  auto check = [&](const Module& copy, const std::string& what) {
    const Module& c0 = *copy.children()[0];
    const Module& cu = *c0.children()[0];
    ASSERT_EQ(cu.params().aliases().size(), 1u) << what;
    EXPECT_EQ(cu.params().aliases()[0].param, c0.params().begin()->second.get()) << what;
    EXPECT_NE(cu.params().aliases()[0].param, original) << what;
    EXPECT_EQ(cu.params().aliases()[0].owner, &c0) << what;
  };
  check(*t.clone(), "clone");
  check(TreeModel(t), "copy construction");
  HostDevice dev;
  Rng rng(1);
  t.init_params(dev, DType::f32, DataDomain::exact, {}, rng);
  check(*deserialize_module(serialize_module(t, dev), model_registry(), dev), "round trip");
  // n0's subtree holds the owner: the alias is remapped inside it.
  const std::unique_ptr<Module> sub0 = n0.clone();
  ASSERT_EQ(sub0->children()[0]->params().aliases().size(), 1u);
  EXPECT_EQ(sub0->children()[0]->params().aliases()[0].owner, sub0.get());
  // The user's subtree lacks the owner: the copy owns a copy of the tied param.
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> subs;
  subs.emplace_back("clone", user.clone());
  subs.emplace_back("round trip",
                    deserialize_module(serialize_module(user, dev), model_registry(), dev));
  for (const auto& [what, sub] : subs) {
    EXPECT_TRUE(sub->params().aliases().empty()) << what;
    ASSERT_EQ(sub->params().size(), 2u) << what;
    const Parameter* tied = sub->params().get("tied");
    ASSERT_NE(tied, nullptr) << what;
    EXPECT_NE(tied, original) << what;
    EXPECT_EQ(tied->shape, original->shape) << what;
    EXPECT_EQ(to_bytes(dev, tied->data), to_bytes(dev, original->data)) << what;
  }
  ASSERT_EQ(user.params().aliases().size(), 1u) << "the original is unchanged";
  EXPECT_EQ(user.params().aliases()[0].param, original);
  EXPECT_EQ(user.params().aliases()[0].owner, &n0);
}

TEST(I4, HoldsForTreesWithAliasesAtEveryStage) {
  for (const auto& code : {ancestor_alias_tree(), sibling_alias_tree()}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int world : {2, 3}) {
        const I4Case c{world, stage, "tree", code, 5, {}};
        EXPECT_EQ(i4_violation(c), "") << describe(c);
      }
    }
  }
}

TEST(I4, KnownBugsB5AndB6StillBreakItWithAliases) {
  const I4Case b5{2, 3, "tree", ancestor_alias_tree(), 3, {KnownBug::B5_copy_drops_owner}};
  EXPECT_TRUE(has(i4_violation(b5), "ParamDict owner is null")) << i4_violation(b5);
  const I4Case b6{3, 3, "tree", sibling_alias_tree(), 3, {KnownBug::B6_fake_param_status}};
  EXPECT_TRUE(has(i4_violation(b6), "trace: failed")) << i4_violation(b6);
}

TEST(I4, HoldsForEveryModelKindAtEveryStage) {
  for (const char* kind : {"mlp", "synthetic", "tree"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      const I4Case c{2, stage, kind, {7, 5, 3 + 48, 2}, 11, {}};
      EXPECT_EQ(i4_violation(c), "") << describe(c);
    }
  }
}

TEST(I4, KnownBugB5LosesTheOwnerOfAZero3Copy) {
  const I4Case c{2, 3, "tree", {2 + 3 * 5, 3 * 4}, 3, {KnownBug::B5_copy_drops_owner}};
  const std::string v = i4_violation(c);
  EXPECT_TRUE(has(v, "clone: module '<root>' param 'weight': ParamDict owner is null")) << v;
  // Only ZeRO-3 trees hold ZeROOrderedDicts, whose reduce the bug was in.
  EXPECT_EQ(i4_violation(I4Case{2, 1, "tree", c.shape, 3, c.bugs}), "");
}

TEST(I4, KnownBugB6FailsTracingAZero3Model) {
  const I4Case c{2, 3, "mlp", {3, 2}, 3, {KnownBug::B6_fake_param_status}};
  const std::string v = i4_violation(c);
  EXPECT_TRUE(has(v, "trace: failed")) << v;
  EXPECT_TRUE(has(v, "param 'layers.0.weight' of module 'layers.0' has no attribute 'ds_status'"))
      << v;
  EXPECT_EQ(i4_violation(I4Case{2, 2, "mlp", {3, 2}, 3, c.bugs}), "") << "stage 2 has no getter";
}

TEST(I4, AMalformedCaseIsAUsageError) {
  EXPECT_THROW(i4_violation(I4Case{0, 3, "tree", {}, 1, {}}), UsageError);
  EXPECT_THROW(i4_violation(I4Case{1, 4, "tree", {}, 1, {}}), UsageError);
  EXPECT_THROW(i4_violation(I4Case{1, 3, "resnet", {}, 1, {}}), UsageError);
}

}  // namespace
}  // namespace zc::props
