// The Hugging Face Trainer's option names, in kebab case, for `zerocheck run` and `plan`: they
// resolve a ds_config's "auto" values as the integration resolves them from its TrainingArguments
// (engine/hf_auto.h).
#pragma once

#include "engine/hf_auto.h"

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace zc::cli {

struct HfCliArgs {
  std::optional<long long> per_device_train_batch_size, gradient_accumulation_steps, warmup_steps, max_steps;
  std::optional<double> max_grad_norm, learning_rate, adam_beta1, adam_beta2, adam_epsilon, weight_decay,
      warmup_ratio;
  bool fp16 = false, bf16 = false;
  std::string optimizer;  // --optimizer: a client optimizer (adam | adamw | sgd), engine/hf_auto.h
  std::optional<double> momentum;  // --momentum, for sgd
};

// Registers --gradient-accumulation-steps, --max-grad-norm, --learning-rate, --adam-beta1,
// --adam-beta2, --adam-epsilon, --weight-decay, --warmup-steps, --warmup-ratio, --max-steps, --fp16,
// --bf16, and (with_batch) --per-device-train-batch-size; each also in the Trainer's underscore
// spelling (--per_device_train_batch_size).
void add_hf_options(CLI::App* cmd, HfCliArgs& a, bool with_batch);

HfTrainingArgs training_args(const HfCliArgs& a, int world, std::optional<long long> hidden);

// Reads a ds_config file as DeepSpeed does (parse_ds_config_text: hjson as DeepSpeed's reader takes
// it, a key twice in one object refused).
nlohmann::json load_ds_config(const std::string& path);

// What a training script does around the ds_config: "auto" values resolved from the Trainer's
// options, then the client optimizer (--optimizer), or the Trainer's default optimizer for a
// Hugging Face config without an "optimizer" block. Notes (a replaced block, the Trainer's
// default) are appended to `notes`.
nlohmann::json as_training_script(nlohmann::json ds_config, const HfCliArgs& a, const HfTrainingArgs& t,
                                  std::vector<std::string>& notes);

}  // namespace zc::cli
