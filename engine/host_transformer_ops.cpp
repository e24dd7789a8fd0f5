// HostDevice's transformer ops II (engine/device.h): LayerNorm, GELU (tanh form), SwiGLU and rotary
// positions, with their backwards. Plain loops in the order device.h states; the transcendental
// functions are glibc's in f64, rounded once to the compute type (Note [Transcendentals]).
#include "engine/errors.h"
#include "engine/host_device.h"
#include "engine/host_loops.h"

#include <cmath>

namespace zc {

using namespace host_loops;
using namespace device_check;

namespace {

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi) rounded to f64 (device.h)

template <class T>
T f64_tanh(T x) {
  return static_cast<T>(std::tanh(static_cast<double>(x)));
}
template <class T>
T f64_exp(T x) {
  return static_cast<T>(std::exp(static_cast<double>(x)));
}

void same_shape3(const char* op, const Tensor& a, const Tensor& b, const Tensor& c) {
  same_numel(op, a, b);
  same_numel(op, a, c);
}

// [R, heads * dh] with an even dh: the head width.
std::int64_t rope_head_dim(const char* op, const Tensor& x, std::int64_t seq, std::int64_t heads) {
  if (x.ndim() != 2 || heads < 1 || seq < 1 || x.dim(1) % heads != 0 ||
      (x.dim(1) / heads) % 2 != 0) {
    throw UsageError(fmt::format("{}: {} must be [R, heads * dh] with {} heads of an even dh and "
                                 "seq {} >= 1", op, x.describe(), heads, seq));
  }
  return x.dim(1) / heads;
}

}  // namespace

void HostDevice::layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                           const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  for (const Tensor* t : {&out, &mean, &rstd, &x, &w, &b}) on("layernorm", *t, placement_);
  same_numel("layernorm", out, x);
  const std::int64_t rows = device_check::rows("layernorm", x), dim = row_len("layernorm", x, w);
  row_len("layernorm", x, b);
  if (mean.numel() != rows || rstd.numel() != rows) {
    throw UsageError(fmt::format("layernorm: mean {} and rstd {} must have {} rows",
                                 mean.describe(), rstd.describe(), rows));
  }
  with_compute({&out, &mean, &rstd, &x, &w, &b}, [&]<class T>(T) {
    const auto e = static_cast<T>(eps);
    for (std::int64_t r = 0; r < rows; ++r) {
      T sum = 0;
      for (std::int64_t j = 0; j < dim; ++j) sum = sum + ld<T>(x, r * dim + j);
      const T mu = sum / static_cast<T>(dim);
      T ss = 0;
      for (std::int64_t j = 0; j < dim; ++j) {
        const T c = ld<T>(x, r * dim + j) - mu;
        ss = ss + c * c;
      }
      const T inv = T(1) / std::sqrt(ss / static_cast<T>(dim) + e);
      st<T>(mean, r, mu);
      st<T>(rstd, r, inv);
      for (std::int64_t j = 0; j < dim; ++j) {
        st<T>(out, r * dim + j, ((ld<T>(x, r * dim + j) - mu) * inv) * ld<T>(w, j) + ld<T>(b, j));
      }
    }
  });
  count_kernel(8 * x.numel(), x.nbytes() + w.nbytes() + b.nbytes(),
               out.nbytes() + mean.nbytes() + rstd.nbytes());
}

void HostDevice::layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                    const Tensor& dout, const Tensor& x, const Tensor& w,
                                    const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&dx, &dw, &db, &dout, &x, &w, &mean, &rstd})
    on("layernorm_backward", *t, placement_);
  same_shape3("layernorm_backward", dx, x, dout);
  same_numel("layernorm_backward", dw, w);
  same_numel("layernorm_backward", db, w);
  const std::int64_t rows = device_check::rows("layernorm_backward", x);
  const std::int64_t dim = row_len("layernorm_backward", x, w);
  if (mean.numel() != rows || rstd.numel() != rows) {
    throw UsageError("layernorm_backward: mean and rstd must have one value per row");
  }
  with_compute({&dx, &dw, &db, &dout, &x, &w, &mean, &rstd}, [&]<class T>(T) {
    auto xhat = [&](std::int64_t r, std::int64_t j) {
      return (ld<T>(x, r * dim + j) - ld<T>(mean, r)) * ld<T>(rstd, r);
    };
    for (std::int64_t j = 0; j < dim; ++j) {
      T aw = 0, ab = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        aw = aw + ld<T>(dout, r * dim + j) * xhat(r, j);
        ab = ab + ld<T>(dout, r * dim + j);
      }
      st<T>(dw, j, aw);
      st<T>(db, j, ab);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      T c1 = 0, c2 = 0;
      for (std::int64_t j = 0; j < dim; ++j) {
        const T g = ld<T>(dout, r * dim + j) * ld<T>(w, j);
        c1 = c1 + g;
        c2 = c2 + g * xhat(r, j);
      }
      const T m1 = c1 / static_cast<T>(dim), m2 = c2 / static_cast<T>(dim), inv = ld<T>(rstd, r);
      for (std::int64_t j = 0; j < dim; ++j) {
        const T g = ld<T>(dout, r * dim + j) * ld<T>(w, j);
        st<T>(dx, r * dim + j, inv * ((g - m1) - xhat(r, j) * m2));
      }
    }
  });
  count_kernel(12 * x.numel(), 2 * x.nbytes() + w.nbytes() + mean.nbytes() + rstd.nbytes(),
               dx.nbytes() + dw.nbytes() + db.nbytes());
}

