// resolve_hf_auto (engine/hf_auto.h).
#include "engine/hf_auto.h"

#include "engine/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <sstream>
#include <vector>

namespace zc {

namespace {

using json = nlohmann::json;

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Python's == for the values the integration compares: numbers by value (1 == 1.0), lists
// element-wise, everything else as JSON.
bool same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!same(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

class Resolver {
 public:
  explicit Resolver(json& config) : config_(config) {}

  // The node at a dotted key, or nullptr if any part is missing (then the key is left alone).
  json* find(const std::string& key) {
    json* node = &config_;
    std::stringstream parts(key);
    std::string part;
    while (std::getline(parts, part, '.')) {
      if (!node->is_object() || !node->contains(part)) return nullptr;
      node = &(*node)[part];
    }
    return node;
  }

  // HF's fill_match: "auto" takes `value` (or is unfillable without it); any other value is
  // checked against `value` when `check` (the user gave the option).
  void fill(const std::string& key, const std::optional<json>& value, const std::string& option, bool check = true) {
    json* node = find(key);
    if (node == nullptr) return;
    if (is_auto(*node)) {
      if (value) {
        *node = *value;
      } else {
        unfilled_.push_back(fmt::format("'{}' is \"auto\": give {}", key, option));
        *node = nullptr;  // reported once, here, not again as a leftover
      }
      return;
    }
    if (check && value && !node->is_null() && !same(*node, *value)) {
      mismatches_.push_back(fmt::format("- ds {}={} vs {}={}", key, node->dump(), option, value->dump()));
    }
  }

  // An "auto" whose option was not given takes TrainingArguments' default, as the Trainer's does,
  // for the values that change neither memory nor collectives (learning rate, betas, eps, weight
  // decay, clipping's threshold); a note names each default taken.
  void fill_or_default(const std::string& key, const std::optional<json>& value, const json& trainer_default,
                       const std::string& option) {
    json* node = find(key);
    if (node != nullptr && is_auto(*node) && !value) {
      *node = trainer_default;
      defaults_.push_back(fmt::format("'{}' \"auto\" <- {} (TrainingArguments' default; {} sets it)", key,
                                      trainer_default.dump(), option));
      return;
    }
    fill(key, value, option);
  }
  const std::vector<std::string>& defaults() const { return defaults_; }

  // Any "auto" the integration does not fill.
  void leftovers(const json& node, const std::string& path) {
    if (is_auto(node)) unfilled_.push_back(fmt::format("'{}' is \"auto\", which the Hugging Face integration does "
                                                       "not fill either: give it a value", path));
    if (!node.is_object()) return;
    for (auto it = node.begin(); it != node.end(); ++it) {
      leftovers(it.value(), path.empty() ? it.key() : path + "." + it.key());
    }
  }

  void finish() {
    std::vector<std::string> parts;
    if (!mismatches_.empty()) {
      parts.push_back(fmt::format("these ds_config values disagree with the command line:\n{}\nset them to \"auto\" "
                                  "or drop the option", fmt::join(mismatches_, "\n")));
    }
    for (const std::string& u : unfilled_) parts.push_back(u);
    if (!parts.empty()) throw ConfigError(fmt::format("{}", fmt::join(parts, "\n")));
  }

 private:
  json& config_;
  std::vector<std::string> mismatches_;
  std::vector<std::string> unfilled_;
  std::vector<std::string> defaults_;
};

template <class T>
std::optional<json> opt(const std::optional<T>& v) {
  if (!v) return std::nullopt;
  return json(*v);
}

void fill_batch_and_optimizer(Resolver& r, const HfTrainingArgs& a) {
  r.fill("train_micro_batch_size_per_gpu", opt(a.per_device_train_batch_size), "--per-device-train-batch-size");
  r.fill("gradient_accumulation_steps", opt(a.gradient_accumulation_steps), "--gradient-accumulation-steps");
  std::optional<json> tbs;
  if (a.per_device_train_batch_size && a.gradient_accumulation_steps) {
    tbs = json(a.world_size * *a.per_device_train_batch_size * *a.gradient_accumulation_steps);
  }
  r.fill("train_batch_size", tbs, "--per-device-train-batch-size and --gradient-accumulation-steps (x world size)");
  r.fill_or_default("gradient_clipping", opt(a.max_grad_norm), json(1.0), "--max-grad-norm");
  r.fill_or_default("optimizer.params.lr", opt(a.learning_rate), json(5e-5), "--learning-rate");
  std::optional<json> betas;
  if (a.adam_beta1 || a.adam_beta2) betas = json::array({a.adam_beta1.value_or(0.9), a.adam_beta2.value_or(0.999)});
  r.fill_or_default("optimizer.params.betas", betas, json::array({0.9, 0.999}), "--adam-beta1 and --adam-beta2");
  r.fill_or_default("optimizer.params.eps", opt(a.adam_epsilon), json(1e-8), "--adam-epsilon");
  r.fill_or_default("optimizer.params.weight_decay", opt(a.weight_decay), json(0.0), "--weight-decay");
}

void fill_scheduler(Resolver& r, const HfTrainingArgs& a) {
  r.fill("scheduler.params.warmup_min_lr", json(0), "", /*check=*/false);  // not a trainer argument
  r.fill_or_default("scheduler.params.warmup_max_lr", opt(a.learning_rate), json(5e-5), "--learning-rate");
  r.fill("scheduler.params.total_num_steps", opt(a.num_training_steps), "--max-steps");
  std::optional<json> warmup;
  if (a.warmup_steps && *a.warmup_steps > 0) {
    warmup = json(*a.warmup_steps);
  } else if (a.warmup_ratio && a.num_training_steps) {
    warmup = json(static_cast<std::int64_t>(std::ceil(static_cast<double>(*a.num_training_steps) * *a.warmup_ratio)));
  } else if (a.warmup_steps) {
    warmup = json(0);
  }
  r.fill("scheduler.params.warmup_num_steps", warmup, "--warmup-steps (or --warmup-ratio with --max-steps)");
}

void fill_precision_and_buckets(Resolver& r, const HfTrainingArgs& a) {
  // A flag is always a value for "auto" (absent = false, TrainingArguments' default) and is
  // checked against an explicit setting only when given.
  r.fill("fp16.enabled", json(a.fp16), "--fp16", a.fp16);
  r.fill("bf16.enabled", json(a.bf16), "--bf16", a.bf16);
  std::optional<json> rbs, prefetch, persistence;
  if (a.hidden_size) {
    const std::int64_t h = *a.hidden_size;
    rbs = json(h * h);
    // Python's int(0.9 * hidden_size * hidden_size): (0.9 * h) * h, left to right.
    prefetch = json(static_cast<std::int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h)));
    persistence = json(10 * h);
  }
  // fill_only: HF never checks these against the model. At stages below 3 HF leaves the stage3_*
  // keys "auto" (DeepSpeed never reads them there); zerocheck fills them, where they do nothing.
  r.fill("zero_optimization.reduce_bucket_size", rbs, "--hidden (the model's hidden size)", false);
  r.fill("zero_optimization.stage3_prefetch_bucket_size", prefetch, "--hidden (the model's hidden size)", false);
  r.fill("zero_optimization.stage3_param_persistence_threshold", persistence, "--hidden (the model's hidden size)",
         false);
}

}  // namespace

