// Transformer: presets, construction, and the forward and explicit backward of transformer.h.
// Every buffer names its memory category (engine/memory.h): what a block keeps for its backward
// is `activations` until that backward frees it; a weight's grad before accumulation is a
// temporary; the rest of the backward's buffers are activation grads (`activations`).
#include "models/transformer.h"

#include "engine/errors.h"
#include "engine/trace.h"
#include "models/params.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace zc {

namespace {

using model_params::act;
using model_params::data_of;
using model_params::grad_buf;
using model_params::param_of;
using model_params::tmp;

// A module of the tree, for the hooks and the copy path.
class Part : public Module {
 public:
  Part(std::string name, std::string kind) : Module(std::move(name)), kind_(std::move(kind)) {}
  Part(const Part&) = default;
  std::string kind() const override { return kind_; }

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<Part>(*this); }

 private:
  std::string kind_;
};

}  // namespace

std::int64_t TransformerSpec::param_count() const {
  const std::int64_t d = dim, dh = head_dim(), q = heads * dh, kv = kv_heads * dh;
  const std::int64_t norm_p = norm == NormKind::layernorm ? 2 * d : d;
  std::int64_t block = 2 * norm_p + d * q + 2 * d * kv + q * d;
  if (bias) block += q + 2 * kv + d;
  if (experts > 0) {
    block += experts * (3 * d * ffn + d);  // the experts and the router's [experts, dim]
  } else {
    block += mlp == MlpKind::swiglu ? 3 * d * ffn : 2 * d * ffn + (bias ? ffn + d : 0);
  }
  std::int64_t total = vocab * d + (pos == PositionKind::learned ? positions * d : 0);
  total += static_cast<std::int64_t>(layers) * block + norm_p;
  if (!tied_embeddings) total += vocab * d;
  return total;
}

std::int64_t TransformerSpec::largest_param() const {
  const std::int64_t dh = head_dim();
  return std::max({vocab * dim, dim * heads * dh, ffn * dim,
                   pos == PositionKind::learned ? positions * dim : 0});
}

std::int64_t TransformerSpec::capacity(std::int64_t tokens) const {
  // DeepSpeed's _capacity: torch.ceil((num_tokens / num_experts) * capacity_factor) with the
  // factor (capacity_factor * 2 for top-2) a float32 tensor, so the product is in f32.
  const float per_expert = static_cast<float>(static_cast<double>(tokens) / experts);
  const auto c = static_cast<std::int64_t>(std::ceil(per_expert * static_cast<float>(capacity_factor * top_k)));
  return std::max(c, min_capacity);
}

std::string TransformerSpec::checkpointing_summary() const {
  if (!gradient_checkpointing) return "";
  if (checkpoint_function == CheckpointFunction::torch_reentrant) return ", gradient checkpointing";
  return fmt::format(", deepspeed.checkpointing{}{}{}", ds_partition_activations ? ", partition_activations" : "",
                     ds_cpu_checkpointing ? ", cpu_checkpointing" : "",
                     ds_contiguous_memory_optimization ? ", contiguous" : "");
}

std::string TransformerSpec::invalid() const {
  if (vocab < 1 || dim < 1 || layers < 1 || heads < 1 || ffn < 1 || seq < 1) {
    return "vocab, dim, layers, heads, ffn and seq must be at least 1";
  }
  if (dim % heads != 0) return fmt::format("heads ({}) must divide dim ({})", heads, dim);
  if (kv_heads < 1 || heads % kv_heads != 0) {
    return fmt::format("kv_heads ({}) must divide heads ({})", kv_heads, heads);
  }
  if (pos == PositionKind::rotary && head_dim() % 2 != 0) {
    return fmt::format("rotary positions need an even head dim (dim / heads = {})", head_dim());
  }
  if (checkpoint_function == CheckpointFunction::deepspeed && gradient_checkpointing) {
    if (ds_contiguous_memory_optimization && !ds_partition_activations) {
      return "activation_checkpointing.contiguous_memory_optimization needs partition_activations (DeepSpeed's assert)";
    }
    if (ds_contiguous_memory_optimization && ds_number_checkpoints < layers) {
      return fmt::format("activation_checkpointing.number_checkpoints {} is below the {} checkpointed layers: "
                         "DeepSpeed's contiguous buffers would run out (an IndexError in checkpointing.py "
                         "partition_activations); set it to {} or more", ds_number_checkpoints, layers, layers);
    }
  }
  if (experts < 0) return "experts must be 0 (dense) or more";
  if (experts > 0) {
    if (mlp != MlpKind::swiglu) return "experts need the swiglu MLP (Mixtral's experts)";
    if (top_k != 2) {
      return fmt::format("top_k {}: only top-2 gating is modelled (DeepSpeed's top1gating's random "
                         "token selection and topkgating's drop policy are not)", top_k);
    }
    if (experts < top_k) return fmt::format("{} experts for top_k {}", experts, top_k);
    if (!(capacity_factor > 0) || min_capacity < 0) {
      return "capacity_factor must be > 0 and min_capacity >= 0 (drop_tokens=False is not modelled)";
    }
  }
  if (pos == PositionKind::learned && seq > positions) {
    return fmt::format("seq {} exceeds the learned position table's {} rows (max_positions)", seq,
                       positions);
  }
  return "";
}

