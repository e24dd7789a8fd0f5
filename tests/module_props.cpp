// RapidCheck properties of invariant I4 (SPEC 7) over random module trees, MLPs and synthetic
// models at every ZeRO stage (trees with external params and aliases too): copies rebind every
// ParamDict owner, alias and external-param registration, the original stays unchanged, and
// tracing succeeds; with
// KnownBug::B5 or B6 switched on, every ZeRO-3 case fails it. On failure the seed and a replay command are printed (prop_main.cpp).
#include "models/tree.h"
#include "props/module_checks_gen.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

namespace zc::props {
namespace {

// How many nodes of a tree case read a param another node owns (0 for the other model kinds).
std::size_t external_uses(const I4Case& c) {
  return c.model == "tree" ? TreeModel(c.shape).external_uses().size() : 0;
}

// Whether a tree case has an alias (Note [Tree aliases]).
bool has_aliases(const I4Case& c) {
  return c.model == "tree" && TreeModel(c.shape).num_aliases() > 0;
}

RC_GTEST_PROP(ModuleProps, I4HoldsOverRandomModuleTrees, ()) {
  const I4Case c = *i4_cases();
  RC_TAG(c.model, c.stage, external_uses(c) > 0 ? "external params" : "",
         has_aliases(c) ? "aliases" : "");
  const std::string v = i4_violation(c);
  if (!v.empty()) RC_FAIL(describe(c) + ": " + v);
}

RC_GTEST_PROP(ModuleProps, KnownBugsB5AndB6BreakI4OnEveryZero3Model, ()) {
  const KnownBug bug =
      *rc::gen::element(KnownBug::B5_copy_drops_owner, KnownBug::B6_fake_param_status);
  const I4Case c = *i4_cases(BugSet{bug}, 3);
  RC_TAG(known_bug_info(bug).code, external_uses(c) > 0 ? "external params" : "",
         has_aliases(c) ? "aliases" : "");
  RC_ASSERT(i4_violation(c) != "");
}

}  // namespace
}  // namespace zc::props
