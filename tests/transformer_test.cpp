// The transformer family (models/transformer.h): the presets have the published parameter counts;
// the explicit backward is the gradient of the loss (central differences in f64); fused and
// materialised attention give the same bits with less memory; and meta mode allocates exactly
// what a host run allocates, per category, at every ZeRO stage.
#include "engine/host_device.h"
#include "models/transformer.h"
#include "props/memory_checks.h"
#include "tests/transformer_spec.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>
#include <map>

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
      {"llama-2-70b", 68'976'648'192},
      {"mixtral-8x7b", 46'702'792'704}};  // Hugging Face's MixtralForCausalLM count
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

nlohmann::json hf_example(const std::string& name) {
  std::ifstream in(std::string(ZC_SOURCE_DIR) + "/examples/plan/hf/" + name + ".json");
  return nlohmann::json::parse(in);
}

// A Hugging Face config.json builds the model its modeling code builds: the published parameter
// counts, and the shapes of the presets made from the same papers.
TEST(TransformerHfConfig, LlamaGpt2AndMixtralConfigsAreTheirModels) {
  std::vector<std::string> notes;
  const TransformerSpec llama = transformer_spec_from_hf_config(hf_example("llama-2-7b"), notes);
  EXPECT_EQ(llama.param_count(), 6'738'415'616);
  EXPECT_EQ(llama.param_count(), transformer_preset("llama-2-7b").param_count());
  EXPECT_EQ(llama.seq, 4096);
  EXPECT_EQ(llama.eps, 1e-5);
  const TransformerSpec gpt2 = transformer_spec_from_hf_config(hf_example("gpt2"), notes);
  EXPECT_EQ(gpt2.param_count(), 124'439'808);  // GPT-2 small, tied embeddings counted once
  EXPECT_EQ(gpt2.ffn, 4 * 768);                // n_inner absent: 4 n_embd
  EXPECT_TRUE(gpt2.tied_embeddings && gpt2.bias && gpt2.pos == PositionKind::learned);
  const TransformerSpec mixtral = transformer_spec_from_hf_config(hf_example("mixtral-8x7b"), notes);
  EXPECT_EQ(mixtral.param_count(), transformer_preset("mixtral-8x7b").param_count());
  EXPECT_EQ(mixtral.rope_base, 1e6);
  bool dropout_said = false, dropless_said = false;
  for (const std::string& n : notes) {
    dropout_said = dropout_said || n.find("attn_pdrop 0.1") != std::string::npos;
    dropless_said = dropless_said || n.find("dropless") != std::string::npos;
  }
  EXPECT_TRUE(dropout_said && dropless_said) << fmt::format("{}", fmt::join(notes, "\n"));
  // transformer_spec_from_json reads either format.
  EXPECT_EQ(transformer_spec_from_json(hf_example("llama-2-7b")).param_count(), llama.param_count());
}

TEST(TransformerHfConfig, WhatIsNotModelledIsRefusedByName) {
  auto refused = [](nlohmann::json j, const std::string& key) {
    std::vector<std::string> notes;
    try {
      transformer_spec_from_hf_config(j, notes);
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  nlohmann::json bert = hf_example("llama-2-7b");
  bert["model_type"] = "bert";
  refused(bert, "model_type 'bert'");
  nlohmann::json gelu = hf_example("llama-2-7b");
  gelu["hidden_act"] = "gelu";
  refused(gelu, "hidden_act");
  nlohmann::json bias = hf_example("llama-2-7b");
  bias["attention_bias"] = true;
  refused(bias, "attention_bias");
  nlohmann::json missing = hf_example("llama-2-7b");
  missing.erase("hidden_size");
  refused(missing, "hidden_size");
  nlohmann::json wrong_type = hf_example("llama-2-7b");
  wrong_type["num_hidden_layers"] = "thirty-two";
  refused(wrong_type, "num_hidden_layers");
  nlohmann::json top1 = hf_example("mixtral-8x7b");
  top1["num_experts_per_tok"] = 1;
  refused(top1, "top_k 1");
  nlohmann::json relu = hf_example("gpt2");
  relu["activation_function"] = "relu";
  refused(relu, "activation_function");
  nlohmann::json upcast = hf_example("gpt2");
  upcast["reorder_and_upcast_attn"] = true;
  refused(upcast, "reorder_and_upcast_attn");
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

TEST(TransformerBackward, IsTheGradientThroughTheMoeRouterAndExperts) {
  TransformerSpec moe = transformer_preset("mixtral-tiny");  // 16 tokens, 4 experts, top-2
  ASSERT_EQ(moe.capacity(16), 8);
  expect_gradient(moe);  // capacity 8 of 32 slots for 32 choices: some choices drop
  moe.capacity_factor = 0.5;  // capacity 4: half the choices drop
  expect_gradient(moe);
  moe.capacity_factor = 4.0;  // nothing drops
  expect_gradient(moe);
}

TEST(TransformerMoe, CapacityDropsAreDeepSpeedsOrderAndReachTheOutput) {
  // Token 0 prefers experts 0 then 1, token 1 experts 1 then 0. With one slot per expert,
  // DeepSpeed places every first choice (token 0's, then token 1's) before any second choice: both
  // first choices are kept, both second choices drop, and each token's kept weight is exactly 1.
  // (Token by token, token 0 would take both slots and token 1 keep nothing.)
  HostDevice dev;
  const Tensor logits = tensor_from_f64(dev, DType::f32, {2, 3}, std::vector<double>{2, 1, 0, 1, 2, 0});
  const Tensor w = dev.alloc(DType::f32, {2, 2}), p = dev.alloc(DType::f32, {2, 3});
  const Tensor idx = dev.alloc(DType::f32, {2, 2});
  const MoeRoute r = dev.moe_gate(w, idx, p, logits, 1);
  EXPECT_EQ(r.expert, (std::vector<std::int64_t>{0, -1, 1, -1}));
  EXPECT_EQ(r.slot, (std::vector<std::int64_t>{0, -1, 0, -1}));
  EXPECT_EQ(to_f64(dev, idx), (std::vector<double>{0, -1, 1, -1}));
  EXPECT_EQ(to_f64(dev, w), (std::vector<double>{1, 0, 1, 0}));
  // Two slots: nothing drops, and the weights are the two probabilities renormalised.
  const MoeRoute r2 = dev.moe_gate(w, idx, p, logits, 2);
  EXPECT_EQ(r2.expert, (std::vector<std::int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(r2.slot, (std::vector<std::int64_t>{0, 1, 0, 1}));  // second choices after the first
  const std::vector<double> wv = to_f64(dev, w), pv = to_f64(dev, p);
  const auto f = [](double x) { return static_cast<float>(x); };
  EXPECT_EQ(wv[0], static_cast<double>(f(pv[0]) / (f(pv[0]) + f(pv[1]))));
  EXPECT_EQ(wv[2], static_cast<double>(f(pv[4]) / (f(pv[4]) + f(pv[3]))));
  TransformerSpec s = transformer_preset("mixtral-tiny");
  s.top_k = 1;
  EXPECT_NE(s.invalid().find("top-2"), std::string::npos) << s.invalid();
  s = transformer_preset("mixtral-tiny");
  s.capacity_factor = 0;
  EXPECT_NE(s.invalid().find("drop_tokens=False"), std::string::npos) << s.invalid();
}

// One forward and backward on the host in f32 (params seed 3, data seed 4, micro-batch 2), with a
// host device for what the model keeps there (cpu_checkpointing): the loss and grads, and what
// the run allocated.
struct HostRun {
  Probe probe;
  std::int64_t activations_peak = 0;            // since before the batch's upload
  std::int64_t activations_after_forward = 0;   // live, less what was live before the forward
  std::int64_t activations_after_backward = 0;  // the same, after the backward
  std::int64_t host_after_forward = 0, host_after_backward = 0;  // live on the host device
  std::int64_t flops = 0;                       // forward and backward
};

HostRun run_on_host(const TransformerSpec& s) {
  HostDevice dev, host;
  Transformer t(s);
  t.set_host_device(&host);
  Rng rng(3);
  t.init_params(dev, DType::f32, DataDomain::gaussian, ExactSpec{}, rng);
  Rng data(4);
  const HostBatch hb = t.make_batch(data, 2, DataDomain::gaussian, ExactSpec{});
  dev.reset_peak();
  const Batch b = upload_batch(dev, hb, DType::f32);
  const auto activations = [&] { return dev.memory().live()[static_cast<std::size_t>(MemCategory::activations)]; };
  const std::int64_t before = activations(), flops_before = dev.counters().flops;
  HostRun r;
  r.probe.loss = t.forward(dev, b);
  r.activations_after_forward = activations() - before;
  r.host_after_forward = host.memory().live_total();
  t.backward(dev, 1.0, 1);
  r.activations_after_backward = activations() - before;
  r.host_after_backward = host.memory().live_total();
  r.flops = dev.counters().flops - flops_before;
  for (Parameter* q : t.named_parameters()) r.probe.grads.push_back(to_f64(dev, q->grad));
  r.activations_peak = dev.memory().peak()[static_cast<std::size_t>(MemCategory::activations)];
  return r;
}

TEST(TransformerBackward, FusedAttentionGivesTheSameBitsWithLessMemory) {
  for (const char* name : {"gpt2-tiny", "llama-gqa-tiny"}) {
    TransformerSpec mat = transformer_preset(name), fused = mat;
    fused.attention = AttentionMemory::fused;
    const HostRun m = run_on_host(mat), f = run_on_host(fused);
    EXPECT_EQ(m.probe.loss, f.probe.loss) << name;
    EXPECT_EQ(m.probe.grads, f.probe.grads) << name;
    EXPECT_LT(f.activations_peak, m.activations_peak) << name << ": fused attention keeps no probabilities";
  }
}

// Note [Gradient checkpointing]: recomputing each layer in the backward gives the gradients bit
// for bit, keeps less, and runs each layer's forward twice.
TEST(TransformerBackward, GradientCheckpointingGivesTheSameBitsWithLessMemory) {
  for (const char* name : {"gpt2-tiny", "llama-gqa-tiny", "mixtral-tiny"}) {
    TransformerSpec plain = transformer_preset(name), ckpt = plain;
    plain.layers = ckpt.layers = 4;
    ckpt.gradient_checkpointing = true;
    const HostRun p = run_on_host(plain), c = run_on_host(ckpt);
    EXPECT_EQ(p.probe.loss, c.probe.loss) << name;
    EXPECT_EQ(p.probe.grads, c.probe.grads) << name;
    EXPECT_LT(c.activations_peak, p.activations_peak) << name;
    // After the forward a checkpointed model keeps 4 layer inputs [N, d] and what the final norm,
    // the head and the loss keep; every block's saved tensors are gone.
    EXPECT_LT(c.activations_after_forward, p.activations_after_forward / 2) << name;
    EXPECT_GT(c.flops, p.flops) << name << ": each layer's forward runs again in the backward";
  }
}

// A transformer on a MetaDevice (Note [Meta mode]: what a host run allocates, in no time) with
// its params (seed 3) and a batch of `samples`, ready to run.
struct OnMeta {
  MetaDevice dev;
  Transformer t;
  Batch b;
  OnMeta(const TransformerSpec& s, std::int64_t samples, DType dtype) : t(s) {
    Rng rng(3);
    t.init_params(dev, dtype, DataDomain::gaussian, ExactSpec{}, rng);
    b = upload_batch(dev, t.batch_shapes(samples), dtype);
  }
};

// The recomputation is one forward of every layer, no more: the FLOPs checkpointing adds equal
// the layers' forward FLOPs (the forward's growth from 4 to 8 layers, per layer, times 4).
TEST(TransformerBackward, CheckpointingRecomputesEachLayerOnce) {
  const auto flops = [](int layers, bool ckpt, bool backward) {
    TransformerSpec s = transformer_preset("llama-gqa-tiny");
    s.layers = layers;
    s.gradient_checkpointing = ckpt;
    OnMeta m(s, 2, DType::bf16);
    const std::int64_t before = m.dev.counters().flops;
    m.t.forward(m.dev, m.b);
    if (backward) m.t.backward(m.dev, 1.0, 1);
    return m.dev.counters().flops - before;
  };
  const std::int64_t per_layer = (flops(8, false, false) - flops(4, false, false)) / 4;
  ASSERT_GT(per_layer, 0);
  EXPECT_EQ(flops(4, true, true) - flops(4, false, true), 4 * per_layer);
  EXPECT_EQ(flops(4, true, false), flops(4, false, false)) << "the checkpointed forward computes what the plain one does";
}

// A checkpointed layer's forward runs without grad: what autograd would save goes once its last
// forward use is past, so at long sequences the forward's peak is the attention's (scores and
// the f32 probabilities), not the MLP's with the whole layer's saved tensors beside it.
TEST(TransformerBackward, ACheckpointedLayersForwardKeepsNothingPastItsLastUse) {
  std::vector<std::int64_t> peaks;
  std::vector<std::string> labels;
  for (bool ckpt : {false, true}) {
    TransformerSpec s = transformer_preset("llama-gqa-tiny");
    s.seq = 64;
    s.gradient_checkpointing = ckpt;
    HostDevice dev;
    Transformer t(s);
    Rng rng(3);
    t.init_params(dev, DType::bf16, DataDomain::gaussian, ExactSpec{}, rng);
    Rng data(4);
    const Batch b = upload_batch(dev, t.make_batch(data, 2, DataDomain::gaussian, ExactSpec{}), DType::bf16);
    const std::int64_t before = dev.memory().live_total();
    dev.memory().reset_window_peak();
    t.forward(dev, b);
    peaks.push_back(dev.memory().window_peak() - before);
    labels.push_back(dev.memory().peak_label());
  }
  EXPECT_EQ(labels[1], "attn_probs_f32") << "kept past their use, the layer's tensors peak at its end (x3)";
  EXPECT_LT(peaks[1], peaks[0] / 2) << "the plain forward keeps both layers' tensors";
  // An MoE layer's experts free theirs expert by expert: with 256 tokens over 4 experts (128 slots
  // each) the checkpointed forward's peak is the loss's (at its last allocation, nll_loss's total
  // weight), not the MoE layer's (mlp_out, when every expert's intermediates stay until the layer
  // returns).
  TransformerSpec moe = transformer_preset("mixtral-tiny");
  moe.gradient_checkpointing = true;
  OnMeta m(moe, 32, DType::bf16);
  m.dev.memory().reset_peak();
  m.t.forward(m.dev, m.b);
  EXPECT_EQ(m.dev.memory().peak_label(), "nll_loss_total_weight");
}

// Hugging Face's own memory, measured on CPU (reference/hf/checkpoint_memory.py, transformers
// 5.25.0, torch 2.10; reference/hf/measured/): tiny Llama and GPT-2 in f32, with and without
// reentrant gradient checkpointing. Four figures each: live bytes after the forward, the
// forward's peak, the peak through the backward, and after the backward (the loss graph still
// held). Each measured figure is zerocheck's plus known terms, to the byte:
//   - torch's CPU RNG state, which each checkpoint keeps (5,056 B a layer; host memory on a GPU);
//   - and a remainder of 0-dim tensors, 4 to 136 B, listed per figure: the loss after the forward
//     (Engine::forward's, which this model alone does not hold past its return) and the
//     backward's own. nll_loss's output and total weight are the model's (4 B each; the weight is
//     kept until nll_loss's backward), so the checkpointed Llama's forward peak, at the loss, is
//     Hugging Face's to the byte but for the RNG states.
// A figure that moves by a byte fails.
TEST(TransformerHfCpu, LiveBytesAreHuggingFacesMeasuredOnCpu) {
  std::ifstream in(std::string(ZC_SOURCE_DIR) + "/reference/hf/measured/cpu-transformers-5.25.0-checkpointing.json");
  ASSERT_TRUE(in) << "reference/hf/measured/cpu-transformers-5.25.0-checkpointing.json";
  const nlohmann::json measured = nlohmann::json::parse(in);
  constexpr std::int64_t kRng = 5056;
  struct Known {  // measured - zerocheck, per figure
    const char* fam;
    bool ckpt;
    std::int64_t after_forward, forward_peak, peak, after_backward;
  };
  const Known known[] = {
      {"llama", false, 36, 32, 40, 4},
      {"llama", true, 4 * kRng + 4, 4 * kRng, 4 * kRng + 16, 4 * kRng + 4},
      {"gpt2", false, 132, 128, 136, 4},
      {"gpt2", true, 4 * kRng + 4, 4 * kRng + 12, 4 * kRng + 40, 4 * kRng + 4},
  };
  for (const Known& want : known) {
    const nlohmann::json& m = measured.at("models").at(want.fam);
    TransformerSpec s;
    s.preset = want.fam;
    s.vocab = m.at("vocab");
    s.dim = m.at("dim");
    s.layers = m.at("layers");
    s.heads = m.at("heads");
    s.kv_heads = m.value("kv_heads", s.heads);
    s.ffn = m.at("ffn");
    s.seq = m.at("seq");
    if (std::string(want.fam) == "gpt2") {
      s.norm = NormKind::layernorm;
      s.mlp = MlpKind::gelu;
      s.pos = PositionKind::learned;
      s.positions = s.seq;
      s.tied_embeddings = s.bias = true;
    }
    s.gradient_checkpointing = want.ckpt;
    OnMeta run(s, 2, DType::f32);
    MetaDevice& dev = run.dev;
    Transformer& t = run.t;
    const Batch& b = run.b;
    const std::int64_t before = dev.memory().live_total();
    dev.memory().reset_window_peak();
    t.forward(dev, b);
    const std::int64_t after_forward = dev.memory().live_total() - before;
    const std::int64_t forward_peak = dev.memory().window_peak() - before;
    t.backward(dev, 1.0, 1);
    const std::int64_t peak = dev.memory().window_peak() - before;
    const std::int64_t after_backward = dev.memory().live_total() - before;
    // use_cache=False without checkpointing (Hugging Face's KV cache is not modelled; the
    // checkpointed layers turn it off themselves).
    const nlohmann::json& r = measured.at("runs").at(fmt::format("{}/{}", want.fam, want.ckpt ? "reentrant" : "none_nocache"));
    const std::int64_t hf_after_backward =
        r.at("end_bytes").get<std::int64_t>() + r.at("after_backward_graph_bytes").get<std::int64_t>();
    const std::string what = fmt::format("{} checkpointing {}", want.fam, want.ckpt);
    EXPECT_EQ(r.at("after_forward_bytes").get<std::int64_t>() - after_forward, want.after_forward) << what << " after the forward";
    EXPECT_EQ(r.at("forward_peak_bytes").get<std::int64_t>() - forward_peak, want.forward_peak) << what << " forward peak";
    EXPECT_EQ(r.at("peak_bytes").get<std::int64_t>() - peak, want.peak) << what << " peak";
    EXPECT_EQ(hf_after_backward - after_backward, want.after_backward) << what << " after the backward";
  }
}

// deepspeed.checkpointing (Note [Gradient checkpointing]): the same bits as torch's reentrant
// checkpoint under every setting, and what each setting keeps where: cpu_checkpointing moves the
// kept inputs to host memory; contiguous_memory_optimization allocates number_checkpoints buffers
// at the first layer and drops the unused ones at the first backward.
TEST(TransformerBackward, DeepSpeedCheckpointingKeepsWhatItsSettingsSay) {
  struct Setting {
    const char* name;
    bool partition, contiguous, cpu;
  };
  constexpr int kLayers = 4;
  const std::int64_t input_bytes = 2 * 8 * 16 * 4;  // one layer input: [B*S, d] f32, llama-gqa-tiny
  TransformerSpec torch_spec = transformer_preset("llama-gqa-tiny");
  torch_spec.layers = kLayers;
  torch_spec.gradient_checkpointing = true;
  const HostRun want = run_on_host(torch_spec);
  for (const Setting& st : {Setting{"plain", false, false, false}, Setting{"partition", true, false, false},
                            Setting{"contiguous", true, true, false}, Setting{"cpu", false, false, true},
                            Setting{"partition+cpu", true, false, true}, Setting{"contiguous+cpu", true, true, true}}) {
    TransformerSpec s = torch_spec;
    s.checkpoint_function = CheckpointFunction::deepspeed;
    s.ds_partition_activations = st.partition;
    s.ds_contiguous_memory_optimization = st.contiguous;
    s.ds_cpu_checkpointing = st.cpu;
    s.ds_number_checkpoints = kLayers + 2;  // two buffers more than the layers use
    const HostRun got = run_on_host(s);
    EXPECT_EQ(got.probe.loss, want.probe.loss) << st.name;
    EXPECT_EQ(got.probe.grads, want.probe.grads) << st.name;
    const std::int64_t kept = kLayers * input_bytes, spare = st.contiguous ? 2 * input_bytes : 0;
    EXPECT_EQ(got.activations_after_forward,
              st.cpu ? want.activations_after_forward - kept : want.activations_after_forward + spare)
        << st.name << " device after the forward";
    // partition_activations keeps each argument's size as a CPU int64 tensor: x [B, S, d], the
    // mask [B, 1, S, S], cos and sin [1, S, dh], the position ids [1, S]: 15 dims a layer.
    const std::int64_t sizes = st.partition ? kLayers * 8 * 15 : 0;
    EXPECT_EQ(got.host_after_forward, (st.cpu ? kept + spare : 0) + sizes) << st.name << " host after the forward";
    EXPECT_EQ(got.activations_after_backward, 0)
        << st.name << " after the backward: every argument went with its layer's backward";
    EXPECT_EQ(got.host_after_backward, 0) << st.name << ": the host copies go with their layers' backward";
  }
  // torch's checkpoints keep what Hugging Face passes by keyword until the next forward: the mask
  // [B, S, S], the position ids [S] int64 and cos/sin [2, S, dh] (B 2, S 8, dh 4, f32).
  EXPECT_EQ(want.activations_after_backward, 2 * 8 * 8 * 4 + 8 * 8 + 2 * 8 * 4 * 4);
  TransformerSpec bad = torch_spec;
  bad.checkpoint_function = CheckpointFunction::deepspeed;
  bad.ds_contiguous_memory_optimization = true;
  EXPECT_NE(bad.invalid().find("needs partition_activations"), std::string::npos) << bad.invalid();
  bad.ds_partition_activations = true;
  bad.ds_number_checkpoints = kLayers - 1;
  EXPECT_NE(bad.invalid().find("number_checkpoints 3 is below the 4"), std::string::npos) << bad.invalid();
}

// Through the engine: a checkpointed model trains to the same bits at every ZeRO stage (at ZeRO-3
// the recomputation's forward fetches the layer's params again and its trace records the second
// fetch), with and without optimizer offload.
TEST(TransformerEngine, GradientCheckpointingTrainsToTheSameBitsAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* preset : {"gpt2-tiny", "llama-gqa-tiny"}) {
      for (const bool offload : {false, true}) {
        if (offload && stage == 0) continue;
        const props::RunResult plain = props::run_on_sim(transformer_run(preset, stage, 2, offload, "bf16"));
        const props::RunResult ckpt = props::run_on_sim(transformer_run(preset, stage, 2, offload, "bf16", true));
        const std::string what = fmt::format("{} ZeRO-{} offload {}", preset, stage, offload);
        ASSERT_TRUE(plain.ranks_agree && ckpt.ranks_agree) << what << ": " << plain.disagreement << ckpt.disagreement;
        ASSERT_EQ(plain.params.size(), 2u) << what;
        EXPECT_EQ(plain.losses, ckpt.losses) << what;
        EXPECT_EQ(plain.grads, ckpt.grads) << what;
        EXPECT_EQ(plain.params, ckpt.params) << what;
      }
    }
  }
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
      const props::MemoryComparison ckpt =
          props::compare_meta_with_host(transformer_run(preset, stage, 2, false, "bf16", true));
      ASSERT_TRUE(ckpt.applies) << ckpt.why_not;
      EXPECT_EQ(ckpt.difference, "") << preset << " stage " << stage << " gradient checkpointing";
      props::RunSpec ds = transformer_run(preset, stage, 2, false, "bf16", true);
      ds.make_model = [preset] {  // deepspeed.checkpointing, its inputs on the host, contiguous buffers
        TransformerSpec t = transformer_preset(preset);
        t.gradient_checkpointing = true;
        t.checkpoint_function = CheckpointFunction::deepspeed;
        t.ds_partition_activations = t.ds_contiguous_memory_optimization = t.ds_cpu_checkpointing = true;
        t.ds_number_checkpoints = t.layers + 1;
        return std::make_unique<Transformer>(t);
      };
      const props::MemoryComparison dsc = props::compare_meta_with_host(ds);
      ASSERT_TRUE(dsc.applies) << dsc.why_not;
      EXPECT_EQ(dsc.difference, "") << preset << " stage " << stage << " deepspeed.checkpointing";
    }
  }
}

props::RunSpec moe_run(int stage, int world, int ep, bool offload, bool checkpointing = false) {
  props::RunSpec spec = transformer_run("mixtral-tiny", stage, world, offload, "bf16");
  spec.ep_size = ep;
  spec.ds_config["moe"] = {{"ep_size", ep}};
  spec.make_moe_model = [checkpointing](Comm& group) {
    TransformerSpec t = transformer_preset("mixtral-tiny");
    t.gradient_checkpointing = checkpointing;
    return std::make_unique<Transformer>(t, "transformer", &group);
  };
  return spec;
}

TEST(TransformerMeta, MetaModeAllocatesWhatTheHostAllocatesForMoe) {
  for (int stage : {1, 2}) {
    for (int ep : {1, 2}) {
      for (bool offload : {false, true}) {
        const props::MemoryComparison c = props::compare_meta_with_host(moe_run(stage, 2, ep, offload));
        ASSERT_TRUE(c.applies) << c.why_not;
        EXPECT_EQ(c.difference, "") << "stage " << stage << " ep " << ep << " offload " << offload;
        EXPECT_GT(c.peak_bytes, 0);
        // checkpointed: the recomputation's all_to_alls and the experts' no-grad frees
        const props::MemoryComparison ck = props::compare_meta_with_host(moe_run(stage, 2, ep, offload, true));
        ASSERT_TRUE(ck.applies) << ck.why_not;
        EXPECT_EQ(ck.difference, "") << "stage " << stage << " ep " << ep << " offload " << offload << " checkpointed";
        EXPECT_LT(ck.peak_bytes, c.peak_bytes);
      }
    }
  }
}

// mixtral-tiny's experts: 4 per layer, each [ffn, dim] x2 and [dim, ffn], all of one size.
constexpr std::int64_t expert_param_numel = 24 * 16;
constexpr std::int64_t expert_numel = 2 * 4 * 3 * expert_param_numel;

// Where each expert param's grad sits in full_grads()' expert part at ep_size ep: rank by rank,
// each rank's params in its module order (layer, local expert, gate / up / down).
std::map<std::string, std::size_t> expert_offsets(int ep) {
  std::map<std::string, std::size_t> at;
  std::size_t off = 0;
  for (int r = 0; r < ep; ++r) {
    for (int l = 0; l < 2; ++l) {
      for (int i = 0; i < 4 / ep; ++i) {
        for (const char* w : {"w_gate", "w_up", "w_down"}) {
          at[fmt::format("layers.{}.expert{}_{}", l, r * (4 / ep) + i, w)] = off;
          off += static_cast<std::size_t>(expert_param_numel);
        }
      }
    }
  }
  return at;
}

TEST(TransformerMoe, ExpertParallelRunsComputeWhatEveryRankHoldingEveryExpertComputes) {
  // At world 4: ep 1 (every rank holds all 4 experts) against ep 2 and 4 (experts spread, tokens
  // by all_to_all). The routing and every token's expert math are row by row, so the loss is the
  // same bits; an expert's weight grad sums its tokens in another association (one matmul over the
  // tokens of every rank, or a matmul per rank then the reduction), so params after the step agree
  // to f32 reassociation, far inside what one misrouted token or a wrong scale would move.
  for (int stage : {1, 2}) {
    props::RunSpec base = moe_run(stage, 4, 1, false);
    base.ds_config.erase("bf16");
    base.steps = 1;
    const props::RunResult ref = props::run_on_sim(base);
    ASSERT_TRUE(ref.ranks_agree) << ref.disagreement;
    for (int ep : {2, 4}) {
      props::RunSpec spec = moe_run(stage, 4, ep, false);
      spec.ds_config.erase("bf16");
      spec.steps = 1;
      const props::RunResult got = props::run_on_sim(spec);
      ASSERT_TRUE(got.ranks_agree) << got.disagreement;
      EXPECT_EQ(got.losses, ref.losses) << "stage " << stage << " ep " << ep;
      ASSERT_EQ(got.grads.size(), ref.grads.size());
      ASSERT_EQ(got.grads[0].size(), ref.grads[0].size());
      // full_grads(): the dense grads, then each expert-parallel rank's experts in turn.
      const std::size_t experts = static_cast<std::size_t>(expert_numel), dense = ref.grads[0].size() - experts;
      const std::vector<double> a(ref.grads[0].begin(), ref.grads[0].begin() + static_cast<std::ptrdiff_t>(dense));
      const std::vector<double> b(got.grads[0].begin(), got.grads[0].begin() + static_cast<std::ptrdiff_t>(dense));
      EXPECT_EQ(props::first_difference(a, b, DType::f32), "") << "dense grads, stage " << stage << " ep " << ep;
      const std::map<std::string, std::size_t> at_ref = expert_offsets(1), at_got = expert_offsets(ep);
      double scale = 0, worst = 0;
      for (const auto& [name, off] : at_ref) {
        for (std::size_t i = 0; i < static_cast<std::size_t>(expert_param_numel); ++i) {
          const double x = ref.grads[0][dense + off + i], y = got.grads[0][dense + at_got.at(name) + i];
          scale = std::max(scale, std::fabs(x));
          worst = std::max(worst, std::fabs(x - y));
        }
      }
      EXPECT_GT(scale, 0);
      EXPECT_LE(worst, 1e-6 * scale) << "stage " << stage << " ep " << ep;
    }
  }
}

TEST(TransformerMoe, StagesZeroAndThreeAreRefusedAsDeepSpeedRefusesThem) {
  for (int stage : {0, 3}) {
    try {
      props::run_on_sim(moe_run(stage, 2, 2, false));
      ADD_FAILURE() << "stage " << stage << " ran";
    } catch (const ZcError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("MoE expert params with ZeRO stage {} are not modelled", stage)),
                std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace zc
