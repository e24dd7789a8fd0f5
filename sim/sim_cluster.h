// SimCluster: many ranks in one process, each on its own Boost.Context fiber, under a
// single-threaded scheduler that picks the next runnable rank with a seeded RNG (FoundationDB's
// model): one seed, one interleaving, one result. It never hangs: mismatched collectives,
// deadlocks, data races, crashed ranks and passed limits all end the run with a named error.
#pragma once

#include "engine/comm.h"
#include "engine/device.h"
#include "engine/errors.h"
#include "engine/rng.h"
#include "engine/trace.h"
#include "sim/cost_model.h"
#include "sim/reduction.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zc::sim {

// The largest world a run may name (with representative ranks; max_ranks bounds the fibers).
inline constexpr int kMaxWorld = 1 << 22;

// Limits on everything (STYLE.md 11). Passing one is a LimitExceeded naming it.
struct SimLimits {
  int max_ranks = 8192;
  int max_inflight_per_rank = 1024;        // async Work issued and not yet waited
  std::int64_t max_scheduler_steps = 100'000'000;
  std::int64_t max_device_ops_between_yields = 50'000'000;  // a rank that never communicates
  int max_groups = 65536;
  std::size_t max_trace_events_kept = 1 << 16;  // per rank; the hash covers all of them
};

// Note [Injected faults]
// SimOptions::faults breaks one rank on purpose, deterministically. `at` counts the rank's
// collectives from 0 over every group (barrier and split included), in issue order.
//   slow_rank  its compute is charged `slowdown` times the cost model's time (simulated time only:
//              no result may change);
//   crash      it throws InjectedCrash instead of issuing collective `at` (the run ends with
//              RankFailure naming it);
//   bit_flip   bit `bit` (mod the dtype's width) of element `element` (mod the count) of the
//              input it contributes to collective `at` is flipped (a corrupted gradient on the wire);
//   nan        that element is NaN instead;
//   drop       collective `at` is never issued: its Work is returned completed and its buffers
//              are untouched; the rank's later collectives meet its peers' earlier ones;
//   reorder    collectives `at` and the next one on the same group swap sequence numbers (the rank
//              issues them in the other order than its peers).
// A drop or reorder ends in CollectiveMismatch or Deadlock when the calls differ, and silently
// swaps data when they are alike (only the numbers can tell). Splits cannot be dropped, reordered
// or corrupted (UsageError).
enum class FaultKind : std::uint8_t { slow_rank, crash, bit_flip, nan, drop, reorder };
std::string_view fault_kind_name(FaultKind k);

struct Fault {
  FaultKind kind = FaultKind::slow_rank;
  int rank = 0;
  std::int64_t at = 0;
  double slowdown = 4.0;
  std::int64_t element = 0;
  int bit = 0;
  std::string str() const;  // "bit_flip on rank 2 at collective #5 (element 3, bit 30)"
};

// A rank crashed on purpose (FaultKind::crash).
class InjectedCrash : public ZcError {
  using ZcError::ZcError;
};

// Note [Decoupled schedule]: how ranks take turns. interleaved: the seeded scheduler, a switch at
// every collective. decoupled: meta mode only, each rank runs to its end in turn, and the clocks
// are solved afterwards from each rank's record of its collectives.
enum class Schedule : std::uint8_t { interleaved, decoupled };
std::string_view schedule_name(Schedule s);

// What a member gives split(): Comm::split(color, key).
struct SplitArgs {
  int color = kNoColor;
  int key = 0;
  bool operator==(const SplitArgs&) const = default;
};
// The split() calls of a run, declared up front for the decoupled schedule (Note [Decoupled
// schedule]): the arguments the member at `parent_rank` of group `parent` gives to its `nth`
// split() on that group (0 for the first).
using DeclaredSplit = std::function<SplitArgs(const std::string& parent, int nth, int parent_rank)>;

