// MpiComm: non-blocking MPI collectives behind Comm, with a timeout watchdog on every wait.
#include "real/mpi_comm.h"

#include "engine/errors.h"

#include <cstring>
#include <thread>
#include <vector>

namespace zc::real {

void throw_mpi_error(const char* call, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw UsageError(fmt::format("{} failed: {}", call, std::string(msg, static_cast<std::size_t>(len))));
}

namespace {

// User reductions on 16-bit words: combine in f32, round once, as a GPU ring step does.
template <std::uint16_t (*ToBits)(float), float (*FromBits)(std::uint16_t), int Op>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = FromBits(a[i]), y = FromBits(b[i]);
    float r;
    if (Op == 0) {
      r = x + y;
    } else if (x != x || y != y) {
      r = x != x ? x : y;
    } else {
      r = Op == 1 ? std::max(x, y) : std::min(x, y);
    }
    b[i] = ToBits(r);
  }
}

struct Ops16 {
  MPI_Op f16[3], bf16[3];
  Ops16() {
    MPI_Op_create(&reduce16<f32_to_f16_bits, f16_bits_to_f32, 0>, 1, &f16[0]);
    MPI_Op_create(&reduce16<f32_to_f16_bits, f16_bits_to_f32, 1>, 1, &f16[1]);
    MPI_Op_create(&reduce16<f32_to_f16_bits, f16_bits_to_f32, 2>, 1, &f16[2]);
    MPI_Op_create(&reduce16<f32_to_bf16_bits, bf16_bits_to_f32, 0>, 1, &bf16[0]);
    MPI_Op_create(&reduce16<f32_to_bf16_bits, bf16_bits_to_f32, 1>, 1, &bf16[1]);
    MPI_Op_create(&reduce16<f32_to_bf16_bits, bf16_bits_to_f32, 2>, 1, &bf16[2]);
  }
};

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::u8: return MPI_UINT8_T;  // MAX and MIN are exact; a SUM wraps, as torch's does
    default: return MPI_UINT16_T;
  }
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  static Ops16 ops16;  // created after MPI_Init, on first use
  const int k = static_cast<int>(op);
  if (t == DType::f16) return ops16.f16[k];
  if (t == DType::bf16) return ops16.bf16[k];
  return op == ReduceOp::sum ? MPI_SUM : op == ReduceOp::max ? MPI_MAX : MPI_MIN;
}

int count_of(std::int64_t n) {
  if (n > INT32_MAX) throw UsageError(fmt::format("MPI collectives take at most 2^31-1 elements, got {}", n));
  return static_cast<int>(n);
}

class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request req, std::string what, std::chrono::milliseconds timeout, int rank,
          std::function<void()> after, std::vector<Tensor> buffers)
      : req_(req), what_(std::move(what)), timeout_(timeout), rank_(rank), after_(std::move(after)),
        buffers_(std::move(buffers)) {}
  void wait() override {
    if (done_) return;
    const auto start = std::chrono::steady_clock::now();
    int flag = 0;
    while (true) {
      MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (flag) break;
      if (std::chrono::steady_clock::now() - start > timeout_) {
        throw RankFailure(rank_, fmt::format("{} did not complete within {} ms: a peer rank died or "
                                             "skipped this collective", what_, timeout_.count()), nullptr);
      }
      std::this_thread::yield();
    }
    done_ = true;
    if (after_) after_();
    buffers_.clear();
  }
  bool is_completed() const override { return done_; }

 private:
  MPI_Request req_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  int rank_;
  std::function<void()> after_;
  std::vector<Tensor> buffers_;  // keeps the op's storage alive until it completes, as c10d's Work does
  bool done_ = false;
};

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, bool owned, std::string name, Duration timeout)
    : comm_(comm), owned_(owned), name_(std::move(name)), timeout_(timeout) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
}

MpiComm::~MpiComm() {
  if (owned_) MPI_Comm_free(&comm_);
}

WorkPtr MpiComm::finish(MPI_Request req, std::string what, bool async_op, std::vector<Tensor> buffers,
                        std::function<void()> after) {
  auto work = std::make_shared<MpiWork>(req, fmt::format("rank {}: {} on {} seq {}", world_rank_, what, name_, seq_++),
                                        timeout_, world_rank_, std::move(after), std::move(buffers));
  if (!async_op) work->wait();
  return work;
}

WorkPtr MpiComm::all_reduce(const Tensor& inout, const AllReduceOptions& opts) {
  comm_check::defined_same_dtype("all_reduce", inout, inout);
  count(CollectiveKind::all_reduce, inout.nbytes());
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, inout.raw(), count_of(inout.numel()), mpi_type(inout.dtype()),
                           mpi_op(inout.dtype(), opts.op), comm_, &req));
  return finish(req, fmt::format("all_reduce({} x {})", inout.numel(), dtype_name(inout.dtype())), opts.async_op, {inout});
}

