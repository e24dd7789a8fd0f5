// `zerocheck verify`: runs the verify job with a progress bar and writes the reports;
// `zerocheck replay FILE`: reruns a saved counterexample exactly.
#include "cli/verify.h"

#include "cli/deepspeed_cli.h"
#include "props/deepspeed_target.h"

#include "cli/verify_mpi.h"

#include "engine/errors.h"
#include "props/reference.h"
#include "props/soak.h"
#include "props/verify.h"
#include "real/deepcompile_loader.h"
#include "reports/writers.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <thread>

namespace zc::cli {

namespace {

props::RunHooks real_hooks() { return {real::plugin_loaders()}; }

void draw_progress(const std::string& item, int done, int total) {
  const int width = 30;
  const int filled = total > 0 ? done * width / total : width;
  const bool tty = isatty(STDERR_FILENO) != 0;
  fmt::print(stderr, "{}[{}{}] {}/{} {}{}", tty ? "\r\033[K" : "", std::string(static_cast<std::size_t>(filled), '#'),
             std::string(static_cast<std::size_t>(width - filled), '.'), done, total, item, tty ? "" : "\n");
  if (tty && done == total) fmt::print(stderr, "\n");
}

// Chrome/Perfetto trace-event JSON: one thread per rank; collectives as async spans from issue to
// done; every other event an instant.
void write_timeline(const sim::SimResult& r, const std::string& path) {
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t rank = 0; rank < r.traces.size(); ++rank) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", rank},
                      {"args", {{"name", fmt::format("rank {}", rank)}}}});
    std::map<std::string, int> open;
    for (const TraceEvent& e : r.traces[rank].events()) {
      nlohmann::json ev = {{"cat", e.category()}, {"pid", 0}, {"tid", rank}, {"ts", e.time_us},
                           {"args", {{"detail", e.detail()}, {"index", e.index}, {"payload", fmt::format("0x{:016x}", e.payload)}}}};
      const bool issue = e.category() == "comm" && e.detail().rfind("issue ", 0) == 0;
      const bool done = e.category() == "comm" && e.detail().rfind("done ", 0) == 0;
      if (issue || done) {
        const std::string key = e.detail().substr(issue ? 6 : 5);
        const int n = issue ? open[key]++ : --open[key];
        ev["ph"] = issue ? "b" : "e";
        ev["name"] = key.substr(0, key.find('('));  // the collective: "all_reduce", ...
        ev["id"] = fmt::format("r{}:{}:{}", rank, key, n);
      } else {
        ev["ph"] = "i";
        ev["s"] = "t";
        ev["name"] = e.detail().substr(0, 60);
      }
      events.push_back(std::move(ev));
    }
  }
  std::ofstream out(path);
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (!out) throw UsageError(fmt::format("cannot write the timeline to {}", path));
}

// Each class of unlisted divergence: how many cases, the first one's failure, its shrunk file.
void print_unlisted_classes(const nlohmann::json& r) {
  for (const nlohmann::json& k : r.value("unlisted_classes", nlohmann::json::array())) {
    fmt::print("  unlisted: {} ({} cases)\n    {}\n", k.value("key", ""), k.value("cases", 0), k.value("failure", ""));
    if (k.contains("scenario_file")) fmt::print("    replay: zerocheck replay {}\n", k.value("scenario_file", ""));
    else fmt::print("    not shrunk (past the first {} classes of its run): its scenario is in the run's JSON\n",
                    props::kMaxUnlistedShrinks);
  }
}

// Comparisons that raised (a DeepSpeed worker crashed or hung): counted, the first few named. Workers
// that died between scenarios (replaced before the next one was sent): named, not errors.
void print_errors(const nlohmann::json& r) {
  const nlohmann::json deaths = r.value("worker_deaths_while_idle", nlohmann::json::array());
  if (!deaths.empty()) {
    fmt::print("  {} DeepSpeed workers died between scenarios and were replaced (no scenario was lost):\n", deaths.size());
    for (const nlohmann::json& d : deaths) fmt::print("    {}\n", d.get<std::string>());
  }
  if (r.value("errors", 0) == 0) return;
  fmt::print("  {} comparisons raised (a worker crashed or hung); the first:\n", r.value("errors", 0));
  for (const nlohmann::json& e : r.value("error_cases", nlohmann::json::array())) {
    fmt::print("    {}\n", e.value("failure", ""));
  }
}

