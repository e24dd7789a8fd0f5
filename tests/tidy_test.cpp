// The house rules, enforced (TigerBeetle's tidy.zig): engine/ knows no backend; sim/ knows no real
// backend; functions in engine/ and sim/ stay under 100 lines (a ratchet list may name exceptions);
// no rand(), random_device or clock read, by any spelling, in engine/, sim/ or props/ outside
// props/stopwatch.h (Note [Wall time never decides]). The checker is tested on crafted snippets
// first, so a rule that silently matches nothing fails too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> sources(const std::string& dir) {
  std::vector<fs::path> out;
  const fs::path root = fs::path(ZC_SOURCE_DIR) / dir;
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".h" || ext == ".cpp" || ext == ".hpp" || ext == ".cu" || ext == ".cuh") {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Lines of `text` that include a header matching `forbidden`.
std::vector<std::string> bad_includes(const std::string& text, const std::regex& forbidden) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  static const std::regex include(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, include) && std::regex_search(m[1].str(), forbidden)) {
      out.push_back(line);
    }
  }
  return out;
}

// Replaces comments, string and char literals with spaces, keeping newlines, so braces inside
// them do not count.
std::string strip(const std::string& s) {
  std::string out = s;
  enum { code, line_comment, block_comment, str, chr } st = code;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i], n = i + 1 < s.size() ? s[i + 1] : '\0';
    switch (st) {
      case code:
        if (c == '/' && n == '/') st = line_comment;
        else if (c == '/' && n == '*') st = block_comment;
        else if (c == '"') st = str;
        else if (c == '\'') st = chr;
        else continue;
        if (c != '"' && c != '\'') out[i] = ' ';
        break;
      case line_comment:
        if (c == '\n') st = code; else out[i] = ' ';
        break;
      case block_comment:
        if (c == '*' && n == '/') { out[i] = out[i + 1] = ' '; ++i; st = code; }
        else if (c != '\n') out[i] = ' ';
        break;
      case str:
      case chr:
        if (c == '\\') { out[i] = ' '; if (i + 1 < s.size()) out[++i] = ' '; break; }
        if ((st == str && c == '"') || (st == chr && c == '\'')) { st = code; break; }
        if (c != '\n') out[i] = ' ';
        break;
    }
  }
  return out;
}

struct LongFunction {
  int line;
  int length;
};

// Outermost brace blocks opened right after a parameter list (") {", ") const {", ") override {",
// "-> T {", or "{" alone on a line after ")") count as function bodies; lambdas and control blocks
// inside them count toward their function.
std::vector<LongFunction> long_functions(const std::string& text, int max_lines) {
  const std::string s = strip(text);
  static const std::regex opener(R"(\)\s*(const|noexcept|override|final|mutable|\s)*(->[^;{}]*)?$)");
  std::vector<LongFunction> out;
  int line = 1, depth = 0, fn_depth = -1, fn_line = 0;
  std::string before;  // code since the last ; { or } at this level
  for (char c : s) {
    if (c == '\n') ++line;
    if (c == '{') {
      if (fn_depth < 0 && std::regex_search(before, opener)) {
        fn_depth = depth;
        fn_line = line;
      }
      ++depth;
      before.clear();
    } else if (c == '}') {
      --depth;
      if (depth == fn_depth) {
        if (line - fn_line + 1 > max_lines) out.push_back({fn_line, line - fn_line + 1});
        fn_depth = -1;
      }
      before.clear();
    } else if (c == ';') {
      before.clear();
    } else {
      before += c;
    }
  }
  return out;
}

