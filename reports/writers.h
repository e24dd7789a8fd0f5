// The four files of a `zerocheck verify` run, written from props::VerifyReport: report.md for a
// person, report.html (one self-contained file with inline SVG plots), results.json for tools and
// junit.xml for CI. Each writer replaces its file; a file that cannot be written is a UsageError
// naming the path and the OS reason.
#pragma once

#include "props/verify_report.h"

#include <filesystem>
#include <string>

namespace zc::reports {

void write_markdown(const props::VerifyReport& r, const std::filesystem::path& file);
void write_html(const props::VerifyReport& r, const std::filesystem::path& file);
void write_json(const props::VerifyReport& r, const std::filesystem::path& file);
void write_junit(const props::VerifyReport& r, const std::filesystem::path& file);

// Creates `dir` (and its parents) and writes report.md, report.html, results.json and junit.xml.
void write_all(const props::VerifyReport& r, const std::filesystem::path& dir);

// The documents themselves, for callers that print or test them.
std::string markdown_report(const props::VerifyReport& r);
// A DeepSpeed comparison's unlisted classes and coverage grid (props::count_conformance's JSON), as
// Markdown: the verify report's and the reference soak's.
std::string md_reference_counts(const nlohmann::json& count);
std::string html_report(const props::VerifyReport& r);
std::string junit_report(const props::VerifyReport& r);
// The CSS every zerocheck HTML page inlines (report.html, deepspeed-seeds.html).
std::string_view page_style();

}  // namespace zc::reports
