// HostDevice kernels: plain loops in a fixed order, compiled with -ffp-contract=off so every
// product and sum rounds exactly where the code says; a fused multiply-add only where it is
// written (fmaf, the optimizer kernels of engine/optimizer_math.h), as the CUDA kernels do too.
#include "engine/host_device.h"

#include "engine/host_loops.h"
#include "engine/optimizer_math.h"
#include "engine/errors.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <sys/mman.h>

namespace zc {

using namespace host_loops;

namespace {

// Stride-halving tree over `leaves`, padded with zeros to a power of two (Note [Canonical
// reduction order]). Destroys leaves.
double tree_sum(std::vector<double>& leaves) {
  std::size_t width = std::bit_ceil(std::max<std::size_t>(leaves.size(), 1));
  leaves.resize(width, 0.0);
  for (width /= 2; width >= 1; width /= 2) {
    for (std::size_t i = 0; i < width; ++i) leaves[i] = leaves[i] + leaves[i + width];
  }
  return leaves[0];
}

}  // namespace

namespace device_check {

void copy_2d_extent(const Tensor& dst, const Tensor& src, std::int64_t rows, std::int64_t cols,
                    std::int64_t dst_stride, std::int64_t src_stride) {
  same_dtype("copy_2d", dst, src);
  if (rows < 0 || cols < 0 || (rows > 1 && (dst_stride < cols || src_stride < cols))) {
    throw UsageError(fmt::format("copy_2d: {} rows of {} with strides {} (dst) and {} (src): "
                                 "strides must cover a row", rows, cols, dst_stride, src_stride));
  }
  const auto need = [&](std::int64_t stride) { return rows == 0 ? 0 : (rows - 1) * stride + cols; };
  if (dst.numel() < need(dst_stride) || src.numel() < need(src_stride)) {
    throw UsageError(fmt::format("copy_2d: {} rows of {} need {} elements of dst {} and {} of src {}",
                                 rows, cols, need(dst_stride), dst.describe(), need(src_stride),
                                 src.describe()));
  }
  if (rows > 0 && cols > 0 && dst.overlaps(src)) {
    throw UsageError(fmt::format("copy_2d: dst {} overlaps src {}", dst.describe(), src.describe()));
  }
}

void same_numel(const char* op, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) {
    throw UsageError(fmt::format("{}: operands have {} and {} elements ({} vs {})", op, a.numel(),
                                 b.numel(), a.describe(), b.describe()));
  }
}
void same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    throw UsageError(fmt::format("{}: dtypes differ ({} vs {}); cast first", op,
                                 dtype_name(a.dtype()), dtype_name(b.dtype())));
  }
}
void on(const char* op, const Tensor& t, Placement placement) {
  if (!t.defined()) throw UsageError(fmt::format("{}: undefined tensor", op));
  if (t.placement() != placement) {
    throw UsageError(fmt::format("{}: tensor {} is on {}, this device is {}", op, t.describe(),
                                 placement_name(t.placement()), placement_name(placement)));
  }
}
void f32_state(const char* op, const Tensor& t) {
  if (t.dtype() != DType::f32) {
    throw UsageError(fmt::format("{}: {} must be f32 (optimizer states and master params are f32)",
                                 op, t.describe()));
  }
}
MatmulDims matmul_dims(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                       bool trans_b) {
  if (out.ndim() != 2 || a.ndim() != 2 || b.ndim() != 2) {
    throw UsageError(fmt::format("matmul: operands must be 2-D, got {} {} {}",
                                 shape_str(out.shape()), shape_str(a.shape()),
                                 shape_str(b.shape())));
  }
  const std::int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const std::int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const std::int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const std::int64_t n = trans_b ? b.dim(0) : b.dim(1);
  if (k != kb || out.dim(0) != m || out.dim(1) != n) {
    throw UsageError(fmt::format("matmul: shapes {}{} x {}{} -> {} do not agree",
                                 shape_str(a.shape()), trans_a ? "^T" : "", shape_str(b.shape()),
                                 trans_b ? "^T" : "", shape_str(out.shape())));
  }
  return {m, n, k};
}
std::int64_t row_len(const char* op, const Tensor& matrix, const Tensor& row) {
  if (matrix.ndim() != 2 || row.numel() != matrix.dim(1)) {
    throw UsageError(fmt::format("{}: row of {} elements does not fit matrix {}", op, row.numel(),
                                 shape_str(matrix.shape())));
  }
  return matrix.dim(1);
}

