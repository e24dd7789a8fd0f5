// NcclComm: NCCL collectives on a comm stream, ordered against the compute stream with events, and
// a watchdog in Work::wait() (see nccl_comm.h).
#include "real/nccl_comm.h"

#include "engine/errors.h"
#include "real/cuda_check.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

namespace zc::real {

// Note [NCCL watchdog]
// Two ways a collective can hang, two guards, one timeout:
//   - on the GPU: the kernel waits for a peer that never comes. Work::wait() polls the `done`
//     event and ncclCommGetAsyncError; past the timeout it aborts.
//   - on the host: NCCL connects peers lazily, on the first use of each algorithm and each
//     send/recv pair, and that setup blocks the calling thread until the peer answers (so does
//     ncclCommSplit). The watchdog thread sees an NCCL call that has not returned within the
//     timeout and calls ncclCommAbort from its own thread, which makes the blocked call return
//     (NCCL's sockets poll the abort flag); issue() then raises RankFailure.
// ncclCommInitRank itself is not covered (there is no communicator to abort yet): a peer that
// never reaches create() leaves the others in MPI_Bcast or in init.
struct NcclComm::State {
  ncclComm_t comm = nullptr;
  cudaStream_t comm_stream = nullptr;
  cudaStream_t compute = nullptr;  // the CudaDevice's stream
  // barrier()'s one float: the communicator's own, like NCCL's internal buffers, so it is
  // allocated here (cudaMalloc, on first use) and not through the CudaDevice, whose counts are the
  // engine's tensors that zerocheck plan predicts (Note [GPU memory measures]).
  float* barrier_buf = nullptr;
  Duration timeout{0};
  int world_rank = 0;

  std::mutex mu;                   // guards the fields below
  std::string aborted;             // why the communicator was aborted; empty while usable
  std::string blocking_op;         // the NCCL call the host is inside, "" when none
  std::chrono::steady_clock::time_point blocking_since;
  bool stop = false;
  std::condition_variable wake;
  std::thread watchdog;

  std::string aborted_reason() {
    std::lock_guard<std::mutex> lock(mu);
    return aborted;
  }
  // The first caller aborts; later calls only return. After the abort, NCCL's kernels leave the
  // comm stream, so it is drained before any buffer of theirs can be freed.
  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!aborted.empty()) return;
      aborted = why;
    }
    (void)ncclCommAbort(comm);
    (void)cudaStreamSynchronize(comm_stream);
    (void)cudaGetLastError();
  }
  void enter(const std::string& op) {
    std::lock_guard<std::mutex> lock(mu);
    blocking_op = op;
    blocking_since = std::chrono::steady_clock::now();
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mu);
    blocking_op.clear();
  }
  void start_watchdog() {
    watchdog = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu);
      while (!stop) {
        wake.wait_for(lock, std::chrono::milliseconds(50));
        if (stop || blocking_op.empty() || !aborted.empty()) continue;
        if (std::chrono::steady_clock::now() - blocking_since <= timeout) continue;
        const std::string why = fmt::format("{} did not complete within {} ms (blocked in NCCL on the host): a peer "
                                            "rank died, hung or never made this call", blocking_op, timeout.count());
        lock.unlock();
        abort(why);
        lock.lock();
      }
    });
  }
  ~State() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    wake.notify_all();
    if (watchdog.joinable()) watchdog.join();
    if (comm != nullptr && aborted.empty()) {
      // Let issued collectives finish, but never wait forever: one whose peer died (and that
      // nobody waited for) would hang the stream, so past the timeout the communicator is aborted.
      const auto start = std::chrono::steady_clock::now();
      cudaError_t q;
      while ((q = cudaStreamQuery(comm_stream)) == cudaErrorNotReady &&
             std::chrono::steady_clock::now() - start < timeout) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      (void)cudaGetLastError();  // cudaErrorNotReady is recorded as the thread's last error
      if (q == cudaSuccess) {
        (void)ncclCommDestroy(comm);
      } else {
        (void)ncclCommAbort(comm);
      }
    }
    if (comm_stream != nullptr) (void)cudaStreamDestroy(comm_stream);
    if (barrier_buf != nullptr) (void)cudaFree(barrier_buf);  // synchronous: after the stream's work
  }
};

