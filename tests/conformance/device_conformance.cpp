// The Device conformance table: cases, deterministic inputs, one runner per op, and the comparison.
#include "tests/conformance/device_conformance.h"

#include "engine/errors.h"
#include "engine/rng.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

namespace zc::conformance {

std::string_view domain_name(Domain d) {
  switch (d) {
    case Domain::exact: return "exact";
    case Domain::gaussian: return "gaussian";
    case Domain::special: return "special";
  }
  return "?";
}

std::string DeviceCase::name() const {
  std::string dims_s;
  for (std::size_t i = 0; i < dims.size(); ++i) dims_s += fmt::format("{}{}", i ? "," : "", dims[i]);
  return fmt::format("{} {}/{} [{}] v{} {}", op, dtype_name(dtype), dtype_name(dtype2), dims_s, variant,
                     domain_name(domain));
}

double ulp_factor(const DeviceCase& c) {
  const auto dim = [&](std::size_t i) { return static_cast<double>(c.dims.at(i)); };
  // exp of integers is no more exact than exp of anything else: every domain gets the bound.
  if (c.op == "softmax_xent" || c.op == "causal_softmax") return 12.0 + 2.0 * dim(1);
  // The same per row, and the loss, a mean of B non-negative row losses each within that bound of
  // max(1, row): within twice it of max(1, mean), plus the sum's B roundings and the division's.
  if (c.op == "log_softmax_nll") {
    return 2.0 * (12.0 + 2.0 * dim(1)) + dim(0) + 1.0;
  }
  // Note [Transcendentals]: tanh/exp/cos/sin are evaluated in f64 and rounded once to the compute
  // type. CUDA's f64 versions are within 1 ulp (tanh, exp) or 2 ulp (sin, cos), glibc's within 1,
  // so two libraries' values differ by <= 3 ulp <= 6u of the function's value; the op's few
  // roundings after it add a couple of u. Where the op then cancels (1 + tanh for negative v, a
  // rotation's x1 cos - x2 sin) that error is relative to the terms, not to the output: the bound
  // is 8u times the larger of |ref| and the terms' magnitude, computed per element from the inputs
  // (Output::terms). Seen on an H200: f64 gelu, gelu_backward, swiglu_backward and rope differed
  // from glibc's by up to 23 u of |out| where they cancel.
  if (c.op == "gelu" || c.op == "gelu_backward" || c.op == "swiglu" || c.op == "swiglu_backward" ||
      c.op == "rope" || c.op == "log_softmax_backward" ||
      (c.op == "unary" && c.variant != static_cast<int>(Unary::cube)) ||
      (c.op == "unary_backward" && c.variant == static_cast<int>(Unary::silu))) {
    return 8.0;
  }
  // The gate's softmax, as softmax_xent's (its backward is plain arithmetic: exact).
  if (c.op == "moe_gate") return 12.0 + 2.0 * static_cast<double>(c.dims.at(1));
  return 0;
}

namespace {

// ---- the table ----------------------------------------------------------------------------------
void add_cases(std::vector<DeviceCase>& out, const std::string& op, std::initializer_list<DType> dts,
               std::initializer_list<DType> dts2, const std::vector<std::vector<std::int64_t>>& shapes,
               std::initializer_list<int> variants, std::initializer_list<Domain> domains) {
  for (DType a : dts) {
    for (DType b : dts2) {
      for (const auto& dims : shapes) {
        for (int v : variants) {
          for (Domain d : domains) out.push_back({op, a, b, dims, v, d});
        }
      }
    }
  }
}

}  // namespace

std::vector<DeviceCase> device_table() {
  std::vector<DeviceCase> t;
  const auto all = {DType::f32, DType::f16, DType::bf16, DType::f64};
  const auto f32 = {DType::f32};
  const auto ed = {Domain::exact, Domain::gaussian};
  const auto eds = {Domain::exact, Domain::gaussian, Domain::special};
  const std::vector<std::vector<std::int64_t>> flat = {{0}, {1}, {7}, {1000}, {70001}};
  const std::vector<std::vector<std::int64_t>> red = {{0}, {1}, {1023}, {1024}, {1025}, {5000}};
  const std::vector<std::vector<std::int64_t>> mat = {{1, 1}, {3, 5}, {17, 33}, {64, 16}};

  add_cases(t, "copy", all, f32, flat, {0}, eds);
  add_cases(t, "upload_download", all, f32, flat, {0}, eds);
  // copy_2d [rows, cols, dst_stride, src_stride]
  add_cases(t, "copy_2d", all, f32, {{0, 3, 3, 3}, {1, 5, 5, 9}, {4, 3, 7, 3}, {8, 16, 16, 20}}, {0}, eds);
  add_cases(t, "fill", all, f32, {{7}, {1000}}, {0, 1, 2, 3, 4, 5}, {Domain::exact});
  add_cases(t, "cast", all, all, flat, {0}, eds);
  add_cases(t, "axpy", all, all, {{1}, {1000}, {70001}}, {0, 1, 2}, ed);
  add_cases(t, "scale", all, f32, flat, {0, 1, 2}, eds);
  add_cases(t, "div", all, f32, flat, {0, 1, 2}, ed);
  add_cases(t, "add", all, f32, flat, {0}, eds);
  add_cases(t, "mul", all, f32, flat, {0}, eds);
  add_cases(t, "sum_sq", all, f32, red, {0}, ed);
  add_cases(t, "dot", all, {DType::f32, DType::bf16}, red, {0}, ed);
  add_cases(t, "max_abs", all, f32, red, {0}, eds);
  add_cases(t, "has_inf_nan", all, f32, red, {0}, eds);
  // Past 1024 leaf blocks the partials' tree runs level by level in global memory first.
  add_cases(t, "sum_sq", f32, f32, {{1024 * 1100 + 3}}, {0}, {Domain::gaussian});
  add_cases(t, "dot", f32, f32, {{1024 * 1100 + 3}}, {0}, {Domain::gaussian});
  add_cases(t, "max_abs", f32, f32, {{1024 * 1100 + 3}}, {0}, {Domain::gaussian});
  // adam: bit 0 adamw, bit 1 weight decay, bit 2 no bias correction, bits 3+ step - 1.
  add_cases(t, "adam_step", f32, {DType::f32, DType::f16, DType::bf16}, {{1}, {1000}, {70001}},
            {0, 1, 2, 3, 4, 8 + 3, 16 + 1}, ed);
  // sgd: 0 plain, 1 momentum first step, 2 momentum later step, 3 nesterov, +4 weight decay.
  add_cases(t, "sgd_step", f32, {DType::f32, DType::f16, DType::bf16}, {{1}, {1000}}, {0, 1, 2, 3, 4, 6}, ed);
  // matmul [m, n, k]: bit 0 trans_a, bit 1 trans_b, bit 2 accumulate.
  add_cases(t, "matmul", all, f32, {{1, 1, 1}, {16, 16, 16}, {17, 5, 33}, {3, 40, 7}, {64, 48, 70}},
            {0, 1, 2, 3, 4, 7}, ed);
  add_cases(t, "relu", all, f32, flat, {0}, eds);
  add_cases(t, "relu_backward", all, f32, flat, {0}, ed);
  add_cases(t, "add_row_vector", all, f32, mat, {0}, ed);
  add_cases(t, "sum_rows", all, f32, mat, {0, 1}, ed);
  add_cases(t, "softmax_xent", all, f32, {{1, 2}, {5, 7}, {33, 16}}, {0}, ed);
  add_cases(t, "log_softmax_nll", all, f32, {{1, 2}, {5, 7}, {33, 16}}, {0}, ed);
  add_cases(t, "nll_loss_backward", all, f32, {{1, 1}, {5, 7}, {33, 16}}, {0}, {Domain::exact});
  add_cases(t, "log_softmax_backward", all, f32, {{1, 2}, {5, 7}, {33, 16}}, {0}, ed);
  add_cases(t, "argmax_rows", all, f32, mat, {0}, ed);
  add_cases(t, "scale_rows", all, f32, mat, {0}, ed);
  add_cases(t, "row_dot", all, f32, mat, {0}, ed);
  // embedding [vocab, dim, n]; variant 1 puts an id out of range (both must refuse).
  add_cases(t, "embedding", all, f32, {{5, 3, 7}, {50, 16, 40}}, {0, 1}, ed);
  add_cases(t, "embedding_backward", all, f32, {{5, 3, 7}, {50, 16, 40}}, {0, 1}, ed);
  add_cases(t, "rmsnorm", all, f32, {{1, 4}, {6, 16}, {33, 40}}, {0}, ed);
  add_cases(t, "rmsnorm_backward", all, f32, {{1, 4}, {6, 16}, {33, 40}}, {0}, ed);
  add_cases(t, "causal_softmax", all, f32, {{1, 1}, {8, 4}, {48, 16}}, {0}, ed);
  add_cases(t, "softmax_backward", all, f32, {{1, 1}, {8, 4}, {48, 16}}, {0}, ed);
  add_cases(t, "permute_0213", all, f32, {{1, 1, 1, 1}, {2, 3, 4, 5}, {3, 8, 2, 16}}, {0}, {Domain::gaussian});
  add_cases(t, "layernorm", all, f32, {{1, 4}, {6, 16}, {33, 40}}, {0}, ed);
  add_cases(t, "layernorm_backward", all, f32, {{1, 4}, {6, 16}, {33, 40}}, {0}, ed);
  add_cases(t, "gelu", all, f32, flat, {0}, eds);
  add_cases(t, "gelu_backward", all, f32, flat, {0}, ed);
  add_cases(t, "swiglu", all, f32, flat, {0}, eds);
  add_cases(t, "swiglu_backward", all, f32, flat, {0}, ed);
  // unary and unary_backward: the variant is the Unary (tanh, silu, cube).
  add_cases(t, "unary", all, f32, flat, {0, 1, 2}, eds);
  add_cases(t, "unary_backward", all, f32, flat, {0, 1, 2}, ed);
  // rope [rows, heads, dh, seq]; variant 1 is the inverse rotation.
  add_cases(t, "rope", all, f32, {{1, 1, 2, 1}, {8, 2, 4, 4}, {24, 3, 16, 12}}, {0, 1}, ed);
  // MoE routing. moe_gate [tokens, experts, k, capacity] (capacity 0: no drops; 3 and 5 drop);
  // moe_gate_backward [tokens, experts, k], variant 1 with dropped choices; gather_rows
  // [rows out, rows in, width] and index_add_rows [rows out, rows in, width], variant 1 with an
  // index past the rows (both must refuse).
  add_cases(t, "moe_gate", all, f32, {{1, 2, 1, 0}, {8, 4, 2, 0}, {16, 8, 2, 3}, {33, 8, 3, 5}}, {0}, ed);
  add_cases(t, "moe_gate_backward", all, f32, {{1, 2, 1}, {8, 4, 2}, {33, 8, 3}}, {0, 1}, ed);
  add_cases(t, "gather_rows", all, f32, {{1, 1, 1}, {12, 5, 7}, {40, 33, 16}}, {0, 1}, ed);
  add_cases(t, "index_add_rows", all, f32, {{1, 1, 1}, {5, 12, 7}, {33, 40, 16}}, {0, 1}, ed);
  return t;
}

namespace {

// ---- inputs -------------------------------------------------------------------------------------
enum class Role : std::uint8_t { any, positive, unit_range };

std::vector<double> values(const DeviceCase& c, int which, std::int64_t n, Role role) {
  std::uint64_t h = std::hash<std::string>{}(c.name());
  Rng rng = Rng(h).split(static_cast<std::uint64_t>(which));
  std::vector<double> v(static_cast<std::size_t>(n));
  static constexpr double kSpecial[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-40, -6e-8, 5.9604644775390625e-08,
                                        65504.0, 65519.0, 65520.0, 70000.0, 3.3895313892515355e38, 1e39, 1e-310,
                                        1.0 + 1.0 / 256, 3.0, -2.5, 1e300, 0.1};
  for (auto& x : v) {
    switch (c.domain) {
      case Domain::exact:
        x = static_cast<double>(static_cast<std::int64_t>(rng.below(9)) - 4);
        if (role == Role::positive) x = std::fabs(x) + 1;
        break;
      case Domain::gaussian:
        x = rng.normal();
        if (role == Role::positive) x = std::fabs(x) + 0.125;
        break;
      case Domain::special:
        x = kSpecial[rng.below(std::size(kSpecial))];
        break;
    }
    if (role == Role::unit_range) x = std::fabs(x) / 8.0;
  }
  return v;
}

struct Output {
  std::string name;
  DType dtype;
  std::vector<std::byte> bytes;
  // Note [Transcendentals]: per element, the magnitude of the terms that a transcendental's error
  // enters before the output cancels them; empty where the output itself is the scale.
  std::vector<double> terms;
};
struct Result {
  std::vector<Output> tensors;
  std::vector<std::pair<std::string, double>> values;
  std::string error;  // what() of an exception, if the op threw
};

struct Runner {
  Device& dev;
  const DeviceCase& c;
  Result r;
  int next_input = 0;

