// The simulator's internals: groups, rendezvous by (group, sequence number), per-rank state and the
// seeded scheduler. Invariants: a rank is in `runnable_` iff it is started, unfinished and not
// blocked; a rendezvous is computed exactly once, when its last member arrives; an output buffer
// is written exactly once, at completion; a Work is in its rank's `inflight` until waited.
#pragma once

#include "engine/host_device.h"
#include "sim/sim_cluster.h"
#include "sim/sim_comm.h"
#include "sim/sim_device.h"

#include <boost/context/fiber.hpp>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace zc::sim {

// Throws UsageError naming the first fault that cannot apply to a world of this size.
void check_faults(const std::vector<Fault>& faults, int world_size);
// Throws UsageError when SimOptions::simulated_ranks cannot apply (Note [Representative ranks]).
void check_representative(const SimOptions& options, int world_size);

class SimWork;
class SimComm;
class SimDevice;
struct Group;

// A byte buffer whose elements are not zeroed when it grows (every byte is written before it is
// read: snapshots by memcpy, results by the reduction), so a collective pays for its copies only.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(p)) U;  // default-initialisation: no zeroing
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
};
using Bytes = std::vector<std::byte, UninitAllocator<std::byte>>;

// What one rank asked for; all members of a rendezvous must agree on it.
struct CallSig {
  CollectiveKind kind = CollectiveKind::barrier;
  DType dtype = DType::f32;
  std::int64_t in_numel = 0;
  std::int64_t out_numel = 0;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  bool meta = false;  // shapes only (Note [Meta mode]): checked and timed, no data moved
  bool operator==(const CallSig&) const = default;
  std::string str() const;  // "all_reduce(16 -> 16 x f32, sum)", ", meta" before the ")"
  std::int64_t bytes() const { return std::max(in_numel, out_numel) * dtype_size(dtype); }

 private:
  std::string describe_call() const;
};

// One rank's part in a rendezvous. At thousands of ranks a collective touches each member once
// at issue, once when computed and once at completion, and every line is cold: what those touch
// is the first cache line, which the scheduler prefetches as it resumes a rank blocked on it
// (Note [Prefetch on resume]); snapshots and split() use the second.
// Its call is the rendezvous's first_sig (a member whose call differs ends the run at issue).
struct alignas(64) Member {
  bool arrived = false;
  // The last member to arrive is computed at its issue, so its input is read in place (no
  // snapshot): this points at it until compute() returns.
  const std::byte* live_input = nullptr;
  SimWork* work = nullptr;        // alive in its rank's inflight list until waited
  // Computed when the last member arrives; shared between members that get the same bytes.
  std::shared_ptr<const Bytes> result;
  std::uint64_t result_hash = 0;  // hash_data of result, taken once per distinct result
  double issue_us = 0.0;
  int split_color = kNoColor;     // split only
  int split_key = 0;
  // ---- line 1
  Bytes input;                    // snapshot (Note [Inputs read at issue])
  Group* split_group = nullptr;  // split only: the member's new group
  int split_rank = -1;
};
static_assert(sizeof(Member) == 128, "Member: one hot line and one cold (Note [Prefetch on resume])");

struct Rendezvous {
  Group* group = nullptr;  // owned by ClusterState::groups_ (no cycle through Group::open)
  std::int64_t seq = 0;
  std::vector<Member> members;  // by slot (Group::members)
  int arrived = 0;
  CallSig first_sig;  // the first arrival's call: every later one must equal it
  bool computed = false;
  // Note [Stream order] (sim/rendezvous.cpp): timed once every member issued it and is at the
  // front of its stream; members whose stream's front it is.
  bool scheduled = false;
  int stream_fronts = 0;
  double done_us = 0.0;
  std::vector<int> waiting;  // global ranks blocked in wait() on it (until scheduled)
  std::string where() const;  // "group world seq 3"
  // The trace lines of its issue and completion, formatted once for every member: each member's
  // call equals first_sig, so the lines are the same (Note [One trace line per rendezvous]).
  std::shared_ptr<const TraceLine> issue_line, done_line;
};

