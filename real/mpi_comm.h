// MpiComm: Comm over OpenMPI for real processes on CPUs. Every collective is a non-blocking MPI
// call whose Work polls MPI_Test; a collective that does not complete within the timeout (a peer
// died or skipped it) raises RankFailure naming this rank, the op and the communicator instead of
// hanging. f16/bf16 travel as 16-bit words with user-defined reductions that compute in f32 and
// round once per combine, as the simulator and NCCL do.
#pragma once

#include "engine/comm.h"

#include <mpi.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace zc::real {

// Evaluates its argument once; throws with MPI's error string.
#define MPI_CHECK(call)                                                                     \
  do {                                                                                      \
    const int zc_mpi_rc_ = (call);                                                          \
    if (zc_mpi_rc_ != MPI_SUCCESS) ::zc::real::throw_mpi_error(#call, zc_mpi_rc_);          \
  } while (0)
[[noreturn]] void throw_mpi_error(const char* call, int rc);

class MpiComm final : public Comm {
 public:
  using Duration = std::chrono::milliseconds;
  // Wraps an existing communicator; owns (frees) it when `owned`.
  MpiComm(MPI_Comm comm, bool owned, std::string name, Duration timeout);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

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

  MPI_Comm handle() const { return comm_; }

 private:
  WorkPtr finish(MPI_Request req, std::string what, bool async_op, std::vector<Tensor> buffers,
                 std::function<void()> after = nullptr);

  MPI_Comm comm_;
  bool owned_;
  std::string name_;
  Duration timeout_;
  int rank_ = 0, size_ = 1;
  int world_rank_ = 0;
  std::int64_t seq_ = 0;
};

}  // namespace zc::real
