// Invariant I4: module copies and tracing on every rank of a trained engine (module_checks.h).
#include "props/module_checks.h"

#include "engine/errors.h"
#include "engine/module_io.h"
#include "engine/rng.h"
#include "engine/tracing.h"
#include "models/mlp.h"
#include "models/registry.h"
#include "models/synthetic.h"
#include "models/tree.h"
#include "props/training_run.h"

#include <algorithm>
#include <map>
#include <set>
#include <typeinfo>

namespace zc::props {

namespace {

std::string list(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}

std::string where(const Module& m) { return m.path().empty() ? "<root>" : m.path(); }

// "module 'layers.0' param 'weight'", or "(no params)" for a module without any.
std::string at(const Module& m) {
  const std::string first = m.params().size() == 0 ? "" : m.params().begin()->first;
  return first.empty() ? fmt::format("module '{}' (no params)", where(m))
                       : fmt::format("module '{}' param '{}'", where(m), first);
}

// ---- the original, before and after ----

struct ParamState {
  std::string name;
  const Parameter* object;
  Shape shape;
  ZeroStatus status;
  bool has_data;
  std::vector<std::byte> data, shard;  // empty when undefined or meta
};
struct ModuleState {
  const Module* module;
  const Module* owner;
  bool in_forward;
  std::vector<ParamState> params;
  std::vector<const Parameter*> external;  // the module's external-param registrations
  std::vector<std::pair<const Parameter*, const Module*>> aliases;  // (param, owning module)
};

std::vector<std::byte> bytes_of(Device& dev, const Tensor& t) {
  return t.defined() && !t.is_meta() ? to_bytes(dev, t) : std::vector<std::byte>{};
}

void snapshot(const Module& m, Device& dev, std::vector<ModuleState>& out) {
  ModuleState s{&m, m.params().owner(), m.params().in_forward(), {},
                {m.external_params().begin(), m.external_params().end()}, {}};
  for (const ParamDict::Alias& a : m.params().aliases()) s.aliases.emplace_back(a.param, a.owner);
  for (const auto& [local, p] : m.params()) {
    s.params.push_back({local, p.get(), p->shape, p->ds_status, p->data.defined(),
                        bytes_of(dev, p->data), bytes_of(dev, p->ds_shard)});
  }
  out.push_back(std::move(s));
  for (const auto& c : m.children()) snapshot(*c, dev, out);
}

std::string param_changed(const Module& m, const ParamState& a, const ParamState& b) {
  const std::string p = fmt::format("module '{}' param '{}'", where(m), a.name);
  if (a.name != b.name || a.object != b.object) return p + ": the param object was replaced";
  if (a.shape != b.shape) {
    return fmt::format("{}: shape {} -> {}", p, shape_str(a.shape), shape_str(b.shape));
  }
  if (a.status != b.status) {
    return fmt::format("{}: ds_status {} -> {}", p, zero_status_name(a.status),
                       zero_status_name(b.status));
  }
  if (a.has_data != b.has_data || a.data != b.data) return p + ": data changed";
  if (a.shard != b.shard) return p + ": ds_shard changed";
  return "";
}

std::string original_changed(const std::vector<ModuleState>& before,
                             const std::vector<ModuleState>& after) {
  if (before.size() != after.size()) {
    return fmt::format("{} modules -> {}", before.size(), after.size());
  }
  for (std::size_t i = 0; i < before.size(); ++i) {
    const ModuleState &a = before[i], &b = after[i];
    const Module& m = *a.module;
    if (a.module != b.module) return fmt::format("module '{}' was replaced", where(m));
    if (a.owner != b.owner) return fmt::format("{}: ParamDict owner was rebound", at(m));
    if (a.in_forward != b.in_forward) return fmt::format("{}: in_forward changed", at(m));
    if (a.external != b.external) {
      return fmt::format("module '{}': external params {} -> {}", where(m), a.external.size(),
                         b.external.size());
    }
    if (a.aliases != b.aliases) {
      return fmt::format("module '{}': aliases rebound, added or removed", where(m));
    }
    if (a.params.size() != b.params.size()) {
      return fmt::format("module '{}': params added or removed", where(m));
    }
    for (std::size_t k = 0; k < a.params.size(); ++k) {
      const std::string d = param_changed(m, a.params[k], b.params[k]);
      if (!d.empty()) return d;
    }
  }
  return "";
}

// ---- a copy against its original ----

void collect(const Module& m, std::set<const Module*>& out) {
  out.insert(&m);
  for (const auto& c : m.children()) collect(*c, out);
}

// The original's modules, and both trees' params by preorder position.
struct CopyIndex {
  std::set<const Module*> originals;
  std::map<const Parameter*, std::size_t> original_pos, copy_pos;
};

void number_params(const Module& m, std::map<const Parameter*, std::size_t>& out) {
  for (const auto& entry : m.params()) out.emplace(entry.second.get(), out.size());
  for (const auto& c : m.children()) number_params(*c, out);
}

std::string param_at(const Module& m, const Parameter* p) {
  return fmt::format("module '{}' external param '{}'", where(m), p->name);
}

// A copy's external params (Note [External params in copies], engine/module.cpp) are the copy's
// own params at the positions of the original's, in the same order.
std::string external_problem(const Module& o, const Module& c, const CopyIndex& idx) {
  const auto &oe = o.external_params(), &ce = c.external_params();
  if (oe.size() != ce.size()) {
    return fmt::format("module '{}': {} external params in the copy, {} in the original",
                       where(o), ce.size(), oe.size());
  }
  for (std::size_t k = 0; k < oe.size(); ++k) {
    if (idx.original_pos.count(ce[k]) != 0) {
      return param_at(c, ce[k]) + " is the original's param, want the copy's";
    }
    auto mine = idx.copy_pos.find(ce[k]);
    if (mine == idx.copy_pos.end()) {
      return param_at(c, ce[k]) + " is not a param of the copied tree";
    }
    auto theirs = idx.original_pos.find(oe[k]);
    if (theirs == idx.original_pos.end() || theirs->second != mine->second) {
      return fmt::format("{} is not the copy of the original's '{}'", param_at(c, ce[k]),
                         oe[k]->name);
    }
  }
  return "";
}

bool owns(const Module& m, const Parameter* p) {
  return std::any_of(m.params().begin(), m.params().end(),
                     [&](const auto& entry) { return entry.second.get() == p; });
}

// A copy's aliases (Note [Shared params]) name the copy's param at the original's position, and
// the copy's module that owns it.
std::string alias_problem(const Module& o, const Module& c, const CopyIndex& idx) {
  const auto &oa = o.params().aliases(), &ca = c.params().aliases();
  if (oa.size() != ca.size()) {
    return fmt::format("module '{}': {} aliases in the copy, {} in the original", where(o),
                       ca.size(), oa.size());
  }
  for (std::size_t k = 0; k < oa.size(); ++k) {
    const std::string a = fmt::format("module '{}' alias '{}'", where(c), ca[k].local);
    if (ca[k].local != oa[k].local) {
      return fmt::format("{}: named '{}' in the original", a, oa[k].local);
    }
    if (idx.original_pos.count(ca[k].param) != 0) {
      return a + " is the original's param, want the copy's";
    }
    auto mine = idx.copy_pos.find(ca[k].param);
    auto theirs = idx.original_pos.find(oa[k].param);
    if (mine == idx.copy_pos.end()) return a + " is not a param of the copied tree";
    if (theirs == idx.original_pos.end() || theirs->second != mine->second) {
      return fmt::format("{} is not the copy of the original's '{}'", a, oa[k].param->name);
    }
    if (ca[k].owner == nullptr || idx.originals.count(ca[k].owner) != 0) {
      return a + ": its owner is null or the original's module, want the copy's";
    }
    if (!owns(*ca[k].owner, ca[k].param) || ca[k].owner->path() != oa[k].owner->path()) {
      return fmt::format("{}: its owner '{}' is not the copy of '{}' owning the param", a,
                         where(*ca[k].owner), where(*oa[k].owner));
    }
  }
  return "";
}

std::string owner_problem(const Module& copy, const std::set<const Module*>& originals) {
  const Module* owner = copy.params().owner();
  if (owner == nullptr) return "ParamDict owner is null, want the copy's module";
  if (originals.count(owner) != 0) {
    return fmt::format("ParamDict owner is the original module '{}', want the copy's",
                       where(*owner));
  }
  if (owner != &copy) {
    return fmt::format("ParamDict owner is module '{}', not the module holding it", where(*owner));
  }
  return "";
}

// Param fields a copy keeps; a traced copy's params are fake instead (meta data, no ZeRO status).
std::string param_problem(const Parameter& o, const Parameter& c, bool fake) {
  if (&o == &c) return "the param object is shared with the original";
  if (o.shape != c.shape || o.dtype != c.dtype) {
    return fmt::format("{} {} in the copy, {} {} in the original", dtype_name(c.dtype),
                       shape_str(c.shape), dtype_name(o.dtype), shape_str(o.shape));
  }
  if (fake) {
    if (c.has_zero_status()) {
      return fmt::format("fake param has ds_status {}", zero_status_name(c.ds_status));
    }
    if (!c.data.defined() || !c.data.is_meta()) return "fake param has no meta tensor";
    return "";
  }
  if (o.ds_status != c.ds_status) {
    return fmt::format("ds_status {} in the copy, {} in the original",
                       zero_status_name(c.ds_status), zero_status_name(o.ds_status));
  }
  if (o.data.defined() != c.data.defined() || o.ds_shard.defined() != c.ds_shard.defined()) {
    return "data or ds_shard defined in one of copy and original only";
  }
  return "";
}

std::string module_problem(const std::string& what, const Module& o, const Module& c,
                           const CopyIndex& idx, bool fake) {
  const std::set<const Module*>& originals = idx.originals;
  if (typeid(o) != typeid(c) || o.name() != c.name()) {
    return fmt::format("{}: module '{}' is {} '{}' in the copy, {} '{}' in the original", what,
                       where(o), c.kind(), c.name(), o.kind(), o.name());
  }
  if (const std::string p = owner_problem(c, originals); !p.empty()) {
    return fmt::format("{}: {}: {}", what, at(c), p);
  }
  if (o.params().size() != c.params().size()) {
    return fmt::format("{}: module '{}': param count differs", what, where(o));
  }
  for (auto oi = o.params().begin(), ci = c.params().begin(); oi != o.params().end(); ++oi, ++ci) {
    const std::string name = oi->first;
    if (ci->first != name) {
      return fmt::format("{}: module '{}': param '{}' is '{}' in the copy", what, where(o), name,
                         ci->first);
    }
    if (const std::string p = param_problem(*oi->second, *ci->second, fake); !p.empty()) {
      return fmt::format("{}: module '{}' param '{}': {}", what, where(o), name, p);
    }
  }
  if (const std::string p = external_problem(o, c, idx); !p.empty()) {
    return fmt::format("{}: {}", what, p);
  }
  if (const std::string p = alias_problem(o, c, idx); !p.empty()) {
    return fmt::format("{}: {}", what, p);
  }
  if (o.children().size() != c.children().size()) {
    return fmt::format("{}: module '{}': child count differs", what, where(o));
  }
  for (std::size_t i = 0; i < o.children().size(); ++i) {
    const Module &oc = *o.children()[i], &cc = *c.children()[i];
    if (cc.parent() != &c) {
      return fmt::format("{}: module '{}' is not a child of its copied parent", what, where(oc));
    }
    if (std::string p = module_problem(what, oc, cc, idx, fake); !p.empty()) return p;
  }
  return "";
}

std::string copy_problem(const std::string& what, const Module& original, const Module& copy,
                         bool fake) {
  if (copy.parent() != nullptr) return what + ": the copy is not a root";
  if (copy.param_coordinator() != nullptr) {
    return what + ": the copy kept the original's ZeRO-3 coordinator";
  }
  CopyIndex idx;
  collect(original, idx.originals);
  number_params(original, idx.original_pos);
  number_params(copy, idx.copy_pos);
  return module_problem(what, original, copy, idx, fake);
}

// ---- the copy paths ----

template <class T>
bool copy_construct_as(const Model& m, std::string& problem) {
  if (typeid(m) != typeid(T)) return false;
  const T copy(static_cast<const T&>(m));  // the subclass's copy constructor
  problem = copy_problem("copy construction", m, copy, false);
  return true;
}

std::string copy_construction_problem(const Model& m) {
  std::string p;
  if (copy_construct_as<Mlp>(m, p) || copy_construct_as<Synthetic>(m, p) ||
      copy_construct_as<TreeModel>(m, p)) {
    return p;
  }
  return fmt::format("copy construction: no copy path for model kind '{}' in the I4 checks",
                     m.kind());
}

std::string round_trip_problem(Model& m, Device& dev) {
  const nlohmann::json j = serialize_module(m, dev);
  const std::unique_ptr<Module> copy = deserialize_module(j, model_registry(), dev);
  if (std::string p = copy_problem("serialize+deserialize", m, *copy, false); !p.empty()) return p;
  if (serialize_module(*copy, dev) != j) {
    return "serialize+deserialize: the copy serializes differently";
  }
  return "";
}

std::string trace_problem(const Model& m) {
  const TracedModel traced = trace(m);
  return copy_problem("trace", m, *traced.model, true);
}

}  // namespace

// The original's state as data (paths, owners as "is this module", statuses and bytes), never
// addresses, so that reruns hash alike.
std::uint64_t state_hash(const std::vector<ModuleState>& states) {
  std::uint64_t h = fnv1a("");
  for (const ModuleState& m : states) {
    h = fnv1a(fmt::format("{}|{}|{}|{}|{}", where(*m.module), m.owner == m.module, m.in_forward, m.external.size(),
                          m.aliases.size()), h);
    for (const ParamState& p : m.params) {
      h = fnv1a(fmt::format("{}|{}|{}|{}", p.name, shape_str(p.shape), zero_status_name(p.status), p.has_data), h);
      h = mix64(mix64(h, hash_data(p.data.data(), p.data.size())), hash_data(p.shard.data(), p.shard.size()));
    }
  }
  return h;
}

std::string i4_violation_on_model(Model& model, Device& dev, Trace* trace) {
  std::vector<ModuleState> before;
  snapshot(model, dev, before);
  const std::vector<std::pair<std::string, std::function<std::string()>>> steps = {
      {"clone", [&] { return copy_problem("clone", model, *model.clone(), false); }},
      {"copy construction", [&] { return copy_construction_problem(model); }},
      {"serialize+deserialize", [&] { return round_trip_problem(model, dev); }},
      {"trace", [&] { return trace_problem(model); }},
  };
  for (const auto& [what, run] : steps) {
    std::string problem;
    try {
      problem = run();
    } catch (const ZcError& e) {
      problem = fmt::format("{}: failed: {}", what, e.what());
    }
    std::vector<ModuleState> after;
    if (problem.empty()) snapshot(model, dev, after);
    if (trace) trace->record("module", fmt::format("{}: {}", what, problem.empty() ? "ok" : problem), state_hash(after));
    if (!problem.empty()) return problem;
    if (std::string d = original_changed(before, after); !d.empty()) {
      return fmt::format("{}: the original changed: {}", what, d);
    }
  }
  return "";
}

std::string describe(const I4Case& c) {
  return fmt::format("world {}, stage {}, {} {}, seed {}, bugs {}", c.world, c.stage, c.model,
                     list(c.shape), c.seed, c.bugs.str());
}

std::unique_ptr<Model> make_i4_model(const I4Case& c) {
  if (c.model == "tree") return std::make_unique<TreeModel>(c.shape);
  std::vector<std::int64_t> v;
  for (std::int64_t x : c.shape) v.push_back(std::max<std::int64_t>(x, 1));
  if (c.model == "synthetic") {
    std::vector<Shape> shapes;
    for (std::int64_t n : v) shapes.push_back({n});
    if (shapes.empty()) shapes.push_back({1});
    return std::make_unique<Synthetic>(shapes);
  }
  if (c.model == "mlp") {
    while (v.size() < 2) v.push_back(1);
    return std::make_unique<Mlp>(MlpSpec{v, true, LossKind::linear});
  }
  throw UsageError(fmt::format("I4Case: model '{}' is not one of mlp, synthetic, tree", c.model));
}

std::string i4_violation(const I4Case& c) { return i4_check(c).violation; }

I4Outcome i4_check(const I4Case& c) {
  if (c.world < 1 || c.world > kI4MaxWorld) {
    throw UsageError(fmt::format("I4Case: world {} is outside 1..{}", c.world, kI4MaxWorld));
  }
  if (c.stage < 0 || c.stage > 3) {
    throw UsageError(fmt::format("I4Case: stage {} is outside 0..3", c.stage));
  }
  make_i4_model(c);  // a malformed kind throws here, not on a rank
  RunSpec spec;
  spec.world = c.world;
  spec.ds_config = {{"optimizer", {{"type", "Adam"}}},
                    {"zero_optimization", {{"stage", c.stage}, {"reduce_bucket_size", 64},
                                           {"stage3_param_persistence_threshold", 0}}}};
  spec.make_model = [c] { return make_i4_model(c); };
  spec.steps = 1;
  spec.collect_grads = false;
  spec.exact.grad_multiple = c.world;
  spec.seed = c.seed;
  spec.bugs = c.bugs;
  std::vector<std::string> found(static_cast<std::size_t>(c.world));
  spec.after_init = [](int, Engine& e) {  // a tree's uses declared up front (models/tree.h)
    if (auto* tree = dynamic_cast<TreeModel*>(&e.model())) {
      for (auto [module, p] : tree->registered_external_uses()) {
        e.register_external_parameter(*module, *p);
      }
    }
  };
  spec.after_step = [&](int rank, int, Engine& e, double) {
    found[static_cast<std::size_t>(rank)] = i4_violation_on_model(e.model(), e.device(), e.options().trace);
  };
  I4Outcome out;
  out.trace_hash = run_on_sim(spec).sim.trace_hash;
  for (int r = 0; r < c.world && out.violation.empty(); ++r) {
    if (!found[static_cast<std::size_t>(r)].empty()) out.violation = fmt::format("rank {}: {}", r, found[static_cast<std::size_t>(r)]);
  }
  return out;
}

}  // namespace zc::props
