// The four report files of a verify run, read back by real parsers and compared with the
// VerifyReport they came from: report.html by libxml2's HTML parser and, since it is XHTML-style,
// by its strict XML parser; junit.xml by the XML parser; results.json by nlohmann; report.md as
// text. The sample run fails on purpose, with text full of markup characters and bad bytes.
#include "engine/errors.h"
#include "props/verify_report.h"
#include "reports/seeds.h"
#include "reports/text.h"
#include "reports/writers.h"

#include <gtest/gtest.h>
#include <libxml/HTMLparser.h>
#include <libxml/parser.h>
#include <libxml/xmlerror.h>
#include <libxml/xpath.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace zc::reports {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- the sample run ----

// Shrunk scenarios and failures carry every character that markup must escape.
const json kCounterexample = {{"world_size", 4},     {"stage", 2},
                              {"n_backward", 3},     {"dtype", "bf16"},
                              {"model", "mlp<2x8>"}, {"note", "a < b && \"c\" > 'd' `e`"}};
const std::string kFailure =
    "param \"fc1.weight\"[17] step 2: coalesced 0x1.8p-3 != baseline "
    "0x1.7ffffffffffffp-3 (<&>)\n\tafter 3 chunks";
// A crash message with an ANSI escape and a byte that is not UTF-8: neither is allowed in XML.
const std::string kBadBytes = "rank 1 aborted: \x1b[31mboom\xff\x01 'µ'";

props::InvariantResult invariant(std::string name, bool holds, int cases, double seconds) {
  props::InvariantResult i;
  i.name = std::move(name);
  i.explanation = "Checks " + i.name +
                  " on every generated scenario; a difference of one ULP "
                  "means gradients were reduced in another order (a < b, x & y).";
  i.holds = holds;
  i.cases = cases;
  i.discarded = cases / 10;
  i.seconds = seconds;
  return i;
}

props::BugResult bug(std::string id, bool caught, int cases, double seconds) {
  props::BugResult b;
  b.id = std::move(id);
  b.summary = "CPU-offload accumulate gated on GA > 1 & drops chunks at \"GA = 1\"";
  b.expected_by = "I1-coalesced-bit-exact";
  b.caught = caught;
  b.seconds = seconds;
  if (!caught) return b;
  b.by = b.expected_by;
  b.cases_to_catch = cases;
  b.shrink_steps = 7;
  b.failure = kFailure;
  b.scenario = {
      {"world_size", 2}, {"stage", 1}, {"offload", true}, {"tag", "</pre><script>x</script>"}};
  b.scenario_file = "reports/scenarios/" + b.id + ".json";
  b.reproduce = "BAAAAAAAAQAAAAAAAAAAMAAAAAAAAAAAAAA==";
  return b;
}

props::VerifyReport sample_report() {
  props::VerifyReport r;
  r.profile = "default";
  r.seed = 424242;
  r.jobs = 2;
  r.seconds = 187.25;
  r.started = "2025-01-02T03:04:05Z";
  r.invariants = {invariant("I1-coalesced-bit-exact", true, 200, 41.7),
                  invariant("I2-sharded-parity", true, 150, 63.2),
                  invariant("I3-rerun-same-trace", false, 37, 8.9)};
  props::InvariantResult& failing = r.invariants[2];
  failing.failure = kFailure;
  failing.counterexample = kCounterexample;
  failing.scenario_file = "reports/scenarios/I3-rerun-same-trace.json";
  failing.reproduce = "BAAAAAAAAQAAAAAAAAAA`AAAA==";
  r.bugs = {bug("B1", true, 37, 12.5), bug("B2", false, 0, 30.0), bug("B3", true, 5, 2.5)};
  r.bugs[2].failure = kBadBytes;
  r.proofs = {{"zero12-partitions-disjoint-and-covering", "proved", "proved", 0.8, ""},
              {"fpa-coalesced-rounding-differs", "found", "found", 3.2,
               "g = [0x1p-24 | -0x1p-24 & 1 < 2]"}};
  r.determinism = {4, 0, ""};
  for (int stage = 1; stage <= 3; ++stage) {
    const int buckets = stage == 3 ? 5 : 2;  // ZeRO-3 adds the parameter all-gathers
    for (int n = 1; n <= 4; ++n) {
      r.collectives.push_back(
          {stage, n, static_cast<double>(n * buckets), static_cast<double>(buckets)});
    }
  }
  return r;
}

