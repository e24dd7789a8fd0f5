// Campaigns of one invariant (Note [Indexed cases]) and saved counterexample files.
//
// Note [Indexed cases]: RapidCheck's own search draws case i from a generator that every earlier
// case (and discard) advanced, so a campaign cannot be split. Here case i is generated with the
// Random keyed by (seed, i, attempt) at a size that depends on (i, total) only; an attempt whose
// scenario is outside the invariant's domain draws again, up to kAttempts. Cases are therefore
// independent: a range [a, b) runs on any process, the lowest failing index over all ranges is the
// one-process answer, and its shrink (RapidCheck's shrink tree, walked greedily as RapidCheck
// walks it) gives the same counterexample anywhere. The result is written as RapidCheck's own
// reproduce string (random, size, shrink path), so `zerocheck replay --rapidcheck` and
// run_campaign(..., reproduce) regenerate it through RapidCheck itself.
//
// Note [Counting campaigns]: a conformance figure is a rate, not a first failure. With
// CaseWatch::on_failure a campaign runs every case of its range: each failing one is counted and
// handed to the watch, which shrinks the first of each class it tells apart (the DeepSpeed
// comparison: the unlisted fields and the configuration's main axes) and only counts the rest. The
// first shrunk failure is still Campaign's own answer, so the verdict is the same as a stopping
// campaign's; the shrink evaluations are not cases (on_case sees each case once, before it).
#include "engine/errors.h"
#include "props/stopwatch.h"
#include "props/verify.h"

#include <fmt/format.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>

#include <fstream>
#include <optional>

