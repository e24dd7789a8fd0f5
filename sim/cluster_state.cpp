// The seeded scheduler and the rendezvous: who runs next, when collectives meet, compute and
// complete, and how a run ends (all finished, or one named error). See cluster_state.h.
//
// Note [No yield inside catch]
// Fibers share the thread's C++ exception state. A rank that issues a collective (a yield point)
// from inside a catch handler could resume with another fiber's exception on top, and a bare
// `throw;` would rethrow the wrong one. So yield() refuses inside a handler: capture the exception
// with std::current_exception(), leave the handler, communicate, then rethrow_exception.
#include "sim/cluster_state.h"

#include "engine/errors.h"
#include "sim/sim_comm.h"
#include "sim/sim_device.h"

#include <boost/context/protected_fixedsize_stack.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace zc::sim {

namespace ctx = boost::context;

std::string CallSig::str() const {
  std::string s = describe_call();
  if (meta) s.insert(s.size() - 1, ", meta");
  return s;
}

std::string CallSig::describe_call() const {
  switch (kind) {
    case CollectiveKind::barrier: return "barrier()";
    case CollectiveKind::split: return "split()";
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter:
      return fmt::format("{}({} -> {} x {}, {})", collective_name(kind), in_numel, out_numel,
                         dtype_name(dtype), reduce_op_name(op));
    case CollectiveKind::reduce:
      return fmt::format("reduce({} x {}, {}, root {})", in_numel, dtype_name(dtype),
                         reduce_op_name(op), root);
    case CollectiveKind::broadcast:
      return fmt::format("broadcast({} x {}, root {})", in_numel, dtype_name(dtype), root);
    default:
      return fmt::format("{}({} -> {} x {})", collective_name(kind), in_numel, out_numel,
                         dtype_name(dtype));
  }
}

std::string Rendezvous::where() const { return fmt::format("group {} seq {}", group->name, seq); }

ClusterState::ClusterState(int world_size, std::uint64_t seed, const SimOptions& options)
    : world_size_(world_size), seed_(seed), options_(options), sched_rng_(Rng(seed).split(0)),
      decoupled_(options.schedule == Schedule::decoupled) {
  if (world_size < 1) {
    throw UsageError(fmt::format("SimCluster: world size {} must be at least 1", world_size));
  }
  if (decoupled_ && !options.meta) {
    throw UsageError("SimOptions::schedule = decoupled needs SimOptions::meta: with data, a rank's "
                     "results depend on the other ranks' inputs (Note [Decoupled schedule])");
  }
  if (decoupled_ && !options.faults.empty()) {
    throw UsageError(fmt::format("SimOptions::schedule = decoupled with faults ({}): a fault needs the "
                                 "interleaved scheduler (Note [Decoupled schedule])",
                                 options.faults.front().str()));
  }
  const std::size_t fibers =
      options.simulated_ranks.empty() ? static_cast<std::size_t>(world_size) : options.simulated_ranks.size();
  if (fibers > static_cast<std::size_t>(options.limits.max_ranks)) {
    throw LimitExceeded(fmt::format("SimCluster: {} simulated ranks pass SimLimits::max_ranks = {}; "
                                    "simulate representative ranks (SimOptions::simulated_ranks)",
                                    fibers, options.limits.max_ranks));
  }
  if (world_size > kMaxWorld) {
    throw LimitExceeded(fmt::format("SimCluster: world size {} passes {}", world_size, kMaxWorld));
  }
  prefetch_ = !decoupled_ && fibers >= static_cast<std::size_t>(std::max(options.prefetch_from_ranks, 0));
  std::vector<int> all = options.simulated_ranks;
  if (all.empty()) {
    all.resize(static_cast<std::size_t>(world_size));
    std::iota(all.begin(), all.end(), 0);
  } else {
    check_representative(options, world_size);
  }
  std::shared_ptr<Group> world = make_group("world", all);
  world->size = world_size;
  world->first_rank = 0;
  world->last_rank = world_size - 1;
  rank_slot_.assign(static_cast<std::size_t>(world_size), -1);
  for (int r : all) {
    rank_slot_[static_cast<std::size_t>(r)] = static_cast<int>(ranks_.size());
    auto rs = std::make_unique<RankState>(options.limits.max_trace_events_kept);
    rs->rank = r;
    if (options.meta) {
      rs->inner = std::make_unique<MetaDevice>();
      rs->cpu = std::make_unique<MetaDevice>();
    } else {
      rs->inner = std::make_unique<HostDevice>();
      rs->cpu = std::make_unique<HostDevice>();
    }
    rs->device = std::make_unique<SimDevice>(*this, r, *rs->inner);
    rs->world = std::make_unique<SimComm>(*this, r, world, r,
                                          static_cast<int>(ranks_.size()));
    ranks_.push_back(std::move(rs));
  }
  runnable_pos_.assign(static_cast<std::size_t>(world_size), -1);
  for (const Fault& f : options.faults) {
    if (f.kind == FaultKind::slow_rank) rank_state(f.rank).slowdown *= f.slowdown;  // checked by SimCluster
    if (options.meta && (f.kind == FaultKind::bit_flip || f.kind == FaultKind::nan)) {
      throw UsageError(fmt::format("SimOptions::faults: {} corrupts data, and a meta run "
                                   "(SimOptions::meta) has none", f.str()));
    }
  }
}

