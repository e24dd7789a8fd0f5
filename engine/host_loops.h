// The element loops' plumbing shared by HostDevice's kernel files: loads and stores in the compute
// type (f32, or f64 when any operand is f64; 16-bit values widened exactly and rounded once on
// store), as engine/device.h specifies every op.
#pragma once

#include "engine/tensor.h"

#include <initializer_list>
#include <type_traits>

namespace zc::host_loops {

inline bool any_f64(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->dtype() == DType::f64) return true;
  }
  return false;
}

template <class T>
inline T ld(const Tensor& t, std::int64_t i) {
  if constexpr (std::is_same_v<T, double>) {
    return load_as_f64(t.raw(), t.dtype(), i);
  } else {
    return load_as_f32(t.raw(), t.dtype(), i);
  }
}

template <class T>
inline void st(const Tensor& t, std::int64_t i, T v) {
  if constexpr (std::is_same_v<T, double>) {
    store_from_f64(t.raw(), t.dtype(), i, v);
  } else {
    store_from_f32(t.raw(), t.dtype(), i, v);
  }
}

// Runs fn with a value of the compute type: double if any operand is f64, else float.
template <class Fn>
inline void with_compute(std::initializer_list<const Tensor*> ts, Fn&& fn) {
  if (any_f64(ts)) {
    fn(0.0);
  } else {
    fn(0.0f);
  }
}

}  // namespace zc::host_loops
