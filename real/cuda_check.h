// CUDA_CHECK / NCCL_CHECK: every CUDA and NCCL call of the GPU backend goes through one of these;
// a failure is a BackendError naming the call, the file:line and CUDA's or NCCL's error string.
// CUDA_CHECK_LAUNCH() follows every kernel launch (cudaGetLastError).
#pragma once

#include "engine/errors.h"

#include <cuda_runtime_api.h>

namespace zc::real {

[[noreturn]] inline void throw_cuda_error(const char* call, const char* file, int line,
                                          cudaError_t rc) {
  (void)cudaGetLastError();  // a non-sticky error stays as the last error: the next launch must not see it
  throw BackendError(fmt::format("{} failed at {}:{}: {} ({})", call, file, line,
                                 cudaGetErrorString(rc), cudaGetErrorName(rc)));
}

}  // namespace zc::real

#define CUDA_CHECK(call)                                                                \
  do {                                                                                  \
    const cudaError_t zc_cuda_rc_ = (call);                                             \
    if (zc_cuda_rc_ != cudaSuccess)                                                     \
      ::zc::real::throw_cuda_error(#call, __FILE__, __LINE__, zc_cuda_rc_);             \
  } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
