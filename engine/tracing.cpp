// trace(): copy, fake params, meta forward (tracing.h).
#include "engine/tracing.h"

#include "engine/errors.h"
#include "engine/host_device.h"

namespace zc {

void make_params_fake(Module& m) {
  for (auto& [local, p] : m.params()) {
    p->data = Tensor(p->dtype, p->shape, Placement::meta, nullptr);
    p->grad = Tensor();
    p->grad_accum = Tensor();
    p->ds_shard = Tensor();
    p->ds_status = ZeroStatus::none;
  }
  for (const auto& c : m.children()) make_params_fake(*c);
}

namespace {

// The batch shapes make_batch gives, as meta tensors, in upload_batch's dtypes.
Batch meta_batch(MetaDevice& meta, const Model& model, std::int64_t samples) {
  Rng rng(0);
  const HostBatch hb = model.make_batch(rng, samples, DataDomain::exact, ExactSpec{});
  Batch b;
  b.samples = hb.samples;
  for (const auto& [name, a] : hb.arrays) {
    b.tensors.emplace(name,
                      meta.alloc(batch_array_dtype(name, model.dtype()), a.shape, name,
                                 MemCategory::activations));
  }
  return b;
}

// Installs the context on the copy's root for the forward, and removes it on return or throw.
class TracingScope {
 public:
  TracingScope(Module& root, const TracingContext& ctx) : root_(root) { root_.set_tracing(&ctx); }
  ~TracingScope() { root_.set_tracing(nullptr); }
  TracingScope(const TracingScope&) = delete;
  TracingScope& operator=(const TracingScope&) = delete;

 private:
  Module& root_;
};

}  // namespace

TracedModel trace(const Model& model, const TraceOptions& opts) {
  if (opts.samples < 1) {
    throw UsageError(fmt::format("trace: samples is {}, must be >= 1", opts.samples));
  }
  std::unique_ptr<Module> copy = model.clone();
  auto* traced = dynamic_cast<Model*>(copy.get());
  ZC_ASSERT(traced != nullptr, "the clone of model '{}' is not a Model", model.name());
  copy.release();
  TracedModel out;
  out.model.reset(traced);
  make_params_fake(*traced);
  TracingContext ctx;
  if (const ParamCoordinator* c = model.param_coordinator()) ctx.bugs = c->bugs();
  MetaDevice meta;
  const Batch batch = meta_batch(meta, model, opts.samples);
  {
    const TracingScope scope(*traced, ctx);
    traced->forward(meta, batch);
  }
  out.counters = meta.counters();
  return out;
}

}  // namespace zc
