// The DeepSpeed comparison counted, not stopped (Note [Counting the comparison]): every scenario of
// a campaign runs, and the figures (matched, listed by class, unlisted by class) are a rate that
// the soak adds up over many seeds. Also the conformance table by feature and the coverage of
// stage x dtype x communication dtype x clipping x offload x optimizer.
//
// Note [Counting the comparison]
// A conformance figure that one seed passes and another fails is a claim about the seed. So the
// comparison runs every case of its range (Note [Counting campaigns] in campaign.cpp) and sorts
// each into matched (bit for bit, collectives included), listed (every difference explained by a
// class of known_divergences.json), refused by both, or unlisted. An unlisted divergence belongs
// to a class of its own, keyed by the fields no class covers and the configuration's main axes
// (stage, dtype, communication dtype, clipping, offload, optimizer): the first case of each such
// class is shrunk and saved once, the later ones only counted, and at most kMaxUnlistedShrinks classes
// per campaign are shrunk (each shrink reruns DeepSpeed tens of times). A comparison that raised
// (a worker crashed or hung: RankFailure) is neither: it is an error, counted with its scenario
// and never shrunk (a hang costs the pool's timeout each time). The verdict fails on any unlisted
// divergence and on any error.
#include "props/reference.h"

#include "engine/errors.h"
#include "engine/trace.h"
#include "props/scenario_gen.h"
#include "props/verify.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <regex>

