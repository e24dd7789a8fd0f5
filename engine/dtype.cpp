// Dtype parsing; the conversions themselves are constexpr in dtype.h.
#include "engine/dtype.h"

#include "engine/errors.h"

namespace zc {

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "float") return DType::f32;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f64" || name == "fp64" || name == "float64" || name == "double") return DType::f64;
  if (name == "u8" || name == "uint8" || name == "byte") return DType::u8;
  throw ConfigError(fmt::format("unknown dtype '{}': use one of fp32, fp16, bf16, fp64, u8", name));
}

}  // namespace zc