struct SimOptions {
  // Meta mode (Note [Meta mode] in engine/model.h): every rank's device is a MetaDevice and its CPU
  // side too; collectives meet, check, count and take simulated time, and move no data.
  bool meta = false;
  ReductionOrder order = ReductionOrder::linear;
  // At each scheduler step, the chance that one ready async collective completes early (its
  // output is written) rather than at its wait(). Seeded, so still deterministic.
  double early_completion_chance = 0.25;
  std::size_t fiber_stack_bytes = 256 * 1024;
  SimLimits limits;
  CostModel cost;
  std::vector<Fault> faults;  // Note [Injected faults]
  // Note [Representative ranks]: simulate only these ranks of the world (sorted, distinct; empty:
  // every rank). Needs meta mode.
  std::vector<int> simulated_ranks;
  Schedule schedule = Schedule::interleaved;  // Note [Decoupled schedule]
  // Schedule::decoupled: split() takes its subgroups from this declaration, and each rank's own
  // call is checked against it; unset, split() is refused under the decoupled schedule.
  DeclaredSplit declared_split;
  // Schedule::decoupled: threads the ranks after the first run on (the rank function must then be
  // safe to run for different ranks at once); the results do not depend on it.
  int threads = 1;
  // Note [Prefetch on resume] (sim/cluster_state.cpp): the fewest simulated ranks for which the
  // interleaved scheduler prefetches a rank's state before it resumes it. Speed only: schedules,
  // traces and results do not depend on it. SchedulerCost: 4-7 % slower with it at 64 ranks,
  // break-even at 256, 0.81-0.94x at 1,024, 0.65-0.82x at 4,096.
  int prefetch_from_ranks = 256;
};

// Note [Decoupled schedule]
// In meta mode no collective moves data, so what one rank computes never depends on another:
// only its clock does (a collective completes when the last member issues it and its members'
// communication streams are free). Schedule::decoupled uses that: the first simulated rank runs
// to its end, then the others, each to its end, on SimOptions::threads threads (no fibers, no
// switch at every collective, one rank's state hot in cache; a rank's results do not depend on
// the threads), every collective returns a Work that wait() completes at once, and each
// rank keeps a record of its issues, waits and clock samples with the compute time charged
// between them. After the last rank, the record is replayed with the interleaved scheduler's own
// timing rules (ClusterState::schedule_on and advance_to: a collective starts when every member
// has issued it and every member's stream is free, and a wait moves the clock to its completion),
// so each rank's clock is what the interleaved run gives it. What is checked where:
//   - agreement: the first rank fixes every call, and a later rank with another call is a
//     CollectiveMismatch naming both ranks and calls;
//   - a rank that issues a collective the first rank did not, or fewer than it, is a Deadlock
//     naming the collective and who issued it (found when the rank runs or after the last one,
//     not while it waits); with several failing ranks, the lowest one's error is raised;
//   - races: each rank's Work stays in its inflight list until waited, so the race detector is
//     the interleaved one;
//   - the trace: each rank records the same issue and done lines in the same order, so the trace
//     hashes equal the interleaved run's.
// Exact: memory, collectives, the trace hash, compute_us and comm_us (the same sums in the same
// order). now_us and wait_us add each segment's compute as one sum instead of op by op, so they
// may differ from the interleaved clock in the last bits (a relative 1e-12 for a 20,000-op step;
// tests/sim_decoupled_test.cpp bounds it at 1e-9). split(): a rank needs its subgroup before the
// ranks after it have named their colors, so the run declares its splits up front
// (SimOptions::declared_split); the first rank to reach a split builds every subgroup from the
// declaration, in the interleaved run's order (so group ids, names and trace hashes equal its),
// and every rank's own (color, key) must equal its declared one, else a CollectiveMismatch naming
// both. Refused, with the reason: data (meta mode only), faults (they need the interleaving), and
// an undeclared split(). Kept event times (TraceEvent::time_us) are the
// compute-only clock of the run, not the replayed one.

