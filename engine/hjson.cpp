#include "engine/hjson.h"

#include "engine/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace zc {

// Note [DeepSpeed's hjson]: DeepSpeed reads a ds_config file with `hjson.load(open(config),
// object_pairs_hook=dict_raise_error_on_duplicate_keys)` (runtime/config.py:444 in 0.19.8; the
// hook, runtime/config_utils.py:205, refuses a key given twice in one object). The pinned
// environment holds hjson 3.1.0, and this reader follows its decoder (hjson/decoder.py) function by
// function, so that a file means here what it means to DeepSpeed, quirks included:
// - getNext skips the whitespace ' \t\n\r' and comments (#, //, /* */) before every token;
// - a quoteless value (scantfnns) runs to the end of its line. At each `,`, `}`, `]`, `#`, `//`,
//   `/*` and at the line's end it asks whether what it has read so far is null, true, false or a
//   number (NUMBER_RE); if so that is the value, else it reads on, so `AdamW, # x` is the string
//   "AdamW, # x" and `5 # x` the number 5;
// - a number with a fraction or exponent is a float, an integer when it is a whole number below
//   1e10 in magnitude (`1.0` is 1, `5e8` is 500000000, `1e10` stays a float);
// - a quoteless key runs to its `:`, whitespace only before the colon; keys may be quoted with " or ';
// - strings in " or ' take JSON's escapes plus \'; '''multiline''' strings drop the indentation of
//   their opening line and their last newline;
// - the root object's braces may be left out; an empty text is {}; what follows the root value is
//   "Extra data".
// Where hjson-py would raise a Python error other than its decode error (an unterminated /* */ at
// the end of the text indexes past it) the reader refuses with the same position. Three departures,
// each refused rather than read differently: a lone UTF-16 surrogate in a \u escape (Python keeps
// it; UTF-8 cannot hold it), a number beyond what a double or a 64-bit integer holds (Python makes
// inf or a big integer), and nesting deeper than 256 levels (hjson-py's recursion stops near 500
// with RecursionError). A ''' on the text's first line takes no indentation (hjson-py's search for
// the line's start wraps to the text's end). A quoteless value is trimmed of ASCII whitespace
// (Python's str.strip() also trims Unicode spaces such as U+00A0). Checked against hjson-py itself
// on a corpus (DeepSpeedReference.HjsonReadsAsDeepSpeedsReader, label deepspeed).

namespace {

constexpr int kEnd = -1;

// What hjson-py raises as HjsonDecodeError (a duplicate key is DeepSpeed's ValueError: a plain
// ConfigError, which the root's second attempt does not catch, as raw_decode does not).
class DecodeError : public ConfigError {
 public:
  DecodeError(const std::string& detail) : ConfigError(std::string(kPrefix) + detail), detail_(detail) {}
  static constexpr std::string_view kPrefix = "ds_config is not hjson as DeepSpeed reads it (hjson 3.1.0): ";
  const std::string& detail() const { return detail_; }  // what and where, without kPrefix

 private:
  std::string detail_;
};

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  nlohmann::json document() {
    check_utf8();
    std::size_t idx = 0;
    if (s_.substr(0, 3) == "\xef\xbb\xbf") idx = 3;  // a UTF-8 byte order mark
    auto [ch, at] = next(idx);
    if (idx == 0 && ch == kEnd) return nlohmann::json::object();  // blank or comments only
    std::pair<nlohmann::json, std::size_t> root;
    if (ch == '{' || ch == '[') {
      root = value(at);
    } else {
      // hjson-py tries an object without braces first, then a single value, and reports the
      // first attempt's error when both fail.
      try {
        root = object(at, /*without_braces=*/true);
      } catch (const DecodeError& as_object) {
        try {
          root = value(at);
        } catch (const ConfigError&) {
          throw as_object;
        }
        // Read as one value, the root leaves "Extra data": hjson-py says only that; the object's
        // own error is the one a user needs.
        if (const std::size_t end = next(root.second).second; end != s_.size()) {
          fail(fmt::format("Extra data (the text read as an object without braces fails first: {})", as_object.detail()), end);
        }
      }
    }
    const std::size_t end = next(root.second).second;
    if (end != s_.size()) fail("Extra data", end);
    return std::move(root.first);
  }

