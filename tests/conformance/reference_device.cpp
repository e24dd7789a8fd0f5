// ReferenceDevice: every op from its comment in engine/device.h, read literally, sharing no code
// with HostDevice or engine/optimizer_math.h (only engine/dtype.h's 16-bit conversions, which have
// their own tests). Built with -ffp-contract=off like the rest: each + and * rounds where written.
#include "tests/conformance/reference_device.h"

#include "engine/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace zc::conformance {

namespace {

void require(bool ok, std::string_view op, std::string_view what) {
  if (!ok) throw UsageError(fmt::format("reference {}: {}", op, what));
}

void same_numel(std::string_view op, const Tensor& a, const Tensor& b) {
  require(a.numel() == b.numel(), op,
          fmt::format("operands of {} and {} elements", a.numel(), b.numel()));
}

std::int64_t rows_of(std::string_view op, const Tensor& t) {
  require(t.ndim() == 2, op, fmt::format("{} must be 2-D", t.describe()));
  return t.dim(0);
}

// ---- elements: explicit conversions, 16-bit values widened exactly and rounded once on store ----
std::byte* at(const Tensor& t, std::int64_t i) {
  return static_cast<std::byte*>(t.raw()) + i * dtype_size(t.dtype());
}

// Element i of t as T (float or double). An f64 element read as float rounds once (the optimizer
// kernels read their grad as f32 whatever its dtype).
template <class T>
T get(const Tensor& t, std::int64_t i) {
  const std::byte* p = at(t, i);
  if (t.dtype() == DType::f64) {
    double d = 0;
    std::memcpy(&d, p, sizeof d);
    return static_cast<T>(d);
  }
  if (t.dtype() == DType::f32) {
    float f = 0;
    std::memcpy(&f, p, sizeof f);
    return static_cast<T>(f);
  }
  std::uint16_t h = 0;
  std::memcpy(&h, p, sizeof h);
  return static_cast<T>(t.dtype() == DType::f16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h));
}

// Stores v into element i of t: exact into f64; one rounding into f32; into 16-bit via f32 (a
// double goes through f32 first, engine/dtype.h), rounding to nearest even.
template <class T>
void put(const Tensor& t, std::int64_t i, T v) {
  std::byte* p = at(t, i);
  if (t.dtype() == DType::f64) {
    const double d = static_cast<double>(v);
    std::memcpy(p, &d, sizeof d);
    return;
  }
  const float f = static_cast<float>(v);
  if (t.dtype() == DType::f32) {
    std::memcpy(p, &f, sizeof f);
    return;
  }
  const std::uint16_t h = t.dtype() == DType::f16 ? f32_to_f16_bits(f) : f32_to_bf16_bits(f);
  std::memcpy(p, &h, sizeof h);
}

// The compute type (device.h's header): double if any operand is f64, else float.
template <class Fn>
void in_compute_type(std::initializer_list<const Tensor*> operands, Fn&& fn) {
  bool f64 = false;
  for (const Tensor* t : operands) f64 = f64 || t->dtype() == DType::f64;
  if (f64) {
    fn(0.0);
  } else {
    fn(0.0f);
  }
}

// exp and log are the only operations here that IEEE does not round: evaluated one type wider and
// rounded once, they are the correctly rounded values (but for rare double roundings). Only the ops
// the table checks within a bound (softmax_xent, causal_softmax, log_softmax_nll,
// log_softmax_backward) call them.
float wide_exp(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }
double wide_exp(double x) { return static_cast<double>(std::exp(static_cast<long double>(x))); }
float wide_log(float x) { return static_cast<float>(std::log(static_cast<double>(x))); }
double wide_log(double x) { return static_cast<double>(std::log(static_cast<long double>(x))); }

// ---- Note [Canonical reduction order] ----
// One stride-halving tree: v[i] = v[i] + v[i + half] for half = size/2, size/4, ..., 1.
double halving_tree(std::vector<double> v) {
  ZC_ASSERT(!v.empty() && (v.size() & (v.size() - 1)) == 0, "tree of {} leaves", v.size());
  for (std::size_t half = v.size() / 2; half > 0; half /= 2) {
    for (std::size_t i = 0; i < half; ++i) v[i] = v[i] + v[i + half];
  }
  return v[0];
}

// sum of leaf(i), i < n, in f64: blocks of kReduceBlock leaves, each a tree over the block padded
// with zeros to kReduceBlock, then a tree over the partials padded with zeros to a power of two.
template <class Leaf>
double canonical_sum(std::int64_t n, Leaf leaf) {
  std::vector<double> partials;
  for (std::int64_t lo = 0; lo < n; lo += kReduceBlock) {
    std::vector<double> block(static_cast<std::size_t>(kReduceBlock), 0.0);
    for (std::int64_t i = lo; i < n && i < lo + kReduceBlock; ++i) {
      block[static_cast<std::size_t>(i - lo)] = leaf(i);
    }
    partials.push_back(halving_tree(std::move(block)));
  }
  std::size_t padded = 1;
  while (padded < partials.size()) padded *= 2;
  partials.resize(padded, 0.0);
  return halving_tree(std::move(partials));
}

// Token ids and labels are stored as floats: the integer part, in [0, limit).
std::vector<std::int64_t> read_ids(std::string_view op, const Tensor& ids, std::int64_t limit) {
  std::vector<std::int64_t> out;
  for (std::int64_t n = 0; n < ids.numel(); ++n) {
    const auto id = static_cast<std::int64_t>(get<double>(ids, n));
    require(id >= 0 && id < limit, op,
            fmt::format("id {} of row {} outside [0, {})", id, n, limit));
    out.push_back(id);
  }
  return out;
}

}  // namespace

// ---- memory ----

Tensor ReferenceDevice::do_alloc(DType dtype, Shape shape, std::string label, MemCategory) {
  const std::int64_t bytes = shape_numel(shape) * dtype_size(dtype);
  void* data = std::calloc(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)), 1);
  require(data != nullptr, "alloc", fmt::format("out of host memory ({} bytes)", bytes));
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->owner = std::shared_ptr<void>(data, [](void* ptr) { std::free(ptr); });
  storage->bytes = bytes;
  storage->placement = Placement::host;
  storage->id = next_id_++;
  storage->name = std::move(label);
  return Tensor(dtype, std::move(shape), Placement::host, std::move(storage));
}