namespace zc::props {

namespace {

constexpr std::size_t kMaxErrorCases = 5;  // errors whose scenario is kept (all are counted)

// "default" when the scenario leaves communication_data_type to DeepSpeed (the model dtype).
std::string comm_label(const Scenario& s) { return s.comm_dtype.empty() ? "default" : s.comm_dtype; }

// The conformance table's features of one scenario ("all" last).
std::vector<std::string> features(const Scenario& s) {
  std::vector<std::string> keys = {fmt::format("stage {}", s.stage), s.dtype, s.optimizer,
                                   fmt::format("world {}", s.world), s.model, "boundary " + s.boundary};
  if (s.coalesce) keys.push_back("coalesced");
  if (s.offload != "none") keys.push_back("offload " + s.offload);
  if (s.contiguous) keys.push_back("contiguous_gradients");
  if (s.overlap) keys.push_back("overlap_comm");
  if (!s.grad_accum_dtype.empty()) keys.push_back("grad_accum fp32");
  if (!s.comm_dtype.empty()) keys.push_back("communication_data_type " + s.comm_dtype);
  if (s.round_robin) keys.push_back("round_robin_gradients");
  if (s.clip > 0) keys.push_back("clipping");
  if (s.ga > 1) keys.push_back("GA > 1");
  if (s.n > 1) keys.push_back("N > 1");
  keys.push_back("all");
  return keys;
}

const std::array<const char*, 6> kTableColumns = {"scenarios", "values_bit_for_bit", "collectives_equal",
                                                   "diverged_in_listed_classes", "refused_by_both", "failed"};
const std::array<const char*, 4> kCoverageColumns = {"scenarios", "matched", "listed", "unlisted"};
const std::array<const char*, 6> kMemoryColumns = {"scenarios", "exact", "listed", "within_1pct", "beyond", "not_measured"};
// within_1pct counts exact figures too; listed, the differing figures a class explains.
const std::array<const char*, 4> kMemoryCategoryColumns = {"figures", "exact", "listed", "within_1pct"};
constexpr std::size_t kMemoryExamples = 6;  // scenarios beyond 1 % whose differences are kept
constexpr std::size_t kMemoryReasons = 12;  // not-measured reasons named apart; the rest counted


// Adds `counts` to the row of `table` (an array of objects) whose `key_name` is `key`.
template <std::size_t N>
void add_row(nlohmann::json& table, const char* key_name, const std::string& key,
             const std::array<const char*, N>& columns, const std::array<int, N>& counts) {
  auto it = std::find_if(table.begin(), table.end(),
                         [&](const nlohmann::json& r) { return r.value(key_name, "") == key; });
  if (it == table.end()) {
    nlohmann::json row = {{key_name, key}};
    for (const char* c : columns) row[c] = 0;
    table.push_back(row);
    it = table.end() - 1;
  }
  for (std::size_t k = 0; k < N; ++k) (*it)[columns[k]] = (*it)[columns[k]].template get<int>() + counts[k];
}

void sort_rows(nlohmann::json& table, const char* key_name) {
  std::sort(table.begin(), table.end(), [key_name](const nlohmann::json& a, const nlohmann::json& b) {
    return a.value(key_name, "") < b.value(key_name, "");
  });
}

// The memory table's row of a scenario: stage, model, offload, dtype.
std::string memory_row(const Scenario& s) {
  const std::string model = s.checkpointing.empty() ? s.model : s.model + " checkpointing " + s.checkpointing;
  return fmt::format("stage {} | {} | offload {} | {}", s.stage, model, s.offload, s.dtype);
}

// Why a scenario's memory was not measured, without the rank that said it first: the same refusal
// on rank 0 and on rank 1 is one reason.
std::string not_measured_reason(const std::string& error) {
  static const std::regex rank(R"(\brank \d+)");
  const std::string reason = std::regex_replace(error, rank, "a rank");
  return reason.empty() ? "no reason given" : reason;
}

// Counts `n` scenarios not measured for `error` (its reason), keeping the first one's description:
// up to kMemoryReasons reasons apart, the scenarios of any further reason in one count.
void add_not_measured(nlohmann::json& m, const std::string& error, int n,
                      const std::string& first) {
  const std::string reason = not_measured_reason(error);
  nlohmann::json& reasons = m["not_measured_reasons"];
  if (reasons.is_null()) reasons = nlohmann::json::array();
  auto it = std::find_if(reasons.begin(), reasons.end(),
                         [&](const nlohmann::json& r) { return r.value("reason", "") == reason; });
  if (it != reasons.end()) {
    (*it)["scenarios"] = it->value("scenarios", 0) + n;
  } else if (reasons.size() < kMemoryReasons) {
    reasons.push_back({{"reason", reason}, {"scenarios", n}, {"first", first}});
  } else {
    m["not_measured_other_reasons"] = m.value("not_measured_other_reasons", 0) + n;
  }
}

// Adds one scenario's memory comparison to a count's "memory" object.
void count_memory(nlohmann::json& m, const Scenario& s, const DeepSpeedMemoryComparison& c) {
  const std::string v = c.verdict();
  const std::array<int, kMemoryColumns.size()> counts = {1,           v == "exact",  v == "listed",
                                                          v == "within 1%", v == "beyond", !c.measured};
  for (std::size_t k = 0; k < counts.size(); ++k) m[kMemoryColumns[k]] = m.value(kMemoryColumns[k], 0) + counts[k];
  add_row(m["rows"], "row", memory_row(s), kMemoryColumns, counts);
  std::map<std::string, std::array<int, kMemoryCategoryColumns.size()>> by_category;
  for (const MemoryFigure& f : c.figures) {
    auto& row = by_category[f.category];
    row[0] += 1, row[1] += f.exact(), row[2] += !f.listed.empty(), row[3] += f.within_1pct();
  }
  for (const std::string& id : c.classes()) m["listed_by_class"][id] = m["listed_by_class"].value(id, 0) + 1;
  for (const auto& [cat, row] : by_category) add_row(m["categories"], "category", cat, kMemoryCategoryColumns, row);
  if (v == "beyond" && m["examples"].size() < kMemoryExamples) {
    m["examples"].push_back({{"scenario", describe(s)}, {"differences", c.differences(4)}});
  }
  // Every measured scenario that is not exact, for results.json (the report shows the examples):
  // what a campaign left to mend, each replayable alone (its scenario's JSON), without rerunning it.
  if (c.measured && v != "exact") {
    m["not_exact"].push_back({{"scenario", describe(s)}, {"json", to_json(s)}, {"verdict", v},
                              {"differences", c.differences(4)}});
  }
  if (!c.measured) add_not_measured(m, c.error, 1, describe(s));
}

nlohmann::json empty_memory_count() {
  return {{"rows", nlohmann::json::array()}, {"categories", nlohmann::json::array()}, {"listed_by_class", nlohmann::json::object()},
          {"examples", nlohmann::json::array()}, {"not_exact", nlohmann::json::array()},
          {"not_measured_reasons", nlohmann::json::array()}};
}

// The class of an unlisted divergence (Note [Counting the comparison]).
std::string unlisted_key(const Scenario& s, const ReferenceVerdict& v) {
  std::vector<std::string> fields = v.unlisted;
  std::sort(fields.begin(), fields.end());
  fields.erase(std::unique(fields.begin(), fields.end()), fields.end());
  return fmt::format("{} | {}", fmt::join(fields, ","), coverage_cell(s));
}

}  // namespace

std::string coverage_cell(const Scenario& s) {
  return fmt::format("stage {} | {} | comm {} | clip {} | offload {} | {}", s.stage, s.dtype, comm_label(s),
                     s.clip > 0 ? "on" : "off", s.offload, s.optimizer);
}

std::vector<Scenario> reference_coverage_space() {
  std::vector<Scenario> cells;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string dtype : {"f32", "bf16"}) {
      const std::vector<std::string> comms = dtype == "f32" ? std::vector<std::string>{"", "bf16", "f16"}
                                                            : std::vector<std::string>{"", "f32"};
      std::vector<std::string> offloads = {"none"};
      if (stage >= 1) offloads.push_back("optimizer");
      if (stage == 3) offloads.insert(offloads.end(), {"param", "both"});
      for (const std::string& comm : comms) {
        for (double clip : {0.0, 0.5}) {
          for (const std::string& offload : offloads) {
            for (const std::string optimizer : {"SGD", "Adam", "AdamW"}) {
              Scenario s;
              s.stage = stage, s.dtype = dtype, s.comm_dtype = comm, s.clip = clip, s.offload = offload;
              s.optimizer = optimizer;
              cells.push_back(s);
            }
          }
        }
      }
    }
  }
  return cells;
}

