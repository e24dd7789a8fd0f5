// The verify runner. Note [Items in child processes]: each work item (one invariant's campaign,
// one bug hunt, the proofs, the collective counts) runs in a fork()ed child that writes its
// result as JSON to a file; the parent keeps --jobs children going and reads results as they
// finish. A child that dies (a signal, an abort) becomes a failed item naming the signal.
#include "props/verify.h"

#include "engine/errors.h"
#include "engine/rng.h"
#include "props/reference.h"
#include "props/stopwatch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <cstring>
#include <map>

namespace zc::props {

namespace {

// RapidCheck's listener, silenced: the verify job prints its own progress.
class QuietListener final : public rc::detail::TestListener {
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

std::string hex(std::uint64_t v) { return fmt::format("0x{:016x}", v); }

std::uint64_t parse_hex(const std::string& s) { return std::stoull(s, nullptr, 16); }

}  // namespace

Profile profile_named(const std::string& name) {
  if (name == "quick") return {"quick", 40, 150, 20000};
  if (name == "default") return {"default", 1000, 1000, 60000};
  if (name == "thorough") return {"thorough", 10000, 5000, 120000};
  throw ConfigError(fmt::format("unknown profile '{}': use quick, default or thorough", name));
}

Campaign run_campaign(const Invariant& inv, const CheckContext& ctx, int cases, std::uint64_t seed,
                      const std::string& reproduce) {
  Campaign c;
  int ran = 0, discarded = 0, failures = 0;
  int ran_before_first_failure = -1;
  std::optional<Scenario> last_failing;
  Verdict last_verdict;
  const Stopwatch watch;
  auto property = [&] {
    const Scenario s = *inv.gen();
    Verdict v;
    try {
      v = inv.check(s, ctx);
    } catch (const std::exception& e) {
      v.holds = false;
      v.failure = fmt::format("the check threw: {}", e.what());
    }
    if (!v.applies) {
      ++discarded;
      RC_DISCARD("outside the invariant's domain");
    }
    if (failures == 0) ++ran;
    if (!v.holds) {
      if (failures++ == 0) ran_before_first_failure = ran;
      last_failing = s;
      last_verdict = v;
      RC_FAIL(v.failure);
    }
  };
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = cases;
  params.maxSize = 100;
  params.maxDiscardRatio = 50;
  rc::detail::TestMetadata meta;
  meta.id = inv.name;
  meta.description = inv.name;
  QuietListener listener;
  std::unordered_map<std::string, rc::detail::Reproduce> repro_map;
  if (!reproduce.empty()) {
    repro_map = rc::detail::configFromString(reproduce).reproduce;
    if (!repro_map.contains(inv.name)) {
      throw ConfigError(fmt::format("the reproduce string has no case for invariant '{}'", inv.name));
    }
  }
  const rc::detail::TestResult result =
      rc::detail::checkProperty(rc::detail::toProperty(property), meta, params, listener, repro_map);
  c.seconds = watch.seconds();
  c.discarded = discarded;
  rc::detail::FailureResult failure;
  rc::detail::GaveUpResult gave_up;
  if (result.match(failure)) {
    c.failed = true;
    c.cases = ran_before_first_failure > 0 ? ran_before_first_failure : ran;
    c.shrink_steps = static_cast<int>(failure.reproduce.shrinkPath.size());
    if (last_failing) {
      c.counterexample = *last_failing;
      c.verdict = last_verdict;
    }
    rc::detail::Configuration config;
    config.testParams = params;
    config.reproduce[inv.name] = failure.reproduce;
    c.reproduce = rc::detail::configToMinimalString(config);
  } else if (result.match(gave_up)) {
    c.cases = ran;
    c.error = "RapidCheck gave up: " + gave_up.description;
  } else {
    c.cases = ran;
  }
  return c;
}

nlohmann::json to_json(const SavedCase& c) {
  return {{"zerocheck", "counterexample"},
          {"invariant", c.invariant},
          {"bugs", c.bugs.str()},
          {"verdict", c.holds ? "holds" : "fails"},
          {"trace_hash", hex(c.trace_hash)},
          {"failure", c.failure},
          {"reproduce", c.reproduce},
          {"rc_seed", c.rc_seed},
          {"scenario", to_json(c.scenario)},
          {"replay", "zerocheck replay <this file>"}};
}

SavedCase saved_case_from_json(const nlohmann::json& j) {
  SavedCase c;
  try {
    c.invariant = j.at("invariant").get<std::string>();
    const std::string bugs = j.value("bugs", "none");
    c.bugs = bugs == "none" ? BugSet{} : BugSet::parse(bugs);
    c.holds = j.value("verdict", "fails") == "holds";
    c.trace_hash = parse_hex(j.value("trace_hash", "0"));
    c.failure = j.value("failure", "");
    c.reproduce = j.value("reproduce", "");
    c.rc_seed = j.value("rc_seed", std::uint64_t{0});
    c.scenario = scenario_from_json(j.at("scenario"));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("not a zerocheck counterexample file: {}", e.what()));
  }
  return c;
}

void save_case(const SavedCase& c, const std::filesystem::path& file) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file);
  out << to_json(c).dump(2) << "\n";
  if (!out) throw UsageError(fmt::format("cannot write {}", file.string()));
}

