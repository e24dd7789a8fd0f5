// Engine: forward / backward / step in DeepSpeed's order (SPEC 2).
#include "engine/engine.h"

#include "engine/decisions.h"
#include "engine/errors.h"

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
  bool moe = false;
  for (Parameter* p : model_.named_parameters()) moe |= p->is_expert;
  if (moe && (opts_.expert_parallel == nullptr || opts_.expert_data_parallel == nullptr)) {
    throw UsageError("the model has MoE expert params: pass Options::expert_parallel and "
                     "Options::expert_data_parallel (Comm::split of the world by ep_size)");
  }
  if (moe && cfg_.ep_size != 1 && cfg_.ep_size != opts_.expert_parallel->size()) {
    throw ConfigError(fmt::format("'moe.ep_size' is {} but the expert-parallel group has {} ranks",
                                  cfg_.ep_size, opts_.expert_parallel->size()));
  }
  check_optimizer_given(Call::initialize);
  broadcast_model();
  if (!moe) {
    optimizers_.push_back(make_zero_optimizer(cfg_, model_, dev_, comm_, opts_));
  } else {
    optimizers_.push_back(make_zero_optimizer(cfg_, model_, dev_, comm_, opts_, ParamSelect::dense));
    optimizers_.push_back(make_zero_optimizer(cfg_, model_, dev_, *opts_.expert_data_parallel, opts_,
                                              ParamSelect::expert));
    optimizers_[1]->set_averaging_world(comm_.size());
    optimizers_[1]->share_staging_from(*optimizers_[0]);
  }
  model_.set_grad_ready_hook([this](Parameter& p) { optimizer_of(p)->on_grad_ready(p); });
  // zero.Init's Linear under ZeRO-3 (Note [Which autograd node hands a Linear its grads]).
  model_.set_zero3_linear(cfg_.zero.stage == 3);
  record(fmt::format("engine init: stage {} dtype {} GA {} world {} optimizer {}{}", cfg_.zero.stage,
                     dtype_name(cfg_.model_dtype()), cfg_.gradient_accumulation_steps,
                     comm_.size(), optimizers_[0]->name(), moe ? " + MoE expert group" : ""));
}

Engine::~Engine() { model_.set_grad_ready_hook(nullptr); }

void Engine::broadcast_model() {
  // Dense params from world rank 0; expert params within their expert-data-parallel group.
  for (Parameter* p : model_.named_parameters()) {
    (p->is_expert ? *opts_.expert_data_parallel : comm_).broadcast(p->data, {.root = 0});
  }
}

ZeroOptimizer* Engine::optimizer_of(const Parameter& p) {
  return p.is_expert && optimizers_.size() > 1 ? optimizers_[1].get() : optimizers_[0].get();
}

std::vector<Tensor> Engine::averaged_gradients() {
  std::vector<Tensor> out;
  for (auto& o : optimizers_) {
    for (Tensor& t : o->averaged_gradients()) out.push_back(t);
  }
  return out;
}

std::vector<Tensor> Engine::master_partitions() {
  std::vector<Tensor> out;
  for (auto& o : optimizers_) {
    for (Tensor& t : o->master_partitions()) out.push_back(t);
  }
  return out;
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
  for (auto& o : optimizers_) o->set_gradient_accumulation_boundary(is_boundary);
}

namespace {

// DeepSpeed's engine marks every ZeROOrderedDict in_forward around the model's forward when
// weights are partitioned, so ParamDict::get discovers external params (SPEC 7); cleared on
// return and on throw.
class ParamsInForward {
 public:
  ParamsInForward(Module& m, bool on) : m_(m), on_(on) { if (on_) m_.set_params_in_forward(true); }
  ~ParamsInForward() { if (on_) m_.set_params_in_forward(false); }
  ParamsInForward(const ParamsInForward&) = delete;
  ParamsInForward& operator=(const ParamsInForward&) = delete;

 private:
  Module& m_;
  bool on_;
};

}  // namespace