std::vector<std::string> reference_coverage_cells() {
  std::vector<std::string> cells;
  for (const Scenario& s : reference_coverage_space()) cells.push_back(coverage_cell(s));
  return cells;
}

nlohmann::json count_conformance(ReferencePools& pools, const std::vector<DivergenceClass>& classes, int cases,
                                 std::uint64_t seed) {
  // The check stashes each evaluation's full verdict; on_case (once per case, before any shrink)
  // counts the case's. None stashed: the comparison raised (a worker crashed or hung, a RankFailure
  // naming it), which is counted as an error, never as a verdict.
  const std::size_t deaths_before = pools.idle_deaths().size();
  auto last = std::make_shared<std::optional<std::pair<ReferenceVerdict, double>>>();
  auto last_memory = std::make_shared<DeepSpeedMemoryComparison>();
  Invariant inv;
  inv.name = kConformanceInvariant;
  inv.gen = gen_reference_scenario;
  inv.check = [&pools, &classes, last, last_memory](const Scenario& s, const CheckContext&) {
    if (!reference_comparable(s)) return Verdict{false, true, reference_unexpressible(s), 0};
    last->reset();
    const ReferenceComparison c = compare_with_deepspeed(s, pools, /*memory=*/true);
    *last = std::make_pair(classify(s, c, classes), c.ds_seconds);
    *last_memory = c.memory;
    list_memory_differences(s, *last_memory, classes);
    return (*last)->first.verdict;
  };
  nlohmann::json j = {{"seeds", {seed}}, {"cases", 0}, {"matched", 0}, {"values_bit_for_bit", 0}, {"listed", 0},
                      {"refused_by_both", 0}, {"unlisted", 0}, {"listed_by_class", nlohmann::json::object()},
                      {"class_ulps", nlohmann::json::object()}, {"class_rel", nlohmann::json::object()},
                      {"unlisted_classes", nlohmann::json::array()},
                      {"conformance", nlohmann::json::array()}, {"coverage", nlohmann::json::array()},
                      {"deepspeed_seconds", 0.0}, {"scenario_hashes", nlohmann::json::array()}, {"errors", 0},
                      {"error_cases", nlohmann::json::array()}, {"memory", empty_memory_count()}};
  for (const std::string& cell : reference_coverage_cells()) {
    add_row(j["coverage"], "cell", cell, kCoverageColumns, {});
  }
  std::map<std::string, std::size_t> class_at;  // unlisted key -> index in unlisted_classes
  CaseWatch watch;
  watch.on_case = [&](int index, const Scenario& s, const Verdict& given, double) {
    j["cases"] = j["cases"].get<int>() + 1;
    j["scenario_hashes"].push_back(fnv1a(to_json(s).dump()));
    if (!last->has_value()) {  // the comparison raised
      j["errors"] = j["errors"].get<int>() + 1;
      if (j["error_cases"].size() < kMaxErrorCases) {
        j["error_cases"].push_back({{"seed", seed}, {"index", index}, {"failure", given.failure}, {"scenario", to_json(s)}});
      }
      return;
    }
    const ReferenceVerdict& v = (*last)->first;
    j["deepspeed_seconds"] = j["deepspeed_seconds"].get<double>() + (*last)->second;
    const bool matched = v.matched && !v.refused, listed = v.verdict.holds && !v.matched && !v.refused;
    const bool unlisted = !v.verdict.holds && !v.refused;
    const std::pair<const char*, bool> counts[] = {{"matched", matched}, {"values_bit_for_bit", v.values_match},
                                                   {"listed", listed}, {"refused_by_both", v.refused},
                                                   {"unlisted", unlisted}};
    for (const auto& [k, on] : counts) j[k] = j[k].get<int>() + (on ? 1 : 0);
    for (const std::string& id : v.classes) j["listed_by_class"][id] = j["listed_by_class"].value(id, 0) + 1;
    for (const auto& [id, u] : v.class_ulps) {
      j["class_ulps"][id] = std::max(j["class_ulps"].value(id, std::int64_t{-1}), u);
    }
    for (const auto& [id, r] : v.class_rel) j["class_rel"][id] = std::max(j["class_rel"].value(id, -1.0), r);
    for (const std::string& f : features(s)) {
      add_row(j["conformance"], "feature", f, kTableColumns,
              {1, v.values_match, v.comm_match, listed, v.refused, !v.verdict.holds});
    }
    add_row(j["coverage"], "cell", coverage_cell(s), kCoverageColumns, {1, matched, listed, unlisted});
    count_memory(j["memory"], s, *last_memory);
  };
  watch.on_failure = [&](int index, const Scenario& s, const Verdict& verdict) {
    if (!last->has_value()) return false;  // an error, counted by on_case: a crash is not shrunk
    const std::string key = unlisted_key(s, (*last)->first);
    if (const auto it = class_at.find(key); it != class_at.end()) {
      nlohmann::json& k = j["unlisted_classes"][it->second];
      k["cases"] = k["cases"].get<int>() + 1;
      return false;
    }
    const bool shrink = static_cast<int>(class_at.size()) < kMaxUnlistedShrinks;
    class_at[key] = j["unlisted_classes"].size();
    j["unlisted_classes"].push_back({{"key", key}, {"cases", 1}, {"seed", seed}, {"index", index},
                                     {"failure", verdict.failure}, {"scenario", to_json(s)}, {"shrunk", shrink}});
    return shrink;
  };
  const Campaign c = run_campaign_range(inv, CheckContext{}, {0, cases, cases}, seed, watch);
  j["discarded"] = c.discarded;
  for (const ShrunkFailure& f : c.shrunk) {
    for (nlohmann::json& k : j["unlisted_classes"]) {
      if (k.value("index", -1) != f.index || k.value("seed", std::uint64_t{0}) != seed) continue;
      k["counterexample"] = to_json(f.counterexample);
      k["counterexample_failure"] = f.verdict.failure;
      k["trace_hash"] = f.verdict.trace_hash;
      k["reproduce"] = f.reproduce;
      k["shrink_steps"] = f.shrink_steps;
    }
  }
  sort_rows(j["conformance"], "feature");
  sort_rows(j["memory"]["rows"], "row");
  sort_rows(j["memory"]["categories"], "category");
  const std::vector<std::string> deaths = pools.idle_deaths();
  j["worker_deaths_while_idle"] = std::vector<std::string>(deaths.begin() + static_cast<std::ptrdiff_t>(deaths_before), deaths.end());
  return j;
}