  Tensor input(DType dt, Shape shape, Role role = Role::any) {
    const std::int64_t n = shape_numel(shape);
    const std::vector<double> v = values(c, next_input++, n, role);
    return tensor_from_f64(dev, dt, std::move(shape), v, fmt::format("in{}", next_input));
  }
  Tensor ids(Shape shape, std::int64_t limit, bool one_bad) {
    std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
    Rng rng = Rng(std::hash<std::string>{}(c.name())).split(1000);
    for (auto& x : v) x = static_cast<double>(rng.below(static_cast<std::uint64_t>(limit)));
    if (one_bad && !v.empty()) v[v.size() / 2] = static_cast<double>(limit);
    return tensor_from_f64(dev, DType::f32, std::move(shape), v, "ids");
  }
  // [rows, k] expert ids as floats: k distinct experts of `experts` per row, some -1 when `drops`.
  Tensor route(std::int64_t rows, std::int64_t experts, std::int64_t k, bool drops) {
    std::vector<double> v;
    Rng rng = Rng(std::hash<std::string>{}(c.name())).split(1001);
    for (std::int64_t n = 0; n < rows; ++n) {
      std::vector<double> row;
      while (static_cast<std::int64_t>(row.size()) < k) {
        const auto e = static_cast<double>(rng.below(static_cast<std::uint64_t>(experts)));
        if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
      }
      for (double& e : row) e = drops && rng.below(3) == 0 ? -1.0 : e;
      v.insert(v.end(), row.begin(), row.end());
    }
    return tensor_from_f64(dev, DType::f32, {rows, k}, v, "route");
  }
  // [n] row ids in [-1, limit) as floats (about one in five -1), one == limit when `one_bad`.
  Tensor rows_index(std::int64_t n, std::int64_t limit, bool one_bad) {
    std::vector<double> v(static_cast<std::size_t>(n));
    Rng rng = Rng(std::hash<std::string>{}(c.name())).split(1002);
    for (auto& x : v) x = rng.below(5) == 0 ? -1.0 : static_cast<double>(rng.below(static_cast<std::uint64_t>(limit)));
    if (one_bad && !v.empty()) v[v.size() / 2] = static_cast<double>(limit);
    return tensor_from_f64(dev, DType::f32, {n}, v, "rows");
  }
  void keep(const std::string& name, const Tensor& t, std::vector<double> terms = {}) {
    r.tensors.push_back({name, t.dtype(), to_bytes(dev, t), std::move(terms)});
  }
  void value(const std::string& name, double v) { r.values.emplace_back(name, v); }
};

constexpr double kScalars[] = {0.5, -1.25, 1.0 / 3.0};
constexpr double kFills[] = {3.0, 0.1, 70000.0, -0.0, 1e-40, INFINITY};

void run_op(Runner& k) {
  const DeviceCase& c = k.c;
  Device& dev = k.dev;
  const auto& d = c.dims;
  const std::string& op = c.op;
  if (op == "copy") {
    const Tensor src = k.input(c.dtype, {d[0]});
    const Tensor dst = dev.alloc(c.dtype, {d[0]});
    dev.copy(dst, src);
    k.keep("dst", dst);
  } else if (op == "upload_download") {
    k.keep("t", k.input(c.dtype, {d[0]}));
  } else if (op == "fill") {
    const Tensor t = dev.alloc(c.dtype, {d[0]});
    dev.fill(t, kFills[c.variant]);
    k.keep("t", t);
  } else if (op == "cast") {
    const Tensor src = k.input(c.dtype2, {d[0]});
    const Tensor dst = dev.alloc(c.dtype, {d[0]});
    dev.cast(dst, src);
    k.keep("dst", dst);
  } else if (op == "axpy") {
    const Tensor y = k.input(c.dtype, {d[0]}), x = k.input(c.dtype2, {d[0]});
    dev.axpy(y, kScalars[c.variant], x);
    k.keep("y", y);
  } else if (op == "scale") {
    const Tensor x = k.input(c.dtype, {d[0]});
    dev.scale(x, kScalars[c.variant]);
    k.keep("x", x);
  } else if (op == "div") {
    const Tensor x = k.input(c.dtype, {d[0]});
    dev.div(x, std::array<double, 3>{3.0, 0.1, 7.0}[static_cast<std::size_t>(c.variant)]);
    k.keep("x", x);
  } else if (op == "add" || op == "mul") {
    const Tensor a = k.input(c.dtype, {d[0]}), b = k.input(c.dtype, {d[0]}), out = dev.alloc(c.dtype, {d[0]});
    if (op == "add") {
      dev.add(out, a, b);
    } else {
      dev.mul(out, a, b);
    }
    k.keep("out", out);
  } else if (op == "sum_sq") {
    k.value("sum_sq", dev.sum_sq(k.input(c.dtype, {d[0]})));
  } else if (op == "dot") {
    const Tensor a = k.input(c.dtype, {d[0]}), b = k.input(c.dtype2, {d[0]});
    k.value("dot", dev.dot(a, b));
  } else if (op == "max_abs") {
    k.value("max_abs", dev.max_abs(k.input(c.dtype, {d[0]})));
  } else if (op == "has_inf_nan") {
    k.value("has_inf_nan", dev.has_inf_nan(k.input(c.dtype, {d[0]})) ? 1.0 : 0.0);
  } else if (op == "adam_step") {
    const Tensor p = k.input(DType::f32, {d[0]}), g = k.input(c.dtype2, {d[0]});
    const Tensor m = k.input(DType::f32, {d[0]}), v = k.input(DType::f32, {d[0]}, Role::positive);
    AdamParams ap;
    ap.lr = 0.01;
    ap.adamw = (c.variant & 1) != 0;
    ap.weight_decay = (c.variant & 2) != 0 ? 0.01 : 0.0;
    ap.bias_correction = (c.variant & 4) == 0;
    ap.step = 1 + (c.variant >> 3);
    ap.beta1_pow = static_cast<float>(std::pow(0.9, static_cast<double>(ap.step)));
    ap.beta2_pow = static_cast<float>(std::pow(0.999, static_cast<double>(ap.step)));
    dev.adam_step(p, g, m, v, ap);
    k.keep("param", p);
    k.keep("exp_avg", m);
    k.keep("exp_avg_sq", v);
  } else if (op == "sgd_step") {
    const Tensor p = k.input(DType::f32, {d[0]}), g = k.input(c.dtype2, {d[0]});
    const Tensor buf = k.input(DType::f32, {d[0]});
    SgdParams sp;
    const int m = c.variant & 3;
    sp.momentum = m == 0 ? 0.0 : 0.9;
    sp.first_step = m == 1;
    sp.nesterov = m == 3;
    sp.dampening = m == 2 ? 0.1 : 0.0;
    sp.weight_decay = (c.variant & 4) != 0 ? 0.01 : 0.0;
    dev.sgd_step(p, g, buf, sp);
    k.keep("param", p);
    k.keep("momentum_buffer", buf);
  } else if (op == "matmul") {
    const bool ta = (c.variant & 1) != 0, tb = (c.variant & 2) != 0, acc = (c.variant & 4) != 0;
    const std::int64_t m = d[0], n = d[1], kk = d[2];
    const Tensor a = k.input(c.dtype, ta ? Shape{kk, m} : Shape{m, kk});
    const Tensor b = k.input(c.dtype, tb ? Shape{n, kk} : Shape{kk, n});
    const Tensor out = k.input(c.dtype, {m, n});
    dev.matmul(out, a, b, ta, tb, acc);
    k.keep("out", out);
  } else if (op == "relu") {
    const Tensor x = k.input(c.dtype, {d[0]}), out = dev.alloc(c.dtype, {d[0]});
    dev.relu(out, x);
    k.keep("out", out);
  } else if (op == "relu_backward") {
    const Tensor go = k.input(c.dtype, {d[0]}), x = k.input(c.dtype, {d[0]}), gi = dev.alloc(c.dtype, {d[0]});
    dev.relu_backward(gi, go, x);
    k.keep("grad_in", gi);
  } else if (op == "add_row_vector") {
    const Tensor out = k.input(c.dtype, {d[0], d[1]}), row = k.input(c.dtype, {d[1]});
    dev.add_row_vector(out, row);
    k.keep("out", out);
  } else if (op == "sum_rows") {
    const Tensor x = k.input(c.dtype, {d[0], d[1]}), out = k.input(c.dtype, {d[1]});
    dev.sum_rows(out, x, c.variant == 1);
    k.keep("out", out);
  } else if (op == "softmax_xent") {
    const Tensor logits = k.input(c.dtype, {d[0], d[1]}), labels = k.ids({d[0]}, d[1], false);
    const Tensor dl = dev.alloc(c.dtype, {d[0], d[1]}), loss = dev.alloc(c.dtype, {d[0]});
    dev.softmax_xent(dl, loss, logits, labels);
    k.keep("dlogits", dl);
    k.keep("row_loss", loss);
  } else if (op == "log_softmax_nll") {
    const Tensor logits = k.input(c.dtype, {d[0], d[1]}), labels = k.ids({d[0]}, d[1], false);
    const Tensor logp = dev.alloc(c.dtype, {d[0], d[1]}), loss = dev.alloc(c.dtype, {1});
    dev.log_softmax_nll(logp, loss, logits, labels);
    k.keep("logp", logp);
    k.keep("loss", loss);
  } else if (op == "nll_loss_backward") {
    const Tensor labels = k.ids({d[0]}, d[1], false), grad = k.input(c.dtype, {d[0], d[1]});  // overwritten
    dev.nll_loss_backward(grad, labels, -1.0 / 3.0);
    k.keep("grad", grad);
  } else if (op == "log_softmax_backward") {
    const Tensor dout = k.input(c.dtype, {d[0], d[1]}), logp = k.input(c.dtype, {d[0], d[1]}, Role::unit_range);
    const Tensor dx = dev.alloc(c.dtype, {d[0], d[1]});
    dev.log_softmax_backward(dx, dout, logp);
    // dout - exp(logp) s: exp's error enters times |exp(logp) s|, and the difference cancels.
    const std::vector<double> g = to_f64(dev, dout), l = to_f64(dev, logp);
    std::vector<double> terms(g.size());
    for (std::int64_t r = 0; r < d[0]; ++r) {
      double s = 0;
      for (std::int64_t j = 0; j < d[1]; ++j) s += g[static_cast<std::size_t>(r * d[1] + j)];
      for (std::int64_t j = 0; j < d[1]; ++j) {
        const auto i = static_cast<std::size_t>(r * d[1] + j);
        terms[i] = std::fabs(g[i]) + std::fabs(std::exp(l[i]) * s);
      }
    }
    k.keep("dx", dx, std::move(terms));
  } else if (op == "argmax_rows") {
    const std::vector<std::int64_t> a = dev.argmax_rows(k.input(c.dtype, {d[0], d[1]}));
    for (std::size_t i = 0; i < a.size(); ++i) k.value(fmt::format("argmax[{}]", i), static_cast<double>(a[i]));
  } else if (op == "scale_rows") {
    const Tensor x = k.input(c.dtype, {d[0], d[1]}), s = k.input(c.dtype, {d[0]}), out = dev.alloc(c.dtype, {d[0], d[1]});
    dev.scale_rows(out, x, s);
    k.keep("out", out);
  } else if (op == "row_dot") {
    const Tensor a = k.input(c.dtype, {d[0], d[1]}), b = k.input(c.dtype, {d[0], d[1]}), out = dev.alloc(c.dtype, {d[0]});
    dev.row_dot(out, a, b);
    k.keep("out", out);
  } else if (op == "embedding") {
    const Tensor table = k.input(c.dtype, {d[0], d[1]}), ids = k.ids({d[2]}, d[0], c.variant == 1);
    const Tensor out = dev.alloc(c.dtype, {d[2], d[1]});
    dev.embedding(out, table, ids);
    k.keep("out", out);
  } else if (op == "embedding_backward") {
    const Tensor dout = k.input(c.dtype, {d[2], d[1]}), ids = k.ids({d[2]}, d[0], c.variant == 1);
    const Tensor dtable = k.input(c.dtype, {d[0], d[1]});  // overwritten: the op zeroes it first
    dev.embedding_backward(dtable, dout, ids);
    k.keep("dtable", dtable);
  } else if (op == "rmsnorm") {
    const Tensor x = k.input(c.dtype, {d[0], d[1]}), w = k.input(c.dtype, {d[1]});
    const Tensor out = dev.alloc(c.dtype, {d[0], d[1]}), rstd = dev.alloc(c.dtype, {d[0]});
    dev.rmsnorm(out, rstd, x, w, 1e-5);
    k.keep("out", out);
    k.keep("rstd", rstd);
  } else if (op == "rmsnorm_backward") {
    const Tensor dout = k.input(c.dtype, {d[0], d[1]}), x = k.input(c.dtype, {d[0], d[1]});
    const Tensor w = k.input(c.dtype, {d[1]}), rstd = k.input(c.dtype, {d[0]}, Role::positive);
    const Tensor dx = dev.alloc(c.dtype, {d[0], d[1]}), dw = dev.alloc(c.dtype, {d[1]});
    dev.rmsnorm_backward(dx, dw, dout, x, w, rstd);
    k.keep("dx", dx);
    k.keep("dw", dw);
  } else if (op == "causal_softmax") {
    const Tensor x = k.input(c.dtype, {d[0], d[1]}), out = dev.alloc(c.dtype, {d[0], d[1]});
    dev.causal_softmax(out, x);
    k.keep("out", out);
  } else if (op == "softmax_backward") {
    const Tensor dout = k.input(c.dtype, {d[0], d[1]}), p = k.input(c.dtype, {d[0], d[1]}, Role::unit_range);
    const Tensor dx = dev.alloc(c.dtype, {d[0], d[1]});
    dev.softmax_backward(dx, dout, p);
    k.keep("dx", dx);
  } else if (op == "permute_0213") {
    const Tensor x = k.input(c.dtype, {d[0] * d[1] * d[2] * d[3]}), out = dev.alloc(c.dtype, {x.numel()});
    dev.permute_0213(out, x, d[0], d[1], d[2], d[3]);
    k.keep("out", out);
  } else if (op == "copy_2d") {
    const std::int64_t rows = d[0], cols = d[1];
    const std::int64_t nd = rows == 0 ? 1 : (rows - 1) * d[2] + cols, ns = rows == 0 ? 1 : (rows - 1) * d[3] + cols;
    const Tensor src = k.input(c.dtype, {ns}), dst = k.input(c.dtype, {nd});  // dst keeps what is not copied
    dev.copy_2d(dst, src, rows, cols, d[2], d[3]);
    k.keep("dst", dst);
  } else if (op == "layernorm") {
    const Tensor x = k.input(c.dtype, {d[0], d[1]}), w = k.input(c.dtype, {d[1]}), b = k.input(c.dtype, {d[1]});
    const Tensor out = dev.alloc(c.dtype, {d[0], d[1]}), mean = dev.alloc(c.dtype, {d[0]});
    const Tensor rstd = dev.alloc(c.dtype, {d[0]});
    dev.layernorm(out, mean, rstd, x, w, b, 1e-5);
    k.keep("out", out);
    k.keep("mean", mean);
    k.keep("rstd", rstd);
  } else if (op == "layernorm_backward") {
    const Tensor dout = k.input(c.dtype, {d[0], d[1]}), x = k.input(c.dtype, {d[0], d[1]});
    const Tensor w = k.input(c.dtype, {d[1]}), mean = k.input(c.dtype, {d[0]});
    const Tensor rstd = k.input(c.dtype, {d[0]}, Role::positive);
    const Tensor dx = dev.alloc(c.dtype, {d[0], d[1]}), dw = dev.alloc(c.dtype, {d[1]});
    const Tensor db = dev.alloc(c.dtype, {d[1]});
    dev.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
    k.keep("dx", dx);
    k.keep("dw", dw);
    k.keep("db", db);
  } else if (op == "gelu" || op == "swiglu") {
    const Tensor x = k.input(c.dtype, {d[0]}), out = dev.alloc(c.dtype, {d[0]});
    if (op == "gelu") {
      dev.gelu(out, x);
      // 0.5 v (1 + t): t's error enters times 0.5 |v|, and 1 + t cancels for negative v.
      std::vector<double> terms = to_f64(dev, x);
      for (double& v : terms) v = std::fabs(v);
      k.keep("out", out, std::move(terms));
    } else {
      dev.swiglu(out, x, k.input(c.dtype, {d[0]}));  // a product: relative to the output
      k.keep("out", out);
    }
  } else if (op == "gelu_backward") {
    const Tensor dout = k.input(c.dtype, {d[0]}), x = k.input(c.dtype, {d[0]}), dx = dev.alloc(c.dtype, {d[0]});
    dev.gelu_backward(dx, dout, x);
    // dout (0.5 (1 + t) + 0.5 v (1 - t^2) c (1 + 3 a v^2)): t's error enters both terms, times
    // at most |dout| (0.5 + |v| (1 + 3 a v^2)) with c < 1; the sum cancels for negative v.
    const std::vector<double> g = to_f64(dev, dout), v = to_f64(dev, x);
    std::vector<double> terms(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      terms[i] = std::fabs(g[i]) * (1.0 + std::fabs(v[i]) * (1.0 + 3.0 * 0.044715 * v[i] * v[i]));
    }
    k.keep("dx", dx, std::move(terms));
  } else if (op == "swiglu_backward") {
    const Tensor dout = k.input(c.dtype, {d[0]}), gate = k.input(c.dtype, {d[0]}), up = k.input(c.dtype, {d[0]});
    const Tensor dgate = dev.alloc(c.dtype, {d[0]}), dup = dev.alloc(c.dtype, {d[0]});
    dev.swiglu_backward(dgate, dup, dout, gate, up);
    // dgate = dout up s (1 + g (1 - s)): s's error enters times |dout up| (1 + 2 |g|) at most,
    // and 1 + g (1 - s) cancels for negative g. dup = dout g s is a product.
    const std::vector<double> gd = to_f64(dev, dout), gg = to_f64(dev, gate), gu = to_f64(dev, up);
    std::vector<double> terms(gd.size());
    for (std::size_t i = 0; i < gd.size(); ++i) terms[i] = std::fabs(gd[i] * gu[i]) * (1.0 + 2.0 * std::fabs(gg[i]));
    k.keep("dgate", dgate, std::move(terms));
    k.keep("dup", dup);
  } else if (op == "unary") {
    const Tensor x = k.input(c.dtype, {d[0]}), out = dev.alloc(c.dtype, {d[0]});
    dev.unary(out, x, static_cast<Unary>(c.variant));  // tanh and silu: relative to the output
    k.keep("out", out);
  } else if (op == "unary_backward") {
    const auto f = static_cast<Unary>(c.variant);
    // tanh's backward reads its output: keep it in [-1, 1] as tanh's is.
    const Tensor dout = k.input(c.dtype, {d[0]});
    const Tensor saved = k.input(c.dtype, {d[0]}, f == Unary::tanh ? Role::unit_range : Role::any);
    const Tensor dx = dev.alloc(c.dtype, {d[0]});
    dev.unary_backward(dx, dout, saved, f);
    std::vector<double> terms;
    if (f == Unary::silu) {  // as swiglu's dgate: s's error times |dout| (1 + 2 |x|), cancelling
      const std::vector<double> g = to_f64(dev, dout), v = to_f64(dev, saved);
      terms.resize(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) terms[i] = std::fabs(g[i]) * (1.0 + 2.0 * std::fabs(v[i]));
    }
    k.keep("dx", dx, std::move(terms));
  } else if (op == "rope") {
    const Tensor x = k.input(c.dtype, {d[0], d[1] * d[2]}), out = dev.alloc(c.dtype, {d[0], d[1] * d[2]});
    dev.rope(out, x, d[3], d[1], 10000.0, c.variant == 1);
    // x1 cos - x2 sin and x2 cos + x1 sin: cos's and sin's errors enter times |x1| + |x2| of the
    // element's pair (the halves of its head), and the sums cancel.
    const std::vector<double> v = to_f64(dev, x);
    const std::int64_t width = d[1] * d[2], half = d[2] / 2;
    std::vector<double> terms(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto k_in_head = static_cast<std::int64_t>(i) % width % d[2];
      const std::size_t pair = k_in_head < half ? i + static_cast<std::size_t>(half) : i - static_cast<std::size_t>(half);
      terms[i] = std::fabs(v[i]) + std::fabs(v[pair]);
    }
    k.keep("out", out, std::move(terms));
  } else if (op == "moe_gate") {
    const Tensor logits = k.input(c.dtype, {d[0], d[1]});
    const Tensor w = dev.alloc(c.dtype, {d[0], d[2]}), probs = dev.alloc(c.dtype, {d[0], d[1]});
    const Tensor index = dev.alloc(DType::f32, {d[0], d[2]});
    const MoeRoute r = dev.moe_gate(w, index, probs, logits, d[3]);
    k.keep("weights", w);
    k.keep("probs", probs);
    k.keep("index", index);
    for (std::size_t i = 0; i < r.expert.size(); ++i) {
      k.value(fmt::format("expert[{}]", i), static_cast<double>(r.expert[i]));
      k.value(fmt::format("slot[{}]", i), static_cast<double>(r.slot[i]));
    }
  } else if (op == "moe_gate_backward") {
    const Tensor probs = k.input(c.dtype, {d[0], d[1]}, Role::unit_range);
    const Tensor w = k.input(c.dtype, {d[0], d[2]}, Role::unit_range), dw = k.input(c.dtype, {d[0], d[2]});
    const Tensor index = k.route(d[0], d[1], d[2], c.variant == 1), dl = dev.alloc(c.dtype, {d[0], d[1]});
    dev.moe_gate_backward(dl, dw, probs, w, index);
    k.keep("dlogits", dl);
  } else if (op == "gather_rows") {
    const Tensor x = k.input(c.dtype, {d[1], d[2]}), index = k.rows_index(d[0], d[1], c.variant == 1);
    const Tensor out = k.input(c.dtype, {d[0], d[2]});  // overwritten, dropped rows zeroed
    dev.gather_rows(out, x, index);
    k.keep("out", out);
  } else if (op == "index_add_rows") {
    const Tensor out = k.input(c.dtype, {d[0], d[2]}), x = k.input(c.dtype, {d[1], d[2]});
    const Tensor index = k.rows_index(d[1], d[0], c.variant == 1);
    dev.index_add_rows(out, x, index);
    k.keep("out", out);
  } else {
    throw UsageError(fmt::format("device conformance: no runner for op '{}'", op));
  }
}

Result run(Device& dev, const DeviceCase& c) {
  Runner k{dev, c, {}};
  try {
    run_op(k);
  } catch (const ZcError& e) {
    k.r.error = e.what();
  }
  return k.r;
}

double ulp_of(DType t, double v) {  // one unit in the last place of v stored as t
  std::vector<std::byte> b(8), b2(8);
  store_from_f64(b.data(), t, 0, std::fabs(v));
  std::uint64_t bits = 0;
  std::memcpy(&bits, b.data(), static_cast<std::size_t>(dtype_size(t)));
  ++bits;
  std::memcpy(b2.data(), &bits, static_cast<std::size_t>(dtype_size(t)));
  return load_as_f64(b2.data(), t, 0) - load_as_f64(b.data(), t, 0);
}

std::string bits_hex(const std::byte* p, DType t) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, p, static_cast<std::size_t>(dtype_size(t)));
  return fmt::format("0x{:0{}x}", bits, 2 * dtype_size(t));
}

}  // namespace