json resolve_hf_auto(json ds_config, const HfTrainingArgs& args, std::vector<std::string>* notes) {
  if (!ds_config.is_object()) throw ConfigError(fmt::format("ds_config must be an object, got {}", ds_config.type_name()));
  Resolver r(ds_config);
  fill_batch_and_optimizer(r, args);
  fill_scheduler(r, args);
  fill_precision_and_buckets(r, args);
  r.leftovers(ds_config, "");
  r.finish();
  if (notes != nullptr) notes->insert(notes->end(), r.defaults().begin(), r.defaults().end());
  return ds_config;
}

bool has_hf_auto(const json& j) {
  if (j.is_string()) return j.get<std::string>() == "auto";
  if (j.is_object() || j.is_array()) {
    for (const json& v : j) {
      if (has_hf_auto(v)) return true;
    }
  }
  return false;
}

ClientOptimizer trainer_default_optimizer(const HfTrainingArgs& a) {
  ClientOptimizer c;
  c.type = "adamw";
  c.lr = a.learning_rate.value_or(5e-5);
  c.beta1 = a.adam_beta1.value_or(0.9);
  c.beta2 = a.adam_beta2.value_or(0.999);
  c.eps = a.adam_epsilon.value_or(1e-8);
  c.weight_decay = a.weight_decay.value_or(0.0);
  c.origin = "the Hugging Face Trainer's default optimizer (torch.optim.AdamW, optim \"adamw_torch\")";
  return c;
}

