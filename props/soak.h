// `zerocheck verify --budget DURATION`: a soak run. It keeps drawing fresh seeds until the budget
// (the caller's clock) is spent: round r runs every invariant on `cases_per_item` new cases from
// seed_r, checks every k-th case twice (same verdict and trace hash, or a determinism mismatch),
// and counts cases, distinct scenarios, mismatches, failures and the slowest case. Items are
// indexed like the verify job's (round r, invariant k), so they spread over MPI ranks the same way.
#pragma once

#include "props/stopwatch.h"
#include "props/verify.h"
#include "props/work_items.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace zc::props {

struct SoakOptions {
  std::uint64_t seed = 20261129;
  std::filesystem::path out = "reports/soak";
  int jobs = 1;
  int cases_per_item = 200;
  int rerun_every = 10;  // every k-th case is checked twice
  std::vector<std::string> only;  // invariants; empty = all
  // > 0: each round also runs the DeepSpeed comparison on this many fresh scenarios, counted
  // (count_conformance), in a child with its own worker pools (--against deepspeed). With
  // `only` = {"deepspeed"} the soak runs the comparison alone.
  int deepspeed_cases_per_item = 0;
  RunHooks hooks;
  // The budget, read by the caller (cli/): false once it is spent. No item starts after that; the
  // ones running finish and count.
  std::function<bool()> keep_going;
};

struct SoakSlowest {
  double seconds = 0;
  std::string invariant;
  std::uint64_t seed = 0;  // the round's seed
  int index = 0;           // the case index in that round (Note [Indexed cases])
  nlohmann::json scenario;
  bool holds = true;       // its verdict and trace hash, for `zerocheck replay out/slowest.json`
  std::uint64_t trace_hash = 0;
};

struct SoakReport {
  std::int64_t cases = 0;
  std::int64_t discarded = 0;
  std::int64_t distinct = 0;  // distinct scenarios (by the hash of their JSON)
  std::int64_t reruns = 0;
  std::int64_t mismatches = 0;  // reruns that disagreed, plus the determinism invariant's failures
  std::vector<std::string> mismatch_details;
  std::vector<std::string> failures;  // "invariant: failure (saved: file)"
  std::int64_t items = 0;
  std::int64_t rounds = 0;
  std::int64_t item_errors = 0;
  SoakSlowest slowest;
  // The DeepSpeed comparison's counts over every round (merge_conformance_counts), or null.
  nlohmann::json reference;
  double seconds = 0;
  int ranks = 1;
  int jobs = 1;
  bool passed() const {
    return mismatches == 0 && failures.empty() && item_errors == 0 &&
           (reference.is_null() || (reference.value("unlisted", 0) == 0 && reference.value("errors", 0) == 0));
  }
};
nlohmann::json to_json(const SoakReport& r);

class SoakJob {
 public:
  explicit SoakJob(const SoakOptions& opts);  // ConfigError on an unknown invariant
  SoakJob(const SoakJob&) = delete;
  SoakJob& operator=(const SoakJob&) = delete;

  nlohmann::json run(std::size_t item) const;  // in a child process
  std::uint64_t fingerprint() const;
  // Adds a finished item's result (the merging process).
  void add(std::size_t item, const nlohmann::json& result);
  SoakReport report(double seconds, int ranks) const;
  std::string name(std::size_t item) const;

 private:
  // Items per round: the DeepSpeed comparison first (so that a short budget runs it too), then the
  // engine's invariants. nullptr: item is the comparison's.
  std::size_t kinds() const { return invs_.size() + (deepspeed_ ? 1 : 0); }
  const Invariant* invariant_of(std::size_t item) const {
    const std::size_t k = item % kinds();
    if (deepspeed_) return k == 0 ? nullptr : invs_[k - 1];
    return invs_[k];
  }
  nlohmann::json run_deepspeed(std::uint64_t seed) const;
  void add_deepspeed(std::size_t item, const nlohmann::json& res);

  SoakOptions opts_;
  std::vector<const Invariant*> invs_;
  bool deepspeed_ = false;  // each round's first item is the DeepSpeed comparison
  std::set<std::uint64_t> scenarios_;
  SoakReport totals_;
};

// soak.json, and the slowest case as slowest.json (a counterexample file `zerocheck replay` reruns).
void write_soak(const SoakReport& r, const std::filesystem::path& out);

// The soak as a Dispatch (one process or MPI's coordinator): fresh items until the budget is spent,
// each result added to `job`, `progress` told the totals over `ranks`.
Dispatch soak_dispatch(SoakJob& job, const SoakOptions& opts, const Stopwatch& watch, int ranks,
                       const std::function<void(const SoakReport&)>& progress);

// One process: --jobs children until the budget is spent. Writes soak.json under opts.out.
SoakReport run_soak(const SoakOptions& opts, const std::function<void(const SoakReport&)>& progress = {});

}  // namespace zc::props