Engine::Loss Engine::forward(const Batch& batch) {
  check_usable("forward()");
  for (auto& o : optimizers_) o->clear_backward_seen_flag();
  double loss = 0.0;
  {
    const ParamsInForward in_forward(model_, cfg_.zero.stage >= 3);
    loss = model_.forward(dev_, batch);
  }
  // The loss as a tensor (Note [The loss's 0-dim tensors]); the last forward's, if its backward
  // never ran, goes as this one replaces it.
  loss_ = dev_.alloc(model_.loss_dtype(), {1}, "loss", MemCategory::temporaries);  // 0-dim
  ++forward_id_;
  record(fmt::format("forward {} loss {:.9g}", forward_id_, loss));
  return Loss{loss, forward_id_};
}

void Engine::check_usable(const char* call) const {
  if (!broken_.empty()) {
    throw UsageError(fmt::format("{}: this engine is unusable because {}; its reduction state is "
                                 "half done, so build a new Engine", call, broken_));
  }
}

// Note [No optimizer]
// A ds_config without an "optimizer" block (DeepSpeed's has_optimizer is false: no client
// optimizer is modelled) is what DeepSpeed 0.19.8 cannot train, and each stage fails where
// DeepSpeed's does (probe no_optimizer, reference/deepspeed/probes.py):
//   - ZeRO-1/2, any dtype or offload: initialize asserts "zero stage N requires an optimizer"
//     (_configure_zero_optimizer with a DummyOptim), so the Engine constructor throws;
//   - ZeRO-3: initialize builds DeepSpeedZeRoOffload (params partitioned and gathered, no
//     optimizer), forward runs, backward raises AttributeError on its missing
//     set_gradient_accumulation_boundary;
//   - stage 0 bf16: BF16_Optimizer over a DummyOptim; backward runs, the step's norm asserts;
//   - stage 0 otherwise (fp32, fp16): no optimizer at all, and backward asserts.
// zerocheck still builds its optimizer for ZeRO-3 and stage 0, so what runs before the failure
// (forward, and stage 0 bf16's backward) runs on zerocheck's usual wrapper: its memory is not
// DeepSpeedZeRoOffload's (no fp32 master or optimizer states there), and a forward-only user of
// ZeRO-3 inference is not modelled by `zerocheck plan`, which refuses such a config up front.
void Engine::check_optimizer_given(Call call) const {
  if (cfg_.optimizer_given) return;
  const int stage = cfg_.zero.stage;
  const Call fails_at = stage == 1 || stage == 2              ? Call::initialize
                        : stage == 0 && cfg_.bf16.enabled ? Call::step
                                                          : Call::backward;
  if (call != fails_at) return;
  constexpr const char* kAddOne = "add one, e.g. \"optimizer\": {\"type\": \"Adam\"}, or (zerocheck run, plan) name the "
                                  "client optimizer a script passes to deepspeed.initialize with --optimizer";
  if (call == Call::initialize) {
    throw ConfigError(fmt::format("zero stage {0} requires an optimizer: the ds_config has no \"optimizer\" block, "
                                  "and DeepSpeed 0.19.8 refuses that at initialize (AssertionError: zero stage {0} "
                                  "requires an optimizer, engine.py:2659); {1}", stage, kAddOne));
  }
  const char* ds_error =
      stage >= 3 ? "AttributeError: 'DeepSpeedZeRoOffload' object has no attribute "
                   "'set_gradient_accumulation_boundary' (engine.py:3149): without an optimizer ZeRO-3 "
                   "builds DeepSpeedZeRoOffload, which can run forward only"
      : call == Call::step
          ? "AssertionError (bf16_optimizer.py:562): without an optimizer stage 0 bf16 wraps a "
            "DummyOptim in BF16_Optimizer, which cannot step"
          : "AssertionError: must provide optimizer during init in order to use backward (engine.py:3395)";
  throw UsageError(fmt::format("{}: the ds_config has no \"optimizer\" block, and DeepSpeed 0.19.8 fails here: {}; {}",
                               call == Call::step ? "step()" : "backward()", ds_error, kAddOne));
}

