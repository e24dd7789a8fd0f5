// GPU figures, each against a baseline measured in the same run:
//   - CudaDevice::adam_step bandwidth as a fraction of a device-to-device copy of the same bytes
//     (both counted as bytes read + bytes written; Adam on f32 moves 28 B per element: p, g, m, v
//     in, p, m, v out; with bf16 grads 26 B);
//   - sum_sq (the canonical-order f64 reduction) read bandwidth, beside the same copy;
//   - NcclComm all_reduce algorithm bandwidth (bytes / time) and bus bandwidth with nccl-tests'
//     formula busbw = algbw * 2(n-1)/n; on one rank only the per-call time (nothing moves).
// Kernels are timed with CUDA events on the compute stream, collectives by the host around a batch
// of async ops and their waits. `zc_gpu_bench [--numel N] [--reps R]`, or under `mpirun -np G`.
// ZC_GPU_REPORT_DIR, if set, receives bench.md. Without a GPU it says so and exits 0.
#include "engine/errors.h"
#include "real/bootstrap.h"
#include "real/cuda_device.h"
#include "real/mpi_comm.h"
#include "real/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

namespace {

using zc::DType;
using zc::Tensor;
using zc::real::CudaDevice;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw zc::BackendError(fmt::format("{}: {}", what, cudaGetErrorString(rc)));
}

// Seconds per call of fn, timed with events on the device's stream after a warm-up.
double time_kernel(CudaDevice& dev, int reps, const std::function<void()>& fn) {
  auto s = static_cast<cudaStream_t>(dev.stream());
  fn();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a, s), "cudaEventRecord");
  for (int r = 0; r < reps; ++r) fn();
  check(cudaEventRecord(b, s), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 1e3 / reps;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t numel = std::int64_t{1} << 28;  // 1 GiB of f32 per tensor
  int reps = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--numel") numel = std::atoll(argv[i + 1]);
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const zc::real::LaunchEnv env = zc::real::detect_launch_env();
  const bool mpi = env.source != "none";
  if (mpi) MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    if (const std::string why = zc::real::gpu_unavailable(env); !why.empty()) {
      fmt::print("zc_gpu_bench: skipped: {}\n", why);
    } else {
      std::unique_ptr<zc::real::MpiComm> host;
      if (mpi) host = std::make_unique<zc::real::MpiComm>(MPI_COMM_WORLD, false, "host", std::chrono::minutes(2));
      zc::real::GpuRank gpu = zc::real::open_gpu_rank(env, host.get(), std::chrono::minutes(2));
      CudaDevice& dev = *gpu.dev;
      zc::real::NcclComm* nccl = gpu.comm.get();
      const bool root = nccl->rank() == 0;
      std::string md = fmt::format("## GPU benchmarks: {}, {} rank(s), {} elements per tensor, {} reps\n\n",
                                   dev.name(), nccl->size(), numel, reps);

      const Tensor src = dev.alloc(DType::f32, {numel}), dst = dev.alloc(DType::f32, {numel});
      dev.fill(src, 1.0);
      const double t_copy = time_kernel(dev, reps, [&] { dev.copy(dst, src); });
      const double copy_bw = 2.0 * static_cast<double>(src.nbytes()) / t_copy;

      const Tensor p = dev.alloc(DType::f32, {numel}), g32 = dev.alloc(DType::f32, {numel});
      const Tensor g16 = dev.alloc(DType::bf16, {numel});
      const Tensor m = dev.alloc(DType::f32, {numel}), v = dev.alloc(DType::f32, {numel});
      dev.fill(g32, 0.001);
      dev.fill(g16, 0.001);
      zc::AdamParams ap;
      const double t_adam = time_kernel(dev, reps, [&] { dev.adam_step(p, g32, m, v, ap); });
      const double adam_bw = 28.0 * static_cast<double>(numel) / t_adam;
      const double t_adam16 = time_kernel(dev, reps, [&] { dev.adam_step(p, g16, m, v, ap); });
      const double adam16_bw = 26.0 * static_cast<double>(numel) / t_adam16;
      const double t_sumsq = time_kernel(dev, reps, [&] { (void)dev.sum_sq(src); });
      const double sumsq_bw = 4.0 * static_cast<double>(numel) / t_sumsq;

      md += "| kernel | time per call | bandwidth (read + written) | fraction of the D2D copy |\n|---|---|---|---|\n";
      md += fmt::format("| device-to-device copy (baseline) | {:.3f} ms | {:.0f} GB/s | 1.00 |\n", t_copy * 1e3, copy_bw / 1e9);
      md += fmt::format("| adam_step, f32 grads (28 B/elem) | {:.3f} ms | {:.0f} GB/s | {:.2f} |\n", t_adam * 1e3,
                        adam_bw / 1e9, adam_bw / copy_bw);
      md += fmt::format("| adam_step, bf16 grads (26 B/elem) | {:.3f} ms | {:.0f} GB/s | {:.2f} |\n", t_adam16 * 1e3,
                        adam16_bw / 1e9, adam16_bw / copy_bw);
      md += fmt::format("| sum_sq f32 (canonical order, f64; includes the host sync that returns its value) | {:.3f} ms | {:.0f} GB/s | {:.2f} |\n\n", t_sumsq * 1e3,
                        sumsq_bw / 1e9, sumsq_bw / copy_bw);

      const int n = nccl->size();
      md += "| all_reduce size | time | algbw | busbw = algbw * 2(n-1)/n |\n|---|---|---|---|\n";
      for (std::int64_t bytes = std::int64_t{1} << 20; bytes <= std::int64_t{1} << 30; bytes <<= 2) {
        const Tensor t = dev.alloc(DType::f32, {bytes / 4});
        nccl->all_reduce(t);  // warm-up
        if (host) host->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<zc::WorkPtr> works;
        for (int r = 0; r < reps; ++r) works.push_back(nccl->all_reduce(t, {.async_op = true}));
        for (auto& w : works) w->wait();
        dev.synchronize();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
        const double algbw = static_cast<double>(bytes) / secs;
        if (n == 1) {  // an in-place all_reduce on one rank moves nothing: its time is the call's cost alone
          md += fmt::format("| {} MiB | {:.3f} ms | - | - |\n", bytes >> 20, secs * 1e3);
        } else {
          md += fmt::format("| {} MiB | {:.3f} ms | {:.1f} GB/s | {:.1f} GB/s |\n", bytes >> 20, secs * 1e3,
                            algbw / 1e9, algbw * 2.0 * (n - 1) / n / 1e9);
        }
      }
      if (n == 1) {
        md += "\nOne rank: an in-place all_reduce moves no bytes (seen: the same time at 1 MiB and 1 GiB), so "
              "the times are NCCL's per-call cost and no bandwidth is a measurement; busbw needs 2+ GPUs.\n";
      }
      if (root) {
        fmt::print("{}", md);
        if (const char* dir = std::getenv("ZC_GPU_REPORT_DIR")) std::ofstream(std::string(dir) + "/bench.md") << md;
      }
    }
  } catch (const zc::ZcError& e) {
    fmt::print(stderr, "zc_gpu_bench: {}\n", e.what());
    rc = 2;
  }
  if (mpi) MPI_Finalize();
  return rc;
}
