// `zerocheck prove`: every Z3 proof, its verdict, time and counterexample or found values; exit 0
// iff each gives the verdict it must (proved for the engine's predicates, the AutoSP
// counterexample for the B1/B2 predicates, values the simulator reproduces for the FPA searches).
#include "cli/prove.h"

#include "props/proofs.h"

#include <fmt/format.h>

namespace zc::cli {

int run_prove(unsigned timeout_ms) {
  const std::vector<props::ProofResult> results = props::run_all_proofs(timeout_ms);
  double total = 0;
  int bad = 0;
  fmt::print("| proof | verdict | expected | seconds |\n|---|---|---|---|\n");
  for (const props::ProofResult& r : results) {
    total += r.seconds;
    bad += !r.ok();
    fmt::print("| {} | {} | {} | {:.2f} |\n", r.name, r.verdict, r.expected, r.seconds);
  }
  for (const props::ProofResult& r : results) {
    if (!r.detail.empty()) fmt::print("\n{}: {}\n", r.name, r.detail);
  }
  fmt::print("\n{} proofs in {:.1f} s; {} as expected, {} not\n", results.size(), total,
             static_cast<int>(results.size()) - bad, bad);
  return bad == 0 ? 0 : 1;
}

}  // namespace zc::cli