void Engine::backward(const Loss& loss) {
  check_usable("backward()");
  check_optimizer_given(Call::backward);
  if (loss.forward_id != forward_id_ || forward_id_ < 0) {
    throw UsageError(fmt::format("backward() of the loss of forward #{}, but the last forward was "
                                 "#{}: call forward() before each backward()", loss.forward_id,
                                 forward_id_));
  }
  // Note [The loss's 0-dim tensors]
  // DeepSpeed's engine.backward (engine.py:3382) divides the loss tensor by the accumulation steps
  // (a new tensor, at GA 1 too), a ZeRO optimizer scales it by its loss scale (scale_if_loss: the
  // static 1.0 of fp32 and bf16 too; stage 0's wrappers have no such step), and autograd makes the
  // ones its backward starts from (_make_grads): three 0-dim tensors in the loss's dtype, the ones
  // alive until autograd's run ends, the others until the epilogue returns; the caller's loss
  // goes after that. On a tiny model they are the difference between the engine's peak and
  // DeepSpeed's; on a GPU each takes one of the caching allocator's blocks.
  Tensor by_gas = dev_.alloc(model_.loss_dtype(), {1}, "loss / gradient_accumulation_steps", MemCategory::temporaries);
  Tensor scaled;
  if (cfg_.zero.stage > 0) scaled = dev_.alloc(model_.loss_dtype(), {1}, "scale_loss", MemCategory::temporaries);
  Tensor ones = dev_.alloc(model_.loss_dtype(), {1}, "_make_grads.ones", MemCategory::temporaries);
  backward_prologue();
  std::exception_ptr error;
  try {
    model_.set_loss_grad(loss_grads(scaled.defined()));
    model_.backward(dev_, loss_scale(), cfg_.gradient_accumulation_steps);
    model_.set_loss_grad(Tensor());  // a model that never read it
    ones = Tensor();  // autograd's run is over
    backward_epilogue();
  } catch (...) {
    error = std::current_exception();
  }
  ones = scaled = by_gas = loss_ = Tensor();
  if (error) {
    model_.set_loss_grad(Tensor());  // a backward that failed before its model read it
    broken_ = "a backward() failed part way (see the first error)";
    std::rethrow_exception(error);
  }
}

// Note [The loss's 0-dim gradients]
// Autograd's run starts from the ones (above) and goes back through the loss's 0-dim ops: the
// optimizer's scaling (MulBackward0) when there is one, then the division by the accumulation
// steps (DivBackward0). Each node's output is a new 0-dim tensor in the loss's dtype, alive until
// the next node has run; the last one is the model's loss's gradient, which the model's first
// node reads (Model::set_loss_grad): the twins' (c * out).sum() / B, their sum of terms, and
// cross entropy's NllLossBackward0. DeepSpeed's run shows them as activations (Synthetic [5,3] at
// stages 0-2, world 2: 100-104 B, 96 without them; the MLP [4,1] at stage 0: 52 B, 48 without
// its sum's). Each node also casts the number it saved on a CPU, which a CUDA kernel does not
// (memory.py's cpu_kernel): not modelled.
Tensor Engine::loss_grads(bool scaled) {
  Tensor by_scale;
  if (scaled) {
    by_scale = dev_.alloc(model_.loss_dtype(), {1}, "scale_loss's grad", MemCategory::activations);
  }
  return dev_.alloc(model_.loss_dtype(), {1}, "(loss / gradient_accumulation_steps)'s grad",
                    MemCategory::activations);
}

bool Engine::runs_deepcompile_hooks() const {
  return compiled_ && decide::runs_deepcompile_hooks(compile_facts_, opts_.bugs.has(KnownBug::B1_autosp_backward_gate));
}

DeepCompileRuntime& Engine::runtime() {
  if (opts_.deepcompile_loader == nullptr) {
    throw UsageError("the DeepCompile runtime is needed but Options::deepcompile_loader is not set");
  }
  return opts_.deepcompile_loader->get_handle();  // loads on first use
}