TransformerSpec transformer_preset(const std::string& name) {
  TransformerSpec s;
  s.preset = name;
  auto gpt2 = [&](std::int64_t v, std::int64_t d, int l, std::int64_t h, std::int64_t p) {
    s.vocab = v, s.dim = d, s.layers = l, s.heads = s.kv_heads = h, s.ffn = 4 * d;
    s.positions = p, s.seq = p, s.norm = NormKind::layernorm, s.mlp = MlpKind::gelu;
    s.pos = PositionKind::learned, s.tied_embeddings = true, s.bias = true;
  };
  auto llama = [&](std::int64_t d, int l, std::int64_t h, std::int64_t kv, std::int64_t f) {
    s.vocab = 32000, s.dim = d, s.layers = l, s.heads = h, s.kv_heads = kv, s.ffn = f;
    s.seq = 4096, s.norm = NormKind::rmsnorm, s.mlp = MlpKind::swiglu;
    s.pos = PositionKind::rotary, s.tied_embeddings = false, s.bias = false;
  };
  if (name == "gpt2-xl") {
    gpt2(50257, 1600, 48, 25, 1024);  // 1,557,611,200 params
  } else if (name == "llama-2-7b") {
    llama(4096, 32, 32, 32, 11008);  // 6,738,415,616
  } else if (name == "llama-2-13b") {
    llama(5120, 40, 40, 40, 13824);  // 13,015,864,320
  } else if (name == "llama-2-70b") {
    llama(8192, 80, 64, 8, 28672);  // 68,976,648,192
  } else if (name == "mixtral-8x7b") {
    llama(4096, 32, 32, 8, 14336);  // 46,702,792,704
    s.experts = 8;
  } else if (name == "gpt2-tiny") {
    gpt2(64, 16, 2, 4, 16);
    s.seq = 8;
  } else if (name == "llama-tiny") {
    llama(16, 2, 4, 4, 40);
    s.vocab = 64, s.seq = 8;
  } else if (name == "llama-gqa-tiny") {
    llama(16, 2, 4, 2, 40);
    s.vocab = 64, s.seq = 8;
  } else if (name == "mixtral-tiny") {
    llama(16, 2, 4, 2, 24);
    s.vocab = 64, s.seq = 8, s.experts = 4;
  } else {
    std::string known;
    for (const std::string& n : transformer_presets()) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError(fmt::format("unknown model preset '{}'; known: {} (or --model-json)", name,
                                  known));
  }
  return s;
}

std::vector<std::string> transformer_presets() {
  return {"gpt2-xl",   "llama-2-7b", "llama-2-13b",    "llama-2-70b", "mixtral-8x7b",
          "gpt2-tiny", "llama-tiny", "llama-gqa-tiny", "mixtral-tiny"};
}

namespace {

// A key of a Hugging Face config, or its config class's default when absent or null.
template <class T>
T hf_value(const nlohmann::json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ConfigError(fmt::format("Hugging Face config: '{}' is {}, not the type its config class "
                                  "expects", key, it->dump()));
  }
}
template <class T>
T hf_required(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) {
    throw ConfigError(fmt::format("Hugging Face config: '{}' is missing", key));
  }
  return hf_value<T>(j, key, T{});
}

}  // namespace

