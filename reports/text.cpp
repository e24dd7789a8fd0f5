// Escaping and file writing for the report writers (text.h).
#include "reports/text.h"

#include "engine/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace zc::reports {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence at s[i] (1..4), or 0 when it is not one: no overlong
// forms, no surrogates, nothing above U+10FFFF. `cp` receives the code point.
std::size_t utf8_sequence(std::string_view s, std::size_t i, char32_t& cp) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  std::size_t len = 0;
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0Fu;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07u;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if ((b(k) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b(k) & 0x3Fu);
  }
  const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
  if (overlong || surrogate || cp > 0x10FFFF) return 0;
  return len;
}

// XML 1.0's Char production, less what the escaper handles itself (tab, newline, return).
bool xml_char(char32_t cp) {
  if (cp < 0x20) return cp == '\t' || cp == '\n' || cp == '\r';
  return cp != 0xFFFE && cp != 0xFFFF;
}

// The entity or character reference that stands for cp, or "" where cp may stand for itself.
std::string_view reference(char32_t cp, bool in_attribute) {
  switch (cp) {
    case '&': return "&amp;";
    case '<': return "&lt;";
    case '>': return "&gt;";
    case '"': return "&quot;";
    case '\'': return "&#39;";
    case '\n': return in_attribute ? "&#10;" : "";
    case '\r': return in_attribute ? "&#13;" : "";
    case '\t': return in_attribute ? "&#9;" : "";
    default: return "";
  }
}

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const std::size_t len = utf8_sequence(s, i, cp);
    const bool keep = len > 0 && xml_char(cp) && cp != '\r';
    out += keep ? s.substr(i, len) : kReplacement;
    i += len == 0 ? 1 : len;
  }
  return out;
}

std::string xml_escape(std::string_view s, bool in_attribute) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const std::size_t len = utf8_sequence(s, i, cp);
    if (len == 0 || !xml_char(cp)) {
      out += kReplacement;
      i += len == 0 ? 1 : len;
      continue;
    }
    const std::string_view ref = reference(cp, in_attribute);
    if (ref.empty()) {
      out.append(s.substr(i, len));
    } else {
      out += ref;
    }
    i += len;
  }
  return out;
}

std::string md_text(std::string_view raw) {
  static constexpr std::string_view special = "\\`*_[]<>|&";
  std::string out;
  for (const char c : printable(raw)) {
    if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      if (special.find(c) != std::string_view::npos) out += '\\';
      out += c;
    }
  }
  return out;
}

namespace {

std::size_t longest_backtick_run(std::string_view s) {
  std::size_t longest = 0, run = 0;
  for (const char c : s) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return longest;
}

}  // namespace

std::string md_code(std::string_view raw, bool in_table) {
  if (raw.empty()) return "";
  const std::string s = printable(raw);
  std::string body;
  for (const char c : s) {
    if (c == '\n' || c == '\r') {
      body += ' ';
    } else if (c == '|' && in_table) {
      body += "\\|";
    } else {
      body += c;
    }
  }
  const std::string fence(longest_backtick_run(s) + 1, '`');
  // A space on each side keeps a leading or trailing backtick from joining the fence.
  const bool pad = body.front() == '`' || body.back() == '`';
  return pad ? fence + " " + body + " " + fence : fence + body + fence;
}

std::string md_fenced(std::string_view raw, std::string_view lang) {
  const std::string body = printable(raw);
  const std::string fence(std::max<std::size_t>(3, longest_backtick_run(body) + 1), '`');
  return fmt::format("{}{}\n{}\n{}\n", fence, lang, body, fence);
}

std::string compact_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string wrappable_json(const nlohmann::json& j) {
  const std::string compact = compact_json(j);
  std::string out;
  bool in_string = false;
  for (std::size_t i = 0; i < compact.size(); ++i) {
    const char c = compact[i];
    if (c == '"' && (i == 0 || compact[i - 1] != '\\')) in_string = !in_string;
    out += c;
    if (c == ',' && !in_string) out += ' ';
  }
  return out;
}

std::string_view verdict(const props::VerifyReport& r) { return r.passed() ? "PASS" : "FAIL"; }

std::string failure_reasons(const props::VerifyReport& r) {
  int invariants = 0, bugs = 0, proofs = 0;
  for (const props::InvariantResult& i : r.invariants) invariants += !i.holds;
  for (const props::BugResult& b : r.bugs) bugs += !b.caught;
  for (const props::ProofResult& p : r.proofs) proofs += !p.ok();
  std::vector<std::string> parts;
  const auto plural = [](int n, std::string_view one, std::string_view many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
  };
  if (invariants > 0) {
    parts.push_back(plural(invariants, "invariant does not hold", "invariants do not hold"));
  }
  if (bugs > 0) parts.push_back(plural(bugs, "known bug not caught", "known bugs not caught"));
  if (proofs > 0) {
    parts.push_back(plural(proofs, "proof not as expected", "proofs not as expected"));
  }
  if (r.determinism.mismatches > 0) {
    parts.push_back(
        plural(r.determinism.mismatches, "determinism mismatch", "determinism mismatches"));
  }
  if (!r.errors.empty()) {
    parts.push_back(plural(static_cast<int>(r.errors.size()), "work item failed", "work items failed"));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string run_line(const props::VerifyReport& r) {
  return fmt::format("profile {}, seed {}, {} job{}, {:.1f} s wall, started {}", r.profile, r.seed,
                     r.jobs, r.jobs == 1 ? "" : "s", r.seconds,
                     r.started.empty() ? "?" : r.started);
}

std::string seconds_label(double seconds) {
  const double s = std::abs(seconds);
  if (s >= 100 || s == 0) return fmt::format("{:.0f}", seconds);
  if (s >= 10) return fmt::format("{:.1f}", seconds);
  if (s >= 1) return fmt::format("{:.2f}", seconds);
  return fmt::format("{:.2g}", seconds);
}

std::string determinism_line(const props::DeterminismResult& d) {
  std::string s = fmt::format("{} same-seed rerun{}, {} mismatch{}", d.runs, d.runs == 1 ? "" : "s",
                              d.mismatches, d.mismatches == 1 ? "" : "es");
  if (d.mismatches == 0) return s + ": every rerun gave the same trace hash.";
  return s + (d.detail.empty() ? "." : ": first " + d.detail);
}

void write_file(const std::filesystem::path& path, std::string_view contents) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw UsageError(
        fmt::format("cannot write report file '{}': {}", path.string(), std::strerror(errno)));
  }
  const std::size_t written = std::fwrite(contents.data(), 1, contents.size(), f);
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (written != contents.size() || !closed) {
    throw UsageError(fmt::format("cannot write report file '{}': {}", path.string(),
                                 std::strerror(written != contents.size() ? write_errno : errno)));
  }
}

}  // namespace zc::reports