void ReferenceDevice::copy(const Tensor& dst, const Tensor& src) {
  same_numel("copy", dst, src);
  require(dst.dtype() == src.dtype(), "copy", "dtypes differ");
  if (src.nbytes() > 0) std::memmove(dst.raw(), src.raw(), static_cast<std::size_t>(src.nbytes()));
}

void ReferenceDevice::copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows,
                              std::int64_t cols, std::int64_t dst_stride, std::int64_t src_stride) {
  require(dst.dtype() == src.dtype(), "copy_2d", "dtypes differ");
  require(rows >= 0 && cols >= 0, "copy_2d", "negative extent");
  const std::int64_t last_dst = rows == 0 ? 0 : (rows - 1) * dst_stride + cols;
  const std::int64_t last_src = rows == 0 ? 0 : (rows - 1) * src_stride + cols;
  require(dst.numel() >= last_dst && src.numel() >= last_src, "copy_2d", "a view is too short");
  require(rows <= 1 || (dst_stride >= cols && src_stride >= cols), "copy_2d", "strides must cover a row");
  require(rows == 0 || cols == 0 || !dst.overlaps(src), "copy_2d", "overlapping views");
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      std::memcpy(at(dst, r * dst_stride + c), at(src, r * src_stride + c),
                  static_cast<std::size_t>(dtype_size(src.dtype())));
    }
  }
}

void ReferenceDevice::fill(const Tensor& t, double value) {
  in_compute_type({&t}, [&]<class T>(T) {
    const auto v = static_cast<T>(value);  // the scalar in the compute type first
    for (std::int64_t i = 0; i < t.numel(); ++i) put<T>(t, i, v);
  });
}

void ReferenceDevice::upload(const Tensor& dst, std::span<const std::byte> src) {
  require(static_cast<std::int64_t>(src.size()) == dst.nbytes(), "upload", "byte count");
  if (!src.empty()) std::memcpy(dst.raw(), src.data(), src.size());
}

void ReferenceDevice::download(std::span<std::byte> dst, const Tensor& src) {
  require(static_cast<std::int64_t>(dst.size()) == src.nbytes(), "download", "byte count");
  if (!dst.empty()) std::memcpy(dst.data(), src.raw(), dst.size());
}

// ---- elementwise ----

void ReferenceDevice::cast(const Tensor& dst, const Tensor& src) {
  same_numel("cast", dst, src);
  in_compute_type({&dst, &src}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dst.numel(); ++i) put<T>(dst, i, get<T>(src, i));
  });
}

void ReferenceDevice::axpy(const Tensor& y, double alpha, const Tensor& x) {
  same_numel("axpy", y, x);
  in_compute_type({&y, &x}, [&]<class T>(T) {
    const auto a = static_cast<T>(alpha);
    for (std::int64_t i = 0; i < y.numel(); ++i) put<T>(y, i, get<T>(y, i) + a * get<T>(x, i));
  });
}

void ReferenceDevice::scale(const Tensor& x, double alpha) {
  in_compute_type({&x}, [&]<class T>(T) {
    const auto a = static_cast<T>(alpha);
    for (std::int64_t i = 0; i < x.numel(); ++i) put<T>(x, i, a * get<T>(x, i));
  });
}

void ReferenceDevice::div(const Tensor& x, double divisor) {
  in_compute_type({&x}, [&]<class T>(T) {
    const auto d = static_cast<T>(divisor);
    for (std::int64_t i = 0; i < x.numel(); ++i) put<T>(x, i, get<T>(x, i) / d);
  });
}

void ReferenceDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  same_numel("add", out, a);
  same_numel("add", out, b);
  in_compute_type({&out, &a, &b}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) put<T>(out, i, get<T>(a, i) + get<T>(b, i));
  });
}

void ReferenceDevice::mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  same_numel("mul", out, a);
  same_numel("mul", out, b);
  in_compute_type({&out, &a, &b}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) put<T>(out, i, get<T>(a, i) * get<T>(b, i));
  });
}

// ---- reductions (f64, canonical order) ----

double ReferenceDevice::sum_sq(const Tensor& x) {
  return canonical_sum(x.numel(), [&](std::int64_t i) {
    const double v = get<double>(x, i);
    return v * v;
  });
}

double ReferenceDevice::dot(const Tensor& a, const Tensor& b) {
  same_numel("dot", a, b);
  return canonical_sum(a.numel(),
                       [&](std::int64_t i) { return get<double>(a, i) * get<double>(b, i); });
}

double ReferenceDevice::max_abs(const Tensor& x) {
  double largest = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = std::fabs(get<double>(x, i));
    if (std::isnan(v)) return std::numeric_limits<double>::quiet_NaN();
    if (v > largest) largest = v;
  }
  return largest;
}

bool ReferenceDevice::has_inf_nan(const Tensor& x) {
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (!std::isfinite(get<double>(x, i))) return true;
  }
  return false;
}

// ---- optimizers: f32 states, every element in f32 ----

