// Comm: a process group in the image of PyTorch c10d (Backend.hpp, Work.hpp): one options struct
// per collective, async Work with a written-down wait() contract, split() for subgroups, and
// per-op counts and bytes in stats() (CommDebugMode). Implemented by SimComm (sim/), MpiComm and
// NcclComm (real/). Buffer-size rules are checked once, here, for every backend.
#pragma once

#include "engine/tensor.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace zc {

enum class ReduceOp : std::uint8_t { sum, max, min };
std::string_view reduce_op_name(ReduceOp op);

enum class CollectiveKind : std::uint8_t {
  all_reduce, reduce_scatter, all_gather, reduce, broadcast, all_to_all, barrier, split
};
inline constexpr int kCollectiveKinds = 8;
std::string_view collective_name(CollectiveKind k);

// Work: one rank's handle on an issued collective.
//
//   work = comm.all_reduce(t, {.async_op = true});   // inputs are read at some point after issue
//   ... compute that touches neither t nor any buffer of the op ...
//   work->wait();                                     // blocks until this rank's part is done
//   ... t now holds the result; its buffers may be read and written again ...
//
// Until wait() returns, writing an input or output buffer of the op, or reading an output, is a
// data race (the simulator raises DataRace; a GPU would compute garbage). wait() is idempotent,
// and a synchronous call returns an already completed Work. On a GPU backend wait() orders the
// compute stream after the comm stream; it need not block the host.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

struct AllReduceOptions {
  ReduceOp op = ReduceOp::sum;
  bool async_op = false;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::sum;
  bool async_op = false;
};
struct AllGatherOptions {
  bool async_op = false;
};
struct ReduceOptions {
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  bool async_op = false;
};
struct BroadcastOptions {
  int root = 0;
  bool async_op = false;
};
struct AllToAllOptions {
  bool async_op = false;
};

struct OpStats {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;  // the larger of the send and receive buffer, as nccl-tests' "size"
};
struct CommStats {
  std::array<OpStats, kCollectiveKinds> by_kind{};
  const OpStats& operator[](CollectiveKind k) const { return by_kind[static_cast<int>(k)]; }
  std::int64_t total_calls() const;
  std::int64_t total_bytes() const;
  std::string to_string() const;  // "all_reduce 3 calls 384 B, ..."
};

// No group for this rank in split(): split returns nullptr.
inline constexpr int kNoColor = -1;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // inout: [count] on every rank; every rank gets the reduction.
  virtual WorkPtr all_reduce(const Tensor& inout, const AllReduceOptions& opts = {}) = 0;
  // in: [size * count]; out: [count] = reduction of every rank's in[rank*count, (rank+1)*count).
  // out may be that slice of in (NCCL's in-place form).
  virtual WorkPtr reduce_scatter(const Tensor& out, const Tensor& in,
                                 const ReduceScatterOptions& opts = {}) = 0;
  // in: [count]; out: [size * count], rank r's in at [r*count, (r+1)*count). in may be that slice.
  virtual WorkPtr all_gather(const Tensor& out, const Tensor& in,
                             const AllGatherOptions& opts = {}) = 0;
  // inout: [count]; the root's becomes the reduction, the others' are left unchanged.
  virtual WorkPtr reduce(const Tensor& inout, const ReduceOptions& opts = {}) = 0;
  // inout: [count]; every rank gets the root's.
  virtual WorkPtr broadcast(const Tensor& inout, const BroadcastOptions& opts = {}) = 0;
  // in, out: [size * chunk]; out chunk j on rank r = in chunk r of rank j.
  virtual WorkPtr all_to_all(const Tensor& out, const Tensor& in,
                             const AllToAllOptions& opts = {}) = 0;
  virtual void barrier() = 0;
  // Collective over this group (as MPI_Comm_split): ranks with the same color >= 0 form a group,
  // ordered by (key, rank). kNoColor returns nullptr.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

  const CommStats& stats() const { return stats_; }

 protected:
  void count(CollectiveKind k, std::int64_t bytes);
  CommStats stats_;
};

// Argument checks shared by every backend; throw UsageError naming the call and what to fix.
namespace comm_check {
void defined_same_dtype(std::string_view op, const Tensor& a, const Tensor& b);
// `rank`: the caller's rank in the group, for the in-place form (out, resp. in, is exactly this
// rank's slice of the other buffer); any other overlap of the two is refused.
void reduce_scatter(const Tensor& out, const Tensor& in, int size, int rank);
void all_gather(const Tensor& out, const Tensor& in, int size, int rank);
void all_to_all(const Tensor& out, const Tensor& in, int size);
void root(std::string_view op, int root, int size);
}  // namespace comm_check

}  // namespace zc
