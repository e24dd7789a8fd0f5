// CudaDevice: argument checks (shared with HostDevice), memory, transfers, and the checked launch
// of each op's kernel (real/cuda_device.cu).
#include "real/cuda_device.h"

#include "engine/host_device.h"
#include "real/cuda_check.h"
#include "real/cuda_kernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace zc::real {

using device_check::on;
using device_check::same_dtype;
using device_check::same_numel;

// Note [GPU memory measures]
// A CudaDevice has two counts of its memory besides the Device's ledger: AllocatorStats, kept
// where cudaMallocAsync returns and where a storage's deleter calls cudaFreeAsync (the same place
// HostDevice counts calloc and free), so it is exact to the byte and per category; and the
// default memory pool's own high-water mark (cudaMemPoolAttrUsedMemHigh), which the driver keeps.
// The pool's count is not per category, rounds each allocation up, includes the internal scratch
// buffers of reductions, and sees a free only when the stream reaches it, so it can only be
// larger; gpu_test checks both against a meta run.
struct CudaDevice::State {
  int index = 0;
  cudaStream_t stream = nullptr;
  std::string gpu;
  std::uint64_t next_id = 0;
  cudaMemPool_t pool = nullptr;
  std::shared_ptr<AllocatorStats> alloc_stats = std::make_shared<AllocatorStats>();
};

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    if (why) *why = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(rc), cudaGetErrorName(rc));
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount reports 0 GPUs";
  return n;
}



using kernels::View;
View vw(const Tensor& t) { return {t.raw(), t.dtype()}; }

namespace {

template <class... Ts>
bool any_f64(const Ts&... ts) {
  return ((ts.dtype() == DType::f64) || ...);
}

// A device buffer for internal use (reduction partials, argmax output), freed on the stream.
struct Scratch {
  cudaStream_t stream;
  void* p = nullptr;
  Scratch(cudaStream_t s, std::size_t bytes) : stream(s) {
    CUDA_CHECK(cudaMallocAsync(&p, std::max<std::size_t>(bytes, 1), s));
  }
  ~Scratch() { (void)cudaFreeAsync(p, stream); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

}  // namespace


CudaDevice::CudaDevice(int index) : st_(std::make_shared<State>()) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) throw BackendError(fmt::format("CudaDevice: no usable GPU ({}); run on a GPU machine or use --backend host", why));
  if (index < 0 || index >= count) {
    throw ConfigError(fmt::format("CudaDevice: GPU {} requested, this process sees {} (CUDA_VISIBLE_DEVICES, LOCAL_RANK)", index, count));
  }
  st_->index = index;
  CUDA_CHECK(cudaSetDevice(index));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  st_->gpu = prop.name;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st_->stream, cudaStreamNonBlocking));
  // Keep freed blocks in the pool: the engine allocates temporaries every step.
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&st_->pool, index));
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
  CUDA_CHECK(cudaMemPoolSetAttribute(st_->pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

const AllocatorStats* CudaDevice::allocator_stats() const { return st_->alloc_stats.get(); }

void CudaDevice::reset_allocator_peak() {
  st_->alloc_stats->reset_peak();
  // The pool's mark restarts from what is in use once the queued frees have run.
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  std::uint64_t zero = 0;
  CUDA_CHECK(cudaMemPoolSetAttribute(st_->pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

std::int64_t CudaDevice::pool_used_high() const {
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  std::uint64_t high = 0;
  CUDA_CHECK(cudaMemPoolGetAttribute(st_->pool, cudaMemPoolAttrUsedMemHigh, &high));
  return static_cast<std::int64_t>(high);
}

CudaDevice::~CudaDevice() {
  // Tensors may outlive the device (their deleters free on the stream); the stream is left to the
  // process exit, after synchronising so no kernel of ours is still running.
  (void)cudaStreamSynchronize(st_->stream);
}

std::string CudaDevice::name() const { return fmt::format("cuda:{} ({})", st_->index, st_->gpu); }
int CudaDevice::index() const { return st_->index; }
std::string CudaDevice::gpu_name() const { return st_->gpu; }
void* CudaDevice::stream() const { return st_->stream; }
void CudaDevice::synchronize() { CUDA_CHECK(cudaStreamSynchronize(st_->stream)); }

Tensor CudaDevice::do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) {
  const std::int64_t bytes = shape_numel(shape) * dtype_size(dtype);
  void* data = nullptr;
  const cudaError_t rc = cudaMallocAsync(&data, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)), st_->stream);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw BackendError(fmt::format("alloc: cudaMallocAsync of {} bytes for '{}' on {} failed: {}", bytes, label,
                                   name(), cudaGetErrorString(rc)));
  }
  CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<std::size_t>(bytes), st_->stream));
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  st_->alloc_stats->on_alloc(category, bytes, label);
  storage->stats = st_->alloc_stats;  // told of the free by the Storage (Note [Stream-ordered free])
  storage->owner = std::shared_ptr<void>(data, [st = st_](void* ptr) {
    // Stream-ordered: after every kernel already queued on the compute stream. A failure here
    // (the runtime already torn down at exit) cannot be raised from a deleter and frees nothing.
    (void)cudaFreeAsync(ptr, st->stream);
  });
  storage->bytes = bytes;
  storage->placement = Placement::cuda;
  storage->id = st_->next_id++;
  storage->name = std::move(label);
  counters_.bytes_allocated += bytes;
  return Tensor(dtype, std::move(shape), Placement::cuda, std::move(storage));
}