// Note [DeepSpeed CPU Adam], as written there: the scalars Step_AVX derives once per call, then one
// element at a time, the SIMD body's operand order below n & ~(simd_width - 1) and the scalar
// tail's from there on. Without bias correction DeepSpeed keeps bc1 = bc2 = 1.
void ReferenceDevice::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                const Tensor& exp_avg_sq, const AdamParams& p) {
  for (const Tensor* t : {&param, &exp_avg, &exp_avg_sq}) {
    require(t->dtype() == DType::f32, "adam_step", "param and states must be f32");
    same_numel("adam_step", param, *t);
  }
  same_numel("adam_step", param, grad);
  if (p.kernel != AdamKernel::ds_cpu) {
    throw NotImplementedError(
        "reference adam_step: only DeepSpeed's CPU Adam (ds_cpu) has written arithmetic");
  }
  require(p.simd_width >= 1 && (p.simd_width & (p.simd_width - 1)) == 0, "adam_step",
          "simd_width must be a power of two");
  const auto beta1 = static_cast<float>(p.beta1), beta2 = static_cast<float>(p.beta2);
  const auto lr = static_cast<float>(p.lr), eps = static_cast<float>(p.eps);
  const auto weight_decay = static_cast<float>(p.weight_decay);
  const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;
  if (p.bias_correction) {
    bias_correction1 = 1.0f - p.beta1_pow;
    bias_correction2 = 1.0f / std::sqrt(1.0f - p.beta2_pow);
  }
  const float step_size = -lr / bias_correction1;
  const float decay_factor = -lr * weight_decay;
  const bool l2 = !p.adamw && weight_decay > 0.0f, decoupled = p.adamw && weight_decay > 0.0f;
  const std::int64_t n = param.numel(), body = n - n % p.simd_width;
  for (std::int64_t i = 0; i < n; ++i) {
    float g = get<float>(grad, i), w = get<float>(param, i);
    float m = get<float>(exp_avg, i), v = get<float>(exp_avg_sq, i);
    if (l2) g = std::fma(w, weight_decay, g);
    if (i < body) {
      m = std::fma(g, one_minus_beta1, m * beta1);
      v = std::fma(g * g, one_minus_beta2, v * beta2);
    } else {
      m = std::fma(m, beta1, g * one_minus_beta1);
      v = std::fma(v, beta2, (g * g) * one_minus_beta2);
    }
    const float update = m / std::fma(std::sqrt(v), bias_correction2, eps);
    if (decoupled) w = std::fma(w, decay_factor, w);
    w = std::fma(update, step_size, w);
    put(param, i, w);
    put(exp_avg, i, m);
    put(exp_avg_sq, i, v);
  }
}

// Note [PyTorch CPU SGD]: torch.optim.SGD's single-tensor step; each Tensor.add(x, alpha=a) is
// fma(x, a, self); scalars are Python doubles rounded once to f32.
void ReferenceDevice::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                               const SgdParams& p) {
  require(param.dtype() == DType::f32, "sgd_step", "param must be f32");
  same_numel("sgd_step", param, grad);
  const bool with_momentum = p.momentum != 0.0, with_decay = p.weight_decay != 0.0;
  if (with_momentum) {
    require(momentum_buf.dtype() == DType::f32, "sgd_step", "momentum_buffer must be f32");
    same_numel("sgd_step", param, momentum_buf);
  }
  const auto neg_lr = static_cast<float>(-p.lr), weight_decay = static_cast<float>(p.weight_decay);
  const auto momentum = static_cast<float>(p.momentum);
  const auto one_minus_dampening = static_cast<float>(1.0 - p.dampening);
  for (std::int64_t i = 0; i < param.numel(); ++i) {
    const float w = get<float>(param, i);
    float g = get<float>(grad, i);
    if (with_decay) g = std::fma(w, weight_decay, g);  // grad.add(param, alpha=weight_decay)
    if (with_momentum) {
      // first step: buf = clone(grad); later: buf.mul_(momentum).add_(grad, alpha=1-dampening)
      const float buf = p.first_step ? g
                                     : std::fma(g, one_minus_dampening,
                                                get<float>(momentum_buf, i) * momentum);
      put(momentum_buf, i, buf);
      g = p.nesterov ? std::fma(buf, momentum, g) : buf;  // grad.add(buf, alpha=momentum)
    }
    put(param, i, std::fma(g, neg_lr, w));  // param.add_(grad, alpha=-lr)
  }
}

// ---- model ops ----

void ReferenceDevice::matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                             bool trans_b, bool accumulate) {
  require(out.ndim() == 2 && a.ndim() == 2 && b.ndim() == 2, "matmul", "operands must be 2-D");
  const std::int64_t m = out.dim(0), n = out.dim(1), k = trans_a ? a.dim(0) : a.dim(1);
  require((trans_a ? a.dim(1) : a.dim(0)) == m && (trans_b ? b.dim(1) : b.dim(0)) == k &&
              (trans_b ? b.dim(0) : b.dim(1)) == n,
          "matmul", "shapes do not agree");
  // op(a)[i,kk] and op(b)[kk,j]: a is [m,k] or, transposed, [k,m]; b is [k,n] or [n,k].
  const auto a_at = [&](std::int64_t i, std::int64_t l) { return trans_a ? l * m + i : i * k + l; };
  const auto b_at = [&](std::int64_t l, std::int64_t j) { return trans_b ? j * k + l : l * n + j; };
  in_compute_type({&out, &a, &b}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        T sum = 0;  // f32 (or f64) sum in ascending k
        for (std::int64_t kk = 0; kk < k; ++kk) {
          sum = sum + get<T>(a, a_at(i, kk)) * get<T>(b, b_at(kk, j));
        }
        const T base = accumulate ? get<T>(out, i * n + j) : T(0);
        put<T>(out, i * n + j, base + sum);
      }
    }
  });
}

// The comment names relu only; this is max(x, 0) with relu_backward's predicate: x > 0 passes, and
// everything else (-0, NaN) gives +0.
void ReferenceDevice::relu(const Tensor& out, const Tensor& x) {
  same_numel("relu", out, x);
  in_compute_type({&out, &x}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = get<T>(x, i);
      put<T>(out, i, v > T(0) ? v : T(0));
    }
  });
}

void ReferenceDevice::relu_backward(const Tensor& grad_in, const Tensor& grad_out,
                                    const Tensor& x) {
  same_numel("relu_backward", grad_in, grad_out);
  same_numel("relu_backward", grad_in, x);
  in_compute_type({&grad_in, &grad_out, &x}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      put<T>(grad_in, i, get<T>(x, i) > T(0) ? get<T>(grad_out, i) : T(0));
    }
  });
}

void ReferenceDevice::add_row_vector(const Tensor& out, const Tensor& row) {
  rows_of("add_row_vector", out);
  const std::int64_t n = out.dim(1);
  require(row.numel() == n, "add_row_vector", "row does not fit");
  in_compute_type({&out, &row}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      put<T>(out, i, get<T>(out, i) + get<T>(row, i % n));
    }
  });
}

void ReferenceDevice::sum_rows(const Tensor& out, const Tensor& x, bool accumulate) {
  const std::int64_t m = rows_of("sum_rows", x), n = x.dim(1);
  require(out.numel() == n, "sum_rows", "out does not fit");
  in_compute_type({&out, &x}, [&]<class T>(T) {
    for (std::int64_t j = 0; j < n; ++j) {
      T sum = 0;  // ascending m
      for (std::int64_t i = 0; i < m; ++i) sum = sum + get<T>(x, i * n + j);
      put<T>(out, j, (accumulate ? get<T>(out, j) : T(0)) + sum);
    }
  });
}

