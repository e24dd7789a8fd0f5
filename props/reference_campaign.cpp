// The DeepSpeed reference's campaigns (reference.h): the known divergence classes, the comparison
// as a RapidCheck property (shrunk and saved like any counterexample), the witnesses that keep the
// list honest, and the invariants checked on DeepSpeed itself.
#include "props/reference.h"

#include "engine/errors.h"
#include "engine/trace.h"
#include "props/scenario_gen.h"
#include "props/verify.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <fstream>

#ifndef ZC_SOURCE_DIR
#error "ZC_SOURCE_DIR must name the source tree (props/CMakeLists.txt)"
#endif

namespace zc::props {

std::filesystem::path divergence_classes_file() {
  return std::filesystem::path(ZC_SOURCE_DIR) / "reference" / "deepspeed" / "known_divergences.json";
}

std::vector<DivergenceClass> load_divergence_classes(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(fmt::format("the divergence list {} is missing", file.string()));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("classes")) throw ConfigError(fmt::format("{}: not a divergence list", file.string()));
  std::vector<DivergenceClass> out;
  for (const nlohmann::json& c : j.at("classes")) {
    DivergenceClass d;
    try {
      d.id = c.at("id").get<std::string>();
      d.summary = c.at("summary").get<std::string>();
      d.deepspeed = c.at("deepspeed").get<std::string>();
      d.when = c.at("when");
      d.affects = c.at("affects").get<std::vector<std::string>>();
      d.witness = scenario_from_json(c.at("witness"));
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("{}: class {}: {}", file.string(), c.dump().substr(0, 80), e.what()));
    }
    if (!d.when.is_object()) throw ConfigError(fmt::format("{}: class {}: 'when' must be an object", file.string(), d.id));
    const nlohmann::json keys = to_json(Scenario{});
    for (const auto& [key, cond] : d.when.items()) {
      if (!keys.contains(key)) throw ConfigError(fmt::format("{}: class {}: 'when' names no scenario key '{}'", file.string(), d.id, key));
    }
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

bool condition_holds(const nlohmann::json& value, const nlohmann::json& cond) {
  if (cond.is_array()) {
    for (const nlohmann::json& v : cond) {
      if (v == value) return true;
    }
    return false;
  }
  if (cond.is_object()) {
    if (!value.is_number()) return false;
    if (cond.contains("min") && value.get<double>() < cond.at("min").get<double>()) return false;
    if (cond.contains("max") && value.get<double>() > cond.at("max").get<double>()) return false;
    return true;
  }
  return cond == value;
}

bool field_affected(const DivergenceClass& c, const std::string& field) {
  for (const std::string& a : c.affects) {
    if (a == field || (a == "comm:" && field.rfind("comm:", 0) == 0)) return true;
  }
  return false;
}

}  // namespace

bool class_covers(const DivergenceClass& c, const Scenario& s, const std::string& field) {
  if (!field_affected(c, field)) return false;
  const nlohmann::json j = to_json(s);
  for (const auto& [key, cond] : c.when.items()) {
    if (!condition_holds(j.at(key), cond)) return false;
  }
  return true;
}

ReferenceVerdict classify(const Scenario& s, const ReferenceComparison& c, const std::vector<DivergenceClass>& classes) {
  ReferenceVerdict v;
  v.verdict.trace_hash = c.hash;
  v.matched = c.matched();
  v.refused = !c.sim_error.empty() && !c.ds_error.empty();
  for (const FieldDiff& d : c.diffs) {
    const DivergenceClass* by = nullptr;
    for (const DivergenceClass& k : classes) {
      if (class_covers(k, s, d.field)) {
        by = &k;
        break;
      }
    }
    if (by == nullptr) {
      if (v.verdict.holds) v.verdict.failure = fmt::format("unlisted divergence in {}: {}", d.field, d.detail);
      else v.verdict.failure += fmt::format("; also {}", d.field);
      v.verdict.holds = false;
    } else if (std::find(v.classes.begin(), v.classes.end(), by->id) == v.classes.end()) {
      v.classes.push_back(by->id);
    }
  }
  if (v.verdict.holds && !c.diffs.empty()) {
    v.verdict.failure = fmt::format("listed divergence ({}) in {}: {}", fmt::join(v.classes, ", "), c.diffs[0].field,
                                    c.diffs[0].detail);
  }
  if (v.refused) v.verdict.failure = fmt::format("both refused: zerocheck {}; DeepSpeed {}", c.sim_error, c.ds_error);
  return v;
}

