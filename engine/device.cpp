// Host-side conveniences over any Device: read and write values through upload/download; a host
// tensor beside a GPU device (the CPU side of ZeRO-Offload) is read and written in place.
#include "engine/device.h"

#include "engine/errors.h"

#include <cstring>

namespace zc {

const char* unary_name(Unary f) {
  switch (f) {
    case Unary::tanh: return "tanh";
    case Unary::silu: return "silu";
    case Unary::cube: return "cube";
  }
  return "?";
}

std::int64_t unary_flops(Unary f, bool backward) {
  switch (f) {
    case Unary::tanh: return backward ? 3 : 4;
    case Unary::silu: return backward ? 7 : 4;
    case Unary::cube: return backward ? 3 : 2;
  }
  return 0;
}

Tensor Device::alloc(DType dtype, Shape shape, std::string label, MemCategory category) {
  Tensor t = do_alloc(dtype, std::move(shape), std::move(label), category);
  if (accounts_allocations_) {
    Storage& s = *t.storage();
    ZC_ASSERT(!s.ledger, "{}: alloc returned an allocation another ledger counts", name());
    s.ledger = ledger_;
    s.category = category;
    ledger_->on_alloc(category, s.bytes, s.name);
  }
  return t;
}

void Device::recategorize(const Tensor& t, MemCategory category, std::string label) {
  Storage& s = *t.storage();
  ZC_ASSERT(t.byte_begin() == 0 && t.nbytes() == s.bytes, "{}: recategorize a view of part of {}", name(), s.name);
  if (s.ledger) {
    s.ledger->on_free(s.category, s.bytes);
    s.ledger->on_alloc(category, s.bytes, label);
  }
  if (s.stats) {
    s.stats->on_free(s.category, s.bytes);
    s.stats->on_alloc(category, s.bytes, label);
  }
  s.category = category;
  s.name = std::move(label);
}

std::vector<std::byte> to_bytes(Device& dev, const Tensor& t) {
  std::vector<std::byte> out(static_cast<std::size_t>(t.nbytes()));
  if (t.defined() && t.placement() == Placement::host && dev.placement() != Placement::host) {
    // A CPU-side tensor (ZeRO-Offload's master weights, say) read beside a GPU device: host memory.
    if (!out.empty()) std::memcpy(out.data(), t.raw(), out.size());
    return out;
  }
  dev.download(out, t);
  return out;
}

std::vector<double> to_f64(Device& dev, const Tensor& t) {
  const std::vector<std::byte> bytes = to_bytes(dev, t);
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    out[static_cast<std::size_t>(i)] = load_as_f64(bytes.data(), t.dtype(), i);
  }
  return out;
}

namespace {
// The output matrix's shape and the element counts bmm's operands must have.
struct BmmCheck {
  std::int64_t m, n;
};
BmmCheck check_bmm(const Tensor& out, const Tensor& a, const Tensor& b, const Device::BmmShape& s,
                   bool trans_a, bool trans_b) {
  const std::int64_t m = trans_a ? s.a_cols : s.a_rows, ka = trans_a ? s.a_rows : s.a_cols;
  const std::int64_t kb = trans_b ? s.b_cols : s.b_rows, n = trans_b ? s.b_rows : s.b_cols;
  const bool divs = s.a_div >= 1 && s.b_div >= 1 && s.out_div >= 1 && s.batches >= 0 &&
                    s.batches % s.a_div == 0 && s.batches % s.b_div == 0 && s.batches % s.out_div == 0;
  if (!divs || ka != kb || a.numel() != s.batches / s.a_div * s.a_rows * s.a_cols ||
      b.numel() != s.batches / s.b_div * s.b_rows * s.b_cols ||
      out.numel() != s.batches / s.out_div * m * n) {
    throw UsageError(fmt::format(
        "bmm: {} batches of [{}x{}]{} x [{}x{}]{} (divs {} {} {}) do not fit a {}, b {}, out {}",
        s.batches, s.a_rows, s.a_cols, trans_a ? "^T" : "", s.b_rows, s.b_cols, trans_b ? "^T" : "",
        s.a_div, s.b_div, s.out_div, a.describe(), b.describe(), out.describe()));
  }
  return {m, n};
}
}  // namespace

void Device::bmm(const Tensor& out, const Tensor& a, const Tensor& b, const BmmShape& s,
                 bool trans_a, bool trans_b, bool accumulate) {
  const BmmCheck d = check_bmm(out, a, b, s, trans_a, trans_b);
  const std::int64_t an = s.a_rows * s.a_cols, bn = s.b_rows * s.b_cols, on = d.m * d.n;
  for (std::int64_t i = 0; i < s.batches; ++i) {
    matmul(out.narrow(i / s.out_div * on, on).view({d.m, d.n}),
           a.narrow(i / s.a_div * an, an).view({s.a_rows, s.a_cols}),
           b.narrow(i / s.b_div * bn, bn).view({s.b_rows, s.b_cols}), trans_a, trans_b,
           accumulate || i % s.out_div != 0);
  }
}

void bmm_meta_counts(const Tensor& out, const Tensor& a, const Tensor& b,
                     const Device::BmmShape& s, bool trans_a, bool trans_b, DeviceCounters& c) {
  const BmmCheck d = check_bmm(out, a, b, s, trans_a, trans_b);
  const std::int64_t k = trans_a ? s.a_rows : s.a_cols;
  const std::int64_t esz_a = dtype_size(a.dtype()), esz_b = dtype_size(b.dtype());
  c.kernels += s.batches;
  c.flops += s.batches * 2 * d.m * d.n * k;
  c.bytes_read += s.batches * (s.a_rows * s.a_cols * esz_a + s.b_rows * s.b_cols * esz_b);
  c.bytes_written += s.batches * d.m * d.n * dtype_size(out.dtype());
}

double item(Device& dev, const Tensor& t, double meta_value) {
  if (t.numel() != 1) {
    throw UsageError(fmt::format("item() of {} with {} elements", t.describe(), t.numel()));
  }
  if (t.is_meta()) return meta_value;
  return to_f64(dev, t)[0];
}

void write_f64(Device& dev, const Tensor& t, std::span<const double> values) {
  if (static_cast<std::int64_t>(values.size()) != t.numel()) {
    throw UsageError(fmt::format("write_f64: {} values into {} of {} elements", values.size(),
                                 t.describe(), t.numel()));
  }
  std::vector<std::byte> bytes(static_cast<std::size_t>(t.nbytes()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    store_from_f64(bytes.data(), t.dtype(), i, values[static_cast<std::size_t>(i)]);
  }
  if (t.placement() == Placement::host && dev.placement() != Placement::host) {
    if (!bytes.empty()) std::memcpy(t.raw(), bytes.data(), bytes.size());  // a CPU-side tensor
    return;
  }
  dev.upload(t, bytes);
}

Tensor tensor_from_f64(Device& dev, DType dtype, Shape shape, std::span<const double> values,
                       std::string label, MemCategory category) {
  Tensor t = dev.alloc(dtype, std::move(shape), std::move(label), category);
  write_f64(dev, t, values);
  return t;
}

}  // namespace zc
