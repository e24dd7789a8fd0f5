// Collectives in the simulator: issue (meet at (group, seq), check agreement, keep the inputs),
// compute once when the last member arrives, complete (write outputs) at a seeded point or at
// wait(), and the race checks and error reports that name ranks, calls and buffers.
//
// Note [Inputs read at issue]
// A collective reads each member's input as it was when that member issued the call, whatever
// the member does later. The member's buffer is read in place until the rank runs again: the
// scheduler, before it resumes a rank, copies the inputs of that rank's collectives that are not
// computed yet (snapshot_live_inputs), and compute() reads the rest where they lie. A rank's code
// runs only when the scheduler resumes it, and a blocking call blocks in wait() without running
// again, so a blocking collective's inputs are never copied: the copy was the largest part of a
// simulated all_reduce's time. A fault that corrupts an input copies it at issue and corrupts the
// copy. Only the issuing rank writes its buffers (each rank has its own devices).
//
// Note [One trace line per rendezvous]
// Every member records "issue <call> on <group> seq <n>" and later "done ..." in its trace, and
// those lines are what the trace hash covers. Every member's call equals the first arrival's
// (a mismatch ends the run before it is recorded), so the lines are the same for all members:
// the rendezvous formats and hashes each once, and every member records (and keeps) that one
// line. Formatting and hashing per member was the scheduler's largest cost per rank (about 0.9 us
// of 1.4 at world 8). A rank blocked in wait() keeps its member slot, and its call is described
// only when an error names it.
#include "engine/errors.h"
#include "sim/cluster_state.h"
#include "sim/sim_comm.h"

#include <algorithm>
#include <cstring>
#include <tuple>

namespace zc::sim {

namespace {

std::uint64_t hash_bytes(const std::shared_ptr<const Bytes>& b) {
  if (!b) return 0;
  return hash_data(b->data(), b->size());
}


std::string blocked_call(const RankState& rs) {
  return rs.blocked_work->rendezvous().first_sig.str();
}

std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return "ConfigError";
  if (dynamic_cast<const NotImplementedError*>(&e)) return "NotImplementedError";
  if (dynamic_cast<const UsageError*>(&e)) return "UsageError";
  if (dynamic_cast<const TrainingError*>(&e)) return "TrainingError";
  if (dynamic_cast<const InternalError*>(&e)) return "InternalError";
  if (dynamic_cast<const RankFailure*>(&e)) return "RankFailure";
  if (dynamic_cast<const InjectedCrash*>(&e)) return "InjectedCrash";
  return "exception";
}

// The Work of a collective a fault dropped: complete, nothing to wait for.
class DroppedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() const override { return true; }
};

// Note [Cold paths out of line]
// At thousands of ranks every fiber switch finds the resumed rank's stack cold, and each cache
// line its frames span is a miss. So issue() and wait() keep their frames small: error messages,
// faults and the once-per-rendezvous work (opening it, formatting its trace lines) are out-of-line
// functions that take stack space only when they run.

[[noreturn, gnu::noinline, gnu::cold]] void throw_mixed_meta(int r, const CallSig& sig,
                                                           const Tensor& in, const Tensor& out) {
  throw UsageError(fmt::format("rank {}: {} mixes a meta tensor with a {} one; a collective's "
                               "buffers are all meta or none", r, sig.str(),
                               in.is_meta() ? placement_name(out.placement())
                                            : placement_name(in.placement())));
}

[[noreturn, gnu::noinline, gnu::cold]] void throw_too_many_inflight(int r, std::size_t inflight) {
  throw LimitExceeded(fmt::format(
      "rank {}: {} async collectives in flight passes SimLimits::max_inflight_per_rank; "
      "wait() on earlier Work before issuing more", r, inflight));
}

[[noreturn, gnu::noinline, gnu::cold]] void throw_foreign_wait(int owner, int caller) {
  throw UsageError(fmt::format("wait() on rank {}'s Work called from rank {}", owner, caller));
}

// The line of an event every member of `rv` records (Note [One trace line per rendezvous]).
[[gnu::noinline]] std::shared_ptr<const TraceLine> rendezvous_line(const char* what,
                                                                   const Rendezvous& rv) {
  return std::make_shared<const TraceLine>(
      "comm", fmt::format("{} {} on {}", what, rv.first_sig.str(), rv.where()));
}

