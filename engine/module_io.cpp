// Module trees to JSON and back (module_io.h). Tensor bytes are hex strings; a meta tensor keeps
// only its dtype and shape.
#include "engine/module_io.h"

#include "engine/errors.h"
#include "engine/model.h"

#include <algorithm>
#include <map>

namespace zc {

ModuleRegistry::ModuleRegistry() {
  add("module", [](const std::string& name, const nlohmann::json&, const ModuleEnv&) {
    return std::make_unique<Module>(name);
  });
}

void ModuleRegistry::add(std::string kind, Factory make) {
  factories_[std::move(kind)] = std::move(make);
}

std::unique_ptr<Module> ModuleRegistry::make(const std::string& kind, const std::string& name,
                                             const nlohmann::json& args,
                                             const ModuleEnv& env) const {
  auto it = factories_.find(kind);
  if (it == factories_.end()) {
    throw UsageError(fmt::format("deserialize: module '{}' has kind '{}', which the registry does "
                                 "not know: add its factory (models/registry.h)", name, kind));
  }
  std::unique_ptr<Module> m = it->second(name, args, env);
  ZC_ASSERT(m != nullptr && m->kind() == kind, "the factory of kind '{}' built kind '{}'", kind,
            m ? m->kind() : "nothing");
  return m;
}

namespace {

std::string to_hex(const std::vector<std::byte>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    const auto v = std::to_integer<unsigned>(b);
    s += kDigits[v >> 4];
    s += kDigits[v & 15u];
  }
  return s;
}

std::vector<std::byte> from_hex(const std::string& s, const std::string& what) {
  auto nibble = [&](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    throw UsageError(fmt::format("deserialize: {} has a non-hex byte string", what));
  };
  if (s.size() % 2 != 0) {
    throw UsageError(fmt::format("deserialize: {} has an odd-length byte string", what));
  }
  std::vector<std::byte> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>((nibble(s[2 * i]) << 4) | nibble(s[2 * i + 1]));
  }
  return out;
}

nlohmann::json tensor_json(Device& dev, const Tensor& t) {
  if (!t.defined()) return nullptr;
  nlohmann::json j = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}};
  if (t.is_meta()) {
    j["placement"] = "meta";
  } else {
    j["bytes"] = to_hex(to_bytes(dev, t));
  }
  return j;
}

Tensor tensor_from_json(Device& dev, const nlohmann::json& j, const std::string& label) {
  if (j.is_null()) return Tensor();
  const DType dtype = parse_dtype(j.at("dtype").get<std::string>());
  Shape shape = j.at("shape").get<Shape>();
  const std::int64_t numel = shape_numel(shape);
  if (j.value("placement", "") == "meta") {
    return Tensor(dtype, std::move(shape), Placement::meta, nullptr);
  }
  // The bytes bound the allocation, so they are checked first: a shape alone may ask for any size.
  const std::vector<std::byte> bytes = from_hex(j.at("bytes").get<std::string>(), label);
  const auto itemsize = static_cast<std::size_t>(dtype_size(dtype));
  if (bytes.size() % itemsize != 0 || bytes.size() / itemsize != static_cast<std::size_t>(numel)) {
    throw UsageError(fmt::format("deserialize: {} holds {} bytes for {} {} ({} elements)", label,
                                 bytes.size(), dtype_name(dtype), shape_str(shape), numel));
  }
  Tensor t = dev.alloc(dtype, std::move(shape), label, MemCategory::params);
  dev.upload(t, bytes);
  return t;
}

nlohmann::json param_json(Device& dev, const std::string& local, const Parameter& p) {
  return {{"name", local},
          {"path", p.name},
          {"id", p.id},
          {"shape", p.shape},
          {"dtype", dtype_name(p.dtype)},
          {"requires_grad", p.requires_grad},
          {"is_expert", p.is_expert},
          {"ds_status", zero_status_name(p.ds_status)},
          {"data", tensor_json(dev, p.data)},
          {"grad", tensor_json(dev, p.grad)},
          {"grad_accum", tensor_json(dev, p.grad_accum)},
          {"ds_shard", tensor_json(dev, p.ds_shard)}};
}

