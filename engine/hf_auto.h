// "auto" values in ds_config files written for Hugging Face's DeepSpeed integration, resolved as
// transformers' HfTrainerDeepSpeedConfig resolves them from its TrainingArguments
// (trainer_config_process and trainer_config_finalize in transformers/integrations/deepspeed.py):
//
//   train_micro_batch_size_per_gpu   <- per_device_train_batch_size
//   gradient_accumulation_steps      <- gradient_accumulation_steps
//   train_batch_size                 <- world x per_device_train_batch_size x gradient_accumulation_steps
//   gradient_clipping                <- max_grad_norm
//   optimizer.params.lr / betas / eps / weight_decay <- learning_rate / [adam_beta1, adam_beta2] /
//                                       adam_epsilon / weight_decay
//   scheduler.params.warmup_min_lr   <- 0 (no option), warmup_max_lr <- learning_rate,
//   scheduler.params.total_num_steps <- the run's steps, warmup_num_steps <- warmup_steps, or
//                                       ceil(steps x warmup_ratio)
//   fp16.enabled / bf16.enabled      <- the --fp16 / --bf16 flags (absent: false, as HF defaults)
//   zero_optimization.reduce_bucket_size <- hidden x hidden; at stage 3 also
//   stage3_prefetch_bucket_size <- int(0.9 x hidden x hidden) and
//   stage3_param_persistence_threshold <- 10 x hidden (hidden: the model's hidden size)
//
// Where zerocheck differs, on purpose: an "auto" that changes memory or collectives (batch sizes,
// accumulation, the schedule's lengths) and that no given option fills is refused naming the key
// and the option (HF would take TrainingArguments' defaults silently; the value-only ones take
// them here too, each named in a note); a number that is not
// "auto" is checked only against an option the user gave (HF checks it against its defaults too),
// and every disagreement is listed in one ConfigError, as HF lists them. An "auto" anywhere else
// (a key the integration does not fill) is refused naming the key.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zc {

struct HfTrainingArgs {
  int world_size = 1;
  std::optional<std::int64_t> per_device_train_batch_size;
  std::optional<std::int64_t> gradient_accumulation_steps;
  std::optional<double> max_grad_norm;
  std::optional<double> learning_rate;
  std::optional<double> adam_beta1;
  std::optional<double> adam_beta2;
  std::optional<double> adam_epsilon;
  std::optional<double> weight_decay;
  std::optional<std::int64_t> warmup_steps;
  std::optional<double> warmup_ratio;
  std::optional<std::int64_t> num_training_steps;  // the training run's optimizer steps (--max-steps), not the simulated ones
  bool fp16 = false;  // --fp16 was given
  bool bf16 = false;  // --bf16 was given
  std::optional<std::int64_t> hidden_size;  // the model's, for the bucket sizes
};

// The config with every "auto" replaced; ConfigError listing every mismatch, or naming the first
// unfillable "auto" key and the option that fills it. The values that change neither memory nor
// collectives (learning rate, betas, eps, weight decay, gradient_clipping, warmup_max_lr) take
// TrainingArguments' defaults when their option is not given, as the Trainer's do; each such
// default is a line in `notes`.
nlohmann::json resolve_hf_auto(nlohmann::json ds_config, const HfTrainingArgs& args,
                               std::vector<std::string>* notes = nullptr);

// Whether the config holds an "auto" anywhere: a config written for the Hugging Face integration.
bool has_hf_auto(const nlohmann::json& ds_config);

// A client optimizer: what a training script passes to deepspeed.initialize(optimizer=...), a
// torch.optim class built with these arguments (unset: torch's own defaults).
struct ClientOptimizer {
  std::string type;  // "adam" | "adamw" | "sgd" (torch.optim.Adam, AdamW, SGD)
  std::optional<double> lr, beta1, beta2, eps, weight_decay, momentum;
  std::string origin;  // for messages: "--optimizer adamw", "the Hugging Face Trainer's default"
};
// The Trainer's optimizer when the ds_config has none (TrainingArguments' defaults: optim
// "adamw_torch", learning_rate 5e-5, adam_beta1 0.9, adam_beta2 0.999, adam_epsilon 1e-8,
// weight_decay 0), with the Trainer options the user gave.
ClientOptimizer trainer_default_optimizer(const HfTrainingArgs& args);
// The config as DeepSpeed 0.19.8 trains it with that client optimizer (engine.py
// _configure_optimizer): the client optimizer takes the place of a config "optimizer" block (a
// warning says so), torch's arithmetic (torch_adam); under ZeRO-Offload DeepSpeed refuses a client
// optimizer that is not DeepSpeedCPUAdam unless "zero_force_ds_cpu_optimizer" is false (its
// ZeRORuntimeException, as a ConfigError); SGD under ZeRO needs zero_allow_untested_optimizer, as
// from the config. ConfigError for an unknown type.
nlohmann::json with_client_optimizer(nlohmann::json ds_config, const ClientOptimizer& client,
                                     std::vector<std::string>& warnings);

}  // namespace zc