void check_representative(const SimOptions& options, int world_size) {
  const std::vector<int>& r = options.simulated_ranks;
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (r[i] < 0 || r[i] >= world_size || (i > 0 && r[i] <= r[i - 1])) {
      throw UsageError(fmt::format("SimOptions::simulated_ranks must be distinct ranks of the world "
                                   "of {}, ascending; rank {} is not", world_size, r[i]));
    }
  }
  if (!options.meta) {
    throw UsageError("SimOptions::simulated_ranks needs SimOptions::meta: the ranks not simulated "
                     "hold no data to reduce (Note [Representative ranks])");
  }
  if (!options.faults.empty()) {
    throw UsageError("SimOptions::simulated_ranks with faults: a fault breaks the SPMD assumption "
                     "the ranks not simulated rest on (Note [Representative ranks])");
  }
}

void check_faults(const std::vector<Fault>& faults, int world_size) {
  for (const Fault& f : faults) {
    if (f.rank < 0 || f.rank >= world_size) {
      throw UsageError(fmt::format("SimOptions::faults: {} names a rank outside the world of {}", f.str(), world_size));
    }
    if (f.at < 0) throw UsageError(fmt::format("SimOptions::faults: {} has a negative collective index", f.str()));
    if (f.kind == FaultKind::slow_rank && !(f.slowdown >= 1.0)) {
      throw UsageError(fmt::format("SimOptions::faults: {} needs slowdown >= 1", f.str()));
    }
    if ((f.kind == FaultKind::bit_flip && f.bit < 0) || f.element < 0) {
      throw UsageError(fmt::format("SimOptions::faults: {} needs a non-negative element and bit", f.str()));
    }
  }
}

std::string_view schedule_name(Schedule s) {
  return s == Schedule::decoupled ? "decoupled" : "interleaved";
}

std::string_view fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::slow_rank: return "slow_rank";
    case FaultKind::crash: return "crash";
    case FaultKind::bit_flip: return "bit_flip";
    case FaultKind::nan: return "nan";
    case FaultKind::drop: return "drop";
    case FaultKind::reorder: return "reorder";
  }
  return "?";
}

std::string Fault::str() const {
  switch (kind) {
    case FaultKind::slow_rank: return fmt::format("slow_rank on rank {} (x{:g})", rank, slowdown);
    case FaultKind::bit_flip:
      return fmt::format("bit_flip on rank {} at collective #{} (element {}, bit {})", rank, at, element, bit);
    case FaultKind::nan: return fmt::format("nan on rank {} at collective #{} (element {})", rank, at, element);
    default: return fmt::format("{} on rank {} at collective #{}", fault_kind_name(kind), rank, at);
  }
}

// The fault that hits `rank`'s collective number `index` (slow ranks hit no collective).
const Fault* ClusterState::fault_at(int rank, std::int64_t index) const {
  for (const Fault& f : options_.faults) {
    if (f.kind != FaultKind::slow_rank && f.rank == rank && f.at == index) return &f;
  }
  return nullptr;
}