namespace {
cudaMemcpyKind kind_of(const Tensor& dst, const Tensor& src) {
  const bool dh = dst.placement() == Placement::host, sh = src.placement() == Placement::host;
  return dh ? (sh ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
            : (sh ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
}
void on_either(const char* op, const Tensor& t) {
  if (!t.defined()) throw UsageError(fmt::format("{}: undefined tensor", op));
  if (t.placement() == Placement::meta) {
    throw UsageError(fmt::format("{}: tensor {} is on meta, this device is cuda", op, t.describe()));
  }
}
}  // namespace

// cudaMemcpy2DAsync: the pitched copy CUDA provides for exactly this.
void CudaDevice::copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols,
                         std::int64_t dst_stride, std::int64_t src_stride) {
  on("copy_2d", dst, Placement::cuda);
  on("copy_2d", src, Placement::cuda);
  device_check::copy_2d_extent(dst, src, rows, cols, dst_stride, src_stride);
  const auto esize = static_cast<std::size_t>(dtype_size(src.dtype()));
  if (rows > 0 && cols > 0) {
    CUDA_CHECK(cudaMemcpy2DAsync(dst.raw(), static_cast<std::size_t>(dst_stride) * esize, src.raw(),
                                 static_cast<std::size_t>(src_stride) * esize, static_cast<std::size_t>(cols) * esize,
                                 static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, st_->stream));
  }
  const auto bytes = static_cast<std::int64_t>(rows * cols * static_cast<std::int64_t>(esize));
  count_kernel(0, bytes, bytes);
}

void CudaDevice::copy(const Tensor& dst, const Tensor& src) {
  on_either("copy", dst);
  on_either("copy", src);
  same_numel("copy", dst, src);
  same_dtype("copy", dst, src);
  if (dst.placement() == Placement::host && src.placement() == Placement::host) {
    throw UsageError(fmt::format("copy: {} and {} are both host tensors; use the host device", dst.describe(),
                                 src.describe()));
  }
  if (src.nbytes() == 0) return;
  const cudaMemcpyKind kind = kind_of(dst, src);
  if (kind == cudaMemcpyDeviceToDevice && dst.overlaps(src)) {  // memmove semantics, as the host
    Scratch tmp(st_->stream, static_cast<std::size_t>(src.nbytes()));
    CUDA_CHECK(cudaMemcpyAsync(tmp.p, src.raw(), static_cast<std::size_t>(src.nbytes()), kind, st_->stream));
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), tmp.p, static_cast<std::size_t>(src.nbytes()), kind, st_->stream));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<std::size_t>(src.nbytes()), kind, st_->stream));
  }
  if (kind != cudaMemcpyDeviceToDevice) synchronize();  // host memory is pageable: finish before returning
  count_kernel(0, src.nbytes(), dst.nbytes());
}

void CudaDevice::fill(const Tensor& t, double value) {
  on("fill", t, Placement::cuda);
  CUDA_CHECK(kernels::fill(st_->stream, vw(t), value, t.numel()));
  count_kernel(0, 0, t.nbytes());
}

void CudaDevice::upload(const Tensor& dst, std::span<const std::byte> src) {
  on("upload", dst, Placement::cuda);
  if (static_cast<std::int64_t>(src.size()) != dst.nbytes()) {
    throw UsageError(fmt::format("upload: {} bytes into {} of {} bytes", src.size(), dst.describe(), dst.nbytes()));
  }
  if (!src.empty()) {
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.data(), src.size(), cudaMemcpyHostToDevice, st_->stream));
    synchronize();  // the caller's span may go away on return
  }
  count_kernel(0, 0, dst.nbytes());
}

void CudaDevice::download(std::span<std::byte> dst, const Tensor& src) {
  on("download", src, Placement::cuda);
  if (static_cast<std::int64_t>(dst.size()) != src.nbytes()) {
    throw UsageError(fmt::format("download: {} of {} bytes into {} bytes", src.describe(), src.nbytes(), dst.size()));
  }
  if (!dst.empty()) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.raw(), dst.size(), cudaMemcpyDeviceToHost, st_->stream));
  }
  synchronize();
  count_kernel(0, src.nbytes(), 0);
}

