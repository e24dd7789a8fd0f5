// The verify job (props/verify.h): its work items, and the merge of their results into the
// report. Running the items is props/work_items.h (one process) or real/verify_mpi.h (MPI ranks).
//
// Note [Work items]: the items depend on the options alone. An invariant's campaign is cut into
// ranges of kCasesPerItem cases (Note [Indexed cases] makes the cut invisible); a bug hunt stays
// one item, since it tries invariants in order until one catches the bug; each proof is an item.
// Items return JSON, counterexamples included as data: only the merging process writes files, so
// ranks on other nodes need no shared file system.
#include "props/verify.h"

#include "engine/errors.h"
#include "engine/rng.h"
#include "props/reference.h"
#include "props/stopwatch.h"
#include "props/work_items.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <fstream>
#include <map>

namespace zc::props {

namespace {

constexpr int kCasesPerItem = 250;  // an invariant's campaign is cut into items of this many cases

std::string hex(std::uint64_t v) { return fmt::format("0x{:016x}", v); }

// The determinism self-check on a saved counterexample: reload it and rerun it exactly.
struct Replays {
  int runs = 0, mismatches = 0;
  std::string detail;
  // Through the file format (as text), then rerun: the saved case must give the same verdict.
  void check(const SavedCase& saved, const Invariant& inv, const RunHooks& hooks) {
    const SavedCase back = saved_case_from_json(nlohmann::json::parse(to_json(saved).dump()));
    const Verdict again = inv.check(back.scenario, CheckContext{back.bugs, hooks});
    ++runs;
    if (again.holds != back.holds || again.trace_hash != back.trace_hash) {
      ++mismatches;
      detail = fmt::format("{}: replay gave {} with trace hash {}, saved {} with {}", saved.invariant,
                           again.holds ? "holds" : "fails", hex(again.trace_hash), back.holds ? "holds" : "fails",
                           hex(back.trace_hash));
    }
  }
  void write(nlohmann::json& j) const {
    j["replays"] = runs;
    j["replay_mismatches"] = mismatches;
    j["replay_detail"] = detail;
  }
  // The counts an item's result carries (write()'s keys), added to these.
  void add(const nlohmann::json& res) {
    runs += res.value("replays", 0);
    mismatches += res.value("replay_mismatches", 0);
    if (!res.value("replay_detail", "").empty()) detail = res.value("replay_detail", "");
  }
};

// The saved counterexample travels in the item's result; merge() writes it under out/.
void attach_case(nlohmann::json& j, const SavedCase& saved, const std::string& file) {
  j["saved_case"] = to_json(saved);
  j["saved_file"] = file;
}

// One range of an invariant's campaign on the correct engine.
nlohmann::json invariant_range_item(const Invariant& inv, const VerifyOptions& opts, CaseRange range) {
  const Campaign c = run_campaign_range(inv, CheckContext{{}, opts.hooks}, range, opts.seed);
  nlohmann::json j = {{"name", inv.name}, {"first", range.first}, {"last", range.last}, {"cases", c.cases},
                      {"discarded", c.discarded}, {"seconds", c.seconds}, {"failed", c.failed},
                      {"first_failing", c.first_failing}};
  Replays replays;
  if (c.failed) {
    j["failure"] = c.verdict.failure;
    j["counterexample"] = to_json(c.counterexample);
    j["reproduce"] = c.reproduce;
    const SavedCase saved{c.counterexample, inv.name, {}, false, c.verdict.trace_hash, c.verdict.failure,
                          c.reproduce, opts.seed};
    attach_case(j, saved, fmt::format("counterexamples/{}.json", inv.name));
    replays.check(saved, inv, opts.hooks);
  }
  replays.write(j);
  return j;
}

// A bug's campaign caught it: the shrunk case into the result, saved and replayed.
void record_catch(BugResult& r, nlohmann::json& extra, Replays& replays, const Campaign& c, const Invariant& inv,
                  const BugSet& bugs, std::uint64_t seed, const RunHooks& hooks) {
  r.caught = true;
  r.by = inv.name;
  r.shrink_steps = c.shrink_steps;
  r.failure = c.verdict.failure;
  r.scenario = to_json(c.counterexample);
  r.reproduce = c.reproduce;
  const SavedCase saved{c.counterexample, inv.name, bugs, false, c.verdict.trace_hash, c.verdict.failure,
                        c.reproduce, seed};
  attach_case(extra, saved, fmt::format("counterexamples/{}-{}.json", r.id, inv.name));
  replays.check(saved, inv, hooks);
}

nlohmann::json bug_json(const BugResult& r, const nlohmann::json& extra, const Replays& replays) {
  VerifyReport one;
  one.bugs.push_back(r);
  nlohmann::json j = to_json(one)["known_bugs"][0];
  j.update(extra);
  replays.write(j);
  return j;
}

// SPEC's "caught by" ids, in the invariant names they stand for.
bool expected_catcher(const std::string& caught_by, const std::string& inv) {
  if (inv.rfind("I1-", 0) == 0 && caught_by.find("I1") != std::string::npos) return true;
  if (inv.rfind("I2-", 0) == 0 && caught_by.find("I2") != std::string::npos) return true;
  if (inv.rfind("I3-", 0) == 0 && caught_by.find("I3") != std::string::npos) return true;
  if (inv.rfind("I4-", 0) == 0 && caught_by.find("I4") != std::string::npos) return true;
  if (inv == "sharded-parity" && caught_by.find("parity") != std::string::npos) return true;
  if (inv == "cross-rank-consistency" && caught_by.find("cross-rank") != std::string::npos) return true;
  return false;
}

nlohmann::json bug_item(const KnownBugInfo& bug, const VerifyOptions& opts, const std::vector<const Invariant*>& invs) {
  BugResult r;
  r.id = std::string(bug.code);
  r.summary = std::string(bug.summary);
  r.expected_by = std::string(bug.caught_by);
  std::vector<const Invariant*> order;
  for (const Invariant* i : invs) {
    if (expected_catcher(r.expected_by, i->name)) order.push_back(i);
  }
  for (const Invariant* i : invs) {
    if (!expected_catcher(r.expected_by, i->name)) order.push_back(i);
  }
  const CheckContext ctx{BugSet{bug.id}, opts.hooks};
  const std::uint64_t seed = opts.seed ^ fnv1a(r.id);
  const Stopwatch watch;
  Replays replays;
  nlohmann::json extra = nlohmann::json::object();
  for (const Invariant* inv : order) {
    const Campaign c = run_campaign(*inv, ctx, opts.profile.bug_cases, seed);
    r.cases_to_catch += c.cases;
    if (!c.failed) continue;
    record_catch(r, extra, replays, c, *inv, ctx.bugs, seed, opts.hooks);
    break;
  }
  r.seconds = watch.seconds();
  return bug_json(r, extra, replays);
}

// A hazard is hunted like a known bug that DeepSpeed always has: its property must fail on the
// correct engine, with no bug switched on; the shrunk counterexample is saved and replayed.
nlohmann::json hazard_item(const Hazard& h, const VerifyOptions& opts) {
  BugResult r;
  r.id = h.code;
  r.summary = h.summary;
  r.expected_by = h.property.name;
  const std::uint64_t seed = opts.seed ^ fnv1a(r.id);
  const Stopwatch watch;
  Replays replays;
  nlohmann::json extra = nlohmann::json::object();
  const Campaign c = run_campaign(h.property, CheckContext{{}, opts.hooks}, opts.profile.bug_cases, seed);
  r.cases_to_catch = c.cases;
  if (c.failed) {
    record_catch(r, extra, replays, c, h.property, {}, seed, opts.hooks);
  } else if (!c.error.empty()) {
    r.failure = c.error;
  } else {
    r.failure = fmt::format("the property held on {} scenarios: the engine no longer does what DeepSpeed does here", c.cases);
  }
  r.seconds = watch.seconds();
  return bug_json(r, extra, replays);
}

nlohmann::json proof_item(const ProofTask& task) {
  VerifyReport one;
  one.proofs.push_back(task.run());
  return to_json(one)["proofs"][0];
}

// Collectives per step (rank 0), baseline vs coalesced, on a fixed world-4 Synthetic model.
nlohmann::json collectives_item(const VerifyOptions& opts) {
  VerifyReport one;
  for (int stage = 1; stage <= 3; ++stage) {
    for (int n = 1; n <= 4; ++n) {
      Scenario s;
      s.world = 4;
      s.stage = stage;
      s.n = n;
      s.steps = 2;
      s.shape = {5, 3, 23, 1, 4};
      s.reduce_bucket_size = 8;
      s.overlap = true;
      CollectivePoint p{stage, n, 0, 0};
      for (bool co : {false, true}) {
        s.coalesce = co;
        RunSpec spec = to_run_spec(s, {}, opts.hooks);
        spec.collect_grads = false;
        const RunResult rr = run_on_sim(spec);
        const double per_step = static_cast<double>(rr.comm.at(0).total_calls()) / s.steps;
        (co ? p.coalesced : p.baseline) = per_step;
      }
      one.collectives.push_back(p);
    }
  }
  return to_json(one)["collectives_per_step"];
}


// Invariant results from their range items: ranges in order, cases counted up to the lowest
// failing range, whose shrunk case is the invariant's counterexample.
InvariantResult merge_ranges(const Invariant& inv, const std::vector<const nlohmann::json*>& ranges, Replays& replays,
                             const nlohmann::json** chosen) {
  InvariantResult r;
  r.name = inv.name;
  r.explanation = inv.explanation;
  for (const nlohmann::json* j : ranges) {
    if (!j->value("ok", false)) {
      r.holds = false;
      r.failure = j->value("error", "unknown");
      return r;
    }
    const nlohmann::json& res = (*j)["result"];
    r.seconds += res.value("seconds", 0.0);
    replays.add(res);
    if (*chosen != nullptr) continue;  // past the lowest failure: its cases do not count
    r.cases += res.value("cases", 0);
    r.discarded += res.value("discarded", 0);
    if (res.value("failed", false)) {
      r.holds = false;
      r.failure = res.value("failure", "");
      r.counterexample = res.value("counterexample", nlohmann::json());
      r.reproduce = res.value("reproduce", "");
      *chosen = &res;
    }
  }
  return r;
}

// verify --config: a counterexample's ds_config beside its scenario file (X.json -> X.ds_config.json).
std::string write_ds_config(const nlohmann::json& scenario, const std::string& scenario_file) {
  const std::string file = scenario_file.substr(0, scenario_file.size() - 5) + ".ds_config.json";
  nlohmann::json j = ds_config(scenario_from_json(scenario));
  j["train_micro_batch_size_per_gpu"] = kScenarioMicroBatch;  // the batch the scenario ran with
  std::ofstream(file) << j.dump(2) << "\n";
  return file;
}

void write_saved(const nlohmann::json& res, const std::filesystem::path& out, std::string& scenario_file) {
  if (!res.contains("saved_case")) return;
  const std::filesystem::path file = out / res.value("saved_file", "counterexamples/unnamed.json");
  save_case(saved_case_from_json(res["saved_case"]), file);
  scenario_file = file.string();
}

}  // namespace

std::vector<std::string> expand_invariant_names(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    std::vector<std::string> matched;
    for (const Invariant& i : invariants()) {
      // The full name, or its short id: "I1" selects every "I1-..." (case-insensitive id).
      std::string id = name;
      for (char& c : id) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (i.name == name || (id.size() >= 2 && i.name.rfind(id + "-", 0) == 0)) matched.push_back(i.name);
    }
    if (matched.empty()) {
      std::vector<std::string> all;
      for (const Invariant& i : invariants()) all.push_back(i.name);
      throw ConfigError(fmt::format("--only: no invariant '{}'; give a short id (I1, I2, I3, I4) or a name: {}", name,
                                    fmt::join(all, ", ")));
    }
    for (std::string& m : matched) {
      if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(std::move(m));
    }
  }
  return out;
}

