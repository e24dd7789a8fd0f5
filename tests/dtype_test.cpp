// The 16-bit conversions: every pattern round-trips; f32 -> 16-bit matches two independent
// references (GCC's _Float16 soft-float conversion, and a nearest-value table search) on all ties,
// subnormals, overflow, NaN/inf and ten million random values.
#include "engine/dtype.h"
#include "engine/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

namespace zc {
namespace {

bool f16_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// Reference 1 for f16: the compiler's own conversion (libgcc __truncsfhf2, round-to-nearest-even).
std::uint16_t gcc_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  return std::bit_cast<std::uint16_t>(h);
}

// Reference 2, for either format: search the sorted table of non-negative finite values for the
// nearest, ties to the even pattern, with "one past the largest finite" standing for infinity.
// Distances are computed in double, where they are exact for f32 inputs.
class NearestTable {
 public:
  NearestTable(float (*to_f32)(std::uint16_t), std::uint16_t max_finite, double past_max)
      : max_finite_(max_finite) {
    for (std::uint32_t p = 0; p <= max_finite; ++p) {
      values_.push_back(static_cast<double>(to_f32(static_cast<std::uint16_t>(p))));
    }
    values_.push_back(past_max);  // the pattern max_finite + 1 is +inf in both formats
  }
  std::uint16_t convert(float f) const {
    const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(f));
    if (std::isinf(f) || a >= values_.back()) return sign | static_cast<std::uint16_t>(max_finite_ + 1);
    const auto hi = std::upper_bound(values_.begin(), values_.end(), a);
    const std::size_t up = static_cast<std::size_t>(hi - values_.begin());
    const std::size_t down = up - 1;
    const double d_down = a - values_[down], d_up = values_[up] - a;
    std::size_t pick = d_down < d_up ? down : up;
    if (d_down == d_up) pick = (down % 2 == 0) ? down : up;
    return sign | static_cast<std::uint16_t>(pick);
  }

 private:
  std::uint16_t max_finite_;
  std::vector<double> values_;
};

const NearestTable& f16_table() {
  static const NearestTable t(f16_bits_to_f32, 0x7bff, 65536.0);
  return t;
}
const NearestTable& bf16_table() {
  static const NearestTable t(bf16_bits_to_f32, 0x7f7f, std::ldexp(1.0, 128));
  return t;
}

void expect_f16_matches(float f) {
  const std::uint16_t got = f32_to_f16_bits(f);
  if (std::isnan(f)) {
    ASSERT_EQ(got, 0x7fffu) << "NaN must become CUDA's canonical 0x7fff";
    return;
  }
  ASSERT_EQ(got, gcc_f16(f)) << std::hexfloat << f << " vs _Float16";
  ASSERT_EQ(got, f16_table().convert(f)) << std::hexfloat << f << " vs table";
}

void expect_bf16_matches(float f) {
  const std::uint16_t got = f32_to_bf16_bits(f);
  if (std::isnan(f)) {
    ASSERT_EQ(got, 0x7fffu) << "NaN must become CUDA's canonical 0x7fff";
    return;
  }
  ASSERT_EQ(got, bf16_table().convert(f)) << std::hexfloat << f << " vs table";
}

TEST(Dtype, EveryF16PatternRoundTripsThroughF32) {
  int nans = 0;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    const float f = f16_bits_to_f32(h);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << p;
      ASSERT_TRUE(f16_is_nan(f32_to_f16_bits(f))) << std::hex << p;
      ++nans;
    } else {
      ASSERT_EQ(f32_to_f16_bits(f), h) << std::hex << p;
      ASSERT_EQ(static_cast<float>(std::bit_cast<_Float16>(h)), f) << std::hex << p;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Dtype, EveryBf16PatternRoundTripsThroughF32) {
  int nans = 0;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto b = static_cast<std::uint16_t>(p);
    const float f = bf16_bits_to_f32(b);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), p << 16) << std::hex << p;
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(bf16_is_nan(f32_to_bf16_bits(f))) << std::hex << p;
      ++nans;
    } else {
      ASSERT_EQ(f32_to_bf16_bits(f), b) << std::hex << p;
    }
  }
  EXPECT_EQ(nans, 2 * 127);
}