void merge_conformance_counts(nlohmann::json& into, const nlohmann::json& more) {
  if (into.is_null()) {
    into = more;
    return;
  }
  for (const char* k :
       {"cases", "discarded", "matched", "values_bit_for_bit", "listed", "refused_by_both", "unlisted", "errors"}) {
    into[k] = into.value(k, 0) + more.value(k, 0);
  }
  into["deepspeed_seconds"] = into.value("deepspeed_seconds", 0.0) + more.value("deepspeed_seconds", 0.0);
  for (const auto& s : more.at("seeds")) into["seeds"].push_back(s);
  for (const auto& d : more.value("worker_deaths_while_idle", nlohmann::json::array())) {
    into["worker_deaths_while_idle"].push_back(d);
  }
  for (const auto& e : more.value("error_cases", nlohmann::json::array())) {
    if (into["error_cases"].size() < kMaxErrorCases) into["error_cases"].push_back(e);
  }
  for (const auto& [id, n] : more.at("listed_by_class").items()) {
    into["listed_by_class"][id] = into["listed_by_class"].value(id, 0) + n.get<int>();
  }
  for (const auto& [id, u] : more.at("class_ulps").items()) {
    into["class_ulps"][id] = std::max(into["class_ulps"].value(id, std::int64_t{-1}), u.get<std::int64_t>());
  }
  const nlohmann::json more_rel = more.value("class_rel", nlohmann::json::object());
  for (const auto& [id, r] : more_rel.items()) {
    into["class_rel"][id] = std::max(into["class_rel"].value(id, -1.0), r.get<double>());
  }
  for (const nlohmann::json& row : more.at("conformance")) {
    std::array<int, kTableColumns.size()> counts{};
    for (std::size_t k = 0; k < counts.size(); ++k) counts[k] = row.value(kTableColumns[k], 0);
    add_row(into["conformance"], "feature", row.value("feature", ""), kTableColumns, counts);
  }
  sort_rows(into["conformance"], "feature");
  for (const nlohmann::json& row : more.at("coverage")) {
    std::array<int, kCoverageColumns.size()> counts{};
    for (std::size_t k = 0; k < counts.size(); ++k) counts[k] = row.value(kCoverageColumns[k], 0);
    add_row(into["coverage"], "cell", row.value("cell", ""), kCoverageColumns, counts);
  }
  if (more.contains("memory")) {
    nlohmann::json& m = into["memory"];
    if (m.is_null()) m = empty_memory_count();
    const nlohmann::json& o = more["memory"];
    for (const char* k : kMemoryColumns) m[k] = m.value(k, 0) + o.value(k, 0);
    for (const nlohmann::json& row : o.value("rows", nlohmann::json::array())) {
      std::array<int, kMemoryColumns.size()> counts{};
      for (std::size_t k = 0; k < counts.size(); ++k) counts[k] = row.value(kMemoryColumns[k], 0);
      add_row(m["rows"], "row", row.value("row", ""), kMemoryColumns, counts);
    }
    for (const nlohmann::json& row : o.value("categories", nlohmann::json::array())) {
      std::array<int, kMemoryCategoryColumns.size()> counts{};
      for (std::size_t k = 0; k < counts.size(); ++k) counts[k] = row.value(kMemoryCategoryColumns[k], 0);
      add_row(m["categories"], "category", row.value("category", ""), kMemoryCategoryColumns, counts);
    }
    const nlohmann::json listed = o.value("listed_by_class", nlohmann::json::object());
    for (const auto& [id, n] : listed.items()) m["listed_by_class"][id] = m["listed_by_class"].value(id, 0) + n.get<int>();
    for (const nlohmann::json& e : o.value("examples", nlohmann::json::array())) {
      if (m["examples"].size() < kMemoryExamples) m["examples"].push_back(e);
    }
    for (const nlohmann::json& e : o.value("not_exact", nlohmann::json::array())) {
      m["not_exact"].push_back(e);
    }
    for (const nlohmann::json& r : o.value("not_measured_reasons", nlohmann::json::array())) {
      add_not_measured(m, r.value("reason", ""), r.value("scenarios", 0), r.value("first", ""));
    }
    if (const int other = o.value("not_measured_other_reasons", 0); other > 0) {
      m["not_measured_other_reasons"] = m.value("not_measured_other_reasons", 0) + other;
    }
    sort_rows(m["rows"], "row");
    sort_rows(m["categories"], "category");
  }
  // An unlisted class seen again adds its count; the first shrunk case found is the one kept.
  for (const nlohmann::json& k : more.at("unlisted_classes")) {
    auto it = std::find_if(into["unlisted_classes"].begin(), into["unlisted_classes"].end(),
                           [&](const nlohmann::json& e) { return e.value("key", "") == k.value("key", ""); });
    if (it == into["unlisted_classes"].end()) {
      into["unlisted_classes"].push_back(k);
      continue;
    }
    const int seen = it->value("cases", 0) + k.value("cases", 0);
    if (!it->contains("counterexample") && k.contains("counterexample")) *it = k;
    (*it)["cases"] = seen;
  }
}

