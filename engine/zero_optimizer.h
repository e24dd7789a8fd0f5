// ZeroOptimizer: what the Engine drives, in DeepSpeed's vocabulary (ZeROOptimizer): grad hooks,
// the backward-end reduction, step, zero_grad, and introspection for verifiers. Implementations:
// Zero12Optimizer (DeepSpeedZeroOptimizer, stages 1-2), Zero3Optimizer (stage 3) and
// DenseOptimizer (stage 0's FP16/BF16/fp32 optimizers, and the BF16_Optimizer wrapper DeepSpeed
// picks for ZeRO-1 + bf16 + fp32 grads). The Engine reaches every stage through this interface.
#pragma once

#include "engine/comm.h"
#include "engine/config.h"
#include "engine/deepcompile.h"
#include "engine/flat_layout.h"
#include "engine/known_bugs.h"
#include "engine/module.h"
#include "engine/offload.h"
#include "engine/optimizer.h"
#include "engine/torch_reductions.h"
#include "engine/trace.h"

#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace zc {

// Per-engine options: the environment and switches that are not ds_config keys.
struct Options {
  BugSet bugs;              // known bugs switched back on (SPEC 9)
  Trace* trace = nullptr;   // engine events go here when set
  bool pipeline = false;    // a PipelineModule (only its refusal paths are modelled)
  // MoE: the expert-parallel group (experts are spread over it) and the expert-data-parallel
  // group (replicas of the same experts, over which their grads are reduced). Both required
  // when the model has expert params.
  Comm* expert_parallel = nullptr;
  Comm* expert_data_parallel = nullptr;
  // Loads the DeepCompile runtime for compile() with a ZeRO backend (see deepcompile.h).
  RuntimeLoader* deepcompile_loader = nullptr;
  // The vector width of the DeepSpeed CPU Adam build being modelled (Note [DeepSpeed CPU Adam]):
  // 16 when DeepSpeed compiled it with -D__AVX512__, 8 with -D__AVX256__. The bits of every
  // element past the last multiple of it depend on it.
  int adam_simd_width = 16;
  // How torch roots a gradient norm tensor where the modelled DeepSpeed runs (Note [torch's f32
  // sqrt on a CPU]): correctly rounded (a GPU), or MKL's SSE kernel of the reference's CPU.
  TorchSqrt torch_sqrt = TorchSqrt::correctly_rounded;
  // The CPU side of ZeRO-Offload (DeepSpeedCPUAdam's memory), handed in by the environment: the
  // simulator gives each rank one (a meta device in meta mode). Null: the optimizer uses a host
  // device of its own.
  Device* cpu_device = nullptr;
};

// Which of the model's params an optimizer owns (DeepSpeed's param groups with their own
// process group: the dense params, or the MoE expert params).
enum class ParamSelect : std::uint8_t { all, dense, expert };

// DeepSpeedZeroOptimizer's predicate (stage_1_and_2.py, engine.py _configure_zero_optimizer):
// fp16 always, bf16 when bf16.check_grad_overflow (DeepSpeed's default: true), fp32 never. The
// other wrappers decide otherwise (StepPlan::overflow).
bool checks_grad_overflow(const Config& cfg);

// How a step tests the grads for inf/NaN (Note [Step sequence] (1)-(2)): not at all; on this rank
// only (the grads are the same on every rank); or this rank's test, then one all_reduce MAX of a
// one-byte flag over the group (DeepSpeed's ByteTensor / torch.uint8 overflow flag).
enum class OverflowCheck : std::uint8_t { none, local, all_reduce };