TransformerSpec transformer_spec_from_hf_config(const nlohmann::json& j,
                                                std::vector<std::string>& notes) {
  const std::string type = hf_value<std::string>(j, "model_type", "");
  TransformerSpec s;
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ConfigError(fmt::format("Hugging Face config ({}): '{}' {}", type, key, why));
  };
  auto dropout = [&](std::initializer_list<const char*> keys, double fallback) {
    std::string set;
    for (const char* k : keys) {
      const double p = hf_value<double>(j, k, fallback);
      if (p > 0) set += fmt::format("{}{} {}", set.empty() ? "" : ", ", k, p);
    }
    if (!set.empty()) {
      notes.push_back(set + ": dropout is not modelled; in training each dropout keeps a mask "
                            "for backward, which this plan does not count");
    }
  };
  if (type == "llama" || type == "mistral" || type == "mixtral") {
    const bool mixtral = type == "mixtral";
    s.preset = hf_value<std::string>(j, "_name_or_path", type);
    if (s.preset.empty()) s.preset = type;
    s.vocab = hf_required<std::int64_t>(j, "vocab_size");
    s.dim = hf_required<std::int64_t>(j, "hidden_size");
    s.layers = hf_required<int>(j, "num_hidden_layers");
    s.heads = hf_required<std::int64_t>(j, "num_attention_heads");
    s.kv_heads = hf_value<std::int64_t>(j, "num_key_value_heads", s.heads);
    s.ffn = hf_required<std::int64_t>(j, "intermediate_size");
    s.seq = hf_value<std::int64_t>(j, "max_position_embeddings", type == "llama" ? 2048 : 32768);
    s.norm = NormKind::rmsnorm, s.mlp = MlpKind::swiglu, s.pos = PositionKind::rotary;
    s.eps = hf_value<double>(j, "rms_norm_eps", mixtral ? 1e-5 : 1e-6);
    s.rope_base = hf_value<double>(j, "rope_theta", mixtral ? 1e6 : 10000.0);
    s.tied_embeddings = hf_value<bool>(j, "tie_word_embeddings", false);
    if (const auto act = hf_value<std::string>(j, "hidden_act", "silu"); act != "silu") {
      refuse("hidden_act", fmt::format("is {}: only silu (SwiGLU) is modelled", act));
    }
    for (const char* k : {"attention_bias", "mlp_bias"}) {
      if (hf_value<bool>(j, k, false)) refuse(k, "is true: biases on Llama's projections are not modelled");
    }
    if (j.contains("head_dim") && !j.at("head_dim").is_null() &&
        j.at("head_dim").get<std::int64_t>() * s.heads != s.dim) {
      refuse("head_dim", "differs from hidden_size / num_attention_heads: not modelled");
    }
    if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
      notes.push_back(fmt::format("rope_scaling {}: it changes the rotary frequencies (values), not "
                                  "memory or time; planned without it", j.at("rope_scaling").dump()));
    }
    if (const auto w = hf_value<std::int64_t>(j, "sliding_window", 0); w > 0) {
      notes.push_back(fmt::format("sliding_window {}: eager attention still materialises every [S, S] "
                                  "row, masked; planned as full causal attention (same memory and "
                                  "time, other values)", w));
    }
    dropout({"attention_dropout"}, 0.0);
    if (mixtral) {
      s.experts = hf_required<int>(j, "num_local_experts");
      s.top_k = hf_value<int>(j, "num_experts_per_tok", 2);
      notes.push_back("Mixtral's experts are planned as DeepSpeed's MoE layer trains them (top-2 "
                      "gating, capacity_factor 1.0, tokens past capacity dropped); Hugging Face's "
                      "MixtralSparseMoeBlock is dropless");
    }
  } else if (type == "gpt2") {
    s.preset = hf_value<std::string>(j, "_name_or_path", "gpt2");
    if (s.preset.empty()) s.preset = "gpt2";
    s.vocab = hf_value<std::int64_t>(j, "vocab_size", 50257);
    s.dim = hf_value<std::int64_t>(j, "n_embd", 768);
    s.layers = hf_value<int>(j, "n_layer", 12);
    s.heads = s.kv_heads = hf_value<std::int64_t>(j, "n_head", 12);
    s.ffn = hf_value<std::int64_t>(j, "n_inner", 4 * s.dim);
    s.positions = s.seq = hf_value<std::int64_t>(j, "n_positions", 1024);
    s.norm = NormKind::layernorm, s.mlp = MlpKind::gelu, s.pos = PositionKind::learned;
    s.eps = hf_value<double>(j, "layer_norm_epsilon", 1e-5);
    s.tied_embeddings = hf_value<bool>(j, "tie_word_embeddings", true);
    s.bias = true;
    if (const auto act = hf_value<std::string>(j, "activation_function", "gelu_new"); act != "gelu_new") {
      refuse("activation_function", fmt::format("is {}: only gelu_new is modelled", act));
    }
    for (const char* k : {"reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "add_cross_attention"}) {
      if (hf_value<bool>(j, k, false)) refuse(k, "is true: not modelled");
    }
    if (!hf_value<bool>(j, "scale_attn_weights", true)) refuse("scale_attn_weights", "is false: not modelled");
    dropout({"attn_pdrop", "resid_pdrop", "embd_pdrop"}, 0.1);
  } else {
    throw ConfigError(fmt::format("Hugging Face config: model_type '{}' is not modelled; llama, "
                                  "mistral, mixtral and gpt2 are", type));
  }
  notes.push_back(fmt::format("{}: the sequence length defaults to the config's {} ({}); --seq sets the "
                              "training length", s.preset, type == "gpt2" ? "n_positions" : "max_position_embeddings",
                              s.seq));
  if (const std::string why = s.invalid(); !why.empty()) {
    throw ConfigError(fmt::format("Hugging Face config ({}): {}", type, why));
  }
  return s;
}