props::VerifyReport passing_report() {
  props::VerifyReport r = sample_report();
  r.invariants[2] = invariant("I3-rerun-same-trace", true, 120, 30.0);
  r.bugs[1] = bug("B2", true, 90, 20.0);
  return r;
}

// ---- reading the files back ----

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A directory of its own under the test temp dir, removed at the end of the test.
class ReportsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("zc_reports_" + std::string(info->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Every message libxml2 raises while `parse` runs, warnings included.
template <typename Parse>
std::vector<std::string> collect_errors(Parse parse, std::set<std::string> tolerated_tags = {}) {
  struct Sink {
    std::vector<std::string> messages;
    std::set<std::string> tolerated_tags;
  } sink{{}, std::move(tolerated_tags)};
  // A generic lambda, so it converts to whichever xmlStructuredErrorFunc this libxml2 declares.
  xmlStructuredErrorFunc handler = [](void* ctx, auto* e) {
    auto* s = static_cast<Sink*>(ctx);
    const bool unknown_tag = e->domain == XML_FROM_HTML && e->code == XML_HTML_UNKNOWN_TAG;
    if (unknown_tag && e->str1 != nullptr && s->tolerated_tags.count(e->str1) > 0) return;
    s->messages.push_back(std::string("line ") + std::to_string(e->line) + ": " +
                          (e->message != nullptr ? e->message : "?"));
  };
  xmlSetStructuredErrorFunc(&sink, handler);
  parse();
  xmlSetStructuredErrorFunc(nullptr, nullptr);
  return sink.messages;
}

using Doc = std::unique_ptr<xmlDoc, decltype(&xmlFreeDoc)>;

// Note [Inline SVG in libxml2's HTML parser]: libxml2's HTML parser knows HTML 4 only, so it
// reports XML_HTML_UNKNOWN_TAG for each SVG element in the page although HTML5 allows inline
// SVG. Those few tag names are tolerated and nothing else; the strict XML parse of the same page
// (HtmlXmlParsesStrictly) tolerates nothing, so markup errors cannot hide behind the leniency.
const std::set<std::string> kSvgTags = {"svg", "rect", "line", "text"};

Doc parse_html(const std::string& text, std::vector<std::string>& errors) {
  htmlDocPtr doc = nullptr;
  errors = collect_errors(
      [&] {
        doc = htmlReadMemory(text.data(), static_cast<int>(text.size()), "report.html", "UTF-8",
                             HTML_PARSE_NONET | HTML_PARSE_PEDANTIC);
      },
      kSvgTags);
  return Doc(doc, &xmlFreeDoc);
}

Doc parse_xml(const std::string& text, const char* name, std::vector<std::string>& errors) {
  xmlDocPtr doc = nullptr;
  errors = collect_errors([&] {
    doc = xmlReadMemory(text.data(), static_cast<int>(text.size()), name, "UTF-8",
                        XML_PARSE_NONET | XML_PARSE_PEDANTIC);
  });
  return Doc(doc, &xmlFreeDoc);
}

std::vector<xmlNodePtr> xpath(xmlDocPtr doc, const std::string& expr) {
  std::unique_ptr<xmlXPathContext, decltype(&xmlXPathFreeContext)> ctx(xmlXPathNewContext(doc),
                                                                       &xmlXPathFreeContext);
  std::unique_ptr<xmlXPathObject, decltype(&xmlXPathFreeObject)> result(
      xmlXPathEvalExpression(reinterpret_cast<const xmlChar*>(expr.c_str()), ctx.get()),
      &xmlXPathFreeObject);
  std::vector<xmlNodePtr> nodes;
  if (result == nullptr || result->nodesetval == nullptr) return nodes;
  for (int k = 0; k < result->nodesetval->nodeNr; ++k) {
    nodes.push_back(result->nodesetval->nodeTab[k]);
  }
  return nodes;
}

std::string content(xmlNodePtr node) {
  xmlChar* c = xmlNodeGetContent(node);
  std::string s = c != nullptr ? reinterpret_cast<const char*>(c) : "";
  xmlFree(c);
  return s;
}

std::string attribute(xmlNodePtr node, const char* name) {
  xmlChar* a = xmlGetProp(node, reinterpret_cast<const xmlChar*>(name));
  std::string s = a != nullptr ? reinterpret_cast<const char*>(a) : "";
  xmlFree(a);
  return s;
}

double number(xmlNodePtr node, const char* name) { return std::stod(attribute(node, name)); }

std::string class_has(const std::string& word) {
  return "contains(concat(' ', @class, ' '), ' " + word + " ')";
}

// The data bars of one plot whose class has `kind` as a word, in document order.
std::vector<xmlNodePtr> bars(xmlDocPtr doc, const std::string& plot, const std::string& kind) {
  return xpath(doc, "//svg[@id='" + plot + "']/rect[" + class_has("bar") + " and " +
                        class_has(kind) + "]");
}

void expect_ratio(double got_a, double got_b, double want_a, double want_b,
                  const std::string& what) {
  ASSERT_GT(got_b, 0) << what;
  EXPECT_NEAR((got_a / got_b) / (want_a / want_b), 1.0, 0.01) << what;
}

// ---- report.html ----

TEST_F(ReportsTest, HtmlParsesWithoutErrorsAndHasEveryTable) {
  const props::VerifyReport r = sample_report();
  write_all(r, dir_);
  std::vector<std::string> errors;
  const Doc doc = parse_html(read_file(dir_ / "report.html"), errors);
  ASSERT_NE(doc, nullptr);
  for (const std::string& e : errors) ADD_FAILURE() << "HTML parser: " << e;
  const auto rows = [&](const std::string& id) {
    return xpath(doc.get(), "//table[@id='" + id + "']//tr").size();
  };
  EXPECT_EQ(rows("invariants"), r.invariants.size() + 1);
  EXPECT_EQ(rows("known-bugs"), r.bugs.size() + 1);
  EXPECT_EQ(rows("proofs"), r.proofs.size() + 1);
  EXPECT_EQ(rows("collectives"), r.collectives.size() + 1);
  EXPECT_EQ(xpath(doc.get(), "//script | //link | //img | //iframe | //object").size(), 0u)
      << "the page is one self-contained file";
  EXPECT_EQ(xpath(doc.get(), "//*[@src or @href]").size(), 0u)
      << "nothing is fetched from elsewhere";
}

TEST_F(ReportsTest, HtmlShowsCounterexamplesAndFailuresAsTheirOwnText) {
  const props::VerifyReport r = sample_report();
  write_all(r, dir_);
  std::vector<std::string> errors;
  const Doc doc = parse_html(read_file(dir_ / "report.html"), errors);
  ASSERT_NE(doc, nullptr);
  const std::string text = content(xmlDocGetRootElement(doc.get()));
  EXPECT_NE(text.find(wrappable_json(kCounterexample)), std::string::npos)
      << "the shrunk scenario, unescaped";
  EXPECT_EQ(nlohmann::json::parse(wrappable_json(kCounterexample)), kCounterexample) << "still JSON to copy";
  EXPECT_NE(text.find(kFailure), std::string::npos);
  EXPECT_NE(text.find(wrappable_json(r.bugs[0].scenario)), std::string::npos);
  EXPECT_NE(text.find(r.proofs[1].detail), std::string::npos);
  EXPECT_NE(text.find("rank 1 aborted: \xEF\xBF\xBD[31mboom\xEF\xBF\xBD\xEF\xBF\xBD 'µ'"),
            std::string::npos)
      << "bytes XML cannot carry become U+FFFD; the rest stays";
  EXPECT_EQ(xpath(doc.get(), "//script").size(), 0u) << "a '<script>' inside a scenario stays text";
  EXPECT_EQ(content(xpath(doc.get(), "//p[contains(@class, 'verdict')]").at(0)).substr(0, 4),
            "FAIL");
}

TEST_F(ReportsTest, HtmlXmlParsesStrictly) {
  write_all(sample_report(), dir_);
  std::vector<std::string> errors;
  const Doc doc = parse_xml(read_file(dir_ / "report.html"), "report.html", errors);
  EXPECT_NE(doc, nullptr);
  for (const std::string& e : errors) ADD_FAILURE() << "XML parser: " << e;
}

TEST_F(ReportsTest, HtmlPlotsHaveOneTooltippedBarPerValue) {
  const props::VerifyReport r = sample_report();
  write_all(r, dir_);
  std::vector<std::string> errors;
  const Doc doc = parse_html(read_file(dir_ / "report.html"), errors);
  ASSERT_NE(doc, nullptr);
  EXPECT_GE(xpath(doc.get(), "//svg").size(), 3u);
  EXPECT_EQ(bars(doc.get(), "plot-collectives", "baseline").size(), r.collectives.size());
  EXPECT_EQ(bars(doc.get(), "plot-collectives", "coalesced").size(), r.collectives.size());
  EXPECT_EQ(bars(doc.get(), "plot-invariants", "cases").size(), r.invariants.size());
  EXPECT_EQ(bars(doc.get(), "plot-invariants", "seconds").size(), r.invariants.size());
  EXPECT_EQ(bars(doc.get(), "plot-bugs", "caught").size(), 2u);
  EXPECT_EQ(bars(doc.get(), "plot-bugs", "not-caught").size(), 1u);
  for (const char* plot : {"plot-collectives", "plot-invariants", "plot-bugs"}) {
    const std::string svg = std::string("//svg[@id='") + plot + "']";
    EXPECT_EQ(xpath(doc.get(), svg + "/rect[starts-with(@class, 'bar')]/title").size(),
              xpath(doc.get(), svg + "/rect[starts-with(@class, 'bar')]").size())
        << plot << ": every bar has a tooltip";
    int numeric_ticks = 0;
    for (xmlNodePtr t : xpath(doc.get(), svg + "/text")) {
      const std::string s = content(t);
      numeric_ticks += !s.empty() && s.find_first_not_of("0123456789.") == std::string::npos;
    }
    EXPECT_GE(numeric_ticks, 3) << plot << ": an axis with numbered ticks";
    EXPECT_EQ(xpath(doc.get(), svg + "/rect[@class='swatch']").size(), 2u) << plot << ": a legend";
  }
  const std::string not_caught =
      content(xpath(doc.get(), "//svg[@id='plot-bugs']/text[.='NOT CAUGHT']").at(0));
  EXPECT_EQ(not_caught, "NOT CAUGHT");
}

TEST_F(ReportsTest, HtmlBarLengthsAreProportionalToValues) {
  const props::VerifyReport r = sample_report();
  write_all(r, dir_);
  std::vector<std::string> errors;
  const Doc doc = parse_html(read_file(dir_ / "report.html"), errors);
  ASSERT_NE(doc, nullptr);
  const auto cases = bars(doc.get(), "plot-invariants", "cases");
  ASSERT_EQ(cases.size(), 3u);
  expect_ratio(number(cases[0], "width"), number(cases[1], "width"), r.invariants[0].cases,
               r.invariants[1].cases, "cases of I1 vs I2");
  expect_ratio(number(cases[2], "width"), number(cases[0], "width"), r.invariants[2].cases,
               r.invariants[0].cases, "cases of I3 vs I1");
  const auto seconds = bars(doc.get(), "plot-invariants", "seconds");
  ASSERT_EQ(seconds.size(), 3u);
  expect_ratio(number(seconds[1], "width"), number(seconds[2], "width"), r.invariants[1].seconds,
               r.invariants[2].seconds, "seconds of I2 vs I3");
  const auto caught = bars(doc.get(), "plot-bugs", "caught");
  ASSERT_EQ(caught.size(), 2u);
  expect_ratio(number(caught[0], "width"), number(caught[1], "width"), r.bugs[0].seconds,
               r.bugs[2].seconds, "seconds to catch B1 vs B3");
  const auto baseline = bars(doc.get(), "plot-collectives", "baseline");
  ASSERT_EQ(baseline.size(), r.collectives.size());
  expect_ratio(number(baseline[3], "height"), number(baseline[0], "height"),
               r.collectives[3].baseline, r.collectives[0].baseline,
               "ZeRO-1 baseline at N = 4 vs N = 1");
  expect_ratio(number(baseline[11], "height"), number(baseline[3], "height"),
               r.collectives[11].baseline, r.collectives[3].baseline,
               "ZeRO-3 vs ZeRO-1 baseline at N = 4 (one shared axis)");
}

// ---- junit.xml ----

TEST_F(ReportsTest, JunitHasOneCasePerEntryAndOneFailurePerReasonToFail) {
  const props::VerifyReport r = sample_report();
  write_all(r, dir_);
  std::vector<std::string> errors;
  const Doc doc = parse_xml(read_file(dir_ / "junit.xml"), "junit.xml", errors);
  ASSERT_NE(doc, nullptr);
  for (const std::string& e : errors) ADD_FAILURE() << "XML parser: " << e;
  std::vector<std::string> suites;
  for (xmlNodePtr s : xpath(doc.get(), "/testsuites/testsuite")) {
    suites.push_back(attribute(s, "name"));
  }
  EXPECT_EQ(suites,
            (std::vector<std::string>{"invariants", "known_bugs", "proofs", "determinism"}));
  EXPECT_EQ(xpath(doc.get(), "//testcase").size(),
            r.invariants.size() + r.bugs.size() + r.proofs.size() + 1);
  EXPECT_EQ(xpath(doc.get(), "//failure").size(), 2u) << "I3 does not hold and B2 was not caught";
  EXPECT_EQ(attribute(xpath(doc.get(), "/testsuites").at(0), "failures"), "2");
  const auto i3 = xpath(
      doc.get(), "//testsuite[@name='invariants']/testcase[@name='I3-rerun-same-trace']/failure");
  ASSERT_EQ(i3.size(), 1u);
  EXPECT_EQ(attribute(i3[0], "message"), "I3-rerun-same-trace does not hold: " + kFailure)
      << "quotes, markup and newlines survive the attribute";
  EXPECT_NE(content(i3[0]).find(compact_json(kCounterexample)), std::string::npos);
  EXPECT_EQ(attribute(xpath(doc.get(), "//testcase[@name='I2-sharded-parity']").at(0), "time"),
            "63.200");
  EXPECT_EQ(xpath(doc.get(), "//testsuite[@name='known_bugs']/testcase[@name='B2']/failure").size(),
            1u);
}

TEST_F(ReportsTest, JunitFailsProofsWithAnUnexpectedVerdictAndNondeterminism) {
  props::VerifyReport r = passing_report();
  r.proofs[0].verdict = "counterexample";
  r.determinism = {4, 1, "seed 7 rerun: trace hash 0x1f != 0x2e"};
  std::vector<std::string> errors;
  const Doc doc = parse_xml(junit_report(r), "junit.xml", errors);
  ASSERT_NE(doc, nullptr);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(xpath(doc.get(), "//testsuite[@name='proofs']//failure").size(), 1u);
  EXPECT_EQ(xpath(doc.get(), "//testsuite[@name='determinism']//failure").size(), 1u);
  EXPECT_EQ(xpath(doc.get(), "//failure").size(), 2u);
}

// ---- results.json ----

TEST_F(ReportsTest, JsonHasTheDocumentedKeysAndRoundTrips) {
  const props::VerifyReport r = sample_report();
  write_all(r, dir_);
  const json j = json::parse(read_file(dir_ / "results.json"));
  ASSERT_EQ(j.at("invariants").size(), r.invariants.size());
  for (const json& i : j.at("invariants")) {
    for (const char* k : {"name", "holds", "cases", "seconds"}) EXPECT_TRUE(i.contains(k)) << k;
  }
  ASSERT_EQ(j.at("known_bugs").size(), r.bugs.size());
  for (const json& b : j.at("known_bugs")) {
    for (const char* k :
         {"id", "caught", "by", "cases_to_catch", "seconds", "scenario_file", "reproduce"}) {
      EXPECT_TRUE(b.contains(k)) << k;
    }
  }
  ASSERT_EQ(j.at("proofs").size(), r.proofs.size());
  for (const json& p : j.at("proofs")) {
    for (const char* k : {"name", "verdict", "seconds"}) EXPECT_TRUE(p.contains(k)) << k;
  }
  EXPECT_EQ(j.at("determinism").at("runs"), 4);
  EXPECT_EQ(j.at("determinism").at("mismatches"), 0);
  EXPECT_EQ(j.at("invariants")[2].at("counterexample"), kCounterexample);
  EXPECT_FALSE(j.at("passed").get<bool>());
  EXPECT_EQ(props::to_json(props::report_from_json(props::to_json(r))), props::to_json(r));
}

// ---- report.md ----

// Cells per row of each Markdown table: a '|' from the data must not add a column.
std::vector<int> table_columns(const std::string& md) {
  std::vector<int> columns;
  std::istringstream in(md);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '|') continue;
    int pipes = 0;
    for (std::size_t k = 0; k < line.size(); ++k) {
      pipes += line[k] == '|' && (k == 0 || line[k - 1] != '\\');
    }
    columns.push_back(pipes - 1);
  }
  return columns;
}