// The per-stage parameters of the step sequence (Note [Step sequence] in zero_optimizer.cpp).
// Each one models a difference between DeepSpeed's wrappers; every wrapper says which in its
// step_plan().
struct StepPlan {
  OverflowCheck overflow = OverflowCheck::none;
  // A norm that is not finite skips the step (stage_1_and_2.py step: `(dtype != bfloat16 or
  // check_grad_overflow) and is_invalid_grad_norm`).
  bool skip_on_invalid_norm = false;
  // The norm's local sum of squares is taken before the overflow all-reduce, not after the
  // decision.
  bool sum_sq_before_overflow = false;
  // The f32 copy of the grads that the base optimizer reads is made before the norm, not after.
  bool fp32_grads_before_norm = false;
  bool norm_partitioned = true;       // the norm is all-reduced over the group (global_norm)
  DType norm_dtype = DType::f32;      // that all-reduce's element and its root
  // The root is a torch op on a tensor (`.pow(1. / 2)`, `** (1. / 2)`), which on a CPU is MKL's
  // sqrt (Options::torch_sqrt), not Python's float arithmetic (`.item() ** (1. / 2)`).
  bool torch_root = false;
  DType combined_dtype = DType::f32;  // combined_unscale_factor's arithmetic
  // BF16_Optimizer (bf16_optimizer.py step): a norm that is not finite skips the step (whatever
  // check_grad_overflow says), and clipping multiplies by clip_tensors_by_global_norm's f32
  // coefficient (1 / (norm + 1e-6)) * clip (torch's __rtruediv__) when it is below 1, instead of
  // dividing by a combined scale.
  bool clip_by_coefficient = false;
  std::string_view fp32_grads_label;  // the f32 copy's allocation label
  bool operator==(const StepPlan&) const = default;
};

// One param group's grads for a step, from prepare_step.
struct StepPrep {
  Tensor grads{};           // [partition_numel] the grads the step reads, on *where
  Device* where = nullptr;  // the device holding them (the CPU space's under offload)
  double local_sum_sq = 0.0;  // this rank's partition, once the sequence has taken it
  Tensor grads32{};         // [partition_numel] f32 on *where, once the sequence has made it
  // grads are already the wrapper's fp32 copies (FP16_UnfusedOptimizer): grads32 is grads.
  bool grads_are_fp32_copies = false;
  // grads are made after the norm (flatten_grads): ZeRO-1/2 norms its per-param pieces first.
  bool flatten_later = false;
};

class ZeroOptimizer {
 public:
  ZeroOptimizer(const Config& cfg, Module& model, Device& dev, Comm& comm, const Options& opts,
                ParamSelect select = ParamSelect::all);
  virtual ~ZeroOptimizer() = default;

  virtual std::string_view name() const = 0;
  void set_gradient_accumulation_boundary(bool b) { boundary_ = b; }
  bool is_gradient_accumulation_boundary() const { return boundary_; }

  // forward() calls it first; ZeRO-3 counts micro steps here.
  virtual void clear_backward_seen_flag() {}
  // The per-parameter grad hook.
  virtual void on_grad_ready(Parameter& p) = 0;
  // The optimizer's part of Engine::allreduce_gradients (stage >= 2: epilogue every backward;
  // stage 1: reduce at the boundary; stage 0: bucketed all-reduce at the boundary).
  virtual void allreduce_gradients() = 0;
  virtual void backward_epilogue() {}
  // One optimizer step; false when skipped for overflow.
  virtual bool step() { return step_param_groups({this}); }
  // The step sequence, written once (Note [Step sequence]), over param groups that share one
  // overflow decision, one global norm and one loss scale (MoE: the dense group, then the expert
  // group). groups[0] leads: its group reduces the decision and the norm, and its loss scale
  // before the update is the one the grads carry. Every group has the same step_plan().
  static bool step_param_groups(const std::vector<ZeroOptimizer*>& groups);
  // DeepSpeed divides grads by the data-parallel world even for expert params, whose reduction
  // group is smaller (stage_1_and_2.average_tensor); set for the expert group's optimizer.
  void set_averaging_world(int w) { averaging_world_ = w; }
  // MoE: the expert group's optimizer uses the buffers DeepSpeed keeps once for every group
  // (Note [ZeRO-1/2 offload's staging buffers]); the first group's optimizer holds them.
  virtual void share_staging_from(ZeroOptimizer& /*first*/) {}
  const std::vector<Parameter*>& params() const { return params_; }
  Comm& comm() { return comm_; }
  virtual void zero_grad() = 0;