std::int64_t rows(const char* op, const Tensor& matrix) {
  if (matrix.ndim() != 2) throw UsageError(fmt::format("{}: {} must be 2-D", op, matrix.describe()));
  return matrix.dim(0);
}

}  // namespace device_check

using namespace device_check;

// A stand-in for a GPU moves data between itself and the CPU side with cast and copy, as
// CudaDevice does; every other op takes its own placement only.
void HostDevice::on_or_cpu(const char* op, const Tensor& t) const {
  if (placement_ != Placement::host && t.defined() && t.placement() == Placement::host) return;
  on(op, t, placement_);
}

Tensor HostDevice::do_alloc(DType dtype, Shape shape, std::string label, MemCategory category) {
  const std::int64_t bytes = shape_numel(shape) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>();
  // Zero-filled, and the deleter runs when the last view is gone. Large buffers are mapped rather
  // than calloc'd: the kernel's zero pages cost nothing until written, where tcmalloc's calloc
  // writes every byte (seen: DeepSpeed's default 5e8-element ipg buffers, which a small model's
  // ZeRO-2 run allocates in full, cost 1.2 s and 2 GB of resident memory per run to zero).
  constexpr std::int64_t kMapAtLeast = std::int64_t{64} << 20;
  const bool mapped = bytes >= kMapAtLeast;
  void* data = nullptr;
  if (mapped) {
    data = mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) data = nullptr;
  } else {
    data = std::calloc(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)), 1);
  }
  if (data == nullptr) throw UsageError(fmt::format("alloc: out of host memory ({} bytes)", bytes));
  storage->data = data;
  alloc_stats_->on_alloc(category, bytes, label);
  storage->stats = alloc_stats_;  // told of the free by the Storage (Note [Stream-ordered free])
  storage->owner = std::shared_ptr<void>(data, [mapped, bytes](void* ptr) {
    if (mapped) {
      munmap(ptr, static_cast<std::size_t>(bytes));
    } else {
      std::free(ptr);
    }
  });
  storage->bytes = bytes;
  storage->placement = placement_;
  storage->id = next_storage_id_++;
  storage->name = std::move(label);
  counters_.bytes_allocated += bytes;
  return Tensor(dtype, std::move(shape), placement_, std::move(storage));
}

void HostDevice::copy(const Tensor& dst, const Tensor& src) {
  on_or_cpu("copy", dst);
  on_or_cpu("copy", src);
  same_numel("copy", dst, src);
  same_dtype("copy", dst, src);
  std::memmove(dst.raw(), src.raw(), static_cast<std::size_t>(src.nbytes()));
  count_kernel(0, src.nbytes(), dst.nbytes());
}

void HostDevice::copy_2d(const Tensor& dst, const Tensor& src, std::int64_t rows,
                         std::int64_t cols, std::int64_t dst_stride, std::int64_t src_stride) {
  on("copy_2d", dst, placement_);
  on("copy_2d", src, placement_);
  copy_2d_extent(dst, src, rows, cols, dst_stride, src_stride);
  const std::int64_t esize = dtype_size(src.dtype());
  const auto* from = static_cast<const std::byte*>(src.raw());
  auto* to = static_cast<std::byte*>(dst.raw());
  for (std::int64_t r = 0; r < rows && cols > 0; ++r) {
    std::memcpy(to + r * dst_stride * esize, from + r * src_stride * esize,
                static_cast<std::size_t>(cols * esize));
  }
  count_kernel(0, rows * cols * esize, rows * cols * esize);
}

void HostDevice::fill(const Tensor& t, double value) {
  on("fill", t, placement_);
  for (std::int64_t i = 0; i < t.numel(); ++i) store_from_f64(t.raw(), t.dtype(), i, value);
  count_kernel(0, 0, t.nbytes());
}

void HostDevice::upload(const Tensor& dst, std::span<const std::byte> src) {
  on("upload", dst, placement_);
  if (static_cast<std::int64_t>(src.size()) != dst.nbytes()) {
    throw UsageError(fmt::format("upload: {} bytes into {} of {} bytes", src.size(),
                                 dst.describe(), dst.nbytes()));
  }
  if (!src.empty()) std::memcpy(dst.raw(), src.data(), src.size());  // an empty one may be null
  count_kernel(0, 0, dst.nbytes());
}

void HostDevice::download(std::span<std::byte> dst, const Tensor& src) {
  on("download", src, placement_);
  if (static_cast<std::int64_t>(dst.size()) != src.nbytes()) {
    throw UsageError(fmt::format("download: {} of {} bytes into {} bytes", src.describe(),
                                 src.nbytes(), dst.size()));
  }
  if (!dst.empty()) std::memcpy(dst.data(), src.raw(), dst.size());  // an empty one may be null
  count_kernel(0, src.nbytes(), 0);
}