void ClusterState::corrupt(const Fault& f, Member& m, const CallSig& sig, RankState& rs) {
  if (m.input.empty()) return;  // nothing contributed (count 0, barrier)
  const std::int64_t esz = dtype_size(sig.dtype);
  const std::int64_t n = static_cast<std::int64_t>(m.input.size()) / esz;
  const std::int64_t e = f.element % n;
  std::byte* p = m.input.data() + e * esz;
  if (f.kind == FaultKind::nan) {
    store_from_f32(m.input.data(), sig.dtype, e, std::numeric_limits<float>::quiet_NaN());
  } else {
    const int bit = f.bit % static_cast<int>(8 * esz);
    p[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
  }
  rs.trace.record("fault", fmt::format("{}: element {} of {}", f.str(), e, sig.str()));
}

ClusterState::~ClusterState() { destroy_fibers(); }

void ClusterState::destroy_fibers() noexcept {
  tearing_down_ = true;
  // A suspended fiber's destructor unwinds its stack (forced_unwind), running the rank's RAII.
  for (auto& rs : ranks_) {
    set_current_rank(rs->rank);
    rs->fiber = ctx::fiber();
    rs->blocked_work = nullptr;  // unwound: the wait and the context are gone
    rs->blocked_slot = nullptr;
    rs->context = nullptr;
  }
  set_current_rank(-1);
}

std::shared_ptr<Group> ClusterState::make_group(std::string name, std::vector<int> members) {
  if (static_cast<int>(groups_.size()) >= options_.limits.max_groups) {
    throw LimitExceeded(fmt::format("split: more than SimLimits::max_groups = {} groups",
                                    options_.limits.max_groups));
  }
  auto g = std::make_shared<Group>();
  g->id = groups_.size();
  g->name = std::move(name);
  g->members = std::move(members);
  g->size = static_cast<int>(g->members.size());
  if (!g->members.empty()) {
    const auto [lo, hi] = std::minmax_element(g->members.begin(), g->members.end());
    g->first_rank = *lo;
    g->last_rank = *hi;
  }
  groups_.push_back(g);
  return g;
}

RankContext ClusterState::context(RankState& rs) {
  return RankContext{rs.rank, world_size_, *rs.device, *rs.cpu, *rs.world, rs.trace,
                     Rng(seed_).split(1 + static_cast<std::uint64_t>(rs.rank)), rs.timing,
                     [this, r = rs.rank] { sample_clock(r); }};
}

void ClusterState::sample_clock(int rank) {
  RankState& rs = rank_state(rank);
  if (options_.cost.nccl != nullptr) rs.nccl_samples.push_back(rs.nccl_calls);
  if (!decoupled_) {
    rs.samples.push_back(rs.timing);
    return;
  }
  log_event(rs, ClockEvent::sample, *rs.world->group(), 0);
  rs.sample_compute_us.push_back(rs.timing.compute_us);
}

void ClusterState::start_fibers(const std::function<void(RankContext&)>& fn) {
  for (auto& owned : ranks_) {
    RankState& rs = *owned;
    auto body = [this, &rs, &fn](ctx::fiber&& sink) -> ctx::fiber {
      // With ucontext fibers (sanitizer builds) destroying a fiber that never ran starts it.
      if (tearing_down_) return std::move(sink);
      rs.sink = std::move(sink);
      try {
        RankContext rc = context(rs);
        rs.context = &rc;
        fn(rc);
        drain(rs);
      } catch (const ctx::detail::forced_unwind&) {
        throw;  // the cluster is being torn down: let Boost.Context unwind this stack
      } catch (...) {
        rs.error = std::current_exception();
      }
      rs.context = nullptr;
      rs.finished = true;
      return std::move(rs.sink);
    };
    rs.fiber = ctx::fiber(std::allocator_arg,
                          ctx::protected_fixedsize_stack(options_.fiber_stack_bytes),
                          std::move(body));
    make_runnable(rs.rank);
  }
}

void ClusterState::drain(RankState& rs) {
  // A rank that returns with async work pending still completes it, as a process exit would
  // after destroy_process_group; a peer that never arrives shows up as a Deadlock.
  while (!rs.inflight.empty()) rs.inflight.front()->wait();
}

SimResult ClusterState::run(const std::function<void(RankContext&)>& fn) {
  std::exception_ptr failure;
  try {
    if (decoupled_) return run_decoupled(fn);
    start_fibers(fn);
    while (finished_ < static_cast<int>(ranks_.size())) step_once();
  } catch (...) {
    failure = std::current_exception();
  }
  destroy_fibers();  // outside any handler: see Note [No yield inside catch]
  if (failure) {
    std::uint64_t h = 0;
    for (auto& rs : ranks_) h = mix64(h, rs->trace.hash());
    h = mix64(h, schedule_hash_);
    try {
      std::rethrow_exception(failure);
    } catch (ZcError& e) {
      e.set_trace_hash(h);
      throw;
    }
  }
  return result();
}

SimResult ClusterState::result() {
  SimResult result;
  result.schedule_hash = schedule_hash_;
  result.scheduler_steps = steps_;
  for (auto& rs : ranks_) {
    result.trace_hash = mix64(result.trace_hash, rs->trace.hash());
    result.makespan_us = std::max(result.makespan_us, rs->timing.now_us);
    result.rank_time_us.push_back(rs->timing.now_us);
    result.rank_compute_us.push_back(rs->timing.compute_us);
    result.rank_comm_us.push_back(rs->timing.comm_us);
    result.rank_wait_us.push_back(rs->timing.wait_us);
    result.traces.push_back(std::move(rs->trace));
    result.clock_samples.push_back(std::move(rs->samples));
    result.nccl_samples.push_back(std::move(rs->nccl_samples));
  }
  return result;
}

void ClusterState::step_once() {
  if (++steps_ > options_.limits.max_scheduler_steps) {
    throw LimitExceeded(fmt::format(
        "scheduler passed SimLimits::max_scheduler_steps = {}; raise it if the run is just long",
        options_.limits.max_scheduler_steps));
  }
  if (!ready_.empty() && sched_rng_.chance(options_.early_completion_chance)) {
    SimWork& w = *ready_[sched_rng_.below(ready_.size())];
    schedule_hash_ = mix64(schedule_hash_, 0x8000'0000ull | static_cast<std::uint64_t>(w.rank_));
    complete(w);
  }
  if (runnable_.empty()) throw_deadlock();
  const int r = runnable_[sched_rng_.below(runnable_.size())];
  schedule_hash_ = mix64(schedule_hash_, static_cast<std::uint64_t>(r));
  RankState& rs = rank_state(r);
  // Note [Prefetch on resume]: the rank this step resumes (its lines are cached when the
  // previous step guessed it), then the one the next step will likely resume.
  if (prefetch_) {
    prefetch_lines(rs);
    prefetch_pointed(rs);
    if (const int next = likely_next(r); next >= 0) prefetch_lines(rank_state(next));
  }
  rs.device_ops_since_yield = 0;
  if (rs.live_inputs > 0) snapshot_live_inputs(rs);  // Note [Inputs read at issue]
  current_ = r;
  set_current_rank(r);
  rs.fiber = std::move(rs.fiber).resume();
  current_ = -1;
  set_current_rank(-1);
  if (rs.finished) {
    remove_runnable(r);
    ++finished_;
    if (rs.error) abort_with(r);
  }
}

// Note [Prefetch on resume]
// At thousands of ranks every switch finds the resumed rank's data cold, and a rank's step is a
// chain of misses: its stack from where it yielded up to its last collective call's caller
// (each return loads its address from a cold line, and the next return waits for it), its
// RankState, the Work and member slot it waited on, its context and communicator, its trace's
// next slot and its slot in the next rendezvous. So the scheduler prefetches them, in two
// stages because some addresses are in lines that are themselves cold:
//   - prefetch_lines: what the rank's first line gives (its stack range, its other hot lines,
//     the Work and slot it waits on), for the rank this step resumes and for the rank the next
//     step will likely resume: the next draw of the scheduler's RNG (a copy: the schedule does
//     not change) if this rank blocks, as it does at a blocking collective;
//   - prefetch_pointed: what those lines give, for the rank this step resumes, whose lines the
//     previous step prefetched when it guessed right.
// A wrong guess costs unused prefetches only (SchedulerCost at 4,096 ranks guesses all but 4 of
// 1,048,575 steps). The stack range is recorded as the rank leaves: a blocking collective's
// issue() marks its caller's frame, a wait() on an async Work its own, and yield() turns the mark
// into a span down to its own frame (RankState::stack_mark, stack_span). Off below
// SimOptions::prefetch_from_ranks ranks, where the state stays in cache; schedules and traces are
// the same either way (SimDeterminism.PrefetchOnResumeChangesNoScheduleNorTrace).

namespace {
// The stack a resume touches beyond the recorded range: below the yield's frame (the switch's
// saved registers, and the frames a collective call makes below it: allocation, the trace)
// and above the collective call's caller frame (its locals and the returned Work).
constexpr std::uintptr_t kStackBelow = 384;
constexpr std::uintptr_t kStackAbove = 128;

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Every cache line of [from, from + bytes), for writing (a prefetch never faults).
void prefetch_range(std::uintptr_t from, std::uintptr_t bytes) {
  for (std::uintptr_t line = from & ~std::uintptr_t{63}; line < from + bytes; line += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), 1, 3);
  }
}
}  // namespace