// Schedule::decoupled (Note [Decoupled schedule]): a group's collective at one seq, fixed by the
// first rank to issue it, and what the replay of the clocks keeps about it.
struct DecoupledCall {
  CallSig sig;
  int first_rank = 0;
  std::shared_ptr<const TraceLine> issue_line, done_line;  // as Note [One trace line per rendezvous]
  // The replay: members issued so far, their latest issue time, and when it completes.
  std::int64_t replay_issued = 0;
  double replay_issue_us = 0.0;
  bool replay_computed = false;  // timed (Note [Stream order])
  int replay_fronts = 0;         // members whose stream's front it is
  double replay_done_us = 0.0;
  std::vector<int> replay_waiting;  // rank slots blocked on it
  // split(): the nth on its group, and each member slot's declared arguments, subgroup and rank.
  int split_nth = -1;
  std::vector<SplitArgs> split_args;
  std::vector<Group*> split_groups;
  std::vector<int> split_ranks;
};

// One entry of a rank's record under Schedule::decoupled: what happened, on which collective, and
// the compute time charged since the previous entry.
struct ClockEvent {
  enum Kind : std::uint8_t { issue, wait, sample };
  double compute_us = 0.0;
  std::uint32_t seq = 0;
  std::uint16_t group = 0;
  Kind kind = issue;
};

struct Group {
  std::uint64_t id = 0;
  std::string name;
  std::vector<int> members;  // the simulated members' global ranks, by slot (= group rank in a
                             // full run; Note [Representative ranks])
  int size = 0;              // ranks in the group, simulated or not
  int first_rank = 0, last_rank = 0;  // the lowest and highest global rank of the whole group
  std::map<std::int64_t, std::shared_ptr<Rendezvous>> open;  // by seq, until computed
  std::vector<DecoupledCall> calls;  // by seq, Schedule::decoupled only
  int decoupled_splits = 0;          // split() calls among them
};

// The most stack the scheduler prefetches as it resumes a rank (Note [Prefetch on resume] in
// sim/cluster_state.cpp).
inline constexpr std::uintptr_t kMaxPrefetchedStack = 4096;

// Laid out hot first: what the scheduler and a collective touch on every switch shares the first
// four cache lines (at thousands of ranks every switch finds the rank's state cold), and the
// scheduler prefetches lines 1 to 3 before it resumes the rank (Note [Prefetch on resume] in
// sim/cluster_state.cpp).
struct alignas(64) RankState {
  // ---- line 0: read by the scheduler first
  int rank = 0;
  bool finished = false;
  bool blocked = false;
  // Inflight collectives whose input is still read in place (Note [Inputs read at issue]).
  int live_inputs = 0;
  // The stack a resume touches (Note [Prefetch on resume]): issue() marks its caller's frame,
  // and yield() keeps the span from its own frame up to the mark and marks its frame.
  std::uint32_t stack_span = 0;
  std::uintptr_t stack_mark = 0;
  boost::context::fiber fiber;  // resumes the rank
  boost::context::fiber sink;   // resumes the scheduler
  std::int64_t device_ops_since_yield = 0;
  // The Work it waits on in wait() and its member slot (the Work keeps the rendezvous alive);
  // the call is described only for an error. The slot is the Work's, kept here so that the
  // prefetch needs no load through the cold Work (Note [Prefetch on resume]).
  SimWork* blocked_work = nullptr;
  const Member* blocked_slot = nullptr;
  // ---- line 1
  std::vector<std::shared_ptr<SimWork>> inflight;  // issued, not yet waited
  // The simulated clock and its split (zerocheck plan): compute charged, collective time on
  // this rank's communication stream (collectives run one after another on it, as NCCL's do),
  // and time spent blocked in wait() past the rank's own clock (exposed communication).
  RankTiming timing;
  double comm_free_us = 0.0;  // when the rank's communication stream is next free
  // Note [Stream order]: issued, not yet timed, in issue order (interleaved schedule).
  std::deque<std::shared_ptr<Rendezvous>> stream;
  // ---- line 2
  Trace trace;
  std::int64_t collectives = 0;  // issued so far, every group: Fault::at counts these
  // ---- line 3
  const RankContext* context = nullptr;  // the rank function's, at the top of its stack
  const SimComm* last_comm = nullptr;    // its last collective's: likely its next's
  double slowdown = 1.0;         // FaultKind::slow_rank
  std::exception_ptr error;
  std::unique_ptr<Device> inner;  // HostDevice, or MetaDevice with SimOptions::meta
  std::unique_ptr<Device> cpu;    // the CPU side of offload (RankContext::cpu), same kind
  std::unique_ptr<SimDevice> device;
  std::unique_ptr<SimComm> world;
  std::map<const Group*, std::int64_t> swapped_seq;  // FaultKind::reorder: the seq the next call takes
  std::vector<RankTiming> samples;  // RankContext::sample_clock()
  std::vector<NcclCalls> nccl_calls;  // CostModel::nccl: NCCL's choices, counted at issue
  std::vector<std::vector<NcclCalls>> nccl_samples;  // nccl_calls at each sample_clock()
  // Schedule::decoupled: the rank's record, the compute charged since its last entry, and the
  // exact compute_us at each sample (the replay gives the rest of each sample).
  std::vector<ClockEvent> clock_log;
  double since_event_us = 0.0;
  std::vector<double> sample_compute_us;
  explicit RankState(std::size_t max_events) : trace(max_events) {}
};