nlohmann::json coverage_summary(const nlohmann::json& count) {
  int cells = 0, drawn = 0;
  nlohmann::json never = nlohmann::json::array();
  for (const nlohmann::json& row : count.value("coverage", nlohmann::json::array())) {
    ++cells;
    if (row.value("scenarios", 0) > 0) ++drawn;
    else never.push_back(row.value("cell", ""));
  }
  return {{"cells", cells}, {"drawn", drawn}, {"never_drawn", never}};
}

nlohmann::json coverage_grid(const nlohmann::json& count) {
  std::map<std::string, int> by_cell;
  for (const nlohmann::json& row : count.value("coverage", nlohmann::json::array())) {
    by_cell[row.value("cell", "")] = row.value("scenarios", 0);
  }
  const std::vector<std::string> offloads = {"none", "optimizer", "param", "both"};
  nlohmann::json columns = nlohmann::json::array(), rows = nlohmann::json::array();
  for (const char* clip : {"off", "on"}) {
    for (const std::string& o : offloads) columns.push_back(fmt::format("clip {}, offload {}", clip, o));
  }
  for (int stage = 0; stage <= 3; ++stage) {
    for (const auto& [dtype, comm] : std::vector<std::pair<std::string, std::string>>{
             {"f32", ""}, {"f32", "bf16"}, {"f32", "f16"}, {"bf16", ""}, {"bf16", "f32"}}) {
      nlohmann::json cells = nlohmann::json::array();
      for (const double clip : {0.0, 0.5}) {
        for (const std::string& offload : offloads) {
          int total = 0, missing = 0, reachable = 0;
          for (const std::string optimizer : {"SGD", "Adam", "AdamW"}) {
            Scenario s;
            s.stage = stage, s.dtype = dtype, s.comm_dtype = comm, s.clip = clip, s.offload = offload;
            s.optimizer = optimizer;
            const auto it = by_cell.find(coverage_cell(s));
            if (it == by_cell.end()) continue;
            ++reachable;
            total += it->second;
            missing += it->second == 0;
          }
          if (reachable == 0) cells.push_back("-");
          else if (missing == 0 || total == 0) cells.push_back(fmt::format("{}", total));
          else cells.push_back(fmt::format("{} ({}/3)", total, 3 - missing));
        }
      }
      Scenario s;
      s.comm_dtype = comm;
      rows.push_back({{"row", fmt::format("stage {}, {}, comm {}", stage, dtype, comm_label(s))}, {"cells", cells}});
    }
  }
  return {{"columns", columns}, {"rows", rows},
          {"what", "scenarios drawn per cell, summed over SGD, Adam and AdamW ('(k/3)': only k of the three optimizers "
                   "drawn; '-': not a configuration the generator draws)"}};
}

}  // namespace zc::props