  // ---- coalesce_grad_reduction (SPEC 6) ----
  // Whether this wrapper can defer its reductions (DeepSpeed's BF16_Optimizer cannot).
  virtual bool supports_coalescing() const { return false; }
  // Engine::coalesce_grad_reduction's flag: while it is set, the grad hooks leave grads in .grad
  // and the reductions return at once. Set once on entry; cleared on exit before the flush
  // (Note [Flush order] in engine.cpp), and again after it (idempotent).
  void begin_coalescing();
  void end_coalescing() { coalescing_ = false; }
  bool coalescing() const { return coalescing_; }
  // The flush on exit: reduce every grad left in .grad, then run the partition epilogue. Only
  // called on a wrapper that supports_coalescing().
  virtual void flush_coalesced_reduction();

  // ZeRO-3: `module` also uses `p` (owned elsewhere), so its hooks gather and release it too.
  // Stages 0-2 hold every param whole: nothing to do.
  virtual void register_external_parameter(Module& module, Parameter& p);

  // ---- introspection ----
  // This rank's flat gradient partition per group ([partition_numel] accumulation dtype), as the
  // next step() will consume it; empty before the boundary.
  virtual std::vector<Tensor> averaged_gradients() = 0;
  // This rank's f32 master partition per group.
  virtual std::vector<Tensor> master_partitions() = 0;
  // Full averaged gradient in param order, as f64 values. A collective: every rank calls it.
  virtual std::vector<double> gathered_grads() = 0;
  // Every param's full value in param order, as f64 values, when this wrapper partitions the
  // params (ZeRO-3: a collective, every rank calls it); std::nullopt when each rank holds them
  // whole (stages 0-2: read them from the params).
  virtual std::optional<std::vector<double>> gathered_params() { return std::nullopt; }
  // Every param's full f32 `what` in param order, as f64 values: DeepSpeed's
  // safe_get_full_fp32_param / safe_get_full_optimizer_state, concatenated. Empty where the
  // optimizer keeps no such state (BaseOptimizer::state). A collective: every rank calls it.
  std::vector<double> gathered_state(OptimizerState what);
  int micro_step_id() const { return micro_step_id_; }
  double loss_scale() const { return scaler_.cur_scale(); }
  // The transfers between the device and the CPU side of offload so far; null without offload.
  virtual const OffloadStats* offload_stats() const { return nullptr; }

 protected:
  // ---- the per-stage pieces of step_param_groups (Note [Step sequence]) ----
  virtual StepPlan step_plan() const = 0;
  // The step's preconditions and bookkeeping, and the grads it reads.
  virtual StepPrep prepare_step() = 0;
  // After an overflow: drop this step's grads.
  virtual void skip_step() { zero_grad(); }
  // The base optimizer's step on `grads32` (already divided by the combined scale), the refresh
  // of the 16-bit params from the master, and the step's trace record.
  virtual void update(const Tensor& grads32, double norm, double combined) = 0;
  // After update() and once the step's fp32 grads are freed (stage3.py step: _release_sub_group,
  // then _post_step): ZeRO-3's re-gather of its persistent params.
  virtual void post_step() {}

  // This rank's sum of squares of `prep.grads` as the norm sees it before the root.
  virtual double norm_sum_sq(const StepPrep& prep) { return prep.where->sum_sq(prep.grads); }
  // get_grad_norm_direct's allocations on `dev` (stage_1_and_2.py:2648, stage3.py:2455; Note
  // [ZeRO-1/2's gradient norm, as DeepSpeed allocates it]): each piece copied into f64 for its
  // norm, its 0-dim norm appended to `norms` (the caller keeps the list as long as DeepSpeed
  // does), then the stack, its square and their sum. Returns the sum of the pieces' squares.
  static double sum_sq_by_piece_f64(Device& dev, std::span<const Tensor> pieces, std::vector<Tensor>& norms);
  // Whether this rank's grads hold an inf or a NaN (the overflow check's local test).
  virtual bool grads_have_inf_nan(const StepPrep& prep) { return prep.where->has_inf_nan(prep.grads); }
  // Makes prep.grads where prepare_step left them for later (StepPrep::flatten_later).
  virtual void flatten_grads(StepPrep&) {}
  virtual const BaseOptimizer& base_optimizer() const = 0;
  // `src`, this rank's f32 partition (on the device, or on the CPU side under offload), gathered
  // from every rank into param order.
  virtual std::vector<double> gather_f32_partition(const Tensor& src) = 0;
  // gather_f32_partition for a flat layout (stages 0-2): this rank's slice `part` of it, gathered
  // when the layout is partitioned over the group.
  std::vector<double> gather_flat_partition(const FlatLayout& layout, int part, bool partitioned,
                                            const Tensor& src);