std::string run_device_case(Device& ref, Device& dut, const DeviceCase& c, double* worst) {
  const Result a = run(ref, c), b = run(dut, c);
  if (worst) *worst = 0;
  if (a.error.empty() != b.error.empty()) {
    return fmt::format("{}: {} raised \"{}\", {} raised \"{}\"", c.name(), ref.name(), a.error, dut.name(), b.error);
  }
  if (!a.error.empty()) return "";  // both refused the input (out-of-range ids)
  if (a.tensors.size() != b.tensors.size() || a.values.size() != b.values.size()) {
    return fmt::format("{}: the two devices produced different outputs", c.name());
  }
  const double factor = ulp_factor(c);
  const double u = c.dtype == DType::f64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  for (std::size_t o = 0; o < a.tensors.size(); ++o) {
    const Output& x = a.tensors[o];
    const Output& y = b.tensors[o];
    const std::int64_t n = static_cast<std::int64_t>(x.bytes.size()) / dtype_size(x.dtype);
    const auto esz = static_cast<std::size_t>(dtype_size(x.dtype));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::byte* px = x.bytes.data() + static_cast<std::size_t>(i) * esz;
      const std::byte* py = y.bytes.data() + static_cast<std::size_t>(i) * esz;
      if (std::memcmp(px, py, esz) == 0) continue;
      const double vx = load_as_f64(x.bytes.data(), x.dtype, i), vy = load_as_f64(y.bytes.data(), y.dtype, i);
      if (std::isnan(vx) && std::isnan(vy)) continue;
      // Relative to the value, except where the output cancels (the loss, and p - 1 in the label
      // column of dlogits, the only non-positive dlogits): there relative to max(1, |ref|), or to
      // the reference's own terms (Note [Transcendentals]); never an infinite scale.
      const bool cancels =
          x.name == "row_loss" || x.name == "loss" || (x.name == "dlogits" && vx <= 0);
      double scale = cancels || factor == 0 ? std::max(1.0, std::fabs(vx)) : std::fabs(vx);
      if (!x.terms.empty() && std::isfinite(x.terms[static_cast<std::size_t>(i)])) {
        scale = std::max(scale, x.terms[static_cast<std::size_t>(i)]);
      }
      if (worst) *worst = std::max(*worst, std::fabs(vx - vy) / (u * scale));
      if (factor > 0) {
        const double bound = factor * u * scale + (is_16bit(x.dtype) ? ulp_of(x.dtype, vx) : 0.0);
        if (std::fabs(vx - vy) <= bound) continue;
        return fmt::format("{}: {}[{}]: {} {} ({}) vs {} {} ({}), |diff| {:.3g} > bound {:.3g}", c.name(), x.name, i,
                           ref.name(), vx, bits_hex(px, x.dtype), dut.name(), vy, bits_hex(py, y.dtype),
                           std::fabs(vx - vy), bound);
      }
      return fmt::format("{}: {}[{}]: {} {} ({}) vs {} {} ({})", c.name(), x.name, i, ref.name(), vx,
                         bits_hex(px, x.dtype), dut.name(), vy, bits_hex(py, y.dtype));
    }
  }
  for (std::size_t v = 0; v < a.values.size(); ++v) {
    const double vx = a.values[v].second, vy = b.values[v].second;
    if (std::bit_cast<std::uint64_t>(vx) == std::bit_cast<std::uint64_t>(vy)) continue;
    if (std::isnan(vx) && std::isnan(vy)) continue;
    return fmt::format("{}: {}: {} {:.17g} (0x{:016x}) vs {} {:.17g} (0x{:016x})", c.name(), a.values[v].first,
                       ref.name(), vx, std::bit_cast<std::uint64_t>(vx), dut.name(), vy,
                       std::bit_cast<std::uint64_t>(vy));
  }
  return "";
}

}  // namespace zc::conformance
