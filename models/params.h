// Reading a module's own params by local name, for the models' explicit forward and backward
// (through ParamDict::get, so ZeRO-3's getter semantics apply), and allocating their buffers in
// the memory category they belong to (engine/memory.h).
#pragma once

#include "engine/errors.h"
#include "engine/module.h"

namespace zc::model_params {

// The param's data; an internal error when the param is missing or has none (not gathered).
inline Tensor& data_of(Module& m, const char* local) {
  Parameter* p = m.params().get(local);
  ZC_ASSERT(p != nullptr && p->data.defined(), "{}: param '{}' missing or without data", m.path(),
            local);
  return p->data;
}
inline Parameter& param_of(Module& m, const char* local) {
  Parameter* p = m.params().get(local);
  ZC_ASSERT(p != nullptr, "{}: no param '{}'", m.path(), local);
  return *p;
}
// What forward keeps for backward, and backward's activation grads.
inline Tensor act(Device& dev, DType dt, Shape shape, const char* label) {
  return dev.alloc(dt, std::move(shape), label, MemCategory::activations);
}
// A param's grad as autograd computes it for AccumulateGrad: grads from its allocation, whether
// it then becomes the param's .grad or is added into one (the param's tensor hook sees it on
// DeepSpeed's side, Note [DeepSpeed's memory, measured]).
inline Tensor grad_buf(Device& dev, DType dt, Shape shape, const char* label) {
  return dev.alloc(dt, std::move(shape), label, MemCategory::grads);
}
// Short-lived buffers: row losses, a product before its sum.
inline Tensor tmp(Device& dev, DType dt, Shape shape, const char* label) {
  return dev.alloc(dt, std::move(shape), label, MemCategory::temporaries);
}

}  // namespace zc::model_params
