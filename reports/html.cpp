// report.html: one self-contained file (inline <style> and <svg>, no scripts, fonts, images or
// links), written as XHTML-style markup so that both an HTML and a strict XML parser read it
// without error. Every value from the run passes through xml_escape (text.h).
#include "props/reference.h"
#include "reports/plots.h"
#include "reports/text.h"
#include "reports/writers.h"

#include <fmt/format.h>

#include <initializer_list>
#include <vector>

namespace zc::reports {

// No '<' or '&' in here: the pages must stay well-formed XML too.
std::string_view page_style() {
  static constexpr std::string_view kStyle = R"(
body { font-family: "DejaVu Sans", Arial, sans-serif; color: #222; max-width: 1150px;
       margin: 1.5em auto; padding: 0 1em; line-height: 1.4; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 2px; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 14px; max-width: 100%; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
td code { overflow-wrap: anywhere; }
th { background: #f3f5f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.verdict { font-size: 20px; font-weight: bold; padding: 8px 12px; border-radius: 4px; }
.pass { background: #e3f4e6; color: #1d6b31; }
.fail { background: #fbe3e3; color: #a11; }
.bad { color: #b11; font-weight: bold; }
pre { background: #f6f8fa; padding: 8px; white-space: pre-wrap; overflow-wrap: anywhere; }
code { font-family: "DejaVu Sans Mono", monospace; font-size: 13px; }
svg { display: block; margin: 1em 0; max-width: 100%; height: auto; }
)";
  return kStyle;
}

namespace {

using props::BugResult;
using props::InvariantResult;
using props::VerifyReport;

// A table cell: text is escaped here; `cls` "num" right-aligns, "bad" marks a failure.
struct Cell {
  std::string text;
  std::string_view cls = "";
  bool code = false;
};

std::string cell(const Cell& c, bool header) {
  const std::string_view tag = header ? "th" : "td";
  const std::string body =
      c.code && !c.text.empty() ? "<code>" + xml_escape(c.text) + "</code>" : xml_escape(c.text);
  if (c.cls.empty()) return fmt::format("<{}>{}</{}>", tag, body, tag);
  return fmt::format(R"(<{} class="{}">{}</{}>)", tag, c.cls, body, tag);
}

std::string row(const std::vector<Cell>& cells, bool header = false) {
  std::string s = "<tr>";
  for (const Cell& c : cells) s += cell(c, header);
  return s + "</tr>\n";
}

std::string header_row(const std::vector<std::string>& names) {
  std::string s = "<tr>";
  for (const std::string& n : names) s += "<th>" + xml_escape(n) + "</th>";
  return s + "</tr>\n";
}

std::string open_table(std::string_view id) { return fmt::format(R"(<table id="{}">)", id) + "\n"; }

std::string seconds(double s) { return fmt::format("{:.2f}", s); }
std::string yes_no(bool ok) { return ok ? "yes" : "NO"; }
std::string_view bad_unless(bool ok) { return ok ? "" : "bad"; }

std::string html_head(const VerifyReport& r) {
  const std::string reasons = failure_reasons(r);
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      "<title>zerocheck verify: {}</title>\n<style>{}</style>\n</head>\n<body>\n"
      "<h1>zerocheck verify</h1>\n<p class=\"verdict {}\">{}{}</p>\n<p>{}</p>\n",
      verdict(r), page_style(), r.passed() ? "pass" : "fail", verdict(r),
      reasons.empty() ? "" : xml_escape(": " + reasons), xml_escape(run_line(r)));
}

std::string html_invariants(const VerifyReport& r) {
  std::string s = "<h2>Invariants</h2>\n" + open_table("invariants") +
                  header_row({"invariant", "holds", "cases", "discarded", "seconds"});
  for (const InvariantResult& i : r.invariants) {
    s += row({{i.name, "", true},
              {i.not_applicable.empty() ? yes_no(i.holds) : "n/a", bad_unless(i.holds)},
              {fmt::format("{}", i.cases), "num"},
              {fmt::format("{}", i.discarded), "num"},
              {seconds(i.seconds), "num"}});
  }
  s += "</table>\n" + invariants_plot(r.invariants);
  for (const InvariantResult& i : r.invariants) {
    s += fmt::format("<h3><code>{}</code></h3>\n<p>{}</p>\n", xml_escape(i.name),
                     xml_escape(i.explanation));
    if (!i.not_applicable.empty()) {
      s += fmt::format("<p>Not applicable to this config: {}</p>\n", xml_escape(i.not_applicable));
    }
    if (!i.ds_config_file.empty()) {
      s += fmt::format("<p>The counterexample's ds_config: <code>{}</code></p>\n", xml_escape(i.ds_config_file));
    }
    if (i.holds) continue;
    s += fmt::format(
        "<p class=\"bad\">Does not hold: <code>{}</code></p>\n"
        "<p>Shrunk counterexample, saved as <code>{}</code>, reproduce with "
        "<code>{}</code>:</p>\n<pre><code>{}</code></pre>\n",
        xml_escape(i.failure), xml_escape(i.scenario_file), xml_escape(i.reproduce),
        xml_escape(wrappable_json(i.counterexample)));
  }
  return s;
}

std::string html_bugs(const VerifyReport& r) {
  std::string s = "<h2>Known bugs and DeepSpeed hazards</h2>\n" + open_table("known-bugs") +
                  header_row({"bug", "summary", "caught", "by", "cases to catch", "seconds",
                              "shrunk scenario file", "reproduce"});
  for (const BugResult& b : r.bugs) {
    s += row({{b.id, "", true},
              {b.summary},
              {yes_no(b.caught), bad_unless(b.caught)},
              {b.by, "", true},
              {b.caught ? fmt::format("{}", b.cases_to_catch) : "\u2014", "num"},
              {seconds(b.seconds), "num"},
              {b.scenario_file, "", true},
              {b.reproduce, "", true}});
  }
  s += "</table>\n" + bugs_plot(r.bugs);
  for (const BugResult& b : r.bugs) {
    s += fmt::format("<h3>{} shrunk scenario</h3>\n", xml_escape(b.id));
    if (!b.caught) {
      s += fmt::format(
          "<p class=\"bad\">Not caught after {:.2f} s; expected to be caught by "
          "<code>{}</code>.</p>\n",
          b.seconds, xml_escape(b.expected_by));
      continue;
    }
    s += fmt::format(
        "<p>Failure: <code>{}</code> ({} shrink steps)</p>\n<pre><code>{}</code></pre>\n",
        xml_escape(b.failure), b.shrink_steps, xml_escape(wrappable_json(b.scenario)));
  }
  return s;
}

std::string html_proofs(const VerifyReport& r) {
  std::string s = "<h2>Proofs</h2>\n" + open_table("proofs") +
                  header_row({"proof", "verdict", "expected", "seconds", "detail"});
  for (const props::ProofResult& p : r.proofs) {
    s += row({{p.name, "", true},
              {p.verdict, bad_unless(p.ok())},
              {p.expected},
              {seconds(p.seconds), "num"},
              {p.detail, "", true}});
  }
  return s + "</table>\n";
}

std::string html_collectives(const VerifyReport& r) {
  std::string s = "<h2>Collectives per step</h2>\n" + open_table("collectives") +
                  header_row({"ZeRO stage", "N backward", "baseline", "coalesced"});
  for (const props::CollectivePoint& c : r.collectives) {
    s += row({{fmt::format("{}", c.stage), "num"},
              {fmt::format("{}", c.n_backward), "num"},
              {fmt::format("{:g}", c.baseline), "num"},
              {fmt::format("{:g}", c.coalesced), "num"}});
  }
  return s + "</table>\n" + collectives_plot(r.collectives);
}

std::string html_reference(const VerifyReport& r) {
  if (r.reference.is_null()) return "";
  const nlohmann::json& j = r.reference;
  const bool holds = j.value("holds", false);
  std::string s = fmt::format(
      "<h2>DeepSpeed {} reference</h2>\n<p id=\"reference\"{}>{} scenarios; values bit for bit in {}; values and "
      "collectives in {}; {} differ only in listed divergence classes; {} refused by both; {} diverge unlisted. "
      "Comparison {}.</p>\n",
      xml_escape(j.value("deepspeed", "?")), holds ? "" : " class=\"bad\"", j.value("cases", 0),
      j.value("values_bit_for_bit", 0), j.value("matched", 0), j.value("listed", 0), j.value("refused_by_both", 0),
      j.value("unlisted", 0), holds ? "holds" : "FAILS");
  const nlohmann::json unlisted = j.value("unlisted_classes", nlohmann::json::array());
  if (!unlisted.empty()) {
    s += open_table("reference-unlisted") + header_row({"unlisted class", "cases", "first failure", "shrunk counterexample"});
    for (const nlohmann::json& k : unlisted) {
      s += row({{k.value("key", "")}, {fmt::format("{}", k.value("cases", 0)), "num"},
                {k.value("failure", ""), "bad", true}, {k.value("scenario_file", "-"), "", true}});
    }
    s += "</table>\n";
  }
  if (j.contains("error")) s += "<p class=\"bad\">" + xml_escape(j.value("error", "")) + "</p>\n";
  s += open_table("reference-conformance") + header_row({"feature", "scenarios", "values bit for bit", "collectives equal",
                                                         "only listed differences", "refused by both", "failed"});
  for (const nlohmann::json& line : j.value("conformance", nlohmann::json::array())) {
    const nlohmann::json& row = line;
    auto n = [&](const char* k) { return fmt::format("{}", row.value(k, 0)); };
    s += ::zc::reports::row({{row.value("feature", "")},
                             {n("scenarios"), "num"},
                             {n("values_bit_for_bit"), "num"},
                             {n("collectives_equal"), "num"},
                             {n("diverged_in_listed_classes"), "num"},
                             {n("refused_by_both"), "num"},
                             {n("failed"), "num", false}});
  }
  s += "</table>\n";
  if (j.contains("memory")) {  // the same scenarios' memory (props/reference_memory.cpp)
    const nlohmann::json& m = j["memory"];
    s += fmt::format("<p>Memory, DeepSpeed's CPU allocations against the engine's ledger (not part of the verdict yet): "
                     "{} scenarios, every figure equal to the byte in {}, equal but for listed memory classes in {}, "
                     "within 1 % in {}, beyond in {}, not measured in {}.</p>\n", m.value("scenarios", 0),
                     m.value("exact", 0), m.value("listed", 0), m.value("within_1pct", 0), m.value("beyond", 0),
                     m.value("not_measured", 0));
    s += open_table("reference-memory") + header_row({"stage / model / offload / dtype", "scenarios", "exact", "listed",
                                                      "within 1 %", "beyond", "not measured"});
    for (const nlohmann::json& mr : m.value("rows", nlohmann::json::array())) {
      auto n = [&](const char* k) { return fmt::format("{}", mr.value(k, 0)); };
      s += row({{mr.value("row", "")}, {n("scenarios"), "num"}, {n("exact"), "num"}, {n("listed"), "num"},
                {n("within_1pct"), "num"}, {n("beyond"), "num"}, {n("not_measured"), "num"}});
    }
    s += "</table>\n" + open_table("reference-memory-categories") +
         header_row({"figure's category", "figures", "exact", "listed", "within 1 %"});
    for (const nlohmann::json& mr : m.value("categories", nlohmann::json::array())) {
      auto n = [&](const char* k) { return fmt::format("{}", mr.value(k, 0)); };
      s += row({{mr.value("category", "")}, {n("figures"), "num"}, {n("exact"), "num"}, {n("listed"), "num"},
                {n("within_1pct"), "num"}});
    }
    s += "</table>\n";
  }
  if (j.contains("coverage")) {
    const nlohmann::json grid = props::coverage_grid(j), summary = props::coverage_summary(j);
    s += fmt::format("<p>Coverage: {} of {} cells (stage x dtype x communication dtype x clipping x offload x optimizer) "
                     "drawn; {}.</p>\n", summary.value("drawn", 0), summary.value("cells", 0),
                     xml_escape(grid.value("what", "")));
    std::vector<std::string> head = {""};
    for (const nlohmann::json& c : grid["columns"]) head.push_back(c.get<std::string>());
    s += open_table("reference-coverage") + header_row(head);
    for (const nlohmann::json& line : grid["rows"]) {
      std::vector<Cell> cells = {{line.value("row", "")}};
      for (const nlohmann::json& c : line["cells"]) cells.push_back({c.get<std::string>(), "num"});
      s += row(cells);
    }
    s += "</table>\n";
  }
  s += open_table("reference-classes") + header_row({"class", "cases", "witness", "DeepSpeed", "summary"});
  for (const nlohmann::json& c : j.value("classes", nlohmann::json::array())) {
    const bool ok = c.value("witness_diverges", false);
    s += row({{c.value("id", ""), "", true},
              {fmt::format("{}", c.value("cases", 0)), "num"},
              {ok ? "diverges" : "does not diverge", bad_unless(ok)},
              {c.value("deepspeed", ""), "", true},
              {c.value("summary", "")}});
  }
  return s + "</table>\n";
}

}  // namespace

std::string html_report(const VerifyReport& r) {
  const bool deterministic = r.determinism.mismatches == 0;
  std::string errors;
  if (!r.errors.empty()) {
    errors = "<h2>Work items that failed</h2>\n<ul id=\"errors\">\n";
    for (const std::string& e : r.errors) errors += "<li class=\"bad\">" + xml_escape(e) + "</li>\n";
    errors += "</ul>\n";
  }
  return html_head(r) + errors + html_invariants(r) + html_bugs(r) + html_proofs(r) +
         fmt::format("<h2>Determinism</h2>\n<p id=\"determinism\"{}>{}</p>\n",
                     deterministic ? "" : " class=\"bad\"",
                     xml_escape(determinism_line(r.determinism))) +
         html_collectives(r) + html_reference(r) + "</body>\n</html>\n";
}

void write_html(const VerifyReport& r, const std::filesystem::path& file) {
  write_file(file, html_report(r));
}

}  // namespace zc::reports
