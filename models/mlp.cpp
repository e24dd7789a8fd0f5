// MLP forward and explicit backward. Shapes: x [B, in]; layer l: W [out, in], b [out];
// h = x W^T + b [B, out]; a = relu(h) between layers when enabled.
#include "models/mlp.h"

#include "engine/errors.h"

#include <nlohmann/json.hpp>

namespace zc {

Linear::Linear(std::string name, std::int64_t in, std::int64_t out)
    : Module(std::move(name)), in_features(in), out_features(out) {
  params().add("weight", {out, in}, DType::f32);
  params().add("bias", {out}, DType::f32);
}

nlohmann::json Linear::kind_args() const { return {{"in", in_features}, {"out", out_features}}; }

MlpSpec simple_model_spec(std::int64_t hidden, int nlayers, LossKind loss) {
  MlpSpec s;
  s.dims.assign(static_cast<std::size_t>(nlayers) + 1, hidden);
  s.relu = false;
  s.loss = loss;
  return s;
}

Mlp::Mlp(MlpSpec spec, std::string name) : Model(std::move(name)), spec_(std::move(spec)) {
  if (spec_.dims.size() < 2) throw UsageError("Mlp needs at least [in, out] dims");
  for (std::size_t l = 0; l + 1 < spec_.dims.size(); ++l) {
    add_child<Linear>(fmt::format("layers.{}", l), spec_.dims[l], spec_.dims[l + 1]);
  }
  finalize_parameters();
}

nlohmann::json Mlp::kind_args() const {
  return {{"dims", spec_.dims}, {"relu", spec_.relu},
          {"loss", spec_.loss == LossKind::linear ? "linear" : "cross_entropy"}};
}

std::string Mlp::describe() const {
  std::string dims;
  for (std::int64_t d : spec_.dims) dims += (dims.empty() ? "" : "x") + std::to_string(d);
  return fmt::format("mlp({}{}, {} loss)", dims, spec_.relu ? ", relu" : "",
                     spec_.loss == LossKind::linear ? "linear" : "cross-entropy");
}

void Mlp::init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex, Rng& rng) {
  dtype_ = dtype;
  for (std::size_t i = 0; i < num_layers(); ++i) {
    Linear& l = layer(i);
    const double g = 1.0 / std::sqrt(static_cast<double>(l.in_features));
    init_param(dev, l.weight(), dtype, domain, ex, rng, g);
    init_param(dev, l.bias(), dtype, domain, ex, rng, g);
  }
}

HostBatch Mlp::batch_shapes(std::int64_t samples) const {
  HostBatch hb;
  hb.samples = samples;
  hb.arrays.emplace("x", HostArray{{samples, spec_.dims.front()}, {}});
  if (spec_.loss == LossKind::linear) {
    hb.arrays.emplace("c", HostArray{{samples, spec_.dims.back()}, {}});
  } else {
    hb.arrays.emplace("labels", HostArray{{samples}, {}});
  }
  return hb;
}

HostBatch Mlp::make_batch(Rng& rng, std::int64_t samples, DataDomain domain, const ExactSpec& ex) const {
  HostBatch hb;
  hb.samples = samples;
  const std::int64_t in = spec_.dims.front(), out = spec_.dims.back();
  HostArray x{{samples, in}, {}};
  for (std::int64_t i = 0; i < samples * in; ++i) x.values.push_back(draw_value(rng, domain, ex));
  hb.arrays.emplace("x", std::move(x));
  if (spec_.loss == LossKind::linear) {
    HostArray c{{samples, out}, {}};
    for (std::int64_t i = 0; i < samples * out; ++i) {
      const double v = domain == DataDomain::exact
                           ? std::ldexp(static_cast<double>(rng.range(-ex.max_k, ex.max_k) * ex.grad_multiple), -ex.scale_exp)
                           : rng.normal();
      c.values.push_back(v);
    }
    hb.arrays.emplace("c", std::move(c));
  } else {
    // Learnable labels: the argmax of a fixed random "teacher" map of x, the same for every batch.
    Rng teacher(0x7eac4e5);
    std::vector<double> t(static_cast<std::size_t>(in * out));
    for (double& v : t) v = teacher.normal();
    HostArray labels{{samples}, {}};
    const std::vector<double>& xv = hb.arrays.at("x").values;
    for (std::int64_t i = 0; i < samples; ++i) {
      std::int64_t best = 0;
      double best_v = -1e300;
      for (std::int64_t o = 0; o < out; ++o) {
        double v = 0;
        for (std::int64_t k = 0; k < in; ++k) v += xv[static_cast<std::size_t>(i * in + k)] * t[static_cast<std::size_t>(k * out + o)];
        if (v > best_v) {
          best_v = v;
          best = o;
        }
      }
      labels.values.push_back(static_cast<double>(best));
    }
    hb.arrays.emplace("labels", std::move(labels));
  }
  return hb;
}