json with_client_optimizer(json cfg, const ClientOptimizer& c, std::vector<std::string>& warnings) {
  if (!cfg.is_object()) throw ConfigError(fmt::format("ds_config must be an object, got {}", cfg.type_name()));
  json params = json::object();
  if (c.type == "adam" || c.type == "adamw") {
    params["torch_adam"] = true;  // torch.optim.Adam / AdamW, not DeepSpeed's FusedAdam
    params["adam_w_mode"] = c.type == "adamw";
    if (c.beta1 || c.beta2) params["betas"] = json::array({c.beta1.value_or(0.9), c.beta2.value_or(0.999)});
    if (c.eps) params["eps"] = *c.eps;
    // torch.optim.AdamW's own default weight_decay is 0.01, Adam's 0.
    params["weight_decay"] = c.weight_decay.value_or(c.type == "adamw" ? 0.01 : 0.0);
  } else if (c.type == "sgd") {
    if (c.momentum) params["momentum"] = *c.momentum;
    if (c.weight_decay) params["weight_decay"] = *c.weight_decay;
  } else {
    throw ConfigError(fmt::format("{}: '{}' is not a client optimizer zerocheck models: use adam, adamw or sgd "
                                  "(torch.optim.Adam, AdamW, SGD)", c.origin, c.type));
  }
  if (c.type == "sgd" && !c.lr) {
    throw ConfigError(fmt::format("{}: torch.optim.SGD needs a learning rate: give --learning-rate", c.origin));
  }
  params["lr"] = c.lr.value_or(1e-3);  // torch.optim.Adam / AdamW's default
  const json* zero = cfg.contains("zero_optimization") ? &cfg["zero_optimization"] : nullptr;
  const bool offload = zero != nullptr && zero->is_object() && zero->value("stage", 0) > 0 &&
                       zero->contains("offload_optimizer") && (*zero)["offload_optimizer"].is_object() &&
                       (*zero)["offload_optimizer"].value("device", "none") == "cpu";
  if (offload && cfg.value("zero_force_ds_cpu_optimizer", true)) {
    throw ConfigError(fmt::format(
        "{}: you are using ZeRO-Offload with a client provided optimizer (torch.optim.{}), which DeepSpeed 0.19.8 "
        "refuses (ZeRORuntimeException, runtime/engine.py _configure_optimizer): use DeepSpeedCPUAdam through an "
        "\"optimizer\" block in the ds_config, or set \"zero_force_ds_cpu_optimizer\": false",
        c.origin, c.type == "adamw" ? "AdamW" : c.type == "adam" ? "Adam" : "SGD"));
  }
  if (cfg.contains("optimizer")) {
    warnings.push_back(fmt::format("the ds_config's \"optimizer\" block is ignored: {} takes its place, as DeepSpeed's "
                                   "client optimizer does (runtime/engine.py _configure_optimizer)", c.origin));
  }
  cfg["optimizer"] = {{"type", c.type == "sgd" ? "SGD" : c.type == "adamw" ? "AdamW" : "Adam"}, {"params", params}};
  return cfg;
}

}  // namespace zc