 private:
  static constexpr int kMaxDepth = 256;
  std::string_view s_;
  int depth_ = 0;
  std::size_t swallowed_ = std::string::npos;  // the first quoteless string holding a } or ]

  // DeepSpeed opens the file as text, so a byte sequence Python's UTF-8 codec refuses (a stray
  // continuation byte, a truncated or overlong sequence, a surrogate, a code point past U+10FFFF)
  // is UnicodeDecodeError before hjson sees it.
  void check_utf8() const {
    for (std::size_t i = 0; i < s_.size();) {
      const int b = at(i);
      const int n = b < 0x80 ? 0 : b >= 0xc2 && b <= 0xdf ? 1 : b >= 0xe0 && b <= 0xef ? 2 : b >= 0xf0 && b <= 0xf4 ? 3 : -1;
      bool ok = n >= 0;
      for (int k = 1; ok && k <= n; ++k) {
        const int c = at(i + static_cast<std::size_t>(k));
        int lo = 0x80, hi = 0xbf;
        if (k == 1 && b == 0xe0) lo = 0xa0;  // overlong
        if (k == 1 && b == 0xed) hi = 0x9f;  // a surrogate
        if (k == 1 && b == 0xf0) lo = 0x90;  // overlong
        if (k == 1 && b == 0xf4) hi = 0x8f;  // past U+10FFFF
        ok = c >= lo && c <= hi;
      }
      if (!ok) fail(fmt::format("the text is not UTF-8 at byte 0x{:02x} (DeepSpeed opens the file as UTF-8 text)", b), i);
      i += static_cast<std::size_t>(n) + 1;
    }
  }