void restore_param(Device& dev, ParamDict& dict, const nlohmann::json& j) {
  const std::string local = j.at("name").get<std::string>();
  const Shape shape = j.at("shape").get<Shape>();
  const DType dtype = parse_dtype(j.at("dtype").get<std::string>());
  Parameter* p = nullptr;
  for (auto& [name, q] : dict) {
    if (name == local) p = q.get();
  }
  if (p == nullptr) p = &dict.add(local, shape, dtype);
  if (p->shape != shape) {
    throw UsageError(fmt::format("deserialize: param '{}' is {} in the JSON but the module built "
                                 "it as {}", local, shape_str(shape), shape_str(p->shape)));
  }
  p->name = j.at("path").get<std::string>();
  p->id = j.at("id").get<std::int64_t>();
  p->dtype = dtype;
  p->requires_grad = j.at("requires_grad").get<bool>();
  p->is_expert = j.at("is_expert").get<bool>();
  p->ds_status = parse_zero_status(j.at("ds_status").get<std::string>());
  p->data = tensor_from_json(dev, j.at("data"), p->name);
  p->grad = tensor_from_json(dev, j.at("grad"), p->name + ".grad");
  p->grad_accum = tensor_from_json(dev, j.at("grad_accum"), p->name + ".grad_accum");
  p->ds_shard = tensor_from_json(dev, j.at("ds_shard"), p->name + ".ds_shard");
}

void restore(Module& m, const nlohmann::json& j, const ModuleRegistry& kinds, Device& dev,
             const ModuleEnv& env);

Module& child_for(Module& m, const nlohmann::json& jc, const ModuleRegistry& kinds,
                  const ModuleEnv& env) {
  const std::string name = jc.at("name").get<std::string>();
  for (const auto& c : m.children()) {
    if (c->name() == name) return *c;
  }
  return m.add_child(kinds.make(jc.at("kind").get<std::string>(), name, jc.at("args"), env));
}

void restore(Module& m, const nlohmann::json& j, const ModuleRegistry& kinds, Device& dev,
             const ModuleEnv& env) {
  if (m.kind() != j.at("kind").get<std::string>()) {
    throw UsageError(fmt::format("deserialize: module '{}' is kind '{}' in the JSON but '{}' was "
                                 "built", m.name(), j.at("kind").get<std::string>(), m.kind()));
  }
  const nlohmann::json& params = j.at("params");
  for (const nlohmann::json& jp : params) restore_param(dev, m.params(), jp);
  if (m.params().size() != params.size()) {
    throw UsageError(fmt::format("deserialize: module '{}' was built with {} params, the JSON has "
                                 "{}", m.name(), m.params().size(), params.size()));
  }
  m.params().set_in_forward(j.at("in_forward").get<bool>());
  if (auto* model = dynamic_cast<Model*>(&m); model != nullptr && j.contains("model_dtype")) {
    model->set_dtype(parse_dtype(j.at("model_dtype").get<std::string>()));
  }
  for (const nlohmann::json& jc : j.at("children")) {
    restore(child_for(m, jc, kinds, env), jc, kinds, dev, env);
  }
  if (m.children().size() != j.at("children").size()) {
    throw UsageError(fmt::format("deserialize: module '{}' was built with {} children, the JSON "
                                 "has {}", m.name(), m.children().size(), j.at("children").size()));
  }
}

}  // namespace