// For every pair of neighbouring 16-bit values: the exact midpoint (a tie), one f32 ulp either
// side, and the neighbours themselves. Covers every tie, every subnormal and the overflow edge.
template <class Check>
void for_every_tie(float (*to_f32)(std::uint16_t), std::uint16_t max_finite, double past_max,
                   Check check) {
  for (std::uint32_t p = 0; p <= max_finite; ++p) {
    const double lo = to_f32(static_cast<std::uint16_t>(p));
    const double hi = p == max_finite ? past_max : to_f32(static_cast<std::uint16_t>(p + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact: the midpoint fits in f32
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                    static_cast<float>(lo)}) {
      check(f);
      check(-f);
    }
  }
}

TEST(Dtype, F32ToF16MatchesReferencesOnEveryTieSubnormalAndOverflow) {
  for_every_tie(f16_bits_to_f32, 0x7bff, 65536.0, [](float f) { expect_f16_matches(f); });
  for (float f : {INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.99f, 65520.0f, 1e30f,
                  0x1.0p-25f, 0x1.0p-25f * 1.0000001f, 0x1.8p-25f, 0x1.0p-24f, 0x1.0p-26f,
                  std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f}) {
    expect_f16_matches(f);
  }
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00u) << "the first tie past 65504 goes to inf";
  EXPECT_EQ(f32_to_f16_bits(0x1.0p-25f), 0x0000u) << "half the smallest subnormal ties to zero";
  EXPECT_EQ(f32_to_f16_bits(0x1.8p-24f), 0x0002u) << "1.5 x smallest subnormal ties to even (2)";
}

TEST(Dtype, F32ToBf16MatchesReferenceOnEveryTieSubnormalAndOverflow) {
  for_every_tie(bf16_bits_to_f32, 0x7f7f, std::ldexp(1.0, 128),
                [](float f) { expect_bf16_matches(f); });
  for (float f : {INFINITY, -INFINITY, NAN, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f}) {
    expect_bf16_matches(f);
  }
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80u) << "rounds to inf";
}

TEST(Dtype, F32To16BitMatchesReferencesOnTenMillionRandomValues) {
  Rng rng(20261129);
  for (int i = 0; i < 10'000'000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng.next());
    const float f = std::bit_cast<float>(bits);
    expect_f16_matches(f);
    expect_bf16_matches(f);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// u8 (DeepSpeed's torch.uint8 overflow flag): a store truncates toward zero and wraps modulo 256,
// as torch's float -> uint8 cast does for finite values; NaN and infinities store 0.
TEST(Dtype, U8StoresTruncateAndWrapAsTorchsCastDoes) {
  const std::pair<float, double> cases[] = {{0.0f, 0}, {1.0f, 1}, {3.7f, 3}, {255.9f, 255}, {256.0f, 0},
                                            {300.0f, 44}, {-1.0f, 255}, {-0.5f, 0}, {NAN, 0}, {INFINITY, 0}};
  for (const auto& [v, want] : cases) {
    std::uint8_t cell = 77;
    store_from_f32(&cell, DType::u8, 0, v);
    EXPECT_EQ(load_as_f64(&cell, DType::u8, 0), want) << v;
  }
  EXPECT_EQ(dtype_size(DType::u8), 1);
  EXPECT_EQ(dtype_name(DType::u8), "u8");
  EXPECT_EQ(parse_dtype("uint8"), DType::u8);
}

TEST(Dtype, ParsesDeepSpeedNamesAndRejectsOthers) {
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp32"), DType::f32);
  EXPECT_THROW(parse_dtype("int8"), std::exception);
}

}  // namespace
}  // namespace zc
