// Tensor views and shape helpers.
#include "engine/tensor.h"

#include "engine/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace zc {

std::string_view placement_name(Placement p) {
  switch (p) {
    case Placement::host: return "host";
    case Placement::cuda: return "cuda";
    case Placement::meta: return "meta";
  }
  return "?";
}

std::int64_t shape_numel(const Shape& shape) {
  // 2^60 elements: past any device, and nbytes() (numel x at most 8) stays within int64.
  constexpr std::int64_t kMaxNumel = std::int64_t{1} << 60;
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw UsageError(fmt::format("negative dimension in shape {}", shape_str(shape)));
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxNumel) {
      throw UsageError(fmt::format("shape {} has more than 2^60 elements", shape_str(shape)));
    }
  }
  return n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

Tensor::Tensor(DType dtype, Shape shape, Placement placement, std::shared_ptr<Storage> storage,
               std::int64_t offset_numel)
    : defined_(true), dtype_(dtype), shape_(std::move(shape)), numel_(shape_numel(shape_)),
      placement_(placement), storage_(std::move(storage)), offset_numel_(offset_numel) {
  if (placement_ == Placement::meta) {
    ZC_ASSERT(storage_ == nullptr || storage_->data == nullptr, "a meta tensor has no data");
    ZC_ASSERT(storage_ == nullptr || (offset_numel_ >= 0 && byte_end() <= storage_->bytes),
              "meta view [{}, {}) bytes outside an allocation of {} bytes", byte_begin(),
              byte_end(), storage_ ? storage_->bytes : 0);
  } else {
    ZC_ASSERT(storage_ != nullptr, "a {} tensor needs storage", placement_name(placement_));
    ZC_ASSERT(offset_numel_ >= 0 && byte_end() <= storage_->bytes,
              "view [{}, {}) bytes outside storage of {} bytes", byte_begin(), byte_end(),
              storage_->bytes);
  }
}

Tensor Tensor::narrow(std::int64_t start, std::int64_t count) const {
  if (start < 0 || count < 0 || start + count > numel_) {
    throw UsageError(fmt::format("narrow({}, {}) outside a tensor of {} elements", start, count,
                                 numel_));
  }
  return Tensor(dtype_, Shape{count}, placement_, storage_,
                storage_ ? offset_numel_ + start : 0);
}

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel_) {
    throw UsageError(fmt::format("view {} of a tensor with shape {}", shape_str(shape),
                                 shape_str(shape_)));
  }
  return Tensor(dtype_, std::move(shape), placement_, storage_, offset_numel_);
}

void* Tensor::raw() const {
  if (!storage_ || !storage_->data) return nullptr;
  return static_cast<char*>(storage_->data) + byte_begin();
}

std::string Tensor::describe() const {
  if (!defined_) return "<undefined>";
  if (is_meta() && (!storage_ || storage_->name.empty())) {
    return fmt::format("<meta {}{}>", dtype_name(dtype_), shape_str(shape_));
  }
  if (is_meta()) {
    return fmt::format("<meta {}[{}:{}] {}>", storage_->name, offset_numel_,
                       offset_numel_ + numel_, dtype_name(dtype_));
  }
  const std::string base =
      storage_->name.empty() ? fmt::format("buffer#{}", storage_->id) : storage_->name;
  return fmt::format("{}[{}:{}] {}", base, offset_numel_, offset_numel_ + numel_,
                     dtype_name(dtype_));
}

bool Tensor::overlaps(const Tensor& other) const {
  if (!storage_ || storage_ != other.storage_) return false;
  if (nbytes() == 0 || other.nbytes() == 0) return false;
  return byte_begin() < other.byte_end() && other.byte_begin() < byte_end();
}

}  // namespace zc