void HostDevice::cast(const Tensor& dst, const Tensor& src) {
  on_or_cpu("cast", dst);
  on_or_cpu("cast", src);
  same_numel("cast", dst, src);
  with_compute({&dst, &src}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dst.numel(); ++i) st<T>(dst, i, ld<T>(src, i));
  });
  count_kernel(0, src.nbytes(), dst.nbytes());
}

void HostDevice::axpy(const Tensor& y, double alpha, const Tensor& x) {
  on("axpy", y, placement_);
  on("axpy", x, placement_);
  same_numel("axpy", y, x);
  with_compute({&y, &x}, [&]<class T>(T) {
    const T a = static_cast<T>(alpha);
    for (std::int64_t i = 0; i < y.numel(); ++i) st<T>(y, i, ld<T>(y, i) + a * ld<T>(x, i));
  });
  count_kernel(2 * y.numel(), x.nbytes() + y.nbytes(), y.nbytes());
}

void HostDevice::scale(const Tensor& x, double alpha) {
  on("scale", x, placement_);
  with_compute({&x}, [&]<class T>(T) {
    const T a = static_cast<T>(alpha);
    for (std::int64_t i = 0; i < x.numel(); ++i) st<T>(x, i, a * ld<T>(x, i));
  });
  count_kernel(x.numel(), x.nbytes(), x.nbytes());
}

void HostDevice::div(const Tensor& x, double divisor) {
  on("div", x, placement_);
  with_compute({&x}, [&]<class T>(T) {
    const T d = static_cast<T>(divisor);
    for (std::int64_t i = 0; i < x.numel(); ++i) st<T>(x, i, ld<T>(x, i) / d);
  });
  count_kernel(x.numel(), x.nbytes(), x.nbytes());
}

void HostDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  on("add", out, placement_);
  on("add", a, placement_);
  on("add", b, placement_);
  same_numel("add", out, a);
  same_numel("add", out, b);
  with_compute({&out, &a, &b}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) st<T>(out, i, ld<T>(a, i) + ld<T>(b, i));
  });
  count_kernel(out.numel(), a.nbytes() + b.nbytes(), out.nbytes());
}

void HostDevice::mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  on("mul", out, placement_);
  on("mul", a, placement_);
  on("mul", b, placement_);
  same_numel("mul", out, a);
  same_numel("mul", out, b);
  with_compute({&out, &a, &b}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) st<T>(out, i, ld<T>(a, i) * ld<T>(b, i));
  });
  count_kernel(out.numel(), a.nbytes() + b.nbytes(), out.nbytes());
}

// Note [Canonical reduction order] for sum_i term(i), terms computed in f64.
template <class Term>
double canonical_sum(std::int64_t n, Term term) {
  const std::int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partials(static_cast<std::size_t>(blocks));
  std::vector<double> leaves;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t lo = b * kReduceBlock;
    const std::int64_t hi = std::min(n, lo + kReduceBlock);
    leaves.assign(static_cast<std::size_t>(kReduceBlock), 0.0);
    for (std::int64_t i = lo; i < hi; ++i) leaves[static_cast<std::size_t>(i - lo)] = term(i);
    partials[static_cast<std::size_t>(b)] = tree_sum(leaves);
  }
  return partials.empty() ? 0.0 : tree_sum(partials);
}

double HostDevice::sum_sq(const Tensor& x) {
  on("sum_sq", x, placement_);
  count_kernel(2 * x.numel(), x.nbytes(), 0);
  return canonical_sum(x.numel(), [&](std::int64_t i) {
    const double v = load_as_f64(x.raw(), x.dtype(), i);
    return v * v;
  });
}

double HostDevice::dot(const Tensor& a, const Tensor& b) {
  on("dot", a, placement_);
  on("dot", b, placement_);
  same_numel("dot", a, b);
  count_kernel(2 * a.numel(), a.nbytes() + b.nbytes(), 0);
  return canonical_sum(a.numel(), [&](std::int64_t i) {
    return load_as_f64(a.raw(), a.dtype(), i) * load_as_f64(b.raw(), b.dtype(), i);
  });
}

double HostDevice::max_abs(const Tensor& x) {
  on("max_abs", x, placement_);
  double m = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = std::fabs(load_as_f64(x.raw(), x.dtype(), i));
    if (std::isnan(v)) {
      m = std::numeric_limits<double>::quiet_NaN();
      break;
    }
    m = std::max(m, v);
  }
  count_kernel(x.numel(), x.nbytes(), 0);
  return m;
}