namespace {

#define NCCL_CHECK(call, comm)                                                                   \
  do {                                                                                           \
    const ncclResult_t zc_nccl_rc_ = (call);                                                     \
    if (zc_nccl_rc_ != ncclSuccess) throw_nccl_error(#call, __FILE__, __LINE__, zc_nccl_rc_, comm); \
  } while (0)

[[noreturn]] void throw_nccl_error(const char* call, const char* file, int line, ncclResult_t rc, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  throw BackendError(fmt::format("{} failed at {}:{}: {}{}{}", call, file, line, ncclGetErrorString(rc),
                                 last && *last ? ": " : "", last ? last : ""));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::f64: return ncclFloat64;
    case DType::u8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm::State> st, cudaEvent_t done, std::string what, std::vector<Tensor> buffers)
      : st_(std::move(st)), done_event_(done), what_(std::move(what)), buffers_(std::move(buffers)) {}
  ~NcclWork() override {
    // Dropped without wait(): still order the compute stream after the collective before the
    // buffers it holds are freed on that stream.
    if (!done_ && st_->aborted_reason().empty()) (void)cudaStreamWaitEvent(st_->compute, done_event_, 0);
    buffers_.clear();
    (void)cudaEventDestroy(done_event_);
  }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  void wait() override {
    if (done_) return;
    if (const std::string why = st_->aborted_reason(); !why.empty()) {
      fail(fmt::format("the communicator was aborted earlier: {}", why));
    }
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      const cudaError_t q = cudaEventQuery(done_event_);
      if (q == cudaSuccess) break;
      // cudaEventQuery records cudaErrorNotReady as this thread's last error: clear it, or the
      // next kernel launch's cudaGetLastError() would report it.
      (void)cudaGetLastError();
      if (q != cudaErrorNotReady) {
        abort_and_fail(fmt::format("CUDA error while waiting: {} ({})", cudaGetErrorString(q), cudaGetErrorName(q)));
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(st_->comm, &async);
      if (rc != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        const ncclResult_t bad = rc != ncclSuccess ? rc : async;
        const char* last = ncclGetLastError(st_->comm);
        abort_and_fail(fmt::format("NCCL asynchronous error: {}{}{}", ncclGetErrorString(bad),
                                   last && *last ? ": " : "", last ? last : ""));
      }
      if (std::chrono::steady_clock::now() - start > st_->timeout) {
        abort_and_fail(fmt::format("did not complete within {} ms: a peer rank died, hung or skipped this collective",
                                   st_->timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    CUDA_CHECK(cudaStreamWaitEvent(st_->compute, done_event_, 0));
    done_ = true;
    buffers_.clear();
  }
  bool is_completed() const override { return done_; }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw RankFailure(st_->world_rank, fmt::format("{} {}", what_, why), nullptr);
  }
  [[noreturn]] void abort_and_fail(const std::string& why) {
    st_->abort(fmt::format("{} {}", what_, why));
    fail(why + "; the NCCL communicator was aborted (ncclCommAbort)");
  }

  std::shared_ptr<NcclComm::State> st_;
  cudaEvent_t done_event_;
  std::string what_;
  std::vector<Tensor> buffers_;  // kept alive until the collective is done, as c10d's Work does
  bool done_ = false;
};

cudaStream_t new_comm_stream() {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

}  // namespace

std::unique_ptr<NcclComm> NcclComm::create(MpiComm& bootstrap, CudaDevice& dev, Duration timeout, std::string name) {
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, bootstrap.handle()));
  int world_rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  return init(&id, bootstrap.size(), bootstrap.rank(), world_rank, dev, timeout, std::move(name));
}

std::unique_ptr<NcclComm> NcclComm::create_local(CudaDevice& dev, Duration timeout, std::string name) {
  ncclUniqueId id{};
  NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  return init(&id, 1, 0, 0, dev, timeout, std::move(name));
}

std::unique_ptr<NcclComm> NcclComm::init(const void* unique_id, int nranks, int rank, int world_rank, CudaDevice& dev,
                                         Duration timeout, std::string name) {
  CUDA_CHECK(cudaSetDevice(dev.index()));
  auto st = std::make_shared<State>();
  st->timeout = timeout;
  st->world_rank = world_rank;
  st->compute = static_cast<cudaStream_t>(dev.stream());
  st->comm_stream = new_comm_stream();
  ncclUniqueId id;
  std::memcpy(&id, unique_id, sizeof id);
  NCCL_CHECK(ncclCommInitRank(&st->comm, nranks, id, rank), nullptr);
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(st), dev, std::move(name)));
}

