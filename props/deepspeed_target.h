// Which DeepSpeed the reference runs (`--against`): the pinned release in the environment
// scripts/ds-env.sh makes ("deepspeed", 0.19.8), a release from the package index
// ("deepspeed==X.Y.Z") or a source tree ("deepspeed@DIR": a git checkout or an unpacked sdist).
// The last two are overlays that scripts/ds-release.sh makes on first use and caches, sharing the
// pinned environment's torch (reference/deepspeed/torch_ranges.txt).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace zc::props {

// "deepspeed" alone. UsageError for a form that is none of the three.
bool is_pinned(const std::string& target);
// Checks the form: "deepspeed", "deepspeed==X.Y.Z" or "deepspeed@DIR" (DIR made absolute).
std::string normalize_target(const std::string& target);

struct Overlay {
  std::filesystem::path dir;      // <cache>/zerocheck/ds-releases/<key>
  std::filesystem::path site;     // dir/site: that DeepSpeed alone
  std::filesystem::path ext_dir;  // its prebuilt CPU ops
  std::string made;               // the stamp's figures: when, how long, how much disk
  std::string version;            // the DeepSpeed version it holds
};

// Makes (or reuses) the overlay of a release or tree through scripts/ds-release.sh, whose progress
// goes to stderr as it runs. ConfigError with the script's one-line reason when it cannot: no such
// release, not a DeepSpeed tree, no torch in the table, cannot be imported, ops do not build.
Overlay ensure_overlay(const std::string& target, bool all_ops);

// The releases on the package index from `from` (inclusive) to `to` (inclusive; empty: the
// newest), oldest first, asked of pip in the pinned environment. ConfigError when the index cannot
// be read.
std::vector<std::string> index_releases(const std::string& from, const std::string& to);

// Version order of "X.Y.Z" strings.
bool version_less(const std::string& a, const std::string& b);

}  // namespace zc::props