bool HostDevice::has_inf_nan(const Tensor& x) {
  on("has_inf_nan", x, placement_);
  bool found = false;
  for (std::int64_t i = 0; i < x.numel() && !found; ++i) {
    found = !std::isfinite(load_as_f64(x.raw(), x.dtype(), i));
  }
  count_kernel(x.numel(), x.nbytes(), 0);
  return found;
}

void HostDevice::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const AdamParams& p) {
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) on("adam_step", *t, placement_);
  f32_state("adam_step", param);
  f32_state("adam_step", exp_avg);
  f32_state("adam_step", exp_avg_sq);
  same_numel("adam_step", param, grad);
  same_numel("adam_step", param, exp_avg);
  same_numel("adam_step", param, exp_avg_sq);
  ZC_ASSERT(p.step >= 1, "adam step count is 1-based, got {}", p.step);
  auto* pw = static_cast<float*>(param.raw());
  auto* m = static_cast<float*>(exp_avg.raw());
  auto* v = static_cast<float*>(exp_avg_sq.raw());
  if (p.kernel == AdamKernel::torch_cpu) {
    throw NotImplementedError(
        "torch_adam: torch.optim.Adam/AdamW's CPU arithmetic is not modelled (its Tensor.sqrt is MKL's vector sqrt, "
        "not correctly rounded on this CPU); use DeepSpeed's FusedAdam (torch_adam false)");
  }
  const DsCpuAdamScalars k = ds_cpu_adam_scalars(p);
  const std::int64_t body = param.numel() & ~static_cast<std::int64_t>(p.simd_width - 1);
  for (std::int64_t i = 0; i < param.numel(); ++i) {
    ds_cpu_adam_element(k, i >= body, load_as_f32(grad.raw(), grad.dtype(), i), pw[i], m[i], v[i]);
  }
  count_kernel(16 * param.numel(), 4 * param.nbytes(), 3 * param.nbytes());
}

void HostDevice::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                          const SgdParams& p) {
  on("sgd_step", param, placement_);
  on("sgd_step", grad, placement_);
  f32_state("sgd_step", param);
  same_numel("sgd_step", param, grad);
  const bool use_momentum = p.momentum != 0.0;
  if (use_momentum) {
    on("sgd_step", momentum_buf, placement_);
    f32_state("sgd_step", momentum_buf);
    same_numel("sgd_step", param, momentum_buf);
  }
  const TorchSgdScalars k = torch_sgd_scalars(p);
  auto* pw = static_cast<float*>(param.raw());
  auto* buf = use_momentum ? static_cast<float*>(momentum_buf.raw()) : nullptr;
  float unused = 0.0f;
  for (std::int64_t i = 0; i < param.numel(); ++i) {
    torch_sgd_element(k, load_as_f32(grad.raw(), grad.dtype(), i), pw[i], use_momentum ? buf[i] : unused);
  }
  count_kernel(6 * param.numel(), 3 * param.nbytes(), 2 * param.nbytes());
}

void HostDevice::matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                        bool trans_b, bool accumulate) {
  on("matmul", out, placement_);
  on("matmul", a, placement_);
  on("matmul", b, placement_);
  const MatmulDims d = matmul_dims(out, a, b, trans_a, trans_b);
  const std::int64_t lda = a.dim(1), ldb = b.dim(1);
  with_compute({&out, &a, &b}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < d.m; ++i) {
      for (std::int64_t j = 0; j < d.n; ++j) {
        T acc = 0;
        for (std::int64_t k = 0; k < d.k; ++k) {
          const T av = ld<T>(a, trans_a ? k * lda + i : i * lda + k);
          const T bv = ld<T>(b, trans_b ? j * ldb + k : k * ldb + j);
          acc = acc + av * bv;
        }
        const std::int64_t o = i * d.n + j;
        st<T>(out, o, accumulate ? ld<T>(out, o) + acc : acc);
      }
    }
  });
  count_kernel(2 * d.m * d.n * d.k, a.nbytes() + b.nbytes(), out.nbytes());
}

void HostDevice::relu(const Tensor& out, const Tensor& x) {
  on("relu", out, placement_);
  on("relu", x, placement_);
  same_numel("relu", out, x);
  with_compute({&out, &x}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = ld<T>(x, i);
      st<T>(out, i, v > T(0) ? v : T(0));
    }
  });
  count_kernel(x.numel(), x.nbytes(), out.nbytes());
}