void print_reference_summary(const nlohmann::json& r) {
  fmt::print("\nDeepSpeed {} reference: {} scenarios; values bit for bit in {}; everything (values and collectives) in {}; "
             "{} differ only in listed classes; {} refused by both; {} diverge unlisted; {} errors{}\n",
             r.value("deepspeed", "?"), r.value("cases", 0), r.value("values_bit_for_bit", 0), r.value("matched", 0),
             r.value("listed", 0), r.value("refused_by_both", 0), r.value("unlisted", 0), r.value("errors", 0),
             r.value("holds", false) ? "" : ": FAILS");
  if (r.contains("drift_from")) {
    fmt::print("  drift from the modelled DeepSpeed {}: the unlisted classes below are differences of this release, "
               "not a verdict on it (its verdicts: zerocheck verify --against deepspeed=={})\n",
               r.value("drift_from", ""), r.value("deepspeed", ""));
  }
  if (r.contains("error")) fmt::print("    {}\n", r.value("error", ""));
  print_unlisted_classes(r);
  print_errors(r);
  if (r.contains("coverage_summary")) {
    const nlohmann::json& c = r["coverage_summary"];
    fmt::print("  coverage: {} of {} cells (stage x dtype x communication dtype x clipping x offload x optimizer) drawn\n",
               c.value("drawn", 0), c.value("cells", 0));
  }
  for (const nlohmann::json& i : r.value("invariants_on_deepspeed", nlohmann::json::array())) {
    if (i.contains("not_run")) {
      fmt::print("  on DeepSpeed: {:<42} not run ({})\n", i.value("name", ""), i.value("not_run", ""));
      continue;
    }
    fmt::print("  on DeepSpeed: {:<42} holds {:<3} {:>4} cases\n", i.value("name", ""), i.value("holds", false) ? "yes" : "NO",
               i.value("cases", 0));
    if (i.contains("failure")) fmt::print("    {}\n", i.value("failure", ""));
  }
  if (r.contains("gaussian_conformance")) {
    for (const nlohmann::json& row : r["gaussian_conformance"].value("rows", nlohmann::json::array())) {
      fmt::print("  gaussian data, {}: grads bit for bit in {} of {} scenarios, grads and params in {}\n",
                 row.value("dtype", ""), row.value("grads_bit_for_bit", 0), row.value("scenarios", 0),
                 row.value("grads_and_params_bit_for_bit", 0));
    }
  }
  if (r.contains("i1_gaussian_on_deepspeed")) {
    const nlohmann::json& g = r["i1_gaussian_on_deepspeed"];
    fmt::print("  on DeepSpeed, gaussian data: coalesced vs per-backward differ in {} of {} scenarios, {} of {} gradient elements\n",
               g.value("scenarios_differing", 0), g.value("scenarios", 0), g.value("elements_differing", 0), g.value("elements", 0));
  }
  if (r.contains("fpa_witnesses_on_deepspeed")) {
    for (const nlohmann::json& w : r["fpa_witnesses_on_deepspeed"].value("witnesses", nlohmann::json::array())) {
      if (!w.contains("predicted_per_backward")) {
        fmt::print("  Z3 FPA witness on DeepSpeed, {}: {}\n", w.value("dtype", ""), w.value("detail", ""));
        continue;
      }
      fmt::print("  Z3 FPA witness on DeepSpeed, {}: per-backward {:.9g}, coalesced {:.9g} predicted; DeepSpeed {:.9g}, "
                 "{:.9g}: {}\n", w.value("dtype", ""), w.value("predicted_per_backward", 0.0), w.value("predicted_coalesced", 0.0),
                 w["deepspeed_per_backward"].at(0).get<double>(), w["deepspeed_coalesced"].at(0).get<double>(),
                 w.value("as_predicted", false) ? "as predicted" : "NOT AS PREDICTED");
    }
  }
  for (const nlohmann::json& c : r.value("classes", nlohmann::json::array())) {
    fmt::print("  class {:<34} {:>4} cases  witness {}\n", c.value("id", ""), c.value("cases", 0),
               c.value("witness_diverges", false) ? "diverges" : "DOES NOT DIVERGE: " + c.value("witness_detail", ""));
  }
}

}  // namespace