void ClusterState::prefetch_lines(const RankState& rs) const {
  if (rs.stack_span > 0) {
    prefetch_range(rs.stack_mark - kStackBelow, rs.stack_span + kStackBelow + kStackAbove);
  }
  prefetch_range(address(&rs) + 64, 3 * 64);  // lines 1 to 3
  if (rs.blocked_work != nullptr) {
    // The Work with the shared_ptr control block before it, and its slot's first line.
    prefetch_range(address(rs.blocked_work) - 16, sizeof(SimWork) + 16);
    __builtin_prefetch(rs.blocked_slot, 1, 3);
  }
}

void ClusterState::prefetch_pointed(const RankState& rs) const {
  if (rs.context != nullptr) prefetch_range(address(rs.context), sizeof(RankContext));
  if (rs.last_comm != nullptr) prefetch_range(address(rs.last_comm), sizeof(SimComm));
  if (const void* slot = rs.trace.next_slot()) __builtin_prefetch(slot, 1, 3);
  if (rs.blocked_work == nullptr) return;
  // Its slot in the group's next rendezvous, if some rank has opened it.
  const Rendezvous& rv = *rs.blocked_work->rv_;
  if (auto it = rv.group->open.find(rv.seq + 1); it != rv.group->open.end()) {
    const std::size_t slot = static_cast<std::size_t>(rs.blocked_work->member_);
    __builtin_prefetch(&it->second->members[slot], 1, 3);
  }
}

