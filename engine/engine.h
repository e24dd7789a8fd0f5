// Engine: DeepSpeed's engine API over a (Device&, Comm&) pair (DESIGN.md "Engine"): forward,
// backward, step, zero_grad, the accumulation boundary, no_sync, and introspection for verifiers.
// Follows SPEC 2: backward = prologue, the model's backward (grad hooks fire), epilogue.
#pragma once

#include "engine/decisions.h"
#include "engine/model.h"
#include "engine/zero_optimizer.h"

#include <exception>
#include <memory>
#include <optional>

namespace zc {

class Engine {
 public:
  // The model's params must be allocated on `dev`; they are broadcast from rank 0 (as DeepSpeed's
  // _broadcast_model does) and then flattened by the optimizer.
  Engine(Config cfg, Model& model, Device& dev, Comm& comm, Options opts = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  struct Loss {
    double value = 0.0;
    std::int64_t forward_id = -1;
  };
  Loss forward(const Batch& batch);
  void backward(const Loss& loss);
  void step();
  void zero_grad();
  void set_gradient_accumulation_boundary(bool is_boundary);
  bool is_gradient_accumulation_boundary() const;

  // Runs body with gradient reduction disabled (DeepSpeed's no_sync context): an error for
  // stage >= 2 and on reentry; the flag is cleared when body returns or throws.
  template <class Body>
  void no_sync(Body&& body) {
    enter_no_sync();
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    inside_no_sync_ = false;
    if (error) std::rethrow_exception(error);
  }

  // Defers ZeRO 1/2/3 gradient reduction across every backward() in body and flushes once on
  // exit (SPEC 6): one with-block is one optimizer step. Errors, in order: stage 0
  // (NotImplementedError); pipeline; an optimizer wrapper that cannot coalesce
  // (NotImplementedError); nesting inside no_sync. (Unmanaged accumulation, DeepSpeed's first
  // check, never reaches here: the config refuses it.) On exit, also when body throws: the
  // coalescing flag is cleared first, then no_sync; the boundary is forced true for the flush;
  // the saved boundary is restored; then body's exception propagates.
  template <class Body>
  void coalesce_grad_reduction(Body&& body) {
    const std::optional<bool> saved = enter_coalesce();
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();  // flush outside the handler: Note [No yield inside catch]
    }
    exit_coalesce(saved);
    if (error) std::rethrow_exception(error);
  }
  bool coalescing() const { return optimizers_[0]->coalescing(); }
  // micro_step_id as the last coalesce flush saw it (I2: 0 for ZeRO-3), -1 before any flush.
  int last_flush_micro_step_id() const { return last_flush_micro_step_id_; }

  // DeepSpeed's engine.compile(): selects the DeepCompile backend from the passes and the stage
  // (SPEC 3, decide:: templates); only a ZeRO backend loads the runtime and calls init().
  // autotp with another pass is NotImplementedError; autotp needs tensor_parallel.autotp_size > 1.
  // AutoSP / AutoTP: the model is constructed parallel (models/tinyllama.h) and compile() checks
  // its ModelParallelism against the selected pass, a ConfigError on a mismatch; a model with
  // nothing for the pass to rewrite is left as it is (Note [Parallel passes] in engine.cpp).
  void compile(const CompileConfig& cc);
  // DeepSpeed's destroy(): runtime cleanup if the runtime was initialised (KnownBug::B2: if
  // DeepCompile is active). The engine refuses further work afterwards.
  void destroy();
  bool deepcompile_active() const { return deepcompile_active_; }