VerifyJob::VerifyJob(const VerifyOptions& opts) : opts_(opts) {
  opts_.only = expand_invariant_names(opts_.only);
  for (const Invariant& i : invariants()) {
    if (!opts_.only.empty() && std::find(opts_.only.begin(), opts_.only.end(), i.name) == opts_.only.end()) continue;
    if (!opts_.user_config) {
      invs_.push_back(&i);
      continue;
    }
    // verify --config: the invariant around the user's config, or n/a naming the setting it never takes.
    const std::string why = not_applicable_reason(i, *opts_.user_config);
    if (!why.empty()) {
      not_applicable_.emplace_back(i.name, why);
      continue;
    }
    pinned_.push_back(pinned(i, *opts_.user_config));
    invs_.push_back(&pinned_.back());
  }
  // --only judges what it selects: without --bugs, the hunts are those of the known bugs one of
  // the selected invariants is expected to catch (a hunt through an invariant that cannot see
  // the bug would report it missed, failing a run that asked about something else).
  std::vector<KnownBugInfo> bugs;
  for (const KnownBugInfo& b : known_bugs()) {
    const bool asked = opts_.bugs.empty()
                           ? !opts_.user_config && (opts_.only.empty() || std::any_of(invs_.begin(), invs_.end(), [&](const Invariant* i) {
                               return expected_catcher(std::string(b.caught_by), i->name);
                             }))
                           : std::find(opts_.bugs.begin(), opts_.bugs.end(), std::string(b.code)) != opts_.bugs.end();
    if (asked) bugs.push_back(b);
  }
  for (const std::string& code : opts_.bugs) {  // ConfigError naming an unknown one
    const bool hazard = std::any_of(hazards().begin(), hazards().end(), [&](const Hazard& h) { return h.code == code; });
    if (!hazard) BugSet::parse(code);
  }
  if (!opts_.engine_items) {
    invs_.clear();
    bugs.clear();
  }
  const VerifyOptions& o = opts_;
  // Long items first, so the jobs finish together.
  if (o.proofs) {  // in reverse: the FPA lemmas, the longest items, start first; merge() restores the order
    const std::vector<ProofTask> tasks = proof_tasks(o.profile.proof_timeout_ms);
    for (auto t = tasks.rbegin(); t != tasks.rend(); ++t) {
      items_.push_back({"proof " + t->name, [task = *t] { return proof_item(task); }, Kind::proof, t->name});
    }
  }
  for (const KnownBugInfo& b : bugs) {
    items_.push_back({fmt::format("bug {}", b.code), [this, b] { return bug_item(b, opts_, invs_); }, Kind::bug,
                      std::string(b.code)});
  }
  // DeepSpeed's hazards run with the bug hunts (--bugs H1 selects one; --only an invariant skips them).
  if (o.engine_items && o.only.empty() && !o.user_config) {
    for (const Hazard& h : hazards()) {
      if (!o.bugs.empty() && std::find(o.bugs.begin(), o.bugs.end(), h.code) == o.bugs.end()) continue;
      items_.push_back({fmt::format("bug {}", h.code), [this, &h] { return hazard_item(h, opts_); }, Kind::bug,
                        std::string(h.code)});
    }
  }
  const int cases = o.profile.cases;
  for (const Invariant* inv : invs_) {
    for (int first = 0; first < cases; first += kCasesPerItem) {
      const CaseRange range{first, std::min(cases, first + kCasesPerItem), cases};
      items_.push_back({fmt::format("invariant {} cases {}-{}", inv->name, range.first, range.last),
                        [this, inv, range] { return invariant_range_item(*inv, opts_, range); }, Kind::invariant,
                        inv->name});
    }
  }
  if (o.engine_items && !o.user_config) {
    items_.push_back({"collectives", [this] { return collectives_item(opts_); }, Kind::collectives, ""});
  }
  // The DeepSpeed reference in its own child too: its worker pools live and die with it.
  if (o.deepspeed_cases > 0) {
    items_.push_back({"deepspeed", [this] {
      ReferencePools pools(reference_env(opts_.deepspeed));
      return run_reference_campaigns({opts_.deepspeed_cases, opts_.seed, opts_.out, opts_.deepspeed_i3}, pools);
    }, Kind::deepspeed, ""});
  }
}