namespace {

// logits [B,C] with labels (and row_loss, when given) of [B] beside out [B,C]: the labels, checked.
std::vector<std::int64_t> loss_labels(const char* op, const Tensor& out, const Tensor* row_loss,
                                      const Tensor& logits, const Tensor& labels) {
  const std::int64_t rows = rows_of(op, logits);
  same_numel(op, out, logits);
  require(labels.numel() == rows && (row_loss == nullptr || row_loss->numel() == rows), op,
          "labels and row_loss need one element per row");
  return read_ids(op, labels, logits.dim(1));
}

// Row r's largest value and sum_c exp(x - largest) (ascending c), in the compute type.
template <class T>
std::pair<T, T> largest_and_denom(const Tensor& logits, std::int64_t r) {
  const std::int64_t cols = logits.dim(1);
  T largest = -std::numeric_limits<T>::infinity();
  for (std::int64_t c = 0; c < cols; ++c) {
    const T v = get<T>(logits, r * cols + c);
    largest = v > largest ? v : largest;
  }
  T denom = 0;
  for (std::int64_t c = 0; c < cols; ++c) denom = denom + wide_exp(get<T>(logits, r * cols + c) - largest);
  return {largest, denom};
}

}  // namespace

// logits [B,C], labels [B]. Per row, in the compute type: max, denom = sum_c exp(x - max)
// (ascending c), dlogits = exp(x - max) / denom - onehot, loss = log(denom) - (x[label] - max).
void ReferenceDevice::softmax_xent(const Tensor& dlogits, const Tensor& row_loss,
                                   const Tensor& logits, const Tensor& labels) {
  const std::vector<std::int64_t> label =
      loss_labels("softmax_xent", dlogits, &row_loss, logits, labels);
  const std::int64_t rows = logits.dim(0), cols = logits.dim(1);
  in_compute_type({&dlogits, &row_loss, &logits}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto x = [&](std::int64_t c) { return get<T>(logits, r * cols + c); };
      const auto [largest, denom] = largest_and_denom<T>(logits, r);
      for (std::int64_t c = 0; c < cols; ++c) {
        const T prob = wide_exp(x(c) - largest) / denom;
        put<T>(dlogits, r * cols + c, c == label[static_cast<std::size_t>(r)] ? prob - T(1) : prob);
      }
      put<T>(row_loss, r, wide_log(denom) - (x(label[static_cast<std::size_t>(r)]) - largest));
    }
  });
}

// As softmax_xent: logp = (x - max) - log(denom); the loss is the mean of the rows'
// log(denom) - (x[label] - max), each computed from the logits, not read back from logp.
void ReferenceDevice::log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                                      const Tensor& labels) {
  require(loss.numel() == 1, "log_softmax_nll", "the loss is one element");
  const std::vector<std::int64_t> label =
      loss_labels("log_softmax_nll", logp, nullptr, logits, labels);
  const std::int64_t rows = logits.dim(0), cols = logits.dim(1);
  in_compute_type({&logp, &loss, &logits}, [&]<class T>(T) {
    T sum = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto x = [&](std::int64_t c) { return get<T>(logits, r * cols + c); };
      const auto [largest, denom] = largest_and_denom<T>(logits, r);
      const T log_denom = wide_log(denom);
      for (std::int64_t c = 0; c < cols; ++c) put<T>(logp, r * cols + c, (x(c) - largest) - log_denom);
      sum = sum + (log_denom - (x(label[static_cast<std::size_t>(r)]) - largest));
    }
    put<T>(loss, 0, sum / static_cast<T>(rows));
  });
}

void ReferenceDevice::nll_loss_backward(const Tensor& grad, const Tensor& labels, double value) {
  const std::int64_t rows = rows_of("nll_loss_backward", grad), cols = grad.dim(1);
  require(labels.numel() == rows, "nll_loss_backward", "labels need one element per row");
  const std::vector<std::int64_t> label = read_ids("nll_loss_backward", labels, cols);
  in_compute_type({&grad}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        put<T>(grad, r * cols + c, c == label[static_cast<std::size_t>(r)] ? static_cast<T>(value) : T(0));
      }
    }
  });
}

void ReferenceDevice::log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) {
  const std::int64_t rows = rows_of("log_softmax_backward", logp), cols = logp.dim(1);
  same_numel("log_softmax_backward", dx, logp);
  same_numel("log_softmax_backward", dout, logp);
  in_compute_type({&dx, &dout, &logp}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      T sum = 0;  // ascending c
      for (std::int64_t c = 0; c < cols; ++c) sum = sum + get<T>(dout, r * cols + c);
      for (std::int64_t c = 0; c < cols; ++c) {
        put<T>(dx, r * cols + c, get<T>(dout, r * cols + c) - wide_exp(get<T>(logp, r * cols + c)) * sum);
      }
    }
  });
}

std::vector<std::int64_t> ReferenceDevice::argmax_rows(const Tensor& x) {
  const std::int64_t rows = rows_of("argmax_rows", x), cols = x.dim(1);
  require(cols > 0 || rows == 0, "argmax_rows", "rows of no columns have no argmax");
  std::vector<std::int64_t> out;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t first_largest = 0;  // a later equal value does not replace it
    for (std::int64_t c = 1; c < cols; ++c) {
      const double v = get<double>(x, r * cols + c);
      if (v > get<double>(x, r * cols + first_largest)) first_largest = c;
    }
    out.push_back(first_largest);
  }
  return out;
}

void ReferenceDevice::scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) {
  const std::int64_t rows = rows_of("scale_rows", x), cols = x.dim(1);
  same_numel("scale_rows", out, x);
  require(s.numel() == rows, "scale_rows", "one scale per row");
  in_compute_type({&out, &x, &s}, [&]<class T>(T) {
    for (std::int64_t b = 0; b < rows; ++b) {
      for (std::int64_t j = 0; j < cols; ++j) {
        put<T>(out, b * cols + j, get<T>(s, b) * get<T>(x, b * cols + j));
      }
    }
  });
}