void HostDevice::relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& x) {
  for (const Tensor* t : {&grad_in, &grad_out, &x}) on("relu_backward", *t, placement_);
  same_numel("relu_backward", grad_in, grad_out);
  same_numel("relu_backward", grad_in, x);
  with_compute({&grad_in, &grad_out, &x}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      st<T>(grad_in, i, ld<T>(x, i) > T(0) ? ld<T>(grad_out, i) : T(0));
    }
  });
  count_kernel(x.numel(), x.nbytes() + grad_out.nbytes(), grad_in.nbytes());
}

void HostDevice::add_row_vector(const Tensor& out, const Tensor& row) {
  on("add_row_vector", out, placement_);
  on("add_row_vector", row, placement_);
  const std::int64_t n = row_len("add_row_vector", out, row);
  with_compute({&out, &row}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) st<T>(out, i, ld<T>(out, i) + ld<T>(row, i % n));
  });
  count_kernel(out.numel(), out.nbytes() + row.nbytes(), out.nbytes());
}

void HostDevice::sum_rows(const Tensor& out, const Tensor& x, bool accumulate) {
  on("sum_rows", out, placement_);
  on("sum_rows", x, placement_);
  const std::int64_t n = row_len("sum_rows", x, out);
  with_compute({&out, &x}, [&]<class T>(T) {
    for (std::int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (std::int64_t i = 0; i < x.dim(0); ++i) acc = acc + ld<T>(x, i * n + j);
      st<T>(out, j, accumulate ? ld<T>(out, j) + acc : acc);
    }
  });
  count_kernel(x.numel(), x.nbytes(), out.nbytes());
}

void HostDevice::softmax_xent(const Tensor& dlogits, const Tensor& row_loss, const Tensor& logits,
                              const Tensor& labels) {
  for (const Tensor* t : {&dlogits, &row_loss, &logits, &labels}) on("softmax_xent", *t, placement_);
  same_numel("softmax_xent", dlogits, logits);
  if (logits.ndim() != 2 || labels.numel() != logits.dim(0) || row_loss.numel() != logits.dim(0)) {
    throw UsageError(fmt::format("softmax_xent: logits {} need labels and row_loss of [{}]",
                                 shape_str(logits.shape()), logits.ndim() == 2 ? logits.dim(0) : -1));
  }
  const std::int64_t rows = logits.dim(0), cols = logits.dim(1);
  with_compute({&dlogits, &row_loss, &logits}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto label = static_cast<std::int64_t>(load_as_f32(labels.raw(), labels.dtype(), r));
      if (label < 0 || label >= cols) {
        throw UsageError(
            fmt::format("softmax_xent: label {} of row {} outside [0, {})", label, r, cols));
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (std::int64_t c = 0; c < cols; ++c) mx = std::max(mx, ld<T>(logits, r * cols + c));
      T denom = 0;
      for (std::int64_t c = 0; c < cols; ++c)
        denom = denom + std::exp(ld<T>(logits, r * cols + c) - mx);
      const T log_denom = std::log(denom);
      for (std::int64_t c = 0; c < cols; ++c) {
        const T p = std::exp(ld<T>(logits, r * cols + c) - mx) / denom;
        st<T>(dlogits, r * cols + c, c == label ? p - T(1) : p);
      }
      st<T>(row_loss, r, log_denom - (ld<T>(logits, r * cols + label) - mx));
    }
  });
  count_kernel(5 * logits.numel(), logits.nbytes() + labels.nbytes(), dlogits.nbytes());
}

namespace {

// [B,C] with labels and a per-row vector of [B]; the labels in [0, C), read as f32 (softmax_xent).
std::vector<std::int64_t> label_rows(const char* op, const Tensor& x, const Tensor& labels,
                                     const Tensor* per_row) {
  if (x.ndim() != 2 || labels.numel() != x.dim(0) || (per_row != nullptr && per_row->numel() != x.dim(0))) {
    throw UsageError(fmt::format("{}: {} needs labels{} of [{}]", op, shape_str(x.shape()),
                                 per_row != nullptr ? " and row_loss" : "", x.ndim() == 2 ? x.dim(0) : -1));
  }
  std::vector<std::int64_t> out(static_cast<std::size_t>(x.dim(0)));
  for (std::int64_t r = 0; r < x.dim(0); ++r) {
    const auto label = static_cast<std::int64_t>(load_as_f32(labels.raw(), labels.dtype(), r));
    if (label < 0 || label >= x.dim(1)) {
      throw UsageError(fmt::format("{}: label {} of row {} outside [0, {})", op, label, r, x.dim(1)));
    }
    out[static_cast<std::size_t>(r)] = label;
  }
  return out;
}

}  // namespace

