// ZeroOptimizer's shared parts and the choice of wrapper, as DeepSpeed's
// _do_optimizer_sanity_check / _configure_zero_optimizer make it.
#include "engine/zero_optimizer.h"

#include "engine/dense_optimizer.h"
#include "engine/errors.h"
#include "engine/zero12_optimizer.h"
#include "engine/zero3_optimizer.h"

#include <cmath>

namespace zc {

ZeroOptimizer::ZeroOptimizer(const Config& cfg, Module& model, Device& dev, Comm& comm,
                             const Options& opts, ParamSelect select)
    : cfg_(cfg), model_(model), dev_(dev), comm_(comm), opts_(opts),
      dtype_(cfg.model_dtype()), accum_dtype_(cfg.accumulation_dtype()),
      averaging_world_(comm.size()), scaler_(cfg) {
  for (Parameter* p : model.named_parameters()) {
    if (!p->requires_grad) continue;
    if (select == ParamSelect::dense && p->is_expert) continue;
    if (select == ParamSelect::expert && !p->is_expert) continue;
    params_.push_back(p);
  }
}

StepPrep ZeroOptimizer::prepare_step() {
  throw NotImplementedError(fmt::format("{} cannot share a step with other param groups (MoE needs "
                                        "ZeRO stage 1 or 2)", name()));
}

void ZeroOptimizer::apply_step(double) {
  throw NotImplementedError(fmt::format("{} cannot share a step with other param groups", name()));
}

void ZeroOptimizer::begin_coalescing() {
  ZC_ASSERT(!coalescing_, "{}: coalescing entered twice", name());
  coalescing_ = true;
}

void ZeroOptimizer::flush_coalesced_reduction() {
  ZC_ASSERT(false, "coalesce flush with optimizer {}, which does not support coalescing", name());
}

void ZeroOptimizer::register_external_parameter(Module&, Parameter&) {}

bool ZeroOptimizer::any_rank_overflow(const std::vector<Tensor>& grads, Device* where) {
  Device& d = where != nullptr ? *where : dev_;
  bool local = false;
  for (const Tensor& g : grads) {
    if (g.defined() && d.has_inf_nan(g)) local = true;
  }
  return any_rank_overflow(local);
}

bool ZeroOptimizer::any_rank_overflow(bool local) {
  Tensor flag = dev_.alloc(DType::f32, {1}, "overflow_flag");  // [1] f32
  dev_.fill(flag, local ? 1.0 : 0.0);
  comm_.all_reduce(flag, {.op = ReduceOp::max});
  return to_f64(dev_, flag)[0] != 0.0;
}

double ZeroOptimizer::global_norm(double local_sum_sq, bool partitioned, DType reduce_dtype) {
  if (!partitioned) return std::sqrt(local_sum_sq);
  ZC_ASSERT(reduce_dtype == DType::f32 || reduce_dtype == DType::f64, "norm reduced in {}", dtype_name(reduce_dtype));
  Tensor t = dev_.alloc(reduce_dtype, {1}, "total_norm");  // [1]
  dev_.fill(t, local_sum_sq);                              // rounded once to reduce_dtype
  comm_.all_reduce(t);
  const double sum = to_f64(dev_, t)[0];
  return reduce_dtype == DType::f32 ? static_cast<double>(std::sqrt(static_cast<float>(sum))) : std::sqrt(sum);
}

void ZeroOptimizer::record(std::string_view what) {
  if (opts_.trace != nullptr) opts_.trace->record("engine", what);
}

std::unique_ptr<ZeroOptimizer> make_zero_optimizer(const Config& cfg, Module& model, Device& dev,
                                                   Comm& comm, const Options& opts,
                                                   ParamSelect select) {
  const int stage = cfg.zero.stage;
  if (select != ParamSelect::all && (stage == 0 || stage == 3)) {
    throw NotImplementedError(fmt::format("MoE expert params with ZeRO stage {} are not modelled; use "
                                          "stage 1 or 2", stage));
  }
  if (stage >= 3) return std::make_unique<Zero3Optimizer>(cfg, model, dev, comm, opts);
  if (stage == 0) return std::make_unique<DenseOptimizer>(cfg, model, dev, comm, opts, false);
  // DeepSpeed: ZeRO-1 + bf16 + fp32 grad accumulation without offload uses BF16_Optimizer.
  if (stage == 1 && cfg.model_dtype() == DType::bf16 && cfg.accumulation_dtype() == DType::f32 &&
      cfg.zero.offload_optimizer != OffloadDevice::cpu) {
    if (select != ParamSelect::all) {
      throw NotImplementedError("MoE with ZeRO-1 + bf16 + fp32 accumulation (BF16_Optimizer) is not modelled");
    }
    return std::make_unique<DenseOptimizer>(cfg, model, dev, comm, opts, true);
  }
  return std::make_unique<Zero12Optimizer>(cfg, model, dev, comm, opts, select);
}

}  // namespace zc
