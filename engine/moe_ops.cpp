// The MoE routing ops' default implementations (engine/device.h): read the operands back, compute
// on the host in the compute type, in the order device.h states, and write the results. Every
// backend but MetaDevice runs this code, so they agree bit for bit by construction; the Device
// conformance table checks it against an independent reference (tests/conformance/).
#include "engine/device.h"
#include "engine/errors.h"
#include "engine/host_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace zc {

namespace {

bool any_f64(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->dtype() == DType::f64) return true;
  }
  return false;
}

// [rows, cols] of a 2-D tensor, or a UsageError naming the op.
std::pair<std::int64_t, std::int64_t> rows_cols(const char* op, const Tensor& t) {
  if (t.ndim() != 2) throw UsageError(fmt::format("{}: {} must be 2-D", op, t.describe()));
  return {t.dim(0), t.dim(1)};
}

// The row an index value names: -1 (skip) or [0, rows); anything else is a UsageError.
std::int64_t row_of(const char* op, double v, std::int64_t m, std::int64_t rows) {
  if (v < 0) {
    if (v != -1) throw UsageError(fmt::format("{}: index {} of row {} is neither -1 nor a row", op, v, m));
    return -1;
  }
  const auto r = static_cast<std::int64_t>(v);
  if (static_cast<double>(r) != v || r >= rows) {
    throw UsageError(fmt::format("{}: index {} of row {} outside [0, {})", op, v, m, rows));
  }
  return r;
}

// The k largest of row p[0..E), largest first, first index on ties, NaN never over a number.
template <class T>
void top_k(const T* p, std::int64_t E, std::int64_t k, std::int64_t* out) {
  std::vector<bool> taken(static_cast<std::size_t>(E), false);
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t best = -1;
    for (std::int64_t e = 0; e < E; ++e) {
      if (taken[static_cast<std::size_t>(e)]) continue;
      if (best < 0 || p[e] > p[best] || (std::isnan(p[best]) && !std::isnan(p[e]))) best = e;
    }
    taken[static_cast<std::size_t>(best)] = true;
    out[j] = best;
  }
}

template <class T>
MoeRoute gate_on_host(Device& dev, const Tensor& weights, const Tensor& index, const Tensor& probs,
                      const Tensor& logits, std::int64_t capacity) {
  const auto [N, E] = rows_cols("moe_gate", logits);
  const std::vector<double> x = to_f64(dev, logits);
  std::vector<T> p(static_cast<std::size_t>(N * E));
  for (std::int64_t n = 0; n < N; ++n) {
    const auto v = [&](std::int64_t e) { return static_cast<T>(x[static_cast<std::size_t>(n * E + e)]); };
    T mx = -std::numeric_limits<T>::infinity();
    for (std::int64_t e = 0; e < E; ++e) mx = std::max(mx, v(e));
    T denom = 0;
    for (std::int64_t e = 0; e < E; ++e) denom = denom + static_cast<T>(std::exp(static_cast<double>(v(e) - mx)));
    for (std::int64_t e = 0; e < E; ++e) {
      p[static_cast<std::size_t>(n * E + e)] = static_cast<T>(std::exp(static_cast<double>(v(e) - mx))) / denom;
    }
  }
  MoeRoute r{N, index.dim(1), E, capacity, std::vector<std::int64_t>(static_cast<std::size_t>(N * index.dim(1))), {}};
  for (std::int64_t n = 0; n < N; ++n) top_k(&p[static_cast<std::size_t>(n * E)], E, r.k, &r.expert[static_cast<std::size_t>(n * r.k)]);
  moe_assign_slots(r);
  std::vector<double> w(r.expert.size(), 0.0), idx(r.expert.size(), -1.0);
  for (std::int64_t n = 0; n < N; ++n) {
    T s = 0;
    for (std::int64_t j = 0; j < r.k; ++j) {
      const std::int64_t e = r.expert[static_cast<std::size_t>(n * r.k + j)];
      if (e >= 0) s = s + p[static_cast<std::size_t>(n * E + e)];
    }
    s = std::max(s, std::numeric_limits<T>::epsilon());
    for (std::int64_t j = 0; j < r.k; ++j) {
      const auto i = static_cast<std::size_t>(n * r.k + j);
      if (r.expert[i] < 0) continue;
      w[i] = static_cast<double>(p[static_cast<std::size_t>(n * E + r.expert[i])] / s);
      idx[i] = static_cast<double>(r.expert[i]);
    }
  }
  write_f64(dev, probs, std::vector<double>(p.begin(), p.end()));
  write_f64(dev, weights, w);
  write_f64(dev, index, idx);
  return r;
}