void ReferenceDevice::row_dot(const Tensor& out, const Tensor& a, const Tensor& c) {
  const std::int64_t rows = rows_of("row_dot", a), cols = a.dim(1);
  same_numel("row_dot", a, c);
  require(out.numel() == rows, "row_dot", "one output per row");
  in_compute_type({&out, &a, &c}, [&]<class T>(T) {
    for (std::int64_t b = 0; b < rows; ++b) {
      T sum = 0;  // ascending j
      for (std::int64_t j = 0; j < cols; ++j) {
        sum = sum + get<T>(a, b * cols + j) * get<T>(c, b * cols + j);
      }
      put<T>(out, b, sum);
    }
  });
}

// ---- transformer ops ----

void ReferenceDevice::embedding(const Tensor& out, const Tensor& table, const Tensor& ids) {
  const std::int64_t vocab = rows_of("embedding", table), dim = table.dim(1);
  require(out.numel() == ids.numel() * dim, "embedding", "out must be [N, D]");
  const std::vector<std::int64_t> id = read_ids("embedding", ids, vocab);
  in_compute_type({&out, &table}, [&]<class T>(T) {
    for (std::size_t n = 0; n < id.size(); ++n) {
      for (std::int64_t j = 0; j < dim; ++j) {
        put<T>(out, static_cast<std::int64_t>(n) * dim + j, get<T>(table, id[n] * dim + j));
      }
    }
  });
}

void ReferenceDevice::embedding_backward(const Tensor& dtable, const Tensor& dout,
                                         const Tensor& ids) {
  const std::int64_t vocab = rows_of("embedding_backward", dtable), dim = dtable.dim(1);
  require(dout.numel() == ids.numel() * dim, "embedding_backward", "dout must be [N, D]");
  const std::vector<std::int64_t> id = read_ids("embedding_backward", ids, vocab);
  in_compute_type({&dtable, &dout}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dtable.numel(); ++i) put<T>(dtable, i, T(0));
    for (std::size_t n = 0; n < id.size(); ++n) {  // ascending n; each += stores (and rounds)
      for (std::int64_t j = 0; j < dim; ++j) {
        const std::int64_t to = id[n] * dim + j, from = static_cast<std::int64_t>(n) * dim + j;
        put<T>(dtable, to, get<T>(dtable, to) + get<T>(dout, from));
      }
    }
  });
}

// out uses rstd as computed, before it is stored: "16-bit operands are computed in f32 and
// rounded once on store" (device.h) rules out reading back a rounded rstd.
void ReferenceDevice::rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x,
                              const Tensor& w, double eps) {
  const std::int64_t rows = rows_of("rmsnorm", x), dim = x.dim(1);
  same_numel("rmsnorm", out, x);
  require(w.numel() == dim && rstd.numel() == rows, "rmsnorm", "w [D] and rstd [N]");
  in_compute_type({&out, &rstd, &x, &w}, [&]<class T>(T) {
    const auto e = static_cast<T>(eps);
    for (std::int64_t r = 0; r < rows; ++r) {
      T squares = 0;  // ascending j
      for (std::int64_t j = 0; j < dim; ++j) {
        squares = squares + get<T>(x, r * dim + j) * get<T>(x, r * dim + j);
      }
      const T inv_rms = T(1) / std::sqrt(squares / static_cast<T>(dim) + e);
      put<T>(rstd, r, inv_rms);
      for (std::int64_t j = 0; j < dim; ++j) {
        put<T>(out, r * dim + j, (get<T>(x, r * dim + j) * inv_rms) * get<T>(w, j));
      }
    }
  });
}

void ReferenceDevice::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                       const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const std::int64_t rows = rows_of("rmsnorm_backward", x), dim = x.dim(1);
  same_numel("rmsnorm_backward", dx, x);
  same_numel("rmsnorm_backward", dout, x);
  require(w.numel() == dim && dw.numel() == dim && rstd.numel() == rows, "rmsnorm_backward",
          "w and dw [D], rstd [N]");
  in_compute_type({&dx, &dw, &dout, &x, &w, &rstd}, [&]<class T>(T) {
    const auto xi = [&](std::int64_t n, std::int64_t j) { return get<T>(x, n * dim + j); };
    const auto gi = [&](std::int64_t n, std::int64_t j) { return get<T>(dout, n * dim + j); };
    for (std::int64_t j = 0; j < dim; ++j) {
      T sum = 0;  // dw[j] = sum_n dout * x * rstd, ascending n
      for (std::int64_t n = 0; n < rows; ++n) sum = sum + gi(n, j) * xi(n, j) * get<T>(rstd, n);
      put<T>(dw, j, sum);
    }
    for (std::int64_t n = 0; n < rows; ++n) {
      const T s = get<T>(rstd, n);
      T c = 0;  // ascending j
      for (std::int64_t j = 0; j < dim; ++j) c = c + gi(n, j) * get<T>(w, j) * xi(n, j);
      const T k = s * s * c / static_cast<T>(dim);
      for (std::int64_t j = 0; j < dim; ++j) {
        put<T>(dx, n * dim + j, s * (get<T>(w, j) * gi(n, j) - xi(n, j) * k));
      }
    }
  });
}

void ReferenceDevice::causal_softmax(const Tensor& out, const Tensor& x) {
  const std::int64_t rows = rows_of("causal_softmax", x), cols = x.dim(1);
  same_numel("causal_softmax", out, x);
  in_compute_type({&out, &x}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = r % cols;  // the query position: keys 0..i
      const auto v = [&](std::int64_t j) { return get<T>(x, r * cols + j); };
      T largest = -std::numeric_limits<T>::infinity();
      for (std::int64_t j = 0; j <= i; ++j) largest = v(j) > largest ? v(j) : largest;
      T denom = 0;  // ascending j'
      for (std::int64_t j = 0; j <= i; ++j) denom = denom + wide_exp(v(j) - largest);
      for (std::int64_t j = 0; j < cols; ++j) {
        put<T>(out, r * cols + j, j <= i ? wide_exp(v(j) - largest) / denom : T(0));
      }
    }
  });
}

void ReferenceDevice::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) {
  const std::int64_t rows = rows_of("softmax_backward", p), cols = p.dim(1);
  same_numel("softmax_backward", dx, p);
  same_numel("softmax_backward", dout, p);
  in_compute_type({&dx, &dout, &p}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      T s = 0;  // sum_k p * dout, ascending k
      for (std::int64_t k = 0; k < cols; ++k) {
        s = s + get<T>(p, r * cols + k) * get<T>(dout, r * cols + k);
      }
      for (std::int64_t j = 0; j < cols; ++j) {
        put<T>(dx, r * cols + j, get<T>(p, r * cols + j) * (get<T>(dout, r * cols + j) - s));
      }
    }
  });
}