namespace zc::props {

namespace {

constexpr int kMaxSize = 100;
constexpr int kAttempts = 50;  // draws per case index before it counts as discarded
constexpr std::uint64_t kCaseKey = 0x7a65726f63686b21;  // "zerochk!": separates our keys from RC's

// RapidCheck's listener, silenced: the verify job prints its own progress.
class QuietListener final : public rc::detail::TestListener {
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

std::string hex(std::uint64_t v) { return fmt::format("0x{:016x}", v); }

std::uint64_t parse_hex(const std::string& s) {
  try {
    std::size_t used = 0;
    const std::uint64_t v = std::stoull(s, &used, 16);
    if (used != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("'trace_hash' {} is not a hexadecimal number", s));
  }
}

int size_for(int index, int total) {
  return total > kMaxSize ? index % (kMaxSize + 1) : index * kMaxSize / std::max(1, total);
}

rc::Random case_random(std::uint64_t seed, int index, int attempt) {
  return rc::Random(rc::Random::Key{seed, static_cast<std::uint64_t>(index), static_cast<std::uint64_t>(attempt), kCaseKey});
}

// The invariant as a RapidCheck property; `last` and `last_failing` see every evaluation.
struct Probe {
  std::optional<Scenario> scenario;
  Verdict verdict;
  std::optional<Scenario> failing;
  Verdict failing_verdict;
};

rc::detail::Property as_property(const Invariant& inv, const CheckContext& ctx, Probe& probe) {
  return rc::detail::toProperty([&inv, &ctx, &probe] {
    const Scenario s = *inv.gen();
    Verdict v;
    try {
      v = inv.check(s, ctx);
    } catch (const std::exception& e) {
      v.holds = false;
      v.failure = fmt::format("the check threw: {}", e.what());
    }
    probe.scenario = s;
    probe.verdict = v;
    if (!v.applies) RC_DISCARD("outside the invariant's domain");
    if (!v.holds) {
      probe.failing = s;
      probe.failing_verdict = v;
      RC_FAIL(v.failure);
    }
  });
}

using CaseShrinkable = rc::Shrinkable<rc::detail::CaseDescription>;
using CaseType = rc::detail::CaseResult::Type;

// Greedy descent of the shrink tree, as RapidCheck's shrinkTestCase: take the first failing
// shrink, restart from its shrinks; the path of indices is what its reproduce string records.
std::vector<std::size_t> shrink(CaseShrinkable& best) {
  std::vector<std::size_t> path;
  for (bool moved = true; moved;) {
    moved = false;
    auto shrinks = best.shrinks();
    std::size_t i = 0;
    while (auto next = shrinks.next()) {
      if (next->value().result.type == CaseType::Failure) {
        best = std::move(*next);
        path.push_back(i);
        moved = true;
        break;
      }
      ++i;
    }
  }
  return path;
}

std::string reproduce_string(const std::string& id, std::uint64_t seed, const rc::detail::Reproduce& r) {
  rc::detail::Configuration config;
  config.testParams.seed = seed;
  config.reproduce[id] = r;
  return rc::detail::configToMinimalString(config);
}

// Reruns exactly the case a reproduce string names, through RapidCheck's own reproduce path.
Campaign reproduce_campaign(const Invariant& inv, const CheckContext& ctx, std::uint64_t seed, const std::string& reproduce) {
  Campaign c;
  Probe probe;
  const Stopwatch watch;
  const auto repro_map = rc::detail::configFromString(reproduce).reproduce;
  if (!repro_map.contains(inv.name)) {
    throw ConfigError(fmt::format("the reproduce string has no case for invariant '{}'", inv.name));
  }
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = 1;
  rc::detail::TestMetadata meta;
  meta.id = inv.name;
  meta.description = inv.name;
  QuietListener listener;
  const rc::detail::TestResult result =
      rc::detail::checkProperty(as_property(inv, ctx, probe), meta, params, listener, repro_map);
  c.seconds = watch.seconds();
  rc::detail::FailureResult failure;
  c.cases = 1;
  if (result.match(failure)) {
    c.failed = true;
    c.shrink_steps = static_cast<int>(failure.reproduce.shrinkPath.size());
    if (probe.failing) {
      c.counterexample = *probe.failing;
      c.verdict = probe.failing_verdict;
    }
    c.reproduce = reproduce;
  }
  return c;
}

// Checks case `index` again when the watch asks, and compares verdict and trace hash.
void rerun_check(const rc::detail::Property& property, const rc::Random& random, int size, int index,
                 Probe& probe, Campaign& c) {
  const Verdict first = probe.verdict;
  (void)property(random, size).value();
  ++c.reruns;
  if (probe.verdict.holds != first.holds || probe.verdict.trace_hash != first.trace_hash) {
    ++c.rerun_mismatches;
    c.rerun_detail = fmt::format("case {}: the rerun gave {} with trace hash {}, the first run {} with {}", index,
                                 probe.verdict.holds ? "holds" : "fails", hex(probe.verdict.trace_hash),
                                 first.holds ? "holds" : "fails", hex(first.trace_hash));
  }
}

}  // namespace

Profile profile_named(const std::string& name) {
  if (name == "quick") return {"quick", 40, 150, 120000};
  if (name == "default") return {"default", 1000, 1000, 240000};
  if (name == "thorough") return {"thorough", 10000, 5000, 600000};
  throw ConfigError(fmt::format("unknown profile '{}': use quick, default or thorough", name));
}

Campaign run_campaign_range(const Invariant& inv, const CheckContext& ctx, CaseRange range, std::uint64_t seed,
                            const CaseWatch& watch) {
  ZC_ASSERT(0 <= range.first && range.first <= range.last && range.last <= range.total, "case range [{}, {}) of {}",
            range.first, range.last, range.total);
  Campaign c;
  Probe probe;
  const rc::detail::Property property = as_property(inv, ctx, probe);
  const Stopwatch total;
  for (int i = range.first; i < range.last; ++i) {
    const int size = size_for(i, range.total);
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const rc::Random random = case_random(seed, i, attempt);
      const Stopwatch one;
      CaseShrinkable sh = property(random, size);
      const CaseType type = sh.value().result.type;
      if (type == CaseType::Discard) {
        ++c.discarded;
        continue;
      }
      ++c.cases;
      if (watch.on_case && probe.scenario) watch.on_case(i, *probe.scenario, probe.verdict, one.seconds());
      if (watch.rerun_every > 0 && i % watch.rerun_every == 0) rerun_check(property, random, size, i, probe, c);
      if (type == CaseType::Failure) {
        ++c.failing_cases;
        const bool wanted = !watch.on_failure || watch.on_failure(i, *probe.failing, probe.failing_verdict);
        ShrunkFailure f{i, *probe.failing, probe.failing_verdict, reproduce_string(inv.name, seed, {random, size, {}}), 0};
        if (wanted) {
          const std::vector<std::size_t> path = shrink(sh);
          f = {i, *probe.failing, probe.failing_verdict, reproduce_string(inv.name, seed, {random, size, path}),
               static_cast<int>(path.size())};
        }
        if (!c.failed) {  // the first failure is the campaign's answer (unshrunk if the watch declined)
          c.failed = true;
          c.first_failing = i;
          c.shrink_steps = f.shrink_steps;
          c.counterexample = f.counterexample;
          c.verdict = f.verdict;
          c.reproduce = f.reproduce;
        }
        if (!watch.on_failure) {
          c.seconds = total.seconds();
          return c;
        }
        if (wanted) c.shrunk.push_back(f);
      }
      break;
    }
  }
  c.seconds = total.seconds();
  return c;
}

Campaign run_campaign(const Invariant& inv, const CheckContext& ctx, int cases, std::uint64_t seed,
                      const std::string& reproduce) {
  if (!reproduce.empty()) return reproduce_campaign(inv, ctx, seed, reproduce);
  return run_campaign_range(inv, ctx, {0, cases, cases}, seed);
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
    const nlohmann::json& seed = j.contains("rc_seed") ? j.at("rc_seed") : nlohmann::json(0u);
    const bool whole = seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<std::int64_t>() >= 0);
    if (!whole) {  // get<> would cast a float or wrap a negative
      throw ConfigError(fmt::format("counterexample key 'rc_seed': an integer in [0, 2^64), got {}",
                                    j.at("rc_seed").dump()));
    }
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

}  // namespace zc::props