rc::Gen<Scenario> gen_reference_scenario() {
  GenDomain d;
  d.max_world = 4;
  d.tree = false;
  using namespace rc;
  auto uniform = [](auto g) { return gen::resize(100, std::move(g)); };
  return gen::map(gen::tuple(gen_scenario(d), uniform(gen::element<std::string>("SGD", "Adam", "AdamW")),
                             uniform(gen::inRange(1, 7)), uniform(gen::element<std::string>("explicit", "implicit")),
                             gen::arbitrary<bool>(), uniform(gen::element<std::string>("f32", "bf16"))),
                  [](const std::tuple<Scenario, std::string, int, std::string, bool, std::string>& t) {
    Scenario s = std::get<0>(t);
    s.dtype = std::get<5>(t);  // fp16 is refused on this CPU (reference_unexpressible)
    if (s.dtype != "bf16" || s.stage == 0) s.grad_accum_dtype = "";
    s.optimizer = std::get<1>(t);
    s.lr = s.optimizer == "SGD" ? std::ldexp(1.0, -std::get<2>(t)) : 1e-3;
    s.boundary = std::get<3>(t);
    // Coalescing needs GA 1, ZeRO 1-3 and no BF16_Optimizer wrapper (ZeRO-1 + bf16 + fp32 accumulation, no offload).
    s.coalesce = std::get<4>(t) && s.ga == 1 && s.stage >= 1 &&
                 !(s.stage == 1 && !s.grad_accum_dtype.empty() && s.offload == "none");
    if (s.model == "mlp" && !grads_param_independent(s)) s.steps = 1;  // later steps' grads are not exact
    return s;
  });
}

namespace {

// The comparison as a property: holds when the scenario matches DeepSpeed or diverges only in listed classes.
struct Tally {
  std::vector<std::pair<Scenario, ReferenceVerdict>> cases;
  double ds_seconds = 0;
};

Invariant conformance_invariant(ReferencePools& pools, std::shared_ptr<Tally> tally, std::vector<DivergenceClass> classes) {
  Invariant inv;
  inv.name = "deepspeed-matches-or-listed";
  inv.explanation =
      "The scenario run on the simulator and on DeepSpeed 0.19.8 (CPU, gloo, one process per rank) gives the same "
      "gradients at the boundary, params after each step, loss scale, skipped steps, micro_step_id at coalesce "
      "flushes and collective calls and bytes per kind, bit for bit; or every difference is explained by a class in "
      "reference/deepspeed/known_divergences.json (DeepSpeed's file:line and the scenarios it covers).";
  inv.gen = gen_reference_scenario;
  inv.check = [&pools, tally, classes](const Scenario& s, const CheckContext&) {
    if (!reference_unexpressible(s).empty() || !exact_infeasible(s).empty()) return Verdict{false, true, "", 0};
    const ReferenceComparison c = compare_with_deepspeed(s, pools);
    ReferenceVerdict v = classify(s, c, classes);
    if (tally) {
      tally->cases.emplace_back(s, v);
      tally->ds_seconds += c.ds_seconds;
    }
    return v.verdict;
  };
  return inv;
}

}  // namespace

std::vector<Invariant> reference_invariants(ReferencePools& pools) {
  std::vector<Invariant> out;
  out.push_back(conformance_invariant(pools, nullptr, load_divergence_classes(divergence_classes_file())));
  return out;
}