void CudaDevice::cast(const Tensor& dst, const Tensor& src) {
  on_either("cast", dst);
  on_either("cast", src);
  same_numel("cast", dst, src);
  if (dst.placement() == Placement::host && src.placement() == Placement::host) {
    throw UsageError(fmt::format("cast: {} and {} are both host tensors; use the host device", dst.describe(), src.describe()));
  }
  if (dst.placement() == Placement::host) {
    // GPU -> CPU (ZeRO-Offload): bring the bytes over, convert with the host's conversions, which
    // are the same round-to-nearest-even as the kernels'.
    HostDevice cpu;
    const Tensor staged = cpu.alloc(src.dtype(), src.shape(), "d2h staging");
    download({static_cast<std::byte*>(staged.raw()), static_cast<std::size_t>(staged.nbytes())}, src);
    cpu.cast(dst, staged);
    count_kernel(0, src.nbytes(), dst.nbytes());
    return;
  }
  if (src.placement() == Placement::host) {
    // CPU -> GPU: convert on the host, then upload the result, as torch's blocking copy_ between
    // devices does (type conversions on the CPU): the GPU holds no staging buffer, so its memory
    // is what zerocheck plan counts (seen on an H200: a GPU-side staging of the source dtype was
    // the only allocation meta mode lacked).
    HostDevice cpu;
    const Tensor staged = cpu.alloc(dst.dtype(), dst.shape(), "h2d staging");
    cpu.cast(staged, src);
    upload(dst, {static_cast<const std::byte*>(staged.raw()), static_cast<std::size_t>(staged.nbytes())});
    count_kernel(0, src.nbytes(), dst.nbytes());
    return;
  }
  CUDA_CHECK(kernels::cast(st_->stream, any_f64(dst, src), vw(dst), vw(src), dst.numel()));
  count_kernel(0, src.nbytes(), dst.nbytes());
}

void CudaDevice::axpy(const Tensor& y, double alpha, const Tensor& x) {
  on("axpy", y, Placement::cuda);
  on("axpy", x, Placement::cuda);
  same_numel("axpy", y, x);
  CUDA_CHECK(kernels::axpy(st_->stream, any_f64(y, x), vw(y), alpha, vw(x), y.numel()));
  count_kernel(2 * y.numel(), x.nbytes() + y.nbytes(), y.nbytes());
}

void CudaDevice::scale(const Tensor& x, double alpha) {
  on("scale", x, Placement::cuda);
  CUDA_CHECK(kernels::scale(st_->stream, any_f64(x), vw(x), alpha, x.numel()));
  count_kernel(x.numel(), x.nbytes(), x.nbytes());
}

void CudaDevice::div(const Tensor& x, double divisor) {
  on("div", x, Placement::cuda);
  CUDA_CHECK(kernels::div(st_->stream, any_f64(x), vw(x), divisor, x.numel()));
  count_kernel(x.numel(), x.nbytes(), x.nbytes());
}

void CudaDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&out, &a, &b}) on("add", *t, Placement::cuda);
  same_numel("add", out, a);
  same_numel("add", out, b);
  CUDA_CHECK(kernels::add(st_->stream, any_f64(out, a, b), vw(out), vw(a), vw(b), out.numel()));
  count_kernel(out.numel(), a.nbytes() + b.nbytes(), out.nbytes());
}

void CudaDevice::mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&out, &a, &b}) on("mul", *t, Placement::cuda);
  same_numel("mul", out, a);
  same_numel("mul", out, b);
  CUDA_CHECK(kernels::mul(st_->stream, any_f64(out, a, b), vw(out), vw(a), vw(b), out.numel()));
  count_kernel(out.numel(), a.nbytes() + b.nbytes(), out.nbytes());
}

// kind 0: sum of squares, 1: dot(x, *y), 2: max |x| (NaN if any NaN), 3: any non-finite (0/1).
double CudaDevice::reduce(const Tensor& x, const Tensor* y, int kind) {
  const std::int64_t n = x.numel();
  if (n == 0) return 0.0;
  const std::int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  const std::int64_t width = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(blocks)));
  Scratch partials(st_->stream, static_cast<std::size_t>(width) * sizeof(double));
  auto* p = static_cast<double*>(partials.p);
  CUDA_CHECK(kernels::reduce(st_->stream, kind, vw(x), y ? vw(*y) : View{nullptr, DType::f32}, n, p, width));
  double out = 0;
  CUDA_CHECK(cudaMemcpyAsync(&out, p, sizeof(double), cudaMemcpyDeviceToHost, st_->stream));
  synchronize();
  return out;
}

double CudaDevice::sum_sq(const Tensor& x) {
  on("sum_sq", x, Placement::cuda);
  count_kernel(2 * x.numel(), x.nbytes(), 0);
  return reduce(x, nullptr, 0);
}

