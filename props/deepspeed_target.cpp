#include "props/deepspeed_target.h"

#include "engine/data_files.h"
#include "engine/errors.h"
#include "props/reference_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <unistd.h>

namespace zc::props {

namespace {

const std::regex kVersion(R"(\d+\.\d+\.\d+)");

std::vector<int> parts(const std::string& v) {
  std::vector<int> out;
  std::stringstream ss(v);
  for (std::string p; std::getline(ss, p, '.');) out.push_back(std::atoi(p.c_str()));
  return out;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command; stdout is returned, stderr goes to `err_file` and (when `echo`) to ours.
int run_capture(const std::string& cmd, const std::filesystem::path& err_file, bool echo, std::string& out) {
  const std::string full =
      echo ? fmt::format("{} 2> >(tee {} >&2)", cmd, quoted(err_file.string())) : fmt::format("{} 2> {}", cmd, quoted(err_file.string()));
  FILE* p = ::popen(fmt::format("bash -c {}", quoted(full)).c_str(), "r");
  if (p == nullptr) throw UsageError(fmt::format("cannot run {}", cmd));
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string last_line(const std::filesystem::path& f) {
  std::ifstream in(f);
  std::string last;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) last = l;
  }
  return last;
}

}  // namespace

bool version_less(const std::string& a, const std::string& b) { return parts(a) < parts(b); }

std::string normalize_target(const std::string& target) {
  if (target == "deepspeed") return target;
  if (target.rfind("deepspeed==", 0) == 0) {
    const std::string v = target.substr(11);
    if (!std::regex_match(v, kVersion)) {
      throw UsageError(fmt::format("--against {}: '{}' is not a release version X.Y.Z (for example deepspeed==0.15.2)", target, v));
    }
    return target;
  }
  if (target.rfind("deepspeed@", 0) == 0 && target.size() > 10) {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::absolute(target.substr(10), ec);
    return "deepspeed@" + dir.lexically_normal().string();
  }
  throw UsageError(fmt::format("--against {}: use deepspeed (the pinned 0.19.8), deepspeed==X.Y.Z (a release) or "
                               "deepspeed@DIR (a DeepSpeed source tree)", target));
}

bool is_pinned(const std::string& target) { return normalize_target(target) == "deepspeed"; }

Overlay ensure_overlay(const std::string& target, bool all_ops) {
  const std::string t = normalize_target(target);
  const std::string arg = t.rfind("deepspeed@", 0) == 0 ? t.substr(10) : t;
  const std::filesystem::path script = data_file("scripts/ds-release.sh", ZC_SOURCE_DIR);
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  const std::filesystem::path err = tmp / fmt::format("zc-ds-release-{}.log", ::getpid());
  const std::filesystem::path reason = tmp / fmt::format("zc-ds-release-{}.why", ::getpid());
  std::string out;
  const int rc = run_capture(fmt::format("ZC_DS_RELEASE_ERROR={} bash {} {}{}", quoted(reason.string()), quoted(script.string()),
                                         quoted(arg), all_ops ? " --all-ops" : ""), err, /*echo=*/true, out);
  const std::string why = last_line(reason);
  const std::string tail = last_line(err);
  std::error_code ec;
  std::filesystem::remove(err, ec);
  std::filesystem::remove(reason, ec);
  if (rc != 0) {  // the script's reason names the DeepSpeed and the cause
    throw ConfigError(!why.empty() ? why : fmt::format("{}: scripts/ds-release.sh failed ({}): {}", t, rc, tail));
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  Overlay o;
  o.dir = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  o.site = o.dir / "site";
  std::ifstream stamp(o.dir / ".zerocheck-complete");
  for (std::string l; std::getline(stamp, l);) {
    if (l.rfind("ops ", 0) == 0) o.ext_dir = l.substr(4);
    if (l.rfind("made ", 0) == 0) o.made = l.substr(5);
    if (l.rfind("deepspeed ", 0) == 0) o.version = l.substr(10);
  }
  if (o.ext_dir.empty() || !std::filesystem::exists(o.site)) {
    throw ConfigError(fmt::format("{}: scripts/ds-release.sh reported {}, which is not a complete overlay", t, o.dir.string()));
  }
  return o;
}

std::vector<std::string> index_releases(const std::string& from, const std::string& to) {
  const std::string env = pinned_env_dir().string();
  const std::filesystem::path err = std::filesystem::temp_directory_path() / fmt::format("zc-ds-index-{}.log", ::getpid());
  std::string out;
  const int rc = run_capture(fmt::format("timeout 120 {}/bin/python -m pip --disable-pip-version-check index versions deepspeed",
                                         quoted(env)), err, /*echo=*/false, out);
  const std::string why = last_line(err);
  std::error_code ec;
  std::filesystem::remove(err, ec);
  const auto at = out.find("Available versions:");
  if (rc != 0 || at == std::string::npos) {
    throw ConfigError(fmt::format("cannot list DeepSpeed's releases on the package index (pip index versions deepspeed "
                                  "in {}): {}", env, why.empty() ? out.substr(0, 200) : why));
  }
  std::vector<std::string> all;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  for (std::sregex_iterator i(line.begin(), line.end(), kVersion), end; i != end; ++i) all.push_back(i->str());
  std::vector<std::string> picked;
  for (const std::string& v : all) {
    if (!version_less(v, from) && (to.empty() || !version_less(to, v))) picked.push_back(v);
  }
  std::sort(picked.begin(), picked.end(), version_less);
  return picked;
}

}  // namespace zc::props