TransformerSpec transformer_spec_from_json(const nlohmann::json& j, std::vector<std::string>* notes) {
  if (j.is_object() && j.contains("model_type")) {
    std::vector<std::string> mine;
    TransformerSpec s = transformer_spec_from_hf_config(j, mine);
    if (notes != nullptr) notes->insert(notes->end(), mine.begin(), mine.end());
    return s;
  }
  static const std::vector<std::string> keys = {
      "name",  "vocab", "dim",       "layers",        "heads",           "kv_heads", "ffn",
      "seq",   "norm",  "mlp",       "positions",     "max_positions",   "tied_embeddings",
      "bias",  "eps",   "rope_base", "attention",     "experts",         "top_k",
      "capacity_factor", "min_capacity"};
  if (!j.is_object()) throw ConfigError("--model-json: the model must be a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      throw ConfigError(fmt::format("--model-json: unknown key '{}'", k));
    }
  }
  TransformerSpec s;
  try {
    s.preset = j.value("name", std::string("custom"));
    s.vocab = j.at("vocab").get<std::int64_t>();
    s.dim = j.at("dim").get<std::int64_t>();
    s.layers = j.at("layers").get<int>();
    s.heads = j.at("heads").get<std::int64_t>();
    s.kv_heads = j.value("kv_heads", s.heads);
    s.ffn = j.at("ffn").get<std::int64_t>();
    s.seq = j.at("seq").get<std::int64_t>();
    const std::string norm = j.value("norm", std::string("rmsnorm"));
    const std::string mlp = j.value("mlp", std::string("swiglu"));
    const std::string pos = j.value("positions", std::string("rotary"));
    const std::string attn = j.value("attention", std::string("materialised"));
    if (norm != "rmsnorm" && norm != "layernorm") throw ConfigError("--model-json: norm must be rmsnorm or layernorm");
    if (mlp != "swiglu" && mlp != "gelu") throw ConfigError("--model-json: mlp must be swiglu or gelu");
    if (pos != "rotary" && pos != "learned") throw ConfigError("--model-json: positions must be rotary or learned");
    if (attn != "materialised" && attn != "fused") throw ConfigError("--model-json: attention must be materialised or fused");
    s.norm = norm == "layernorm" ? NormKind::layernorm : NormKind::rmsnorm;
    s.mlp = mlp == "gelu" ? MlpKind::gelu : MlpKind::swiglu;
    s.pos = pos == "learned" ? PositionKind::learned : PositionKind::rotary;
    s.attention = attn == "fused" ? AttentionMemory::fused : AttentionMemory::materialised;
    s.positions = j.value("max_positions", s.pos == PositionKind::learned ? s.seq : 0);
    s.tied_embeddings = j.value("tied_embeddings", false);
    s.bias = j.value("bias", false);
    s.eps = j.value("eps", 1e-5);
    s.rope_base = j.value("rope_base", 10000.0);
    s.experts = j.value("experts", 0);
    s.top_k = j.value("top_k", 2);
    s.capacity_factor = j.value("capacity_factor", 1.0);
    s.min_capacity = j.value("min_capacity", std::int64_t{4});
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--model-json: {}", e.what()));
  }
  if (const std::string why = s.invalid(); !why.empty()) throw ConfigError("--model-json: " + why);
  return s;
}