  // ---- introspection ----
  std::int64_t micro_steps() const { return micro_steps_; }
  std::int64_t global_steps() const { return global_steps_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }
  int micro_step_id() const { return optimizers_[0]->micro_step_id(); }
  double loss_scale() const { return optimizers_[0]->loss_scale(); }
  // Per param group (dense, then MoE experts when present).
  std::vector<Tensor> averaged_gradients();
  std::vector<Tensor> master_partitions();
  // Every param's full value, in named_parameters() order. Local for stages 0-2, which keep full
  // params; a collective for stage 3 (every rank must call it). With MoE: the dense params in
  // model order, then every expert in global expert order (gathered over the expert-parallel
  // group), so runs with different ep_size compare directly.
  std::vector<double> full_params();
  // The full averaged gradient after the boundary. A collective: every rank must call it.
  // Inside coalesce_grad_reduction it is this rank's unreduced local grad, and local.
  std::vector<double> full_grads();
  // Every param's full f32 master or optimizer state (DeepSpeed's safe_get_full_fp32_param and
  // safe_get_full_optimizer_state), ordered as full_params(); empty where the optimizer keeps no
  // such state. A collective: every rank must call it.
  std::vector<double> full_optimizer_state(OptimizerState what);
  const CommStats& comm_stats() const { return comm_.stats(); }
  Comm& comm() { return comm_; }  // the data-parallel (world) group
  ZeroOptimizer& optimizer() { return *optimizers_[0]; }  // the dense (or only) param group
  Model& model() { return model_; }
  Device& device() { return dev_; }
  // ZeRO-3: `module` also uses `p` (owned elsewhere), so its hooks gather and release it too.
  // A no-op for stages 0-2, whose params are always whole.
  void register_external_parameter(Module& module, Parameter& p);
  const Config& config() const { return cfg_; }
  const Options& options() const { return opts_; }
  bool inside_no_sync() const { return inside_no_sync_; }

 private:
  void check_parallel_layout(const decide::CompileFacts<bool, std::int64_t>& f);
  void enter_no_sync();
  void check_usable(const char* call) const;
  // Where DeepSpeed fails without an optimizer block (Note [No optimizer] in engine.cpp).
  enum class Call : std::uint8_t { initialize, backward, step };
  void check_optimizer_given(Call call) const;
  bool runs_deepcompile_hooks() const;
  DeepCompileRuntime& runtime();
  std::optional<bool> enter_coalesce();
  void exit_coalesce(std::optional<bool> saved_boundary);
  void flush_coalesced_reduction();
  void backward_prologue();
  // The 0-dim gradients of the loss's scaling and division, to the model's loss's (Note [The
  // loss's 0-dim gradients]). scaled: a ZeRO optimizer scaled the loss.
  Tensor loss_grads(bool scaled);
  void backward_epilogue();
  void allreduce_gradients();
  void broadcast_model();
  void record(std::string_view what);

  Config cfg_;
  Model& model_;
  Device& dev_;
  Comm& comm_;
  Options opts_;
  // [0]: the dense params (all params without MoE); [1]: MoE expert params, reduced over the
  // expert-data-parallel group. They share the boundary, overflow decision, norm and loss scale.
  std::vector<std::unique_ptr<ZeroOptimizer>> optimizers_;
  ZeroOptimizer* optimizer_of(const Parameter& p);
  std::vector<double> append_experts(std::vector<double> dense, std::vector<double> local_experts);
  std::int64_t micro_steps_ = 0;
  std::int64_t global_steps_ = 0;
  std::int64_t skipped_steps_ = 0;
  std::int64_t forward_id_ = -1;
  Tensor loss_;  // the loss tensor the user's forward returned: 0-dim, until its backward has run
  std::optional<bool> boundary_override_;  // set_gradient_accumulation_boundary
  bool inside_no_sync_ = false;
  bool enable_backward_allreduce_ = true;
  bool deepcompile_active_ = false;         // set by compile()
  bool parallelization_pass_only_ = false;
  bool compiled_ = false;
  decide::CompileFacts<bool, std::int64_t> compile_facts_{};
  int last_flush_micro_step_id_ = -1;
  std::string broken_;  // why the engine refuses further work ("" while usable)
};

}  // namespace zc
