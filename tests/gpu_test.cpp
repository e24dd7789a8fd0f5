// The `gpu` tests: CudaDevice against ReferenceDevice (the Device conformance table), NcclComm
// against the Comm conformance table, async ordering, subgroups, the watchdog, and the engine on
// GPUs against the simulator bit for bit.
//
// Run as `zc_gpu_tests` (one process, one GPU, no MPI) or `mpirun -np G zc_gpu_tests` (one GPU per
// rank, NCCL bootstrapped over MPI). Without a usable GPU every test reports itself skipped with
// the reason (no driver, no device), and the process exits 0. ZC_GPU_REPORT_DIR, if set, receives
// device_conformance.md and comm_conformance.md (rank 0).
#include "engine/errors.h"
#include "engine/host_device.h"
#include "props/memory_checks.h"
#include "props/scenarios.h"
#include "real/bootstrap.h"
#include "real/cuda_device.h"
#include "real/mpi_comm.h"
#include "real/nccl_comm.h"
#include "tests/conformance/comm_conformance.h"
#include "tests/conformance/device_conformance.h"
#include "tests/conformance/reference_device.h"
#include "tests/transformer_spec.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>

namespace zc::real {
namespace {

using namespace std::chrono_literals;

struct GpuWorld {
  std::string skip;  // why every test skips; empty when a GPU is there
  bool mpi = false;
  std::unique_ptr<MpiComm> host;  // null without MPI
  std::unique_ptr<CudaDevice> dev;
  std::unique_ptr<NcclComm> nccl;
  int rank() const { return nccl ? nccl->rank() : 0; }
  int size() const { return nccl ? nccl->size() : 1; }
};
GpuWorld* g = nullptr;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!g->skip.empty()) GTEST_SKIP() << g->skip;
  }
};

void write_report(const std::string& file, const std::string& text) {
  if (g->rank() != 0) return;
  fmt::print("{}", text);
  if (const char* dir = std::getenv("ZC_GPU_REPORT_DIR")) std::ofstream(std::string(dir) + "/" + file) << text;
}

TEST_F(Gpu, DeviceConformanceTableAgainstTheReference) {
  conformance::ReferenceDevice ref;
  struct Row {
    int cases = 0, bitwise = 0, failed = 0;
    double worst = 0;
    double bound = 0;
  };
  std::map<std::string, Row> rows;
  std::vector<std::string> failures;
  const auto t0 = std::chrono::steady_clock::now();
  for (const conformance::DeviceCase& c : conformance::device_table()) {
    double worst = 0;
    const std::string why = conformance::run_device_case(ref, *g->dev, c, &worst);
    Row& r = rows[c.op];
    ++r.cases;
    r.bitwise += worst == 0 && why.empty();
    r.worst = std::max(r.worst, worst);
    r.bound = std::max(r.bound, conformance::ulp_factor(c));
    if (!why.empty()) {
      ++r.failed;
      failures.push_back(why);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string md = fmt::format("## Device conformance: {} vs reference ({:.1f} s)\n\n"
                               "| op | cases | bit for bit (NaN = NaN) | failed | largest difference (u * the bound's scale) | bound |\n"
                               "|---|---|---|---|---|---|\n", g->dev->name(), secs);
  for (const auto& [op, r] : rows) {
    md += fmt::format("| {} | {} | {} | {} | {:.3g} | {} |\n", op, r.cases, r.bitwise, r.failed, r.worst,
                      r.bound == 0                                           ? std::string("0 (bit for bit)")
                      : op == "softmax_xent" || op == "causal_softmax" || op == "moe_gate"
                          ? fmt::format("(12 + 2 cols) u, up to {:g} u", r.bound)
                          : fmt::format("{:g} u of the terms", r.bound));
  }
  write_report("device_conformance.md", md + "\n");
  std::string first;
  for (std::size_t i = 0; i < failures.size() && i < 20; ++i) first += failures[i] + "\n";
  EXPECT_TRUE(failures.empty()) << failures.size() << " cases disagree; the first:\n" << first;
}

TEST_F(Gpu, DeviceErrorsNameTheCauseAndTheDeviceStaysUsable) {
  CudaDevice& dev = *g->dev;
  HostDevice host;
  const Tensor on_host = host.alloc(DType::f32, {4}, "host_tensor");
  const Tensor on_gpu = dev.alloc(DType::f32, {4}, "gpu_tensor");
  try {
    dev.axpy(on_gpu, 1.0, on_host);
    ADD_FAILURE() << "axpy with a host operand ran";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("host_tensor"), std::string::npos) << e.what();
  }
  try {
    (void)dev.alloc(DType::f32, {std::int64_t{1} << 48}, "too_big");  // 1 PiB
    ADD_FAILURE() << "a 1 PiB allocation succeeded";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("too_big"), std::string::npos) << e.what();
  }
  const Tensor ids = tensor_from_f64(dev, DType::f32, {2}, std::vector<double>{1, 9});
  const Tensor table = dev.alloc(DType::f32, {4, 3}), out = dev.alloc(DType::f32, {2, 3});
  EXPECT_THROW(dev.embedding(out, table, ids), UsageError);
  // Still usable after the failures.
  const Tensor x = tensor_from_f64(dev, DType::f32, {3}, std::vector<double>{1, 2, 3});
  EXPECT_EQ(dev.sum_sq(x), 14.0);
}

