// HostDevice against references written out by hand, and MetaDevice's shape-only contract.
// Exact inputs compare bit for bit; the 16-bit cases show "compute in f32, round once on store".
#include "engine/errors.h"
#include "engine/host_device.h"
#include "tests/optimizer_fixture.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

namespace zc {
namespace {

std::vector<double> iota_values(std::int64_t n, double start, double step) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = start + step * static_cast<double>(i);
  return v;
}

TEST(HostDevice, AllocIsZeroFilledAndViewsShareStorage) {
  HostDevice dev;
  Tensor t = dev.alloc(DType::bf16, {4, 3}, "buf");
  EXPECT_EQ(to_f64(dev, t), std::vector<double>(12, 0.0));
  Tensor mid = t.narrow(5, 4);
  dev.fill(mid, 2.0);
  const std::vector<double> got = to_f64(dev, t);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got[i], (i >= 5 && i < 9) ? 2.0 : 0.0) << i;
  EXPECT_TRUE(mid.overlaps(t.narrow(8, 2)));
  EXPECT_FALSE(mid.overlaps(t.narrow(9, 3)));
  EXPECT_EQ(mid.describe(), "buf[5:9] bf16");
  EXPECT_THROW(t.narrow(10, 3), UsageError);
}

// Buffers of 64 MiB and more are mapped, not calloc'd (DeepSpeed-sized ipg buffers): zero-filled
// as the small ones, counted and freed the same way.
TEST(HostDevice, ALargeAllocationIsZeroFilledCountedAndFreed) {
  HostDevice dev;
  const std::int64_t n = (std::int64_t{64} << 20) / 4 + 3;  // just over the mapping threshold in f32
  {
    Tensor big = dev.alloc(DType::f32, {n}, "ipg_buffer_0", MemCategory::ipg_buckets);
    EXPECT_EQ(dev.allocator_stats()->live_total, n * 4);
    const Tensor last = big.narrow(n - 5, 5);
    EXPECT_EQ(to_f64(dev, last), std::vector<double>(5, 0.0));
    EXPECT_EQ(to_f64(dev, big.narrow(0, 5)), std::vector<double>(5, 0.0));
    dev.fill(last, 1.5);
    EXPECT_EQ(to_f64(dev, big.narrow(n - 6, 6)), (std::vector<double>{0.0, 1.5, 1.5, 1.5, 1.5, 1.5}));
  }
  EXPECT_EQ(dev.allocator_stats()->live_total, 0);
  EXPECT_EQ(dev.allocator_stats()->peak_total, n * 4);
}

TEST(HostDevice, ElementwiseOpsMatchF32ArithmeticBitForBit) {
  HostDevice dev;
  const std::vector<double> av = iota_values(64, -3.25, 0.37), bv = iota_values(64, 1.5, -0.11);
  Tensor a = tensor_from_f64(dev, DType::f32, {64}, av), b = tensor_from_f64(dev, DType::f32, {64}, bv);
  Tensor out = dev.alloc(DType::f32, {64});
  dev.add(out, a, b);
  std::vector<double> got = to_f64(dev, out);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], static_cast<double>(static_cast<float>(av[i]) + static_cast<float>(bv[i])));
  dev.mul(out, a, b);
  got = to_f64(dev, out);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], static_cast<double>(static_cast<float>(av[i]) * static_cast<float>(bv[i])));
  dev.axpy(out, 0.3, a);  // out = out + f32(0.3) * a, no FMA
  const std::vector<double> after = to_f64(dev, out);
  for (int i = 0; i < 64; ++i) {
    const float expect = static_cast<float>(got[i]) + 0.3f * static_cast<float>(av[i]);
    EXPECT_EQ(after[i], static_cast<double>(expect)) << i;
  }
}

