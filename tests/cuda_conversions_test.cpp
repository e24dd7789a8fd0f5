// engine/dtype.h's 16-bit conversions against CUDA's own: the host implementations of
// __float2half_rn, __float2bfloat16_rn, __half2float and __bfloat162float in the CUDA toolkit's
// cuda_fp16.hpp / cuda_bf16.hpp (the same headers the kernels use; a GPU run checks the hardware
// instructions through the Device conformance table). Built when CUDA is found; no GPU needed.
#include "engine/dtype.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>

namespace zc {
namespace {

std::uint16_t cuda_f16(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
std::uint16_t cuda_bf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Every 97th f32 bit pattern, plus every pattern whose dropped bits sit at a rounding decision
// (just below, at and just above half an ulp, and the odd/even kept bit) for both formats.
TEST(CudaConversions, FloatTo16BitRoundsAsCudasIntrinsics) {
  std::int64_t checked = 0;
  auto check = [&](std::uint32_t x) {
    const float f = std::bit_cast<float>(x);
    ASSERT_EQ(f32_to_f16_bits(f), cuda_f16(f)) << std::hex << "f32 0x" << x << " -> f16";
    ASSERT_EQ(f32_to_bf16_bits(f), cuda_bf16(f)) << std::hex << "f32 0x" << x << " -> bf16";
    ++checked;
  };
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 97) check(static_cast<std::uint32_t>(u));
  const std::uint32_t low16[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};  // bf16 drops 16 bits
  const std::uint32_t low13[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff};  // f16 normals drop 13
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (std::uint32_t lo : low16) check(hi << 16 | lo);
  }
  for (std::uint32_t hi = 0; hi < 0x80000; ++hi) {
    for (std::uint32_t lo : low13) check(hi << 13 | lo);
  }
  EXPECT_GT(checked, 40'000'000);
}

TEST(CudaConversions, SixteenBitToFloatIsExactAsCudas) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const __half h = __ushort_as_half(bits);
    const __nv_bfloat16 bf = __ushort_as_bfloat16(bits);
    const float ours16 = f16_bits_to_f32(bits), cuda16 = __half2float(h);
    const float oursbf = bf16_bits_to_f32(bits), cudabf = __bfloat162float(bf);
    if (ours16 != ours16) {
      EXPECT_TRUE(cuda16 != cuda16) << std::hex << "f16 0x" << b << " is NaN";  // payloads may differ
    } else {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(ours16), std::bit_cast<std::uint32_t>(cuda16)) << std::hex << "f16 0x" << b;
    }
    if (oursbf != oursbf) {
      EXPECT_TRUE(cudabf != cudabf) << std::hex << "bf16 0x" << b << " is NaN";
    } else {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(oursbf), std::bit_cast<std::uint32_t>(cudabf)) << std::hex << "bf16 0x" << b;
    }
  }
}

}  // namespace
}  // namespace zc
