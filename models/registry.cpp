// Factories for every Module subclass of models/, from its kind_args().
#include "models/registry.h"

#include "engine/errors.h"
#include "models/contrastive.h"
#include "models/moe.h"
#include "models/synthetic.h"
#include "models/tree.h"

namespace zc {

namespace {

LossKind loss_of(const nlohmann::json& args) {
  return args.at("loss").get<std::string>() == "linear" ? LossKind::linear
                                                        : LossKind::cross_entropy;
}

}  // namespace

ModuleRegistry model_registry() {
  using nlohmann::json;
  ModuleRegistry r;
  r.add("linear", [](const std::string& name, const json& a, const ModuleEnv&) {
    return std::make_unique<Linear>(name, a.at("in").get<std::int64_t>(),
                                    a.at("out").get<std::int64_t>());
  });
  r.add("mlp", [](const std::string& name, const json& a, const ModuleEnv&) {
    MlpSpec spec{a.at("dims").get<std::vector<std::int64_t>>(), a.at("relu").get<bool>(),
                 loss_of(a)};
    return std::make_unique<Mlp>(std::move(spec), name);
  });
  r.add("synthetic", [](const std::string& name, const json& a, const ModuleEnv&) {
    return std::make_unique<Synthetic>(a.at("shapes").get<std::vector<Shape>>(), name);
  });
  r.add("contrastive", [](const std::string& name, const json& a, const ModuleEnv&) {
    return std::make_unique<Contrastive>(a.at("in").get<std::int64_t>(),
                                         a.at("dim").get<std::int64_t>(), loss_of(a), name);
  });
  r.add("simple_moe", [](const std::string& name, const json& a, const ModuleEnv& env) {
    if (env.expert_parallel == nullptr) {
      throw UsageError(fmt::format("deserialize: simple_moe '{}' needs ModuleEnv::expert_parallel, "
                                   "the expert-parallel group its experts are spread over", name));
    }
    MoeSpec spec{a.at("dim").get<std::int64_t>(), a.at("num_experts").get<int>()};
    return std::make_unique<SimpleMoE>(spec, *env.expert_parallel, name);
  });
  r.add("tree", [](const std::string& name, const json& a, const ModuleEnv&) {
    return std::make_unique<TreeModel>(a.at("code").get<std::vector<std::int64_t>>(), name);
  });
  r.add("tree_node", [](const std::string& name, const json&, const ModuleEnv&) {
    return std::make_unique<TreeNode>(name);
  });
  return r;
}

}  // namespace zc
