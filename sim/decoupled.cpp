// Schedule::decoupled (Note [Decoupled schedule] in sim_cluster.h): every rank runs to its end in
// turn, its collectives checked against the first rank's and recorded, and the clocks solved
// afterwards by replaying the records under the interleaved scheduler's timing rules.
#include "engine/errors.h"
#include "sim/cluster_state.h"
#include "sim/sim_comm.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <thread>

namespace zc::sim {

namespace {
thread_local int t_running = -1;  // the rank this thread runs under Schedule::decoupled
}  // namespace

int ClusterState::running_rank() const { return decoupled_ ? t_running : current_; }

void ClusterState::run_one(const std::function<void(RankContext&)>& fn, RankState& rs) {
  t_running = rs.rank;
  set_current_rank(rs.rank);
  try {
    RankContext rc = context(rs);
    fn(rc);
    drain(rs);
  } catch (...) {
    rs.error = std::current_exception();
  }
  t_running = -1;
  set_current_rank(-1);
  rs.finished = true;
}

// The first rank runs alone and fixes its groups' calls. Then the lowest rank of each group it is
// not in (split()'s subgroups) fixes that group's calls, in waves: a wave's leaders share no group
// that one of them leads, so they run at once on SimOptions::threads threads. The others then only
// read the calls, on the same threads. A failure in the first rank or a wave ends the run at once
// (the lowest failing rank of it); after them, the lowest failing rank's, whatever the threads
// did: every rank below it runs, and ranks above it are skipped once it is known.
SimResult ClusterState::run_decoupled(const std::function<void(RankContext&)>& fn) {
  const std::size_t n = ranks_.size();
  std::vector<bool> ran(n, false);
  run_one(fn, *ranks_[0]);
  ran[0] = true;
  if (ranks_[0]->error) abort_with(ranks_[0]->rank);
  for (std::vector<std::size_t> wave = leader_wave(ran); !wave.empty(); wave = leader_wave(ran)) {
    parallel_wave_ = wave.size() > 1;
    run_parallel(fn, wave, /*stop_at_error=*/false);
    parallel_wave_ = false;
    for (std::size_t i : wave) ran[i] = true;
    for (std::size_t i : wave) {
      if (ranks_[i]->error) abort_with(ranks_[i]->rank);
    }
  }
  calls_fixed_ = true;
  std::vector<std::size_t> rest;
  for (std::size_t i = 0; i < n; ++i) {
    if (!ran[i]) rest.push_back(i);
  }
  run_parallel(fn, rest, /*stop_at_error=*/true);
  for (auto& rs : ranks_) {
    if (rs->error) abort_with(rs->rank);  // outside any handler (Note [No yield inside catch])
  }
  finished_ = static_cast<int>(n);
  check_decoupled_counts();
  replay_clocks();
  return result();
}

// The ranks (slots, ascending) at `slots`, on SimOptions::threads threads. stop_at_error: ranks
// above the lowest failing one are skipped once it is known.
void ClusterState::run_parallel(const std::function<void(RankContext&)>& fn, const std::vector<std::size_t>& slots,
                                bool stop_at_error) {
  std::atomic<std::size_t> next{0}, first_error{ranks_.size()};
  auto worker = [&] {
    for (std::size_t k = next++; k < slots.size(); k = next++) {
      const std::size_t i = slots[k];
      if (stop_at_error && i > first_error.load()) continue;
      run_one(fn, *ranks_[i]);
      if (ranks_[i]->error) {
        std::size_t seen = first_error.load();
        while (i < seen && !first_error.compare_exchange_weak(seen, i)) {}
      }
    }
  };
  std::vector<std::jthread> pool;
  for (int t = 1; t < std::min<int>(options_.threads, static_cast<int>(slots.size())); ++t) pool.emplace_back(worker);
  worker();
}

// The group leaders to run next, ascending: the lowest rank (slot) of each group whose leader has
// not run, if every such group it is in is one it leads. So no two of them touch a group whose
// calls are not fixed yet, unless it leads that group. Empty when every group's leader has run.
std::vector<std::size_t> ClusterState::leader_wave(const std::vector<bool>& ran) const {
  auto slot_of = [&](int rank) { return static_cast<std::size_t>(rank_slot_[static_cast<std::size_t>(rank)]); };
  std::vector<bool> leads(ran.size(), false), blocked(ran.size(), false);
  for (const auto& g : groups_) {
    if (g->members.empty()) continue;
    std::size_t lowest = ran.size();
    for (int m : g->members) lowest = std::min(lowest, slot_of(m));
    if (ran[lowest]) continue;  // its calls are fixed
    leads[lowest] = true;
    for (int m : g->members) {
      if (slot_of(m) != lowest) blocked[slot_of(m)] = true;
    }
  }
  std::vector<std::size_t> wave;
  for (std::size_t s = 0; s < ran.size(); ++s) {
    if (leads[s] && !blocked[s]) wave.push_back(s);
  }
  ZC_ASSERT(wave.empty() == std::none_of(leads.begin(), leads.end(), [](bool b) { return b; }),
            "group leaders left but none can run");
  return wave;
}

void ClusterState::log_event(RankState& rs, ClockEvent::Kind kind, const Group& group,
                             std::int64_t seq) {
  if (seq > std::numeric_limits<std::uint32_t>::max() || group.id > std::numeric_limits<std::uint16_t>::max()) {
    throw LimitExceeded(fmt::format("rank {}: collective seq {} on group {} passes the decoupled "
                                    "schedule's record (2^32 collectives, 2^16 groups)",
                                    rs.rank, seq, group.name));
  }
  rs.clock_log.push_back(ClockEvent{rs.since_event_us, static_cast<std::uint32_t>(seq),
                                    static_cast<std::uint16_t>(group.id), kind});
  rs.since_event_us = 0.0;
}

// The subgroups of a declared split, built as the interleaved run's compute_split builds them
// from the members' arguments (the same order of groups, ids and names).
void ClusterState::declare_split(Group& group, DecoupledCall& call) {
  if (parallel_wave_) {  // make_group would race with the wave's other leaders
    throw UsageError(fmt::format(
        "split() of group {} by its lowest rank while other group leaders run: under the decoupled "
        "schedule only the first rank's splits, or splits outside a wave of leaders, are supported; "
        "use the interleaved schedule (Note [Decoupled schedule])", group.name));
  }
  call.split_nth = group.decoupled_splits++;
  Rendezvous rv;
  rv.group = &group;
  rv.members.resize(group.members.size());
  call.split_args.resize(group.members.size());
  for (std::size_t g = 0; g < group.members.size(); ++g) {
    call.split_args[g] = options_.declared_split(group.name, call.split_nth, static_cast<int>(g));
    rv.members[g].split_color = call.split_args[g].color;
    rv.members[g].split_key = call.split_args[g].key;
  }
  compute_split(rv);
  for (const Member& m : rv.members) {
    call.split_groups.push_back(m.split_group);
    call.split_ranks.push_back(m.split_rank);
  }
}

WorkPtr ClusterState::issue_decoupled(SimComm& comm, const CallSig& sig, const Tensor& in,
                                      const Tensor& out, bool async_op, SplitArgs split) {
  const int r = comm.global_rank();
  RankState& rs = rank_state(r);
  Group& group = *comm.group();
  if (sig.kind == CollectiveKind::split && !options_.declared_split) {
    throw UsageError(fmt::format(
        "rank {}: split() on {} under SimOptions::schedule = decoupled: a rank would need its "
        "subgroup before the ranks after it have named their colors; declare the run's splits "
        "(SimOptions::declared_split) or use the interleaved schedule (Note [Decoupled schedule])",
        r, group.name));
  }
  if (!sig.meta && ((in.defined() && in.nbytes() > 0) || (out.defined() && out.nbytes() > 0))) {
    throw UsageError(fmt::format("rank {}: {} on {} has data, and the decoupled schedule moves none; "
                                 "every buffer must be meta (Note [Decoupled schedule])",
                                 r, sig.str(), group.name));
  }
  const std::int64_t seq = comm.next_seq();
  if (seq == static_cast<std::int64_t>(group.calls.size())) {
    // The group's lowest simulated rank runs before its other members and fixes its calls; the
    // others, some of them on other threads, only read them (run_decoupled, leader_wave).
    const int leader = *std::min_element(group.members.begin(), group.members.end());
    if (calls_fixed_ || r != leader) {
      throw Deadlock(fmt::format(
          "deadlock: rank {} issued {} on group {} seq {}, which rank {} never issued (it issued {} "
          "collectives on the group). A rank skipped a collective or called collectives in a "
          "different order.", r, sig.str(), group.name, seq, leader, group.calls.size()));
    }
    DecoupledCall c;
    c.sig = sig;
    c.first_rank = r;
    const std::string where = fmt::format("on group {} seq {}", group.name, seq);
    c.issue_line = std::make_shared<const TraceLine>("comm", fmt::format("issue {} {}", sig.str(), where));
    c.done_line = std::make_shared<const TraceLine>("comm", fmt::format("done {} {}", sig.str(), where));
    if (sig.kind == CollectiveKind::split) declare_split(group, c);
    group.calls.push_back(std::move(c));
  }
  DecoupledCall& call = group.calls[static_cast<std::size_t>(seq)];
  if (!(call.sig == sig)) {
    throw CollectiveMismatch(fmt::format(
        "collective mismatch on group {} seq {}:\n  rank {} called {}\n  rank {} called {}\n"
        "Every rank of a group must issue the same collectives, with the same count, dtype, op "
        "and root, in the same order.", group.name, seq, call.first_rank, call.sig.str(), r, sig.str()));
  }
  const auto slot = static_cast<std::size_t>(comm.slot());
  if (sig.kind == CollectiveKind::split && !(call.split_args[slot] == split)) {
    throw CollectiveMismatch(fmt::format(
        "split mismatch on group {} seq {}: rank {} called split(color {}, key {}), the run's declared "
        "split gives it color {}, key {} (SimOptions::declared_split, Note [Decoupled schedule])",
        group.name, seq, r, split.color, split.key, call.split_args[slot].color, call.split_args[slot].key));
  }
  comm.count_op(sig.kind, sig.bytes());
  rs.trace.record(call.issue_line);
  log_event(rs, ClockEvent::issue, group, seq);
  rs.device_ops_since_yield = 0;  // a collective is where the interleaved rank would yield
  // A private one-member rendezvous: what the race detector and error messages read of a Work.
  auto rv = std::make_shared<Rendezvous>();
  rv->group = &group;
  rv->seq = seq;
  rv->members.resize(1);
  rv->first_sig = sig;
  if (sig.kind == CollectiveKind::split) {
    rv->members[0].split_group = call.split_groups[slot];
    rv->members[0].split_rank = call.split_ranks[slot];
  }
  auto work = std::make_shared<SimWork>(*this, r, 0, rv, in, out, rs.trace.size() - 1);
  rs.inflight.push_back(work);
  if (!async_op) work->wait();
  return work;
}

void ClusterState::wait_decoupled(SimWork& work) {
  RankState& rs = rank_state(work.rank_);
  const Rendezvous& rv = *work.rv_;
  DecoupledCall& call = rv.group->calls[static_cast<std::size_t>(rv.seq)];
  log_event(rs, ClockEvent::wait, *rv.group, rv.seq);
  rs.trace.record(call.done_line, 0);  // a meta collective's result hashes to 0
  work.completed_ = true;
  work.waited_ = true;
  auto it = std::find_if(rs.inflight.begin(), rs.inflight.end(),
                         [&](const auto& w) { return w.get() == &work; });
  ZC_ASSERT(it != rs.inflight.end(), "waited Work missing from rank {}'s inflight list", work.rank_);
  rs.inflight.erase(it);
  work.in_ = Tensor();
  work.out_ = Tensor();
}

// A rank that issued fewer collectives on a group than another would wait forever for it in an
// interleaved run: name the first collective it never issued.
void ClusterState::check_decoupled_counts() const {
  for (const auto& g : groups_) {
    for (int member : g->members) {
      const RankState& rs = *ranks_[static_cast<std::size_t>(rank_slot_[static_cast<std::size_t>(member)])];
      const auto issued = static_cast<std::size_t>(std::count_if(
          rs.clock_log.begin(), rs.clock_log.end(),
          [&](const ClockEvent& e) { return e.kind == ClockEvent::issue && e.group == g->id; }));
      if (issued == g->calls.size()) continue;
      const DecoupledCall& call = g->calls[issued];
      throw Deadlock(fmt::format(
          "deadlock: rank {} never issued {} on group {} seq {}, which rank {} issued (rank {} issued "
          "{} of the group's {} collectives). A rank skipped a collective or called collectives in a "
          "different order.", member, call.sig.str(), g->name, issued, call.first_rank, member, issued,
          g->calls.size()));
    }
  }
}

// The interleaved scheduler's clocks from the records: each rank advances through its record
// until it waits on a collective not every member has issued yet; the last issue computes it
// (schedule_on, as ClusterState::compute does) and wakes its waiters.
void ClusterState::replay_clocks() {
  const std::size_t n = ranks_.size();
  // Note [Stream order]: each rank's untimed collectives in issue order; a collective is timed
  // once every member issued it and it is at the front of every member's stream.
  using Entry = std::pair<Group*, DecoupledCall*>;
  std::vector<std::deque<Entry>> stream(n);
  std::vector<std::size_t> runnable(n);
  auto try_time = [&](Entry first) {
    std::vector<Entry> ready{first};
    while (!ready.empty()) {
      const auto [group, call] = ready.back();
      ready.pop_back();
      const auto members = static_cast<std::int64_t>(group->members.size());
      if (call->replay_computed || call->replay_issued != members || call->replay_fronts != members) continue;
      call->replay_done_us = schedule_on(*group, call->sig, call->replay_issue_us);
      call->replay_computed = true;
      for (int w : call->replay_waiting) runnable.push_back(static_cast<std::size_t>(w));
      call->replay_waiting.clear();
      for (int member : group->members) {
        std::deque<Entry>& s = stream[static_cast<std::size_t>(rank_slot_[static_cast<std::size_t>(member)])];
        ZC_ASSERT(!s.empty() && s.front().second == call, "rank {}'s stream front is not group {}'s call",
                  member, group->name);
        s.pop_front();
        if (!s.empty()) {
          ++s.front().second->replay_fronts;
          ready.push_back(s.front());
        }
      }
    }
  };
  std::vector<std::size_t> cursor(n, 0);
  std::vector<bool> resumed(n, false);  // blocked at a wait whose compute is already charged
  std::vector<std::size_t> samples(n, 0);  // samples replayed so far
  for (auto& rs : ranks_) {
    const double compute = rs->timing.compute_us;  // exact: charged op by op during the run
    rs->timing = RankTiming{};
    rs->timing.compute_us = compute;
    rs->comm_free_us = 0.0;
    rs->samples.clear();
  }
  for (std::size_t i = 0; i < n; ++i) runnable[i] = n - 1 - i;  // rank order, popped from the back
  std::size_t finished = 0;
  while (!runnable.empty()) {
    const std::size_t i = runnable.back();
    runnable.pop_back();
    RankState& rs = *ranks_[i];
    for (; cursor[i] < rs.clock_log.size(); ++cursor[i]) {
      const ClockEvent& e = rs.clock_log[cursor[i]];
      if (!resumed[i]) rs.timing.now_us += e.compute_us;
      resumed[i] = false;
      if (e.kind == ClockEvent::sample) {
        RankTiming t = rs.timing;
        t.compute_us = rs.sample_compute_us[samples[i]++];
        rs.samples.push_back(t);
        continue;
      }
      Group& group = *groups_[e.group];
      DecoupledCall& call = group.calls[e.seq];
      if (e.kind == ClockEvent::issue) {
        call.replay_issue_us = std::max(call.replay_issue_us, rs.timing.now_us);
        stream[i].emplace_back(&group, &call);
        if (stream[i].size() == 1) ++call.replay_fronts;
        ++call.replay_issued;
        try_time({&group, &call});
        continue;
      }
      if (!call.replay_computed) {  // blocked: resume here once the last member issues it
        call.replay_waiting.push_back(static_cast<int>(i));
        resumed[i] = true;
        break;
      }
      advance_to(rs, call.replay_done_us);
    }
    if (cursor[i] == rs.clock_log.size()) {
      rs.timing.now_us += rs.since_event_us;  // compute after the last entry
      rs.since_event_us = 0.0;
      ++finished;
    }
  }
  ZC_ASSERT(finished == n, "the decoupled replay stalled with {} of {} ranks finished", finished, n);
}

}  // namespace zc::sim