// out[a,c,b,d] = x[a,b,c,d], element by element, bytes unchanged (a copy, not a cast).
void ReferenceDevice::permute_0213(const Tensor& out, const Tensor& x, std::int64_t a,
                                   std::int64_t b, std::int64_t c, std::int64_t d) {
  same_numel("permute_0213", out, x);
  require(out.dtype() == x.dtype(), "permute_0213", "dtypes differ");
  require(a * b * c * d == x.numel(), "permute_0213", "[A,B,C,D] does not cover x");
  const auto esize = static_cast<std::size_t>(dtype_size(x.dtype()));
  for (std::int64_t ia = 0; ia < a; ++ia) {
    for (std::int64_t ib = 0; ib < b; ++ib) {
      for (std::int64_t ic = 0; ic < c; ++ic) {
        for (std::int64_t id = 0; id < d; ++id) {
          const std::int64_t from = ((ia * b + ib) * c + ic) * d + id;
          const std::int64_t to = ((ia * c + ic) * b + ib) * d + id;
          std::memcpy(at(out, to), at(x, from), esize);
        }
      }
    }
  }
}

// ---- transformer ops II, from device.h's comments ----

namespace {
// Note [Transcendentals]: the f64 function, rounded once to the compute type.
template <class T>
T tanh_in_f64(T v) {
  const double d = std::tanh(static_cast<double>(v));
  return static_cast<T>(d);
}
template <class T>
T exp_in_f64(T v) {
  const double d = std::exp(static_cast<double>(v));
  return static_cast<T>(d);
}
}  // namespace

void ReferenceDevice::layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const std::int64_t rows = rows_of("layernorm", x), dim = x.dim(1);
  same_numel("layernorm", out, x);
  require(w.numel() == dim && b.numel() == dim && mean.numel() == rows && rstd.numel() == rows,
          "layernorm", "w, b [D], mean, rstd [N]");
  in_compute_type({&out, &mean, &rstd, &x, &w, &b}, [&]<class T>(T) {
    for (std::int64_t n = 0; n < rows; ++n) {
      T total = 0;  // ascending j
      for (std::int64_t j = 0; j < dim; ++j) total = total + get<T>(x, n * dim + j);
      const T mu = total / static_cast<T>(dim);
      T squares = 0;  // ascending j
      for (std::int64_t j = 0; j < dim; ++j) {
        squares = squares + (get<T>(x, n * dim + j) - mu) * (get<T>(x, n * dim + j) - mu);
      }
      const T var = squares / static_cast<T>(dim);
      const T inv = T(1) / std::sqrt(var + static_cast<T>(eps));
      put<T>(mean, n, mu);
      put<T>(rstd, n, inv);
      for (std::int64_t j = 0; j < dim; ++j) {
        const T normed = (get<T>(x, n * dim + j) - mu) * inv;
        put<T>(out, n * dim + j, normed * get<T>(w, j) + get<T>(b, j));
      }
    }
  });
}

void ReferenceDevice::layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                         const Tensor& dout, const Tensor& x, const Tensor& w,
                                         const Tensor& mean, const Tensor& rstd) {
  const std::int64_t rows = rows_of("layernorm_backward", x), dim = x.dim(1);
  same_numel("layernorm_backward", dx, x);
  same_numel("layernorm_backward", dout, x);
  require(w.numel() == dim && dw.numel() == dim && db.numel() == dim && mean.numel() == rows &&
              rstd.numel() == rows,
          "layernorm_backward", "w, dw, db [D], mean, rstd [N]");
  in_compute_type({&dx, &dw, &db, &dout, &x, &w, &mean, &rstd}, [&]<class T>(T) {
    std::vector<T> xhat(static_cast<std::size_t>(rows * dim));
    for (std::int64_t n = 0; n < rows; ++n) {
      for (std::int64_t j = 0; j < dim; ++j) {
        xhat[static_cast<std::size_t>(n * dim + j)] =
            (get<T>(x, n * dim + j) - get<T>(mean, n)) * get<T>(rstd, n);
      }
    }
    for (std::int64_t j = 0; j < dim; ++j) {
      T sw = 0, sb = 0;  // ascending n
      for (std::int64_t n = 0; n < rows; ++n) {
        sw = sw + get<T>(dout, n * dim + j) * xhat[static_cast<std::size_t>(n * dim + j)];
        sb = sb + get<T>(dout, n * dim + j);
      }
      put<T>(dw, j, sw);
      put<T>(db, j, sb);
    }
    for (std::int64_t n = 0; n < rows; ++n) {
      std::vector<T> g(static_cast<std::size_t>(dim));
      T c1 = 0, c2 = 0;  // ascending j
      for (std::int64_t j = 0; j < dim; ++j) {
        g[static_cast<std::size_t>(j)] = get<T>(dout, n * dim + j) * get<T>(w, j);
        c1 = c1 + g[static_cast<std::size_t>(j)];
        c2 = c2 + g[static_cast<std::size_t>(j)] * xhat[static_cast<std::size_t>(n * dim + j)];
      }
      for (std::int64_t j = 0; j < dim; ++j) {
        const T first = g[static_cast<std::size_t>(j)] - c1 / static_cast<T>(dim);
        const T second = xhat[static_cast<std::size_t>(n * dim + j)] * (c2 / static_cast<T>(dim));
        put<T>(dx, n * dim + j, get<T>(rstd, n) * (first - second));
      }
    }
  });
}

void ReferenceDevice::gelu(const Tensor& out, const Tensor& x) {
  same_numel("gelu", out, x);
  in_compute_type({&out, &x}, [&]<class T>(T) {
    const auto c = static_cast<T>(0.79788456080286535588);
    const auto a = static_cast<T>(0.044715);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = get<T>(x, i);
      const T cube = (v * v) * v;
      const T t = tanh_in_f64(c * (v + a * cube));
      put<T>(out, i, (T(0.5) * v) * (T(1) + t));
    }
  });
}