template <class T>
void gate_backward_on_host(Device& dev, const Tensor& dlogits, const Tensor& dweights,
                           const Tensor& probs, const Tensor& weights, const Tensor& index) {
  const auto [N, E] = rows_cols("moe_gate_backward", probs);
  const std::int64_t k = index.dim(1);
  const std::vector<double> p = to_f64(dev, probs), dw = to_f64(dev, dweights);
  const std::vector<double> w = to_f64(dev, weights), idx = to_f64(dev, index);
  std::vector<double> out(static_cast<std::size_t>(N * E));
  std::vector<T> dp(static_cast<std::size_t>(E));
  const auto P = [&](std::int64_t n, std::int64_t e) { return static_cast<T>(p[static_cast<std::size_t>(n * E + e)]); };
  for (std::int64_t n = 0; n < N; ++n) {
    std::fill(dp.begin(), dp.end(), T(0));
    T s = 0, c = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      const auto i = static_cast<std::size_t>(n * k + j);
      const std::int64_t e = row_of("moe_gate_backward", idx[i], n, E);
      if (e < 0) continue;
      s = s + P(n, e);
      c = c + static_cast<T>(dw[i]) * static_cast<T>(w[i]);
    }
    if (s < std::numeric_limits<T>::epsilon()) s = std::numeric_limits<T>::epsilon(), c = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      const auto i = static_cast<std::size_t>(n * k + j);
      const auto e = static_cast<std::int64_t>(idx[i]);
      if (e >= 0) dp[static_cast<std::size_t>(e)] = (static_cast<T>(dw[i]) - c) / s;
    }
    T t = 0;
    for (std::int64_t e = 0; e < E; ++e) t = t + P(n, e) * dp[static_cast<std::size_t>(e)];
    for (std::int64_t e = 0; e < E; ++e) {
      out[static_cast<std::size_t>(n * E + e)] = static_cast<double>(P(n, e) * (dp[static_cast<std::size_t>(e)] - t));
    }
  }
  write_f64(dev, dlogits, out);
}

}  // namespace

namespace device_check {

void moe_gate_shapes(const char* op, const Tensor& wide, const Tensor& wide2, const Tensor& narrow,
                     const Tensor& index) {
  const auto [N, E] = rows_cols(op, wide);
  const auto [Nw, k] = rows_cols(op, narrow);
  if (wide2.numel() != wide.numel() || Nw != N || index.ndim() != 2 || index.dim(0) != N ||
      index.dim(1) != k || k < 1 || k > E) {
    throw UsageError(fmt::format("{}: {} and {} must be [N, E], {} and index {} [N, k], 1 <= k <= E",
                                 op, wide.describe(), wide2.describe(), narrow.describe(),
                                 index.describe()));
  }
}

void index_rows_shapes(const char* op, const Tensor& indexed, const Tensor& dense,
                       const Tensor& index) {
  const auto [M, D] = rows_cols(op, indexed);
  if (dense.ndim() != 2 || dense.dim(1) != D || index.numel() != M) {
    throw UsageError(fmt::format("{}: {} (one row per index) and {} need the same width and {} "
                                 "indices, not {}", op, indexed.describe(), dense.describe(), M,
                                 index.numel()));
  }
}

}  // namespace device_check

