// report.md: the verify run for a person reading the file or its rendering. Identifiers, files,
// reproduce strings and failures are code spans; prose is escaped (text.h), so no value from the
// run can break a table row or inject HTML.
#include "props/reference.h"
#include "reports/text.h"
#include "reports/writers.h"

#include <fmt/format.h>

namespace zc::reports {

namespace {

using props::BugResult;
using props::InvariantResult;
using props::VerifyReport;

// A table cell's code span, or a dash for a value the run did not produce.
std::string code_or_dash(const std::string& s) { return s.empty() ? "\u2014" : md_code(s); }
// A code span in running text, where '|' needs no escape.
std::string inline_code(const std::string& s) { return s.empty() ? "\u2014" : md_code(s, false); }

std::string md_header(const VerifyReport& r) {
  const std::string reasons = failure_reasons(r);
  return fmt::format("# zerocheck verify: {}\n\n**{}**{}: {}\n\n", verdict(r), verdict(r),
                     reasons.empty() ? "" : " (" + reasons + ")", md_text(run_line(r)));
}

std::string md_invariants(const VerifyReport& r) {
  std::string s =
      "## Invariants\n\n| invariant | holds | cases | discarded | seconds |\n"
      "|---|---|---:|---:|---:|\n";
  for (const InvariantResult& i : r.invariants) {
    s += fmt::format("| {} | {} | {} | {} | {:.2f} |\n", md_code(i.name),
                     !i.not_applicable.empty() ? "n/a" : i.holds ? "yes" : "**NO**", i.cases, i.discarded, i.seconds);
  }
  for (const InvariantResult& i : r.invariants) {
    s += fmt::format("\n### {}\n\n{}\n", md_code(i.name, false), md_text(i.explanation));
    if (!i.not_applicable.empty()) s += fmt::format("\n**Not applicable to this config:** {}\n", md_text(i.not_applicable));
    if (!i.ds_config_file.empty()) s += fmt::format("\nThe counterexample's ds_config: {}\n", inline_code(i.ds_config_file));
    if (i.holds) continue;
    s += fmt::format("\n**Does not hold:** {}\n", inline_code(i.failure));
    s += fmt::format("\nShrunk counterexample, saved as {}, reproduce with {}:\n\n{}",
                     inline_code(i.scenario_file), inline_code(i.reproduce),
                     md_fenced(compact_json(i.counterexample), "json"));
  }
  return s + "\n";
}

std::string md_bugs(const VerifyReport& r) {
  std::string s =
      "## Known bugs and DeepSpeed hazards\n\n| bug | summary | caught | by | cases to catch | seconds | "
      "shrunk scenario file | reproduce |\n|---|---|---|---|---:|---:|---|---|\n";
  for (const BugResult& b : r.bugs) {
    s += fmt::format("| {} | {} | {} | {} | {} | {:.2f} | {} | {} |\n", md_code(b.id),
                     md_text(b.summary), b.caught ? "yes" : "**NO**", code_or_dash(b.by),
                     b.caught ? fmt::format("{}", b.cases_to_catch) : "\u2014", b.seconds,
                     code_or_dash(b.scenario_file), code_or_dash(b.reproduce));
  }
  for (const BugResult& b : r.bugs) {
    s += fmt::format("\n### {} shrunk scenario\n\n", md_code(b.id, false));
    if (!b.caught) {
      s += fmt::format("Not caught after {:.2f} s; expected to be caught by {}.\n", b.seconds,
                       inline_code(b.expected_by));
      continue;
    }
    s += fmt::format("Failure: {} ({} shrink steps)\n\n{}", inline_code(b.failure), b.shrink_steps,
                     md_fenced(compact_json(b.scenario), "json"));
  }
  return s + "\n";
}

std::string md_proofs(const VerifyReport& r) {
  std::string s =
      "## Proofs\n\n| proof | verdict | expected | seconds | detail |\n|---|---|---|---:|---|\n";
  for (const props::ProofResult& p : r.proofs) {
    s += fmt::format("| {} | {}{} | {} | {:.2f} | {} |\n", md_code(p.name), md_code(p.verdict),
                     p.ok() ? "" : " **(unexpected)**", md_code(p.expected), p.seconds,
                     md_code(p.detail));
  }
  return s + "\n";
}

std::string md_collectives(const VerifyReport& r) {
  std::string s =
      "## Collectives per step\n\n| ZeRO stage | N backward | baseline | coalesced |\n"
      "|---:|---:|---:|---:|\n";
  for (const props::CollectivePoint& c : r.collectives) {
    s += fmt::format("| {} | {} | {:g} | {:g} |\n", c.stage, c.n_backward, c.baseline, c.coalesced);
  }
  return s;
}

}  // namespace

// Unlisted divergences by class, and the coverage grid (Note [Counting the comparison]).
std::string md_reference_counts(const nlohmann::json& j) {
  std::string s;
  const nlohmann::json unlisted = j.value("unlisted_classes", nlohmann::json::array());
  if (!unlisted.empty()) {
    s += "Unlisted divergences, by class (the first case of each shrunk and saved):\n\n"
         "| class | cases | first failure | shrunk counterexample |\n|---|---:|---|---|\n";
    for (const nlohmann::json& k : unlisted) {
      s += fmt::format("| {} | {} | {} | {} |\n", md_text(k.value("key", "")), k.value("cases", 0),
                       code_or_dash(k.value("failure", "")), code_or_dash(k.value("scenario_file", "")));
    }
    s += "\n";
  }
  if (!j.contains("coverage")) return s;
  const nlohmann::json grid = props::coverage_grid(j);
  const nlohmann::json summary = props::coverage_summary(j);
  s += fmt::format("Coverage: {} of {} cells (stage x dtype x communication dtype x clipping x offload x optimizer) "
                   "drawn; {}.\n\n| | ", summary.value("drawn", 0), summary.value("cells", 0), md_text(grid.value("what", "")));
  std::string rule = "|---|";
  for (const nlohmann::json& c : grid["columns"]) {
    s += md_text(c.get<std::string>()) + " | ";
    rule += "---:|";
  }
  s += "\n" + rule + "\n";
  for (const nlohmann::json& row : grid["rows"]) {
    s += "| " + md_text(row.value("row", "")) + " | ";
    for (const nlohmann::json& c : row["cells"]) s += md_text(c.get<std::string>()) + " | ";
    s += "\n";
  }
  return s + "\n";
}

namespace {

// The memory comparison of the same scenarios (props/reference_memory.cpp): by row and by category.
std::string md_reference_memory(const nlohmann::json& j) {
  if (!j.contains("memory")) return "";
  const nlohmann::json& m = j["memory"];
  std::string s = fmt::format(
      "\n### Memory: DeepSpeed's CPU allocations against the engine's ledger\n\n{} scenarios: every figure (construction, "
      "steps and each step's peak, after-forward and after-step bytes, each category's peak, rank by rank) equal to "
      "the byte in {}, equal but for listed memory classes in {}, within 1 % in {}, beyond in {}; not measured in {}. "
      "Not part of the verdict yet.\n\n"
      "| stage / model / offload / dtype | scenarios | exact | listed | within 1 % | beyond | not measured |\n"
      "|---|---:|---:|---:|---:|---:|---:|\n",
      m.value("scenarios", 0), m.value("exact", 0), m.value("listed", 0), m.value("within_1pct", 0), m.value("beyond", 0),
      m.value("not_measured", 0));
  for (const nlohmann::json& row : m.value("rows", nlohmann::json::array())) {
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", md_text(row.value("row", "")), row.value("scenarios", 0),
                     row.value("exact", 0), row.value("listed", 0), row.value("within_1pct", 0), row.value("beyond", 0),
                     row.value("not_measured", 0));
  }
  s += "\n| figure's category | figures | exact | listed | within 1 % |\n|---|---:|---:|---:|---:|\n";
  for (const nlohmann::json& row : m.value("categories", nlohmann::json::array())) {
    s += fmt::format("| {} | {} | {} | {} | {} |\n", md_text(row.value("category", "")), row.value("figures", 0),
                     row.value("exact", 0), row.value("listed", 0), row.value("within_1pct", 0));
  }
  const nlohmann::json listed = m.value("listed_by_class", nlohmann::json::object());
  for (const auto& [id, n] : listed.items()) {
    s += fmt::format("\n- memory class `{}`: {} scenarios", md_text(id), n.get<int>());
  }
  for (const nlohmann::json& e : m.value("examples", nlohmann::json::array())) {
    s += fmt::format("\n- {}:", md_text(e.value("scenario", "")));
    for (const nlohmann::json& d : e.value("differences", nlohmann::json::array())) s += " " + md_text(d.get<std::string>()) + ";";
  }
  for (const nlohmann::json& r : m.value("not_measured_reasons", nlohmann::json::array())) {
    s += fmt::format("\n- not measured in {} (the first: {}): {}", r.value("scenarios", 0),
                     md_text(r.value("first", "")), md_text(r.value("reason", "")));
  }
  if (const int other = m.value("not_measured_other_reasons", 0); other > 0) {
    s += fmt::format("\n- not measured in {}: reasons beyond the {} above, counted, not kept",
                     other, m["not_measured_reasons"].size());
  }
  return s + "\n";
}

// verify --against deepspeed: the comparison with DeepSpeed, its conformance table and the known
// divergence classes with their witnesses.
std::string md_reference(const VerifyReport& r) {
  if (r.reference.is_null()) return "";
  const nlohmann::json& j = r.reference;
  std::string s = fmt::format(
      "## DeepSpeed {} reference\n\n{} scenarios on real DeepSpeed (CPU, gloo) and on the simulator: values (gradients, "
      "params, masters, loss scale, skipped steps, micro_step_id) bit for bit in {}; values and collectives in {}; "
      "{} differ only in listed divergence classes; {} refused by both; {} diverge unlisted. Comparison {}.\n\n",
      md_text(j.value("deepspeed", "?")), j.value("cases", 0), j.value("values_bit_for_bit", 0), j.value("matched", 0),
      j.value("listed", 0), j.value("refused_by_both", 0), j.value("unlisted", 0),
      j.value("holds", false) ? "holds" : "**FAILS**");
  if (j.contains("error")) s += "Error: " + md_text(j.value("error", "")) + "\n\n";
  s += md_reference_counts(j);
  s += "| feature | scenarios | values bit for bit | collectives equal | only listed differences | refused by both | failed |\n"
       "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const nlohmann::json& row : j.value("conformance", nlohmann::json::array())) {
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", md_text(row.value("feature", "")), row.value("scenarios", 0),
                     row.value("values_bit_for_bit", 0), row.value("collectives_equal", 0),
                     row.value("diverged_in_listed_classes", 0), row.value("refused_by_both", 0), row.value("failed", 0));
  }
  s += md_reference_memory(j);
  s += "\n### Invariants on DeepSpeed itself\n\n| invariant | holds | cases | failure |\n|---|---|---:|---|\n";
  const nlohmann::json* i3 = nullptr;
  const nlohmann::json on_ds = j.value("invariants_on_deepspeed", nlohmann::json::array());
  for (const nlohmann::json& i : on_ds) {
    if (i.contains("not_run")) {
      s += fmt::format("| {} | not run ({}) | 0 | - |\n", code_or_dash(i.value("name", "")), md_text(i.value("not_run", "")));
      continue;
    }
    s += fmt::format("| {} | {} | {} | {} |\n", code_or_dash(i.value("name", "")), i.value("holds", false) ? "yes" : "**NO**",
                     i.value("cases", 0), code_or_dash(i.value("failure", "")));
    if (i.contains("facts") && i["facts"].contains("mutants")) i3 = &i;
  }
  if (i3 != nullptr) {
    // Each lifecycle of the I3 probe: which backend compile installed, how far DeepSpeed got, and
    // whether DeepCompile's handle was requested.
    const nlohmann::json& f = (*i3)["facts"];
    s += "\nI3 on DeepSpeed, lifecycle by lifecycle (world 2; `deepcompile active`: compile installed the pass's "
         "DeepCompile backend, else DeepSpeed fell back to torch's compiler):\n\n"
         "| lifecycle | deepcompile active | reached | destroyed | handle requested | where DeepSpeed stopped |\n"
         "|---|---|---|---|---|---|\n";
    auto lifecycle = [&](const nlohmann::json& run, const std::string& label) {
      const std::string stopped = run.contains("stopped")
                                      ? fmt::format("{} ({})", run["stopped"].value("error", "").substr(0, 120),
                                                    run["stopped"].contains("deepspeed_frame") && run["stopped"]["deepspeed_frame"].is_string()
                                                        ? run["stopped"]["deepspeed_frame"].get<std::string>()
                                                        : std::string("-"))
                                      : "";
      const nlohmann::json requests = run.value("handle_requests", nlohmann::json::array());
      s += fmt::format("| {} | {} | {} | {} | {} | {} |\n", md_text(label),
                       run.contains("deepcompile_active") ? (run["deepcompile_active"].get<bool>() ? "yes" : "no") : "-",
                       md_text(run.value("reached", "")), run.value("destroyed", false) ? "yes" : "no",
                       run.value("handle_requested", false) ? fmt::format("**yes** ({})", md_text(requests.dump())) : "no",
                       stopped.empty() ? "-" : md_text(stopped));
    };
    for (const nlohmann::json& lc : f.value("runs", nlohmann::json::array())) {
      lifecycle(lc, fmt::format("{} stage {}", lc["passes"].at(0).get<std::string>(), lc.value("stage", -1)));
    }
    if (f.contains("control_z1_deepcompile")) lifecycle(f["control_z1_deepcompile"], "control: DeepCompile z1 pass, stage 1");
    for (const nlohmann::json& m : f.value("mutants", nlohmann::json::array())) {
      lifecycle(m, fmt::format("control: autosp stage 0 with {}'s historical gate", m.value("mutant", "?")));
    }
  }
  if (j.contains("i1_gaussian_on_deepspeed")) {
    const nlohmann::json& g = j["i1_gaussian_on_deepspeed"];
    s += fmt::format("\nGaussian data ({}): the two paths differ in {} of {} scenarios, {} of {} gradient elements.\n",
                     md_text(g.value("what", "")), g.value("scenarios_differing", 0), g.value("scenarios", 0),
                     g.value("elements_differing", 0), g.value("elements", 0));
  }
  if (j.contains("fpa_witnesses_on_deepspeed")) {
    const nlohmann::json& f = j["fpa_witnesses_on_deepspeed"];
    s += fmt::format("\nZ3's rounding witnesses on DeepSpeed ({}):\n\n| dtype | rank 0 grads | rank 1 grads | predicted "
                     "per-backward / coalesced | DeepSpeed per-backward / coalesced | as predicted |\n"
                     "|---|---|---|---|---|---|\n", md_text(f.value("what", "")));
    for (const nlohmann::json& w : f.value("witnesses", nlohmann::json::array())) {
      if (!w.contains("grads")) {
        s += fmt::format("| {} | - | - | - | - | **NO**: {} |\n", md_text(w.value("dtype", "")), md_text(w.value("detail", "")));
        continue;
      }
      const nlohmann::json& g = w["grads"];
      s += fmt::format("| {} | {:.9g}, {:.9g} | {:.9g}, {:.9g} | {:.9g} / {:.9g} | {:.9g} / {:.9g} | {} |\n",
                       md_text(w.value("dtype", "")), g[0][0].get<double>(), g[0][1].get<double>(), g[1][0].get<double>(),
                       g[1][1].get<double>(), w.value("predicted_per_backward", 0.0), w.value("predicted_coalesced", 0.0),
                       w["deepspeed_per_backward"].at(0).get<double>(), w["deepspeed_coalesced"].at(0).get<double>(),
                       w.value("as_predicted", false) ? "yes" : "**NO**");
    }
  }
  if (j.contains("gaussian_conformance")) {
    const nlohmann::json& g = j["gaussian_conformance"];
    s += fmt::format("\nGaussian-domain row ({}):\n\n| dtype | scenarios | grads bit for bit | grads and params bit for bit |\n"
                     "|---|---:|---:|---:|\n", md_text(g.value("what", "")));
    for (const nlohmann::json& row : g.value("rows", nlohmann::json::array())) {
      s += fmt::format("| {} | {} | {} | {} |\n", md_text(row.value("dtype", "")), row.value("scenarios", 0),
                       row.value("grads_bit_for_bit", 0), row.value("grads_and_params_bit_for_bit", 0));
    }
  }
  s += "\n### Known divergence classes\n\n| class | cases | witness | affects | DeepSpeed |\n|---|---:|---|---|---|\n";
  for (const nlohmann::json& c : j.value("classes", nlohmann::json::array())) {
    std::string affects;
    for (const nlohmann::json& a : c.value("affects", nlohmann::json::array())) affects += (affects.empty() ? "" : ", ") + a.get<std::string>();
    s += fmt::format("| {} | {} | {} | {} | {} |\n", code_or_dash(c.value("id", "")), c.value("cases", 0),
                     c.value("witness_diverges", false) ? "diverges" : "**does not diverge**", md_text(affects),
                     md_text(c.value("deepspeed", "")));
  }
  for (const nlohmann::json& c : j.value("classes", nlohmann::json::array())) {
    s += fmt::format("\n**{}**: {}\n\nWitness {}: {}\n", md_text(c.value("id", "")), md_text(c.value("summary", "")),
                     inline_code(c.value("witness_file", "")), inline_code(c.value("witness_detail", "")));
  }
  return s + "\n";
}

}  // namespace

std::string markdown_report(const VerifyReport& r) {
  std::string errors;
  if (!r.errors.empty()) {
    errors = "## Work items that failed\n\n";
    for (const std::string& e : r.errors) errors += "- " + md_text(e) + "\n";
    errors += "\n";
  }
  return md_header(r) + errors + md_invariants(r) + md_bugs(r) + md_proofs(r) +
         fmt::format("## Determinism\n\n{}\n\n", md_text(determinism_line(r.determinism))) +
         md_collectives(r) + md_reference(r);
}

void write_markdown(const VerifyReport& r, const std::filesystem::path& file) {
  write_file(file, markdown_report(r));
}

}  // namespace zc::reports
