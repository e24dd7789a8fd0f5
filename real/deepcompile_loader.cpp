// Loading the DeepCompile runtime plugin with dlopen.
#include "real/deepcompile_loader.h"

#include "engine/errors.h"

#include <dlfcn.h>

namespace zc::real {

PluginLoader::PluginLoader(std::string path) : path_(std::move(path)) {}

PluginLoader::~PluginLoader() {
  runtime_.reset();
  if (lib_ != nullptr) dlclose(lib_);
}

DeepCompileRuntime& PluginLoader::get_handle() {
  if (runtime_) return *runtime_;
  lib_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    throw NotImplementedError(fmt::format("cannot load the DeepCompile runtime from {}: {}", path_, dlerror()));
  }
  using Create = DeepCompileRuntime* (*)();
  auto create = reinterpret_cast<Create>(dlsym(lib_, "zc_deepcompile_create"));
  if (create == nullptr) throw NotImplementedError(fmt::format("{} has no zc_deepcompile_create", path_));
  runtime_.reset(create());
  return *runtime_;
}

DeepCompileRuntime& RefusingLoader::get_handle() {
  throw NotImplementedError("the DeepCompile runtime cannot be built on this accelerator: use "
                            "deepcompile=false, or the autosp/autotp passes, which do not need it");
}

}  // namespace zc::real
