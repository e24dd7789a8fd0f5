// add_hf_options and training_args (cli/hf_options.h).
#include "cli/hf_options.h"

#include "engine/config.h"
#include "engine/errors.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace zc::cli {

void add_hf_options(CLI::App* cmd, HfCliArgs& a, bool with_batch) {
  const char* g = "Hugging Face Trainer arguments (fill \"auto\" in --config; a given one must agree with it)";
  if (with_batch) {
    cmd->add_option("--per-device-train-batch-size,--per_device_train_batch_size,--micro-batch", a.per_device_train_batch_size,
                    "train_micro_batch_size_per_gpu")->group(g)->check(CLI::Range(1LL, 1LL << 20));
  }
  cmd->add_option("--gradient-accumulation-steps,--gradient_accumulation_steps", a.gradient_accumulation_steps, "gradient_accumulation_steps")
      ->group(g)->check(CLI::Range(1LL, 1LL << 20));
  cmd->add_option("--max-grad-norm,--max_grad_norm", a.max_grad_norm, "gradient_clipping")->group(g)->check(CLI::NonNegativeNumber);
  cmd->add_option("--learning-rate,--learning_rate", a.learning_rate, "optimizer.params.lr and scheduler.params.warmup_max_lr")
      ->group(g)->check(CLI::NonNegativeNumber);
  cmd->add_option("--adam-beta1,--adam_beta1", a.adam_beta1, "optimizer.params.betas[0]")->group(g)->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--adam-beta2,--adam_beta2", a.adam_beta2, "optimizer.params.betas[1]")->group(g)->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--adam-epsilon,--adam_epsilon", a.adam_epsilon, "optimizer.params.eps")->group(g)->check(CLI::PositiveNumber);
  cmd->add_option("--weight-decay,--weight_decay", a.weight_decay, "optimizer.params.weight_decay")->group(g)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--warmup-steps,--warmup_steps", a.warmup_steps, "scheduler.params.warmup_num_steps")->group(g)
      ->check(CLI::Range(0LL, 1LL << 40));
  cmd->add_option("--warmup-ratio,--warmup_ratio", a.warmup_ratio,
                  "warmup_num_steps = ceil(max-steps x ratio) when --warmup-steps is 0")->group(g)->check(CLI::Range(0.0, 1.0));
  // The training length, as the Trainer's max_steps: it fills scheduler.params.total_num_steps. The
  // simulated --steps are a few steps of that run, never its length.
  cmd->add_option("--max-steps,--max_steps", a.max_steps, "scheduler.params.total_num_steps (the training run's "
                  "optimizer steps; --steps only says how many of them zerocheck simulates)")
      ->group(g)->check(CLI::Range(1LL, 1LL << 40));
  cmd->add_option("--optimizer", a.optimizer, "A client optimizer, as a script passes to deepspeed.initialize: adam | "
                  "adamw | sgd (torch.optim; --learning-rate, --adam-beta1/2, --adam-epsilon, --weight-decay, "
                  "--momentum set it); it takes the place of the config's optimizer block, as in DeepSpeed")
      ->group(g)->check(CLI::IsMember({"adam", "adamw", "sgd"}));
  cmd->add_option("--momentum", a.momentum, "torch.optim.SGD's momentum (--optimizer sgd)")->group(g)
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--fp16", a.fp16, "fp16.enabled (absent: false for \"auto\")")->group(g);
  cmd->add_flag("--bf16", a.bf16, "bf16.enabled (absent: false for \"auto\")")->group(g);
}

HfTrainingArgs training_args(const HfCliArgs& a, int world, std::optional<long long> hidden) {
  HfTrainingArgs t;
  t.world_size = world;
  t.per_device_train_batch_size = a.per_device_train_batch_size;
  t.gradient_accumulation_steps = a.gradient_accumulation_steps;
  t.max_grad_norm = a.max_grad_norm;
  t.learning_rate = a.learning_rate;
  t.adam_beta1 = a.adam_beta1;
  t.adam_beta2 = a.adam_beta2;
  t.adam_epsilon = a.adam_epsilon;
  t.weight_decay = a.weight_decay;
  t.warmup_steps = a.warmup_steps;
  t.warmup_ratio = a.warmup_ratio;
  t.num_training_steps = a.max_steps;
  t.hidden_size = hidden;
  t.fp16 = a.fp16;
  t.bf16 = a.bf16;
  return t;
}

nlohmann::json load_ds_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot read --config '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_ds_config_text(ss.str());
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("--config '{}': {}", path, e.what()));
  }
}

nlohmann::json as_training_script(nlohmann::json cfg, const HfCliArgs& a, const HfTrainingArgs& t,
                                  std::vector<std::string>& notes) {
  const bool hf = has_hf_auto(cfg);
  cfg = resolve_hf_auto(std::move(cfg), t, &notes);
  if (!a.optimizer.empty()) {
    ClientOptimizer c{a.optimizer, t.learning_rate, t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.weight_decay,
                      a.momentum, "--optimizer " + a.optimizer};
    return with_client_optimizer(std::move(cfg), c, notes);
  }
  if (hf && cfg.is_object() && !cfg.contains("optimizer")) {
    const ClientOptimizer c = trainer_default_optimizer(t);
    notes.push_back(fmt::format("the ds_config has no \"optimizer\" block and is a Hugging Face config: training with "
                                "{}, lr {}", c.origin, *c.lr));
    return with_client_optimizer(std::move(cfg), c, notes);
  }
  return cfg;
}

}  // namespace zc::cli
