// The verifier's invariants: named predicates over a scenario's runs, each with the generator of
// the scenarios it applies to and a one-paragraph explanation. Names start with their SPEC id
// where they have one (I1-I4). check() is a pure function of (scenario, bugs): it reruns exactly,
// so a saved counterexample replays to the same verdict and trace hash.
#pragma once

#include "props/scenario.h"

#include <rapidcheck.h>

#include <functional>
#include <string>
#include <vector>

namespace zc::props {

struct Verdict {
  bool applies = true;  // false: the scenario is outside the invariant's domain (discarded)
  bool holds = true;
  std::string failure;  // the first diverging value (rank, step, tensor, index, both values and bits) or the error
  std::uint64_t trace_hash = 0;  // of every simulated run the check made, in order
};

struct CheckContext {
  BugSet bugs;
  RunHooks hooks;
};

struct Invariant {
  std::string name;
  std::string explanation;
  std::function<rc::Gen<Scenario>()> gen;
  std::function<Verdict(const Scenario&, const CheckContext&)> check;
};

// Every invariant, in report order.
const std::vector<Invariant>& invariants();

// A hazard: a property a user relies on that DeepSpeed's own semantics break, so the engine (which
// computes what DeepSpeed computes) must FAIL it. verify hunts each like a known bug that is always
// on: caught means the counterexample was found, shrunk and saved; a hazard that stops failing
// means the engine no longer models DeepSpeed there.
struct Hazard {
  std::string code;     // "H1"
  std::string summary;  // one line for the report's table
  Invariant property;   // the user's expectation
};
const std::vector<Hazard>& hazards();

// nullptr when no invariant or hazard property has that name.
const Invariant* find_invariant(std::string_view name);

// The first element where a and b differ, named: "rank 0, step 1, grads fc.weight[3]: 0.5 (0x3f000000) vs ...".
// "" when bit-identical.
std::string first_divergence(const Scenario& s, int rank, int step, const std::string& what,
                             const std::vector<double>& a, const std::vector<double>& b);

}  // namespace zc::props