const std::regex kBackendHeaders(R"(^(sim/|real/|cuda|nccl|mpi|cublas))");
const std::regex kRealHeaders(R"(^(real/|cuda|nccl|mpi|cublas))");
// Unseeded randomness, or a clock read by any spelling: a C or POSIX time call, a std::chrono clock
// or anything from std::chrono (so an alias such as `using Clock = std::chrono::steady_clock` is
// caught where it is made), `::now` / `.now` / `->now` on whatever name (so `Clock::now()` is
// caught where an alias is used), time types and constants, the cycle counter, inline assembly.
// Matched on strip()ped code, so comments and string literals do not count; `\b` keeps
// `operand(`, `runtime(`, `set_time(`, `time_us` and `now_us` out.
const std::regex kNondeterminism(
    R"(\b(rand|srand|rand_r|drand48|random|time|clock|clock_gettime|gettimeofday)"
    R"(|timespec_get|ftime|times|getrusage|localtime|gmtime|mktime)\s*\()"
    R"(|\b(steady_clock|system_clock|high_resolution_clock|utc_clock|tai_clock|gps_clock)"
    R"(|file_clock|chrono|clock_t|time_t|timespec|timeval|CLOCKS_PER_SEC|CLOCK_[A-Z_]+)"
    R"(|random_device|last_write_time)\b)"
    R"(|(::|\.|->)\s*now\b)"
    R"(|\b_*(builtin_ia32_)?rdtscp?\b|\b__builtin_readcyclecounter\b|\b(asm|__asm|__asm__)\b)");
// Headers whose only use here would be reading a clock (or the cycle counter).
const std::regex kClockHeaders(
    R"((^|/)chrono(\.h)?$)"
    R"(|^(ctime|time\.h|sys/time\.h|sys/times\.h|sys/timeb\.h|x86intrin\.h|ia32intrin\.h)$)"
    R"(|^intrin\.h$)");
// The one file allowed to read a clock: its values go to reports and to deadlines on external
// processes, never to a verdict or a hash (Note [Wall time never decides]).
const std::string kClockFile = "props/stopwatch.h";

// Every clock read or unseeded random call in `text`: "line N: match", or the include line.
std::vector<std::string> clock_reads(const std::string& text) {
  std::vector<std::string> out = bad_includes(text, kClockHeaders);
  const std::string s = strip(text);
  const std::sregex_iterator end;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), kNondeterminism); it != end; ++it) {
    const auto line = 1 + std::count(s.begin(), s.begin() + it->position(), '\n');
    out.push_back("line " + std::to_string(line) + ": " + it->str());
  }
  return out;
}

// The ratchet: functions allowed past the limit, by "file:line-of-opening". Empty, and it should
// only shrink.
const std::vector<std::string> kLongFunctionExceptions = {};

TEST(TidyChecker, FindsWhatItMustFind) {
  EXPECT_EQ(bad_includes("#include \"sim/sim_comm.h\"\n#include <vector>\n", kBackendHeaders).size(), 1u);
  EXPECT_EQ(bad_includes("#  include <cuda_runtime.h>\n#include <nccl.h>\n#include <mpi.h>\n",
                         kBackendHeaders).size(), 3u);
  EXPECT_TRUE(bad_includes("#include \"engine/comm.h\"\n", kBackendHeaders).empty());
  std::string fn = "int f(int x) const {\n";
  for (int i = 0; i < 120; ++i) fn += "  if (x) { x += 1; }\n";
  fn += "}\nstruct S { int g() { return 1; } };\n";
  const auto found = long_functions(fn, 100);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].line, 1);
  EXPECT_EQ(found[0].length, 122);
  EXPECT_TRUE(long_functions("void g() {\n  auto s = \"}}}\"; // }\n}\n", 2).size() == 1u);
  EXPECT_TRUE(long_functions("namespace a {\nstruct B {\n};\n}\n", 1).empty());
}