namespace {

using Positions = std::map<const Parameter*, std::int64_t>;  // param -> preorder position

void number_params(const Module& m, Positions& out) {
  for (const auto& entry : m.params()) out.emplace(entry.second.get(), out.size());
  for (const auto& c : m.children()) number_params(*c, out);
}

// External params travel as positions in the serialized tree's preorder param order; one whose
// param lies outside the serialized subtree is left out, as a copy drops it (module.cpp, Note
// [External params in copies]).
nlohmann::json serialize_tree(const Module& m, Device& dev, const Positions& positions) {
  nlohmann::json j = {{"kind", m.kind()}, {"name", m.name()}, {"args", m.kind_args()},
                      {"in_forward", m.params().in_forward()}};
  if (const auto* model = dynamic_cast<const Model*>(&m)) {
    j["model_dtype"] = dtype_name(model->dtype());
  }
  nlohmann::json params = nlohmann::json::array();
  for (const auto& [local, p] : m.params()) params.push_back(param_json(dev, local, *p));
  nlohmann::json aliases = nlohmann::json::array();
  for (const ParamDict::Alias& a : m.params().aliases()) {
    if (auto it = positions.find(a.param); it != positions.end()) {
      aliases.push_back({{"name", a.local}, {"position", it->second}});
    } else {  // the owner is outside the serialized subtree: the copy owns it
      params.push_back(param_json(dev, a.local, *a.param));
    }
  }
  j["params"] = std::move(params);
  if (!aliases.empty()) j["aliases"] = std::move(aliases);
  nlohmann::json external = nlohmann::json::array();
  for (const Parameter* p : m.external_params()) {
    if (auto it = positions.find(p); it != positions.end()) external.push_back(it->second);
  }
  if (!external.empty()) j["external_params"] = std::move(external);
  nlohmann::json children = nlohmann::json::array();
  for (const auto& c : m.children()) children.push_back(serialize_tree(*c, dev, positions));
  j["children"] = std::move(children);
  return j;
}

void owners_of(Module& m, std::map<const Parameter*, Module*>& out) {
  for (const auto& entry : m.params()) out.emplace(entry.second.get(), &m);
  for (const auto& c : m.children()) owners_of(*c, out);
}

// After restore(): an alias the module's constructor built is pointed at the param at its
// position (it already is, for a tree built from its code); a missing one is added.
void restore_aliases(Module& m, const nlohmann::json& j, const std::vector<Parameter*>& params,
                     const std::map<const Parameter*, Module*>& owners) {
  if (m.params().aliases().size() > (j.contains("aliases") ? j.at("aliases").size() : 0)) {
    throw UsageError(fmt::format("deserialize: module '{}' was built with {} aliases, the JSON "
                                 "has fewer", m.name(), m.params().aliases().size()));
  }
  for (const nlohmann::json& ja : j.value("aliases", nlohmann::json::array())) {
    const std::string local = ja.at("name").get<std::string>();
    const auto k = ja.at("position").get<std::int64_t>();
    if (k < 0 || k >= static_cast<std::int64_t>(params.size())) {
      throw UsageError(fmt::format("deserialize: module '{}' aliases param {}, but the tree has "
                                   "{} params", m.name(), k, params.size()));
    }
    Parameter& p = *params[static_cast<std::size_t>(k)];
    Module* owner = owners.at(&p);
    if (owner == &m) {  // an alias shares another module's param; its own is simply a param
      throw UsageError(fmt::format("deserialize: module '{}' aliases '{}' (position {}), which is its "
                                   "own param: an alias must name another module's param", m.name(), local, k));
    }
    auto& built = m.params().aliases();
    auto it = std::find_if(built.begin(), built.end(),
                           [&](const ParamDict::Alias& a) { return a.local == local; });
    if (it == built.end()) {
      m.params().add_alias(local, p, *owner);
    } else {
      it->param = &p;
      it->owner = owner;
    }
  }
  for (std::size_t i = 0; i < m.children().size(); ++i) {
    restore_aliases(*m.children()[i], j.at("children").at(i), params, owners);
  }
}

// After restore(): the "external_params" positions, against the rebuilt tree's own params.
void restore_external(Module& m, const nlohmann::json& j, const std::vector<Parameter*>& params) {
  if (j.contains("external_params")) {
    for (const nlohmann::json& pos : j.at("external_params")) {
      const auto k = pos.get<std::int64_t>();
      if (k < 0 || k >= static_cast<std::int64_t>(params.size())) {
        throw UsageError(fmt::format("deserialize: module '{}' has external param {}, but the tree "
                                     "has {} params", m.name(), k, params.size()));
      }
      m.add_external_param(*params[static_cast<std::size_t>(k)]);
    }
  }
  for (std::size_t i = 0; i < m.children().size(); ++i) {
    restore_external(*m.children()[i], j.at("children").at(i), params);
  }
}

}  // namespace

nlohmann::json serialize_module(const Module& m, Device& dev) {
  Positions positions;
  number_params(m, positions);
  return serialize_tree(m, dev, positions);
}

namespace {

// serialize_module writes no float: every number is a size, an id, a position or a count. nlohmann
// casts a float to the integer a reader asks for, which is undefined behaviour out of range, so a
// float anywhere is refused before any is read. The walk recurses, so nesting is bounded too.
constexpr int kMaxJsonDepth = 256;  // a module tree nests two levels a module; trees are shallower

void refuse_floats(const nlohmann::json& j, const std::string& where, int depth = 0) {
  if (depth > kMaxJsonDepth) {
    throw UsageError(fmt::format("deserialize: the module JSON nests deeper than {} levels at {}",
                                 kMaxJsonDepth, where.substr(0, 200)));
  }
  if (j.is_number_float()) {
    throw UsageError(fmt::format("deserialize: {} is {}, but module JSON has integers only: "
                                 "write it with serialize_module", where, j.dump()));
  }
  if (j.is_object()) {
    for (const auto& [key, v] : j.items()) refuse_floats(v, where + "." + key, depth + 1);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) {
      refuse_floats(j[i], fmt::format("{}[{}]", where, i), depth + 1);
    }
  }
}

}  // namespace

std::unique_ptr<Module> deserialize_module(const nlohmann::json& j, const ModuleRegistry& kinds,
                                           Device& dev, const ModuleEnv& env) {
  refuse_floats(j, "the root");
  try {
    std::unique_ptr<Module> root = kinds.make(j.at("kind").get<std::string>(),
                                              j.at("name").get<std::string>(), j.at("args"), env);
    restore(*root, j, kinds, dev, env);
    const std::vector<Parameter*> params = root->named_parameters();
    std::map<const Parameter*, Module*> owners;
    owners_of(*root, owners);
    restore_aliases(*root, j, params, owners);
    restore_external(*root, j, params);
    return root;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("deserialize: the module JSON is malformed ({}): write it with "
                                 "serialize_module", e.what()));
  }
}

}  // namespace zc