void HostDevice::log_softmax_nll(const Tensor& logp, const Tensor& loss, const Tensor& logits,
                                 const Tensor& labels) {
  for (const Tensor* t : {&logp, &loss, &logits, &labels}) on("log_softmax_nll", *t, placement_);
  same_numel("log_softmax_nll", logp, logits);
  if (loss.numel() != 1) {
    throw UsageError(fmt::format("log_softmax_nll: the loss is one element, not {}", loss.numel()));
  }
  const std::vector<std::int64_t> label = label_rows("log_softmax_nll", logits, labels, nullptr);
  const std::int64_t rows = logits.dim(0), cols = logits.dim(1);
  with_compute({&logp, &loss, &logits}, [&]<class T>(T) {
    T sum = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      T mx = -std::numeric_limits<T>::infinity();
      for (std::int64_t c = 0; c < cols; ++c) mx = std::max(mx, ld<T>(logits, r * cols + c));
      T denom = 0;
      for (std::int64_t c = 0; c < cols; ++c) denom = denom + std::exp(ld<T>(logits, r * cols + c) - mx);
      const T log_denom = std::log(denom);
      for (std::int64_t c = 0; c < cols; ++c) st<T>(logp, r * cols + c, (ld<T>(logits, r * cols + c) - mx) - log_denom);
      sum = sum - ld<T>(logp, r * cols + label[static_cast<std::size_t>(r)]);
    }
    st<T>(loss, 0, sum / static_cast<T>(rows));
  });
  count_kernel(4 * logits.numel() + rows + 1, logits.nbytes() + labels.nbytes(),
               logp.nbytes() + loss.nbytes());
}

void HostDevice::nll_loss_backward(const Tensor& grad, const Tensor& labels, double value) {
  for (const Tensor* t : {&grad, &labels}) on("nll_loss_backward", *t, placement_);
  const std::vector<std::int64_t> label = label_rows("nll_loss_backward", grad, labels, nullptr);
  const std::int64_t rows = grad.dim(0), cols = grad.dim(1);
  with_compute({&grad}, [&]<class T>(T) {
    const auto v = static_cast<T>(value);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) st<T>(grad, r * cols + c, c == label[static_cast<std::size_t>(r)] ? v : T(0));
    }
  });
  count_kernel(grad.numel(), labels.nbytes(), grad.nbytes());
}

void HostDevice::log_softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& logp) {
  for (const Tensor* t : {&dx, &dout, &logp}) on("log_softmax_backward", *t, placement_);
  same_numel("log_softmax_backward", dx, logp);
  same_numel("log_softmax_backward", dout, logp);
  const std::int64_t rows = device_check::rows("log_softmax_backward", logp), cols = logp.dim(1);
  with_compute({&dx, &dout, &logp}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      T s = 0;
      for (std::int64_t c = 0; c < cols; ++c) s = s + ld<T>(dout, r * cols + c);
      for (std::int64_t c = 0; c < cols; ++c) {
        st<T>(dx, r * cols + c, ld<T>(dout, r * cols + c) - std::exp(ld<T>(logp, r * cols + c)) * s);
      }
    }
  });
  count_kernel(4 * logp.numel(), logp.nbytes() + dout.nbytes(), dx.nbytes());
}

std::vector<std::int64_t> HostDevice::argmax_rows(const Tensor& x) {
  on("argmax_rows", x, placement_);
  const std::int64_t rows = device_check::rows("argmax_rows", x), cols = x.dim(1);
  std::vector<std::int64_t> out(static_cast<std::size_t>(rows), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double best = load_as_f64(x.raw(), x.dtype(), r * cols);
    for (std::int64_t c = 1; c < cols; ++c) {
      const double v = load_as_f64(x.raw(), x.dtype(), r * cols + c);
      if (v > best) {
        best = v;
        out[static_cast<std::size_t>(r)] = c;
      }
    }
  }
  count_kernel(x.numel(), x.nbytes(), 0);
  return out;
}

void HostDevice::scale_rows(const Tensor& out, const Tensor& x, const Tensor& s) {
  for (const Tensor* t : {&out, &x, &s}) on("scale_rows", *t, placement_);
  same_numel("scale_rows", out, x);
  const std::int64_t rows = device_check::rows("scale_rows", x), cols = x.dim(1);
  if (s.numel() != rows) throw UsageError(fmt::format("scale_rows: {} scales for {} rows", s.numel(), rows));
  with_compute({&out, &x, &s}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < x.numel(); ++i) st<T>(out, i, ld<T>(s, i / cols) * ld<T>(x, i));
  });
  count_kernel(x.numel(), x.nbytes() + s.nbytes(), out.nbytes());
}