TEST_F(Gpu, OffloadCastsBetweenHostAndGpuRoundOnceAsTheHost) {
  CudaDevice& dev = *g->dev;
  HostDevice host;
  std::vector<double> v;
  for (int i = 0; i < 5000; ++i) v.push_back(std::ldexp(1.0 + i * 0.001234, (i % 40) - 20) * (i % 3 ? 1 : -1));
  const Tensor src32 = tensor_from_f64(host, DType::f32, {5000}, v);
  const Tensor gpu16 = dev.alloc(DType::bf16, {5000});
  dev.cast(gpu16, src32);  // CPU -> GPU with rounding
  const Tensor ref16 = host.alloc(DType::bf16, {5000});
  host.cast(ref16, src32);
  EXPECT_EQ(to_bytes(dev, gpu16), to_bytes(host, ref16));
  const Tensor back = host.alloc(DType::f32, {5000});
  dev.cast(back, gpu16);  // GPU -> CPU: a download, then the host's conversion (so this half checks the transfer)
  const Tensor ref_back = host.alloc(DType::f32, {5000});
  host.cast(ref_back, ref16);
  EXPECT_EQ(to_bytes(host, back), to_bytes(host, ref_back));
}

TEST_F(Gpu, CommConformanceTableOnNccl) {
  int passed = 0;
  std::vector<std::string> failures;
  for (const conformance::Case& c : conformance::table(g->size())) {
    const std::string why = conformance::run_case(*g->nccl, *g->dev, c);
    if (why.empty()) {
      ++passed;
    } else {
      failures.push_back(why);
    }
  }
  write_report("comm_conformance.md",
               fmt::format("## Comm conformance: NCCL, {} rank(s), {}\n\n{} cases, {} passed bit for bit, {} failed\n\n",
                           g->size(), g->dev->name(), passed + failures.size(), passed, failures.size()));
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed; first: " << (failures.empty() ? "" : failures[0]);
}

TEST_F(Gpu, AsyncAllReduceOrdersLaterComputeAfterIt) {
  // A large async all_reduce, then compute on the result right after wait(): the compute stream
  // must see the reduced values, not the input. (wait() blocks the host until the collective is
  // done, so this checks the end result; the stream-ordering event is belt and braces.)
  CudaDevice& dev = *g->dev;
  const std::int64_t n = 1 << 24;
  const Tensor t = dev.alloc(DType::f32, {n});
  dev.fill(t, 1.0);
  WorkPtr w = g->nccl->all_reduce(t, {.op = ReduceOp::sum, .async_op = true});
  w->wait();
  dev.scale(t, 2.0);
  EXPECT_EQ(dev.max_abs(t), 2.0 * g->size());
  EXPECT_EQ(dev.sum_sq(t), static_cast<double>(n) * 4.0 * g->size() * g->size());
  EXPECT_TRUE(w->is_completed());
}

TEST_F(Gpu, SplitGivesWorkingSubgroups) {
  const int color = g->rank() % 2;
  std::unique_ptr<Comm> sub = g->nccl->split(color, g->rank());
  ASSERT_NE(sub, nullptr);
  const Tensor t = tensor_from_f64(*g->dev, DType::f32, {1}, std::vector<double>{static_cast<double>(g->rank())});
  sub->all_reduce(t);
  double want = 0;
  for (int r = color; r < g->size(); r += 2) want += r;
  EXPECT_EQ(to_f64(*g->dev, t)[0], want);
  EXPECT_EQ(g->nccl->split(kNoColor, 0), nullptr);
}

TEST_F(Gpu, HostTensorsAreRefusedWithAClearError) {
  HostDevice host;
  const Tensor t = host.alloc(DType::f32, {4}, "cpu_buffer");
  try {
    g->nccl->all_reduce(t);
    ADD_FAILURE() << "NCCL accepted a host tensor";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL moves GPU memory only"), std::string::npos) << e.what();
  }
}

