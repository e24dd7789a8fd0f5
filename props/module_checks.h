// Invariant I4 (SPEC 7) as a reusable predicate: every copy of a module tree (clone(), copy
// construction, serialize + deserialize) binds each ParamDict to its new module, never to null or
// to the original; the original is unchanged (owners, statuses, shards, data); and tracing the
// model (the compile front end, fake params on the meta device) succeeds, also for a ZeRO-3
// model whose params are partitioned. Caught here: KnownBug::B5 and KnownBug::B6.
#pragma once

#include "engine/known_bugs.h"
#include "engine/model.h"
#include "engine/trace.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zc::props {

struct I4Case {
  int world = 1;                     // ranks, 1..kI4MaxWorld
  int stage = 3;                     // ZeRO stage 0..3
  std::string model = "tree";        // "mlp", "synthetic" or "tree"
  // mlp: the dims [in, h..., out] (padded with 1s to two, each at least 1); synthetic: each
  // param's numel (at least 1; empty = one param of 1); tree: TreeModel's code (models/tree.h).
  std::vector<std::int64_t> shape;
  std::uint64_t seed = 1;
  BugSet bugs;
};
inline constexpr int kI4MaxWorld = 8;

// "world 2, stage 3, tree [4,7], seed 9, bugs B5"
std::string describe(const I4Case& c);
// The case's model, with every param in f32 and no data yet.
std::unique_ptr<Model> make_i4_model(const I4Case& c);

// "" when I4 holds, else one line: the rank, the copy path, the module path, the param and what
// was wrong. Trains one step of an Engine with the case's stage on the simulated cluster
// (stage3_param_persistence_threshold 0, so ZeRO-3 params end partitioned), then checks every
// rank's model. Throws UsageError for a malformed case (world, stage or model kind).
std::string i4_violation(const I4Case& c);

// The same check with the hash of its run: every rank's trace of the training step (engine
// events, collectives) and of the copies (one "module" event per copy path with its outcome and
// a hash of the original's state after it).
struct I4Outcome {
  std::string violation;
  std::uint64_t trace_hash = 0;
};
I4Outcome i4_check(const I4Case& c);

// The checks on one rank's model, which an engine may be training (not inside a forward or
// backward); tensors are read through `dev`. "" when I4 holds. Each copy path is recorded in
// `trace` when given.
std::string i4_violation_on_model(Model& model, Device& dev, Trace* trace = nullptr);

}  // namespace zc::props