void Engine::compile(const CompileConfig& cc) {
  check_usable("compile()");
  decide::CompileFacts<bool, std::int64_t> f{false, false, false, false, cc.deepcompile, cfg_.zero.stage,
                                             cfg_.autotp_size > 1};
  for (const std::string& p : cc.passes) {
    if (p == "z1") f.pass_z1 = true;
    else if (p == "z3") f.pass_z3 = true;
    else if (p == "autosp") f.pass_autosp = true;
    else if (p == "autotp") f.pass_autotp = true;
    else throw ConfigError(fmt::format("compile: unknown pass '{}': use z1, z3, autosp or autotp", p));
  }
  if (decide::compile_is_error(f)) {
    throw NotImplementedError("compile: the autotp pass cannot be combined with other passes");
  }
  if (f.deepcompile && f.pass_autotp && !f.autotp_size_ok) {
    throw ConfigError(fmt::format("compile: autotp needs 'tensor_parallel.autotp_size' > 1, got {}", cfg_.autotp_size));
  }
  check_parallel_layout(f);
  compile_facts_ = f;
  compiled_ = true;
  deepcompile_active_ = decide::deepcompile_active(f);
  parallelization_pass_only_ = decide::uses_parallelization_pass_only(f);
  std::string backend = "none";
  if (decide::selects_autotp(f)) backend = "autotp";
  if (decide::selects_autosp(f)) backend = "autosp";
  if (decide::selects_zero_backend(f)) {
    backend = fmt::format("z{}", cfg_.zero.stage);
    DeepCompileExecutors ex;
    ex.reduce_gradients = [this] {  // the compiled engine's reduction: the same ZeRO path
      if (decide::runs_backward_allreduce(enable_backward_allreduce_, inside_no_sync_)) {
        for (auto& o : optimizers_) {
          o->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
          o->allreduce_gradients();
        }
      }
    };
    runtime().init(comm_, backend, cfg_.zero.reduce_bucket_size, std::move(ex));
  }
  record(fmt::format("compile: backend {} deepcompile_active {}", backend, deepcompile_active_));
}

// Note [Parallel passes]
// Upstream's AutoTP and AutoSP rewrite the traced graph: AutoTP shards the attention and MLP
// linears over a TP group, AutoSP wraps attention in Ulysses all_to_alls over an SP group. We have
// no graph to rewrite, so the model is constructed parallel (TinyLlama with TinyLlamaGroups) and
// compile() checks that its layout matches the pass the config selects:
//   - a model with layers the selected pass rewrites (ModelParallelism::supports_*) must have been
//     built over a group of the matching size (autotp: tensor_parallel.autotp_size; autosp: more
//     than one rank, dividing the engine's world), else ConfigError saying how to build it;
//   - a model without such layers (MLP, Synthetic, ...) is left as it is, as upstream's passes
//     find nothing to rewrite in it; the I3 verifier exercises the gating on exactly such models.
// The Comm handed to the Engine is the data-parallel group: for TP the split of the world over
// ranks with the same TP rank; for SP the whole world (Note [Ulysses loss scaling]).
void Engine::check_parallel_layout(const decide::CompileFacts<bool, std::int64_t>& f) {
  const ModelParallelism mp = model_.parallelism();
  if (decide::selects_autotp(f) && mp.supports_autotp && mp.tp_size != cfg_.autotp_size) {
    throw ConfigError(fmt::format(
        "compile: autotp with 'tensor_parallel.autotp_size' {} but model '{}' was built over a "
        "tensor-parallel group of {} rank(s): build it over world.split() groups of {} ranks and "
        "give the Engine the data-parallel split", cfg_.autotp_size, model_.describe(), mp.tp_size,
        cfg_.autotp_size));
  }
  if (decide::selects_autosp(f) && mp.supports_autosp &&
      (mp.sp_size < 2 || comm_.size() % mp.sp_size != 0)) {
    throw ConfigError(fmt::format(
        "compile: autosp but model '{}' was built over a sequence-parallel group of {} rank(s) with "
        "an engine world of {}: build it over world.split() groups of sp > 1 ranks that divide the "
        "world, and give the Engine the whole world", model_.describe(), mp.sp_size, comm_.size()));
  }
  const bool rewrites = (decide::selects_autotp(f) && mp.supports_autotp) ||
                        (decide::selects_autosp(f) && mp.supports_autosp);
  if ((decide::selects_autotp(f) || decide::selects_autosp(f)) && !rewrites) {
    record(fmt::format("compile: model {} has no layers the pass rewrites; left as it is", model_.describe()));
  }
}