Transformer::Transformer(TransformerSpec spec, std::string name, Comm* ep)
    : Model(std::move(name)), spec_(std::move(spec)), ep_(spec_.experts > 0 ? ep : nullptr) {
  if (const std::string why = spec_.invalid(); !why.empty()) {
    throw ConfigError(fmt::format("transformer {}: {}", spec_.preset, why));
  }
  if (spec_.experts % ep_size() != 0) {
    throw ConfigError(fmt::format("transformer {}: {} experts do not split over ep_size {}",
                                  spec_.preset, spec_.experts, ep_size()));
  }
  const std::int64_t d = spec_.dim, q = spec_.heads * spec_.head_dim();
  const std::int64_t kv = spec_.kv_heads * spec_.head_dim(), f = spec_.ffn;
  const bool ln = spec_.norm == NormKind::layernorm, b = spec_.bias;
  Module& emb = add_child<Part>("embed", "transformer_embed");
  emb.params().add("tok", {spec_.vocab, d}, DType::f32);
  if (spec_.pos == PositionKind::learned) emb.params().add("pos", {spec_.positions, d}, DType::f32);
  for (int l = 0; l < spec_.layers; ++l) {
    Module& blk = add_child<Part>(fmt::format("layers.{}", l), "transformer_block");
    ParamDict& p = blk.params();
    p.add("attn_norm", {d}, DType::f32);
    if (ln) p.add("attn_norm_b", {d}, DType::f32);
    p.add("wq", {q, d}, DType::f32);
    if (b) p.add("bq", {q}, DType::f32);
    p.add("wk", {kv, d}, DType::f32);
    if (b) p.add("bk", {kv}, DType::f32);
    p.add("wv", {kv, d}, DType::f32);
    if (b) p.add("bv", {kv}, DType::f32);
    p.add("wo", {d, q}, DType::f32);
    if (b) p.add("bo", {d}, DType::f32);
    p.add("mlp_norm", {d}, DType::f32);
    if (ln) p.add("mlp_norm_b", {d}, DType::f32);
    if (spec_.experts > 0) {  // Note [MoE routing]; this rank's experts by global id
      p.add("router", {spec_.experts, d}, DType::f32);
      for (int i = 0; i < local_experts(); ++i) {
        const int e = (ep_ == nullptr ? 0 : ep_->rank()) * local_experts() + i;
        for (const auto& [w, shape] : {std::pair{"w_gate", Shape{f, d}}, std::pair{"w_up", Shape{f, d}},
                                       std::pair{"w_down", Shape{d, f}}}) {
          p.add(fmt::format("expert{}_{}", e, w), shape, DType::f32).is_expert = true;
        }
      }
    } else if (spec_.mlp == MlpKind::gelu) {
      p.add("w_fc", {f, d}, DType::f32);
      if (b) p.add("b_fc", {f}, DType::f32);
      p.add("w_proj", {d, f}, DType::f32);
      if (b) p.add("b_proj", {d}, DType::f32);
    } else {
      p.add("w_gate", {f, d}, DType::f32);
      p.add("w_up", {f, d}, DType::f32);
      p.add("w_down", {d, f}, DType::f32);
    }
  }
  Module& norm = add_child<Part>("norm", "transformer_norm");
  norm.params().add("weight", {d}, DType::f32);
  if (ln) norm.params().add("bias", {d}, DType::f32);
  Module& head = add_child<Part>("lm_head", "transformer_lm_head");
  if (spec_.tied_embeddings) {
    head.params().add_alias("weight", *emb.params().get("tok"), emb);
  } else {
    head.params().add("weight", {spec_.vocab, d}, DType::f32);
  }
  finalize_parameters();
}

nlohmann::json Transformer::kind_args() const {
  nlohmann::json j = {{"preset", spec_.preset}, {"vocab", spec_.vocab}, {"dim", spec_.dim},
                      {"layers", spec_.layers}, {"heads", spec_.heads}, {"kv_heads", spec_.kv_heads},
                      {"ffn", spec_.ffn},       {"seq", spec_.seq},     {"experts", spec_.experts}};
  if (spec_.gradient_checkpointing) {
    j["gradient_checkpointing"] = spec_.checkpoint_function == CheckpointFunction::deepspeed ? "deepspeed" : "torch";
  }
  return j;
}

