// RuntimeLoaders: the dlopen plugin loader, and one that refuses (an accelerator that cannot
// build the extension).
#pragma once

#include "engine/deepcompile.h"

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

}  // namespace zc::real