TEST_F(ReportsTest, MarkdownNamesEveryInvariantAndTheVerdict) {
  const props::VerifyReport r = sample_report();
  write_all(r, dir_);
  const std::string md = read_file(dir_ / "report.md");
  EXPECT_EQ(md.rfind("# zerocheck verify: FAIL\n", 0), 0u);
  EXPECT_NE(md.find("**FAIL** (1 invariant does not hold, 1 known bug not caught)"),
            std::string::npos);
  for (const props::InvariantResult& i : r.invariants) {
    EXPECT_NE(md.find(i.name), std::string::npos) << i.name;
  }
  EXPECT_NE(md.find("| `I3-rerun-same-trace` | **NO** | 37 | 3 | 8.90 |"), std::string::npos);
  EXPECT_NE(md.find("```json\n" + compact_json(kCounterexample) + "\n```"), std::string::npos);
  EXPECT_NE(md.find("``BAAAAAAAAQAAAAAAAAAA`AAAA==``"), std::string::npos)
      << "a backtick inside a code span";
  EXPECT_EQ(printable(md), md) << "valid UTF-8 without control characters";
  for (int c : table_columns(md)) EXPECT_TRUE(c == 5 || c == 8 || c == 4) << c << " columns";
  EXPECT_EQ(markdown_report(passing_report()).rfind("# zerocheck verify: PASS\n", 0), 0u);
}