TEST(TidyChecker, FindsEveryClockReadAndNothingElse) {
  const std::vector<std::string> reads = {
      "auto t = Clock::now();",  // the alias spelling, where it is used
      "auto t = clk.now();", "auto t = src->now();", "auto f = &Clock::now;",
      "using Clock = std::chrono::steady_clock;", "using namespace std::chrono;",
      "auto t = steady_clock::now();", "auto t = std::chrono::system_clock::now();",
      "auto t = std::chrono::high_resolution_clock::now();", "auto t = utc_clock::now();",
      "auto t = file_clock::now();", "tai_clock c;", "gps_clock c;",
      "clock_gettime(CLOCK_MONOTONIC, &ts);", "gettimeofday(&tv, nullptr);",
      "const auto t = std::time(nullptr);", "auto t = time(0);", "auto t = ::time(nullptr);",
      "auto c = clock();", "auto c = std::clock();", "clock_t c;", "std::time_t t;",
      "struct timespec ts;", "timeval tv;", "double d = CLOCKS_PER_SEC;",
      "timespec_get(&ts, TIME_UTC);", "auto w = fs::last_write_time(p);",
      "auto c = __rdtsc();", "auto c = __rdtscp(&aux);", "auto c = __builtin_ia32_rdtsc();",
      "auto c = __builtin_readcyclecounter();", "asm volatile(\"rdtsc\");", "__asm__(\"rdtsc\");",
      "int x = rand();", "srand(1);", "std::random_device rd;", "std::mt19937 g(std::random_device{}());", "long r = random();",
      "#include <chrono>", "#include <ctime>", "#include <time.h>", "#include <sys/time.h>",
      "#  include <fmt/chrono.h>", "#include <x86intrin.h>",
  };
  for (const std::string& r : reads) EXPECT_FALSE(clock_reads(r).empty()) << r;
  const std::vector<std::string> not_reads = {
      "// Clock::now() steady_clock time(nullptr)\n/* std::chrono::system_clock::now() */ int x;",
      "auto s = \"time(nullptr) Clock::now() steady_clock rand()\";", "char c = ')';",
      "int operand(1);", "runtime();", "double time_us = 0;", "set_time(t);", "rs.now_us = 1;",
      "auto u = time_us(x);", "auto u = now_us();", "int times_seen = 0;", "lifetime(p);",
      "x.known();", "a->nowhere = 0;", "Clockwork w;", "int timeout_s = 1;", "brand(1);",
      "random_bits(3);", "#include \"props/time_budget.h\"", "#include <thread>",
      "#include \"props/stopwatch.h\"", "const Stopwatch watch; r.seconds = watch.seconds();",
      "Deadline d(5); if (d.passed()) d.tighten(1);",
  };
  for (const std::string& n : not_reads) EXPECT_EQ(clock_reads(n), std::vector<std::string>{}) << n;
  const std::vector<std::string> two = clock_reads("int a;\nusing C = std::chrono::steady_clock;");
  ASSERT_EQ(two.size(), 2u) << "every hit, each with its line";
  EXPECT_EQ(two[0], "line 2: chrono");
  EXPECT_EQ(two[1], "line 2: steady_clock");
}

// Calls of alloc(...) whose arguments name no memory category (MemCategory::, or a forwarded
// `category` / `why` parameter): "line: call" for each. Declarations and definitions are not calls.
std::vector<std::string> uncategorised_allocs(const std::string& text) {
  const std::string s = strip(text);
  std::vector<std::string> out;
  static const std::regex call(R"((\.|->)alloc\()");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), call); it != std::sregex_iterator(); ++it) {
    const std::size_t open = static_cast<std::size_t>(it->position() + it->length()) - 1;
    int depth = 0;
    std::size_t close = open;
    for (; close < s.size(); ++close) {
      if (s[close] == '(') ++depth;
      if (s[close] == ')' && --depth == 0) break;
    }
    const std::string args = s.substr(open, close - open + 1);
    static const std::regex named(R"(MemCategory::|\bcategory\b|\bwhy\b)");
    if (std::regex_search(args, named)) continue;
    const auto line = 1 + std::count(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(open), '\n');
    out.push_back(std::to_string(line) + ": alloc" + args);
  }
  return out;
}

TEST(TidyChecker, FindsEveryAllocationWithoutACategory) {
  const std::string snippet =
      "Tensor a = dev.alloc(DType::f32, {n}, \"a\", MemCategory::grads);\n"
      "Tensor b = dev_.alloc(dtype_, {n}, \"b\");\n"                       // missing
      "Tensor c = cpu_->alloc(DType::f32, {pn},\n  \"c\", MemCategory::master);\n"
      "Tensor d = dev.alloc(dtype_, shape(x, y));\n"                          // missing, nested parens
      "return cpu_->alloc(dtype, std::move(shape), \"cpu:\" + label, category);\n"
      "// dev.alloc(DType::f32, {1}) in a comment is not a call\n"
      "const char* s = \"dev.alloc(x)\";\n";
  const std::vector<std::string> found = uncategorised_allocs(snippet);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].rfind("2:", 0), 0u) << found[0];
  EXPECT_EQ(found[1].rfind("5:", 0), 0u) << found[1];
}