class ClusterState {
 public:
  ClusterState(int world_size, std::uint64_t seed, const SimOptions& options);
  ~ClusterState();

  SimResult run(const std::function<void(RankContext&)>& fn);

  // ---- called from inside a rank's fiber ----
  WorkPtr issue(SimComm& comm, const CallSig& sig, const Tensor& in, const Tensor& out,
                bool async_op, int split_color = kNoColor, int split_key = 0);
  void wait(SimWork& work);  // a Work's wait(), from the rank's code
  std::unique_ptr<Comm> split_result(const SimWork& work);
  void yield(int rank);
  // Race checks for a Device op of `rank` (Note [Race detection] in sim_device.h).
  void check_read(int rank, const char* op, const Tensor& t);
  void check_write(int rank, const char* op, const Tensor& t);
  void before_device_op(int rank, const char* op);  // counts; enforces the yield limit
  void on_device_op(int rank, std::int64_t flops, std::int64_t bytes) noexcept;

  const SimOptions& options() const { return options_; }
  RankState& rank_state(int rank) {
    return *ranks_[static_cast<std::size_t>(rank_slot_[static_cast<std::size_t>(rank)])];
  }
  std::shared_ptr<Group> make_group(std::string name, std::vector<int> members);
  void sample_clock(int rank);
  void count_issued_nccl(RankState& rs, const Group& group, const CallSig& sig);

 private:
  RankContext context(RankState& rs);
  // Note [Decoupled schedule] (sim/decoupled.cpp)
  SimResult run_decoupled(const std::function<void(RankContext&)>& fn);
  void run_one(const std::function<void(RankContext&)>& fn, RankState& rs);
  int running_rank() const;  // whose code runs on this thread
  WorkPtr issue_decoupled(SimComm& comm, const CallSig& sig, const Tensor& in, const Tensor& out,
                          bool async_op, SplitArgs split);
  void declare_split(Group& group, DecoupledCall& call);
  std::vector<std::size_t> leader_wave(const std::vector<bool>& ran) const;
  void run_parallel(const std::function<void(RankContext&)>& fn, const std::vector<std::size_t>& slots,
                    bool stop_at_error);
  void wait_decoupled(SimWork& work);
  void log_event(RankState& rs, ClockEvent::Kind kind, const Group& group, std::int64_t seq);
  void check_decoupled_counts() const;
  void replay_clocks();
  // The interleaved timing rules, shared with the replay: a collective of `group` whose last
  // issue was at `issued_us` starts when every member's stream is free; a wait moves the clock.
  double schedule_on(const Group& group, const CallSig& sig, double issued_us);
  void try_schedule(Rendezvous& rv);  // Note [Stream order]
  void enqueue_stream(RankState& rs, const std::shared_ptr<Rendezvous>& rv);
  static void advance_to(RankState& rs, double done_us);
  SimResult result();