TEST(HostDevice, SixteenBitArithmeticComputesInF32AndRoundsOnce) {
  HostDevice dev;
  // bf16 axpy: y = 2, x = 1, alpha = 2^-7 (1 + 2^-13). In f32, y + alpha x = 2 + 2^-7 + 2^-20,
  // just above the midpoint of 2 and 2 + 2^-6, so one rounding gives 2 + 2^-6. Rounding alpha x
  // to bf16 first would give 2^-7, a tie, and ties-to-even would give 2.
  Tensor y = tensor_from_f64(dev, DType::bf16, {1}, std::vector<double>{2.0});
  Tensor x = tensor_from_f64(dev, DType::bf16, {1}, std::vector<double>{1.0});
  dev.axpy(y, std::ldexp(1.0 + std::ldexp(1.0, -13), -7), x);
  EXPECT_EQ(to_f64(dev, y)[0], 2.015625);
  // f16 overflow goes to inf on store, and has_inf_nan sees it.
  Tensor h = tensor_from_f64(dev, DType::f16, {2}, std::vector<double>{60000.0, 1.0});
  dev.scale(h, 2.0);
  EXPECT_TRUE(std::isinf(to_f64(dev, h)[0]));
  EXPECT_TRUE(dev.has_inf_nan(h));
  dev.fill(h, 3.0);
  EXPECT_FALSE(dev.has_inf_nan(h));
  // cast f32 -> bf16 -> f32 rounds to nearest even
  Tensor f = tensor_from_f64(dev, DType::f32, {1}, std::vector<double>{1.00390625});  // 1 + 2^-8: a tie
  Tensor g = dev.alloc(DType::bf16, {1});
  dev.cast(g, f);
  EXPECT_EQ(to_f64(dev, g)[0], 1.0) << "the tie rounds to the even pattern";
}

