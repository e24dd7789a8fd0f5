// The fuzz targets' driver where libFuzzer is not built (g++, `make test`): every file of the seed
// corpus, then a bounded number of mutations of them, deterministic from --seed (SplitMix64, no
// clock). An input that escapes the contract is printed, escaped, and written to a file that the
// libFuzzer binary (or this one) reruns: `zc_fuzz_<target> <file>`.
#include <algorithm>
#include <array>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;
using Bytes = std::string;

constexpr std::size_t kMaxLen = 4096;  // as the campaign's -max_len
constexpr int kMaxStack = 4;           // mutations stacked on one input

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }

 private:
  std::uint64_t state_;
};

// Values a parser meets at its edges: integer and float limits, other JSON types.
constexpr std::array<std::string_view, 34> kInteresting = {
    "0", "-1", "1", "2", "3", "7", "-2147483649", "2147483648", "4294967297",
    "9223372036854775807", "-9223372036854775808", "18446744073709551615",
    "18446744073709551616", "1e12", "1e19", "1e308", "-1e308", "1e400", "0.5", "-0.0", "1.5",
    "16777217", "1000000000", "null", "true", "false", "\"\"", "\"x\"", "[]", "{}", "[1e12]",
    "[-1]", "{\"a\":1}", "\"0x\""};

struct Options {
  std::vector<fs::path> corpus_dirs;
  std::vector<fs::path> files;  // given: run only these (reproduce a crash)
  fs::path dict;
  fs::path crash_dir = ".";
  long runs = 20000;
  std::uint64_t seed = 1;
};

// ---- the input under test, for the crash handler ----

std::string g_target = ZC_FUZZ_TARGET;
std::array<char, 4096> g_crash_path{};
const Bytes* g_current = nullptr;