double CudaDevice::dot(const Tensor& a, const Tensor& b) {
  on("dot", a, Placement::cuda);
  on("dot", b, Placement::cuda);
  same_numel("dot", a, b);
  count_kernel(2 * a.numel(), a.nbytes() + b.nbytes(), 0);
  return reduce(a, &b, 1);
}

double CudaDevice::max_abs(const Tensor& x) {
  on("max_abs", x, Placement::cuda);
  count_kernel(x.numel(), x.nbytes(), 0);
  const double m = reduce(x, nullptr, 2);
  return std::isnan(m) ? std::numeric_limits<double>::quiet_NaN() : m;
}

bool CudaDevice::has_inf_nan(const Tensor& x) {
  on("has_inf_nan", x, Placement::cuda);
  count_kernel(x.numel(), x.nbytes(), 0);
  return reduce(x, nullptr, 3) != 0.0;
}

void CudaDevice::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const AdamParams& p) {
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) on("adam_step", *t, Placement::cuda);
  device_check::f32_state("adam_step", param);
  device_check::f32_state("adam_step", exp_avg);
  device_check::f32_state("adam_step", exp_avg_sq);
  same_numel("adam_step", param, grad);
  same_numel("adam_step", param, exp_avg);
  same_numel("adam_step", param, exp_avg_sq);
  ZC_ASSERT(p.step >= 1, "adam step count is 1-based, got {}", p.step);
  if (p.kernel == AdamKernel::torch_cpu) {
    throw NotImplementedError("torch_adam: torch.optim.Adam/AdamW's CPU arithmetic is not modelled; use FusedAdam");
  }
  const std::int64_t body = param.numel() & ~static_cast<std::int64_t>(p.simd_width - 1);
  CUDA_CHECK(kernels::adam(st_->stream, static_cast<float*>(param.raw()), vw(grad), static_cast<float*>(exp_avg.raw()),
                           static_cast<float*>(exp_avg_sq.raw()), ds_cpu_adam_scalars(p), body, param.numel()));
  count_kernel(16 * param.numel(), 4 * param.nbytes(), 3 * param.nbytes());
}

void CudaDevice::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                          const SgdParams& p) {
  on("sgd_step", param, Placement::cuda);
  on("sgd_step", grad, Placement::cuda);
  device_check::f32_state("sgd_step", param);
  same_numel("sgd_step", param, grad);
  const bool use_momentum = p.momentum != 0.0;
  if (use_momentum) {
    on("sgd_step", momentum_buf, Placement::cuda);
    device_check::f32_state("sgd_step", momentum_buf);
    same_numel("sgd_step", param, momentum_buf);
  }
  CUDA_CHECK(kernels::sgd(st_->stream, static_cast<float*>(param.raw()), vw(grad),
                          use_momentum ? static_cast<float*>(momentum_buf.raw()) : nullptr, torch_sgd_scalars(p),
                          param.numel()));
  count_kernel(6 * param.numel(), 3 * param.nbytes(), 2 * param.nbytes());
}

void CudaDevice::matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                        bool accumulate) {
  for (const Tensor* t : {&out, &a, &b}) on("matmul", *t, Placement::cuda);
  const device_check::MatmulDims d = device_check::matmul_dims(out, a, b, trans_a, trans_b);
  if (d.m > 65535LL * kernels::kTile) {
    throw UsageError(fmt::format("matmul: {} rows exceed the kernel's grid of 65535 x {} rows", d.m, kernels::kTile));
  }
  CUDA_CHECK(kernels::matmul(st_->stream, any_f64(out, a, b), vw(out), vw(a), vw(b), trans_a, trans_b, accumulate,
                             d.m, d.n, d.k, a.dim(1), b.dim(1)));
  count_kernel(2 * d.m * d.n * d.k, a.nbytes() + b.nbytes(), out.nbytes());
}

void CudaDevice::relu(const Tensor& out, const Tensor& x) {
  on("relu", out, Placement::cuda);
  on("relu", x, Placement::cuda);
  same_numel("relu", out, x);
  CUDA_CHECK(kernels::relu(st_->stream, any_f64(out, x), vw(out), vw(x), x.numel()));
  count_kernel(x.numel(), x.nbytes(), out.nbytes());
}

void CudaDevice::relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& x) {
  for (const Tensor* t : {&grad_in, &grad_out, &x}) on("relu_backward", *t, Placement::cuda);
  same_numel("relu_backward", grad_in, grad_out);
  same_numel("relu_backward", grad_in, x);
  CUDA_CHECK(kernels::relu_backward(st_->stream, any_f64(grad_in, grad_out, x), vw(grad_in), vw(grad_out), vw(x), x.numel()));
  count_kernel(x.numel(), x.nbytes() + grad_out.nbytes(), grad_in.nbytes());
}

