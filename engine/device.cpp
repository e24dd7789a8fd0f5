// Host-side conveniences over any Device: read and write values through upload/download; a host
// tensor beside a GPU device (the CPU side of ZeRO-Offload) is read and written in place.
#include "engine/device.h"

#include "engine/errors.h"

#include <cstring>

namespace zc {

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