void HostDevice::row_dot(const Tensor& out, const Tensor& a, const Tensor& c) {
  for (const Tensor* t : {&out, &a, &c}) on("row_dot", *t, placement_);
  same_numel("row_dot", a, c);
  const std::int64_t rows = device_check::rows("row_dot", a), cols = a.dim(1);
  if (out.numel() != rows) throw UsageError(fmt::format("row_dot: output of {} for {} rows", out.numel(), rows));
  with_compute({&out, &a, &c}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      T acc = 0;
      for (std::int64_t j = 0; j < cols; ++j) acc = acc + ld<T>(a, r * cols + j) * ld<T>(c, r * cols + j);
      st<T>(out, r, acc);
    }
  });
  count_kernel(2 * a.numel(), a.nbytes() + c.nbytes(), out.nbytes());
}

namespace {
std::int64_t token_id(const char* op, const Tensor& ids, std::int64_t n, std::int64_t vocab) {
  const auto id = static_cast<std::int64_t>(load_as_f64(ids.raw(), ids.dtype(), n));
  if (id < 0 || id >= vocab)
    throw UsageError(fmt::format("{}: id {} of row {} outside [0, {})", op, id, n, vocab));
  return id;
}
}  // namespace

void HostDevice::embedding(const Tensor& out, const Tensor& table, const Tensor& ids) {
  for (const Tensor* t : {&out, &table, &ids}) on("embedding", *t, placement_);
  const std::int64_t vocab = device_check::rows("embedding", table), dim = table.dim(1), n = ids.numel();
  if (out.numel() != n * dim)
    throw UsageError(fmt::format("embedding: out {} for {} ids of dim {}", out.describe(), n, dim));
  with_compute({&out, &table}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t id = token_id("embedding", ids, i, vocab);
      for (std::int64_t j = 0; j < dim; ++j) st<T>(out, i * dim + j, ld<T>(table, id * dim + j));
    }
  });
  count_kernel(0, out.nbytes() + ids.nbytes(), out.nbytes());
}

void HostDevice::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  for (const Tensor* t : {&dtable, &dout, &ids}) on("embedding_backward", *t, placement_);
  const std::int64_t vocab = device_check::rows("embedding_backward", dtable), dim = dtable.dim(1),
                     n = ids.numel();
  if (dout.numel() != n * dim)
    throw UsageError(
        fmt::format("embedding_backward: dout {} for {} ids of dim {}", dout.describe(), n, dim));
  with_compute({&dtable, &dout}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dtable.numel(); ++i) st<T>(dtable, i, T(0));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t id = token_id("embedding_backward", ids, i, vocab);
      for (std::int64_t j = 0; j < dim; ++j) {
        st<T>(dtable, id * dim + j, ld<T>(dtable, id * dim + j) + ld<T>(dout, i * dim + j));
      }
    }
  });
  count_kernel(dout.numel(), dout.nbytes() + ids.nbytes(), dtable.nbytes());
}

void HostDevice::rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                         double eps) {
  for (const Tensor* t : {&out, &rstd, &x, &w}) on("rmsnorm", *t, placement_);
  same_numel("rmsnorm", out, x);
  const std::int64_t rows = device_check::rows("rmsnorm", x), dim = row_len("rmsnorm", x, w);
  if (rstd.numel() != rows)
    throw UsageError(fmt::format("rmsnorm: rstd {} for {} rows", rstd.describe(), rows));
  with_compute({&out, &rstd, &x, &w}, [&]<class T>(T) {
    const auto e = static_cast<T>(eps);
    for (std::int64_t r = 0; r < rows; ++r) {
      T ss = 0;
      for (std::int64_t j = 0; j < dim; ++j)
        ss = ss + ld<T>(x, r * dim + j) * ld<T>(x, r * dim + j);
      const T inv = T(1) / std::sqrt(ss / static_cast<T>(dim) + e);
      st<T>(rstd, r, inv);
      for (std::int64_t j = 0; j < dim; ++j)
        st<T>(out, r * dim + j, (ld<T>(x, r * dim + j) * inv) * ld<T>(w, j));
    }
  });
  count_kernel(4 * x.numel(), x.nbytes() + w.nbytes(), out.nbytes() + rstd.nbytes());
}

