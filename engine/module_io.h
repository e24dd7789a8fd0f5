// Serialize + deserialize of module trees (SPEC 7, invariant I4): JSON with each module's kind and
// constructor arguments, its params (names, shapes, dtypes, ds_status, tensor bytes when present)
// and its children. A ModuleRegistry maps kinds to factories, so deserialize rebuilds the right
// subclasses; each rebuilt ParamDict belongs to its new module. Tensor values travel as their
// raw bytes, so a round trip is bit-exact, NaN payloads included.
#pragma once

#include "engine/module.h"

#include <nlohmann/json.hpp>

#include <map>

namespace zc {

class Comm;

// What a factory may need besides the JSON: MoE models are built over an expert-parallel group.
struct ModuleEnv {
  Comm* expert_parallel = nullptr;
};

class ModuleRegistry {
 public:
  // Builds a module of one kind, with its constructor's children, from kind_args().
  using Factory = std::function<std::unique_ptr<Module>(const std::string& name,
                                                        const nlohmann::json& args,
                                                        const ModuleEnv& env)>;
  ModuleRegistry();  // knows "module", the plain Module
  void add(std::string kind, Factory make);
  bool knows(const std::string& kind) const { return factories_.count(kind) != 0; }
  // Throws UsageError naming an unknown kind.
  std::unique_ptr<Module> make(const std::string& kind, const std::string& name,
                               const nlohmann::json& args, const ModuleEnv& env) const;

 private:
  std::map<std::string, Factory> factories_;
};

// The tree under `m` (m becomes the root of the JSON); tensors are read through `dev`.
nlohmann::json serialize_module(const Module& m, Device& dev);
// A new tree from serialize_module's JSON: each module built by its kind's factory, then its
// params' state restored (tensors allocated on `dev`, meta tensors stay meta) and any child the
// factory did not build added. Throws UsageError on a kind, shape or param the JSON disagrees on.
std::unique_ptr<Module> deserialize_module(const nlohmann::json& j, const ModuleRegistry& kinds,
                                           Device& dev, const ModuleEnv& env = {});

}  // namespace zc