int ClusterState::likely_next(int r) const {
  const std::size_t n = runnable_.size();
  if (n < 2) return -1;
  Rng peek = sched_rng_;  // step_once's draws, in its order
  if (!ready_.empty() && peek.chance(options_.early_completion_chance)) {
    (void)peek.below(ready_.size());
  }
  // r blocks: remove_runnable moves the last runnable rank into its place.
  const std::size_t i = peek.below(n - 1);
  return static_cast<int>(i) == runnable_pos_[static_cast<std::size_t>(r)] ? runnable_.back()
                                                                           : runnable_[i];
}

void ClusterState::make_runnable(int rank) {
  RankState& rs = rank_state(rank);
  rs.blocked = false;
  int& pos = runnable_pos_[static_cast<std::size_t>(rank)];
  if (pos >= 0) return;
  pos = static_cast<int>(runnable_.size());
  runnable_.push_back(rank);
}

void ClusterState::remove_runnable(int rank) {
  int& pos = runnable_pos_[static_cast<std::size_t>(rank)];
  if (pos < 0) return;
  const int last = runnable_.back();
  runnable_[static_cast<std::size_t>(pos)] = last;
  runnable_pos_[static_cast<std::size_t>(last)] = pos;
  runnable_.pop_back();
  pos = -1;
}

void ClusterState::before_device_op(int rank, const char* op) {
  RankState& rs = rank_state(rank);
  if (++rs.device_ops_since_yield > options_.limits.max_device_ops_between_yields) {
    throw LimitExceeded(fmt::format(
        "rank {}: {} device ops ({} last) without a collective passes "
        "SimLimits::max_device_ops_between_yields; is the rank looping forever?",
        rank, rs.device_ops_since_yield, op));
  }
}

void ClusterState::on_device_op(int rank, std::int64_t flops, std::int64_t bytes) noexcept {
  RankState& rs = rank_state(rank);
  const double t = options_.cost.compute_us(flops, bytes) * rs.slowdown;
  rs.timing.now_us += t;
  rs.timing.compute_us += t;
  rs.since_event_us += t;  // Schedule::decoupled's record
  rs.trace.set_time(rs.timing.now_us);
}

}  // namespace zc::sim