void CudaDevice::add_row_vector(const Tensor& out, const Tensor& row) {
  on("add_row_vector", out, Placement::cuda);
  on("add_row_vector", row, Placement::cuda);
  const std::int64_t n = device_check::row_len("add_row_vector", out, row);
  CUDA_CHECK(kernels::add_row_vector(st_->stream, any_f64(out, row), vw(out), vw(row), out.numel(), n));
  count_kernel(out.numel(), out.nbytes() + row.nbytes(), out.nbytes());
}

void CudaDevice::sum_rows(const Tensor& out, const Tensor& x, bool accumulate) {
  on("sum_rows", out, Placement::cuda);
  on("sum_rows", x, Placement::cuda);
  const std::int64_t n = device_check::row_len("sum_rows", x, out);
  CUDA_CHECK(kernels::sum_rows(st_->stream, any_f64(out, x), vw(out), vw(x), x.dim(0), n, accumulate));
  count_kernel(x.numel(), x.nbytes(), out.nbytes());
}

// Labels and token ids are data the kernels index with; they are checked on the host first (one
// small download), so a bad id is a UsageError naming the row, as on the host, not a fault.
void CudaDevice::check_ids(const char* op, const Tensor& ids, std::int64_t limit) {
  // Labels are read as f32 (HostDevice's softmax_xent), token ids as f64 (its embedding ops).
  const std::string_view name(op);
  const bool labels = name == "softmax_xent" || name == "log_softmax_nll" || name == "nll_loss_backward";
  const std::vector<double> v = to_f64(*this, ids);
  for (std::size_t n = 0; n < v.size(); ++n) {
    const auto id = static_cast<std::int64_t>(labels ? static_cast<double>(static_cast<float>(v[n])) : v[n]);
    if (id < 0 || id >= limit) {
      throw UsageError(fmt::format("{}: {} {} of row {} outside [0, {})", op, labels ? "label" : "id", id, n, limit));
    }
  }
}

void CudaDevice::softmax_xent(const Tensor& dlogits, const Tensor& row_loss, const Tensor& logits,
                              const Tensor& labels) {
  for (const Tensor* t : {&dlogits, &row_loss, &logits, &labels}) on("softmax_xent", *t, Placement::cuda);
  same_numel("softmax_xent", dlogits, logits);
  if (logits.ndim() != 2 || labels.numel() != logits.dim(0) || row_loss.numel() != logits.dim(0)) {
    throw UsageError(fmt::format("softmax_xent: logits {} need labels and row_loss of [{}]",
                                 shape_str(logits.shape()), logits.ndim() == 2 ? logits.dim(0) : -1));
  }
  const std::int64_t rows = logits.dim(0), cols = logits.dim(1);
  check_ids("softmax_xent", labels, cols);
  CUDA_CHECK(kernels::softmax_xent(st_->stream, any_f64(dlogits, row_loss, logits), vw(dlogits), vw(row_loss), vw(logits),
              vw(labels), rows, cols));
  count_kernel(5 * logits.numel(), logits.nbytes() + labels.nbytes(), dlogits.nbytes());
}

void CudaDevice::log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                                 const Tensor& labels) {
  for (const Tensor* t : {&logp, &loss, &logits, &labels}) {
    on("log_softmax_nll", *t, Placement::cuda);
  }
  same_numel("log_softmax_nll", logp, logits);
  if (logits.ndim() != 2 || labels.numel() != logits.dim(0) || loss.numel() != 1) {
    throw UsageError(fmt::format("log_softmax_nll: {} needs labels of [{}] and a one-element loss",
                                 shape_str(logits.shape()), logits.ndim() == 2 ? logits.dim(0) : -1));
  }
  const std::int64_t rows = logits.dim(0), cols = logits.dim(1);
  check_ids("log_softmax_nll", labels, cols);
  CUDA_CHECK(kernels::log_softmax_nll(st_->stream, any_f64(logp, loss, logits), vw(logp),
                                      vw(loss), vw(logits), vw(labels), rows, cols));
  count_kernel(4 * logits.numel() + rows + 1, logits.nbytes() + labels.nbytes(),
               logp.nbytes() + loss.nbytes());
}

void CudaDevice::nll_loss_backward(const Tensor& grad, const Tensor& labels, double value) {
  for (const Tensor* t : {&grad, &labels}) on("nll_loss_backward", *t, Placement::cuda);
  if (grad.ndim() != 2 || labels.numel() != grad.dim(0)) {
    throw UsageError(fmt::format("nll_loss_backward: {} needs labels of [{}]", shape_str(grad.shape()),
                                 grad.ndim() == 2 ? grad.dim(0) : -1));
  }
  check_ids("nll_loss_backward", labels, grad.dim(1));
  CUDA_CHECK(kernels::nll_loss_backward(st_->stream, any_f64(grad), vw(grad), vw(labels), value, grad.dim(0),
                                        grad.dim(1)));
  count_kernel(grad.numel(), labels.nbytes(), grad.nbytes());
}