NcclComm::NcclComm(std::shared_ptr<State> state, CudaDevice& dev, std::string name)
    : state_(std::move(state)), dev_(dev), name_(std::move(name)) {
  state_->start_watchdog();
  NCCL_CHECK(ncclCommUserRank(state_->comm, &rank_), state_->comm);
  NCCL_CHECK(ncclCommCount(state_->comm, &size_), state_->comm);
}

NcclComm::~NcclComm() = default;

void NcclComm::on_this_gpu(const char* op, const Tensor& t) const {
  if (t.defined() && t.placement() != Placement::cuda) {
    throw UsageError(fmt::format("{} on NCCL communicator '{}': {} is on {}; NCCL moves GPU memory only, "
                                 "allocate it on the CudaDevice", op, name_, t.describe(), placement_name(t.placement())));
  }
}

template <class Launch>
WorkPtr NcclComm::issue(std::string what, bool async_op, std::vector<Tensor> buffers, Launch&& launch) {
  State& s = *state_;
  const std::string full = fmt::format("rank {}: {} on {} seq {}", s.world_rank, what, name_, seq_++);
  if (const std::string why = s.aborted_reason(); !why.empty()) {
    throw UsageError(fmt::format("{}: communicator '{}' was aborted after an earlier failure ({}); "
                                 "create a new communicator", full, name_, why));
  }
  cudaEvent_t ready = nullptr, done = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ready, s.compute));           // the inputs, as the compute stream leaves them
  CUDA_CHECK(cudaStreamWaitEvent(s.comm_stream, ready, 0));
  CUDA_CHECK(cudaEventDestroy(ready));
  s.enter(full);  // Note [NCCL watchdog]: the call may block the host while NCCL connects peers
  const ncclResult_t rc = launch(s.comm_stream);
  s.leave();
  if (const std::string why = s.aborted_reason(); !why.empty()) {
    throw RankFailure(s.world_rank, fmt::format("{}; the NCCL communicator was aborted (ncclCommAbort)", why), nullptr);
  }
  if (rc != ncclSuccess) {
    const char* last = ncclGetLastError(s.comm);
    throw BackendError(fmt::format("{}: NCCL refused the call: {}{}{}", full, ncclGetErrorString(rc),
                                   last && *last ? ": " : "", last ? last : ""));
  }
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(done, s.comm_stream));
  auto work = std::make_shared<NcclWork>(state_, done, full, std::move(buffers));
  if (!async_op) work->wait();
  return work;
}

WorkPtr NcclComm::all_reduce(const Tensor& inout, const AllReduceOptions& opts) {
  comm_check::defined_same_dtype("all_reduce", inout, inout);
  on_this_gpu("all_reduce", inout);
  count(CollectiveKind::all_reduce, inout.nbytes());
  return issue(fmt::format("all_reduce({} x {})", inout.numel(), dtype_name(inout.dtype())), opts.async_op, {inout},
               [&](cudaStream_t s) {
                 if (inout.numel() == 0) return ncclSuccess;
                 return ncclAllReduce(inout.raw(), inout.raw(), static_cast<std::size_t>(inout.numel()),
                                      nccl_type(inout.dtype()), nccl_op(opts.op), state_->comm, s);
               });
}