// A group's rendezvous at `seq`, made by its first member to arrive.
[[gnu::noinline]] void open_rendezvous(Group& group, std::int64_t seq,
                                       std::shared_ptr<Rendezvous>& slot) {
  slot = std::make_shared<Rendezvous>();
  slot->group = &group;
  slot->seq = seq;
  slot->members.resize(group.members.size());
}

}  // namespace

// A call that a fault hits (Note [Injected faults]): a crash throws, a drop records and yields
// (returns true: the call never happens), a reorder swaps this call's sequence number with the
// next call's. Sets `seq`, and `corrupting` to a bit_flip or nan fault, which issue() applies to
// a copy of the input.
[[gnu::noinline, gnu::cold]] bool ClusterState::issue_faulty(RankState& rs, SimComm& comm,
                                                             const CallSig& sig, std::int64_t index,
                                                             std::int64_t& seq,
                                                             const Fault*& corrupting) {
  const int r = rs.rank;
  Group* group = comm.group().get();
  const Fault* fault = fault_at(r, index);
  if (fault != nullptr) {
    if (sig.kind == CollectiveKind::split && fault->kind != FaultKind::crash) {
      throw UsageError(fmt::format("{} hits a split(), which cannot be dropped, reordered or corrupted; "
                                   "choose another collective index", fault->str()));
    }
    if (fault->kind == FaultKind::crash) {
      throw InjectedCrash(fmt::format("injected fault: {} ({} on {})", fault->str(), sig.str(), group->name));
    }
    if (fault->kind == FaultKind::drop) {
      rs.trace.record("fault", fmt::format("{}: {} on {} never issued", fault->str(), sig.str(), group->name));
      yield(r);
      return true;
    }
    if (fault->kind == FaultKind::bit_flip || fault->kind == FaultKind::nan) corrupting = fault;
  }
  if (auto swapped = rs.swapped_seq.find(group); swapped != rs.swapped_seq.end()) {
    seq = swapped->second;  // the earlier call of a reordered pair took our number
    rs.swapped_seq.erase(swapped);
  } else if (fault != nullptr && fault->kind == FaultKind::reorder) {
    const std::int64_t mine = comm.next_seq();
    seq = comm.next_seq();  // the next call's number; the next call gets ours
    rs.swapped_seq[group] = mine;
    rs.trace.record("fault", fmt::format("{}: {} takes seq {} on {}", fault->str(), sig.str(), seq, group->name));
  } else {
    seq = comm.next_seq();
  }
  return false;
}

namespace {
[[noreturn, gnu::noinline, gnu::cold]] void throw_yield_in_handler(int rank) {
  throw UsageError(fmt::format(
      "rank {}: a collective or wait() was called inside a catch handler; capture the "
      "exception, leave the handler, then communicate (Note [No yield inside catch])", rank));
}
}  // namespace

void ClusterState::yield(int rank) {
  if (std::current_exception()) throw_yield_in_handler(rank);
  RankState& rs = rank_state(rank);
  // The stack a resume touches: from here up to the mark (Note [Prefetch on resume]).
  const char here = 0;
  const auto bottom = reinterpret_cast<std::uintptr_t>(&here);
  const std::uintptr_t top = rs.stack_mark;
  rs.stack_span = top > bottom && top - bottom <= kMaxPrefetchedStack
                      ? static_cast<std::uint32_t>(top - bottom) : 0;
  rs.stack_mark = bottom;
  rs.sink = std::move(rs.sink).resume();
}

void ClusterState::block(int rank) {
  RankState& rs = rank_state(rank);
  rs.blocked = true;
  remove_runnable(rank);
  yield(rank);
  ZC_ASSERT(!rs.blocked, "rank {} resumed while still blocked", rank);
}

