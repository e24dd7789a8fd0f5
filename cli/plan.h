// `zerocheck plan`: per-rank memory by category, the step's collectives and a predicted step time
// for a model at N ranks, from the engine itself in meta mode (plan/plan.h); --fit searches the
// stage, offload and micro-batch settings that fit a memory budget.
#pragma once

#include "cli/hf_options.h"

#include <optional>
#include <string>

namespace zc::cli {

struct PlanCliOptions {
  std::string config_path;
  std::string model = "llama-2-7b";
  std::string model_json;
  int world_size = 8;
  int gpus_per_node = 0;
  std::string gpu = "h100";
  std::string network;
  std::optional<long long> micro_batch, seq;
  int steps = 2;
  std::string attention = "materialised";
  bool gradient_checkpointing = false;  // Note [Gradient checkpointing] (models/transformer.h)
  bool activation_checkpointing = false;  // the same under deepspeed.checkpointing (the config's block)
  bool fit = false;                // --fit given, with or without a budget
  std::optional<double> fit_gib;   // --fit's budget in GiB; unset: the GPU's capacity
  std::string out;
  std::string hardware;
  bool json = false;
  bool no_deepspeed = false;
  std::string ranks = "auto";  // auto | all | representative
  std::string schedule = "auto";  // auto | decoupled | interleaved (Note [Decoupled schedule])
  std::string collectives = "auto";  // auto (NCCL's model where the node has graphs) | ring
  HfCliArgs hf;  // fill the config's "auto" values (the batch from --micro-batch, the buckets from the model)
};

// Exit status: 0 when the config fits (or --fit found a setting), 1 when it does not, 2 for an
// error (printed).
int run_plan_cli(const PlanCliOptions& o);

}  // namespace zc::cli
