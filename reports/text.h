// Text helpers shared by the report writers: escaping for XML/HTML and Markdown, the verdict in
// words, and writing a file with an error that names the path and the OS reason. Every escaped
// string is valid UTF-8 without XML-forbidden control characters, whatever bytes came in.
#pragma once

#include "props/verify_report.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace zc::reports {

// s as valid UTF-8 without control characters other than newline and tab: each invalid byte and
// each other control character becomes U+FFFD. Markdown and plain text go through this.
std::string printable(std::string_view s);

// For XML/HTML text and attribute values: & < > " ' as entities, newline and tab as character
// references only where `in_attribute`, invalid UTF-8 and forbidden control characters as U+FFFD.
std::string xml_escape(std::string_view s, bool in_attribute = false);

// Markdown prose in a paragraph or table cell: punctuation that Markdown or inline HTML would
// interpret is backslash-escaped; newlines become spaces.
std::string md_text(std::string_view s);
// A Markdown code span (identifiers, files, reproduce strings): a backtick fence longer than any
// run inside, newlines as spaces, and `|` escaped when it sits in a GFM table cell. Empty stays
// empty.
std::string md_code(std::string_view s, bool in_table = true);
// A fenced code block whose fence no line of `body` can close.
std::string md_fenced(std::string_view body, std::string_view lang);

// One-line JSON; bytes that are not UTF-8 are replaced rather than thrown on.
std::string compact_json(const nlohmann::json& j);
// compact_json with a space after each comma between fields: still JSON (it parses back to j), and a
// long one wraps between fields in a page rather than mid-word.
std::string wrappable_json(const nlohmann::json& j);

// "PASS" or "FAIL".
std::string_view verdict(const props::VerifyReport& r);
// What made the run fail, e.g. "1 invariant does not hold, 1 known bug not caught"; "" on PASS.
std::string failure_reasons(const props::VerifyReport& r);
// The verify run in one line: profile, seed, jobs, wall seconds, start time.
std::string run_line(const props::VerifyReport& r);

// Seconds for a label: three significant digits or so, "0.012" as readily as "187.3".
std::string seconds_label(double seconds);

// The determinism self-check in one sentence, with the first mismatch when there is one.
std::string determinism_line(const props::DeterminismResult& d);

// Writes `contents` to `path`, replacing it; throws UsageError naming the path and the OS reason.
void write_file(const std::filesystem::path& path, std::string_view contents);

}  // namespace zc::reports