WorkPtr ClusterState::issue(SimComm& comm, const CallSig& call, const Tensor& in,
                            const Tensor& out, bool async_op, int split_color, int split_key) {
  const int r = comm.global_rank();
  CallSig sig = call;
  sig.meta = (in.defined() && in.is_meta()) || (out.defined() && out.is_meta());
  if (sig.meta && ((in.defined() && !in.is_meta()) || (out.defined() && !out.is_meta()))) {
    throw_mixed_meta(r, sig, in, out);
  }
  RankState& rs = rank_state(r);
  // The top of the stack a resume touches: `call` lies in our caller's frame (Note [Prefetch on
  // resume] in sim/cluster_state.cpp).
  rs.stack_mark = reinterpret_cast<std::uintptr_t>(&call) + sizeof(CallSig);
  rs.last_comm = &comm;
  if (static_cast<int>(rs.inflight.size()) >= options_.limits.max_inflight_per_rank) {
    throw_too_many_inflight(r, rs.inflight.size());
  }
  const char* op = collective_name(sig.kind).data();
  if (in.defined()) check_read(r, op, in);
  if (out.defined()) check_write(r, op, out);

  if (options_.cost.nccl != nullptr) count_issued_nccl(rs, *comm.group(), sig);
  if (decoupled_) {  // Note [Decoupled schedule]
    return issue_decoupled(comm, sig, in, out, async_op, SplitArgs{split_color, split_key});
  }
  const std::int64_t index = rs.collectives++;
  std::int64_t seq = 0;
  const Fault* corrupting = nullptr;
  if (options_.faults.empty()) [[likely]] {
    seq = comm.next_seq();
  } else if (issue_faulty(rs, comm, sig, index, seq, corrupting)) {
    return std::make_shared<DroppedWork>();
  }
  // The group's open map holds the rendezvous until it is computed, and each member's Work after.
  std::shared_ptr<Rendezvous>& slot = comm.group()->open[seq];
  if (!slot) open_rendezvous(*comm.group(), seq, slot);
  Rendezvous* rv = slot.get();
  Member& m = rv->members[static_cast<std::size_t>(comm.slot())];
  ZC_ASSERT(!m.arrived, "rank {} arrived twice at {}", r, rv->where());
  m.arrived = true;
  m.issue_us = rs.timing.now_us;
  if (sig.kind == CollectiveKind::split) {  // the member's second line: split() only
    m.split_color = split_color;
    m.split_key = split_key;
  }
  if (in.defined() && in.nbytes() > 0 && !sig.meta) {  // Note [Inputs read at issue]
    if (corrupting == nullptr) {
      m.live_input = static_cast<const std::byte*>(in.raw());
      ++rs.live_inputs;  // compute() counts it off (the last member's below, before any yield)
    } else {
      m.input.resize(static_cast<std::size_t>(in.nbytes()));
      std::memcpy(m.input.data(), in.raw(), m.input.size());
    }
  }
  if (corrupting != nullptr) corrupt(*corrupting, m, sig, rs);
  if (rv->arrived++ == 0) rv->first_sig = sig;
  if (!(rv->first_sig == sig)) throw_mismatch(*rv, comm.slot(), sig);
  comm.count_op(sig.kind, sig.bytes());
  if (!rv->issue_line) rv->issue_line = rendezvous_line("issue", *rv);
  rs.trace.record(rv->issue_line);
  auto work = std::make_shared<SimWork>(*this, r, comm.slot(), slot, in, out,
                                        rs.trace.size() - 1);
  m.work = work.get();
  rs.inflight.push_back(work);
  enqueue_stream(rs, slot);
  if (rv->arrived == static_cast<int>(rv->members.size())) compute(*rv);
  // Every collective is a scheduling point: a blocking call that is not computed yet yields in
  // wait(), where it blocks until the last member arrives; any other call yields here.
  if (async_op || rv->computed) yield(r);
  if (!async_op) wait_issued(*work);  // the stack mark stays at our caller's frame
  return work;
}

void ClusterState::snapshot_live_inputs(RankState& rs) {
  for (const auto& w : rs.inflight) {
    Member& m = w->rv_->members[static_cast<std::size_t>(w->member_)];
    if (m.live_input == nullptr) continue;
    ZC_ASSERT(!w->rv_->computed, "{} kept a live input after it was computed", w->rv_->where());
    m.input.assign(m.live_input, m.live_input + w->in_.nbytes());
    m.live_input = nullptr;
    --rs.live_inputs;
  }
  ZC_ASSERT(rs.live_inputs == 0, "rank {}: {} live inputs left after the snapshot", rs.rank, rs.live_inputs);
}

void ClusterState::wait(SimWork& work) {
  if (work.waited_) return;
  if (running_rank() != work.rank_) throw_foreign_wait(work.rank_, running_rank());
  if (decoupled_) {
    wait_decoupled(work);
    return;
  }
  // A wait on an async Work: the stack a resume touches reaches our caller's frame, just above
  // this one (Note [Prefetch on resume]).
  const char frame = 0;
  rank_state(work.rank_).stack_mark = reinterpret_cast<std::uintptr_t>(&frame);
  wait_issued(work);
}