void Engine::destroy() {
  check_usable("destroy()");
  if (compiled_ && decide::destroy_cleans_up_runtime(compile_facts_, opts_.bugs.has(KnownBug::B2_destroy_cleanup_gate))) {
    runtime().cleanup();
  }
  broken_ = "destroy() was called";
  record("destroy");
}

void Engine::backward_prologue() {
  if (runs_deepcompile_hooks()) runtime().start_backward(is_gradient_accumulation_boundary());
  for (auto& o : optimizers_) o->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
  record(fmt::format("backward prologue: micro_steps {} boundary {}", micro_steps_,
                     is_gradient_accumulation_boundary()));
}

void Engine::backward_epilogue() {
  if (decide::runs_backward_allreduce(enable_backward_allreduce_, inside_no_sync_)) {
    allreduce_gradients();
  }
  if (runs_deepcompile_hooks()) runtime().end_backward();  // the runtime's executors reduce here
  for (auto& o : optimizers_) o->backward_epilogue();
  record(fmt::format("backward epilogue: micro_step_id {}", micro_step_id()));
}

void Engine::allreduce_gradients() {
  if (decide::skips_allreduce_for_deepcompile(deepcompile_active_, parallelization_pass_only_,
                                              opts_.bugs.has(KnownBug::B8_allreduce_gate_parallel_passes))) {
    return;
  }
  for (auto& o : optimizers_) {
    o->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
    o->allreduce_gradients();
  }
}

