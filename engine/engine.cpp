// Engine: forward / backward / step in DeepSpeed's order (SPEC 2).
#include "engine/engine.h"

#include "engine/decisions.h"
#include "engine/errors.h"
#include "engine/zero12_optimizer.h"
#include "engine/zero3_optimizer.h"

namespace zc {

Engine::Engine(Config cfg, Model& model, Device& dev, Comm& comm, Options opts)
    : cfg_(std::move(cfg)), model_(model), dev_(dev), comm_(comm), opts_(opts) {
  for (Parameter* p : model_.named_parameters()) {
    if (!p->data.defined()) {
      throw UsageError(fmt::format("param '{}' has no data: call the model's init_params() first", p->name));
    }
    if (p->dtype != cfg_.model_dtype()) {
      throw UsageError(fmt::format("param '{}' is {} but the config trains in {}: initialise the "
                                   "model in the config's dtype", p->name, dtype_name(p->dtype),
                                   dtype_name(cfg_.model_dtype())));
    }
  }
  broadcast_model();
  optimizer_ = make_zero_optimizer(cfg_, model_, dev_, comm_, opts_);
  model_.set_grad_ready_hook([this](Parameter& p) { optimizer_->on_grad_ready(p); });
  record(fmt::format("engine init: stage {} dtype {} GA {} world {} optimizer {}", cfg_.zero.stage,
                     dtype_name(cfg_.model_dtype()), cfg_.gradient_accumulation_steps,
                     comm_.size(), optimizer_->name()));
}

Engine::~Engine() { model_.set_grad_ready_hook(nullptr); }

void Engine::broadcast_model() {
  for (Parameter* p : model_.named_parameters()) comm_.broadcast(p->data, {.root = 0});
}

void Engine::record(std::string_view what) {
  if (opts_.trace != nullptr) opts_.trace->record("engine", what);
}

bool Engine::is_gradient_accumulation_boundary() const {
  if (boundary_override_) return *boundary_override_;
  return (micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0;
}

void Engine::set_gradient_accumulation_boundary(bool is_boundary) {
  boundary_override_ = is_boundary;
  optimizer_->set_gradient_accumulation_boundary(is_boundary);
}

Engine::Loss Engine::forward(const Batch& batch) {
  optimizer_->clear_backward_seen_flag();
  const double loss = model_.forward(dev_, batch);
  ++forward_id_;
  record(fmt::format("forward {} loss {:.9g}", forward_id_, loss));
  return Loss{loss, forward_id_};
}

void Engine::backward(const Loss& loss) {
  if (loss.forward_id != forward_id_ || forward_id_ < 0) {
    throw UsageError(fmt::format("backward() of the loss of forward #{}, but the last forward was "
                                 "#{}: call forward() before each backward()", loss.forward_id,
                                 forward_id_));
  }
  backward_prologue();
  model_.backward(dev_, optimizer_->loss_scale(), cfg_.gradient_accumulation_steps);
  backward_epilogue();
}

void Engine::backward_prologue() {
  // DeepCompile's start_backward(boundary) joins here with the compile issue.
  optimizer_->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
  record(fmt::format("backward prologue: micro_steps {} boundary {}", micro_steps_,
                     is_gradient_accumulation_boundary()));
}

void Engine::backward_epilogue() {
  if (decide::runs_backward_allreduce(enable_backward_allreduce_, inside_no_sync_)) {
    allreduce_gradients();
  }
  optimizer_->backward_epilogue();
  record(fmt::format("backward epilogue: micro_step_id {}", optimizer_->micro_step_id()));
}

void Engine::allreduce_gradients() {
  if (decide::skips_allreduce_for_deepcompile(deepcompile_active_, parallelization_pass_only_,
                                              opts_.bugs.has(KnownBug::B8_allreduce_gate_parallel_passes))) {
    return;
  }
  optimizer_->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
  optimizer_->allreduce_gradients();
}

void Engine::step() {
  if (inside_no_sync_) {
    throw UsageError("step() inside no_sync() or coalesce_grad_reduction(): leave the scope "
                     "first; it is illegal to step inside it");
  }
  if (is_gradient_accumulation_boundary()) {
    const bool applied = optimizer_->step();
    optimizer_->zero_grad();
    if (!applied) ++skipped_steps_;
    ++global_steps_;
    record(fmt::format("step: global_steps {} applied {} loss_scale {}", global_steps_, applied,
                       optimizer_->loss_scale()));
  }
  ++micro_steps_;
}

void Engine::zero_grad() {
  for (Parameter* p : model_.named_parameters()) p->grad = Tensor();
}

void Engine::enter_no_sync() {
  if (cfg_.zero.stage >= 2) {
    throw UsageError(fmt::format("no_sync context manager is incompatible with gradient "
                                 "partitioning logic of ZeRO stage {}", cfg_.zero.stage));
  }
  if (inside_no_sync_) throw UsageError("no_sync context manager reentry is unsupported");
  inside_no_sync_ = true;
}

void Engine::register_external_parameter(Module& module, Parameter& p) {
  if (auto* z3 = dynamic_cast<Zero3Optimizer*>(optimizer_.get())) z3->register_external_parameter(module, p);
}

std::vector<double> Engine::full_grads() {
  if (!optimizer_->coalescing) return optimizer_->gathered_grads();
  std::vector<double> out;  // inside the scope: the local, unreduced .grad
  for (Parameter* p : model_.named_parameters()) {
    const Tensor& g = p->grad.defined() ? p->grad : p->grad_accum;
    const std::vector<double> v = g.defined() ? to_f64(dev_, g) : std::vector<double>(static_cast<std::size_t>(p->numel()), 0.0);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::optional<bool> Engine::enter_coalesce() {
  if (!cfg_.managed_gradient_accumulation) {
    throw UsageError("coalesce_grad_reduction is not supported with managed_gradient_accumulation=False; "
                     "the caller already owns the accumulation boundary via step()");
  }
  if (cfg_.zero.stage < 1 || cfg_.zero.stage > 3) {
    throw NotImplementedError(fmt::format("coalesce_grad_reduction requires ZeRO stage 1/2/3, got stage {}", cfg_.zero.stage));
  }
  if (opts_.pipeline) {
    throw NotImplementedError("coalesce_grad_reduction is not supported under pipeline parallelism");
  }
  if (!optimizer_->supports_coalescing()) {
    throw NotImplementedError(fmt::format(
        "coalesce_grad_reduction does not yet support optimizer wrapper {} (ZeRO-1 + bf16 + fp32 "
        "grad accumulation without offload); use ZeRO stage 2, or drop grad_accum_dtype", optimizer_->name()));
  }
  if (inside_no_sync_) {
    throw UsageError("coalesce_grad_reduction cannot be nested inside another no_sync context");
  }
  const std::optional<bool> saved = boundary_override_;
  inside_no_sync_ = true;
  optimizer_->coalescing = true;
  record("coalesce enter");
  return saved;
}

// Note [Flush order]: the coalescing flag is cleared before the flush, or the reductions the
// flush drives would return at the coalescing guard (KnownBug::B7 is that historical order).
void Engine::exit_coalesce(std::optional<bool> saved_boundary) {
  const bool b7 = opts_.bugs.has(KnownBug::B7_flush_with_coalescing_set);
  if (!b7) optimizer_->coalescing = false;
  inside_no_sync_ = false;
  boundary_override_ = true;
  optimizer_->set_gradient_accumulation_boundary(true);
  flush_coalesced_reduction();
  if (b7) optimizer_->coalescing = false;
  boundary_override_ = saved_boundary;
  if (saved_boundary) optimizer_->set_gradient_accumulation_boundary(*saved_boundary);
  record(fmt::format("coalesce exit: flushed at micro_step_id {}", last_flush_micro_step_id_));
}

void Engine::flush_coalesced_reduction() {
  last_flush_micro_step_id_ = optimizer_->micro_step_id();
  if (auto* z3 = dynamic_cast<Zero3Optimizer*>(optimizer_.get())) {
    for (Parameter* p : model_.named_parameters()) {
      if (p->requires_grad && p->grad.defined()) z3->reduce_ready_partitions_and_remove_grads(*p);
    }
    z3->independent_gradient_partition_epilogue();
    return;
  }
  auto* z12 = dynamic_cast<Zero12Optimizer*>(optimizer_.get());
  ZC_ASSERT(z12 != nullptr, "coalesce flush with optimizer {}", optimizer_->name());
  z12->wait_reduction_stream();
  z12->setup_buckets();  // micro_step_id -1 -> 0 for the whole block
  last_flush_micro_step_id_ = optimizer_->micro_step_id();
  for (int i = 0; i < z12->num_params(); ++i) {
    if (z12->has_gradient_for_reduction(i)) z12->reduce_ready_partitions_and_remove_grads(i);
  }
  z12->independent_gradient_partition_epilogue();
}

std::vector<double> Engine::full_params() {
  if (auto* z3 = dynamic_cast<Zero3Optimizer*>(optimizer_.get())) return z3->gathered_params();
  std::vector<double> out;
  for (Parameter* p : model_.named_parameters()) {
    const std::vector<double> v = to_f64(dev_, p->data);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace zc