void HostDevice::gelu(const Tensor& out, const Tensor& x) {
  for (const Tensor* t : {&out, &x}) on("gelu", *t, placement_);
  same_numel("gelu", out, x);
  with_compute({&out, &x}, [&]<class T>(T) {
    const auto c = static_cast<T>(kGeluC);
    const auto a = static_cast<T>(0.044715);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = ld<T>(x, i);
      const T t = f64_tanh(c * (v + a * ((v * v) * v)));
      st<T>(out, i, (T(0.5) * v) * (T(1) + t));
    }
  });
  count_kernel(10 * x.numel(), x.nbytes(), out.nbytes());
}

void HostDevice::gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  for (const Tensor* t : {&dx, &dout, &x}) on("gelu_backward", *t, placement_);
  same_shape3("gelu_backward", dx, dout, x);
  with_compute({&dx, &dout, &x}, [&]<class T>(T) {
    const auto c = static_cast<T>(kGeluC);
    const auto a = static_cast<T>(0.044715);
    const T a3 = T(3) * a;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = ld<T>(x, i);
      const T t = f64_tanh(c * (v + a * ((v * v) * v)));
      const T d = T(0.5) * (T(1) + t) + ((T(0.5) * v) * (T(1) - t * t)) * (c * (T(1) + a3 * (v * v)));
      st<T>(dx, i, ld<T>(dout, i) * d);
    }
  });
  count_kernel(16 * x.numel(), x.nbytes() + dout.nbytes(), dx.nbytes());
}

void HostDevice::swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  for (const Tensor* t : {&out, &gate, &up}) on("swiglu", *t, placement_);
  same_shape3("swiglu", out, gate, up);
  with_compute({&out, &gate, &up}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      const T g = ld<T>(gate, i);
      const T s = T(1) / (T(1) + f64_exp(-g));
      st<T>(out, i, (g * s) * ld<T>(up, i));
    }
  });
  count_kernel(6 * out.numel(), gate.nbytes() + up.nbytes(), out.nbytes());
}

void HostDevice::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                 const Tensor& gate, const Tensor& up) {
  for (const Tensor* t : {&dgate, &dup, &dout, &gate, &up}) on("swiglu_backward", *t, placement_);
  same_shape3("swiglu_backward", dgate, dup, dout);
  same_shape3("swiglu_backward", dgate, gate, up);
  with_compute({&dgate, &dup, &dout, &gate, &up}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dout.numel(); ++i) {
      const T g = ld<T>(gate, i), u = ld<T>(up, i), d = ld<T>(dout, i);
      const T s = T(1) / (T(1) + f64_exp(-g));
      st<T>(dup, i, d * (g * s));
      st<T>(dgate, i, (d * u) * (s * (T(1) + g * (T(1) - s))));
    }
  });
  count_kernel(10 * dout.numel(), dout.nbytes() + gate.nbytes() + up.nbytes(),
               dgate.nbytes() + dup.nbytes());
}

void HostDevice::unary(const Tensor& out, const Tensor& x, Unary f) {
  const char* op = unary_name(f);
  for (const Tensor* t : {&out, &x}) on(op, *t, placement_);
  same_numel(op, out, x);
  with_compute({&out, &x}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const T v = ld<T>(x, i);
      T y{};
      switch (f) {
        case Unary::tanh: y = f64_tanh(v); break;
        case Unary::silu: y = v / (T(1) + f64_exp(-v)); break;
        case Unary::cube: y = (v * v) * v; break;
      }
      st<T>(out, i, y);
    }
  });
  count_kernel(unary_flops(f, false) * x.numel(), x.nbytes(), out.nbytes());
}

void HostDevice::unary_backward(const Tensor& dx, const Tensor& dout, const Tensor& saved,
                                Unary f) {
  const char* op = unary_name(f);
  for (const Tensor* t : {&dx, &dout, &saved}) on(op, *t, placement_);
  same_shape3(op, dx, dout, saved);
  with_compute({&dx, &dout, &saved}, [&]<class T>(T) {
    for (std::int64_t i = 0; i < dx.numel(); ++i) {
      const T v = ld<T>(saved, i);
      T d{};
      switch (f) {
        case Unary::tanh: d = T(1) - v * v; break;
        case Unary::silu: {
          const T s = T(1) / (T(1) + f64_exp(-v));
          d = s * (T(1) + v * (T(1) - s));
          break;
        }
        case Unary::cube: d = T(3) * (v * v); break;
      }
      st<T>(dx, i, ld<T>(dout, i) * d);
    }
  });
  count_kernel(unary_flops(f, true) * dx.numel(), dout.nbytes() + saved.nbytes(), dx.nbytes());
}

void HostDevice::rope(const Tensor& out, const Tensor& x, std::int64_t seq, std::int64_t heads,
                      double base, bool inverse) {
  for (const Tensor* t : {&out, &x}) on("rope", *t, placement_);
  same_numel("rope", out, x);
  const std::int64_t dh = rope_head_dim("rope", x, seq, heads), half = dh / 2;
  const std::int64_t rows = x.dim(0), width = x.dim(1);
  with_compute({&out, &x}, [&]<class T>(T) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto pos = static_cast<double>(r % seq);
      for (std::int64_t i = 0; i < half; ++i) {
        const double angle =
            pos * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
        const auto cs = static_cast<T>(std::cos(angle));
        const auto sn = static_cast<T>(inverse ? -std::sin(angle) : std::sin(angle));
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t lo = r * width + h * dh + i, hi = lo + half;
          const T x1 = ld<T>(x, lo), x2 = ld<T>(x, hi);
          st<T>(out, lo, x1 * cs - x2 * sn);
          st<T>(out, hi, x2 * cs + x1 * sn);
        }
      }
    }
  });
  count_kernel(6 * x.numel(), x.nbytes(), out.nbytes());
}

}  // namespace zc
