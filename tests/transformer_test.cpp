// The transformer family (models/transformer.h): the presets have the published parameter counts;
// the explicit backward is the gradient of the loss (central differences in f64); fused and
// materialised attention give the same bits with less memory; and meta mode allocates exactly
// what a host run allocates, per category, at every ZeRO stage.
#include "engine/host_device.h"
#include "models/transformer.h"
#include "props/memory_checks.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace zc {
namespace {

std::int64_t counted(const TransformerSpec& s) {
  Transformer t(s);
  std::int64_t n = 0;
  for (Parameter* p : t.named_parameters()) n += p->numel();
  return n;
}

TEST(TransformerPresets, ParameterCountsEqualThePublishedOnes) {
  const std::vector<std::pair<std::string, std::int64_t>> published = {
      {"gpt2-xl", 1'557'611'200},
      {"llama-2-7b", 6'738'415'616},
      {"llama-2-13b", 13'015'864'320},
      {"llama-2-70b", 68'976'648'192}};
  for (const auto& [name, count] : published) {
    const TransformerSpec s = transformer_preset(name);
    EXPECT_EQ(s.param_count(), count) << name;
    EXPECT_EQ(counted(s), count) << name << ": the module tree's params";
  }
}

TEST(TransformerPresets, UnknownPresetAndBadShapesAreConfigErrors) {
  try {
    transformer_preset("llama-3-8b");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("llama-2-7b"), std::string::npos) << e.what();
  }
  EXPECT_THROW(transformer_spec_from_json(nlohmann::json::parse(
                   R"({"vocab":8,"dim":6,"layers":1,"heads":4,"ffn":8,"seq":4})")),
               ConfigError);  // 4 heads do not divide dim 6
  EXPECT_THROW(transformer_spec_from_json(nlohmann::json::parse(
                   R"({"vocab":8,"dim":8,"layers":1,"heads":2,"ffn":8,"seq":4,"colour":1})")),
               ConfigError);  // unknown key
  const TransformerSpec s = transformer_spec_from_json(nlohmann::json::parse(
      R"({"vocab":8,"dim":8,"layers":1,"heads":2,"kv_heads":1,"ffn":8,"seq":4})"));
  EXPECT_EQ(s.param_count(), counted(s));
}

struct Probe {
  double loss = 0;
  std::vector<std::vector<double>> grads;  // per param
};

Probe run_f64(const TransformerSpec& spec, HostDevice& dev, Transformer& t, const HostBatch& hb,
              bool backward) {
  for (Parameter* p : t.named_parameters()) p->grad = Tensor();
  const Batch b = upload_batch(dev, hb, DType::f64);
  Probe out;
  out.loss = t.forward(dev, b);
  if (!backward) return out;
  t.backward(dev, 1.0, 1);
  for (Parameter* p : t.named_parameters()) out.grads.push_back(to_f64(dev, p->grad));
  (void)spec;
  return out;
}

// Central differences against the explicit backward, a few elements of every parameter.
void expect_gradient(const TransformerSpec& spec) {
  HostDevice dev;
  Transformer t(spec);
  Rng rng(11);
  t.init_params(dev, DType::f64, DataDomain::gaussian, ExactSpec{}, rng);
  Rng data(5);
  const HostBatch hb = t.make_batch(data, 2, DataDomain::gaussian, ExactSpec{});
  const Probe analytic = run_f64(spec, dev, t, hb, true);
  const std::vector<Parameter*> params = t.named_parameters();
  const double h = 1e-6;
  for (std::size_t i = 0; i < params.size(); ++i) {
    Parameter& p = *params[i];
    std::vector<double> v = to_f64(dev, p.data);
    for (std::int64_t e : {std::int64_t{0}, p.numel() / 2, p.numel() - 1}) {
      const double keep = v[static_cast<std::size_t>(e)];
      v[static_cast<std::size_t>(e)] = keep + h;
      write_f64(dev, p.data, v);
      const double up = run_f64(spec, dev, t, hb, false).loss;
      v[static_cast<std::size_t>(e)] = keep - h;
      write_f64(dev, p.data, v);
      const double down = run_f64(spec, dev, t, hb, false).loss;
      v[static_cast<std::size_t>(e)] = keep;
      write_f64(dev, p.data, v);
      const double numeric = (up - down) / (2 * h);
      const double got = analytic.grads[i][static_cast<std::size_t>(e)];
      EXPECT_NEAR(got, numeric, 1e-6 * std::max(1.0, std::fabs(numeric)))
          << spec.preset << " " << p.name << "[" << e << "]";
    }
  }
}

TEST(TransformerBackward, IsTheGradientOfTheLossForEveryLayerKind) {
  expect_gradient(transformer_preset("gpt2-tiny"));       // LayerNorm, GELU, learned, tied, biases
  expect_gradient(transformer_preset("llama-tiny"));      // RMSNorm, SwiGLU, rotary
  expect_gradient(transformer_preset("llama-gqa-tiny"));  // grouped-query attention
}

TEST(TransformerBackward, FusedAttentionGivesTheSameBitsWithLessMemory) {
  for (const char* name : {"gpt2-tiny", "llama-gqa-tiny"}) {
    TransformerSpec mat = transformer_preset(name), fused = mat;
    fused.attention = AttentionMemory::fused;
    std::vector<Probe> probes;
    std::vector<std::int64_t> peaks;
    for (const TransformerSpec& s : {mat, fused}) {
      HostDevice dev;
      Transformer t(s);
      Rng rng(3);
      t.init_params(dev, DType::f32, DataDomain::gaussian, ExactSpec{}, rng);
      Rng data(4);
      const HostBatch hb = t.make_batch(data, 2, DataDomain::gaussian, ExactSpec{});
      dev.reset_peak();
      const Batch b = upload_batch(dev, hb, DType::f32);
      Probe p;
      p.loss = t.forward(dev, b);
      t.backward(dev, 1.0, 1);
      for (Parameter* q : t.named_parameters()) p.grads.push_back(to_f64(dev, q->grad));
      probes.push_back(p);
      peaks.push_back(dev.memory().peak()[static_cast<std::size_t>(MemCategory::activations)]);
    }
    EXPECT_EQ(probes[0].loss, probes[1].loss) << name;
    EXPECT_EQ(probes[0].grads, probes[1].grads) << name;
    EXPECT_LT(peaks[1], peaks[0]) << name << ": fused attention keeps no probabilities";
  }
}

props::RunSpec transformer_run(const std::string& preset, int stage, int world, bool offload,
                               const std::string& dtype) {
  props::RunSpec spec;
  spec.world = world;
  spec.steps = 2;
  spec.micro_batch = 2;
  spec.domain = DataDomain::gaussian;
  nlohmann::json cfg = {{"gradient_accumulation_steps", 1},
                        {"zero_optimization",
                         {{"stage", stage}, {"reduce_bucket_size", 500},
                          {"stage3_param_persistence_threshold", 20}}},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  if (dtype == "bf16") cfg["bf16"] = {{"enabled", true}};
  if (offload) cfg["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  spec.ds_config = cfg;
  spec.make_model = [preset] { return std::make_unique<Transformer>(transformer_preset(preset)); };
  return spec;
}

TEST(TransformerMeta, MetaModeAllocatesWhatTheHostAllocatesAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* preset : {"gpt2-tiny", "llama-gqa-tiny"}) {
      for (bool offload : {false, true}) {
        if (offload && stage == 0) continue;
        const props::MemoryComparison c =
            props::compare_meta_with_host(transformer_run(preset, stage, 2, offload, "bf16"));
        ASSERT_TRUE(c.applies) << c.why_not;
        EXPECT_EQ(c.difference, "") << preset << " stage " << stage << " offload " << offload;
        EXPECT_GT(c.peak_bytes, 0);
      }
    }
  }
}

}  // namespace
}  // namespace zc