  void start_fibers(const std::function<void(RankContext&)>& fn);
  void step_once();
  // Note [Prefetch on resume] (sim/cluster_state.cpp)
  void prefetch_lines(const RankState& rs) const;
  void prefetch_pointed(const RankState& rs) const;
  int likely_next(int r) const;  // -1: none
  void block(int rank);
  void wait_issued(SimWork& work);  // wait()'s part after the checks; issue()'s blocking wait
  void make_runnable(int rank);
  // issue()'s out-of-line parts (Note [Cold paths out of line] in sim/rendezvous.cpp).
  bool issue_faulty(RankState& rs, SimComm& comm, const CallSig& sig, std::int64_t index,
                    std::int64_t& seq, const Fault*& corrupting);
  void compute(Rendezvous& rv);
  void snapshot_live_inputs(RankState& rs);  // Note [Inputs read at issue]
  void compute_split(Rendezvous& rv);
  void schedule(Rendezvous& rv);
  void hash_results(Rendezvous& rv);
  void complete(SimWork& work);
  void drop_ready(SimWork& work);
  void remove_runnable(int rank);
  void destroy_fibers() noexcept;
  void drain(RankState& rs);
  const Fault* fault_at(int rank, std::int64_t index) const;
  void corrupt(const Fault& f, Member& m, const CallSig& sig, RankState& rs);
  // `slot` called `sig`, which differs from rv.first_sig.
  [[noreturn]] void throw_mismatch(const Rendezvous& rv, int slot, const CallSig& sig) const;
  [[noreturn]] void throw_deadlock() const;
  [[noreturn]] void abort_with(int rank);
  std::string describe_rank(int rank) const;

  int world_size_;
  std::uint64_t seed_;
  SimOptions options_;
  Rng sched_rng_;
  std::vector<std::unique_ptr<RankState>> ranks_;  // the simulated ranks, ascending
  std::vector<int> rank_slot_;  // global rank -> index in ranks_, -1 when not simulated
  std::vector<int> runnable_;
  std::vector<int> runnable_pos_;  // index in runnable_, or -1
  // Computed, not yet completed; each is owned by its rank's inflight list until completed and waited.
  std::vector<SimWork*> ready_;
  bool parallel_wave_ = false;  // Schedule::decoupled: several group leaders run at once
  std::vector<std::shared_ptr<Group>> groups_;
  std::uint64_t schedule_hash_ = 0;
  std::int64_t steps_ = 0;
  int finished_ = 0;
  int current_ = -1;
  bool tearing_down_ = false;  // fibers never started must not run user code when destroyed
  bool decoupled_ = false;     // Note [Decoupled schedule]
  bool calls_fixed_ = false;   // decoupled: the first rank has run; groups' calls are read-only
  bool prefetch_ = false;      // Note [Prefetch on resume]: enough ranks that their state is cold
};

class SimWork final : public Work, public std::enable_shared_from_this<SimWork> {
 public:
  SimWork(ClusterState& cluster, int rank, int member, std::shared_ptr<Rendezvous> rv,
          Tensor in, Tensor out, std::uint64_t issue_index)
      : cluster_(cluster), rank_(rank), member_(member), rv_(std::move(rv)),
        issue_index_(issue_index), out_(std::move(out)), in_(std::move(in)) {}
  void wait() override { cluster_.wait(*this); }
  bool is_completed() const override { return completed_; }
  const Rendezvous& rendezvous() const { return *rv_; }

 private:
  friend class ClusterState;
  // What completing and waiting read first, the input (read at a snapshot only) last.
  ClusterState& cluster_;
  int rank_;
  int member_;
  bool completed_ = false;
  bool waited_ = false;
  int ready_pos_ = -1;
  std::shared_ptr<Rendezvous> rv_;
  std::uint64_t issue_index_;  // the rank's trace index of the issue event
  Tensor out_;
  Tensor in_;
};

}  // namespace zc::sim
