// Tests run under mpirun (ctest label `mpi`): the collective conformance table unchanged on
// MpiComm (world and a split subgroup), training on real processes bit-identical to the
// simulator, and the failure paths (a skipped collective times out naming the rank; a dying rank
// ends the job). ZC_MPI_FAULT selects a failure scenario instead of the gtest suite.
#include "engine/errors.h"
#include "engine/host_device.h"
#include "models/mlp.h"
#include "models/synthetic.h"
#include "props/memory_checks.h"
#include "props/scenarios.h"
#include "props/training_run.h"
#include "real/mpi_comm.h"
#include "tests/conformance/comm_conformance.h"
#include "tests/transformer_spec.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace zc::real {
namespace {

MpiComm& world() {
  static MpiComm comm(MPI_COMM_WORLD, false, "world", std::chrono::milliseconds(60000));
  return comm;
}

void run_table(Comm& comm) {
  HostDevice dev;
  int failures = 0;
  const std::vector<conformance::Case> cases = conformance::table(comm.size());
  for (const conformance::Case& c : cases) {
    const std::string err = conformance::run_case(comm, dev, c);
    if (!err.empty() && ++failures <= 10) ADD_FAILURE() << comm.name() << ": " << err;
  }
  EXPECT_GT(cases.size(), 300u);
  EXPECT_EQ(failures, 0);
}

TEST(MpiConformance, EveryCaseIsBitExactOnTheWorld) { run_table(world()); }

TEST(MpiConformance, EveryCaseIsBitExactInsideSplitGroups) {
  std::unique_ptr<Comm> sub = world().split(world().rank() % 2, world().rank());
  ASSERT_NE(sub, nullptr);
  run_table(*sub);
}

props::RunSpec spec_for(int stage, bool coalesce, DType dtype) {
  props::RunSpec spec;
  spec.make_model = [] { return std::make_unique<Synthetic>(std::vector<Shape>{{5}, {3, 2}, {11}}); };
  spec.ds_config = {{"optimizer", {{"type", "Adam"}}}, {"zero_optimization", {{"stage", stage}, {"overlap_comm", stage >= 2}, {"reduce_bucket_size", 8}}}};
  if (dtype == DType::bf16) spec.ds_config["bf16"] = {{"enabled", true}};
  spec.world = world().size();
  spec.steps = 2;
  spec.n_backward = 2;
  spec.coalesce = coalesce;
  spec.exact.grad_multiple = world().size();
  spec.seed = 12;
  return spec;
}

TEST(MpiTraining, RealProcessesMatchTheSimulatorBitForBit) {
  for (int stage : {0, 1, 2, 3}) {
    for (bool coalesce : {false, true}) {
      if (coalesce && stage == 0) continue;
      const props::RunSpec spec = spec_for(stage, coalesce, stage % 2 ? DType::bf16 : DType::f32);
      HostDevice dev;
      const props::RankRecord real = props::train_rank(spec, world().rank(), dev, world(), nullptr);
      const props::RunResult sim = props::run_on_sim(spec);
      for (std::size_t s = 0; s < sim.params.size(); ++s) {
        EXPECT_EQ(props::first_difference(real.params[s], sim.params[s], DType::f64), "") << "stage " << stage << " coalesce " << coalesce;
        EXPECT_EQ(props::first_difference(real.grads[s], sim.grads[s], DType::f64), "") << "stage " << stage << " coalesce " << coalesce;
      }
    }
  }
}

// A Comm that refuses every buffer not tagged `cuda`, as NcclComm does (it moves GPU memory only).
class GpuOnlyComm final : public Comm {
 public:
  explicit GpuOnlyComm(Comm& inner, std::unique_ptr<Comm> owned = nullptr) : inner_(inner), owned_(std::move(owned)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return "gpu-only:" + inner_.name(); }
  WorkPtr all_reduce(const Tensor& t, const AllReduceOptions& o = {}) override { return inner_.all_reduce(gpu("all_reduce", t), o); }
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, const ReduceScatterOptions& o = {}) override {
    return inner_.reduce_scatter(gpu("reduce_scatter", out), gpu("reduce_scatter", in), o);
  }
  WorkPtr all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions& o = {}) override {
    return inner_.all_gather(gpu("all_gather", out), gpu("all_gather", in), o);
  }
  WorkPtr reduce(const Tensor& t, const ReduceOptions& o = {}) override { return inner_.reduce(gpu("reduce", t), o); }
  WorkPtr broadcast(const Tensor& t, const BroadcastOptions& o = {}) override { return inner_.broadcast(gpu("broadcast", t), o); }
  WorkPtr all_to_all(const Tensor& out, const Tensor& in, const AllToAllOptions& o = {}) override {
    return inner_.all_to_all(gpu("all_to_all", out), gpu("all_to_all", in), o);
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Comm> split(int color, int key) override {
    std::unique_ptr<Comm> sub = inner_.split(color, key);
    if (!sub) return nullptr;
    Comm& ref = *sub;
    return std::make_unique<GpuOnlyComm>(ref, std::move(sub));
  }

 private:
  static const Tensor& gpu(const char* op, const Tensor& t) {
    if (t.placement() != Placement::cuda) {
      throw UsageError(fmt::format("{}: {} is on {}; a GPU communicator takes GPU tensors only", op, t.describe(),
                                   placement_name(t.placement())));
    }
    return t;
  }
  Comm& inner_;
  std::unique_ptr<Comm> owned_;
};

