// RapidCheck generator of I4 cases (module_checks.h): small worlds, every stage (ZeRO-3 weighted
// up, where the ParamDict semantics live), and a model kind with a shape for it. Tree codes
// shrink toward fewer nodes and smaller params; counterexamples print with describe().
#pragma once

#include "props/module_checks.h"

#include <rapidcheck.h>

#include <ostream>

namespace zc::props {

// Found by RapidCheck through ADL when it prints a counterexample.
inline void showValue(const I4Case& c, std::ostream& os) { os << describe(c); }

// The shape vector for one model kind: tree codes (models/tree.h) of up to about 10 nodes, each
// value in [0, 3 * 16 * 8 * 8 * 8) so nodes also use external params, discovered in the getter
// or registered (Note [Tree external params]), and alias earlier nodes' params (Note [Tree
// aliases]); values shrink toward 0, dropping aliases and those uses first;
// mlp dims 1..8; synthetic param numels 1..40.
inline rc::Gen<std::vector<std::int64_t>> i4_shapes(const std::string& model) {
  using V = std::vector<std::int64_t>;
  if (model == "tree") {
    // inRange scales its range by the size: the values keep the full range (size 100), so bias
    // params, external uses and aliases are drawn; only the node count is capped at about 10.
    return rc::gen::resize(10, rc::gen::container<V>(rc::gen::resize(
                                   100, rc::gen::inRange<std::int64_t>(0, 3 * 16 * 8 * 8 * 8))));
  }
  if (model == "mlp") {
    return rc::gen::resize(4, rc::gen::container<V>(rc::gen::inRange<std::int64_t>(1, 9)));
  }
  return rc::gen::resize(6, rc::gen::container<V>(rc::gen::inRange<std::int64_t>(1, 41)));
}

// Cases with `bugs` switched on (none: the property that I4 holds on the correct engine).
inline rc::Gen<I4Case> i4_cases(BugSet bugs = {}, int min_stage = 0) {
  return rc::gen::mapcat(
      rc::gen::element<std::string>("tree", "mlp", "synthetic"),
      [bugs, min_stage](std::string model) {
        return rc::gen::build<I4Case>(
            rc::gen::set(&I4Case::world, rc::gen::inRange(1, 5)),
            rc::gen::set(
                &I4Case::stage,
                rc::gen::suchThat(rc::gen::weightedElement<int>({{1, 0}, {1, 1}, {1, 2}, {3, 3}}),
                                  [min_stage](int s) { return s >= min_stage; })),
            rc::gen::set(&I4Case::model, rc::gen::just(model)),
            rc::gen::set(&I4Case::shape, i4_shapes(model)),
            rc::gen::set(&I4Case::seed, rc::gen::arbitrary<std::uint64_t>()),
            rc::gen::set(&I4Case::bugs, rc::gen::just(bugs)));
      });
}

}  // namespace zc::props