  // True on every rank of this optimizer's group if any rank's `local` is true (all-reduce MAX).
  bool any_rank_overflow(bool local);
  // sqrt of the sum over ranks of each rank's sum of squares: one all-reduce SUM of a
  // `reduce_dtype` element and the root in that dtype, as DeepSpeed 0.19.8 does: f32 at stages 1/2
  // (get_grad_norm_direct's .float(), the offload path's FloatTensor) and at stage 3 under
  // offload_optimizer (FloatTensor), f64 at stage 3 otherwise (get_norm_dtype() is double on CPU
  // and CUDA). Unpartitioned: the root of the local sum in `reduce_dtype`, no collective. The root
  // is norm_root's.
  double global_norm(double local_sum_sq, bool partitioned, DType reduce_dtype = DType::f32,
                     bool torch_root = false);
  // Several param groups' norm as DeepSpeed's ZeRO-1/2 takes it with MoE (Note [MoE's gradient
  // norm]): one world all_reduce per group, one expert-data-parallel all_reduce per expert group.
  static double moe_global_norm(const std::vector<ZeroOptimizer*>& groups, const std::vector<StepPrep>& preps,
                                const StepPlan& plan);
  // A norm's root as DeepSpeed takes it: in `dtype` (f32 or f64), through torch on a tensor
  // (Options::torch_sqrt: Note [torch's f32 sqrt on a CPU]; f64: correctly rounded, MKL's dSqrt is
  // not modelled) or in Python floats (correctly rounded).
  double norm_root(double sum_sq, DType dtype, bool torch_root) const;
  // Note [The communication dtype]
  // DeepSpeed reduces every gradient buffer in its communication_data_type (Config::comm_dtype:
  // the config key, else the model's 16-bit dtype, else f32): a buffer of another dtype is cast to
  // it (`tensor.to(communication_data_type)`), scaled and reduced there, and cast back
  // (`tensor.copy_(tensor_to_allreduce)`): engine.py allreduce_bucket (stage 0, BF16_Optimizer's
  // fp32 grads), stage_1_and_2.py allreduce_bucket, gradient_reduction_w_predivide and
  // _add_to_grad_partition_buffer (the compact fp32 partition adds the comm-dtype result, not the
  // cast-back one), stage3.py __avg_scatter_grads (the grads cast before the pre-division, the
  // partitions cast to grad_accum_dtype after). Where each path scales relative to the cast is
  // the path's own: average_tensor with reduce_scatter divides the bucket in its own dtype first.
  // comm_image is `t` itself when it is in the comm dtype, else a cast copy in it.
  Tensor comm_image(const Tensor& t, std::string_view label);
  void record(std::string_view what);

  Config cfg_;
  Module& model_;
  Device& dev_;
  Comm& comm_;
  Options opts_;
  std::vector<Parameter*> params_;  // trainable params, in named_parameters() order
  DType dtype_;        // model dtype
  DType accum_dtype_;  // gradient accumulation dtype
  DType comm_dtype_;   // Note [The communication dtype]
  bool boundary_ = true;
  int averaging_world_;
  int micro_step_id_ = -1;  // DeepSpeed's INITIAL_MICRO_STEP_ID
  LossScaler scaler_;

 private:
  bool coalescing_ = false;
  Tensor fused_adam_buf_;  // Note [FusedAdam's buffer, before the wrapper]
};

std::unique_ptr<ZeroOptimizer> make_zero_optimizer(const Config& cfg, Module& model, Device& dev,
                                                   Comm& comm, const Options& opts,
                                                   ParamSelect select = ParamSelect::all);

}  // namespace zc