namespace {

// The DeepSpeed comparison's figures over a soak's rounds, printed and written as deepspeed.md.
void print_reference_soak(const props::SoakReport& r, const std::filesystem::path& out) {
  const nlohmann::json& j = r.reference;
  const std::size_t seeds = j.value("seeds", nlohmann::json::array()).size();
  const std::string head = fmt::format(
      "DeepSpeed 0.19.8 reference soak: {} scenarios over {} seeds in {:.0f} s ({:.0f} s in DeepSpeed); {} matched bit "
      "for bit (values and collectives), {} values bit for bit, {} only in listed classes, {} refused by both, {} "
      "unlisted, {} errors", j.value("cases", 0), seeds, r.seconds, j.value("deepspeed_seconds", 0.0),
      j.value("matched", 0), j.value("values_bit_for_bit", 0), j.value("listed", 0), j.value("refused_by_both", 0),
      j.value("unlisted", 0), j.value("errors", 0));
  fmt::print("{}\n", head);
  std::string classes;
  const nlohmann::json by_class = j.value("listed_by_class", nlohmann::json::object());
  for (const auto& [id, n] : by_class.items()) {
    fmt::print("  listed class {:<34} {:>5} cases\n", id, n.get<int>());
    classes += fmt::format("| `{}` | {} |\n", id, n.get<int>());
  }
  print_unlisted_classes(j);
  print_errors(j);
  const nlohmann::json cov = props::coverage_summary(j);
  fmt::print("  coverage: {} of {} cells drawn\n", cov.value("drawn", 0), cov.value("cells", 0));
  std::string seed_list;
  for (const nlohmann::json& sd : j.value("seeds", nlohmann::json::array())) seed_list += fmt::format(" {}", sd.get<std::uint64_t>());
  std::ofstream md(out / "deepspeed.md");
  md << "# " << head << "\n\nRound seeds:" << seed_list << "\n\n"
     << (classes.empty() ? "" : "| listed class | cases |\n|---|---:|\n" + classes + "\n")
     << reports::md_reference_counts(j);
  fmt::print("  {}\n", (out / "deepspeed.md").string());
}

}  // namespace

// Ctrl-C or SIGTERM ends a soak run early, as a spent budget does: running items finish, the
// report is written. (Forked children inherit the handler, so they finish their items too.)
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted = true; }

// "90s", "10m", "8h", "1h30m" (a bare number is seconds). UsageError otherwise.
double parse_duration(const std::string& text) {
  double total = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text.substr(pos), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || v < 0) break;
    pos += used;
    const char unit = pos < text.size() ? text[pos++] : 's';
    const double scale = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : -1;
    if (scale < 0) break;
    total += v * scale;
    if (pos == text.size() && total > 0) return total;
  }
  throw UsageError(fmt::format("--budget '{}': give a duration such as 90s, 10m, 8h or 1h30m", text));
}

// Test-only fault injection (props::VerifyFaults), from the environment so mpirun -x carries it.
props::VerifyFaults faults_from_env() {
  props::VerifyFaults f;
  auto get = [](const char* k) { const char* v = std::getenv(k); return v == nullptr ? std::string() : std::string(v); };
  f.crash_item = get("ZC_VERIFY_CRASH_ITEM");
  f.hang_item = get("ZC_VERIFY_HANG_ITEM");
  if (!f.crash_item.empty()) f.crash_times = get("ZC_VERIFY_CRASH_TIMES").empty() ? 1 : std::stoi(get("ZC_VERIFY_CRASH_TIMES"));
  if (!get("ZC_VERIFY_DIE_RANK").empty()) {
    f.die_rank = std::stoi(get("ZC_VERIFY_DIE_RANK"));
    f.die_after = get("ZC_VERIFY_DIE_AFTER").empty() ? 1 : std::stoi(get("ZC_VERIFY_DIE_AFTER"));
  }
  return f;
}

