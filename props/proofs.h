// Z3 proofs over the engine's own decision templates (engine/decisions.h), instantiated with
// z3::expr: DeepCompile gating, ZeRO-1/2 and ZeRO-3 partition arithmetic in the Int theory, an
// int64 overflow hunt in bit-vectors, and floating-point (FPA) searches for gradients whose
// per-backward and coalesced reductions round differently, which the simulator then reproduces.
#pragma once

#include "engine/dtype.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zc::props {

struct ProofResult {
  std::string name;
  std::string verdict;   // "proved", "counterexample", "found", "none found", "unknown", "FAILED"
  std::string expected;  // the verdict this proof must give for zerocheck to pass
  double seconds = 0;
  std::string detail;    // the counterexample or found values, as a config or numbers
  bool ok() const { return verdict == expected; }
};

// One proof, run when asked: the verify job runs each in its own work item.
struct ProofTask {
  std::string name;  // short; the result's name may add the bound it proved
  std::function<ProofResult()> run;
};
std::vector<ProofTask> proof_tasks(unsigned timeout_ms);
std::vector<ProofResult> run_all_proofs(unsigned timeout_ms);  // every task, in order

// A Z3 FPA witness (the fpa-* proofs): gradients g[rank][chunk] at world 2, N 2, ZeRO-2, loss
// scale 1, whose per-backward reduction (each chunk halved, summed over the ranks, accumulated)
// and coalesced reduction (each rank's chunks summed, halved, summed over the ranks) round apart,
// with both results as Z3's model of the arithmetic gives them. std::nullopt: none found in time.
struct FpaWitness {
  DType dtype = DType::f32;
  double g[2][2] = {};
  double per_backward = 0, coalesced = 0;
};
std::optional<FpaWitness> fpa_rounding_witness(DType dtype, unsigned timeout_ms);

// The int64 overflow hunt over decide::zero12_partition_numel / partition_start for numel <=
// max_numel, world <= 65536: ("found" | "none found" | "unknown", detail).
std::pair<std::string, std::string> int64_overflow_hunt(std::int64_t max_numel, unsigned timeout_ms);

// The exact-domain lemma for one dtype: a sum of two integers with |a|, |b|, |a + b| <= max_k,
// computed as the engine does, is exact ("proved"), or Z3's counterexample.
ProofResult exact_integer_sum_lemma(DType dtype, std::int64_t max_k, unsigned timeout_ms);

}  // namespace zc::props