TEST(HostDevice, SumOfSquaresFollowsTheCanonicalTreeOrder) {
  HostDevice dev;
  // Exact inputs: any order gives the exact sum.
  const std::int64_t n = 3000;
  std::vector<double> v(static_cast<std::size_t>(n));
  double exact = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    v[static_cast<std::size_t>(i)] = static_cast<double>(i % 17 - 8);
    exact += v[static_cast<std::size_t>(i)] * v[static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(dev.sum_sq(tensor_from_f64(dev, DType::f32, {n}, v)), exact);
  // Crafted: [2^27, 1, 1, ..., 1] squared is 2^54 and ones; the ulp at 2^54 is 4, so the order
  // decides which ones survive. Sequential loses all of them; the stride-halving tree of the Note
  // adds 512 + 256 + ... + 4 of them to the big value in sums large enough to keep.
  std::vector<double> w(1024, 1.0);
  w[0] = std::ldexp(1.0, 27);
  double sequential = 0;
  for (double x : w) sequential += x * x;
  std::vector<double> sq(1024);  // the Note's tree, written independently of HostDevice
  for (std::size_t i = 0; i < sq.size(); ++i) sq[i] = w[i] * w[i];
  for (std::size_t half = 512; half >= 1; half /= 2) {
    for (std::size_t i = 0; i < half; ++i) sq[i] = sq[i] + sq[i + half];
  }
  const double tree = dev.sum_sq(tensor_from_f64(dev, DType::f32, {1024}, w));
  EXPECT_EQ(sequential, std::ldexp(1.0, 54));
  EXPECT_EQ(tree, sq[0]);
  EXPECT_EQ(tree, std::ldexp(1.0, 54) + 1020.0) << "the 1 and the 2 are lost on ties";
  // Two blocks: the partials are summed by the same tree.
  std::vector<double> two(2048, 0.5);
  EXPECT_EQ(dev.sum_sq(tensor_from_f64(dev, DType::f32, {2048}, two)), 512.0);
  EXPECT_EQ(dev.sum_sq(dev.alloc(DType::f32, {0})), 0.0);
}

TEST(HostDevice, MaxAbsSeesNaN) {
  HostDevice dev;
  Tensor t = tensor_from_f64(dev, DType::f32, {3}, std::vector<double>{1.0, -7.5, 2.0});
  EXPECT_EQ(dev.max_abs(t), 7.5);
  write_f64(dev, t, std::vector<double>{1.0, NAN, 2.0});
  EXPECT_TRUE(std::isnan(dev.max_abs(t)));
}

// The oracle is DeepSpeed itself: tests/data/cpu_optimizers.txt is what the installed DeepSpeed
// 0.19.8's FusedAdam (CPU) and DeepSpeedCPUAdam, and torch 2.10's SGD, computed on this project's
// CPU (AVX-512, FMA), written by reference/deepspeed/measure_optimizers.py;
// tests/reference_test.cpp measures it afresh.
TEST(HostDevice, OptimizerStepsReproduceDeepSpeedsCpuKernelsBitForBit) {
  const testing::OptimizerFixture f = testing::read_optimizer_fixture(ZC_TEST_DATA "/cpu_optimizers.txt");
  std::int64_t compared = 0;
  for (const testing::OptimizerFixtureCase& c : f.cases) {
    const std::string diff = testing::replay_optimizer_case(c, f.simd_width, &compared);
    EXPECT_EQ(diff, "") << f.header;
  }
  EXPECT_GE(compared, 6000);  // the whole fixture was compared
}

// The vector width decides which elements take the tail's operand order: replaying the fixture
// as an AVX2 build (8 wide) must fail on the elements between 8 and 16 of the 17- and 40-element
// cases, or the tail is not what the test measures.
TEST(HostDevice, AdamTailOrderIsVisibleInTheFixture) {
  const testing::OptimizerFixture f = testing::read_optimizer_fixture(ZC_TEST_DATA "/cpu_optimizers.txt");
  int differs = 0;
  for (const testing::OptimizerFixtureCase& c : f.cases) {
    if (c.attrs.at("kernel") != "torch_sgd") differs += testing::replay_optimizer_case(c, 8).empty() ? 0 : 1;
  }
  EXPECT_GT(differs, 0);
}

TEST(HostDevice, SgdWithMomentumMatchesPyTorch) {
  HostDevice dev;
  Tensor param = tensor_from_f64(dev, DType::f32, {2}, std::vector<double>{1.0, 2.0});
  Tensor grad = tensor_from_f64(dev, DType::f32, {2}, std::vector<double>{0.5, -0.25});
  Tensor buf = dev.alloc(DType::f32, {2});
  SgdParams p{.lr = 0.5, .momentum = 0.5};
  dev.sgd_step(param, grad, buf, p);  // buf = g; p -= 0.5 g
  EXPECT_EQ(to_f64(dev, param), (std::vector<double>{0.75, 2.125}));
  p.first_step = false;
  dev.sgd_step(param, grad, buf, p);  // buf = 0.5 buf + g = 1.5 g; p -= 0.75 g
  EXPECT_EQ(to_f64(dev, param), (std::vector<double>{0.375, 2.3125}));
}

TEST(HostDevice, MatmulAndRowOpsMatchLoops) {
  HostDevice dev;
  const std::vector<double> av = iota_values(6, -2.0, 1.0), bv = iota_values(12, 1.0, -0.5);
  Tensor a = tensor_from_f64(dev, DType::f32, {2, 3}, av), b = tensor_from_f64(dev, DType::f32, {3, 4}, bv);
  Tensor out = dev.alloc(DType::f32, {2, 4});
  dev.matmul(out, a, b, false, false, false);
  std::vector<double> got = to_f64(dev, out);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      double s = 0;
      for (int k = 0; k < 3; ++k) s += av[i * 3 + k] * bv[k * 4 + j];
      EXPECT_EQ(got[i * 4 + j], s);
    }
  }
  Tensor at = dev.alloc(DType::f32, {3, 2});  // a^T a: [3,2]^T x ... use trans flags
  Tensor ata = dev.alloc(DType::f32, {3, 3});
  dev.matmul(ata, a, a, true, false, false);
  EXPECT_EQ(to_f64(dev, ata)[0], av[0] * av[0] + av[3] * av[3]);
  Tensor row = tensor_from_f64(dev, DType::f32, {4}, std::vector<double>{1, 2, 3, 4});
  dev.add_row_vector(out, row);
  const std::vector<double> with_row = to_f64(dev, out);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(with_row[i], got[i] + (i % 4) + 1);
  Tensor col = dev.alloc(DType::f32, {4});
  dev.sum_rows(col, out, false);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(to_f64(dev, col)[j], with_row[j] + with_row[4 + j]);
  Tensor r = dev.alloc(DType::f32, {2, 4}), gi = dev.alloc(DType::f32, {2, 4});
  dev.relu(r, out);
  dev.relu_backward(gi, out, out);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(to_f64(dev, r)[i], std::max(0.0, with_row[i]));
    EXPECT_EQ(to_f64(dev, gi)[i], with_row[i] > 0 ? with_row[i] : 0.0);
  }
  EXPECT_THROW(dev.matmul(out, a, a, false, false, false), UsageError);
  (void)at;
}

