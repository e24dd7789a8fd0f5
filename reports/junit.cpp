// junit.xml: the verify run as CI test results. Four suites (invariants, known_bugs, proofs,
// determinism), one <testcase> per entry with time in seconds, and a <failure> for each entry that
// makes `zerocheck verify` fail, so the suite's failure count equals the run's reasons to fail.
#include "reports/text.h"
#include "reports/writers.h"

#include <fmt/format.h>

#include <vector>

namespace zc::reports {

namespace {

struct JunitCase {
  std::string name;
  double seconds = 0;
  std::string failure_type;     // "" when it passed
  std::string failure_message;  // one line, the message attribute
  std::string failure_text;     // the details: counterexample, reproduce string
  std::string skipped;          // why it did not run (verify --config: not applicable); "" otherwise
};

struct JunitSuite {
  std::string name;
  std::vector<JunitCase> cases;
};

JunitSuite invariant_suite(const props::VerifyReport& r) {
  JunitSuite s{"invariants", {}};
  for (const props::InvariantResult& i : r.invariants) {
    JunitCase c{i.name, i.seconds, "", "", "", ""};
    if (!i.not_applicable.empty()) c.skipped = "not applicable to this config: " + i.not_applicable;
    if (!i.holds) {
      c.failure_type = "InvariantDoesNotHold";
      c.failure_message = fmt::format("{} does not hold: {}", i.name, i.failure);
      c.failure_text = fmt::format("counterexample: {}\nscenario file: {}\nreproduce: {}\n",
                                   compact_json(i.counterexample), i.scenario_file, i.reproduce);
    }
    s.cases.push_back(std::move(c));
  }
  return s;
}

JunitSuite bug_suite(const props::VerifyReport& r) {
  JunitSuite s{"known_bugs", {}};
  for (const props::BugResult& b : r.bugs) {
    JunitCase c{b.id, b.seconds, "", "", "", ""};
    if (!b.caught) {
      c.failure_type = "KnownBugNotCaught";
      c.failure_message = fmt::format("{} not caught after {:.2f} s (expected: {}): {}", b.id,
                                      b.seconds, b.expected_by, b.summary);
      c.failure_text = c.failure_message + "\n";
    }
    s.cases.push_back(std::move(c));
  }
  return s;
}

JunitSuite proof_suite(const props::VerifyReport& r) {
  JunitSuite s{"proofs", {}};
  for (const props::ProofResult& p : r.proofs) {
    JunitCase c{p.name, p.seconds, "", "", "", ""};
    if (!p.ok()) {
      c.failure_type = "UnexpectedVerdict";
      c.failure_message =
          fmt::format("{}: verdict '{}', expected '{}'", p.name, p.verdict, p.expected);
      c.failure_text = fmt::format("detail: {}\n", p.detail);
    }
    s.cases.push_back(std::move(c));
  }
  return s;
}

JunitSuite determinism_suite(const props::VerifyReport& r) {
  JunitCase c{"same-seed-reruns", 0, "", "", "", ""};
  if (r.determinism.mismatches > 0) {
    c.failure_type = "Nondeterminism";
    c.failure_message = determinism_line(r.determinism);
    c.failure_text = r.determinism.detail + "\n";
  }
  return {"determinism", {std::move(c)}};
}

std::string render_suite(const JunitSuite& s) {
  int failures = 0, skipped = 0;
  double seconds = 0;
  for (const JunitCase& c : s.cases) {
    failures += !c.failure_type.empty();
    skipped += !c.skipped.empty();
    seconds += c.seconds;
  }
  std::string out = fmt::format(
      "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" "
      "time=\"{:.3f}\">\n",
      xml_escape(s.name, true), s.cases.size(), failures, skipped, seconds);
  for (const JunitCase& c : s.cases) {
    out += fmt::format("    <testcase classname=\"zerocheck.{}\" name=\"{}\" time=\"{:.3f}\"",
                       xml_escape(s.name, true), xml_escape(c.name, true), c.seconds);
    if (!c.skipped.empty()) {
      out += fmt::format(">\n      <skipped message=\"{}\"/>\n    </testcase>\n", xml_escape(c.skipped, true));
      continue;
    }
    if (c.failure_type.empty()) {
      out += "/>\n";
      continue;
    }
    out +=
        fmt::format(">\n      <failure type=\"{}\" message=\"{}\">{}</failure>\n    </testcase>\n",
                    xml_escape(c.failure_type, true), xml_escape(c.failure_message, true),
                    xml_escape(c.failure_text));
  }
  return out + "  </testsuite>\n";
}

}  // namespace

std::string junit_report(const props::VerifyReport& r) {
  const std::vector<JunitSuite> suites = {invariant_suite(r), bug_suite(r), proof_suite(r),
                                          determinism_suite(r)};
  std::size_t tests = 0, failures = 0;
  std::string body;
  for (const JunitSuite& s : suites) {
    tests += s.cases.size();
    for (const JunitCase& c : s.cases) failures += !c.failure_type.empty();
    body += render_suite(s);
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<testsuites name=\"zerocheck verify\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
      "time=\"{:.3f}\">\n{}</testsuites>\n",
      tests, failures, r.seconds, body);
}

void write_junit(const props::VerifyReport& r, const std::filesystem::path& file) {
  write_file(file, junit_report(r));
}

}  // namespace zc::reports
