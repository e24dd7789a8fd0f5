// RapidCheck properties: every invariant of the verify job (props/invariants.h) over its own
// scenario generator, on the correct engine, as one RC_GTEST_PROP each. The verify job runs the
// same predicates with more cases; here RapidCheck's default 100 cases keep ctest short. On
// failure the seed and a replay command are printed (prop_main.cpp), and RapidCheck prints the
// shrunk scenario.
#include "props/invariants.h"
#include "real/deepcompile_loader.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

namespace zc::props {
namespace {

void holds(const std::string& name) {
  const Invariant* inv = find_invariant(name);
  RC_ASSERT(inv != nullptr);
  const Scenario s = *inv->gen();
  CheckContext ctx;
  ctx.hooks.make_loader = real::plugin_loaders();
  const Verdict v = inv->check(s, ctx);
  RC_PRE(v.applies);
  RC_TAG(s.world > 1 ? "multi-rank" : "one rank");
  if (!v.holds) RC_FAIL(v.failure + "\n  scenario: " + to_json(s).dump());
}

RC_GTEST_PROP(Invariants, I1CoalescedBitExact, ()) { holds("I1-coalesced-bit-exact"); }
RC_GTEST_PROP(Invariants, I1CoalescedUlpBound, ()) { holds("I1-coalesced-ulp-bound"); }
RC_GTEST_PROP(Invariants, I2MicroStepZeroAtFlush, ()) { holds("I2-micro-step-zero-at-flush"); }
RC_GTEST_PROP(Invariants, I3NoRuntimeForParallelPasses, ()) { holds("I3-no-deepcompile-runtime-for-parallel-passes"); }
RC_GTEST_PROP(Invariants, ShardedParity, ()) { holds("sharded-parity"); }
RC_GTEST_PROP(Invariants, CrossRankConsistency, ()) { holds("cross-rank-consistency"); }
RC_GTEST_PROP(Invariants, OneReductionPassPerCoalescedStep, ()) { holds("one-reduction-pass-per-coalesced-step"); }
RC_GTEST_PROP(Invariants, Determinism, ()) { holds("determinism-same-trace-hash"); }
RC_GTEST_PROP(Invariants, ScheduleIndependence, ()) { holds("schedule-independence"); }
RC_GTEST_PROP(Invariants, FailureModesClearErrors, ()) { holds("failure-modes-clear-errors"); }
RC_GTEST_PROP(Invariants, EngineLifecycleStateMachine, ()) { holds("engine-lifecycle-state-machine"); }
RC_GTEST_PROP(Invariants, MetaMemoryEqualsHost, ()) { holds("meta-memory-equals-host"); }

}  // namespace
}  // namespace zc::props