SavedCase load_case(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw UsageError(fmt::format("cannot read {}: no such file or not readable", file.string()));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{} is not JSON: {}", file.string(), e.what()));
  }
  return saved_case_from_json(j);
}

namespace {

// ---- the work items ----

// The determinism self-check on a saved counterexample: reload it and rerun it exactly.
struct Replays {
  int runs = 0, mismatches = 0;
  std::string detail;
  void check(const std::filesystem::path& file, const Invariant& inv, const RunHooks& hooks) {
    const SavedCase back = load_case(file);
    const Verdict again = inv.check(back.scenario, CheckContext{back.bugs, hooks});
    ++runs;
    if (again.holds != back.holds || again.trace_hash != back.trace_hash) {
      ++mismatches;
      detail = fmt::format("{}: replay gave {} with trace hash {}, saved {} with {}", file.string(),
                           again.holds ? "holds" : "fails", hex(again.trace_hash), back.holds ? "holds" : "fails",
                           hex(back.trace_hash));
    }
  }
  void write(nlohmann::json& j) const {
    j["replays"] = runs;
    j["replay_mismatches"] = mismatches;
    j["replay_detail"] = detail;
  }
};

nlohmann::json invariant_item(const Invariant& inv, const VerifyOptions& opts) {
  CheckContext ctx{{}, opts.hooks};
  const Campaign c = run_campaign(inv, ctx, opts.profile.cases, opts.seed);
  InvariantResult r;
  r.name = inv.name;
  r.explanation = inv.explanation;
  r.holds = !c.failed && c.error.empty();
  r.cases = c.cases;
  r.discarded = c.discarded;
  r.seconds = c.seconds;
  if (!c.error.empty()) r.failure = c.error;
  Replays replays;
  if (c.failed) {
    r.failure = c.verdict.failure;
    r.counterexample = to_json(c.counterexample);
    r.reproduce = c.reproduce;
    SavedCase saved{c.counterexample, inv.name, {}, false, c.verdict.trace_hash, c.verdict.failure, c.reproduce, opts.seed};
    const std::filesystem::path file = opts.out / "counterexamples" / fmt::format("{}.json", inv.name);
    save_case(saved, file);
    r.scenario_file = file.string();
    replays.check(file, inv, opts.hooks);
  }
  VerifyReport one;
  one.invariants.push_back(r);
  nlohmann::json j = to_json(one)["invariants"][0];
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
  const Stopwatch watch;
  Replays replays;
  for (const Invariant* inv : order) {
    const Campaign c = run_campaign(*inv, ctx, opts.profile.bug_cases, opts.seed ^ fnv1a(r.id));
    r.cases_to_catch += c.cases;
    if (!c.failed) continue;
    r.caught = true;
    r.by = inv->name;
    r.seconds = watch.seconds();
    r.shrink_steps = c.shrink_steps;
    r.failure = c.verdict.failure;
    r.scenario = to_json(c.counterexample);
    r.reproduce = c.reproduce;
    SavedCase saved{c.counterexample, inv->name, ctx.bugs, false, c.verdict.trace_hash, c.verdict.failure, c.reproduce,
                    opts.seed ^ fnv1a(r.id)};
    const std::filesystem::path file = opts.out / "counterexamples" / fmt::format("{}-{}.json", r.id, inv->name);
    save_case(saved, file);
    r.scenario_file = file.string();
    replays.check(file, *inv, opts.hooks);
    break;
  }
  if (!r.caught) r.seconds = watch.seconds();
  VerifyReport one;
  one.bugs.push_back(r);
  nlohmann::json j = to_json(one)["known_bugs"][0];
  replays.write(j);
  return j;
}

// A hazard is hunted like a known bug that DeepSpeed always has: its property must fail on the
// correct engine, with no bug switched on; the shrunk counterexample is saved and replayed.
nlohmann::json hazard_item(const Hazard& h, const VerifyOptions& opts) {
  BugResult r;
  r.id = h.code;
  r.summary = h.summary;
  r.expected_by = h.property.name;
  const CheckContext ctx{{}, opts.hooks};
  const Stopwatch watch;
  Replays replays;
  const Campaign c = run_campaign(h.property, ctx, opts.profile.bug_cases, opts.seed ^ fnv1a(r.id));
  r.cases_to_catch = c.cases;
  r.seconds = watch.seconds();
  if (c.failed) {
    r.caught = true;
    r.by = h.property.name;
    r.shrink_steps = c.shrink_steps;
    r.failure = c.verdict.failure;
    r.scenario = to_json(c.counterexample);
    r.reproduce = c.reproduce;
    SavedCase saved{c.counterexample, h.property.name, {}, false, c.verdict.trace_hash, c.verdict.failure, c.reproduce,
                    opts.seed ^ fnv1a(r.id)};
    const std::filesystem::path file = opts.out / "counterexamples" / fmt::format("{}-{}.json", r.id, h.property.name);
    save_case(saved, file);
    r.scenario_file = file.string();
    replays.check(file, h.property, opts.hooks);
  } else if (!c.error.empty()) {
    r.failure = c.error;
  } else {
    r.failure = fmt::format("the property held on {} scenarios: the engine no longer does what DeepSpeed does here", c.cases);
  }
  VerifyReport one;
  one.bugs.push_back(r);
  nlohmann::json j = to_json(one)["known_bugs"][0];
  replays.write(j);
  return j;
}

nlohmann::json proofs_item(const VerifyOptions& opts) {
  VerifyReport one;
  one.proofs = run_all_proofs(opts.profile.proof_timeout_ms);
  return to_json(one)["proofs"];
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

struct Item {
  std::string name;
  std::function<nlohmann::json()> run;
};

// Runs items in forked children, at most `jobs` at once; results in item order.
std::vector<nlohmann::json> run_items(const std::vector<Item>& items, const VerifyOptions& opts) {
  // Per run, so two runs into one --out (ctest runs tests in parallel) cannot take each other's.
  const std::filesystem::path work = opts.out / fmt::format(".work-{}", getpid());
  std::filesystem::create_directories(work);
  std::vector<nlohmann::json> results(items.size());
  std::map<pid_t, std::size_t> running;
  std::size_t next = 0;
  int done = 0;
  auto file_of = [&](std::size_t i) { return work / fmt::format("item-{}.json", i); };
  std::fflush(nullptr);
  while (next < items.size() || !running.empty()) {
    while (next < items.size() && static_cast<int>(running.size()) < std::max(1, opts.jobs)) {
      const pid_t pid = fork();
      if (pid < 0) throw UsageError(fmt::format("fork failed: {}", std::strerror(errno)));
      if (pid == 0) {
        int rc = 0;
        nlohmann::json out;
        try {
          out = {{"ok", true}, {"result", items[next].run()}};
        } catch (const std::exception& e) {
          out = {{"ok", false}, {"error", e.what()}};
          rc = 3;
        }
        std::ofstream f(file_of(next));
        f << out.dump();
        f.close();
        std::fflush(nullptr);
        _exit(f ? rc : 4);
      }
      running[pid] = next++;
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) throw UsageError(fmt::format("waitpid failed: {}", std::strerror(errno)));
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const std::size_t i = it->second;
    running.erase(it);
    nlohmann::json got;
    std::ifstream f(file_of(i));
    if (WIFSIGNALED(status)) {
      got = {{"ok", false}, {"error", fmt::format("the work item died with signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)))}};
    } else if (!f) {
      got = {{"ok", false}, {"error", fmt::format("the work item exited {} without a result", WEXITSTATUS(status))}};
    } else {
      try {
        f >> got;
      } catch (const nlohmann::json::exception& e) {
        got = {{"ok", false}, {"error", fmt::format("unreadable result: {}", e.what())}};
      }
    }
    results[i] = got;
    ++done;
    if (opts.progress) opts.progress(items[i].name, done, static_cast<int>(items.size()));
  }
  std::filesystem::remove_all(work);
  return results;
}

}  // namespace

VerifyReport run_verify(const VerifyOptions& opts) {
  const Stopwatch watch;
  VerifyReport report;
  report.profile = opts.profile.name;
  report.seed = opts.seed;
  report.jobs = opts.jobs;
  report.started = opts.started;
  std::filesystem::remove_all(opts.out / "counterexamples");  // no stale cases from an earlier run

  std::vector<const Invariant*> invs;
  for (const Invariant& i : invariants()) {
    if (opts.only.empty() || std::find(opts.only.begin(), opts.only.end(), i.name) != opts.only.end()) invs.push_back(&i);
  }
  for (const std::string& name : opts.only) {
    if (!find_invariant(name)) {
      std::vector<std::string> names;
      for (const Invariant& i : invariants()) names.push_back(i.name);
      throw ConfigError(fmt::format("--only: no invariant '{}'; the invariants are {}", name, fmt::join(names, ", ")));
    }
  }
  std::vector<KnownBugInfo> bugs;
  for (const KnownBugInfo& b : known_bugs()) {
    if (opts.bugs.empty() || std::find(opts.bugs.begin(), opts.bugs.end(), std::string(b.code)) != opts.bugs.end()) bugs.push_back(b);
  }
  for (const std::string& code : opts.bugs) {  // ConfigError naming an unknown one
    const bool hazard = std::any_of(hazards().begin(), hazards().end(), [&](const Hazard& h) { return h.code == code; });
    if (!hazard) BugSet::parse(code);
  }

  if (!opts.engine_items) {
    invs.clear();
    bugs.clear();
  }
  std::vector<Item> items;
  // Long items first, so two jobs finish together.
  if (opts.proofs) items.push_back({"proofs", [&] { return proofs_item(opts); }});
  for (const KnownBugInfo& b : bugs) {
    items.push_back({fmt::format("bug {}", b.code), [&opts, &invs, b] { return bug_item(b, opts, invs); }});
  }
  // DeepSpeed's hazards run with the bug hunts (--bugs H1 selects one; --only an invariant skips them).
  if (opts.engine_items && opts.only.empty()) {
    for (const Hazard& h : hazards()) {
      if (!opts.bugs.empty() && std::find(opts.bugs.begin(), opts.bugs.end(), h.code) == opts.bugs.end()) continue;
      items.push_back({fmt::format("bug {}", h.code), [&opts, &h] { return hazard_item(h, opts); }});
    }
  }
  for (const Invariant* inv : invs) {
    items.push_back({"invariant " + inv->name, [&opts, inv] { return invariant_item(*inv, opts); }});
  }
  if (opts.engine_items) items.push_back({"collectives", [&] { return collectives_item(opts); }});
  // The DeepSpeed reference in its own child too: its worker pools live and die with it.
  if (opts.deepspeed_cases > 0) {
    items.push_back({"deepspeed", [&] {
      ReferencePools pools(reference_env());
      return run_reference_campaigns({opts.deepspeed_cases, opts.seed, opts.out}, pools);
    }});
  }

  const std::vector<nlohmann::json> results = run_items(items, opts);
  nlohmann::json j = {{"invariants", nlohmann::json::array()},
                      {"known_bugs", nlohmann::json::array()},
                      {"proofs", nlohmann::json::array()},
                      {"determinism", {{"runs", 0}, {"mismatches", 0}, {"detail", ""}}},
                      {"collectives_per_step", nlohmann::json::array()}};
  int runs = 0, mismatches = 0;
  std::string detail;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const nlohmann::json& r = results[i];
    const std::string& name = items[i].name;
    if (!r.value("ok", false)) {
      const std::string error = r.value("error", "unknown");
      if (name.rfind("invariant ", 0) == 0) {
        j["invariants"].push_back({{"name", name.substr(10)}, {"holds", false}, {"cases", 0}, {"seconds", 0.0},
                                   {"failure", error}});
      } else if (name.rfind("bug ", 0) == 0) {
        j["known_bugs"].push_back({{"id", name.substr(4)}, {"caught", false}, {"by", ""}, {"cases_to_catch", 0},
                                   {"seconds", 0.0}, {"scenario_file", ""}, {"reproduce", ""}, {"failure", error}});
      } else if (name == "proofs") {
        j["proofs"].push_back({{"name", "all proofs"}, {"verdict", "FAILED"}, {"expected", "proved"}, {"seconds", 0.0},
                               {"detail", error}});
      } else if (name == "deepspeed") {
        report.reference = {{"holds", false}, {"error", error}, {"cases", 0}};
      } else {
        report.errors.push_back(name + ": " + error);
      }
      continue;
    }
    const nlohmann::json& res = r["result"];
    if (name == "deepspeed") report.reference = res;
    else if (name == "proofs") j["proofs"] = res;
    else if (name == "collectives") j["collectives_per_step"] = res;
    else {
      runs += res.value("replays", 0);
      mismatches += res.value("replay_mismatches", 0);
      if (!res.value("replay_detail", "").empty()) detail = res.value("replay_detail", "");
      j[name.rfind("bug ", 0) == 0 ? "known_bugs" : "invariants"].push_back(res);
    }
  }
  const VerifyReport parsed = report_from_json(j);
  report.invariants = parsed.invariants;
  report.bugs = parsed.bugs;
  report.proofs = parsed.proofs;
  report.collectives = parsed.collectives;
  // The determinism invariant's reruns count too: each of its cases ran twice.
  for (const InvariantResult& inv : report.invariants) {
    if (inv.name == "determinism-same-trace-hash") {
      runs += inv.cases;
      if (!inv.holds) {
        ++mismatches;
        detail = inv.failure;
      }
    }
  }
  report.determinism = {runs, mismatches, detail};
  report.seconds = watch.seconds();
  return report;
}

}  // namespace zc::props