WorkPtr NcclComm::reduce_scatter(const Tensor& out, const Tensor& in, const ReduceScatterOptions& opts) {
  comm_check::reduce_scatter(out, in, size(), rank());
  on_this_gpu("reduce_scatter", out);
  on_this_gpu("reduce_scatter", in);
  count(CollectiveKind::reduce_scatter, in.nbytes());
  // out may be this rank's slice of in: exactly NCCL's in-place form.
  return issue(fmt::format("reduce_scatter({} -> {} x {})", in.numel(), out.numel(), dtype_name(in.dtype())),
               opts.async_op, {in, out}, [&](cudaStream_t s) {
                 if (out.numel() == 0) return ncclSuccess;
                 return ncclReduceScatter(in.raw(), out.raw(), static_cast<std::size_t>(out.numel()),
                                          nccl_type(in.dtype()), nccl_op(opts.op), state_->comm, s);
               });
}

WorkPtr NcclComm::all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions& opts) {
  comm_check::all_gather(out, in, size(), rank());
  on_this_gpu("all_gather", out);
  on_this_gpu("all_gather", in);
  count(CollectiveKind::all_gather, out.nbytes());
  return issue(fmt::format("all_gather({} -> {} x {})", in.numel(), out.numel(), dtype_name(in.dtype())),
               opts.async_op, {in, out}, [&](cudaStream_t s) {
                 if (in.numel() == 0) return ncclSuccess;
                 return ncclAllGather(in.raw(), out.raw(), static_cast<std::size_t>(in.numel()),
                                      nccl_type(in.dtype()), state_->comm, s);
               });
}

WorkPtr NcclComm::reduce(const Tensor& inout, const ReduceOptions& opts) {
  comm_check::defined_same_dtype("reduce", inout, inout);
  comm_check::root("reduce", opts.root, size());
  on_this_gpu("reduce", inout);
  count(CollectiveKind::reduce, inout.nbytes());
  // recvbuff is only written on the root: the others' buffers are left unchanged.
  return issue(fmt::format("reduce({} x {}, root {})", inout.numel(), dtype_name(inout.dtype()), opts.root),
               opts.async_op, {inout}, [&](cudaStream_t s) {
                 if (inout.numel() == 0) return ncclSuccess;
                 return ncclReduce(inout.raw(), inout.raw(), static_cast<std::size_t>(inout.numel()),
                                   nccl_type(inout.dtype()), nccl_op(opts.op), opts.root, state_->comm, s);
               });
}

WorkPtr NcclComm::broadcast(const Tensor& inout, const BroadcastOptions& opts) {
  comm_check::defined_same_dtype("broadcast", inout, inout);
  comm_check::root("broadcast", opts.root, size());
  on_this_gpu("broadcast", inout);
  count(CollectiveKind::broadcast, inout.nbytes());
  return issue(fmt::format("broadcast({} x {}, root {})", inout.numel(), dtype_name(inout.dtype()), opts.root),
               opts.async_op, {inout}, [&](cudaStream_t s) {
                 if (inout.numel() == 0) return ncclSuccess;
                 return ncclBroadcast(inout.raw(), inout.raw(), static_cast<std::size_t>(inout.numel()),
                                      nccl_type(inout.dtype()), opts.root, state_->comm, s);
               });
}