void ClusterState::wait_issued(SimWork& work) {
  RankState& rs = rank_state(work.rank_);
  Rendezvous& rv = *work.rv_;
  const Member& m = rv.members[static_cast<std::size_t>(work.member_)];
  if (!rv.scheduled) {  // computed, and timed on every member's stream (Note [Stream order])
    rv.waiting.push_back(work.rank_);
    rs.blocked_work = &work;
    rs.blocked_slot = &m;
    block(work.rank_);
    rs.blocked_work = nullptr;
    rs.blocked_slot = nullptr;
  }
  ZC_ASSERT(rv.computed && rv.scheduled, "rank {} woke before {} was computed and timed", work.rank_,
            rv.where());
  complete(work);
  work.waited_ = true;
  auto it = std::find_if(rs.inflight.begin(), rs.inflight.end(),
                         [&](const auto& w) { return w.get() == &work; });
  ZC_ASSERT(it != rs.inflight.end(), "waited Work missing from rank {}'s inflight list",
            work.rank_);
  rs.inflight.erase(it);
  // Drop the buffer handles now, on the owning rank: a rendezvous freed later by another rank
  // must not free this rank's memory (per-rank live-byte accounting).
  work.in_ = Tensor();
  work.out_ = Tensor();
  advance_to(rs, rv.done_us);
  rs.trace.set_time(rs.timing.now_us);
  if (!rv.done_line) rv.done_line = rendezvous_line("done", rv);
  rs.trace.record(rv.done_line, m.result_hash);
}

void ClusterState::compute(Rendezvous& rv) {
  ZC_ASSERT(!rv.computed, "{} computed twice", rv.where());
  rv.computed = true;
  rv.group->open.erase(rv.seq);
  const CallSig& sig = rv.first_sig;
  const int n = static_cast<int>(rv.members.size());
  std::vector<const std::byte*> ins;
  for (const Member& m : rv.members) ins.push_back(m.live_input != nullptr ? m.live_input : m.input.data());
  const std::int64_t esz = dtype_size(sig.dtype);
  const auto sized = [&](std::int64_t numel) {
    return std::make_shared<Bytes>(static_cast<std::size_t>(numel * esz));
  };
  std::shared_ptr<Bytes> shared;  // one result for every member (all_reduce, broadcast)
  for (int g = 0; g < n && !sig.meta; ++g) {  // a meta collective has no data to compute
    Member& m = rv.members[static_cast<std::size_t>(g)];
    switch (sig.kind) {
      case CollectiveKind::all_reduce:
        if (!shared) {
          shared = sized(sig.out_numel);
          all_reduce_into(sig.dtype, sig.op, options_.order, ins, sig.in_numel, shared->data());
        }
        m.result = shared;
        break;
      case CollectiveKind::reduce_scatter: {
        auto r = sized(sig.out_numel);
        reduce_scatter_into(sig.dtype, sig.op, options_.order, ins, sig.out_numel, g, r->data());
        m.result = std::move(r);
        break;
      }
      case CollectiveKind::all_gather: {
        auto r = std::make_shared<Bytes>();
        r->resize(static_cast<std::size_t>(sig.in_numel * esz * n));
        for (std::size_t k = 0; k < ins.size(); ++k) {
          if (sig.in_numel > 0) {
            std::memcpy(r->data() + k * static_cast<std::size_t>(sig.in_numel * esz), ins[k],
                        static_cast<std::size_t>(sig.in_numel * esz));
          }
        }
        m.result = std::move(r);
        break;
      }
      case CollectiveKind::reduce:
        if (g == sig.root) {
          auto r = sized(sig.out_numel);
          reduce_to_root_into(sig.dtype, sig.op, options_.order, ins, sig.in_numel, sig.root,
                              r->data());
          m.result = std::move(r);
        }
        break;
      case CollectiveKind::broadcast:
        if (!shared) {
          shared = sized(sig.in_numel);
          if (sig.in_numel > 0) std::memcpy(shared->data(), ins[static_cast<std::size_t>(sig.root)], shared->size());
        }
        m.result = shared;
        break;
      case CollectiveKind::all_to_all: {
        const std::size_t chunk = static_cast<std::size_t>(sig.in_numel / n * esz);
        auto r = std::make_shared<Bytes>();
        r->resize(chunk * ins.size());
        for (std::size_t k = 0; k < ins.size(); ++k) {
          if (chunk > 0) std::memcpy(r->data() + k * chunk, ins[k] + static_cast<std::size_t>(g) * chunk, chunk);
        }
        m.result = std::move(r);
        break;
      }
      case CollectiveKind::barrier:
      case CollectiveKind::split: break;
    }
  }
  for (std::size_t g = 0; g < rv.members.size(); ++g) {  // read; it may change after this call
    Member& m = rv.members[g];
    if (m.live_input == nullptr) continue;
    m.live_input = nullptr;
    --rank_state(rv.group->members[g]).live_inputs;
  }
  if (sig.kind == CollectiveKind::split) compute_split(rv);
  hash_results(rv);
  for (Member& m : rv.members) {
    ZC_ASSERT(m.work != nullptr, "member of {} has no Work", rv.where());
    m.work->ready_pos_ = static_cast<int>(ready_.size());
    ready_.push_back(m.work);
  }
  try_schedule(rv);
}

