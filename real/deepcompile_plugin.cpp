// The DeepCompile runtime plugin (a shared library loaded with dlopen, as DeepSpeed's native
// extension is built and loaded on first use). It records every call for the I3 checks and runs
// the compiled engine's gradient reduction through the executors handed to init().
#include "engine/deepcompile.h"
#include "engine/errors.h"

#include <fmt/format.h>

namespace {

class Runtime final : public zc::DeepCompileRuntime {
 public:
  Runtime() { calls_.push_back("load"); }
  void init(zc::Comm& group, const std::string& backend, std::int64_t bucket_size,
            zc::DeepCompileExecutors executors) override {
    calls_.push_back(fmt::format("init({}, group {} of {}, bucket {})", backend, group.name(), group.size(), bucket_size));
    executors_ = std::move(executors);
  }
  void start_backward(bool boundary) override { calls_.push_back(fmt::format("start_backward({})", boundary)); }
  void end_backward() override {
    calls_.push_back("end_backward");
    if (executors_.reduce_gradients) executors_.reduce_gradients();
  }
  void cleanup() override { calls_.push_back("cleanup"); }
  const std::vector<std::string>& calls() const override { return calls_; }

 private:
  std::vector<std::string> calls_;
  zc::DeepCompileExecutors executors_;
};

}  // namespace

extern "C" zc::DeepCompileRuntime* zc_deepcompile_create() { return new Runtime(); }
