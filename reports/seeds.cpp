// The report of `zerocheck verify --against deepspeed==X.Y.Z | deepspeed@DIR`: the seeds'
// invariants on that DeepSpeed alone (props/deepspeed_seeds.h), as deepspeed-seeds.md,
// deepspeed-seeds.html (self-contained, styled as report.html) and junit.xml (a failure for
// "fails", a skip with the reason for "not applicable" and "not runnable"). Every value passes
// through the escapes of text.h.
#include "reports/seeds.h"

#include "reports/text.h"
#include "reports/writers.h"

#include <fmt/format.h>

namespace zc::reports {

namespace {

using props::SeedResult;
using props::SeedVerdict;

bool bad(SeedVerdict v) { return v == SeedVerdict::fails || v == SeedVerdict::not_runnable; }

std::string replay_of(const SeedResult& r) { return r.saved.empty() ? "" : "zerocheck replay " + r.saved; }


}  // namespace

SeedCounts count_seeds(const std::vector<SeedResult>& rs) {
  SeedCounts c;
  for (const SeedResult& r : rs) {
    c.holds += r.verdict == SeedVerdict::holds;
    c.fails += r.verdict == SeedVerdict::fails;
    c.not_applicable += r.verdict == SeedVerdict::not_applicable;
    c.not_runnable += r.verdict == SeedVerdict::not_runnable;
  }
  return c;
}

std::string SeedCounts::line() const {
  return fmt::format("{} hold, {} fail, {} not applicable, {} not runnable", holds, fails, not_applicable, not_runnable);
}

std::string seeds_markdown(const std::string& target, const std::vector<SeedResult>& rs) {
  const SeedCounts c = count_seeds(rs);
  std::string s = fmt::format("# The seeds' invariants on {}\n\n**{}**: {}\n\n", md_code(target, false),
                              c.passed() ? "PASS" : "FAIL", c.line());
  s += "| invariant | verdict | cases | seconds | summary | counterexample |\n|---|---|---:|---:|---|---|\n";
  for (const SeedResult& r : rs) {
    s += fmt::format("| {} | {} | {} | {:.1f} | {} | {} |\n", md_code(r.invariant), props::to_string(r.verdict), r.cases,
                     r.seconds, md_text(r.summary), replay_of(r).empty() ? "" : md_code(replay_of(r)));
  }
  return s;
}

std::string seeds_html(const std::string& target, const std::vector<SeedResult>& rs) {
  const SeedCounts c = count_seeds(rs);
  std::string s = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      "<title>zerocheck verify --against {}</title>\n<style>{}</style>\n</head>\n<body>\n"
      "<h1>The seeds' invariants on {}</h1>\n<p class=\"verdict {}\">{}: {}</p>\n"
      "<p>Each verdict is DeepSpeed's own behaviour (no comparison with zerocheck's simulator): holds, fails "
      "with a shrunk counterexample that <code>zerocheck replay</code> reruns, not applicable (the release lacks "
      "the feature), or not runnable (the reason is given).</p>\n"
      "<h2>Invariants</h2>\n<table id=\"seeds\">\n<tr><th>invariant</th><th>verdict</th><th>cases</th>"
      "<th>seconds</th><th>summary</th><th>counterexample</th></tr>\n",
      xml_escape(target), page_style(), xml_escape(target), c.passed() ? "pass" : "fail", c.passed() ? "PASS" : "FAIL",
      xml_escape(c.line()));
  for (const SeedResult& r : rs) {
    s += fmt::format("<tr><td><code>{}</code></td><td{}>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1f}</td>"
                     "<td>{}</td><td>{}</td></tr>\n",
                     xml_escape(r.invariant), bad(r.verdict) ? " class=\"bad\"" : "", props::to_string(r.verdict), r.cases,
                     r.seconds, xml_escape(r.summary),
                     replay_of(r).empty() ? "" : "<code>" + xml_escape(replay_of(r)) + "</code>");
  }
  return s + "</table>\n</body>\n</html>\n";
}

std::string seeds_junit(const std::string& target, const std::vector<SeedResult>& rs) {
  const SeedCounts c = count_seeds(rs);
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" +
                  fmt::format("<testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\">\n",
                              xml_escape("seeds on " + target, true), rs.size(), c.fails, c.not_applicable + c.not_runnable);
  for (const SeedResult& r : rs) {
    x += fmt::format("  <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\">", xml_escape(target, true),
                     xml_escape(r.invariant, true), r.seconds);
    if (r.verdict == SeedVerdict::fails) {
      x += fmt::format("<failure message=\"{}\"/>", xml_escape(r.summary, true));
    } else if (r.verdict != SeedVerdict::holds) {
      x += fmt::format("<skipped message=\"{}: {}\"/>", props::to_string(r.verdict), xml_escape(r.summary, true));
    }
    x += "</testcase>\n";
  }
  return x + "</testsuite>\n";
}

void write_seed_reports(const std::string& target, const std::vector<SeedResult>& rs, const std::filesystem::path& out) {
  write_file(out / "deepspeed-seeds.md", seeds_markdown(target, rs));
  write_file(out / "deepspeed-seeds.html", seeds_html(target, rs));
  write_file(out / "junit.xml", seeds_junit(target, rs));
}

}  // namespace zc::reports