// engine/memory.h: every allocation the engine and the models make names what it is for, so
// zerocheck plan's categories add up to the whole.
TEST(Tidy, EveryEngineAndModelAllocationNamesAMemoryCategory) {
  std::string report;
  int checked = 0;
  for (const std::string dir : {"engine", "models"}) {
    for (const fs::path& p : sources(dir)) {
      ++checked;
      for (const std::string& call : uncategorised_allocs(read(p))) {
        report += fs::relative(p, ZC_SOURCE_DIR).string() + ":" + call + "\n";
      }
    }
  }
  EXPECT_GT(checked, 20);
  EXPECT_EQ(report, "") << "name a MemCategory at these alloc calls (engine/memory.h)";
}

TEST(Tidy, EngineIncludesNoBackend) {
  std::string report;
  ASSERT_GT(sources("engine").size(), 10u) << "ZC_SOURCE_DIR must point at the tree";
  for (const fs::path& p : sources("engine")) {
    for (const std::string& line : bad_includes(read(p), kBackendHeaders)) {
      report += p.string() + ": " + line + "\n";
    }
  }
  EXPECT_EQ(report, "") << "engine/ must not include sim/, real/, CUDA, NCCL or MPI (DESIGN.md)";
}

TEST(Tidy, SimIncludesNoRealBackend) {
  std::string report;
  ASSERT_GT(sources("sim").size(), 5u) << "ZC_SOURCE_DIR must point at the tree";
  for (const fs::path& p : sources("sim")) {
    for (const std::string& line : bad_includes(read(p), kRealHeaders)) {
      report += p.string() + ": " + line + "\n";
    }
  }
  EXPECT_EQ(report, "");
}

TEST(Tidy, FunctionsInEngineAndSimStayUnderAHundredLines) {
  std::string report;
  int checked = 0;
  for (const std::string dir : {"engine", "sim"}) {
    for (const fs::path& p : sources(dir)) {
      ++checked;
      for (const LongFunction& f : long_functions(read(p), 100)) {
        const std::string key = fs::relative(p, ZC_SOURCE_DIR).string() + ":" + std::to_string(f.line);
        if (std::find(kLongFunctionExceptions.begin(), kLongFunctionExceptions.end(), key) !=
            kLongFunctionExceptions.end()) continue;
        report += key + " is " + std::to_string(f.length) + " lines\n";
      }
    }
  }
  EXPECT_GT(checked, 10);
  EXPECT_EQ(report, "") << "split these functions (STYLE.md 8)";
}

TEST(Tidy, NoWallClockOrUnseededRandomnessInDeterministicCode) {
  std::string report;
  int allowed_reads = 0;
  ASSERT_GT(sources("engine").size() + sources("sim").size() + sources("props").size(), 20u);
  for (const std::string dir : {"engine", "sim", "props"}) {
    for (const fs::path& p : sources(dir)) {
      const std::string rel = fs::relative(p, ZC_SOURCE_DIR).string();
      const std::vector<std::string> reads = clock_reads(read(p));
      if (rel == kClockFile) {
        allowed_reads = static_cast<int>(reads.size());
        continue;
      }
      for (const std::string& r : reads) report += rel + ": " + r + "\n";
    }
  }
  EXPECT_GT(allowed_reads, 0) << kClockFile << " reads no clock: drop the exemption";
  EXPECT_EQ(report, "") << "use zc::Rng from the root seed and simulated time; for report timings "
                           "and deadlines on external processes use " << kClockFile << " (STYLE.md 6)";
}

// ---- decide:: coverage: every decision template is both run by the engine and proved ----------