namespace {

// Counts by stage, dtype and feature: {"stage 2": [matched, listed, failed], ...}.
nlohmann::json conformance_table(const Tally& tally) {
  std::map<std::string, std::array<int, 4>> rows;  // matched, diverged in listed classes, refused by both, failed
  for (const auto& [s, v] : tally.cases) {
    std::vector<std::string> keys = {fmt::format("stage {}", s.stage), s.dtype, s.optimizer,
                                     fmt::format("world {}", s.world), s.model, "boundary " + s.boundary};
    if (s.coalesce) keys.push_back("coalesced");
    if (s.offload != "none") keys.push_back("offload " + s.offload);
    if (s.contiguous) keys.push_back("contiguous_gradients");
    if (s.overlap) keys.push_back("overlap_comm");
    if (!s.grad_accum_dtype.empty()) keys.push_back("grad_accum fp32");
    if (s.clip > 0) keys.push_back("clipping");
    if (s.ga > 1) keys.push_back("GA > 1");
    if (s.n > 1) keys.push_back("N > 1");
    keys.push_back("all");
    const int col = !v.verdict.holds ? 3 : v.refused ? 2 : v.matched ? 0 : 1;
    for (const std::string& k : keys) rows[k][static_cast<std::size_t>(col)]++;
  }
  nlohmann::json table = nlohmann::json::array();
  for (const auto& [k, r] : rows) {
    table.push_back({{"feature", k}, {"matched", r[0]}, {"listed", r[1]}, {"refused_by_both", r[2]}, {"failed", r[3]}});
  }
  return table;
}

// Each class's witness must still diverge in a field the class affects; a witness that matches
// means DeepSpeed or the engine changed and the entry must go.
nlohmann::json check_witnesses(const std::vector<DivergenceClass>& classes, ReferencePools& pools,
                               const std::filesystem::path& out, const std::map<std::string, int>& seen) {
  nlohmann::json list = nlohmann::json::array();
  for (const DivergenceClass& c : classes) {
    nlohmann::json r = {{"id", c.id}, {"summary", c.summary}, {"deepspeed", c.deepspeed}, {"affects", c.affects},
                        {"when", c.when}, {"cases", seen.contains(c.id) ? seen.at(c.id) : 0}};
    try {
      const ReferenceComparison cmp = compare_with_deepspeed(c.witness, pools);
      std::string detail;
      for (const FieldDiff& d : cmp.diffs) {
        if (field_affected(c, d.field) && detail.empty()) detail = d.field + ": " + d.detail;
      }
      r["witness_diverges"] = !detail.empty();
      r["witness_detail"] = detail.empty() ? "the witness matches DeepSpeed: remove this entry" : detail;
      const ReferenceVerdict v = classify(c.witness, cmp, classes);
      SavedCase saved{c.witness, "deepspeed-matches-or-listed", {}, v.verdict.holds, cmp.hash, detail, "", 0};
      const std::filesystem::path file = out / "counterexamples" / fmt::format("deepspeed-{}.json", c.id);
      save_case(saved, file);
      r["witness_file"] = file.string();
      r["witness_hash"] = fmt::format("0x{:016x}", cmp.hash);
    } catch (const ZcError& e) {
      r["witness_diverges"] = false;
      r["witness_detail"] = fmt::format("the witness did not run: {}", e.what());
    }
    list.push_back(r);
  }
  return list;
}

}  // namespace

nlohmann::json run_reference_campaigns(const ReferenceOptions& opts, ReferencePools& pools) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<DivergenceClass> classes = load_divergence_classes(divergence_classes_file());
  auto tally = std::make_shared<Tally>();
  const Invariant inv = conformance_invariant(pools, tally, classes);
  const Campaign c = run_campaign(inv, CheckContext{}, opts.cases, opts.seed);
  // Cases after the first failure are RapidCheck's shrinking: the table counts the campaign's own.
  if (c.failed && static_cast<int>(tally->cases.size()) > c.cases) tally->cases.resize(static_cast<std::size_t>(c.cases));
  std::map<std::string, int> seen;
  int matched = 0, listed = 0, refused = 0;
  for (const auto& [s, v] : tally->cases) {
    for (const std::string& id : v.classes) seen[id]++;
    matched += v.matched && !v.refused;
    refused += v.refused;
    listed += v.verdict.holds && !v.matched;
  }
  nlohmann::json j = {{"deepspeed", "0.19.8"}, {"torch", "2.10.0"}, {"cases", static_cast<int>(tally->cases.size())},
                      {"discarded", c.discarded}, {"matched", matched}, {"listed", listed}, {"refused_by_both", refused},
                      {"holds", !c.failed && c.error.empty()}, {"conformance", conformance_table(*tally)},
                      {"deepspeed_seconds", tally->ds_seconds}};
  if (!c.error.empty()) j["error"] = c.error;
  if (c.failed) {
    j["failure"] = c.verdict.failure;
    j["counterexample"] = to_json(c.counterexample);
    j["reproduce"] = c.reproduce;
    SavedCase saved{c.counterexample, inv.name, {}, false, c.verdict.trace_hash, c.verdict.failure, c.reproduce, opts.seed};
    const std::filesystem::path file = opts.out / "counterexamples" / "deepspeed-matches-or-listed.json";
    save_case(saved, file);
    j["scenario_file"] = file.string();
  }
  j["classes"] = check_witnesses(classes, pools, opts.out, seen);
  for (const nlohmann::json& k : j["classes"]) {
    if (!k.value("witness_diverges", false)) j["holds"] = false;
  }
  j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return j;
}

}  // namespace zc::props