// The GPU backend rehearsed on CPUs (Note [Emulated placement]): the engine on HostDevice tagged
// `cuda`, its collectives through a communicator that takes GPU tensors only, CPU offload moving
// data through cast. Every verify-real scenario still matches the simulator bit for bit.
TEST(MpiTraining, EmulatedGpuRunKeepsCpuAndGpuTensorsApart) {
  int offload = 0, offload_param = 0;
  for (const props::NamedSpec& ns : props::real_backend_scenarios(world().size(), 7, 24)) {
    HostDevice gpu(Placement::cuda);
    GpuOnlyComm comm(world());
    const props::BackendOutcome o = props::check_on_backend(ns, gpu, comm, &world());
    EXPECT_EQ(o.sim_mismatch, "") << ns.description;
    EXPECT_TRUE(o.ranks_agree) << ns.description;
    offload += ns.description.find("offload true") != std::string::npos;
    offload_param += ns.description.find("offload_param") != std::string::npos;
  }
  EXPECT_GT(offload, 0);
  EXPECT_GT(offload_param, 0);
}

// What zerocheck plan predicts, checked on a real backend: a meta run's per-category peaks equal
// what this rank's allocators counted (the GPU stand-in and the CPU side of offload), for every
// verify-real scenario and the transformer runs. gpu_test runs the same check on CudaDevice.
TEST(MpiTraining, MetaPeaksEqualTheEmulatedGpusAllocator) {
  int offload = 0;
  std::vector<props::NamedSpec> runs = props::real_backend_scenarios(world().size(), 7, 24);
  for (props::NamedSpec& t : transformer_memory_runs(world().size())) runs.push_back(std::move(t));
  for (const props::NamedSpec& ns : runs) {
    HostDevice gpu(Placement::cuda), cpu;
    GpuOnlyComm comm(world());
    const props::MemoryComparison c = props::compare_meta_with_backend(ns.spec, gpu, cpu, comm);
    EXPECT_EQ(c.difference, "") << ns.description;
    EXPECT_GT(c.peak_bytes, 0) << ns.description;
    offload += ns.description.find("offload true") != std::string::npos;
  }
  EXPECT_GT(offload, 0);
}

TEST(MpiTraining, GpuOnlyCommRefusesACpuTensor) {
  HostDevice cpu;
  GpuOnlyComm comm(world());
  EXPECT_THROW(comm.all_reduce(cpu.alloc(DType::f32, {2})), UsageError);
}

// Failure scenarios, selected by ZC_MPI_FAULT; each must end the job, never hang.
int run_fault(const std::string& fault) {
  MpiComm comm(MPI_COMM_WORLD, false, "world", std::chrono::milliseconds(2000));
  HostDevice dev;
  Tensor t = dev.alloc(DType::f32, {4});
  try {
    if (fault == "skip") {
      if (comm.rank() != 1) comm.all_reduce(t);  // rank 1 skips the collective
    } else if (fault == "die") {
      if (comm.rank() == 1) std::_Exit(7);  // a crashed rank
      comm.all_reduce(t);
    }
  } catch (const ZcError& e) {
    std::fprintf(stderr, "zerocheck: %s\n", e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return 0;
}

}  // namespace
}  // namespace zc::real

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  if (const char* fault = std::getenv("ZC_MPI_FAULT")) {
    rc = zc::real::run_fault(fault);
  } else {
    ::testing::InitGoogleTest(&argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {  // one rank prints; every rank's result counts
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    rc = RUN_ALL_TESTS();
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = worst;
  }
  MPI_Finalize();
  return rc;
}