// The function templates of a decisions header, each with the templates of the header it calls.
std::map<std::string, std::set<std::string>> decide_templates(const std::string& header) {
  const std::string s = strip(header);
  static const std::regex head(R"(template\s*<[^>]*>\s*[\w:<>, ]+?\s+(\w+)\s*\()");
  std::map<std::string, std::string> bodies;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), head); it != std::sregex_iterator(); ++it) {
    const std::size_t open = s.find('{', static_cast<std::size_t>(it->position(0) + it->length(0)));
    if (open == std::string::npos) continue;
    std::size_t close = open;
    for (int depth = 0; close < s.size(); ++close) {
      depth += s[close] == '{' ? 1 : s[close] == '}' ? -1 : 0;
      if (depth == 0) break;
    }
    bodies[(*it)[1].str()] = s.substr(open, close - open + 1);
  }
  std::map<std::string, std::set<std::string>> out;
  for (const auto& [name, body] : bodies) {
    std::set<std::string>& calls = out[name];
    for (const auto& [other, unused] : bodies) {
      if (other != name && std::regex_search(body, std::regex("\\b" + other + R"(\s*(<[^;(]*>)?\s*\()"))) calls.insert(other);
    }
  }
  return out;
}

// The templates `code` names as decide::NAME, and every template those call, transitively.
std::set<std::string> decide_reached(const std::map<std::string, std::set<std::string>>& templates,
                                     const std::string& code) {
  std::set<std::string> reached;
  std::vector<std::string> todo;
  const std::string s = strip(code);
  for (const auto& [name, calls] : templates) {
    if (std::regex_search(s, std::regex(R"(\bdecide::)" + name + "\\b"))) todo.push_back(name);
  }
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    if (!reached.insert(name).second) continue;
    for (const std::string& callee : templates.at(name)) todo.push_back(callee);
  }
  return reached;
}

// One line per template that the engine runs but no proof instantiates, or the reverse, or neither.
std::string decide_coverage_violations(const std::string& header, const std::string& engine_code,
                                       const std::string& proof_code) {
  const auto templates = decide_templates(header);
  const std::set<std::string> run = decide_reached(templates, engine_code), proved = decide_reached(templates, proof_code);
  std::string out;
  for (const auto& [name, calls] : templates) {
    if (run.count(name) && !proved.count(name)) out += "decide::" + name + " is called by the engine but no proof instantiates it\n";
    if (!run.count(name) && proved.count(name)) out += "decide::" + name + " is proved but the engine never calls it\n";
    if (!run.count(name) && !proved.count(name)) out += "decide::" + name + " is neither called nor proved\n";
  }
  return out;
}

TEST(TidyChecker, DecideCoverageFindsWhatItMustFind) {
  const std::string header = R"(
template <class Int>
Int inner(Int a) { return a + 1; }  // called through outer only
template <class Int, class Bool = bool>
Bool outer(Int a, Int b) { return inner<Int>(a) > b; }
template <class Int>
Int alone(Int a) { return a; }
template <class T>
struct NotAFunction { T t; };
)";
  const auto t = decide_templates(header);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at("outer"), std::set<std::string>{"inner"});
  EXPECT_EQ(decide_coverage_violations(header, "if (decide::outer<int>(x, y)) z = decide::alone(1);", "decide::outer(a, b)"),
            "decide::alone is called by the engine but no proof instantiates it\n");
  EXPECT_EQ(decide_coverage_violations(header, "decide::outer(x, y); // decide::alone(1)", "decide::outer(a, b); decide::alone(c);"),
            "decide::alone is proved but the engine never calls it\n");
  EXPECT_EQ(decide_coverage_violations(header, "decide::outer(x, y);", "decide::outer(a, b);"),
            "decide::alone is neither called nor proved\n");
  EXPECT_EQ(decide_coverage_violations(header, "decide::outer(x, y); decide::alone(1);", "decide::alone(c); decide::outer(a, b);"), "");
}

TEST(Tidy, EveryDecideTemplateIsCalledByTheEngineAndProved) {
  const std::string header = read(fs::path(ZC_SOURCE_DIR) / "engine" / "decisions.h");
  ASSERT_GE(decide_templates(header).size(), 20u);
  std::string engine, proofs;
  for (const fs::path& p : sources("engine")) {
    if (p.filename() != "decisions.h") engine += read(p) + "\n";
  }
  for (const fs::path& p : sources("props")) {
    if (p.filename().string().rfind("proofs", 0) == 0) proofs += read(p) + "\n";
  }
  EXPECT_EQ(decide_coverage_violations(header, engine, proofs), "")
      << "a decision the engine makes must be the template a proof instantiates (engine/decisions.h)";
}

}  // namespace