void CudaDevice::log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) {
  for (const Tensor* t : {&dx, &dout, &logp}) on("log_softmax_backward", *t, Placement::cuda);
  same_numel("log_softmax_backward", dx, logp);
  same_numel("log_softmax_backward", dout, logp);
  const std::int64_t rows = device_check::rows("log_softmax_backward", logp), cols = logp.dim(1);
  CUDA_CHECK(kernels::log_softmax_backward(st_->stream, any_f64(dx, dout, logp), vw(dx), vw(dout), vw(logp), rows,
                                           cols));
  count_kernel(4 * logp.numel(), logp.nbytes() + dout.nbytes(), dx.nbytes());
}

std::vector<std::int64_t> CudaDevice::argmax_rows(const Tensor& x) {
  on("argmax_rows", x, Placement::cuda);
  const std::int64_t rows = device_check::rows("argmax_rows", x), cols = x.dim(1);
  std::vector<std::int64_t> out(static_cast<std::size_t>(rows), 0);
  if (rows > 0 && cols > 0) {
    Scratch buf(st_->stream, out.size() * sizeof(std::int64_t));
    CUDA_CHECK(kernels::argmax_rows(st_->stream, static_cast<std::int64_t*>(buf.p), vw(x), rows, cols));
    CUDA_CHECK(cudaMemcpyAsync(out.data(), buf.p, out.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost, st_->stream));
    synchronize();
  }
  count_kernel(x.numel(), x.nbytes(), 0);
  return out;
}

void CudaDevice::scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) {
  for (const Tensor* t : {&out, &x, &s}) on("scale_rows", *t, Placement::cuda);
  same_numel("scale_rows", out, x);
  const std::int64_t rows = device_check::rows("scale_rows", x), cols = x.dim(1);
  if (s.numel() != rows) throw UsageError(fmt::format("scale_rows: {} scales for {} rows", s.numel(), rows));
  CUDA_CHECK(kernels::scale_rows(st_->stream, any_f64(out, x, s), vw(out), vw(x), vw(s), x.numel(), cols));
  count_kernel(x.numel(), x.nbytes() + s.nbytes(), out.nbytes());
}

void CudaDevice::row_dot(const Tensor& out, const Tensor& a, const Tensor& c) {
  for (const Tensor* t : {&out, &a, &c}) on("row_dot", *t, Placement::cuda);
  same_numel("row_dot", a, c);
  const std::int64_t rows = device_check::rows("row_dot", a), cols = a.dim(1);
  if (out.numel() != rows) throw UsageError(fmt::format("row_dot: output of {} for {} rows", out.numel(), rows));
  CUDA_CHECK(kernels::row_dot(st_->stream, any_f64(out, a, c), vw(out), vw(a), vw(c), rows, cols));
  count_kernel(2 * a.numel(), a.nbytes() + c.nbytes(), out.nbytes());
}

void CudaDevice::embedding(const Tensor& out, const Tensor& table, const Tensor& ids) {
  for (const Tensor* t : {&out, &table, &ids}) on("embedding", *t, Placement::cuda);
  const std::int64_t vocab = device_check::rows("embedding", table), dim = table.dim(1), n = ids.numel();
  if (out.numel() != n * dim)
    throw UsageError(fmt::format("embedding: out {} for {} ids of dim {}", out.describe(), n, dim));
  check_ids("embedding", ids, vocab);
  CUDA_CHECK(kernels::embedding(st_->stream, any_f64(out, table), vw(out), vw(table), vw(ids), n, dim));
  count_kernel(0, out.nbytes() + ids.nbytes(), out.nbytes());
}

void CudaDevice::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  for (const Tensor* t : {&dtable, &dout, &ids}) on("embedding_backward", *t, Placement::cuda);
  const std::int64_t vocab = device_check::rows("embedding_backward", dtable), dim = dtable.dim(1), n = ids.numel();
  if (dout.numel() != n * dim)
    throw UsageError(fmt::format("embedding_backward: dout {} for {} ids of dim {}", dout.describe(), n, dim));
  check_ids("embedding_backward", ids, vocab);
  CUDA_CHECK(kernels::embedding_backward(st_->stream, any_f64(dtable, dout), vw(dtable), vw(dout), vw(ids), n, dim,
              dtable.numel()));
  count_kernel(dout.numel(), dout.nbytes() + ids.nbytes(), dtable.nbytes());
}

