// MpiComm all_reduce and reduce_scatter throughput beside SimComm's for the same sizes, in the
// same run: every rank times K collectives over MPI; rank 0 then times the same collectives on a
// simulated cluster of the same world. Figures are algorithm bandwidth (bytes per rank / time) and
// nccl-tests' bus bandwidth; run with `mpirun -np N build/default/bench/zc_mpi_bench`.
#include "engine/host_device.h"
#include "real/mpi_comm.h"
#include "sim/sim_cluster.h"

#include <fmt/format.h>

#include <chrono>

namespace {

using Clock = std::chrono::steady_clock;

template <class Op>
double time_mpi(zc::real::MpiComm& comm, zc::HostDevice& dev, std::int64_t numel, int reps, Op op) {
  zc::Tensor in = dev.alloc(zc::DType::f32, {numel});
  zc::Tensor out = dev.alloc(zc::DType::f32, {numel / comm.size()});
  op(comm, in, out);  // warm-up
  comm.barrier();
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) op(comm, in, out);
  comm.barrier();
  return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
}

template <class Op>
double time_sim(int world, std::int64_t numel, int reps, Op op) {
  double t = 0;
  zc::sim::SimCluster(world, 1).run([&](zc::sim::RankContext& ctx) {
    zc::Tensor in = ctx.device.alloc(zc::DType::f32, {numel});
    zc::Tensor out = ctx.device.alloc(zc::DType::f32, {numel / world});
    ctx.world.barrier();
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) op(ctx.world, in, out);
    ctx.world.barrier();
    if (ctx.rank == 0) t = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
  });
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    zc::real::MpiComm comm(MPI_COMM_WORLD, false, "world", std::chrono::milliseconds(60000));
    zc::HostDevice dev;
    const int W = comm.size();
    auto all_reduce = [](zc::Comm& c, zc::Tensor& in, zc::Tensor&) { c.all_reduce(in); };
    auto reduce_scatter = [](zc::Comm& c, zc::Tensor& in, zc::Tensor& out) { c.reduce_scatter(out, in); };
    if (comm.rank() == 0) {
      fmt::print("| op | bytes per rank | MpiComm GB/s (bus) | SimComm GB/s (bus) | Mpi / Sim time |\n|---|---|---|---|---|\n");
    }
    for (std::int64_t numel : {std::int64_t{1} << 10, std::int64_t{1} << 16, std::int64_t{1} << 20}) {
      numel = numel / W * W;
      const int reps = numel >= (1 << 20) ? 10 : 50;
      for (int which = 0; which < 2; ++which) {
        const double t_mpi = which == 0 ? time_mpi(comm, dev, numel, reps, all_reduce) : time_mpi(comm, dev, numel, reps, reduce_scatter);
        if (comm.rank() != 0) continue;
        const double t_sim = which == 0 ? time_sim(W, numel, reps, all_reduce) : time_sim(W, numel, reps, reduce_scatter);
        const double bytes = static_cast<double>(numel) * 4;
        const double factor = which == 0 ? 2.0 * (W - 1) / W : static_cast<double>(W - 1) / W;
        fmt::print("| {} | {} | {:.2f} ({:.2f}) | {:.2f} ({:.2f}) | {:.2f} |\n", which == 0 ? "all_reduce" : "reduce_scatter",
                   static_cast<std::int64_t>(bytes), bytes / t_mpi / 1e9, bytes * factor / t_mpi / 1e9,
                   bytes / t_sim / 1e9, bytes * factor / t_sim / 1e9, t_mpi / t_sim);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
