// The module kinds of models/, for deserialize_module (engine/module_io.h): every Module subclass
// here has a factory, keyed by its kind(). Not a global: callers build the registry they pass.
#pragma once

#include "engine/module_io.h"

namespace zc {

// "module", "linear", "mlp", "synthetic", "contrastive", "simple_moe" (needs
// ModuleEnv::expert_parallel), "tree" and "tree_node".
ModuleRegistry model_registry();

}  // namespace zc