// Note [The MLP's activations, as autograd keeps them]
// What the forward keeps for backward, and when it frees the rest, follow what torch's autograd
// does for the twin's forward (reference/deepspeed/twin.py MlpTwin: Linear, relu, then
// (c * h).sum() / B), as DeepSpeed's measured memory shows it: a Linear saves its input (the
// previous layer's kept output), relu saves its result and not its input, so a layer's output
// before relu is freed once relu has run (relu's backward masks by the result, which is positive
// exactly where its input is); the last layer's output is saved by nothing (the loss's product
// saves c, the factor that needs no grad) and lives until the forward returns. A layer output
// that no backward reads is a temporary, the kept ones activations. Each saved tensor is freed
// once the last node that reads it has run, the batch's x and c included: DeepSpeed's run drops
// the batch after the backward, and holding them to the next forward was 40 B more after each
// step on a [3,4,2] MLP. In the backward a Linear's incoming grad goes once its node has run (held
// to the end of the backward it was 16 B over DeepSpeed's activations on that MLP), and the bias's
// hook runs before the weight's (backward_from; not under ZeRO-3: Note [Which autograd node hands a
// Linear its grads]), which is where DeepSpeed's ipg buckets close.
Tensor Mlp::layer_forward(Device& dev, Linear& l, const Tensor& x, bool kept) {
  l.run_pre_forward();
  Tensor h = dev.alloc(dtype_, {x.dim(0), l.out_features}, l.path() + ".out",
                       kept ? MemCategory::activations : MemCategory::temporaries);  // [B, out]
  dev.matmul(h, x, l.weight().data, false, true, false);
  dev.add_row_vector(h, l.bias().data);
  l.run_post_forward();
  return h;
}

Tensor Mlp::encode(Device& dev, const Tensor& x) {
  Tensor cur = x;
  for (std::size_t l = 0; l < num_layers(); ++l) {
    Tensor h = layer_forward(dev, layer(l), cur, /*kept=*/true);
    if (spec_.relu && l + 1 < num_layers()) dev.relu(h, h);
    cur = h;
  }
  return cur;
}

Tensor Mlp::forward_features(Device& dev, const Tensor& x) {
  batch_ = x.dim(0);
  acts_.assign(1, x);
  for (std::size_t l = 0; l < num_layers(); ++l) {
    const bool relu = spec_.relu && l + 1 < num_layers();
    const bool last = l + 1 == num_layers();
    Tensor h = layer_forward(dev, layer(l), acts_.back(), /*kept=*/!relu && !last);
    if (relu) {
      Tensor a = dev.alloc(dtype_, h.shape(), layer(l).path() + ".relu", MemCategory::activations);
      dev.relu(a, h);
      acts_.push_back(a);  // h is freed here (Note [The MLP's activations, as autograd keeps them])
    } else {
      acts_.push_back(h);
    }
  }
  return acts_.back();
}

double Mlp::forward(Device& dev, const Batch& batch) {
  run_pre_forward();
  forward_features(dev, batch.at("x"));
  double loss;
  const Tensor& out = acts_.back();
  if (spec_.loss == LossKind::linear) {
    coeff_ = batch.at("c");
    Tensor sum;  // the twin's (c * h).sum(), 0-dim, until it is divided by B (the engine's loss)
    {  // c * h: a [B, out] product that lives until its sum is taken
      Tensor prod = dev.alloc(dtype_, out.shape(), "loss.c_times_out", MemCategory::temporaries);
      dev.mul(prod, coeff_, out);
      sum = dev.alloc(dtype_, {1}, "loss.sum", MemCategory::temporaries);
    }
    loss = dev.dot(coeff_, out) / static_cast<double>(batch_);
  } else {
    dlogits_ = dev.alloc(dtype_, out.shape(), "dlogits", MemCategory::activations);
    Tensor rows = dev.alloc(DType::f32, {batch_}, "row_loss", MemCategory::temporaries);
    dev.softmax_xent(dlogits_, rows, out, batch.at("labels"));
    Tensor ones = dev.alloc(DType::f32, {batch_}, "ones", MemCategory::temporaries);
    dev.fill(ones, 1.0);
    loss = dev.dot(rows, ones) / static_cast<double>(batch_);
  }
  run_post_forward();
  out_shape_ = out.shape();
  if (num_layers() > 0) acts_.back() = Tensor();  // the output: no backward reads it (the loss's gradient is c / B or dlogits)
  return loss;
}