TEST_F(Gpu, EngineOnGpusMatchesTheSimulatorBitForBit) {
  int checked = 0;
  for (const props::NamedSpec& ns : props::real_backend_scenarios(g->size(), 11, 6)) {
    const props::BackendOutcome o = props::check_on_backend(ns, *g->dev, *g->nccl, g->host.get());
    EXPECT_EQ(o.sim_mismatch, "") << ns.description;
    EXPECT_TRUE(o.ranks_agree) << ns.description;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

// zerocheck plan's memory figures against a GPU (Note [GPU memory measures]): for each verify-real
// scenario, a meta run's per-category peaks equal what CudaDevice's allocator counted, byte for
// byte, and the memory pool's own high-water mark is at least that peak (it adds the reductions'
// scratch and its rounding). The table goes to gpu_memory.md.
TEST_F(Gpu, MetaPeaksEqualTheGpuAllocatorsAndThePoolHoldsNoLess) {
  std::string table = "| scenario | meta peak (B) | CudaDevice counted (B) | pool high (B) | pool / counted |\n"
                      "|---|---:|---:|---:|---:|\n";
  std::vector<props::NamedSpec> runs = props::real_backend_scenarios(g->size(), 11, 6);
  for (props::NamedSpec& t : transformer_memory_runs(g->size())) runs.push_back(std::move(t));
  int checked = 0;
  for (const props::NamedSpec& ns : runs) {
    HostDevice cpu;
    const props::MemoryComparison c = props::compare_meta_with_backend(ns.spec, *g->dev, cpu, *g->nccl);
    EXPECT_EQ(c.difference, "") << ns.description;
    if (!c.difference.empty()) {  // no figures from a run that did not compare
      table += fmt::format("| {} | not compared: {} | | | |\n", ns.description, c.difference);
      continue;
    }
    const AllocatorStats* a = g->dev->allocator_stats();
    ASSERT_NE(a, nullptr);
    const std::int64_t pool = g->dev->pool_used_high();
    EXPECT_GE(pool, a->peak_total) << ns.description;
    table += fmt::format("| {} | {} | {} | {} | {:.2f} |\n", ns.description, c.peak_bytes, a->peak_total, pool,
                         a->peak_total > 0 ? static_cast<double>(pool) / static_cast<double>(a->peak_total) : 0.0);
    ++checked;
  }
  EXPECT_EQ(checked, 15);
  write_report("gpu_memory.md", table);
}

// Last: it aborts communicators of its own. Phase 1: a peer never makes the first collective of a
// fresh communicator, where NCCL blocks the host connecting peers (the watchdog thread aborts it).
// Phase 2: after a warm-up, a peer skips one, so rank 0's kernel waits on the GPU (wait() aborts).
TEST_F(Gpu, WatchdogAbortsACollectiveAPeerSkipped) {
  if (g->size() < 2) GTEST_SKIP() << "needs 2 GPUs (a peer that skips the collective); this run has 1";
  for (int phase = 1; phase <= 2; ++phase) {
    std::unique_ptr<NcclComm> c = NcclComm::create(*g->host, *g->dev, 2000ms, fmt::format("watchdog{}", phase));
    const Tensor t = g->dev->alloc(DType::f32, {4});
    if (phase == 2) c->all_reduce(t);  // every rank: connections made, the host will not block
    if (c->rank() == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c->all_reduce(t);
        ADD_FAILURE() << "phase " << phase << ": the all_reduce completed without its peer";
      } catch (const RankFailure& e) {
        const std::string what = e.what();
        const std::string op = fmt::format("rank 0: all_reduce(4 x f32) on watchdog{} seq {} did not complete within 2000 ms",
                                           phase, phase == 2 ? 1 : 0);
        EXPECT_NE(what.find(op), std::string::npos) << what;
        EXPECT_NE(what.find("ncclCommAbort"), std::string::npos) << what;
      }
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "phase " << phase;
      EXPECT_THROW(c->all_reduce(t), UsageError);  // the aborted communicator says so
    }
    g->host->barrier();  // rank 1 (and any other) waits here: it never joins rank 0's collective
  }
}

}  // namespace
}  // namespace zc::real

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zc::real::GpuWorld world;
  zc::real::g = &world;
  const zc::real::LaunchEnv env = zc::real::detect_launch_env();
  world.mpi = env.source != "none";
  if (world.mpi) {
    MPI_Init(&argc, &argv);
    world.host = std::make_unique<zc::real::MpiComm>(MPI_COMM_WORLD, false, "host", std::chrono::minutes(2));
  }
  world.skip = zc::real::gpu_unavailable(env);
  if (world.skip.empty()) {
    zc::real::GpuRank gpu = zc::real::open_gpu_rank(env, world.host.get(), std::chrono::minutes(2));
    world.dev = std::move(gpu.dev);
    world.nccl = std::move(gpu.comm);
  }
  if (!world.skip.empty()) fmt::print("zc_gpu_tests: every test skips: {}\n", world.skip);
  const int rc = RUN_ALL_TESTS();
  world.nccl.reset();
  world.dev.reset();
  world.host.reset();
  if (world.mpi) MPI_Finalize();
  return rc;
}
