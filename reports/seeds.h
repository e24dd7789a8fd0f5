// The report of `zerocheck verify --against deepspeed==X.Y.Z | deepspeed@DIR` (the seeds'
// invariants on that DeepSpeed alone): deepspeed-seeds.md, deepspeed-seeds.html and junit.xml
// beside the run's deepspeed-seeds.json.
#pragma once

#include "props/deepspeed_seeds.h"

#include <filesystem>
#include <string>
#include <vector>

namespace zc::reports {

struct SeedCounts {
  int holds = 0, fails = 0, not_applicable = 0, not_runnable = 0;
  // The run passes when nothing fails and everything ran (not applicable is not a failure).
  bool passed() const { return fails == 0 && not_runnable == 0; }
  std::string line() const;  // "3 hold, 1 fail, 1 not applicable, 0 not runnable"
};
SeedCounts count_seeds(const std::vector<props::SeedResult>& rs);

std::string seeds_markdown(const std::string& target, const std::vector<props::SeedResult>& rs);
std::string seeds_html(const std::string& target, const std::vector<props::SeedResult>& rs);
std::string seeds_junit(const std::string& target, const std::vector<props::SeedResult>& rs);
// Writes the three files into `out` (which must exist); UsageError naming a file that cannot be written.
void write_seed_reports(const std::string& target, const std::vector<props::SeedResult>& rs,
                        const std::filesystem::path& out);

}  // namespace zc::reports