WorkPtr NcclComm::all_to_all(const Tensor& out, const Tensor& in, const AllToAllOptions& opts) {
  comm_check::all_to_all(out, in, size());
  on_this_gpu("all_to_all", out);
  on_this_gpu("all_to_all", in);
  count(CollectiveKind::all_to_all, in.nbytes());
  return issue(fmt::format("all_to_all({} x {})", in.numel(), dtype_name(in.dtype())), opts.async_op, {in, out},
               [&](cudaStream_t s) {
                 const std::int64_t chunk = in.numel() / size_;
                 if (chunk == 0) return ncclSuccess;
                 const std::int64_t bytes = chunk * dtype_size(in.dtype());
                 const auto* src = static_cast<const char*>(in.raw());
                 auto* dst = static_cast<char*>(out.raw());
                 // One group: every peer's slice goes out and comes in together (grouped calls).
                 ncclResult_t rc = ncclGroupStart();
                 for (int peer = 0; peer < size_ && rc == ncclSuccess; ++peer) {
                   rc = ncclSend(src + peer * bytes, static_cast<std::size_t>(chunk), nccl_type(in.dtype()), peer,
                                 state_->comm, s);
                   if (rc == ncclSuccess) {
                     rc = ncclRecv(dst + peer * bytes, static_cast<std::size_t>(chunk), nccl_type(in.dtype()), peer,
                                   state_->comm, s);
                   }
                 }
                 const ncclResult_t end = ncclGroupEnd();
                 return rc != ncclSuccess ? rc : end;
               });
}

void NcclComm::barrier() {
  // A one-element all_reduce on the communicator's own float (State::barrier_buf): seen on an
  // H200, a barrier buffer taken from the CudaDevice was the one allocation a meta run of ZeRO-3's
  // construction lacked.
  count(CollectiveKind::barrier, 0);
  if (state_->barrier_buf == nullptr) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&state_->barrier_buf), sizeof(float)));
  }
  float* buf = state_->barrier_buf;
  issue("barrier()", false, {}, [&](cudaStream_t s) {
    return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, state_->comm, s);
  });
}

std::unique_ptr<Comm> NcclComm::split(int color, int key) {
  if (color < kNoColor) throw UsageError(fmt::format("split: color {} is negative; use kNoColor", color));
  if (const std::string why = state_->aborted_reason(); !why.empty()) {
    throw UsageError(fmt::format("split on communicator '{}', which was aborted ({})", name_, why));
  }
  count(CollectiveKind::split, 0);
  ncclComm_t sub = nullptr;
  const std::string what = fmt::format("rank {}: split(color {}, key {}) of {}", state_->world_rank, color, key, name_);
  state_->enter(what);
  const ncclResult_t rc = ncclCommSplit(state_->comm, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr);
  state_->leave();
  if (const std::string why = state_->aborted_reason(); !why.empty()) {
    throw RankFailure(state_->world_rank, fmt::format("{}; the NCCL communicator was aborted (ncclCommAbort)", why), nullptr);
  }
  NCCL_CHECK(rc, state_->comm);
  if (sub == nullptr) return nullptr;
  auto st = std::make_shared<State>();
  st->comm = sub;
  st->timeout = state_->timeout;
  st->world_rank = state_->world_rank;
  st->compute = state_->compute;
  st->comm_stream = new_comm_stream();
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(st), dev_, fmt::format("{}.c{}", name_, color)));
}

std::string gpu_unavailable(const LaunchEnv& env) {
  std::string why;
  const int gpus = cuda_device_count(&why);
  if (gpus == 0) return fmt::format("rank {} has no usable GPU ({})", env.rank, why);
  if (env.local_rank >= gpus) {
    return fmt::format("rank {} has no usable GPU: it is local rank {} on a machine with {} GPU(s), and NCCL "
                       "needs one GPU per rank", env.rank, env.local_rank, gpus);
  }
  return "";
}

GpuRank open_gpu_rank(const LaunchEnv& env, MpiComm* bootstrap, NcclComm::Duration timeout) {
  if (const std::string why = gpu_unavailable(env); !why.empty()) throw BackendError(why);
  GpuRank g;
  g.dev = std::make_unique<CudaDevice>(env.local_rank);
  g.comm = bootstrap ? NcclComm::create(*bootstrap, *g.dev, timeout) : NcclComm::create_local(*g.dev, timeout);
  return g;
}

}  // namespace zc::real