// The DeepSpeed section's I3 table: a lifecycle per row, a stop with DeepSpeed's frame, one
// without any (null, as a probe wrote it before: the table says "-"), and the controls.
TEST(ReportsMarkdown, TheI3OnDeepSpeedTableShowsEachLifecycle) {
  props::VerifyReport r = passing_report();
  const nlohmann::json complete = {{"stage", 0}, {"passes", {"autosp"}}, {"reached", "step 2"}, {"deepcompile_active", true},
                                   {"destroyed", true}, {"handle_requested", false}, {"handle_requests", nlohmann::json::array()}};
  nlohmann::json stopped = {{"stage", 3}, {"passes", {"autotp"}}, {"reached", "compile"}, {"deepcompile_active", true},
                            {"destroyed", true}, {"handle_requested", false}, {"handle_requests", nlohmann::json::array()},
                            {"stopped", {{"error", "Unsupported: reset_step"}, {"deepspeed_frame", "deepspeed/runtime/engine.py:3007 forward"}}}};
  nlohmann::json no_frame = stopped;
  no_frame["stage"] = 2;
  no_frame["stopped"]["deepspeed_frame"] = nullptr;
  const nlohmann::json mutant = {{"stage", 0}, {"passes", {"autosp"}}, {"mutant", "b1"}, {"reached", "step 1"},
                                 {"deepcompile_active", true}, {"destroyed", true}, {"handle_requested", true},
                                 {"handle_requests", {"deepspeed.compile.util"}}};
  r.reference = {{"deepspeed", "0.19.8"}, {"holds", true},
                 {"invariants_on_deepspeed",
                  {{{"name", "deepspeed-I3-no-deepcompile-runtime-for-parallel-passes"}, {"holds", true}, {"cases", 1},
                    {"facts", {{"runs", {complete, stopped, no_frame}}, {"mutants", {mutant}}}}},
                   {{"name", "deepspeed-I9-not-run"}, {"not_run", "--deepspeed-i3 off"}, {"cases", 0}}}}};
  const std::string md = markdown_report(r);
  EXPECT_NE(md.find("| autosp stage 0 | yes | step 2 | yes | no | - |"), std::string::npos) << md;
  EXPECT_NE(md.find("| autotp stage 3 | yes | compile | yes | no | Unsupported: reset\\_step (deepspeed/runtime/engine.py:3007 forward) |"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| autotp stage 2 | yes | compile | yes | no | Unsupported: reset\\_step (-) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| control: autosp stage 0 with b1's historical gate | yes | step 1 | yes | **yes**"), std::string::npos) << md;
  EXPECT_NE(md.find("| `deepspeed-I9-not-run` | not run (--deepspeed-i3 off) | 0 | - |"), std::string::npos) << md;
}

// The memory comparison beside the values (props/reference_count.cpp's "memory" object): its
// rows and categories in both reports, the examples and the not-measured reasons in Markdown.
TEST(ReportsText, ReferenceMemoryTableInMarkdownAndHtml) {
  props::VerifyReport r = passing_report();
  r.reference = {{"deepspeed", "0.19.8"}, {"holds", true},
                 {"memory",
                  {{"scenarios", 8}, {"exact", 1}, {"listed", 1}, {"within_1pct", 2}, {"beyond", 3}, {"not_measured", 1},
                   {"rows", {{{"row", "stage 1 | synthetic | offload none | f32"}, {"scenarios", 8}, {"exact", 1},
                              {"listed", 1}, {"within_1pct", 2}, {"beyond", 3}, {"not_measured", 1}}}},
                   {"categories", {{{"category", "master"}, {"figures", 8}, {"exact", 6}, {"listed", 1}, {"within_1pct", 7}}}},
                   {"listed_by_class", {{"offload-param-cpu-partition-not-copied", 1}}},
                   {"examples", {{{"scenario", "z1 w2"}, {"differences", {"rank 0 steps peak: zerocheck 45 B, DeepSpeed 44 B"}}}}},
                   {"not_measured_reasons",
                    {{{"reason", "refused by both: x"}, {"scenarios", 1}, {"first", "z3 w2"}}}},
                   {"not_measured_other_reasons", 2}}}};
  const std::string md = markdown_report(r);
  EXPECT_NE(md.find("### Memory: DeepSpeed's CPU allocations against the engine's ledger"), std::string::npos) << md;
  EXPECT_NE(md.find("8 scenarios: every figure"), std::string::npos) << md;
  EXPECT_NE(md.find("equal but for listed memory classes in 1"), std::string::npos) << md;
  EXPECT_NE(md.find("| stage 1 \\| synthetic \\| offload none \\| f32 | 8 | 1 | 1 | 2 | 3 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| master | 8 | 6 | 1 | 7 |"), std::string::npos) << md;
  EXPECT_NE(md.find("- memory class `offload-param-cpu-partition-not-copied`: 1 scenarios"), std::string::npos) << md;
  EXPECT_NE(md.find("- z1 w2: rank 0 steps peak: zerocheck 45 B, DeepSpeed 44 B;"), std::string::npos) << md;
  EXPECT_NE(md.find("- not measured in 1 (the first: z3 w2): refused by both: x"), std::string::npos)
      << md;
  EXPECT_NE(md.find("- not measured in 2: reasons beyond the 1 above, counted, not kept"),
            std::string::npos) << md;
  const std::string html = html_report(r);
  EXPECT_NE(html.find("id=\"reference-memory\""), std::string::npos);
  EXPECT_NE(html.find("id=\"reference-memory-categories\""), std::string::npos);
  EXPECT_NE(html.find("stage 1 | synthetic | offload none | f32"), std::string::npos);
  EXPECT_NE(html.find("not measured in 1"), std::string::npos);
  EXPECT_NE(html.find("equal but for listed memory classes in 1"), std::string::npos);
}

// ---- errors ----

TEST_F(ReportsTest, UnwritablePathsAreUsageErrorsNamingPathAndReason) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "a-file";
  std::ofstream(file) << "x";
  try {
    write_all(sample_report(), file / "out");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find((file / "out").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Not a directory"), std::string::npos) << e.what();
  }
  try {
    write_markdown(sample_report(), dir_ / "missing" / "report.md");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find((dir_ / "missing" / "report.md").string()),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
}

TEST(ReportsText, EscapesMarkupAndReplacesWhatXmlCannotCarry) {
  EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  EXPECT_EQ(xml_escape("x\ny\tz", true), "x&#10;y&#9;z");
  EXPECT_EQ(xml_escape("x\ny"), "x\ny");
  EXPECT_EQ(xml_escape("\x01\xff\xc0\x80 µ \xed\xa0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD µ "
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD")
      << "control, invalid, overlong and surrogate bytes";
  EXPECT_EQ(md_code("a|b"), "`a\\|b`");
  EXPECT_EQ(md_code("``x"), "``` ``x ```");
  EXPECT_EQ(md_text("a_b <c> | d"), "a\\_b \\<c\\> \\| d");
  EXPECT_EQ(md_fenced("```\nx", "json"), "````json\n```\nx\n````\n");
}

// ---- verify --against a release or tree: the seeds' report ----

// One result of each verdict, the values chosen to break markup (<, &, quotes, |, a long unbroken
// path): every file well-formed, each verdict where it belongs, and the run's verdict in the banner.
TEST_F(ReportsTest, SeedReportsShowEveryVerdictAndStayWellFormed) {
  const auto result = [](const char* inv, props::SeedVerdict v, std::string summary, std::string saved = "") {
    props::SeedResult r;
    r.target = "deepspeed==0.15.4";
    r.invariant = inv;
    r.verdict = v;
    r.summary = std::move(summary);
    r.cases = 3;
    r.seconds = 1.5;
    r.saved = std::move(saved);
    return r;
  };
  const std::vector<props::SeedResult> rs = {
      result("I1-coalesced-bit-exact", props::SeedVerdict::holds, "16 cases hold"),
      result("I4-copies-keep-parent", props::SeedVerdict::fails, "TypeError: can only concatenate tuple (not \"list\") <&> | x",
             "reports/out/deepspeed-0.15.4/" + std::string(200, 'a') + ".json"),
      result("I3-no-deepcompile-for-parallel-passes", props::SeedVerdict::not_applicable, "no AutoSP pass in this DeepSpeed"),
      result("MB-multi-backward-sum", props::SeedVerdict::not_runnable, "rank 1 was killed by signal 9")};
  fs::create_directories(dir_);
  write_seed_reports("deepspeed==0.15.4", rs, dir_);
  EXPECT_EQ(count_seeds(rs).line(), "1 hold, 1 fail, 1 not applicable, 1 not runnable");
  EXPECT_FALSE(count_seeds(rs).passed());
  EXPECT_TRUE(count_seeds({rs[0], rs[2]}).passed()) << "not applicable is not a failure";

  std::vector<std::string> errors;
  const Doc html = parse_xml(read_file(dir_ / "deepspeed-seeds.html"), "deepspeed-seeds.html", errors);
  ASSERT_NE(html, nullptr);
  EXPECT_TRUE(errors.empty()) << errors.front();
  const std::vector<xmlNodePtr> banner = xpath(html.get(), "//p[" + class_has("verdict") + "]");
  ASSERT_EQ(banner.size(), 1u);
  EXPECT_EQ(content(banner[0]), "FAIL: 1 hold, 1 fail, 1 not applicable, 1 not runnable");
  EXPECT_NE(attribute(banner[0], "class").find("fail"), std::string::npos);
  const std::vector<xmlNodePtr> rows = xpath(html.get(), "//table[@id='seeds']/tr[td]");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(content(xpath(html.get(), "//table[@id='seeds']/tr[td][2]/td[5]")[0]), rs[1].summary);
  EXPECT_EQ(content(xpath(html.get(), "//table[@id='seeds']/tr[td][2]/td[6]")[0]), "zerocheck replay " + rs[1].saved);
  EXPECT_EQ(xpath(html.get(), "//td[" + class_has("bad") + "]").size(), 2u) << "fails and not runnable are marked";

  const Doc junit = parse_xml(read_file(dir_ / "junit.xml"), "junit.xml", errors);
  ASSERT_NE(junit, nullptr);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(xpath(junit.get(), "//failure").size(), 1u);
  EXPECT_EQ(xpath(junit.get(), "//skipped").size(), 2u);
  EXPECT_EQ(attribute(xpath(junit.get(), "//testsuite")[0], "failures"), "1");

  const std::string md = read_file(dir_ / "deepspeed-seeds.md");
  EXPECT_NE(md.find("**FAIL**: 1 hold, 1 fail"), std::string::npos) << md;
  EXPECT_NE(md.find("\\| x"), std::string::npos) << "a | in a summary cannot end the row: " << md;
}

}  // namespace
}  // namespace zc::reports