int run_soak_cli(const VerifyCliOptions& o, int jobs, bool mpi) {
  props::SoakOptions s;
  s.seed = o.seed;
  s.out = o.out_given ? o.out : "reports/soak";
  s.jobs = jobs;
  s.only = o.only;
  s.hooks = real_hooks();
  if (o.against == "deepspeed") {
    s.deepspeed_cases_per_item = o.deepspeed_cases;
    props::reference_env();  // a missing environment is an error now, not in every round
  }
  const double budget_s = parse_duration(o.budget);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(budget_s);
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  s.keep_going = [end] { return !g_interrupted && std::chrono::steady_clock::now() < end; };  // the clock lives in cli/
  auto last = std::chrono::steady_clock::now();
  auto progress = [&last](const props::SoakReport& r) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::seconds(10)) return;
    last = now;
    fmt::print(stderr, "soak: {:.0f} s, {} cases, {} distinct, {} reruns, {} mismatches, {} failures\n", r.seconds,
               r.cases, r.distinct, r.reruns, r.mismatches, r.failures.size());
  };
  fmt::print(stderr, "zerocheck verify --budget {}: soak from seed {}, {} jobs{}, report in {}\n", o.budget, s.seed,
             s.jobs, mpi ? " per rank" : "", s.out.string());
  std::optional<props::SoakReport> got = mpi ? run_soak_mpi(s, progress) : props::run_soak(s, progress);
  if (!got) return 0;  // an MPI worker: rank 0 reports
  const props::SoakReport& r = *got;
  fmt::print("soak: {} cases ({} distinct scenarios, {} discarded) in {:.0f} s on {} rank(s) x {} jobs; {} rounds of "
             "seeds; {} determinism reruns, {} mismatches; {} failures; {} item errors\n", r.cases, r.distinct,
             r.discarded, r.seconds, r.ranks, r.jobs, r.rounds, r.reruns, r.mismatches, r.failures.size(),
             r.item_errors);
  if (!r.slowest.invariant.empty()) {  // none when the soak ran the DeepSpeed comparison alone
    fmt::print("slowest case: {:.3f} s, {} (round seed {}, case {}); replay: zerocheck replay {}/slowest.json\n",
               r.slowest.seconds, r.slowest.invariant, r.slowest.seed, r.slowest.index, s.out.string());
  }
  for (const std::string& d : r.mismatch_details) fmt::print("mismatch: {}\n", d);
  for (const std::string& f : r.failures) fmt::print("failure: {}\n", f);
  if (!r.reference.is_null()) print_reference_soak(r, s.out);
  fmt::print("{}; {}/soak.json\n", r.passed() ? "PASS" : "FAIL", s.out.string());
  return r.passed() ? 0 : 1;
}