void ReferenceDevice::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  same_numel("gelu_backward", dx, x);
  same_numel("gelu_backward", dout, x);
  in_compute_type({&dx, &dout, &x}, [&]<class T>(T) {
    const auto c = static_cast<T>(0.79788456080286535588);
    const auto a = static_cast<T>(0.044715);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = get<T>(x, i);
      const T t = tanh_in_f64(c * (v + a * ((v * v) * v)));
      const T left = T(0.5) * (T(1) + t);
      const T right = ((T(0.5) * v) * (T(1) - t * t)) * (c * (T(1) + (T(3) * a) * (v * v)));
      put<T>(dx, i, get<T>(dout, i) * (left + right));
    }
  });
}

void ReferenceDevice::swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  same_numel("swiglu", out, gate);
  same_numel("swiglu", out, up);
  in_compute_type({&out, &gate, &up}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      const T g = get<T>(gate, i);
      const T sigmoid = T(1) / (T(1) + exp_in_f64(-g));
      put<T>(out, i, (g * sigmoid) * get<T>(up, i));
    }
  });
}

void ReferenceDevice::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                      const Tensor& gate, const Tensor& up) {
  for (const Tensor* t : {&dup, &dout, &gate, &up}) same_numel("swiglu_backward", dgate, *t);
  in_compute_type({&dgate, &dup, &dout, &gate, &up}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dout.numel(); ++i) {
      const T g = get<T>(gate, i);
      const T sigmoid = T(1) / (T(1) + exp_in_f64(-g));
      put<T>(dup, i, get<T>(dout, i) * (g * sigmoid));
      const T slope = sigmoid * (T(1) + g * (T(1) - sigmoid));
      put<T>(dgate, i, (get<T>(dout, i) * get<T>(up, i)) * slope);
    }
  });
}

void ReferenceDevice::unary(const Tensor& out, const Tensor& x, Unary f) {
  same_numel(unary_name(f), out, x);
  in_compute_type({&out, &x}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = get<T>(x, i);
      if (f == Unary::tanh) put<T>(out, i, tanh_in_f64(v));
      if (f == Unary::silu) put<T>(out, i, v / (T(1) + exp_in_f64(-v)));
      if (f == Unary::cube) put<T>(out, i, (v * v) * v);
    }
  });
}

void ReferenceDevice::unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved,
                                     Unary f) {
  same_numel(unary_name(f), dx, saved);
  same_numel(unary_name(f), dout, saved);
  in_compute_type({&dx, &dout, &saved}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dx.numel(); ++i) {
      const T v = get<T>(saved, i);
      T slope = T(3) * (v * v);  // cube
      if (f == Unary::tanh) slope = T(1) - v * v;  // v is tanh's output
      if (f == Unary::silu) {
        const T sigmoid = T(1) / (T(1) + exp_in_f64(-v));
        slope = sigmoid * (T(1) + v * (T(1) - sigmoid));
      }
      put<T>(dx, i, get<T>(dout, i) * slope);
    }
  });
}

void ReferenceDevice::rope(const Tensor& out, const Tensor& x, std::int64_t seq,
                           std::int64_t heads, double base, bool inverse) {
  const std::int64_t rows = rows_of("rope", x), width = x.dim(1);
  same_numel("rope", out, x);
  require(heads >= 1 && seq >= 1 && width % heads == 0 && (width / heads) % 2 == 0, "rope",
          "[R, heads * dh] with an even dh");
  const std::int64_t dh = width / heads, half = dh / 2;
  in_compute_type({&out, &x}, [&]<class T>(T) {
    std::vector<T> row(static_cast<std::size_t>(width));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t k = 0; k < width; ++k) row[static_cast<std::size_t>(k)] = get<T>(x, r * width + k);
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t i = 0; i < half; ++i) {
          const double inv_freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
          const double angle = static_cast<double>(r % seq) * inv_freq;
          const T cs = static_cast<T>(std::cos(angle));
          const T sn = inverse ? static_cast<T>(-std::sin(angle)) : static_cast<T>(std::sin(angle));
          const T x1 = row[static_cast<std::size_t>(h * dh + i)];
          const T x2 = row[static_cast<std::size_t>(h * dh + i + half)];
          put<T>(out, r * width + h * dh + i, x1 * cs - x2 * sn);
          put<T>(out, r * width + h * dh + i + half, x2 * cs + x1 * sn);
        }
      }
    }
  });
}

