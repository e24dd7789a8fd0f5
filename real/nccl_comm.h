// NcclComm: Comm over NCCL, one communicator per process and GPU, as nccl-tests and c10d's
// ProcessGroupNCCL set it up:
//   - create(): rank 0 makes the ncclUniqueId and broadcasts it over MPI; ncclCommInitRank.
//   - collectives run on a dedicated comm stream. Before each, the comm stream waits on an event
//     recorded on the device's compute stream (the inputs are ready); after it, a `done` event is
//     recorded. Work::wait() blocks the host until `done` (so errors surface at the call that
//     waits) and then makes the compute stream wait on it: compute after wait() is ordered after
//     the collective, and buffers freed after wait() are freed after NCCL has finished with them.
//   - all_to_all is one ncclGroupStart/End of per-peer ncclSend/ncclRecv slices.
//   - split() is ncclCommSplit; kNoColor gives nullptr, as MPI_Comm_split's MPI_UNDEFINED.
//   - the watchdog (Note [NCCL watchdog] in nccl_comm.cpp): an asynchronous NCCL error, a
//     collective still running on the GPU past the timeout, or an NCCL call blocking the host past
//     it (lazy peer connection, split) aborts the communicator (ncclCommAbort) and raises
//     RankFailure naming the rank, the op and its sequence number. Every later call on the
//     aborted communicator raises UsageError saying so. Not covered: ncclCommInitRank itself.
// Tensors must live on this process's CudaDevice; f16/bf16 use NCCL's own 16-bit reductions
// (each combine correctly rounded, as the simulator's f32-compute-then-round is for two operands).
#pragma once

#include "engine/comm.h"
#include "real/bootstrap.h"
#include "real/cuda_device.h"
#include "real/mpi_comm.h"

#include <chrono>
#include <memory>
#include <string>

namespace zc::real {

class NcclComm final : public Comm {
 public:
  using Duration = std::chrono::milliseconds;
  // Collective over `bootstrap`: every rank of it calls create() with its own GPU's device.
  static std::unique_ptr<NcclComm> create(MpiComm& bootstrap, CudaDevice& dev, Duration timeout,
                                          std::string name = "world");
  // A one-rank communicator with no MPI at all: a single process on one GPU (world 1).
  static std::unique_ptr<NcclComm> create_local(CudaDevice& dev, Duration timeout, std::string name = "world");
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  WorkPtr all_reduce(const Tensor& inout, const AllReduceOptions& opts = {}) override;
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in,
                         const ReduceScatterOptions& opts = {}) override;
  WorkPtr all_gather(const Tensor& out, const Tensor& in,
                     const AllGatherOptions& opts = {}) override;
  WorkPtr reduce(const Tensor& inout, const ReduceOptions& opts = {}) override;
  WorkPtr broadcast(const Tensor& inout, const BroadcastOptions& opts = {}) override;
  WorkPtr all_to_all(const Tensor& out, const Tensor& in,
                     const AllToAllOptions& opts = {}) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;

  // Shared with this communicator's Work objects (which may outlive it).
  struct State;

 private:
  NcclComm(std::shared_ptr<State> state, CudaDevice& dev, std::string name);
  static std::unique_ptr<NcclComm> init(const void* unique_id, int nranks, int rank, int world_rank,
                                        CudaDevice& dev, Duration timeout, std::string name);
  template <class Launch>
  WorkPtr issue(std::string what, bool async_op, std::vector<Tensor> buffers, Launch&& launch);
  void on_this_gpu(const char* op, const Tensor& t) const;

  std::shared_ptr<State> state_;
  CudaDevice& dev_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  std::int64_t seq_ = 0;
};

// Why this process cannot have a GPU of its own, "" when it can: no driver or device, or more
// ranks on this machine than GPUs (NCCL needs one GPU per rank).
std::string gpu_unavailable(const LaunchEnv& env);

// This process's GPU (its local rank's) and NCCL communicator, over `bootstrap` (MPI) or, when
// null, a one-rank communicator without MPI. Throws BackendError with gpu_unavailable's reason.
struct GpuRank {
  std::unique_ptr<CudaDevice> dev;
  std::unique_ptr<NcclComm> comm;  // destroyed before dev
};
GpuRank open_gpu_rank(const LaunchEnv& env, MpiComm* bootstrap, NcclComm::Duration timeout);

}  // namespace zc::real