// Note [Representative ranks]
// Data-parallel ranks do the same work on their own partition, so a meta run can simulate a few
// of them for all: with SimOptions::simulated_ranks, fibers exist only for those ranks; the world
// group still has world_size ranks (rank(), size(), the cost model's ring), and a collective is
// complete when every simulated member has issued it, the others being taken to issue the same
// call (SPMD). What cannot be taken for granted is refused: data (meta mode only), faults, and
// split() (a subgroup's membership depends on the ranks not simulated). The simulated ranks' own
// figures (memory, collectives, their clocks' splits) are what a full run gives them
// (tests/plan_test.cpp checks it where both run); ranks not simulated have no figures.

// The collectives of one kind that NCCL's tuning model timed with one (algorithm, protocol).
struct NcclCalls {
  CollectiveKind kind{};
  NcclAlgo algo{};
  NcclProto proto{};
  std::int64_t calls = 0, bytes = 0;
  double us = 0.0;
};

// With CostModel::nccl, a rank's collectives so far by NCCL's choice, counted as the rank issues
// them (a handful of entries, in first-use order).
void count_nccl(std::vector<NcclCalls>& calls, CollectiveKind kind, const NcclChoice& choice,
                std::int64_t bytes, double us);

// A rank's simulated clock and its split (zerocheck plan): compute charged, time its
// communication stream was busy, time blocked in wait().
struct RankTiming {
  double now_us = 0.0;
  double compute_us = 0.0;
  double comm_us = 0.0;
  double wait_us = 0.0;
};

// What a rank's function receives: its environment, handed in (TigerBeetle style).
struct RankContext {
  int rank;
  int world_size;
  Device& device;  // race-checked host device (meta device with SimOptions::meta)
  Device& cpu;     // the rank's CPU memory for offload (Options::cpu_device), same kind
  Comm& world;     // the world group
  Trace& trace;    // this rank's event trace
  Rng rng;         // this rank's stream of the root seed
  const RankTiming& timing;  // this rank's clock, read-only (provisional under Schedule::decoupled)
  // Records the rank's clock now into SimResult::clock_samples (under Schedule::decoupled, the
  // clock the replay gives this point).
  std::function<void()> sample_clock;
};

struct SimResult {
  std::uint64_t trace_hash = 0;     // per-rank trace hashes combined in rank order
  std::uint64_t schedule_hash = 0;  // the interleaving: picks and early completions
  std::int64_t scheduler_steps = 0;
  double makespan_us = 0.0;         // simulated time of the slowest rank
  std::vector<Trace> traces;        // per rank
  std::vector<double> rank_time_us;
  // Per rank: compute charged, time its communication stream was busy, and time blocked in
  // wait() (communication not hidden behind compute).
  std::vector<double> rank_compute_us, rank_comm_us, rank_wait_us;
  // Per simulated rank, the clock at each RankContext::sample_clock() call, in call order.
  std::vector<std::vector<RankTiming>> clock_samples;
  // Per simulated rank, its NCCL choices so far at each sample_clock() call (CostModel::nccl).
  std::vector<std::vector<std::vector<NcclCalls>>> nccl_samples;
};

class SimCluster {
 public:
  SimCluster(int world_size, std::uint64_t seed, SimOptions options = {});

  // Runs fn on every rank until all finish. Each call starts afresh from the seed, so two calls
  // give the same result. Throws CollectiveMismatch, Deadlock, DataRace or LimitExceeded as
  // raised, and RankFailure for any other exception from a rank.
  SimResult run(const std::function<void(RankContext&)>& fn) const;

  int world_size() const { return world_size_; }
  std::uint64_t seed() const { return seed_; }
  const SimOptions& options() const { return options_; }

 private:
  int world_size_;
  std::uint64_t seed_;
  SimOptions options_;
};

}  // namespace zc::sim