// ---- MoE routing (device.h), from the comments: softmax, top-k, DeepSpeed's capacity order, the
// clamped renormalisation; no code shared with engine/moe_ops.cpp. ----
MoeRoute ReferenceDevice::moe_gate(const Tensor& weights, const Tensor& index, const Tensor& probs,
                                   const Tensor& logits, std::int64_t capacity) {
  const std::int64_t N = rows_of("moe_gate", logits), E = logits.dim(1);
  require(index.ndim() == 2 && index.dim(0) == N && weights.numel() == index.numel() &&
              probs.numel() == logits.numel() && index.dim(1) >= 1 && index.dim(1) <= E,
          "moe_gate", "shapes");
  const std::int64_t k = index.dim(1);
  MoeRoute route;
  route.tokens = N, route.k = k, route.experts = E, route.capacity = capacity;
  in_compute_type({&weights, &probs, &logits}, [&]<class T>(T) {
    std::vector<std::vector<std::int64_t>> chosen(static_cast<std::size_t>(N));
    for (std::int64_t n = 0; n < N; ++n) {
      const auto x = [&](std::int64_t e) { return get<T>(logits, n * E + e); };
      T largest = -std::numeric_limits<T>::infinity();
      for (std::int64_t e = 0; e < E; ++e) largest = x(e) > largest ? x(e) : largest;
      T denom = 0;
      for (std::int64_t e = 0; e < E; ++e) denom = denom + wide_exp(x(e) - largest);
      for (std::int64_t e = 0; e < E; ++e) put<T>(probs, n * E + e, wide_exp(x(e) - largest) / denom);
      // Recomputed, not read back from probs (which may be 16-bit): the choice is on the f32 value.
      const auto p = [&](std::int64_t e) { return wide_exp(x(e) - largest) / denom; };
      std::vector<std::int64_t>& c = chosen[static_cast<std::size_t>(n)];
      while (static_cast<std::int64_t>(c.size()) < k) {
        std::int64_t pick = -1;
        for (std::int64_t e = 0; e < E; ++e) {
          if (std::find(c.begin(), c.end(), e) != c.end()) continue;
          const bool better = pick < 0 || (!std::isnan(p(e)) && (std::isnan(p(pick)) || p(e) > p(pick)));
          if (better) pick = e;
        }
        c.push_back(pick);
      }
    }
    std::vector<std::int64_t> fill(static_cast<std::size_t>(E), 0);
    route.expert.assign(static_cast<std::size_t>(N * k), -1);
    route.slot.assign(static_cast<std::size_t>(N * k), -1);
    for (std::int64_t j = 0; j < k; ++j) {  // first choices of every token, then second ones, ...
      for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t e = chosen[static_cast<std::size_t>(n)][static_cast<std::size_t>(j)];
        const std::int64_t at = fill[static_cast<std::size_t>(e)]++;
        if (capacity > 0 && at >= capacity) continue;
        route.expert[static_cast<std::size_t>(n * k + j)] = e;
        route.slot[static_cast<std::size_t>(n * k + j)] = at;
      }
    }
    for (std::int64_t n = 0; n < N; ++n) {
      const auto& c = chosen[static_cast<std::size_t>(n)];
      T s = 0;
      std::vector<T> pj(static_cast<std::size_t>(k), T(0));
      {
        const auto x = [&](std::int64_t e) { return get<T>(logits, n * E + e); };
        T largest = -std::numeric_limits<T>::infinity();
        for (std::int64_t e = 0; e < E; ++e) largest = x(e) > largest ? x(e) : largest;
        T denom = 0;
        for (std::int64_t e = 0; e < E; ++e) denom = denom + wide_exp(x(e) - largest);
        for (std::int64_t j = 0; j < k; ++j) pj[static_cast<std::size_t>(j)] = wide_exp(x(c[static_cast<std::size_t>(j)]) - largest) / denom;
      }
      for (std::int64_t j = 0; j < k; ++j) {
        if (route.expert[static_cast<std::size_t>(n * k + j)] >= 0) s = s + pj[static_cast<std::size_t>(j)];
      }
      if (s < std::numeric_limits<T>::epsilon()) s = std::numeric_limits<T>::epsilon();
      for (std::int64_t j = 0; j < k; ++j) {
        const bool kept_j = route.expert[static_cast<std::size_t>(n * k + j)] >= 0;
        put<T>(weights, n * k + j, kept_j ? pj[static_cast<std::size_t>(j)] / s : T(0));
        put<float>(index, n * k + j, kept_j ? static_cast<float>(c[static_cast<std::size_t>(j)]) : -1.0f);
      }
    }
  });
  return route;
}

void ReferenceDevice::moe_gate_backward(const Tensor& dlogits, const Tensor& dweights,
                                        const Tensor& probs, const Tensor& weights,
                                        const Tensor& index) {
  const std::int64_t N = rows_of("moe_gate_backward", probs), E = probs.dim(1);
  require(index.ndim() == 2 && index.dim(0) == N && dweights.numel() == index.numel() &&
              weights.numel() == index.numel() && dlogits.numel() == probs.numel(),
          "moe_gate_backward", "shapes");
  const std::int64_t k = index.dim(1);
  in_compute_type({&dlogits, &dweights, &probs, &weights}, [&]<class T>(T) {
    for (std::int64_t n = 0; n < N; ++n) {
      std::vector<T> dp(static_cast<std::size_t>(E), T(0));
      T s = 0, c = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        const auto e = static_cast<std::int64_t>(get<float>(index, n * k + j));
        require(e >= -1 && e < E, "moe_gate_backward", "index outside [-1, E)");
        if (e < 0) continue;
        s = s + get<T>(probs, n * E + e);
        c = c + get<T>(dweights, n * k + j) * get<T>(weights, n * k + j);
      }
      if (s < std::numeric_limits<T>::epsilon()) {
        s = std::numeric_limits<T>::epsilon();
        c = 0;
      }
      for (std::int64_t j = 0; j < k; ++j) {
        const auto e = static_cast<std::int64_t>(get<float>(index, n * k + j));
        if (e >= 0) dp[static_cast<std::size_t>(e)] = (get<T>(dweights, n * k + j) - c) / s;
      }
      T t = 0;
      for (std::int64_t e = 0; e < E; ++e) t = t + get<T>(probs, n * E + e) * dp[static_cast<std::size_t>(e)];
      for (std::int64_t e = 0; e < E; ++e) {
        put<T>(dlogits, n * E + e, get<T>(probs, n * E + e) * (dp[static_cast<std::size_t>(e)] - t));
      }
    }
  });
}

void ReferenceDevice::gather_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  const std::int64_t M = rows_of("gather_rows", out), D = out.dim(1);
  const std::int64_t N = rows_of("gather_rows", x);
  require(x.dim(1) == D && index.numel() == M, "gather_rows", "shapes");
  for (std::int64_t m = 0; m < M; ++m) {
    const double at = get<double>(index, m);
    require(at == -1 || (at >= 0 && at < static_cast<double>(N) && at == std::floor(at)), "gather_rows",
            "index neither -1 nor a row");
    for (std::int64_t j = 0; j < D; ++j) {
      put<double>(out, m * D + j, at < 0 ? 0.0 : get<double>(x, static_cast<std::int64_t>(at) * D + j));
    }
  }
}

void ReferenceDevice::index_add_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  const std::int64_t N = rows_of("index_add_rows", out), D = out.dim(1);
  const std::int64_t M = rows_of("index_add_rows", x);
  require(x.dim(1) == D && index.numel() == M, "index_add_rows", "shapes");
  in_compute_type({&out, &x}, [&]<class T>(T) {
    for (std::int64_t m = 0; m < M; ++m) {
      const double at = get<double>(index, m);
      require(at == -1 || (at >= 0 && at < static_cast<double>(N) && at == std::floor(at)),
              "index_add_rows", "index neither -1 nor a row");
      if (at < 0) continue;
      const auto r = static_cast<std::int64_t>(at);
      for (std::int64_t j = 0; j < D; ++j) put<T>(out, r * D + j, get<T>(out, r * D + j) + get<T>(x, m * D + j));
    }
  });
}

}  // namespace zc::conformance