void Engine::step() {
  check_usable("step()");
  if (inside_no_sync_) {
    throw UsageError("step() inside no_sync() or coalesce_grad_reduction(): leave the scope "
                     "first; it is illegal to step inside it");
  }
  if (is_gradient_accumulation_boundary()) {
    check_optimizer_given(Call::step);
    // Several param groups (MoE) share one overflow decision, one global norm over the world and
    // one loss scale; every rank's expert partition is a distinct piece of some expert, so the
    // world sum of partition squares is the whole model's.
    std::vector<ZeroOptimizer*> groups;
    for (auto& o : optimizers_) groups.push_back(o.get());
    bool applied = false;
    try {
      applied = groups.size() == 1 ? groups[0]->step() : ZeroOptimizer::step_param_groups(groups);
    } catch (...) {
      broken_ = "a step() failed part way (see the first error)";
      throw;
    }
    for (auto& o : optimizers_) o->zero_grad();
    if (!applied) ++skipped_steps_;
    ++global_steps_;
    record(fmt::format("step: global_steps {} applied {} loss_scale {}", global_steps_, applied,
                       loss_scale()));
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
  optimizers_[0]->register_external_parameter(module, p);
}

std::vector<double> Engine::append_experts(std::vector<double> dense, std::vector<double> local) {
  // Every expert-parallel rank holds different experts: gather them in global expert order.
  Comm& ep = *opts_.expert_parallel;
  Tensor mine = tensor_from_f64(dev_, DType::f64, {static_cast<std::int64_t>(local.size())}, local, "local_experts");
  Tensor all = dev_.alloc(DType::f64, {mine.numel() * ep.size()}, "all_experts",
                          MemCategory::temporaries);
  ep.all_gather(all, mine);
  const std::vector<double> v = to_f64(dev_, all);
  dense.insert(dense.end(), v.begin(), v.end());
  return dense;
}

std::vector<double> Engine::full_grads() {
  if (!coalescing() && optimizers_.size() > 1) {
    return append_experts(optimizers_[0]->gathered_grads(), optimizers_[1]->gathered_grads());
  }
  if (!coalescing()) return optimizers_[0]->gathered_grads();
  std::vector<double> out;  // inside the scope: the local, unreduced .grad
  for (Parameter* p : model_.named_parameters()) {
    const Tensor& g = p->grad.defined() ? p->grad : p->grad_accum;
    const std::vector<double> v = g.defined() ? to_f64(dev_, g) : std::vector<double>(static_cast<std::size_t>(p->numel()), 0.0);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<double> Engine::full_optimizer_state(OptimizerState what) {
  std::vector<double> dense = optimizers_[0]->gathered_state(what);
  if (optimizers_.size() == 1 || dense.empty()) return dense;
  return append_experts(std::move(dense), optimizers_[1]->gathered_state(what));
}

std::optional<bool> Engine::enter_coalesce() {
  if (cfg_.zero.stage < 1 || cfg_.zero.stage > 3) {
    throw NotImplementedError(fmt::format("coalesce_grad_reduction requires ZeRO stage 1/2/3, got stage {}", cfg_.zero.stage));
  }
  if (opts_.pipeline) {
    throw NotImplementedError("coalesce_grad_reduction is not supported under pipeline parallelism");
  }
  for (auto& o : optimizers_) {
    if (!o->supports_coalescing()) {
      throw NotImplementedError(fmt::format(
          "coalesce_grad_reduction does not yet support optimizer wrapper {} (ZeRO-1 + bf16 + fp32 "
          "grad accumulation without offload); use ZeRO stage 2, or drop grad_accum_dtype", o->name()));
    }
  }
  if (inside_no_sync_) {
    throw UsageError("coalesce_grad_reduction cannot be nested inside another no_sync context");
  }
  const std::optional<bool> saved = boundary_override_;
  inside_no_sync_ = true;
  for (auto& o : optimizers_) o->begin_coalescing();
  record("coalesce enter");
  return saved;
}

// Note [Flush order]: the coalescing flag is cleared before the flush, or the reductions the
// flush drives would return at the coalescing guard (KnownBug::B7 is that historical order).
void Engine::exit_coalesce(std::optional<bool> saved_boundary) {
  const bool b7 = opts_.bugs.has(KnownBug::B7_flush_with_coalescing_set);
  if (!b7) {
    for (auto& o : optimizers_) o->end_coalescing();
  }
  inside_no_sync_ = false;
  boundary_override_ = true;
  for (auto& o : optimizers_) o->set_gradient_accumulation_boundary(true);
  std::exception_ptr flush_error;  // as DeepSpeed's inner `finally`: restore, then propagate
  try {
    flush_coalesced_reduction();
  } catch (...) {
    flush_error = std::current_exception();
  }
  for (auto& o : optimizers_) o->end_coalescing();  // (already ended unless B7)
  boundary_override_ = saved_boundary;
  for (auto& o : optimizers_) o->set_gradient_accumulation_boundary(is_gradient_accumulation_boundary());
  if (flush_error) {
    broken_ = "the coalesce_grad_reduction flush failed";
    std::rethrow_exception(flush_error);
  }
  record(fmt::format("coalesce exit: flushed at micro_step_id {}", last_flush_micro_step_id_));
}

void Engine::flush_coalesced_reduction() {
  last_flush_micro_step_id_ = micro_step_id();
  for (auto& o : optimizers_) o->flush_coalesced_reduction();
  last_flush_micro_step_id_ = micro_step_id();  // stage 1/2's setup_buckets moved it from -1 to 0
}

std::vector<double> Engine::full_params() {
  if (std::optional<std::vector<double>> all = optimizers_[0]->gathered_params()) {
    return *std::move(all);  // ZeRO-3: partitioned, gathered
  }
  std::vector<double> dense, experts;
  for (Parameter* p : model_.named_parameters()) {
    const std::vector<double> v = to_f64(dev_, p->data);
    std::vector<double>& dst = p->is_expert && optimizers_.size() > 1 ? experts : dense;
    dst.insert(dst.end(), v.begin(), v.end());
  }
  if (optimizers_.size() > 1) return append_experts(std::move(dense), std::move(experts));
  return dense;
}

}  // namespace zc