int run_verify_cli(const VerifyCliOptions& o) {
  const bool other_deepspeed = !o.against.empty() && o.against != "deepspeed";
  if (other_deepspeed) props::normalize_target(o.against);  // a malformed --against is refused first
  const bool only_reference = std::find(o.only.begin(), o.only.end(), "deepspeed") != o.only.end();
  if (other_deepspeed && !only_reference) {
    if (!o.budget.empty() || !o.config.empty() || !o.resume.empty()) {
      throw UsageError(fmt::format("--against {}: runs the seeds' invariants on that DeepSpeed; --budget, --config and "
                                   "--resume go with the pinned --against deepspeed", o.against));
    }
    return run_verify_deepspeed_target(o);
  }
  const bool mpi = verify_under_mpi();
  const int jobs = o.jobs > 0 ? o.jobs : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (!o.budget.empty()) {
    if (!o.resume.empty()) throw UsageError("--budget and --resume: a soak run has no journal to resume");
    if (!o.config.empty()) throw UsageError("--budget and --config: a soak draws the whole space; run --config with a profile");
    return run_soak_cli(o, jobs, mpi);
  }
  props::VerifyOptions opts;
  opts.profile = props::profile_named(o.profile);
  opts.seed = o.seed;
  opts.out = o.out;
  if (!o.resume.empty()) {
    if (o.out_given && std::filesystem::path(o.out) != std::filesystem::path(o.resume)) {
      throw UsageError(fmt::format("--resume {} and --out {}: a resumed run writes where it started; drop --out",
                                   o.resume, o.out));
    }
    opts.out = o.resume;
    opts.resume = true;
  }
  opts.jobs = jobs;
  opts.only = o.only;
  opts.bugs = o.bugs;
  opts.proofs = !o.no_proofs;
  const auto ds_only = std::find(opts.only.begin(), opts.only.end(), "deepspeed");
  if (ds_only != opts.only.end()) {
    if (o.against.rfind("deepspeed", 0) != 0) throw ConfigError("--only deepspeed needs --against deepspeed");
    opts.only.erase(ds_only);
    if (opts.only.empty()) {  // the reference alone
      opts.engine_items = false;
      opts.proofs = false;
    }
  }
  if (o.against.rfind("deepspeed", 0) == 0) {
    opts.deepspeed_cases = o.deepspeed_cases;
    opts.deepspeed_i3 = o.deepspeed_i3;
    opts.deepspeed = props::normalize_target(o.against);
    props::reference_env(opts.deepspeed);  // a missing environment is an error now (another DeepSpeed: made now)
  }
  if (!o.config.empty()) {
    if (o.against == "deepspeed") {
      throw UsageError("--config and --against deepspeed: the DeepSpeed comparison draws its own scenarios; run it "
                       "separately; a --config counterexample runs on DeepSpeed with `zerocheck replay FILE --against deepspeed`");
    }
    std::vector<std::string> notes;
    // The scenarios' models are 16 wide or less: "auto" bucket sizes resolve from hidden 16.
    nlohmann::json given = load_ds_config(o.config);
    if (given.is_object()) {  // the batch is drawn (props/user_config.h): its "auto"s need no option
      for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
        given.erase(k);
      }
    }
    const nlohmann::json cfg = as_training_script(given, o.hf, training_args(o.hf, 1, 16), notes);
    opts.user_config = props::user_config_from_json(cfg, o.config);
    opts.proofs = false;  // the proofs are about zerocheck's engine, not this config
    opts.user_config->warnings.insert(opts.user_config->warnings.end(), notes.begin(), notes.end());
    for (const std::string& w : opts.user_config->warnings) fmt::print(stderr, "warning: {}\n", w);
    for (const std::string& n : opts.user_config->not_checked) fmt::print(stderr, "not checked: {}\n", n);
    fmt::print(stderr, "zerocheck verify --config {}: pinned {}\n", o.config, props::describe(opts.user_config->pins));
  }
  opts.hooks = real_hooks();
  opts.faults = faults_from_env();
  opts.item_timeout_s = o.item_timeout_s;
  opts.progress = draw_progress;
  opts.started = fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr)));
  fmt::print(stderr, "zerocheck verify: profile {}, seed {}, {} jobs{}{}, reports in {}\n", opts.profile.name,
             opts.seed, opts.jobs, mpi ? " per MPI rank" : "", opts.resume ? ", resuming" : "", opts.out.string());
  const std::optional<props::VerifyReport> got = mpi ? run_verify_mpi(opts) : props::run_verify(opts);
  if (!got) return 0;  // an MPI worker: rank 0 writes the report and gives the verdict
  const props::VerifyReport& report = *got;
  reports::write_all(report, opts.out);

  fmt::print("\n{:<48} {:>6} {:>6} {:>8}\n", "invariant", "holds", "cases", "seconds");
  for (const props::InvariantResult& i : report.invariants) {
    fmt::print("{:<48} {:>6} {:>6} {:>8.1f}\n", i.name, !i.not_applicable.empty() ? "n/a" : i.holds ? "yes" : "NO",
               i.cases, i.seconds);
    if (!i.not_applicable.empty()) fmt::print("    not applicable to this config: {}\n", i.not_applicable);
    if (!i.holds) fmt::print("    {}\n    saved: {}{}\n", i.failure, i.scenario_file,
                             i.ds_config_file.empty() ? "" : " (its ds_config: " + i.ds_config_file + ")");
  }
  if (!report.bugs.empty()) fmt::print("\n{:<4} {:<7} {:<40} {:>6} {:>8}\n", "bug", "caught", "by", "cases", "seconds");
  for (const props::BugResult& b : report.bugs) {
    fmt::print("{:<4} {:<7} {:<40} {:>6} {:>8.1f}\n", b.id, b.caught ? "yes" : "NO", b.by, b.cases_to_catch, b.seconds);
  }
  int proofs_ok = 0;
  for (const props::ProofResult& p : report.proofs) proofs_ok += p.ok();
  fmt::print("\nproofs: {}/{} as expected; determinism: {} reruns, {} mismatches\n", proofs_ok, report.proofs.size(),
             report.determinism.runs, report.determinism.mismatches);
  if (!report.reference.is_null()) print_reference_summary(report.reference);
  for (const std::string& e : report.errors) fmt::print("error: {}\n", e);
  fmt::print("{} in {:.1f} s; report: {}/report.html\n", report.passed() ? "PASS" : "FAIL", report.seconds, opts.out.string());
  return report.passed() ? 0 : 1;
}

