// Scenario: one point of the configuration space the verifier explores, as plain data with a
// JSON round-trip (saved counterexamples are Scenario files). to_run_spec() turns it into the
// training run the invariants compare; exact_spec() sizes exact-domain data (SPEC 8) so every
// partial sum of the scenario's reductions fits the mantissa, for every model kind and dtype.
#pragma once

#include "engine/known_bugs.h"
#include "props/training_run.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace zc::props {

struct Scenario {
  int world = 2;
  int stage = 2;
  bool contiguous = true;
  bool overlap = false;
  std::int64_t reduce_bucket_size = 16;
  std::string dtype = "f32";             // f32 | f16 | bf16
  std::string grad_accum_dtype = "";     // "" = the model dtype, or "f32" (bf16 models only)
  std::string offload = "none";          // none | optimizer | param | both (param: stage 3)
  double clip = 0.0;                     // gradient_clipping (0 = off)
  int ga = 1;                            // gradient_accumulation_steps
  int n = 1;                             // backward chunks per micro-step
  int steps = 2;
  bool coalesce = false;                 // run each step's N backwards coalesced (GA 1)
  // synthetic: one param per entry, of that many elements. mlp: layer widths [in, h..., out],
  // ReLU between layers and a linear loss. tree: a random module tree's code (models/tree.h),
  // prescribed grads like Synthetic's, gathered node by node under ZeRO-3. gpt2-tiny, llama-tiny,
  // llama-gqa-tiny: those transformer presets (models/transformer.h), Hugging Face's eager blocks
  // on token ids; no shape ([]), and the gaussian domain only (softmax and norms are never exact).
  std::string model = "synthetic";
  std::vector<std::int64_t> shape{5, 3};
  // Transformers only: the decoder layers under activation checkpointing (Note [Gradient
  // checkpointing] in models/transformer.h). "" off; "torch": Hugging Face's
  // gradient_checkpointing_enable() (torch.utils.checkpoint, reentrant); "deepspeed":
  // deepspeed.checkpointing.checkpoint, configured by the ds_config's activation_checkpointing
  // block (its defaults); "deepspeed-partition": the same with partition_activations. Written to
  // the JSON only when set.
  std::string checkpointing;
  // MoE transformers only (mixtral-tiny, Note [MoE routing] in models/transformer.h): the config's
  // moe.ep_size, which DeepSpeed's MoE layer takes as its ep_size; experts over groups of that
  // many consecutive ranks; 1 (the default) for every other model.
  int ep_size = 1;
  std::vector<std::string> passes;       // compile passes; empty = no compile()
  bool deepcompile = true;               // compile's deepcompile flag (with passes)
  std::string domain = "exact";          // exact | gaussian
  std::uint64_t seed = 1;                // data and init
  std::uint64_t sched_seed = 1;          // the simulator's interleaving
  // An injected fault or misuse, applied after step 0 (deadlock: after the last step) by the
  // last rank (crash, mismatch, deadlock) or every rank (the API misuses):
  //   crash                the rank throws
  //   mismatch             the rank issues an all_reduce (f64, min) no other rank issues
  //   deadlock             the rank waits on an all_reduce after the others have finished
  //   step-in-coalesce     step() inside coalesce_grad_reduction()
  //   coalesce-in-no-sync  coalesce_grad_reduction() inside no_sync()
  //   stale-backward       backward() of an older forward's loss
  // or a simulator fault (Note [Injected faults]) on the last rank from the start:
  //   dropped-collective   its first collective is never issued
  //   slow-rank            its compute is charged 8x the cost model's time
  std::string fault;
  // Multi-backward form: "explicit" sets set_gradient_accumulation_boundary(false) before every
  // backward but the last of a step (DeepSpeed's formalised form); "implicit" leaves the boundary
  // to micro_steps and GA, so all N backwards of the last micro-step are at the boundary.
  std::string boundary = "explicit";
  // The optimizer block of the ds_config. "" = {"type": "Adam"} without params (DeepSpeed's
  // FusedAdam defaults, lr 1e-3, which zerocheck's match): a ds_config needs a block, since
  // DeepSpeed cannot train without one (Note [No optimizer] in engine/engine.cpp). "SGD" also
  // writes zero_allow_untested_optimizer, as DeepSpeed requires for ZeRO.
  std::string optimizer;                 // "" | Adam | AdamW | SGD
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;                 // SGD
  bool torch_adam = false;               // Adam/AdamW: torch's implementation instead of DeepSpeed's
  bool adam_w_mode = true;               // Adam: decoupled weight decay (DeepSpeed's default)
  bool check_grad_overflow = true;       // bf16.check_grad_overflow (DeepSpeed's default: true)
  // prescale_gradients and gradient_predivide_factor (Note [Stage 0 post-scaling]); written to the
  // ds_config and the JSON only when set. Not drawn by the generators.
  bool prescale = false;
  double predivide = 1.0;
  bool reduce_scatter = true;  // zero_optimization.reduce_scatter; written only when false
  // SGD writes zero_allow_untested_optimizer (DeepSpeed's ZeRO requires it); false leaves it out,
  // and both sides must then refuse ZeRO. Written to the JSON only when false; not drawn.
  bool allow_untested_optimizer = true;
  // More optimizer.params keys, merged into the ds_config's (DeepSpeed's refusals: max_grad_norm,
  // amsgrad, a key the chosen constructor does not take). Written to the JSON only when non-empty;
  // not drawn.
  nlohmann::json extra_optimizer_params = nlohmann::json::object();
  // communication_data_type: "" = not written (DeepSpeed's default, the model's 16-bit dtype or
  // f32), else f32 | f16 | bf16 (Note [The communication dtype]).
  std::string comm_dtype;
  // zero_optimization.round_robin_gradients (ZeRO-1/2 reorder their flat buffer); written when true.
  bool round_robin = false;
  // zero_optimization.use_multi_rank_bucket_allreduce; written when false (each owner's slices are
  // then reduced to it, one reduce per owner). Not drawn.
  bool multi_rank_bucket_allreduce = true;
  // zero_optimization.allgather_bucket_size; written only when >= 0. Not drawn.
  std::int64_t allgather_bucket_size = -1;
  // The engine-lifecycle state machine's command sequence (engine-lifecycle-state-machine).
  std::vector<std::string> commands;

