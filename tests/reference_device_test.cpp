// The Device conformance table's reference (tests/conformance/reference_device.h) checked against
// what it claims to follow: the optimizer kernels DeepSpeed and torch ran on this CPU
// (tests/data/cpu_optimizers.txt, bit for bit) and the canonical reduction tree of device.h.
#include "tests/conformance/reference_device.h"
#include "tests/optimizer_fixture.h"

#include <gtest/gtest.h>

#include <bit>

namespace zc::conformance {
namespace {

using Bits = std::vector<std::uint32_t>;

Tensor from_bits(Device& dev, const Bits& bits) {
  Tensor t = dev.alloc(DType::f32, {static_cast<std::int64_t>(bits.size())});
  dev.upload(t, std::as_bytes(std::span(bits)));
  return t;
}

Bits bits_of(Device& dev, const Tensor& t) {
  Bits out(static_cast<std::size_t>(t.numel()));
  dev.download(std::as_writable_bytes(std::span(out)), t);
  return out;
}

// Replays one fixture case on the reference alone: its own step loop, running f32 beta products
// (DeepSpeed's IncrementStep: beta at step 1, then times beta), states zero at the start.
// "" when every step's p, m, v (or momentum buffer) matches; else the first difference.
std::string replay_on_reference(const testing::OptimizerFixtureCase& c, int simd_width,
                                std::int64_t* compared) {
  ReferenceDevice dev;
  const bool sgd = c.attrs.at("kernel") == "torch_sgd";
  const Bits& p0 = c.rows.at("p0");
  const auto n = static_cast<std::int64_t>(p0.size());
  const Tensor p = from_bits(dev, p0);
  const Tensor a = dev.alloc(DType::f32, {n}), b = dev.alloc(DType::f32, {n});  // m, v or buf
  AdamParams ap;
  SgdParams sp;
  ap.lr = sp.lr = std::stod(c.attrs.at("lr"));
  ap.weight_decay = sp.weight_decay = std::stod(c.attrs.at("wd"));
  ap.simd_width = simd_width;
  if (sgd) {
    sp.momentum = std::stod(c.attrs.at("momentum"));
    sp.dampening = std::stod(c.attrs.at("dampening"));
    sp.nesterov = c.attrs.at("nesterov") == "1";
  } else {
    ap.beta1 = std::stod(c.attrs.at("b1"));
    ap.beta2 = std::stod(c.attrs.at("b2"));
    ap.eps = std::stod(c.attrs.at("eps"));
    ap.adamw = c.attrs.at("adamw") == "1";
  }
  const int steps = std::stoi(c.attrs.at("steps"));
  for (int s = 1; s <= steps; ++s) {
    const Tensor g = from_bits(dev, c.rows.at(fmt::format("g{}", s)));
    std::vector<std::pair<std::string, Tensor>> outputs{{"p", p}};
    if (sgd) {
      sp.first_step = s == 1;
      dev.sgd_step(p, g, a, sp);
      if (sp.momentum != 0.0) outputs.emplace_back("b", a);
    } else {
      ap.step = s;
      const auto b1 = static_cast<float>(ap.beta1), b2 = static_cast<float>(ap.beta2);
      ap.beta1_pow = s == 1 ? b1 : ap.beta1_pow * b1;
      ap.beta2_pow = s == 1 ? b2 : ap.beta2_pow * b2;
      dev.adam_step(p, g, a, b, ap);
      outputs.insert(outputs.end(), {{"m", a}, {"v", b}});
    }
    for (const auto& [name, t] : outputs) {
      const Bits want = c.rows.at(fmt::format("{}{}", name, s)), have = bits_of(dev, t);
      for (std::size_t i = 0; i < want.size(); ++i, ++*compared) {
        if (want[i] == have[i]) continue;
        std::string what;
        for (const auto& [key, value] : c.attrs) what += fmt::format("{}={} ", key, value);
        return fmt::format("{}step {} {}[{}]: measured {:08x} ({}), reference {:08x} ({})", what, s,
                           name, i, want[i], std::bit_cast<float>(want[i]), have[i],
                           std::bit_cast<float>(have[i]));
      }
    }
  }
  return "";
}

TEST(ReferenceDevice, ReproducesTheMeasuredDeepSpeedAdamAndTorchSgdBitForBit) {
  const testing::OptimizerFixture f =
      testing::read_optimizer_fixture(ZC_TEST_DATA "/cpu_optimizers.txt");
  std::int64_t compared = 0;
  for (const testing::OptimizerFixtureCase& c : f.cases) {
    EXPECT_EQ(replay_on_reference(c, f.simd_width, &compared), "") << f.header;
  }
  EXPECT_GE(compared, 6000);  // the whole fixture
}

// Paired with the above: the SIMD body / scalar tail split is visible in the fixture, so the
// reference's tail operand order is measured, not assumed (an 8-wide split must fail somewhere).
TEST(ReferenceDevice, AdamTailOperandOrderIsMeasuredByTheFixture) {
  const testing::OptimizerFixture f =
      testing::read_optimizer_fixture(ZC_TEST_DATA "/cpu_optimizers.txt");
  int differs = 0;
  std::int64_t compared = 0;
  for (const testing::OptimizerFixtureCase& c : f.cases) {
    if (c.attrs.at("kernel") == "torch_sgd") continue;
    differs += replay_on_reference(c, 8, &compared).empty() ? 0 : 1;
  }
  EXPECT_GT(differs, 0);
}

// Note [Canonical reduction order] on values where the order shows. 1e16 + 1 rounds back to 1e16
// (a tie, to even), so the order decides what survives: left to right, 1e16, 1, -1e16, 1 sums to 1;
// the halving tree pairs 1e16 with -1e16 and 1 with 1, giving 2.
TEST(ReferenceDevice, DotFollowsTheHalvingTreeInsideABlockAndAcrossBlocks) {
  ReferenceDevice dev;
  const auto dot_with_ones = [&](const std::vector<double>& x) {
    const auto n = static_cast<std::int64_t>(x.size());
    const Tensor a = tensor_from_f64(dev, DType::f64, {n}, x);
    const Tensor ones = tensor_from_f64(dev, DType::f64, {n}, std::vector<double>(x.size(), 1.0));
    return dev.dot(a, ones);
  };
  EXPECT_EQ(dot_with_ones({1e16, 1.0, -1e16, 1.0}), 2.0);
  // The same four across two blocks: leaves 0, 1 in block 0 and 1024, 1025 in block 1. Each block
  // keeps +-1e16 alone, so the partials cancel to 0 (one flat tree over 2048 leaves would give 2).
  std::vector<double> x(1026, 0.0);
  x[0] = 1e16;
  x[1] = 1.0;
  x[1024] = -1e16;
  x[1025] = 1.0;
  EXPECT_EQ(dot_with_ones(x), 0.0);
}

}  // namespace
}  // namespace zc::conformance