nlohmann::json VerifyJob::run(std::size_t i, int attempt) const {
  const Item& item = items_.at(i);
  if (item.name == opts_.faults.crash_item && attempt <= opts_.faults.crash_times) {
    // Die by the signal, as an unsanitized worker does: a sanitizer's handler would turn it into
    // exit 1 (the asan preset).
    std::signal(SIGSEGV, SIG_DFL);
    std::raise(SIGSEGV);
  }
  while (item.name == opts_.faults.hang_item) pause();
  return item.run();
}

std::uint64_t VerifyJob::fingerprint() const {
  std::string key = fmt::format("{}|{}|{}|{}|{}|{}|{}", opts_.profile.name, opts_.profile.cases, opts_.profile.bug_cases,
                                opts_.profile.proof_timeout_ms, opts_.seed, opts_.deepspeed_cases, opts_.deepspeed_i3);
  if (opts_.deepspeed != "deepspeed") key += "|against " + opts_.deepspeed;
  if (opts_.user_config) key += "|config " + opts_.user_config->ds_config.dump();
  for (const Item& item : items_) key += "|" + item.name;
  return fnv1a(key);
}

std::string VerifyJob::describe() const {
  return fmt::format("profile {}, seed {}, {} items (fingerprint {})", opts_.profile.name, opts_.seed, items_.size(),
                     hex(fingerprint()));
}