void Mlp::backward(Device& dev, double loss_scale, std::int64_t ga) {
  ZC_ASSERT(acts_.size() == num_layers() + 1, "backward without forward");
  // The twin's linear loss (c * out).sum() / B: DivBackward0 makes the 0-dim sum's gradient from
  // the loss's (then freed), MulBackward0 the output's from it (freed after).
  Tensor dsum;
  if (spec_.loss == LossKind::linear) {
    dsum = dev.alloc(dtype_, {1}, "loss.sum's grad", MemCategory::activations);
    loss_grad_ = Tensor();
  }
  Tensor dy = dev.alloc(dtype_, out_shape_, "dout",
                        MemCategory::activations);  // [B, out]
  dsum = loss_grad_ = Tensor();  // cross entropy: its node read the loss's gradient
  dev.copy(dy, spec_.loss == LossKind::linear ? coeff_ : dlogits_);
  coeff_ = dlogits_ = Tensor();  // the loss's node has run: what it saved is freed
  dev.div(dy, static_cast<double>(batch_));  // mean over the micro-batch
  dev.scale(dy, loss_scale);                   // the fp16 loss scale (a power of two)
  dev.div(dy, static_cast<double>(ga));        // DeepSpeed divides output grads by GA
  backward_from(dev, std::move(dy));  // the Linear's node frees it once it has run
}

// Node by node as torch's autograd runs the twin's backward (Note [The MLP's activations, as
// autograd keeps them]): a Linear's input grad, then its weight and bias grads, which become the
// params' .grad without a copy when they have none (AccumulateGrad); relu's backward writes a new
// tensor; a saved activation is freed once the last node that reads it has run.
void Mlp::backward_from(Device& dev, Tensor dy) {
  run_pre_backward();
  for (std::size_t li = num_layers(); li-- > 0;) {
    Linear& l = layer(li);
    // The relu on this Linear's output is the model's op, not the Linear's: its node runs first,
    // and the Linear's pre-backward hook (ZeRO-3's gather) fires on the grad it makes, once the
    // relu's result and incoming grad are freed.
    if (spec_.relu && li + 1 < num_layers()) {
      Tensor g = dev.alloc(dtype_, dy.shape(), "drelu", MemCategory::activations);  // [B, out]
      dev.relu_backward(g, dy, acts_[li + 1]);  // masked by relu's result
      acts_[li + 1] = Tensor();
      dy = g;
    }
    l.run_pre_backward();
    const Tensor& x = acts_[li];  // [B, in]
    Tensor dx;
    if (li > 0) {
      dx = dev.alloc(dtype_, x.shape(), "dx", MemCategory::activations);  // [B, in]
      dev.matmul(dx, dy, l.weight().data, false, false, false);
    }
    // grads from the start: what autograd hands to AccumulateGrad is a param's grad for all its
    // life, kept as .grad or added into one (DeepSpeed's side sees it through a hook on the param).
    Tensor dw = dev.alloc(dtype_, l.weight().shape, "dW", MemCategory::grads);  // [out, in]
    dev.matmul(dw, dy, x, true, false, false);
    Tensor db = dev.alloc(dtype_, l.bias().shape, "db", MemCategory::grads);  // [out]
    dev.sum_rows(db, dy, false);
    dy = Tensor();  // the Linear's node has run: its incoming grad goes before the params' hooks
    // The bias's hook first but under ZeRO-3 (Note [Which autograd node hands a Linear its grads]).
    accumulate_linear_grads(dev, l.weight(), std::move(dw), &l.bias(), std::move(db));
    // DeepSpeed's post-backward hook fires only through an input that requires grad: the first
    // layer's is data (Note [ZeRO-3's parameter coordinator]), and so is the model's.
    if (li > 0) l.run_post_backward();
    dy = dx;
    // Its Linear's node has run: the saved input is freed (the batch's x for the first layer), but
    // for a relu's result, which the previous layer's relu node reads too (freed there, above).
    if (li == 0 || !spec_.relu) acts_[li] = Tensor();
  }
}

}  // namespace zc
