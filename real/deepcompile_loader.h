// RuntimeLoaders: the dlopen plugin loader, and one that refuses (an accelerator that cannot
// build the extension).
#pragma once

#include "engine/deepcompile.h"

#include <functional>
#include <memory>

namespace zc::real {

class PluginLoader final : public RuntimeLoader {
 public:
  explicit PluginLoader(std::string path = ZC_DEEPCOMPILE_PLUGIN);
  ~PluginLoader() override;
  DeepCompileRuntime& get_handle() override;
  bool loaded() const override { return runtime_ != nullptr; }

 private:
  std::string path_;
  void* lib_ = nullptr;
  std::unique_ptr<DeepCompileRuntime> runtime_;
};

class RefusingLoader final : public RuntimeLoader {
 public:
  DeepCompileRuntime& get_handle() override;
  bool loaded() const override { return false; }
};

// The factory every real run uses (the CLI's verify, the tests): a fresh PluginLoader of the
// built plugin, so that each engine loads the runtime on its own first get_handle().
inline std::function<std::unique_ptr<RuntimeLoader>()> plugin_loaders() {
  return [] { return std::make_unique<PluginLoader>(); };
}

}  // namespace zc::real