void CudaDevice::rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  for (const Tensor* t : {&out, &rstd, &x, &w}) on("rmsnorm", *t, Placement::cuda);
  same_numel("rmsnorm", out, x);
  const std::int64_t rows = device_check::rows("rmsnorm", x), dim = device_check::row_len("rmsnorm", x, w);
  if (rstd.numel() != rows) throw UsageError(fmt::format("rmsnorm: rstd {} for {} rows", rstd.describe(), rows));
  CUDA_CHECK(kernels::rmsnorm(st_->stream, any_f64(out, rstd, x, w), vw(out), vw(rstd), vw(x), vw(w), eps, rows, dim));
  count_kernel(4 * x.numel(), x.nbytes() + w.nbytes(), out.nbytes() + rstd.nbytes());
}

void CudaDevice::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                                  const Tensor& w, const Tensor& rstd) {
  for (const Tensor* t : {&dx, &dw, &dout, &x, &w, &rstd}) on("rmsnorm_backward", *t, Placement::cuda);
  same_numel("rmsnorm_backward", dx, x);
  same_numel("rmsnorm_backward", dout, x);
  same_numel("rmsnorm_backward", dw, w);
  const std::int64_t rows = device_check::rows("rmsnorm_backward", x), dim = device_check::row_len("rmsnorm_backward", x, w);
  CUDA_CHECK(kernels::rmsnorm_backward(st_->stream, any_f64(dx, dw, dout, x, w, rstd), vw(dx), vw(dw), vw(dout), vw(x),
              vw(w), vw(rstd), rows, dim));
  count_kernel(8 * x.numel(), 2 * x.nbytes() + w.nbytes() + rstd.nbytes(), dx.nbytes() + dw.nbytes());
}

void CudaDevice::layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                           const Tensor& w, const Tensor& b, double eps) {
  for (const Tensor* t : {&out, &mean, &rstd, &x, &w, &b}) on("layernorm", *t, Placement::cuda);
  same_numel("layernorm", out, x);
  const std::int64_t rows = device_check::rows("layernorm", x), dim = device_check::row_len("layernorm", x, w);
  device_check::row_len("layernorm", x, b);
  if (mean.numel() != rows || rstd.numel() != rows) {
    throw UsageError(fmt::format("layernorm: mean {} and rstd {} must have {} rows", mean.describe(),
                                 rstd.describe(), rows));
  }
  CUDA_CHECK(kernels::layernorm(st_->stream, any_f64(out, mean, rstd, x, w, b), vw(out), vw(mean), vw(rstd), vw(x),
                                vw(w), vw(b), eps, rows, dim));
  count_kernel(8 * x.numel(), x.nbytes() + w.nbytes() + b.nbytes(), out.nbytes() + mean.nbytes() + rstd.nbytes());
}

void CudaDevice::layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                    const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&dx, &dw, &db, &dout, &x, &w, &mean, &rstd}) on("layernorm_backward", *t, Placement::cuda);
  same_numel("layernorm_backward", dx, x);
  same_numel("layernorm_backward", dout, x);
  same_numel("layernorm_backward", dw, w);
  same_numel("layernorm_backward", db, w);
  const std::int64_t rows = device_check::rows("layernorm_backward", x);
  const std::int64_t dim = device_check::row_len("layernorm_backward", x, w);
  if (mean.numel() != rows || rstd.numel() != rows) {
    throw UsageError("layernorm_backward: mean and rstd must have one value per row");
  }
  CUDA_CHECK(kernels::layernorm_backward(st_->stream, any_f64(dx, dw, db, dout, x, w, mean, rstd), vw(dx), vw(dw),
                                         vw(db), vw(dout), vw(x), vw(w), vw(mean), vw(rstd), rows, dim));
  count_kernel(12 * x.numel(), 2 * x.nbytes() + w.nbytes() + mean.nbytes() + rstd.nbytes(),
               dx.nbytes() + dw.nbytes() + db.nbytes());
}

void CudaDevice::gelu(const Tensor& out, const Tensor& x) {
  for (const Tensor* t : {&out, &x}) on("gelu", *t, Placement::cuda);
  same_numel("gelu", out, x);
  CUDA_CHECK(kernels::gelu(st_->stream, any_f64(out, x), vw(out), vw(x), x.numel()));
  count_kernel(10 * x.numel(), x.nbytes(), out.nbytes());
}

void CudaDevice::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  for (const Tensor* t : {&dx, &dout, &x}) on("gelu_backward", *t, Placement::cuda);
  same_numel("gelu_backward", dx, dout);
  same_numel("gelu_backward", dx, x);
  CUDA_CHECK(kernels::gelu_backward(st_->stream, any_f64(dx, dout, x), vw(dx), vw(dout), vw(x), x.numel()));
  count_kernel(16 * x.numel(), x.nbytes() + dout.nbytes(), dx.nbytes());
}

void CudaDevice::swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  for (const Tensor* t : {&out, &gate, &up}) on("swiglu", *t, Placement::cuda);
  same_numel("swiglu", out, gate);
  same_numel("swiglu", out, up);
  CUDA_CHECK(kernels::swiglu(st_->stream, any_f64(out, gate, up), vw(out), vw(gate), vw(up), out.numel()));
  count_kernel(6 * out.numel(), gate.nbytes() + up.nbytes(), out.nbytes());
}