// A rank's stream holds its collectives in issue order, which is seq order on each group; a
// reordered pair (FaultKind::reorder: the rank issued them the other way round) goes in by seq.
void ClusterState::enqueue_stream(RankState& rs, const std::shared_ptr<Rendezvous>& rv) {
  auto pos = rs.stream.end();
  while (pos != rs.stream.begin() && (*std::prev(pos))->group == rv->group && (*std::prev(pos))->seq > rv->seq) {
    --pos;
  }
  if (pos == rs.stream.begin()) {
    if (!rs.stream.empty()) --rs.stream.front()->stream_fronts;
    ++rv->stream_fronts;
  }
  rs.stream.insert(pos, rv);
}

// Note [Stream order]
// A rank's collectives run on its communication stream one after another in the order it issued
// them, as on one NCCL stream: a collective starts once every member has issued it and each
// member's stream has finished what that member issued before it (schedule_on: the members'
// comm_free_us). So a collective is timed only when every member issued it and it is at the
// front of every member's stream of untimed collectives, and a wait() on it blocks until then.
// With one group (or groups every rank issues in one order) seq order is every rank's issue
// order and nothing waits for that; with overlapping groups (MoE's expert-parallel and
// expert-data-parallel groups) the times no longer depend on the order in which the scheduler,
// or the decoupled replay (sim/decoupled.cpp), reaches the ranks. Timing only: data is computed
// when the last member issues, as before.
void ClusterState::try_schedule(Rendezvous& first) {
  std::vector<Rendezvous*> ready{&first};
  while (!ready.empty()) {
    Rendezvous& rv = *ready.back();
    ready.pop_back();
    if (rv.scheduled || !rv.computed || rv.stream_fronts != static_cast<int>(rv.members.size())) continue;
    schedule(rv);
    rv.scheduled = true;
    for (int waiter : rv.waiting) make_runnable(waiter);
    rv.waiting.clear();
    const std::shared_ptr<Rendezvous> keep = rank_state(rv.group->members.front()).stream.front();
    for (int member : rv.group->members) {
      std::deque<std::shared_ptr<Rendezvous>>& stream = rank_state(member).stream;
      ZC_ASSERT(!stream.empty() && stream.front().get() == &rv, "rank {}'s stream front is not {}", member,
                rv.where());
      stream.pop_front();
      if (!stream.empty()) {
        ++stream.front()->stream_fronts;
        ready.push_back(stream.front().get());
      }
    }
  }
}

// The collective starts when every member has issued it and every member's communication stream
// is free, and takes the cost model's time over the whole group (Note [Plan time model]).
void ClusterState::schedule(Rendezvous& rv) {
  double issued = 0.0;
  for (const Member& m : rv.members) issued = std::max(issued, m.issue_us);
  rv.done_us = schedule_on(*rv.group, rv.first_sig, issued);
}

// NCCL's choice for this rank's call, counted at issue (so that it lands between the rank's own
// clock samples under either schedule); the time is the cost model's, as schedule_on charges it.
void ClusterState::count_issued_nccl(RankState& rs, const Group& group, const CallSig& sig) {
  const CollectiveCost cost = options_.cost.cost(
      sig.kind, sig.bytes(), group.size, options_.cost.nodes_spanned(group.first_rank, group.last_rank));
  if (cost.nccl) count_nccl(rs.nccl_calls, sig.kind, *cost.nccl, sig.bytes(), cost.us);
}

