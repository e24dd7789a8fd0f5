// Model: the interface the Engine trains (concrete models live in models/): a Module tree with
// explicit forward and backward (llm.c style), plus the data it trains on. Every model can be initialised and fed in the exact data domain (SPEC 8: values k * 2^-e
// with small k, loss-gradient coefficients multiples of `grad_multiple`, so every sum the engine
// forms is exact) and with gaussian data.
#pragma once

#include "engine/module.h"
#include "engine/rng.h"

#include <map>
#include <string>
#include <vector>

namespace zc {

enum class DataDomain : std::uint8_t { exact, gaussian };
std::string_view data_domain_name(DataDomain d);

// Exact-domain sizing: values are k * 2^-scale_exp with |k| <= max_k; loss coefficients are
// k * grad_multiple * 2^-scale_exp, with grad_multiple (the product of every divisor the engine applies: world per
// reduction, GA), so each division the engine does is exact.
struct ExactSpec {
  int max_k = 1;
  int scale_exp = 0;
  std::int64_t grad_multiple = 1;
};

// Host-side data with a leading sample dimension, so a global batch can be sliced per rank.
struct HostArray {
  Shape shape;  // [samples, ...]
  std::vector<double> values;
};
struct HostBatch {
  std::int64_t samples = 0;
  std::map<std::string, HostArray> arrays;
  HostBatch slice(std::int64_t begin, std::int64_t count) const;
};

struct Batch {
  std::int64_t samples = 0;
  std::map<std::string, Tensor> tensors;
  const Tensor& at(const std::string& name) const;
};
// Uploads every array in `dtype`, except "labels" and "ids" which stay f32 (token ids).
Batch upload_batch(Device& dev, const HostBatch& hb, DType dtype);
// The dtype a batch array is uploaded in: the model's, but token ids and labels in f64, which is
// the 8 bytes of the int64 tensors torch takes them as (so the ledger holds what a torch run holds)
// and holds every id exactly.
DType batch_array_dtype(const std::string& name, DType model_dtype);

// A value of the data domain: exact k * 2^-e, or a standard normal times `gaussian_scale`.
double draw_value(Rng& rng, DataDomain domain, const ExactSpec& ex, double gaussian_scale = 1.0);

// The parallel layout a model was built with. Engine::compile() checks the autotp/autosp passes
// against it: a model with layers a pass rewrites (supports_*) must have been built over a group
// of the matching size; a model without such layers is left as it is (Note [Parallel passes] in
// engine.cpp).
struct ModelParallelism {
  bool supports_autotp = false;  // has attention / MLP linears that AutoTP shards
  int tp_size = 1;               // the tensor-parallel group it was built over
  bool supports_autosp = false;  // has attention that AutoSP (Ulysses) wraps in all_to_all
  int sp_size = 1;               // the sequence-parallel group it was built over
};

// Note [Meta mode]
// On a meta device (MetaDevice, or the simulator with SimOptions::meta) the same engine and model
// code runs on shapes: every allocation is counted (memory.h) and none is made, every op checks
// its shapes and counts its FLOPs and bytes, and every collective meets, checks and is timed, with
// no data. Nothing holds host data either: init_param allocates without drawing values, batches
// come from batch_shapes(), upload_batch only allocates. Reads that would depend on data get
// defined meta values, so that a meta run takes the path a clean host run takes:
//   sum_sq, dot, max_abs -> 0 (a gradient norm of 0: clipping never binds; a loss of 0);
//   has_inf_nan -> false (no overflow: no skipped step, the loss scale only grows on schedule);
//   argmax_rows -> row r picks column r % C (balanced MoE routing);
//   download / to_f64 -> UsageError (there are no values to read).
// With these, a meta run allocates exactly what a host run of the same scenario allocates, when
// the host run's own data takes that path (no overflow, no clipping); props/memory_checks.h
// checks it category by category.
class Model : public Module {
 public:
  explicit Model(std::string name) : Module(std::move(name)) {}

  // Allocates every parameter on `dev` in `dtype` and fills it from `rng`.
  virtual void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                           Rng& rng) = 0;
  virtual HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                               const ExactSpec& ex) const = 0;
  // The arrays make_batch gives, shapes only (no values): the batch of meta mode (Note [Meta
  // mode]). NotImplementedError for a model without one.
  virtual HostBatch batch_shapes(std::int64_t samples) const;
  // Runs forward on this rank's micro-batch, keeps what backward needs, returns the loss.
  virtual double forward(Device& dev, const Batch& batch) = 0;
  // Accumulates grads of (loss * loss_scale / ga) into the params, firing grad-ready hooks in
  // backward order. The output gradient is scaled then divided, as DeepSpeed does.
  virtual void backward(Device& dev, double loss_scale, std::int64_t ga) = 0;
  // The 0-dim gradient autograd hands the model's loss (Note [The loss's 0-dim gradients]): set
  // by the Engine before backward(), freed by the model once its first node has read it.
  void set_loss_grad(Tensor g) { loss_grad_ = std::move(g); }
  virtual std::string describe() const = 0;
  virtual ModelParallelism parallelism() const { return {}; }
  DType dtype() const { return dtype_; }
  // The dtype of the 0-dim loss tensor forward returns in DeepSpeed's run (the twin's): the
  // model's, unless the model upcasts its loss (Hugging Face's to f32).
  virtual DType loss_dtype() const { return dtype_; }
  // init_params() sets it; deserialize restores it.
  void set_dtype(DType dtype) { dtype_ = dtype; }
  // The CPU side a model may keep tensors in (deepspeed.checkpointing's cpu_checkpointing): the
  // environment's host device (Options::cpu_device; a meta device in meta mode). Null: none.
  void set_host_device(Device* host) { host_ = host; }
  // Note [Which autograd node hands a Linear its grads]: true under ZeRO-3, whose zero.Init
  // replaces torch.nn.functional.linear with LinearFunctionForZeroStage3 (the Engine sets it).
  void set_zero3_linear(bool on) { zero3_linear_ = on; }

 protected:
  // Allocates p on dev and fills it with domain values.
  void init_param(Device& dev, Parameter& p, DType dtype, DataDomain domain, const ExactSpec& ex,
                  Rng& rng, double gaussian_scale);
  // The gradient of a loss linear in p, L = (1/B) sum_s <g_s, p>, for per-sample gradients g
  // [B, numel]: sum over samples, / B, * loss_scale, / ga, in that order (the order every exact
  // test relies on), then accumulated into p with its grad-ready hook (Synthetic, TreeModel).
  // last_loss_reader: p's node is the last to read the loss's gradient (freed after dp's
  // allocation, before its hook).
  void accumulate_prescribed_grad(Device& dev, Parameter& p, const Tensor& g, std::int64_t samples,
                                  double loss_scale, std::int64_t ga, bool last_loss_reader);
  // Accumulates a Linear's weight and bias grads (each becomes .grad through its hook) in the
  // order DeepSpeed's run hands them to AccumulateGrad (Note [Which autograd node hands a Linear
  // its grads]). `bias` null: the weight's only.
  void accumulate_linear_grads(Device& dev, Parameter& weight, Tensor dw, Parameter* bias,
                               Tensor db);
  DType dtype_ = DType::f32;
  Device* host_ = nullptr;
  Tensor loss_grad_;  // set_loss_grad's
  bool zero3_linear_ = false;
};

}  // namespace zc
