// The DeepCompile runtime as the engine sees it: a native component loaded lazily through a
// RuntimeLoader (a dlopen'ed plugin in real use; a loader can refuse, as an accelerator that
// cannot build the extension does). Only the ZeRO backends (z1/z2/z3) call get_handle() and
// init(); invariant I3 says nothing else may load it, and no call but loading precedes init().
#pragma once

#include "engine/comm.h"

#include <functional>
#include <string>
#include <vector>

namespace zc {

// What the runtime's executors run for the compiled engine: the engine's own ZeRO reduction.
struct DeepCompileExecutors {
  std::function<void()> reduce_gradients;
};

class DeepCompileRuntime {
 public:
  virtual ~DeepCompileRuntime() = default;
  virtual void init(Comm& group, const std::string& backend, std::int64_t bucket_size,
                    DeepCompileExecutors executors) = 0;
  virtual void start_backward(bool boundary) = 0;
  virtual void end_backward() = 0;
  virtual void cleanup() = 0;
  // Every call in order, "load" first: what the I3 checks read.
  virtual const std::vector<std::string>& calls() const = 0;
};

class RuntimeLoader {
 public:
  virtual ~RuntimeLoader() = default;
  // Loads on first use; throws NotImplementedError when this accelerator cannot build it.
  virtual DeepCompileRuntime& get_handle() = 0;
  virtual bool loaded() const = 0;
};

// The compile() request (DeepSpeed's compile config).
struct CompileConfig {
  bool deepcompile = true;
  std::vector<std::string> passes;  // subset of {z1, z3, autosp, autotp}
};

}  // namespace zc