double ClusterState::schedule_on(const Group& group, const CallSig& sig, double issued_us) {
  double start = issued_us;
  for (int member : group.members) start = std::max(start, rank_state(member).comm_free_us);
  const double duration = options_.cost.collective_us(
      sig.kind, sig.bytes(), group.size, options_.cost.nodes_spanned(group.first_rank, group.last_rank));
  const double done = start + duration;
  for (int member : group.members) {
    RankState& ms = rank_state(member);
    ms.comm_free_us = done;
    ms.timing.comm_us += duration;
  }
  return done;
}

void ClusterState::advance_to(RankState& rs, double done_us) {
  if (done_us > rs.timing.now_us) rs.timing.wait_us += done_us - rs.timing.now_us;
  rs.timing.now_us = std::max(rs.timing.now_us, done_us);
}

// Each distinct result is hashed once (an all_reduce's is shared by every member).
void ClusterState::hash_results(Rendezvous& rv) {
  const Bytes* hashed = nullptr;
  std::uint64_t last_hash = 0;
  for (Member& m : rv.members) {
    if (m.result.get() != hashed || hashed == nullptr) {
      hashed = m.result.get();
      last_hash = hash_bytes(m.result);
    }
    m.result_hash = last_hash;
  }
}

void ClusterState::compute_split(Rendezvous& rv) {
  // Ranks with one color form a group ordered by (key, parent rank); colors in ascending order,
  // so group ids and names are the same on every run.
  std::vector<std::tuple<int, int, int>> order;  // (color, key, group rank)
  for (std::size_t g = 0; g < rv.members.size(); ++g) {
    const Member& m = rv.members[g];
    if (m.split_color != kNoColor) order.emplace_back(m.split_color, m.split_key, g);
  }
  std::sort(order.begin(), order.end());
  for (std::size_t i = 0; i < order.size();) {
    const int color = std::get<0>(order[i]);
    std::vector<int> parent_ranks;
    for (; i < order.size() && std::get<0>(order[i]) == color; ++i) {
      parent_ranks.push_back(std::get<2>(order[i]));
    }
    std::vector<int> globals;
    for (int pr : parent_ranks) globals.push_back(rv.group->members[static_cast<std::size_t>(pr)]);
    Group* group = make_group(fmt::format("{}.c{}", rv.group->name, color), globals).get();
    for (std::size_t k = 0; k < parent_ranks.size(); ++k) {
      Member& m = rv.members[static_cast<std::size_t>(parent_ranks[k])];
      m.split_group = group;
      m.split_rank = static_cast<int>(k);
    }
  }
}

std::unique_ptr<Comm> ClusterState::split_result(const SimWork& work) {
  const Member& m = work.rv_->members[static_cast<std::size_t>(work.member_)];
  if (!m.split_group) return nullptr;
  return std::make_unique<SimComm>(*this, work.rank_, groups_[m.split_group->id], m.split_rank,
                                   m.split_rank);
}

void ClusterState::complete(SimWork& work) {
  if (work.completed_) return;
  Member& m = work.rv_->members[static_cast<std::size_t>(work.member_)];
  if (m.result && !m.result->empty()) {
    ZC_ASSERT(static_cast<std::int64_t>(m.result->size()) == work.out_.nbytes(),
              "{}: result of {} bytes for an output of {}", work.rv_->where(), m.result->size(),
              work.out_.nbytes());
    std::memcpy(work.out_.raw(), m.result->data(), m.result->size());
  }
  work.completed_ = true;
  drop_ready(work);
}

void ClusterState::drop_ready(SimWork& work) {
  const int pos = work.ready_pos_;
  ZC_ASSERT(pos >= 0 && pos < static_cast<int>(ready_.size()), "Work not in the ready list");
  SimWork* last = ready_.back();
  last->ready_pos_ = pos;
  ready_[static_cast<std::size_t>(pos)] = last;
  ready_.pop_back();
  work.ready_pos_ = -1;
}