std::string Transformer::describe() const {
  return fmt::format(
      "transformer {} ({} params: vocab {}, dim {}, {} layers, {} heads ({} kv), ffn {}, seq {}, "
      "{}, {}, {} positions{}{}, {} attention{}{})",
      spec_.preset, spec_.param_count(), spec_.vocab, spec_.dim, spec_.layers, spec_.heads,
      spec_.kv_heads, spec_.ffn, spec_.seq,
      spec_.norm == NormKind::layernorm ? "LayerNorm" : "RMSNorm",
      spec_.mlp == MlpKind::gelu ? "GELU" : "SwiGLU",
      spec_.pos == PositionKind::learned ? "learned" : "rotary",
      spec_.tied_embeddings ? ", tied embeddings" : "", spec_.bias ? ", biases" : "",
      spec_.attention == AttentionMemory::fused ? "fused" : "materialised",
      spec_.checkpointing_summary(),
      spec_.experts > 0 ? fmt::format(", {} experts top-{} over ep_size {}, capacity factor {}",
                                      spec_.experts, spec_.top_k, ep_size(), spec_.capacity_factor)
                        : std::string());
}

void Transformer::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                              Rng& rng) {
  dtype_ = dtype;
  // Experts draw from a stream of their own name, so that an expert has the same values at any
  // ep_size and the dense params the same draws with or without them.
  for (Parameter* p : named_parameters()) {
    if (!p->is_expert) continue;
    Rng own = rng.split(fnv1a(p->name));
    init_param(dev, *p, dtype, domain, ex, own, 0.02);
  }
  for (Parameter* p : named_parameters()) {
    if (p->is_expert) continue;
    const std::string& n = p->name;
    const bool norm_w = n.ends_with("norm") || n == "norm.weight";
    const bool zero = n.ends_with("_b") || n == "norm.bias" || (p->shape.size() == 1 && !norm_w);
    if (!norm_w && !zero) {
      init_param(dev, *p, dtype, domain, ex, rng, 0.02);
      continue;
    }
    p->dtype = dtype;
    if (dev.placement() == Placement::meta) {  // Note [Meta mode]
      p->data = dev.alloc(dtype, p->shape, p->name, MemCategory::params);
      continue;
    }
    const std::vector<double> v(static_cast<std::size_t>(p->numel()), norm_w ? 1.0 : 0.0);
    p->data = tensor_from_f64(dev, dtype, p->shape, v, p->name, MemCategory::params);
  }
}

HostBatch Transformer::make_batch(Rng& rng, std::int64_t samples, DataDomain,
                                  const ExactSpec&) const {
  const std::int64_t S = spec_.seq;
  HostBatch hb = batch_shapes(samples);
  std::vector<double>& ids = hb.arrays.at("ids").values;
  std::vector<double>& labels = hb.arrays.at("labels").values;
  for (std::int64_t s = 0; s < samples; ++s) {
    std::vector<double> tokens(static_cast<std::size_t>(S + 1));
    for (double& t : tokens) t = static_cast<double>(rng.below(static_cast<std::uint64_t>(spec_.vocab)));
    ids.insert(ids.end(), tokens.begin(), tokens.end() - 1);
    labels.insert(labels.end(), tokens.begin() + 1, tokens.end());
  }
  return hb;
}

HostBatch Transformer::batch_shapes(std::int64_t samples) const {
  HostBatch hb;
  hb.samples = samples;
  hb.arrays.emplace("ids", HostArray{{samples, spec_.seq}, {}});
  hb.arrays.emplace("labels", HostArray{{samples, spec_.seq}, {}});
  return hb;
}

// ---- pieces ----

Tensor Transformer::norm_forward(Device& dev, Module& m, const char* w, const Tensor& x,
                                 NormActs& s) {
  const std::int64_t N = x.dim(0), d = spec_.dim;
  const DType sd = stats_dtype();
  Tensor out = act(dev, dtype_, {N, d}, "norm_out");
  s.rstd = act(dev, sd, {N}, "norm_rstd");
  if (spec_.norm == NormKind::layernorm) {
    s.x = x;
    s.mean = act(dev, sd, {N}, "norm_mean");
    const std::string b = std::string(w) + (std::string(w) == "weight" ? "" : "_b");
    dev.layernorm(out, s.mean, s.rstd, x, data_of(m, w),
                  data_of(m, std::string(w) == "weight" ? "bias" : b.c_str()), spec_.eps);
    return out;
  }
  // Hugging Face's LlamaRMSNorm (Note [Hugging Face's saved tensors]).
  if (dtype_ == sd) {
    s.x = x;
  } else {
    s.x = act(dev, sd, {N, d}, "norm_x_f32");
    dev.cast(s.x, x);
  }
  dev.rmsnorm(out, s.rstd, s.x, data_of(m, w), spec_.eps);
  s.xn = act(dev, dtype_, {N, d}, "norm_xn");
  dev.scale_rows(s.xn, s.x, s.rstd);
  return out;
}

