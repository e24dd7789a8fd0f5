// Dtypes and the 16-bit conversions. f16 and bf16 are stored as bit patterns; f32 -> 16-bit rounds to
// nearest even exactly as CUDA's __float2half_rn / __float2bfloat16_rn (NaN -> 0x7fff, overflow -> inf),
// and 16-bit -> f32 is exact (NaN payloads kept). f64 -> 16-bit goes through f32, as a kernel would.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace zc {

// u8: an unsigned byte, for flags (DeepSpeed's overflow flag is a torch.uint8 all-reduced with
// MAX). A store truncates toward zero and wraps modulo 256, as torch's float -> uint8 cast does on
// a CPU for finite values; NaN and infinities store 0.
enum class DType : std::uint8_t { f32, f16, bf16, f64, u8 };

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::u8: return "u8";
  }
  return "?";
}
// Mantissa bits including the implicit one: the integers up to 2^bits are exact.
constexpr int dtype_mantissa_bits(DType t) {
  switch (t) {
    case DType::f32: return 24;
    case DType::f16: return 11;
    case DType::bf16: return 8;
    case DType::f64: return 53;
    case DType::u8: return 8;  // 0..255 only
  }
  return 0;
}
constexpr bool is_16bit(DType t) { return t == DType::f16 || t == DType::bf16; }

// Parses "f32", "fp32", "float32", "f16", "fp16", "half", "bf16", "bfloat16", "f64"; throws ConfigError.
DType parse_dtype(std::string_view name);

// ---- f16 -----------------------------------------------------------------------------------------
// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
constexpr std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf or NaN: NaN becomes the canonical 0x7fff, as CUDA does
    return static_cast<std::uint16_t>(mag == 0x7f800000u ? (sign | 0x7c00u) : 0x7fffu);
  }
  if (mag >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 2^16: inf
  std::uint32_t kept;        // the result's magnitude bits before rounding
  std::uint32_t rest;        // the dropped bits, left-aligned: 0x80000000 is exactly one half ulp
  if (mag >= 0x38800000u) {  // a normal half (>= 2^-14): rebias exponent 127 -> 15, drop 13 bits
    kept = (mag - 0x38000000u) >> 13;
    rest = mag << 19;
  } else if (mag < 0x33000000u) {  // below half the smallest subnormal (2^-25): rounds to zero
    kept = 0;
    rest = mag == 0 ? 0 : 1;  // nonzero but below a half ulp: rounds down either way
  } else {  // a subnormal half: shift the full 24-bit significand right by 126 - exponent
    const std::uint32_t exponent = mag >> 23;
    const std::uint32_t shift = 126u - exponent;  // 14..24 for exponents 102..112
    const std::uint32_t significand = (mag & 0x7fffffu) | 0x800000u;
    kept = significand >> shift;
    rest = significand << (32u - shift);
  }
  // Round to nearest, ties to even. A carry out of the mantissa bumps the exponent, which is the
  // right answer (including 65520 and up -> inf, since 0x7bff + 1 = 0x7c00).
  if (rest > 0x80000000u || (rest == 0x80000000u && (kept & 1u))) ++kept;
  return static_cast<std::uint16_t>(sign | kept);
}

constexpr float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    std::uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// ---- bf16 ----------------------------------------------------------------------------------------
// The upper half of an f32: 1 sign, 8 exponent, 7 mantissa bits.
constexpr std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN -> canonical, as CUDA does
  const std::uint32_t round_bias = 0x7fffu + ((x >> 16) & 1u);  // ties to even
  return static_cast<std::uint16_t>((x + round_bias) >> 16);    // overflow carries into inf
}
constexpr float bf16_bits_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// ---- u8 -------------------------------------------------------------------------------------------
constexpr float u8_to_f32(std::uint8_t v) { return static_cast<float>(v); }
constexpr std::uint8_t f32_to_u8(float v) {
  if (!(v > -9.2e18f && v < 9.2e18f)) return 0;  // NaN, infinities, past int64
  return static_cast<std::uint8_t>(static_cast<std::uint64_t>(static_cast<std::int64_t>(v)) & 0xffu);
}

// ---- element access on raw storage (Device implementations only) --------------------------------
inline float load_as_f32(const void* base, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return f16_bits_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case DType::bf16: return bf16_bits_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case DType::f64: return static_cast<float>(static_cast<const double*>(base)[i]);
    case DType::u8: return u8_to_f32(static_cast<const std::uint8_t*>(base)[i]);
  }
  return 0.0f;
}
inline double load_as_f64(const void* base, DType t, std::int64_t i) {
  if (t == DType::f64) return static_cast<const double*>(base)[i];
  return static_cast<double>(load_as_f32(base, t, i));
}
// Stores an f32 value, rounding once to the destination dtype.
inline void store_from_f32(void* base, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; return;
    case DType::f16: static_cast<std::uint16_t*>(base)[i] = f32_to_f16_bits(v); return;
    case DType::bf16: static_cast<std::uint16_t*>(base)[i] = f32_to_bf16_bits(v); return;
    case DType::f64: static_cast<double*>(base)[i] = static_cast<double>(v); return;
    case DType::u8: static_cast<std::uint8_t*>(base)[i] = f32_to_u8(v); return;
  }
}
// Stores an f64 value: exact into f64, one rounding into f32, f32 then 16-bit otherwise.
inline void store_from_f64(void* base, DType t, std::int64_t i, double v) {
  if (t == DType::f64) {
    static_cast<double*>(base)[i] = v;
  } else {
    store_from_f32(base, t, i, static_cast<float>(v));
  }
}
// v as a store into a tensor of dtype t rounds it (store_from_f64), read back exactly.
inline double round_to(DType t, double v) {
  alignas(8) unsigned char cell[8];
  store_from_f64(cell, t, 0, v);
  return load_as_f64(cell, t, 0);
}

}  // namespace zc