namespace {

// Note [A counterexample on DeepSpeed]: `replay FILE --against deepspeed[==V|@DIR]` runs the
// counterexample's scenario (the calls; a verify --config one's ds_config is the scenario's, written
// beside it) on DeepSpeed through the reference's twin. Two answers: the invariant stated on DeepSpeed
// alone where zerocheck has that statement (I1: coalesced against per-backward, both on DeepSpeed; I2:
// micro_step_id at each flush), so the user learns whether DeepSpeed has the failure too; and the
// comparison of DeepSpeed's values and collectives with the engine's on that scenario (the engine
// with no known bug switched on), classified as the campaign classifies it. The exit status is
// DeepSpeed's verdict where there is one, else the comparison's.

// Before anything runs: the scenario is in the twin's domain, and the ds_config written beside it
// (the file a user may run by hand) is the one DeepSpeed will run. Returns that file ("" if none).
std::string check_runnable_on_deepspeed(const ReplayOptions& o, const props::SavedCase& saved) {
  const props::Scenario& s = saved.scenario;
  if (const std::string why = props::reference_unexpressible(s); !why.empty()) {
    throw UsageError(fmt::format("{}: DeepSpeed's twin cannot run this scenario: {} (the twin's domain: "
                                 "docs/deepspeed-reference.md)", o.file, why));
  }
  const std::filesystem::path beside = std::filesystem::path(o.file).replace_extension(".ds_config.json");
  if (!std::filesystem::exists(beside)) return "";
  nlohmann::json ran = props::ds_config(s);
  ran["train_micro_batch_size_per_gpu"] = props::kScenarioMicroBatch;
  if (load_ds_config(beside.string()) != ran) {
    throw UsageError(fmt::format("{} is not the scenario's ds_config (edited?): the replay runs the scenario in {}, "
                                 "whose ds_config is\n{}", beside.string(), o.file, ran.dump(2)));
  }
  return beside.string();
}

int replay_on_deepspeed(const ReplayOptions& o, const props::SavedCase& saved, const std::string& ds_config_file) {
  const std::string target = props::normalize_target(o.against);
  const props::Scenario& s = saved.scenario;
  fmt::print("\non {} (the twin: reference/deepspeed/twin.py){}\n", target,
             ds_config_file.empty() ? "" : ", with the ds_config " + ds_config_file);
  props::ReferencePools pools(props::reference_env(target, props::runs_deepspeed_adam_ops(s)));
  int rc = 0;
  bool stated = false;
  if (const std::string name = props::deepspeed_counterpart(saved.invariant); !name.empty()) {
    const std::vector<props::Invariant> on_ds = props::reference_invariants(pools);
    const auto it = std::find_if(on_ds.begin(), on_ds.end(), [&](const props::Invariant& i) { return i.name == name; });
    ZC_ASSERT(it != on_ds.end(), "deepspeed_counterpart names {}, which reference_invariants() lacks", name);
    const props::Verdict d = it->check(s, props::CheckContext{});
    stated = d.applies;
    fmt::print("  {} on DeepSpeed: {}\n", name,
               !d.applies ? "not applicable (outside the exact domain: " + props::exact_infeasible(s) + ")"
               : d.holds  ? "holds"
                          : "FAILS");
    if (!d.failure.empty()) fmt::print("    {}\n", d.failure);
    rc = d.applies && !d.holds ? 1 : 0;
  } else {
    fmt::print("  {} has no statement on DeepSpeed alone (those are I1-coalesced-bit-exact and "
               "I2-micro-step-zero-at-flush); the comparison says whether DeepSpeed computes what the engine does\n",
               saved.invariant);
  }
  const props::ReferenceComparison c = props::compare_with_deepspeed(s, pools);
  const props::ReferenceVerdict cv =
      props::classify(s, c, props::load_divergence_classes(props::divergence_classes_file()));
  fmt::print("  the engine{} against DeepSpeed on this scenario: {}\n",
             saved.bugs.none() ? "" : " (no known bug switched on)",
             cv.refused  ? "both refuse it (" + c.ds_error + ")"
             : cv.matched ? "the same values and collectives, bit for bit"
             : cv.verdict.holds
                 ? fmt::format("different, each difference a listed class ({})", fmt::join(cv.classes, ", "))
                 : fmt::format("DIFFERENT in {} ({})", fmt::join(cv.unlisted, ", "), cv.verdict.failure));
  if (!stated && !cv.verdict.holds) rc = 1;
  return rc;
}

}  // namespace