Tensor Transformer::norm_backward(Device& dev, Module& m, const char* w, Tensor dout, NormActs& s) {
  const std::int64_t N = dout.dim(0), d = spec_.dim;
  Tensor dx = act(dev, dtype_, {N, d}, "norm_dx");
  Tensor dw = grad_buf(dev, dtype_, {d}, "dnorm_w");
  if (spec_.norm == NormKind::layernorm) {
    const std::string bname = std::string(w) == "weight" ? "bias" : std::string(w) + "_b";
    Tensor db = grad_buf(dev, dtype_, {d}, "dnorm_b");
    dev.layernorm_backward(dx, dw, db, dout, s.x, data_of(m, w), s.mean, s.rstd);
    accumulate_grad(dev, param_of(m, w), std::move(dw));
    accumulate_grad(dev, param_of(m, bname.c_str()), std::move(db));
    return dx;
  }
  // dx from rmsnorm_backward. The dw it writes beside (from the unrounded rows) is not autograd's
  // and is overwritten at once, in the buffer the weight's grad takes (no allocation autograd has
  // not): the weight's grad as autograd computes it for w * xn, the rows dout * xn (MulBackward's
  // product, an activation grad while the backward runs it), summed.
  dev.rmsnorm_backward(dx, dw, dout, s.x, data_of(m, w), s.rstd);
  Tensor rows = act(dev, dtype_, {N, d}, "dnorm_w_rows");
  dev.mul(rows, dout, s.xn);
  dev.sum_rows(dw, rows, false);
  rows = Tensor();
  // The weight's hook runs once w * xn's MulBackward has run (AccumulateGrad ahead of the rest of
  // the norm's nodes), which has freed its incoming grad and its saved xn by then. DeepSpeed's
  // ZeRO-2 allocates its grads partition in the first hook of the rank that owns it (the final
  // norm's on llama-tiny's rank 1): with these two and the LM head's saved input live there, the
  // engine's steps peak was 704 B over DeepSpeed's (ZC_DS_MEMORY_LOG: freed at the hook's moment).
  dout = Tensor();
  s.xn = Tensor();
  accumulate_grad(dev, param_of(m, w), std::move(dw));
  return dx;
}

Tensor Transformer::linear(Device& dev, Module& m, const char* w, const char* b, const Tensor& x,
                           std::int64_t out_features, const char* label) {
  Tensor y = act(dev, dtype_, {x.dim(0), out_features}, label);
  dev.matmul(y, x, data_of(m, w), false, true, false);
  if (spec_.bias && b != nullptr) dev.add_row_vector(y, data_of(m, b));
  return y;
}

Tensor Transformer::linear_backward(Device& dev, Module& m, const char* w, const char* b,
                                    const Tensor& dy, const Tensor& x, bool want_dx) {
  Parameter& pw = param_of(m, w);
  Tensor dx;
  if (want_dx) {
    dx = act(dev, dtype_, {dy.dim(0), x.dim(1)}, "dx");
    dev.matmul(dx, dy, pw.data, false, false, false);  // dx = dy W
  }
  Tensor dw = grad_buf(dev, dtype_, pw.shape, "dW");
  dev.matmul(dw, dy, x, true, false, false);  // dW = dy^T x
  Parameter* pb = spec_.bias && b != nullptr ? &param_of(m, b) : nullptr;
  Tensor db;
  if (pb != nullptr) {
    db = grad_buf(dev, dtype_, pb->shape, "db");
    dev.sum_rows(db, dy, false);
  }
  // Autograd hands each grad to AccumulateGrad, which keeps it as .grad without a copy, in
  // DeepSpeed's order (Note [Which autograd node hands a Linear its grads]).
  accumulate_linear_grads(dev, pw, std::move(dw), pb, std::move(db));
  return dx;
}

}  // namespace zc
