#include "cli/deepspeed_cli.h"

#include "engine/errors.h"
#include "props/deepspeed_seeds.h"
#include "props/deepspeed_target.h"
#include "props/stopwatch.h"
#include "reports/seeds.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace zc::cli {

namespace {

// "deepspeed==0.15.1" -> "deepspeed-0.15.1"; a tree -> "tree-<last dir>".
std::string label_of(const std::string& target) {
  if (target.rfind("deepspeed==", 0) == 0) return "deepspeed-" + target.substr(11);
  if (target.rfind("deepspeed@", 0) == 0) return "tree-" + std::filesystem::path(target.substr(10)).filename().string();
  return "deepspeed";
}

void print_result(const props::SeedResult& r) {
  fmt::print("{:<40} {:<15} {:>5} {:>8.1f}  {}\n", r.invariant, props::to_string(r.verdict), r.cases, r.seconds, r.summary);
  if (!r.saved.empty()) fmt::print("    counterexample (shrunk {} steps): {}; replay: zerocheck replay {}\n", r.shrink_steps, r.saved, r.saved);
}

}  // namespace

int run_verify_deepspeed_target(const VerifyCliOptions& o) {
  const std::string target = props::normalize_target(o.against);
  std::vector<const props::SeedInvariant*> invs;
  for (const std::string& name : o.only) invs.push_back(&props::find_seed_invariant(name));
  if (invs.empty()) {
    for (const props::SeedInvariant& inv : props::seed_invariants()) invs.push_back(&inv);
  }
  const props::Stopwatch watch;
  fmt::print(stderr, "zerocheck verify --against {}: the seeds' invariants on that DeepSpeed alone\n", target);
  props::ReferencePools pools(props::reference_env(target, /*with_adam_ops=*/false));
  const std::filesystem::path out = std::filesystem::path(o.out) / label_of(target);
  std::filesystem::create_directories(out);
  nlohmann::json all = nlohmann::json::array();
  std::vector<props::SeedResult> results;
  fmt::print("\n{:<40} {:<15} {:>5} {:>8}  {}\n", "invariant", "verdict", "cases", "seconds", "summary");
  for (const props::SeedInvariant* inv : invs) {
    props::SeedResult r;
    try {
      r = props::check_seed_invariant(pools, *inv, o.seed_cases, o.seed, out);
    } catch (const ZcError& e) {  // a worker crashed or hung: this invariant is not runnable here
      r.target = target;
      r.invariant = inv->name;
      r.verdict = props::SeedVerdict::not_runnable;
      r.summary = e.what();
      pools.retire(inv->world);
    }
    print_result(r);
    all.push_back(r.to_json());
    results.push_back(r);
  }
  std::ofstream(out / "deepspeed-seeds.json") << all.dump(2) << "\n";
  reports::write_seed_reports(target, results, out);
  const reports::SeedCounts counts = reports::count_seeds(results);
  fmt::print("{} in {:.1f} s: {}; {}/deepspeed-seeds.html\n", counts.passed() ? "PASS" : "FAIL", watch.seconds(),
             counts.line(), out.string());
  return counts.passed() ? 0 : 1;
}

int run_bisect(const BisectOptions& o) {
  if (o.against != "deepspeed") {
    throw UsageError(fmt::format("bisect --against {}: bisect walks the released DeepSpeeds; use --against deepspeed", o.against));
  }
  const props::SeedInvariant& inv = props::find_seed_invariant(o.invariant);
  std::string from = "0.14.0", to;
  if (!o.releases.empty()) {
    const auto dots = o.releases.find("..");
    if (dots == std::string::npos) throw UsageError(fmt::format("--releases {}: use A..B (either side may be empty)", o.releases));
    if (dots > 0) from = o.releases.substr(0, dots);
    to = o.releases.substr(dots + 2);
    for (const std::string& v : {from, to}) {
      if (!v.empty()) props::normalize_target("deepspeed==" + v);
    }
    if (props::version_less(from, "0.14.0")) {
      throw UsageError(fmt::format("--releases {}: releases before 0.14.0 are not run (reference/deepspeed/torch_ranges.txt)", o.releases));
    }
  }
  const std::vector<std::string> releases = props::index_releases(from, to);
  if (releases.empty()) throw ConfigError(fmt::format("no DeepSpeed release on the package index in {}..{}", from, to));
  fmt::print(stderr, "zerocheck bisect: {} over {} releases ({}..{})\n", inv.name, releases.size(), releases.front(), releases.back());
  const props::Stopwatch watch;
  const props::Bisection b = props::bisect_releases(inv.name, releases, [&](const std::string& v) {
    const std::string target = "deepspeed==" + v;
    props::SeedResult r;
    r.target = target;
    r.invariant = inv.name;
    try {
      props::ReferencePools pools(props::reference_env(target, /*with_adam_ops=*/false));
      r = props::check_seed_invariant(pools, inv, o.cases, o.seed, std::filesystem::path(o.out) / label_of(target));
    } catch (const ZcError& e) {
      r.verdict = props::SeedVerdict::not_runnable;
      r.summary = e.what();
    }
    fmt::print(stderr, "bisect: {} {} ({} cases, {:.0f} s){}\n", v, props::to_string(r.verdict), r.cases, r.seconds,
               r.summary.empty() ? "" : ": " + r.summary.substr(0, 160));
    return r;
  }, o.all);
  nlohmann::json j = b.to_json();
  j["seconds"] = watch.seconds();
  j["releases"] = releases;
  std::filesystem::create_directories(o.out);
  std::ofstream(std::filesystem::path(o.out) / "bisect.json") << j.dump(2) << "\n";
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}: last release where it fails: {}; first where it holds: {} ({} of {} releases run, {:.0f} s)\n", inv.name,
               b.last_bad.value_or("none"), b.first_good.value_or("none"), b.order.size(), releases.size(), watch.seconds());
    for (const std::string& r : releases) {
      if (b.verdicts.contains(r)) fmt::print("  {:<8} {:<15} {}\n", r, props::to_string(b.verdicts.at(r).verdict), b.verdicts.at(r).summary.substr(0, 140));
    }
    if (!b.note.empty()) fmt::print("note: {}\n", b.note);
    if (!b.monotone) fmt::print("NOT MONOTONE: the history has more than one boundary\n");
  }
  return b.monotone && (b.first_good || b.last_bad) ? 0 : 1;
}

bool replay_seed_case(const std::filesystem::path& file, int& exit_code, const std::string& on) {
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("deepspeed_seed")) return false;
  const props::SeedInvariant& inv = props::find_seed_invariant(j["deepspeed_seed"].get<std::string>());
  const std::string target = on.empty() ? j.value("target", std::string("deepspeed")) : on;
  const props::SeedCase c = props::SeedCase::from_args(j.at("counterexample"));
  fmt::print("replaying {}\n  invariant {} on {}\n  case: {}\n", file.string(), inv.name, target, c.args().dump());
  props::ReferencePools pools(props::reference_env(target, /*with_adam_ops=*/false));
  const props::SeedResult r = props::check_seed_case(pools, inv, c, file.parent_path() / "replay-scratch");
  std::error_code ec;
  std::filesystem::remove_all(file.parent_path() / "replay-scratch", ec);
  fmt::print("verdict: {}\n  {}\nsaved: {}: {}\n", props::to_string(r.verdict), r.summary, j.value("verdict", std::string("?")),
             r.summary == j.value("summary", std::string()) ? "replayed exactly" : "DIFFERENT");
  exit_code = r.summary == j.value("summary", std::string()) ? 0 : 1;
  return true;
}

}  // namespace zc::cli