void CudaDevice::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                                 const Tensor& up) {
  for (const Tensor* t : {&dgate, &dup, &dout, &gate, &up}) on("swiglu_backward", *t, Placement::cuda);
  for (const Tensor* t : {&dup, &dout, &gate, &up}) same_numel("swiglu_backward", dgate, *t);
  CUDA_CHECK(kernels::swiglu_backward(st_->stream, any_f64(dgate, dup, dout, gate, up), vw(dgate), vw(dup), vw(dout),
                                      vw(gate), vw(up), dout.numel()));
  count_kernel(10 * dout.numel(), dout.nbytes() + gate.nbytes() + up.nbytes(), dgate.nbytes() + dup.nbytes());
}

void CudaDevice::unary(const Tensor& out, const Tensor& x, Unary f) {
  for (const Tensor* t : {&out, &x}) on(unary_name(f), *t, Placement::cuda);
  same_numel(unary_name(f), out, x);
  CUDA_CHECK(kernels::unary(st_->stream, any_f64(out, x), vw(out), vw(x), static_cast<int>(f), x.numel()));
  count_kernel(unary_flops(f, false) * x.numel(), x.nbytes(), out.nbytes());
}

void CudaDevice::unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved, Unary f) {
  for (const Tensor* t : {&dx, &dout, &saved}) on(unary_name(f), *t, Placement::cuda);
  same_numel(unary_name(f), dx, dout);
  same_numel(unary_name(f), dx, saved);
  CUDA_CHECK(kernels::unary_backward(st_->stream, any_f64(dx, dout, saved), vw(dx), vw(dout), vw(saved),
                                     static_cast<int>(f), dx.numel()));
  count_kernel(unary_flops(f, true) * dx.numel(), dout.nbytes() + saved.nbytes(), dx.nbytes());
}

void CudaDevice::rope(const Tensor& out, const Tensor& x, std::int64_t seq, std::int64_t heads, double base,
                      bool inverse) {
  for (const Tensor* t : {&out, &x}) on("rope", *t, Placement::cuda);
  same_numel("rope", out, x);
  if (x.ndim() != 2 || heads < 1 || seq < 1 || x.dim(1) % heads != 0 || (x.dim(1) / heads) % 2 != 0) {
    throw UsageError(fmt::format("rope: {} must be [R, heads * dh] with {} heads of an even dh and seq {} >= 1",
                                 x.describe(), heads, seq));
  }
  CUDA_CHECK(kernels::rope(st_->stream, any_f64(out, x), vw(out), vw(x), x.dim(0), heads, x.dim(1) / heads, seq,
                           base, inverse));
  count_kernel(6 * x.numel(), x.nbytes(), out.nbytes());
}

void CudaDevice::causal_softmax(const Tensor& out, const Tensor& x) {
  for (const Tensor* t : {&out, &x}) on("causal_softmax", *t, Placement::cuda);
  same_numel("causal_softmax", out, x);
  const std::int64_t rows = device_check::rows("causal_softmax", x), cols = x.dim(1);
  CUDA_CHECK(kernels::causal_softmax(st_->stream, any_f64(out, x), vw(out), vw(x), rows, cols));
  count_kernel(4 * x.numel(), x.nbytes(), out.nbytes());
}

void CudaDevice::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) {
  for (const Tensor* t : {&dx, &dout, &p}) on("softmax_backward", *t, Placement::cuda);
  same_numel("softmax_backward", dx, p);
  same_numel("softmax_backward", dout, p);
  const std::int64_t rows = device_check::rows("softmax_backward", p), cols = p.dim(1);
  CUDA_CHECK(kernels::softmax_backward(st_->stream, any_f64(dx, dout, p), vw(dx), vw(dout), vw(p), rows, cols));
  count_kernel(4 * p.numel(), p.nbytes() + dout.nbytes(), dx.nbytes());
}

void CudaDevice::permute_0213(const Tensor& out, const Tensor& x, std::int64_t a, std::int64_t b, std::int64_t c,
                              std::int64_t d) {
  for (const Tensor* t : {&out, &x}) on("permute_0213", *t, Placement::cuda);
  same_numel("permute_0213", out, x);
  if (a * b * c * d != x.numel()) {
    throw UsageError(fmt::format("permute_0213: [{},{},{},{}] does not cover {}", a, b, c, d, x.describe()));
  }
  same_dtype("permute_0213", out, x);
  CUDA_CHECK(kernels::permute_0213(st_->stream, out.raw(), x.raw(), dtype_size(x.dtype()), a, b, c, d));
  count_kernel(0, x.nbytes(), out.nbytes());
}

}  // namespace zc::real