void HostDevice::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                  const Tensor& x, const Tensor& w, const Tensor& rstd) {
  for (const Tensor* t : {&dx, &dw, &dout, &x, &w, &rstd})
    on("rmsnorm_backward", *t, placement_);
  same_numel("rmsnorm_backward", dx, x);
  same_numel("rmsnorm_backward", dout, x);
  same_numel("rmsnorm_backward", dw, w);
  const std::int64_t rows = device_check::rows("rmsnorm_backward", x), dim = row_len("rmsnorm_backward", x, w);
  with_compute({&dx, &dw, &dout, &x, &w, &rstd}, [&]<class T>(T) {
    for (std::int64_t j = 0; j < dim; ++j) {
      T acc = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        acc = acc + ld<T>(dout, r * dim + j) * ld<T>(x, r * dim + j) * ld<T>(rstd, r);
      st<T>(dw, j, acc);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const T inv = ld<T>(rstd, r);
      T c = 0;
      for (std::int64_t j = 0; j < dim; ++j)
        c = c + ld<T>(dout, r * dim + j) * ld<T>(w, j) * ld<T>(x, r * dim + j);
      const T k = inv * inv * c / static_cast<T>(dim);
      for (std::int64_t j = 0; j < dim; ++j) {
        st<T>(dx, r * dim + j,
              inv * (ld<T>(w, j) * ld<T>(dout, r * dim + j) - ld<T>(x, r * dim + j) * k));
      }
    }
  });
  count_kernel(8 * x.numel(), 2 * x.nbytes() + w.nbytes() + rstd.nbytes(),
        dx.nbytes() + dw.nbytes());
}

void HostDevice::causal_softmax(const Tensor& out, const Tensor& x) {
  for (const Tensor* t : {&out, &x}) on("causal_softmax", *t, placement_);
  same_numel("causal_softmax", out, x);
  const std::int64_t rows = device_check::rows("causal_softmax", x), cols = x.dim(1);
  with_compute({&out, &x}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t seen = r % cols + 1;  // keys 0..i
      T mx = -std::numeric_limits<T>::infinity();
      for (std::int64_t j = 0; j < seen; ++j) mx = std::max(mx, ld<T>(x, r * cols + j));
      T denom = 0;
      for (std::int64_t j = 0; j < seen; ++j) denom = denom + std::exp(ld<T>(x, r * cols + j) - mx);
      for (std::int64_t j = 0; j < cols; ++j) {
        st<T>(out, r * cols + j, j < seen ? std::exp(ld<T>(x, r * cols + j) - mx) / denom : T(0));
      }
    }
  });
  count_kernel(4 * x.numel(), x.nbytes(), out.nbytes());
}

void HostDevice::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& p) {
  for (const Tensor* t : {&dx, &dout, &p}) on("softmax_backward", *t, placement_);
  same_numel("softmax_backward", dx, p);
  same_numel("softmax_backward", dout, p);
  const std::int64_t rows = device_check::rows("softmax_backward", p), cols = p.dim(1);
  with_compute({&dx, &dout, &p}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      T s = 0;
      for (std::int64_t j = 0; j < cols; ++j)
        s = s + ld<T>(p, r * cols + j) * ld<T>(dout, r * cols + j);
      for (std::int64_t j = 0; j < cols; ++j) {
        st<T>(dx, r * cols + j, ld<T>(p, r * cols + j) * (ld<T>(dout, r * cols + j) - s));
      }
    }
  });
  count_kernel(4 * p.numel(), p.nbytes() + dout.nbytes(), dx.nbytes());
}

void HostDevice::permute_0213(const Tensor& out, const Tensor& x, std::int64_t a, std::int64_t b,
                              std::int64_t c, std::int64_t d) {
  for (const Tensor* t : {&out, &x}) on("permute_0213", *t, placement_);
  same_numel("permute_0213", out, x);
  if (a * b * c * d != x.numel()) {
    throw UsageError(
        fmt::format("permute_0213: [{},{},{},{}] does not cover {}", a, b, c, d, x.describe()));
  }
  same_dtype("permute_0213", out, x);
  const std::int64_t esize = dtype_size(x.dtype());
  const auto* src = static_cast<const std::byte*>(x.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  for (std::int64_t ia = 0; ia < a; ++ia) {
    for (std::int64_t ib = 0; ib < b; ++ib) {
      for (std::int64_t ic = 0; ic < c; ++ic) {
        const std::int64_t from = ((ia * b + ib) * c + ic) * d, to = ((ia * c + ic) * b + ib) * d;
        std::memcpy(dst + to * esize, src + from * esize, static_cast<std::size_t>(d * esize));
      }
    }
  }
  count_kernel(0, x.nbytes(), out.nbytes());
}

}  // namespace zc