int run_replay(const ReplayOptions& o) {
  // a seed invariant's case on a DeepSpeed
  if (int rc = 0; replay_seed_case(o.file, rc, o.against.empty() ? "" : props::normalize_target(o.against))) return rc;
  const props::SavedCase saved = props::load_case(o.file);
  const props::Invariant* inv = props::find_invariant(saved.invariant);
  // A DeepSpeed counterexample reruns both sides: the simulator and DeepSpeed through a fresh pool.
  std::unique_ptr<props::ReferencePools> pools;
  std::vector<props::Invariant> reference;
  if (inv == nullptr && saved.invariant.rfind("deepspeed-", 0) == 0) {
    pools = std::make_unique<props::ReferencePools>(
        props::reference_env(o.against.empty() ? "deepspeed" : props::normalize_target(o.against)));
    reference = props::reference_invariants(*pools);
    for (const props::Invariant& r : reference) {
      if (r.name == saved.invariant) inv = &r;
    }
  }
  if (inv == nullptr) throw ConfigError(fmt::format("{}: no invariant named '{}'", o.file, saved.invariant));
  const bool on_deepspeed = !o.against.empty() && pools == nullptr;
  const std::string ds_config_file = on_deepspeed ? check_runnable_on_deepspeed(o, saved) : "";
  const props::CheckContext ctx{saved.bugs, real_hooks()};
  fmt::print("replaying {}\n  invariant {}\n  known bugs switched on: {}\n  scenario: {}\n", o.file, saved.invariant,
             saved.bugs.str(), props::describe(saved.scenario));
  const props::Verdict v = inv->check(saved.scenario, ctx);
  if (!v.applies) {  // a discarded scenario holds vacuously: say so instead of "holds"
    throw ConfigError(fmt::format("{}: the scenario is outside {}'s domain here{}", o.file, saved.invariant,
                                  v.failure.empty() ? "" : ": " + v.failure));
  }
  fmt::print("verdict: {}\ntrace hash: 0x{:016x}\n", v.holds ? "holds" : "FAILS", v.trace_hash);
  if (!v.failure.empty()) fmt::print("first divergence: {}\n", v.failure);
  const bool same = v.holds == saved.holds && v.trace_hash == saved.trace_hash;
  fmt::print("saved: {} with trace hash 0x{:016x}: {}\n", saved.holds ? "holds" : "fails", saved.trace_hash,
             same ? "replayed exactly" : "DIFFERENT (the run is not deterministic, or the engine changed)");
  if (o.rapidcheck && !saved.reproduce.empty()) {
    const props::Campaign c = props::run_campaign(*inv, ctx, 1, saved.rc_seed, saved.reproduce);
    fmt::print("RapidCheck reproduce string: regenerated {}; {}\n", props::describe(c.counterexample),
               c.counterexample == saved.scenario ? "the same scenario" : "a DIFFERENT scenario");
  }
  if (!o.trace.empty()) {
    try {
      const sim::SimResult r = props::run_on_sim(props::to_run_spec(saved.scenario, saved.bugs, ctx.hooks)).sim;
      write_timeline(r, o.trace);
      fmt::print("timeline: {} (open in https://ui.perfetto.dev or chrome://tracing)\n", o.trace);
    } catch (const ZcError& e) {
      fmt::print("timeline: not written: the scenario's run raised {}\n", e.what());
    }
  }
  if (on_deepspeed) return replay_on_deepspeed(o, saved, ds_config_file);
  return v.holds ? 0 : 1;
}

}  // namespace zc::cli
