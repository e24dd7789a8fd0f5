// The soak run (props/soak.h).
#include "props/soak.h"

#include "engine/errors.h"
#include "engine/rng.h"
#include "props/reference.h"
#include "props/stopwatch.h"
#include "props/work_items.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <map>

namespace zc::props {

namespace {

std::uint64_t round_seed(std::uint64_t seed, std::int64_t round) {
  return fnv1a(fmt::format("soak {} {}", seed, round));
}

}  // namespace

nlohmann::json to_json(const SoakReport& r) {
  return {{"zerocheck", "soak"},
          {"passed", r.passed()},
          {"cases", r.cases},
          {"discarded", r.discarded},
          {"distinct_scenarios", r.distinct},
          {"reruns", r.reruns},
          {"mismatches", r.mismatches},
          {"mismatch_details", r.mismatch_details},
          {"failures", r.failures},
          {"items", r.items},
          {"rounds", r.rounds},
          {"item_errors", r.item_errors},
          {"slowest", {{"seconds", r.slowest.seconds}, {"invariant", r.slowest.invariant},
                       {"round_seed", r.slowest.seed}, {"index", r.slowest.index},
                       {"scenario", r.slowest.scenario}}},
          {"reference", r.reference},
          {"seconds", r.seconds},
          {"ranks", r.ranks},
          {"jobs", r.jobs}};
}

SoakJob::SoakJob(const SoakOptions& opts) : opts_(opts) {
  std::vector<std::string> only = opts_.only;
  const auto ds = std::find(only.begin(), only.end(), "deepspeed");
  if (ds != only.end()) {
    if (opts_.deepspeed_cases_per_item < 1) throw ConfigError("--only deepspeed needs --against deepspeed");
    only.erase(ds);
  }
  deepspeed_ = opts_.deepspeed_cases_per_item > 0;
  only = expand_invariant_names(only);  // I1 .. I4 as short ids; ConfigError naming the known ones
  const bool engine = opts_.only.empty() || !only.empty();  // --only deepspeed alone: no engine invariant
  for (const Invariant& i : invariants()) {
    if (engine && (only.empty() || std::find(only.begin(), only.end(), i.name) != only.end())) invs_.push_back(&i);
  }
  ZC_ASSERT(kinds() > 0, "a soak run with no invariant");
  if (opts_.cases_per_item < 1) throw UsageError("soak: cases per item must be >= 1");
}

std::string SoakJob::name(std::size_t item) const {
  const Invariant* inv = invariant_of(item);
  return fmt::format("round {} {}", item / kinds(), inv != nullptr ? inv->name : "deepspeed");
}

std::uint64_t SoakJob::fingerprint() const {
  std::string key = fmt::format("soak|{}|{}|{}|{}", opts_.seed, opts_.cases_per_item, opts_.rerun_every,
                                opts_.deepspeed_cases_per_item);
  for (const Invariant* inv : invs_) key += "|" + inv->name;
  return fnv1a(key);
}

// The DeepSpeed comparison's round: fresh pools in this child (they die with it), every case
// counted. Its rounds' seeds are the engine invariants' (round_seed), so a round replays alike.
nlohmann::json SoakJob::run_deepspeed(std::uint64_t seed) const {
  ReferencePools pools(reference_env());
  nlohmann::json count = count_conformance(pools, load_divergence_classes(divergence_classes_file()),
                                           opts_.deepspeed_cases_per_item, seed);
  const int cases = count.value("cases", 0), discarded = count.value("discarded", 0);
  return {{"invariant", "deepspeed"}, {"seed", seed}, {"cases", cases}, {"discarded", discarded},
          {"reference", std::move(count)}};
}

nlohmann::json SoakJob::run(std::size_t item) const {
  const std::uint64_t seed = round_seed(opts_.seed, static_cast<std::int64_t>(item / kinds()));
  if (invariant_of(item) == nullptr) return run_deepspeed(seed);
  const Invariant& inv = *invariant_of(item);
  nlohmann::json hashes = nlohmann::json::array();
  nlohmann::json slowest = {{"seconds", -1.0}};
  CaseWatch watch;
  watch.rerun_every = opts_.rerun_every;
  watch.on_case = [&](int index, const Scenario& s, const Verdict& v, double seconds) {
    const nlohmann::json j = to_json(s);
    hashes.push_back(fnv1a(j.dump()));
    if (seconds > slowest.value("seconds", -1.0)) {
      slowest = {{"seconds", seconds}, {"index", index}, {"scenario", j}, {"holds", v.holds},
                 {"trace_hash", v.trace_hash}};
    }
  };
  const int n = opts_.cases_per_item;
  const Campaign c = run_campaign_range(inv, CheckContext{{}, opts_.hooks}, {0, n, n}, seed, watch);
  nlohmann::json out = {{"invariant", inv.name}, {"seed", seed}, {"cases", c.cases}, {"discarded", c.discarded},
                        {"reruns", c.reruns}, {"mismatches", c.rerun_mismatches}, {"detail", c.rerun_detail},
                        {"hashes", hashes}, {"slowest", slowest}, {"failed", c.failed}};
  if (c.failed) {
    const SavedCase saved{c.counterexample, inv.name, {}, false, c.verdict.trace_hash, c.verdict.failure,
                          c.reproduce, seed};
    out["failure"] = c.verdict.failure;
    out["saved_case"] = to_json(saved);
  }
  return out;
}

// A DeepSpeed round: its counts merged; an unlisted class new to the soak saves its shrunk case.
void SoakJob::add_deepspeed(std::size_t item, const nlohmann::json& res) {
  SoakReport& t = totals_;
  t.cases += res.value("cases", 0);
  t.discarded += res.value("discarded", 0);
  const nlohmann::json& count = res["reference"];
  for (const std::uint64_t h : count.value("scenario_hashes", std::vector<std::uint64_t>{})) scenarios_.insert(h);
  t.distinct = static_cast<std::int64_t>(scenarios_.size());
  std::map<std::string, bool> known;  // unlisted classes the soak has seen -> one of them was shrunk
  if (!t.reference.is_null()) {
    for (const nlohmann::json& k : t.reference["unlisted_classes"]) known[k.value("key", "")] = k.contains("counterexample");
  }
  nlohmann::json more = count;
  more.erase("scenario_hashes");
  int n = 0;
  for (nlohmann::json& k : more["unlisted_classes"]) {
    ++n;
    const auto seen = known.find(k.value("key", ""));
    if (seen != known.end() && (seen->second || !k.contains("counterexample"))) continue;  // nothing new to save
    std::string saved = "not shrunk: the scenario is in soak.json";
    if (k.contains("counterexample")) {  // the class's first shrunk case, in this round or a later one
      const std::filesystem::path file = opts_.out / "counterexamples" / fmt::format("{}-{}-{}.json", kConformanceInvariant, item, n);
      save_case({scenario_from_json(k["counterexample"]), kConformanceInvariant, {}, false,
                 k.value("trace_hash", std::uint64_t{0}), k.value("counterexample_failure", ""), k.value("reproduce", ""),
                 k.value("seed", std::uint64_t{0})}, file);
      k["scenario_file"] = file.string();
      saved = "saved: " + file.string();
    }
    if (seen == known.end()) {
      t.failures.push_back(fmt::format("{}: unlisted divergence, class {}: {} ({})", name(item), k.value("key", ""),
                                       k.value("failure", ""), saved));
    }
  }
  if (more.value("errors", 0) > 0) {
    const nlohmann::json first = more.value("error_cases", nlohmann::json::array());
    t.failures.push_back(fmt::format("{}: {} comparisons raised; the first: {}", name(item), more.value("errors", 0),
                                     first.empty() ? "" : first[0].value("failure", "")));
  }
  merge_conformance_counts(t.reference, more);
}

void SoakJob::add(std::size_t item, const nlohmann::json& r) {
  SoakReport& t = totals_;
  ++t.items;
  t.rounds = std::max<std::int64_t>(t.rounds, static_cast<std::int64_t>(item / kinds()) + 1);
  if (!r.value("ok", false)) {
    ++t.item_errors;
    t.failures.push_back(fmt::format("{}: {}", name(item), r.value("error", "unknown")));
    return;
  }
  const nlohmann::json& res = r["result"];
  if (res.contains("reference")) return add_deepspeed(item, res);
  t.cases += res.value("cases", 0);
  t.discarded += res.value("discarded", 0);
  t.reruns += res.value("reruns", 0);
  t.mismatches += res.value("mismatches", 0);
  if (!res.value("detail", "").empty()) t.mismatch_details.push_back(name(item) + ": " + res.value("detail", ""));
  for (const auto& h : res["hashes"]) scenarios_.insert(h.get<std::uint64_t>());
  t.distinct = static_cast<std::int64_t>(scenarios_.size());
  const nlohmann::json& slow = res["slowest"];
  if (slow.value("seconds", -1.0) > t.slowest.seconds) {
    t.slowest = {slow.value("seconds", 0.0), res.value("invariant", ""), res.value("seed", std::uint64_t{0}),
                 slow.value("index", 0), slow.value("scenario", nlohmann::json()), slow.value("holds", true),
                 slow.value("trace_hash", std::uint64_t{0})};
  }
  if (res.value("failed", false)) {
    const std::string inv = res.value("invariant", "");
    if (inv == "determinism-same-trace-hash") ++t.mismatches;
    const std::filesystem::path file = opts_.out / "counterexamples" / fmt::format("{}-{}.json", inv, item);
    save_case(saved_case_from_json(res["saved_case"]), file);
    t.failures.push_back(fmt::format("{}: {} (saved: {})", name(item), res.value("failure", ""), file.string()));
  }
}

SoakReport SoakJob::report(double seconds, int ranks) const {
  SoakReport r = totals_;
  r.seconds = seconds;
  r.ranks = ranks;
  r.jobs = opts_.jobs;
  return r;
}

Dispatch soak_dispatch(SoakJob& job, const SoakOptions& opts, const Stopwatch& watch, int ranks,
                       const std::function<void(const SoakReport&)>& progress) {
  Dispatch d;
  d.run = [&job](std::size_t i, int) { return job.run(i); };
  d.next = [&opts, next = std::size_t{0}]() mutable -> std::optional<std::size_t> {
    if (!opts.keep_going()) return std::nullopt;
    return next++;
  };
  d.land = [&job, &watch, ranks, progress](std::size_t i, const nlohmann::json& r) {
    job.add(i, r);
    if (progress) progress(job.report(watch.seconds(), ranks));
  };
  return d;
}

SoakReport run_soak(const SoakOptions& opts, const std::function<void(const SoakReport&)>& progress) {
  const Stopwatch watch;
  SoakJob job(opts);
  run_locally(soak_dispatch(job, opts, watch, 1, progress), opts.jobs);
  const SoakReport r = job.report(watch.seconds(), 1);
  write_soak(r, opts.out);
  return r;
}

void write_soak(const SoakReport& r, const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  std::ofstream(out / "soak.json") << to_json(r).dump(2) << "\n";
  if (r.slowest.scenario.is_null()) return;
  // The slowest case as a counterexample file, so `zerocheck replay out/slowest.json` reruns it.
  const SoakSlowest& s = r.slowest;
  save_case({scenario_from_json(s.scenario), s.invariant, {}, s.holds, s.trace_hash, "", "", s.seed},
            out / "slowest.json");
}

}  // namespace zc::props