  int at(std::size_t i) const { return i < s_.size() ? static_cast<unsigned char>(s_[i]) : kEnd; }
  static bool whitespace(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  [[noreturn]] void fail(const std::string& msg, std::size_t pos) const { throw DecodeError(where(msg, pos)); }

  std::string where(const std::string& msg, std::size_t pos) const {
    if (swallowed_ != std::string::npos && swallowed_ < pos) {
      const std::string at_line = where_plain(swallowed_);
      return fmt::format("{}: {} (the quoteless value at {} holds a closing brace or bracket: a quoteless value runs to "
                         "the end of its line, so hjson reads it as part of the string; put it on a line of its own "
                         "or quote the value)", msg, where_plain(pos), at_line);
    }
    return fmt::format("{}: {}", msg, where_plain(pos));
  }

  std::string where_plain(std::size_t pos) const {
    int line = 1;
    std::size_t line_start = 0;
    for (std::size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') ++line, line_start = i + 1;
    }
    return fmt::format("line {} column {}", line, pos - line_start + 1);
  }

  // getNext: the next token's first character (kEnd at the end) and its index.
  std::pair<int, std::size_t> next(std::size_t end) const {
    while (true) {
      while (whitespace(at(end))) ++end;
      const int ch = at(end), ch2 = at(end + 1);
      if (ch == '#' || (ch == '/' && ch2 == '/')) {
        end = eol(end);
      } else if (ch == '/' && ch2 == '*') {
        const std::size_t open = end;
        end += 2;
        while (at(end) != kEnd && !(at(end) == '*' && at(end + 1) == '/')) ++end;
        if (at(end) == kEnd) fail("Unterminated /* comment", open);
        end += 2;
      } else {
        return {ch, end};
      }
    }
  }

  std::size_t eol(std::size_t end) const {
    while (at(end) != '\r' && at(end) != '\n' && at(end) != kEnd) ++end;
    return end;
  }

  // scan_once: the value at idx (after next()).
  std::pair<nlohmann::json, std::size_t> value(std::size_t idx) {
    const int ch = at(idx);
    if (ch == kEnd) fail("Expecting value", idx);
    if (ch == '"' || ch == '\'') {
      if (s_.substr(idx, 3) == "'''") return multiline(idx);
      return quoted(idx + 1);
    }
    if (ch == '{' || ch == '[') {
      // A bound on the recursion (hjson-py's own stops near 500 levels with RecursionError).
      if (++depth_ > kMaxDepth) fail(fmt::format("nested deeper than {} levels", kMaxDepth), idx);
      auto got = ch == '{' ? object(idx + 1, false) : array(idx + 1);
      --depth_;
      return got;
    }
    return quoteless(idx);
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  // Four hex digits at i (hjson-py: int(esc, 16), refusing an 'x' in the second place).
  std::optional<std::uint32_t> hex4(std::size_t i) const {
    if (i + 4 > s_.size()) return std::nullopt;
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = s_[i + k];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return std::nullopt;
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  // scanstring: end is just after the opening quote.
  std::pair<nlohmann::json, std::size_t> quoted(std::size_t end) {
    const std::size_t begin = end - 1;
    const int quote = at(begin);
    std::string out;
    while (true) {
      const int ch = at(end);
      if (ch == kEnd) fail("Unterminated string starting at", begin);
      ++end;
      if (ch == quote) break;
      if (ch == '"' || ch == '\'') {
        out += static_cast<char>(ch);
        continue;
      }
      if (ch < 0x20) fail("Invalid control character at", end - 1);
      if (ch != '\\') {
        out += static_cast<char>(ch);
        continue;
      }
      const int esc = at(end);
      if (esc == kEnd) fail("Unterminated string starting at", begin);
      if (esc != 'u') {
        static constexpr std::string_view from = "\"'\\/bfnrt", to = "\"'\\/\b\f\n\r\t";
        const std::size_t k = from.find(static_cast<char>(esc));
        if (k == std::string_view::npos) fail("Invalid \\X escape sequence", end);
        out += to[k];
        ++end;
        continue;
      }
      std::optional<std::uint32_t> cp = hex4(end + 1);
      if (!cp) fail("Invalid \\uXXXX escape sequence", end - 1);
      end += 5;
      if ((*cp & 0xfc00) == 0xd800 && s_.substr(end, 2) == "\\u") {
        if (const std::optional<std::uint32_t> low = hex4(end + 2); low && (*low & 0xfc00) == 0xdc00) {
          cp = 0x10000 + (((*cp - 0xd800) << 10) | (*low - 0xdc00));
          end += 6;
        }
      }
      if (*cp >= 0xd800 && *cp < 0xe000) {
        fail("a lone UTF-16 surrogate in a \\u escape (hjson-py keeps it; zerocheck refuses it)", end - 6);
      }
      append_utf8(out, *cp);
    }
    return {nlohmann::json(std::move(out)), end};
  }

  std::size_t skip_indent(std::size_t end, int n) const {
    while ((at(end) == ' ' || at(end) == '\t' || at(end) == '\r') && n != 0) ++end, --n;
    return end;
  }

  // mlscanstring: end is at the first ' of '''.
  std::pair<nlohmann::json, std::size_t> multiline(std::size_t end) {
    int indent = 0;  // the opening line's characters before the '''
    while (end >= static_cast<std::size_t>(indent) + 1 && s_[end - indent - 1] != '\n') ++indent;
    end = skip_indent(end + 3, -1);
    if (at(end) == kEnd) fail("Bad multiline string", end);
    if (at(end) == '\n') end = skip_indent(end + 1, indent);
    std::string out;
    int quotes = 0;
    while (true) {
      const int ch = at(end);
      if (ch == kEnd) fail("Bad multiline string", end);
      if (ch == '\'') {
        ++end;
        if (++quotes == 3) {
          if (!out.empty() && out.back() == '\n') out.pop_back();
          return {nlohmann::json(std::move(out)), end};
        }
        continue;
      }
      out.append(static_cast<std::size_t>(quotes), '\'');
      quotes = 0;
      if (ch == '\n') {
        out += '\n';
        end = skip_indent(end + 1, indent);
      } else {
        if (ch != '\r') out += static_cast<char>(ch);
        ++end;
      }
    }
  }

  static std::string_view trim(std::string_view t) {
    const auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); };
    while (!t.empty() && space(t.front())) t.remove_prefix(1);
    while (!t.empty() && space(t.back())) t.remove_suffix(1);
    return t;
  }

  // NUMBER_RE = [\t ]*(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?[\t ]* matched at begin: where it
  // ends, and whether it has a fraction or exponent; nullopt when it does not match.
  std::optional<std::pair<std::size_t, bool>> number_match(std::size_t i) const {
    const auto digit = [&](std::size_t k) { return at(k) >= '0' && at(k) <= '9'; };
    while (at(i) == ' ' || at(i) == '\t') ++i;
    if (at(i) == '-') ++i;
    if (at(i) == '0') {
      ++i;
    } else if (digit(i)) {
      while (digit(i)) ++i;
    } else {
      return std::nullopt;
    }
    bool real = false;
    if (at(i) == '.' && digit(i + 1)) {
      i += 1;
      while (digit(i)) ++i;
      real = true;
    }
    if (at(i) == 'e' || at(i) == 'E') {
      std::size_t k = i + 1;
      if (at(k) == '+' || at(k) == '-') ++k;
      if (digit(k)) {
        while (digit(k)) ++k;
        i = k;
        real = true;
      }
    }
    while (at(i) == ' ' || at(i) == '\t') ++i;
    return std::make_pair(i, real);
  }

  nlohmann::json number(std::string_view text, bool real, std::size_t pos) const {
    const std::string t(trim(text));
    if (real) {
      const double d = std::strtod(t.c_str(), nullptr);  // correctly rounded, as Python's float()
      if (!std::isfinite(d)) fail(fmt::format("the number {} is beyond a double (hjson-py makes it inf)", t), pos);
      if (d == std::trunc(d) && std::abs(d) < 1e10) return static_cast<std::int64_t>(d);
      return d;
    }
    std::int64_t v = 0;
    if (std::from_chars(t.data(), t.data() + t.size(), v).ec == std::errc()) return v;
    std::uint64_t u = 0;
    if (t[0] != '-' && std::from_chars(t.data(), t.data() + t.size(), u).ec == std::errc()) return u;
    fail(fmt::format("the integer {} is beyond 64 bits", t), pos);
  }

  // scantfnns: null, true, false, a number, or a quoteless string to the end of the line.
  std::pair<nlohmann::json, std::size_t> quoteless(std::size_t from) {
    const auto [chf, begin] = next(from);
    if (chf == kEnd || std::string_view("{}[],:").find(static_cast<char>(chf)) != std::string_view::npos) {
      fail("Found a punctuator character when expecting a quoteless string (check your syntax)", begin);
    }
    for (std::size_t end = begin;; ++end) {
      const int ch = at(end);
      const bool is_eol = ch == '\r' || ch == '\n' || ch == kEnd;
      if (!(is_eol || ch == ',' || ch == '}' || ch == ']' || ch == '#' ||
            (ch == '/' && (at(end + 1) == '/' || at(end + 1) == '*')))) {
        continue;
      }
      const std::string_view text = s_.substr(begin, end - begin);
      if (chf == 'n' && trim(text) == "null") return {nullptr, end};
      if (chf == 't' && trim(text) == "true") return {true, end};
      if (chf == 'f' && trim(text) == "false") return {false, end};
      if (chf == '-' || (chf >= '0' && chf <= '9')) {
        if (const auto m = number_match(begin); m && m->first == end) return {number(text, m->second, begin), end};
      }
      if (is_eol) {
        const std::string_view str = trim(text);
        if (swallowed_ == std::string::npos && str.find_first_of("}]") != std::string_view::npos) swallowed_ = begin;
        return {nlohmann::json(std::string(str)), end};
      }
    }
  }

  // scanKeyName.
  std::pair<std::string, std::size_t> key(std::size_t from) {
    const auto [ch, begin] = next(from);
    if (ch == '"' || ch == '\'') {
      auto [k, end] = quoted(begin + 1);
      return {k.get<std::string>(), end};
    }
    std::ptrdiff_t space = -1;
    for (std::size_t end = begin;; ++end) {
      const int c = at(end);
      if (c == kEnd) fail("Bad key name (eof)", end);
      if (c == ':') {
        if (begin == end) fail("Found ':' but no key name (for an empty key name use quotes)", begin);
        if (space >= 0) {
          if (static_cast<std::size_t>(space) != end - 1) {
            fail("Found whitespace in your key name (use quotes to include)", static_cast<std::size_t>(space));
          }
          return {std::string(trim(s_.substr(begin, end - begin))), end};
        }
        return {std::string(s_.substr(begin, end - begin)), end};
      }
      if (whitespace(c)) {
        if (space < 0 || static_cast<std::size_t>(space) == end - 1) space = static_cast<std::ptrdiff_t>(end);
      } else if (c == '{' || c == '}' || c == '[' || c == ']' || c == ',') {
        fail(fmt::format("Found '{}' where a key name was expected (check your syntax or use quotes if the key "
                         "name includes {{}}[],: or whitespace)", static_cast<char>(c)),
             begin);
      }
    }
  }

  // JSONObject: end is after the '{' (or at the first key, without braces).
  std::pair<nlohmann::json, std::size_t> object(std::size_t end, bool without_braces) {
    nlohmann::json obj = nlohmann::json::object();
    std::vector<std::string> twice;
    auto [ch, at_] = next(end);
    end = at_;
    if (!without_braces && ch == '}') return {std::move(obj), end + 1};
    while (true) {
      auto [k, after_key] = key(end);
      std::tie(ch, end) = next(after_key);
      if (ch != ':') fail("Expecting ':' delimiter", end);
      std::tie(ch, end) = next(end + 1);
      auto [v, after_value] = value(end);
      if (obj.contains(k)) {
        if (std::find(twice.begin(), twice.end(), k) == twice.end()) twice.push_back(k);
      }
      obj[k] = std::move(v);  // the last one, as Python's dict(pairs)
      std::tie(ch, end) = next(after_value);
      if (ch == ',') std::tie(ch, end) = next(end + 1);
      if (without_braces ? ch == kEnd : ch == '}') {
        if (!without_braces) ++end;
        break;
      }
      std::tie(ch, end) = next(end);
    }
    if (!twice.empty()) {
      std::string names;
      for (const std::string& k : twice) names += (names.empty() ? "'" : ", '") + k + "'";
      throw ConfigError(fmt::format("ds_config has the key {} twice in one object: DeepSpeed refuses it (\"Duplicate "
                                    "keys in DeepSpeed config\", runtime/config_utils.py:205)", names));
    }
    return {std::move(obj), end};
  }

  // JSONArray: end is after the '['.
  std::pair<nlohmann::json, std::size_t> array(std::size_t end) {
    nlohmann::json arr = nlohmann::json::array();
    auto [ch, at_] = next(end);
    end = at_;
    if (ch == ']') return {std::move(arr), end + 1};
    if (ch == kEnd) fail("End of input while parsing an array (did you forget a closing ']'?)", end);
    while (true) {
      auto [v, after] = value(end);
      arr.push_back(std::move(v));
      std::tie(ch, end) = next(after);
      if (ch == ',') std::tie(ch, end) = next(end + 1);
      if (ch == ']') {
        ++end;
        break;
      }
      std::tie(ch, end) = next(end);
    }
    return {std::move(arr), end};
  }
};

}  // namespace

nlohmann::json parse_hjson(std::string_view text) { return Reader(text).document(); }

}  // namespace zc