TEST(HostDevice, RejectsMismatchedOperandsWithTheOpName) {
  HostDevice dev;
  Tensor a = dev.alloc(DType::f32, {3}), b = dev.alloc(DType::f32, {4});
  try {
    dev.add(a, a, b);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("add: operands have 3 and 4 elements"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dev.copy(a, dev.alloc(DType::f16, {3})), UsageError);
  EXPECT_THROW(dev.adam_step(dev.alloc(DType::f16, {3}), a, a, a, {}), UsageError);
}

TEST(MetaDevice, KeepsShapesMovesNoDataAndCounts) {
  MetaDevice meta;
  Tensor a = meta.alloc(DType::bf16, {8, 16}), b = meta.alloc(DType::bf16, {16, 4});
  Tensor out = meta.alloc(DType::f32, {8, 4});
  EXPECT_TRUE(a.is_meta());
  EXPECT_EQ(a.raw(), nullptr);
  meta.matmul(out, a, b, false, false, false);
  EXPECT_EQ(meta.counters().flops, 2 * 8 * 4 * 16);
  EXPECT_EQ(meta.counters().bytes_read, a.nbytes() + b.nbytes());
  EXPECT_EQ(meta.counters().bytes_allocated, (128 + 64) * 2 + 32 * 4);
  EXPECT_THROW(meta.matmul(out, b, a, false, false, false), UsageError);
  EXPECT_THROW(to_f64(meta, a), UsageError);
  HostDevice host;
  EXPECT_THROW(meta.add(out, out, host.alloc(DType::f32, {8, 4})), UsageError) << "placement";
  EXPECT_EQ(meta.sum_sq(out), 0.0);
}


// Note [Emulated placement]: a HostDevice standing in for a GPU takes only its own tensors, except
// that cast and copy move data to and from CPU tensors, as CudaDevice does.
TEST(EmulatedPlacement, OpsRefuseCpuTensorsButTransfersCrossOver) {
  HostDevice gpu(Placement::cuda);
  HostDevice cpu;
  EXPECT_EQ(gpu.name(), "host-as-cuda");
  const Tensor g = tensor_from_f64(gpu, DType::bf16, {3}, std::vector<double>{1.5, -2.0, 3.0});
  EXPECT_EQ(g.placement(), Placement::cuda);
  const Tensor c = tensor_from_f64(cpu, DType::f32, {3}, std::vector<double>{0.25, 0.5, 1.0});
  try {
    gpu.axpy(g, 1.0, c);
    ADD_FAILURE() << "axpy took a CPU tensor";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is on host, this device is cuda"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu.axpy(c, 1.0, g), UsageError);  // and the CPU side refuses the GPU's
  const Tensor up = gpu.alloc(DType::bf16, {3});
  gpu.cast(up, c);  // CPU f32 -> GPU bf16
  EXPECT_EQ(to_f64(gpu, up), (std::vector<double>{0.25, 0.5, 1.0}));
  const Tensor down = cpu.alloc(DType::f32, {3});
  gpu.cast(down, g);  // GPU bf16 -> CPU f32
  EXPECT_EQ(to_f64(gpu, down), (std::vector<double>{1.5, -2.0, 3.0}));  // a CPU tensor read beside the GPU
  const Tensor copied = gpu.alloc(DType::f32, {3});
  gpu.copy(copied, c);
  EXPECT_EQ(to_f64(gpu, copied), (std::vector<double>{0.25, 0.5, 1.0}));
  EXPECT_THROW(cpu.cast(down, g), UsageError);  // a plain host device takes host tensors only
}

}  // namespace
}  // namespace zc