WorkPtr MpiComm::reduce_scatter(const Tensor& out, const Tensor& in, const ReduceScatterOptions& opts) {
  comm_check::reduce_scatter(out, in, size(), rank());
  count(CollectiveKind::reduce_scatter, in.nbytes());
  // NCCL's in-place form (out is this rank's slice of in) needs a separate receive buffer in MPI.
  auto tmp = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(out.nbytes()));
  MPI_Request req;
  MPI_CHECK(MPI_Ireduce_scatter_block(in.raw(), tmp->data(), count_of(out.numel()), mpi_type(in.dtype()),
                                      mpi_op(in.dtype(), opts.op), comm_, &req));
  Tensor dst = out;
  return finish(req, fmt::format("reduce_scatter({} -> {} x {})", in.numel(), out.numel(), dtype_name(in.dtype())),
                opts.async_op, {in, out}, [tmp, dst] { std::memcpy(dst.raw(), tmp->data(), tmp->size()); });
}

WorkPtr MpiComm::all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions& opts) {
  comm_check::all_gather(out, in, size(), rank());
  count(CollectiveKind::all_gather, out.nbytes());
  const bool in_place = in.storage() == out.storage() && in.byte_begin() == out.byte_begin() + rank_ * in.nbytes();
  MPI_Request req;
  MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.raw(), count_of(in.numel()), mpi_type(in.dtype()),
                           out.raw(), count_of(in.numel()), mpi_type(in.dtype()), comm_, &req));
  return finish(req, fmt::format("all_gather({} -> {} x {})", in.numel(), out.numel(), dtype_name(in.dtype())), opts.async_op, {in, out});
}

WorkPtr MpiComm::reduce(const Tensor& inout, const ReduceOptions& opts) {
  comm_check::defined_same_dtype("reduce", inout, inout);
  comm_check::root("reduce", opts.root, size());
  count(CollectiveKind::reduce, inout.nbytes());
  MPI_Request req;
  const bool root = rank_ == opts.root;
  MPI_CHECK(MPI_Ireduce(root ? MPI_IN_PLACE : inout.raw(), root ? inout.raw() : nullptr, count_of(inout.numel()),
                        mpi_type(inout.dtype()), mpi_op(inout.dtype(), opts.op), opts.root, comm_, &req));
  return finish(req, fmt::format("reduce({} x {}, root {})", inout.numel(), dtype_name(inout.dtype()), opts.root), opts.async_op, {inout});
}

WorkPtr MpiComm::broadcast(const Tensor& inout, const BroadcastOptions& opts) {
  comm_check::defined_same_dtype("broadcast", inout, inout);
  comm_check::root("broadcast", opts.root, size());
  count(CollectiveKind::broadcast, inout.nbytes());
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(inout.raw(), count_of(inout.numel()), mpi_type(inout.dtype()), opts.root, comm_, &req));
  return finish(req, fmt::format("broadcast({} x {}, root {})", inout.numel(), dtype_name(inout.dtype()), opts.root), opts.async_op, {inout});
}

WorkPtr MpiComm::all_to_all(const Tensor& out, const Tensor& in, const AllToAllOptions& opts) {
  comm_check::all_to_all(out, in, size());
  count(CollectiveKind::all_to_all, in.nbytes());
  MPI_Request req;
  const int chunk = count_of(in.numel() / size());
  MPI_CHECK(MPI_Ialltoall(in.raw(), chunk, mpi_type(in.dtype()), out.raw(), chunk, mpi_type(in.dtype()), comm_, &req));
  return finish(req, fmt::format("all_to_all({} x {})", in.numel(), dtype_name(in.dtype())), opts.async_op, {in, out});
}

void MpiComm::barrier() {
  count(CollectiveKind::barrier, 0);
  MPI_Request req;
  MPI_CHECK(MPI_Ibarrier(comm_, &req));
  finish(req, "barrier()", false, {});
}

std::unique_ptr<Comm> MpiComm::split(int color, int key) {
  if (color < kNoColor) throw UsageError(fmt::format("split: color {} is negative; use kNoColor", color));
  count(CollectiveKind::split, 0);
  MPI_Comm sub;
  MPI_CHECK(MPI_Comm_split(comm_, color == kNoColor ? MPI_UNDEFINED : color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiComm>(sub, true, fmt::format("{}.c{}", name_, color), timeout_);
}

}  // namespace zc::real
