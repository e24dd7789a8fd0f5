#include "props/deepspeed_seeds.h"

#include "engine/errors.h"
#include "props/deepspeed_target.h"
#include "props/stopwatch.h"

#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>

#include <algorithm>
#include <cctype>
#include <fstream>

namespace zc::props {

namespace {

class QuietListener final : public rc::detail::TestListener {
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

SeedVerdict verdict_named(const std::string& s) {
  if (s == "holds") return SeedVerdict::holds;
  if (s == "fails") return SeedVerdict::fails;
  if (s == "not_applicable") return SeedVerdict::not_applicable;
  if (s == "not_runnable") return SeedVerdict::not_runnable;
  throw ConfigError(fmt::format("a seed probe answered the verdict '{}'", s));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The RapidCheck generator of an invariant's scenarios (each field shrinks toward the smallest).
rc::Gen<SeedCase> gen_case(const SeedInvariant& inv) {
  return rc::gen::exec([&inv] {
    SeedCase c;
    c.world = *rc::gen::inRange(1, 3);
    c.stage = *rc::gen::inRange(inv.min_stage, inv.max_stage + 1);
    c.offload = c.stage > 0 && *rc::gen::arbitrary<bool>();
    // Coalescing is one with-block per optimizer step: DeepSpeed's docstring forbids spanning GA
    // micro-steps with several blocks (engine.py coalesce_grad_reduction; unenforced: docs/findings.md).
    c.ga = inv.id == "I1" || inv.id == "I2" ? 1 : *rc::gen::inRange(1, 3);
    c.n = *rc::gen::inRange(1, 5);
    c.steps = *rc::gen::inRange(1, inv.id == "I2" ? 4 : 3);
    c.contiguous = !*rc::gen::arbitrary<bool>();
    c.overlap = *rc::gen::arbitrary<bool>();
    c.bucket = *rc::gen::element<std::int64_t>(500000000, 8);
    c.seed = *rc::gen::inRange(0, 16);
    return c;
  });
}

}  // namespace

const char* to_string(SeedVerdict v) {
  switch (v) {
    case SeedVerdict::holds: return "holds";
    case SeedVerdict::fails: return "fails";
    case SeedVerdict::not_applicable: return "not applicable";
    case SeedVerdict::not_runnable: return "not runnable";
  }
  return "?";
}

nlohmann::json SeedCase::args() const {
  nlohmann::json j = {{"stage", stage}, {"offload", offload}, {"ga", ga}, {"n", n}, {"steps", steps},
                      {"contiguous", contiguous}, {"overlap", overlap}, {"bucket", bucket}, {"seed", seed}};
  if (!passes.empty()) j["passes"] = passes;
  if (world > 0) j["world"] = world;
  return j;
}

SeedCase SeedCase::from_args(const nlohmann::json& j) {
  SeedCase c;
  c.stage = j.value("stage", 0);
  c.offload = j.value("offload", false);
  c.ga = j.value("ga", 1);
  c.n = j.value("n", 1);
  c.steps = j.value("steps", 1);
  c.contiguous = j.value("contiguous", true);
  c.overlap = j.value("overlap", false);
  c.bucket = j.value("bucket", std::int64_t{500000000});
  c.seed = j.value("seed", 0);
  c.passes = j.value("passes", std::string());
  c.world = j.value("world", 0);
  return c;
}

const std::vector<SeedInvariant>& seed_invariants() {
  static const std::vector<SeedInvariant> all = [] {
    std::vector<SeedInvariant> v;
    v.push_back({"MB", "multi-backward-sum", "seed_multi_backward",
                 "N engine.backward() calls with the explicit boundary give the summed loss's gradient",
                 "001_03cee7fe9d0b6291 (builds on PR #7981)", 2, {}, 0, 3});
    v.push_back({"I1", "I1-coalesced-bit-exact", "seed_i1",
                 "N backward calls inside coalesce_grad_reduction() equal per-backward reduction bit for bit",
                 "001_03cee7fe9d0b6291 (PR #7992)", 2, {}, 1, 3});
    v.push_back({"I2", "I2-micro-step-id-zero", "seed_i2", "ZeRO-3: micro_step_id is 0 at every coalesced flush",
                 "001_03cee7fe9d0b6291 (PR #7992)", 2, {}, 3, 3});
    SeedCase sp;
    sp.passes = "autosp";
    SeedCase tp;
    tp.passes = "autotp";
    v.push_back({"I3", "I3-no-deepcompile-for-parallel-passes", "seed_i3",
                 "AutoSP / AutoTP alone never request or load the DeepCompile handle (compile, steps, destroy)",
                 "000_c58ac685dbf6c8b5", 2, {sp, tp}, 0, 0});
    SeedCase plain, offloaded;
    offloaded.offload = true;
    v.push_back({"I4", "I4-copies-keep-parent", "seed_i4",
                 "copy/deepcopy of a ZeRO-3 module's _parameters keep _parent_module; a traced read skips ds_status",
                 "002_f62cef7345bfd50d (PRs #6564, #6527)", 1, {plain, offloaded}, 3, 3});
    return v;
  }();
  return all;
}

const SeedInvariant& find_seed_invariant(const std::string& name) {
  std::string known;
  for (const SeedInvariant& inv : seed_invariants()) {
    if (lower(inv.id) == lower(name) || lower(inv.name) == lower(name)) return inv;
    known += (known.empty() ? "" : ", ") + inv.id + " (" + inv.name + ")";
  }
  throw ConfigError(fmt::format("no seed invariant named '{}': use one of {}", name, known));
}

nlohmann::json SeedResult::to_json() const {
  nlohmann::json j = {{"target", target}, {"invariant", invariant},
                      {"verdict", to_string(verdict)}, {"summary", summary}, {"cases", cases},
                      {"shrink_steps", shrink_steps}, {"seconds", seconds}};
  if (counterexample) j["counterexample"] = counterexample->args();
  if (!reproduce.empty()) j["reproduce"] = reproduce;
  if (!saved.empty()) j["saved"] = saved;
  return j;
}

SeedResult check_seed_case(ReferencePools& pools, const SeedInvariant& inv, const SeedCase& c,
                           const std::filesystem::path& scratch) {
  SeedResult r;
  r.target = pools.env().target;
  r.invariant = inv.name;
  r.cases = 1;
  const Stopwatch watch;
  std::filesystem::create_directories(scratch);
  const std::filesystem::path file = scratch / fmt::format("probe_{}.json", inv.probe);
  std::error_code ec;
  std::filesystem::remove(file, ec);
  pools.get(c.world > 0 ? c.world : inv.world).probe(inv.probe, scratch, c.args().dump());
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("verdict")) {
    throw ConfigError(fmt::format("the {} probe wrote no verdict in {}", inv.probe, file.string()));
  }
  r.verdict = verdict_named(j["verdict"].get<std::string>());
  r.summary = j.value("summary", std::string());
  if (r.verdict == SeedVerdict::fails) r.counterexample = c;
  r.seconds = watch.seconds();
  return r;
}

SeedResult check_seed_invariant(ReferencePools& pools, const SeedInvariant& inv, int cases, std::uint64_t seed,
                                const std::filesystem::path& out) {
  const Stopwatch watch;
  const std::filesystem::path scratch = out / "scratch";
  SeedResult result;
  result.target = pools.env().target;
  result.invariant = inv.name;
  if (!inv.fixed.empty()) {
    for (const SeedCase& c : inv.fixed) {
      SeedResult one = check_seed_case(pools, inv, c, scratch);
      ++result.cases;
      if (one.verdict != SeedVerdict::holds) {
        result.verdict = one.verdict;
        result.summary = one.summary;
        result.counterexample = one.counterexample;
      } else {  // every fixed case that holds, named
        result.summary += (result.summary.empty() ? "" : "; ") + one.summary;
      }
      if (one.verdict != SeedVerdict::holds) break;
    }
    if (inv.id == "I3") pools.retire(inv.world);  // AutoTP leaves DeepSpeed's TP groups behind
  } else {
    // Applicability first, on the smallest case: a release without the feature answers n/a once.
    SeedCase smallest;
    smallest.stage = inv.min_stage;
    smallest.world = 1;
    const SeedResult first = check_seed_case(pools, inv, smallest, scratch);
    result.cases = 1;
    result.verdict = first.verdict;
    result.summary = first.summary;
    result.counterexample = first.counterexample;
    if (first.verdict == SeedVerdict::holds) {
      std::optional<SeedResult> failing;
      const rc::detail::Property property = rc::detail::toProperty([&] {
        const SeedCase c = *gen_case(inv);
        SeedResult one = check_seed_case(pools, inv, c, scratch);
        ++result.cases;
        if (one.verdict == SeedVerdict::not_runnable || one.verdict == SeedVerdict::not_applicable) {
          RC_DISCARD(one.summary);
        }
        if (one.verdict == SeedVerdict::fails) {
          failing = one;  // the last failing case RapidCheck tries is its shrunk counterexample
          RC_FAIL(one.summary);
        }
      });
      rc::detail::TestParams params;
      params.seed = seed;
      params.maxSuccess = std::max(1, cases - 1);
      params.maxSize = 100;
      params.maxDiscardRatio = 10;
      rc::detail::TestMetadata meta;
      meta.id = inv.name;
      meta.description = inv.name;
      QuietListener listener;
      const rc::detail::TestResult tr = rc::detail::checkProperty(property, meta, params, listener, {});
      rc::detail::FailureResult failure;
      if (!tr.match(failure)) {
        result.summary = fmt::format("{} cases hold (worlds 1-2, stages {}-{}, offload, GA {}, 1-4 backward calls)",
                                     result.cases, inv.min_stage, inv.max_stage,
                                     inv.id == "I1" || inv.id == "I2" ? "1" : "1-2");
      } else if (failing) {
        result.verdict = SeedVerdict::fails;
        result.summary = failing->summary;
        result.counterexample = failing->counterexample;
        result.shrink_steps = static_cast<int>(failure.reproduce.shrinkPath.size());
        rc::detail::Configuration config;
        config.testParams.seed = seed;
        config.reproduce[inv.name] = failure.reproduce;
        result.reproduce = rc::detail::configToMinimalString(config);
      }
    }
  }
  if (result.verdict == SeedVerdict::fails && result.counterexample) {
    std::filesystem::create_directories(out);
    const std::filesystem::path file = out / fmt::format("{}.json", inv.name);
    nlohmann::json j = result.to_json();
    j["deepspeed_seed"] = inv.name;
    j["replay"] = fmt::format("zerocheck replay {}", file.string());
    std::ofstream(file) << j.dump(2) << "\n";
    result.saved = file.string();
  }
  std::error_code ec;
  std::filesystem::remove_all(scratch, ec);
  result.seconds = watch.seconds();
  return result;
}

nlohmann::json Bisection::to_json() const {
  nlohmann::json v = nlohmann::json::object();
  for (const std::string& r : order) v[r] = to_string(verdicts.at(r).verdict);
  nlohmann::json details = nlohmann::json::object();
  for (const std::string& r : order) details[r] = verdicts.at(r).to_json();
  return {{"invariant", invariant}, {"last_bad", last_bad ? nlohmann::json(*last_bad) : nlohmann::json()},
          {"first_good", first_good ? nlohmann::json(*first_good) : nlohmann::json()}, {"monotone", monotone},
          {"note", note}, {"verdicts", v}, {"details", details}};
}

Bisection bisect_releases(const std::string& invariant, const std::vector<std::string>& releases,
                          const std::function<SeedResult(const std::string&)>& verdict_of, bool every_release) {
  Bisection b;
  b.invariant = invariant;
  const int n = static_cast<int>(releases.size());
  auto eval = [&](int i) -> SeedVerdict {
    const std::string& r = releases[static_cast<std::size_t>(i)];
    if (!b.verdicts.contains(r)) {
      b.verdicts[r] = verdict_of(r);
      b.order.push_back(r);
    }
    return b.verdicts[r].verdict;
  };
  auto runnable = [&](int i) { return eval(i) != SeedVerdict::not_runnable; };
  if (every_release) {
    for (int i = 0; i < n; ++i) eval(i);
  }
  int lo = 0, hi = n;  // first_good is in [lo, hi]; hi == n: none
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    int j = -1;
    for (int k = mid; k < hi && j < 0; ++k) {
      if (runnable(k)) j = k;
    }
    for (int k = mid - 1; k >= lo && j < 0; --k) {
      if (runnable(k)) j = k;
    }
    if (j < 0) break;  // nothing runnable left in [lo, hi)
    if (eval(j) == SeedVerdict::holds) hi = j;
    else lo = j + 1;
  }
  int good = -1;
  if (hi < n && eval(hi) == SeedVerdict::holds) good = hi;
  // The nearest runnable release below the boundary (or the newest, when nothing holds).
  int bad = -1;
  for (int k = (good >= 0 ? good : n) - 1; k >= 0; --k) {
    if (!runnable(k)) continue;
    if (eval(k) == SeedVerdict::fails) bad = k;
    break;
  }
  if (good >= 0) b.first_good = releases[static_cast<std::size_t>(good)];
  if (bad >= 0) b.last_bad = releases[static_cast<std::size_t>(bad)];
  // The boundary's neighbours.
  if (good >= 0 && good + 1 < n) eval(good + 1);
  if (bad > 0) eval(bad - 1);
  // Monotone: in release order, not applicable*, then fails*, then holds*.
  int phase = 0;
  for (int k = 0; k < n; ++k) {
    const std::string& r = releases[static_cast<std::size_t>(k)];
    if (!b.verdicts.contains(r)) continue;
    const SeedVerdict v = b.verdicts[r].verdict;
    const int p = v == SeedVerdict::not_applicable ? 0 : v == SeedVerdict::fails ? 1 : v == SeedVerdict::holds ? 2 : -1;
    if (p < 0) continue;
    if (p < phase) {
      b.monotone = false;
      b.note += fmt::format("{} {} after a release where it {}; ", r, to_string(v), phase == 2 ? "holds" : "fails");
    }
    phase = std::max(phase, p);
  }
  if (!b.first_good && !b.last_bad) b.note += "no evaluated release both applies and fails or holds; ";
  else if (!b.first_good) b.note += "it fails in the newest release evaluated; ";
  else if (!b.last_bad) b.note += "it holds in every release where it applies; ";
  if (!b.note.empty()) b.note.resize(b.note.size() - 2);
  return b;
}

}  // namespace zc::props