std::string escaped(const Bytes& b) {
  std::string out;
  for (unsigned char c : b) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// A crash (a signal) has no exception to catch: write the input with async-signal-safe calls only.
extern "C" void on_fatal_signal(int sig) {
  if (g_current != nullptr) {
    const int fd = ::open(g_crash_path.data(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      write_all(fd, g_current->data(), g_current->size());
      ::close(fd);
    }
    static const char kMsg[] = "\nfuzz: fatal signal on an input, written to ";
    write_all(2, kMsg, sizeof kMsg - 1);
    write_all(2, g_crash_path.data(), std::strlen(g_crash_path.data()));
    write_all(2, "\n", 1);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void report(const Bytes& input, const std::string& what) {
  std::fprintf(stderr, "fuzz %s: FAILED: %s\ninput (%zu bytes, escaped): %s\n", g_target.c_str(),
               what.c_str(), input.size(), escaped(input).c_str());
  std::ofstream(g_crash_path.data(), std::ios::binary) << input;
  std::fprintf(stderr, "written to %s; rerun it with: zc_fuzz_%s %s\n", g_crash_path.data(),
               g_target.c_str(), g_crash_path.data());
}

bool run_one(const Bytes& input) {
  g_current = &input;
  try {
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
  } catch (const std::exception& e) {
    report(input, std::string("exception escaped the contract: ") + e.what());
    return false;
  } catch (...) {
    report(input, "a non-std exception escaped the contract");
    return false;
  }
  g_current = nullptr;
  return true;
}

// ---- mutations ----

// A JSON token at or after `from`: a number or a string literal; {begin, end} or {npos, npos}.
std::pair<std::size_t, std::size_t> token_at(const Bytes& b, std::size_t from) {
  for (std::size_t i = from; i < b.size(); ++i) {
    if (b[i] == '"') {
      std::size_t j = i + 1;
      while (j < b.size() && b[j] != '"') j += b[j] == '\\' ? 2 : 1;
      return {i, std::min(j + 1, b.size())};
    }
    if (b[i] == '-' || (b[i] >= '0' && b[i] <= '9')) {
      std::size_t j = i + 1;
      while (j < b.size() && std::strchr("0123456789.eE+-", b[j]) != nullptr) ++j;
      return {i, j};
    }
  }
  return {Bytes::npos, Bytes::npos};
}

std::string pick_value(SplitMix64& rng, const std::vector<Bytes>& dict) {
  if (!dict.empty() && rng.below(3) == 0) return "\"" + dict[rng.below(dict.size())] + "\"";
  return std::string(kInteresting[rng.below(kInteresting.size())]);
}

// Replaces a number or string with an edge value, or inserts a known key into an object.
void mutate_json(Bytes& b, SplitMix64& rng, const std::vector<Bytes>& dict) {
  if (b.empty()) return;
  if (rng.below(4) == 0 && !dict.empty()) {
    const std::size_t brace = b.find('{', rng.below(b.size()));
    if (brace == Bytes::npos) return;
    const std::string entry = "\"" + dict[rng.below(dict.size())] + "\":" + pick_value(rng, dict);
    const bool empty = brace + 1 < b.size() && b[brace + 1] == '}';
    b.insert(brace + 1, empty ? entry : entry + ",");
    return;
  }
  const auto [begin, end] = token_at(b, rng.below(b.size()));
  if (begin == Bytes::npos) return;
  b.replace(begin, end - begin, pick_value(rng, dict));
}

void mutate_bytes(Bytes& b, SplitMix64& rng, const std::vector<Bytes>& dict, const Bytes& other) {
  const std::size_t at = rng.below(b.size() + 1);
  switch (rng.below(7)) {
    case 0:
      if (!b.empty()) b[rng.below(b.size())] ^= static_cast<char>(1u << rng.below(8));
      break;
    case 1: b.insert(at, 1, static_cast<char>(rng.below(256))); break;
    case 2: b.erase(at, 1 + rng.below(16)); break;
    case 3: b.resize(at); break;
    case 4: b.insert(at, b.substr(rng.below(b.size() + 1), 1 + rng.below(32))); break;
    case 5:  // splice: our head, the other input's tail
      b = b.substr(0, at) + other.substr(rng.below(other.size() + 1));
      break;
    default:
      if (!dict.empty()) b.insert(at, dict[rng.below(dict.size())]);
      break;
  }
}

Bytes mutate(const std::vector<Bytes>& corpus, SplitMix64& rng, const std::vector<Bytes>& dict) {
  Bytes b = corpus[rng.below(corpus.size())];
  const Bytes& other = corpus[rng.below(corpus.size())];
  const int n = 1 + static_cast<int>(rng.below(kMaxStack));
  for (int i = 0; i < n; ++i) {
    if (rng.below(2) == 0) {
      mutate_json(b, rng, dict);
    } else {
      mutate_bytes(b, rng, dict, other);
    }
  }
  if (b.size() > kMaxLen) b.resize(kMaxLen);
  return b;
}

// ---- files ----

Bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// libFuzzer's dictionary format: one `name="token"` or `"token"` a line, \" \\ and \xNN escapes.
std::vector<Bytes> read_dict(const fs::path& p) {
  std::vector<Bytes> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) {
    const std::size_t q = line.find('"'), last = line.rfind('"');
    if (line.empty() || line[0] == '#' || q == std::string::npos || last <= q) continue;
    Bytes tok;
    for (std::size_t i = q + 1; i < last; ++i) {
      if (line[i] == '\\' && i + 1 < last && line[i + 1] == 'x' && i + 3 < last) {
        tok += static_cast<char>(std::stoi(line.substr(i + 2, 2), nullptr, 16));
        i += 3;
      } else if (line[i] == '\\' && i + 1 < last) {
        tok += line[++i];
      } else {
        tok += line[i];
      }
    }
    out.push_back(tok);
  }
  return out;
}

std::vector<Bytes> read_corpus(const std::vector<fs::path>& dirs) {
  std::vector<fs::path> files;
  for (const fs::path& d : dirs) {
    for (const auto& e : fs::directory_iterator(d)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());  // directory order differs between file systems
  std::vector<Bytes> out;
  for (const fs::path& f : files) out.push_back(read_file(f));
  return out;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "zc_fuzz_%s: %s\nusage: zc_fuzz_%s [--corpus DIR]... [--dict FILE] [--runs N] "
               "[--seed S] [--crash-dir DIR] [FILE...]\n",
               g_target.c_str(), why, g_target.c_str());
  return 2;
}

bool parse_args(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--corpus" && has_value) {
      o.corpus_dirs.emplace_back(argv[++i]);
    } else if (a == "--dict" && has_value) {
      o.dict = argv[++i];
    } else if (a == "--runs" && has_value) {
      o.runs = std::stol(argv[++i]);
    } else if (a == "--seed" && has_value) {
      o.seed = std::stoull(argv[++i]);
    } else if (a == "--crash-dir" && has_value) {
      o.crash_dir = argv[++i];
    } else if (a.starts_with("--")) {
      return false;
    } else {
      o.files.emplace_back(argv[i]);
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_args(argc, argv, o)) return usage("bad arguments");
  fs::create_directories(o.crash_dir);
  const std::string crash = (o.crash_dir / ("crash-" + g_target + "-seed" +
                                            std::to_string(o.seed))).string();
  if (crash.size() >= g_crash_path.size()) return usage("--crash-dir is too long");
  std::memcpy(g_crash_path.data(), crash.c_str(), crash.size() + 1);
  for (int sig : {SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL}) std::signal(sig, on_fatal_signal);
  if (!o.files.empty()) {  // reproduce mode
    for (const fs::path& f : o.files) {
      if (!run_one(read_file(f))) return 1;
    }
    std::printf("zc_fuzz_%s: %zu file(s) ran clean\n", g_target.c_str(), o.files.size());
    return 0;
  }
  const std::vector<Bytes> corpus = read_corpus(o.corpus_dirs);
  if (corpus.empty()) return usage("no seed inputs: give --corpus DIR or files");
  const std::vector<Bytes> dict = o.dict.empty() ? std::vector<Bytes>{} : read_dict(o.dict);
  for (const Bytes& seed_input : corpus) {
    if (!run_one(seed_input)) return 1;
  }
  SplitMix64 rng(o.seed);
  for (long i = 0; i < o.runs; ++i) {
    if (!run_one(mutate(corpus, rng, dict))) return 1;
  }
  std::printf("zc_fuzz_%s: %zu seed inputs and %ld mutations (seed %llu) ran clean\n",
              g_target.c_str(), corpus.size(), o.runs,
              static_cast<unsigned long long>(o.seed));
  return 0;
}
