// Config: DeepSpeed's ds_config.json keys (SPEC.md section 1) with DeepSpeed's defaults. A real
// user's file is accepted or rejected with an error naming the key and the reason; unknown keys
// are kept as warnings (`warnings`), as DeepSpeed logs them.
#pragma once

#include "engine/dtype.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zc {

enum class OptimizerType : std::uint8_t { adam, adamw, sgd };

// The ds_config "scheduler" block: DeepSpeed's WarmupLR and WarmupDecayLR (runtime/lr_schedules.py),
// the two the Hugging Face integration's configs use. The learning rate of each applied step is
// scheduled_lr() (engine/optimizer.h); other schedulers are refused.
enum class LrScheduleType : std::uint8_t { none, warmup, warmup_decay };

struct LrSchedule {
  LrScheduleType type = LrScheduleType::none;
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;  // unset: the optimizer's lr (WarmupLR's default; WarmupDecayLR's is 0.001)
  std::int64_t warmup_num_steps = 1000;
  bool linear = false;                  // warmup_type "linear"; "log" (the default) otherwise
  std::int64_t total_num_steps = 0;     // WarmupDecayLR
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::adam;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;  // DeepSpeed's Adam defaults to decoupled weight decay (AdamW)
  double momentum = 0.0;    // SGD
  double dampening = 0.0;
  bool nesterov = false;
  bool bias_correction = true;
  // optimizer.params.torch_adam: torch.optim.Adam/AdamW in place of DeepSpeed's FusedAdam (and in
  // place of DeepSpeedCPUAdam under offload, as DeepSpeed's get_optimizer_configuration decides).
  bool torch_adam = false;
  bool amsgrad = false;  // refused when true where DeepSpeed refuses it (check_optimizer_params)
  // Every key of optimizer.params as given: DeepSpeed passes them to the optimizer's constructor
  // as keyword arguments, so which are accepted depends on the implementation it picks.
  std::vector<std::string> param_keys;
  LrSchedule schedule;  // the top-level "scheduler" block
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
  bool check_grad_overflow = true;  // DeepSpeed's default; DeepSpeedZeroOptimizer only (StepPlan::overflow)
};

enum class OffloadDevice : std::uint8_t { none, cpu };

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool overlap_comm = false;  // DeepSpeed: true only for stage 3 unless set
  std::int64_t reduce_bucket_size = 500'000'000;
  std::int64_t allgather_bucket_size = 500'000'000;
  bool reduce_scatter = true;
  bool round_robin_gradients = false;
  bool parameter_alignment = false;  // refused when true at ZeRO-1/2 (check_combinations)
  bool use_multi_rank_bucket_allreduce = true;
  OffloadDevice offload_optimizer = OffloadDevice::none;
  OffloadDevice offload_param = OffloadDevice::none;
  std::int64_t stage3_param_persistence_threshold = 100'000;
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  std::int64_t stage3_max_live_parameters = 1'000'000'000;  // caps the prefetch (numel available)
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;   // keeps params used again within it
};

struct CompileSection {
  bool deepcompile = false;
  std::vector<std::string> passes;  // subset of {z1, z3, autosp, autotp}
};

// The "activation_checkpointing" block: deepspeed.checkpointing's settings
// (runtime/activation_checkpointing/config.py), which apply only where the model calls
// deepspeed.checkpointing.checkpoint (Note [Gradient checkpointing] in models/transformer.h).
struct ActivationCheckpointingConfig {
  bool given = false;  // the block is in the config
  bool partition_activations = false;
  bool contiguous_memory_optimization = false;  // needs partition_activations and number_checkpoints
  bool cpu_checkpointing = false;
  std::int64_t number_checkpoints = 0;  // 0: not given (DeepSpeed's None)
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct Config {
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;
  // Note [Stage 0 post-scaling]: the DenseOptimizer paths (stage 0, BF16_Optimizer) apply them as
  // DeepSpeed's allreduce_bucket does; ZeRO-2/3 with reduce_scatter refuse them as DeepSpeed does.
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  bool managed_gradient_accumulation = true;
  // ZeRO with an optimizer outside DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS (here: SGD) needs it
  // (engine.py _do_optimizer_sanity_check).
  bool zero_allow_untested_optimizer = false;
  // "communication_data_type", when set: DeepSpeed then reduces gradients in it (comm_dtype()).
  std::optional<DType> communication_data_type;
  OptimizerConfig optimizer;
  // False when the ds_config has no "optimizer" block (and no client optimizer is modelled):
  // DeepSpeed then cannot train (Note [No optimizer] in engine/engine.cpp), and `optimizer` only
  // holds the defaults. A Config built in code carries `optimizer` as if it were named.
  bool optimizer_given = true;
  Fp16Config fp16;
  Bf16Config bf16;
  std::optional<DType> grad_accum_dtype;  // data_types.grad_accum_dtype
  ZeroConfig zero;
  CompileSection compile;
  int sequence_parallel_size = 1;
  int autotp_size = 1;   // tensor_parallel.autotp_size
  int ep_size = 1;       // moe.ep_size
  int steps_per_print = 10;
  ActivationCheckpointingConfig activation_checkpointing;
  std::vector<std::string> warnings;  // unknown keys, ignored settings

  // Parses a ds_config object for `world_size` data-parallel ranks (batch sizes are checked and
  // derived as DeepSpeed does). Throws ConfigError or NotImplementedError naming the key.
  static Config from_json(const nlohmann::json& j, int world_size);
  static Config from_json_text(const std::string& text, int world_size);  // parse_ds_config_text's syntax
  static Config from_file(const std::string& path, int world_size);

  DType model_dtype() const;
  DType accumulation_dtype() const;  // grad_accum_dtype or the model dtype
  // engine.py communication_data_type: the key when set, else f16 for fp16, bf16 for bf16, f32.
  // Every gradient reduction casts its buffer to it, reduces there and casts back (Note [The
  // communication dtype] in engine/zero_optimizer.h).
  DType comm_dtype() const;
  // DeepSpeed's BF16_Optimizer wrapper: ZeRO-1 + bf16 + fp32 accumulation without offload
  // (engine.py _do_optimizer_sanity_check returns BFLOAT16), in place of DeepSpeedZeroOptimizer.
  bool uses_bf16_optimizer() const;
  bool zero_enabled() const { return zero.stage > 0; }
};

// A ds_config file's text as DeepSpeed reads it: hjson (engine/hjson.h, Note [DeepSpeed's hjson]),
// a key twice in one object refused as DeepSpeed refuses it. ConfigError naming the line and column.
nlohmann::json parse_ds_config_text(const std::string& text);

}  // namespace zc
