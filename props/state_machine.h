// The engine-lifecycle state machine (rc::state): random sequences of engine calls on every rank
// of a small simulated cluster, against a model that predicts the engine's counters and flags
// and which calls must raise, with which error. A sequence is saved in Scenario::commands, so a
// counterexample replays without RapidCheck.
#pragma once

#include "props/invariants.h"

namespace zc::props {

// Scenarios of world 1-2, stage 0-3, with a command sequence drawn by rc::state::gen::commands.
rc::Gen<Scenario> gen_lifecycle_scenario();
// Runs s.commands on every rank; fails at the first call whose outcome or resulting state the
// model did not predict.
Verdict check_lifecycle(const Scenario& s, const CheckContext& ctx);

}  // namespace zc::props