VerifyReport VerifyJob::merge(const std::vector<nlohmann::json>& results, double seconds, int ranks) const {
  ZC_ASSERT(results.size() == items_.size(), "{} results for {} items", results.size(), items_.size());
  VerifyReport report;
  report.profile = opts_.profile.name;
  report.seed = opts_.seed;
  report.jobs = opts_.jobs;
  report.ranks = ranks;
  report.started = opts_.started;
  std::filesystem::remove_all(opts_.out / "counterexamples");  // no stale cases from an earlier run
  Replays replays;
  std::map<std::string, std::vector<const nlohmann::json*>> ranges;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const nlohmann::json& r = results[i];
    const Item& item = items_[i];
    if (item.kind == Kind::invariant) {
      ranges[item.key].push_back(&r);
      continue;
    }
    if (!r.value("ok", false)) {
      const std::string error = r.value("error", "unknown");
      if (item.kind == Kind::bug) {
        BugResult b;
        b.id = item.key;
        b.failure = error;
        report.bugs.push_back(b);
      } else if (item.kind == Kind::proof) {
        report.proofs.push_back({item.key, "FAILED", "proved", 0, error});
      } else if (item.kind == Kind::deepspeed) {
        report.reference = {{"holds", false}, {"error", error}, {"cases", 0}};
      } else {
        report.errors.push_back(item.name + ": " + error);
      }
      continue;
    }
    const nlohmann::json& res = r["result"];
    if (item.kind == Kind::deepspeed) {
      report.reference = res;
      report.reference.erase("saved_cases");
      std::string file;
      for (const nlohmann::json& saved : res.value("saved_cases", nlohmann::json::array())) write_saved(saved, opts_.out, file);
    } else if (item.kind == Kind::proof) {
      report.proofs.push_back(report_from_json({{"proofs", {res}}}).proofs.at(0));
    } else if (item.kind == Kind::collectives) {
      report.collectives = report_from_json({{"collectives_per_step", res}}).collectives;
    } else {
      replays.add(res);
      BugResult b = report_from_json({{"known_bugs", {res}}}).bugs.at(0);
      write_saved(res, opts_.out, b.scenario_file);
      if (opts_.user_config && !b.scenario_file.empty() && b.scenario.is_object()) {
        write_ds_config(b.scenario, b.scenario_file);
      }
      report.bugs.push_back(b);
    }
  }
  std::reverse(report.proofs.begin(), report.proofs.end());  // proof_tasks() order (the items run reversed)
  for (const Invariant* inv : invs_) {
    const nlohmann::json* chosen = nullptr;
    InvariantResult r = merge_ranges(*inv, ranges[inv->name], replays, &chosen);
    if (chosen != nullptr) write_saved(*chosen, opts_.out, r.scenario_file);
    if (opts_.user_config && !r.counterexample.is_null() && !r.scenario_file.empty()) {
      // The counterexample as the ds_config it trains with, beside its scenario (which holds the calls:
      // world, backwards per step, boundary, steps, data seed), for DeepSpeed or a colleague.
      r.ds_config_file = write_ds_config(r.counterexample, r.scenario_file);
    }
    report.invariants.push_back(r);
  }
  if (opts_.user_config) {
    for (const auto& [name, why] : not_applicable_) {
      InvariantResult r;
      r.name = name;
      r.explanation = find_invariant(name)->explanation;
      r.not_applicable = why;
      report.invariants.push_back(r);
    }
    std::vector<std::string> order;
    for (const Invariant& i : invariants()) order.push_back(i.name);
    std::stable_sort(report.invariants.begin(), report.invariants.end(), [&](const auto& a, const auto& b) {
      return std::find(order.begin(), order.end(), a.name) < std::find(order.begin(), order.end(), b.name);
    });
    if (invs_.empty() && !not_applicable_.empty()) {  // nothing ran: a PASS would say the config was checked
      report.errors.push_back(fmt::format("verify --config {}: no selected invariant applies to this config (each "
                                          "says which of its settings its scenarios never take)",
                                          opts_.user_config->path));
    }
    const UserConfig& u = *opts_.user_config;
    report.user_config = {{"path", u.path}, {"pinned", to_json(u.pins)}, {"not_checked", u.not_checked},
                          {"warnings", u.warnings}};
  }
  // The determinism invariant's reruns count too: each of its cases ran twice.
  for (const InvariantResult& inv : report.invariants) {
    if (inv.name == "determinism-same-trace-hash") {
      replays.runs += inv.cases;
      if (!inv.holds) {
        ++replays.mismatches;
        replays.detail = inv.failure;
      }
    }
  }
  report.determinism = {replays.runs, replays.mismatches, replays.detail};
  report.seconds = seconds;
  return report;
}

VerifyReport run_verify(const VerifyOptions& opts) {
  const Stopwatch watch;
  const VerifyJob job(opts);
  Journal journal(opts.out, job, opts.resume);
  const std::vector<nlohmann::json> results = run_items_locally(job, journal, opts.jobs, opts.item_timeout_s,
                                                                opts.progress);
  return job.merge(results, watch.seconds(), 1);
}

}  // namespace zc::props