void ClusterState::check_read(int rank, const char* op, const Tensor& t) {
  for (const auto& w : rank_state(rank).inflight) {
    if (t.overlaps(w->out_)) {
      throw DataRace(fmt::format(
          "rank {}: {} reads {} before wait() on async {} ({}, issued at trace event #{}), "
          "whose output {} it overlaps; call wait() on that Work first",
          rank, op, t.describe(), w->rv_->first_sig.str(), w->rv_->where(),
          w->issue_index_, w->out_.describe()));
    }
  }
}

void ClusterState::check_write(int rank, const char* op, const Tensor& t) {
  for (const auto& w : rank_state(rank).inflight) {
    const bool out = t.overlaps(w->out_);  // in-place ops: report the output
    const bool in = !out && t.overlaps(w->in_);
    if (in || out) {
      throw DataRace(fmt::format(
          "rank {}: {} writes {} while async {} ({}, issued at trace event #{}) has {} as its "
          "{} and is not waited; call wait() on that Work before touching its buffers",
          rank, op, t.describe(), w->rv_->first_sig.str(), w->rv_->where(),
          w->issue_index_, in ? w->in_.describe() : w->out_.describe(), in ? "input" : "output"));
    }
  }
}

void ClusterState::throw_mismatch(const Rendezvous& rv, int slot, const CallSig& sig) const {
  std::string calls;
  for (std::size_t g = 0; g < rv.members.size(); ++g) {
    if (!rv.members[g].arrived) continue;
    const CallSig& called = static_cast<int>(g) == slot ? sig : rv.first_sig;
    calls += fmt::format("\n  rank {} (group rank {}) called {}", rv.group->members[g], g,
                         called.str());
  }
  throw CollectiveMismatch(fmt::format(
      "collective mismatch on {}:{}\nEvery rank of a group must issue the same collectives, "
      "with the same count, dtype, op and root, in the same order.", rv.where(), calls));
}

std::string ClusterState::describe_rank(int rank) const {
  const RankState& rs = *ranks_[static_cast<std::size_t>(rank_slot_[static_cast<std::size_t>(rank)])];
  if (rs.finished) return fmt::format("rank {} (finished)", rank);
  if (rs.blocked_work != nullptr) {
    return fmt::format("rank {} (waiting in {} on {})", rank, blocked_call(rs),
                       rs.blocked_work->rendezvous().where());
  }
  return fmt::format("rank {} (running)", rank);
}

void ClusterState::throw_deadlock() const {
  std::string lines;
  for (const auto& rs : ranks_) {
    if (rs->finished || rs->blocked_work == nullptr) continue;
    const Rendezvous& rv = rs->blocked_work->rendezvous();
    std::string missing;
    for (std::size_t g = 0; g < rv.members.size(); ++g) {
      if (rv.members[g].arrived) continue;
      missing += (missing.empty() ? "" : ", ") + describe_rank(rv.group->members[g]);
    }
    if (missing.empty()) {  // every member issued it: a member's stream is behind (Note [Stream order])
      for (int member : rv.group->members) {
        const RankState& ms = *ranks_[static_cast<std::size_t>(rank_slot_[static_cast<std::size_t>(member)])];
        if (ms.stream.empty() || ms.stream.front().get() == &rv) continue;
        missing += fmt::format("{}rank {}'s stream first runs {}", missing.empty() ? "" : ", ", member,
                               ms.stream.front()->where());
      }
      lines += fmt::format("\n  rank {} waits in {} on {}; every member issued it, but {}", rs->rank,
                           blocked_call(*rs), rv.where(), missing);
      continue;
    }
    lines += fmt::format("\n  rank {} waits in {} on {}; not arrived: {}", rs->rank,
                         blocked_call(*rs), rv.where(), missing);
  }
  throw Deadlock(fmt::format(
      "deadlock: no rank can run and {} of {} have not finished:{}\nA rank skipped a collective "
      "or called collectives in a different order.", static_cast<int>(ranks_.size()) - finished_,
      static_cast<int>(ranks_.size()),
      lines));
}

void ClusterState::abort_with(int rank) {
  const std::exception_ptr error = rank_state(rank).error;
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveMismatch&) {
    throw;
  } catch (const DataRace&) {
    throw;
  } catch (const Deadlock&) {
    throw;
  } catch (const LimitExceeded&) {
    throw;
  } catch (const std::exception& e) {
    throw RankFailure(rank, fmt::format("{}: {}", error_kind(e), e.what()), error);
  } catch (...) {
    throw RankFailure(rank, "a non-standard exception", error);
  }
}

}  // namespace zc::sim