void moe_assign_slots(MoeRoute& r) {
  ZC_ASSERT(r.expert.size() == static_cast<std::size_t>(r.tokens * r.k), "{} choices for {} x {}",
            r.expert.size(), r.tokens, r.k);
  std::vector<std::int64_t> used(static_cast<std::size_t>(r.experts), 0);
  r.slot.assign(r.expert.size(), -1);
  for (std::int64_t j = 0; j < r.k; ++j) {
    for (std::int64_t n = 0; n < r.tokens; ++n) {
      const auto i = static_cast<std::size_t>(n * r.k + j);
      const std::int64_t e = r.expert[i];
      ZC_ASSERT(e >= 0 && e < r.experts, "expert {} of {}", e, r.experts);
      const std::int64_t s = used[static_cast<std::size_t>(e)]++;
      if (r.capacity > 0 && s >= r.capacity) {
        r.expert[i] = -1;
      } else {
        r.slot[i] = s;
      }
    }
  }
}

MoeRoute Device::moe_gate(const Tensor& weights, const Tensor& index, const Tensor& probs,
                          const Tensor& logits, std::int64_t capacity) {
  device_check::moe_gate_shapes("moe_gate", logits, probs, weights, index);
  const MoeRoute r = any_f64({&weights, &probs, &logits})
                         ? gate_on_host<double>(*this, weights, index, probs, logits, capacity)
                         : gate_on_host<float>(*this, weights, index, probs, logits, capacity);
  count_kernel(6 * logits.numel(), logits.nbytes(), probs.nbytes() + weights.nbytes() + index.nbytes());
  return r;
}

void Device::moe_gate_backward(const Tensor& dlogits, const Tensor& dweights, const Tensor& probs,
                               const Tensor& weights, const Tensor& index) {
  device_check::moe_gate_shapes("moe_gate_backward", probs, dlogits, dweights, index);
  device_check::same_numel("moe_gate_backward", weights, dweights);
  if (any_f64({&dlogits, &dweights, &probs, &weights})) {
    gate_backward_on_host<double>(*this, dlogits, dweights, probs, weights, index);
  } else {
    gate_backward_on_host<float>(*this, dlogits, dweights, probs, weights, index);
  }
  count_kernel(4 * probs.numel(), probs.nbytes() + dweights.nbytes() + weights.nbytes() + index.nbytes(),
               dlogits.nbytes());
}

void Device::gather_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  device_check::index_rows_shapes("gather_rows", out, x, index);
  const std::int64_t M = out.dim(0), D = out.dim(1), N = x.dim(0);
  const std::vector<double> v = to_f64(*this, x), idx = to_f64(*this, index);
  std::vector<double> o(static_cast<std::size_t>(M * D), 0.0);
  for (std::int64_t m = 0; m < M; ++m) {
    const std::int64_t r = row_of("gather_rows", idx[static_cast<std::size_t>(m)], m, N);
    if (r < 0) continue;
    std::copy_n(v.begin() + r * D, D, o.begin() + m * D);
  }
  write_f64(*this, out, o);
  count_kernel(0, index.nbytes() + out.numel() * dtype_size(x.dtype()), out.nbytes());
}

void Device::index_add_rows(const Tensor& out, const Tensor& x, const Tensor& index) {
  device_check::index_rows_shapes("index_add_rows", x, out, index);
  const std::int64_t M = x.dim(0), D = x.dim(1), N = out.dim(0);
  const std::vector<double> v = to_f64(*this, x), idx = to_f64(*this, index);
  std::vector<double> o = to_f64(*this, out);
  const bool f64 = any_f64({&out, &x});
  // Each sum in the compute type, rounded to out's dtype on store.
  for (std::int64_t m = 0; m < M; ++m) {
    const std::int64_t r = row_of("index_add_rows", idx[static_cast<std::size_t>(m)], m, N);
    if (r < 0) continue;
    for (std::int64_t d = 0; d < D; ++d) {
      double& acc = o[static_cast<std::size_t>(r * D + d)];
      const double s = f64 ? acc + v[static_cast<std::size_t>(m * D + d)]
                           : static_cast<double>(static_cast<float>(acc) + static_cast<float>(v[static_cast<std::size_t>(m * D + d)]));
      acc = round_to(out.dtype(), s);
    }
  }
  write_f64(*this, out, o);
  count_kernel(M * D, x.nbytes() + index.nbytes() + out.nbytes(), out.nbytes());
}

}  // namespace zc