  bool operator==(const Scenario&) const = default;
};

nlohmann::json to_json(const Scenario& s);
// Strict: an unknown key or a wrong type is a ConfigError naming it.
Scenario scenario_from_json(const nlohmann::json& j);
// One line: "z2 w4 n2 bf16 contiguous overlap bucket 16 synthetic[5,3] exact ...".
std::string describe(const Scenario& s);

// Every scenario's micro-batch per rank (to_run_spec); its global batch is this x world x GA.
inline constexpr std::int64_t kScenarioMicroBatch = 2;

DType dtype_of(const Scenario& s);
// The scenario's model is one of the transformer presets (Scenario::model).
bool is_transformer(const Scenario& s);
// A transformer preset with experts (mixtral-tiny).
bool is_moe(const Scenario& s);
// The DeepSpeed config the scenario trains with.
nlohmann::json ds_config(const Scenario& s);
// The exact-domain data spec for the scenario (scale and grad multiple).
ExactSpec exact_spec(const Scenario& s);
// "" when exact data exists for the scenario, else why not (the odd part of the divisors and
// the largest partial sum do not fit the dtype's mantissa together).
std::string exact_infeasible(const Scenario& s);

// The largest |integer| (in units of the data's smallest power of two) that exact data may reach in
// any partial sum of a reduction in `dtype`: every integer below 2^p is representable with p
// significand bits. exact_infeasible keeps generated scenarios within it, and the exact-domain
// proof (zerocheck prove) is over exactly this bound, so what is proved is what is generated.
constexpr std::int64_t exact_domain_max_integer(DType dtype) {
  return (std::int64_t{1} << dtype_mantissa_bits(dtype)) - 1;
}
// True when the model's gradient is exact at every step (it does not depend on the params):
// Synthetic, a module tree, and an MLP with one layer. Deeper MLPs are exact on their first step only.
bool grads_param_independent(const Scenario& s);

struct RunHooks {
  std::function<std::unique_ptr<RuntimeLoader>()> make_loader;  // for compile passes
};
RunSpec to_run_spec(const Scenario& s, const BugSet& bugs, const RunHooks& hooks);

// Maps an index into full_params()/full_grads() to "param_name[local_index]".
std::string element_name(const Scenario& s, std::int64_t flat_index);

}  // namespace zc::props
