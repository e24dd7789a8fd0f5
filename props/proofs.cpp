// The proofs. Each claim is checked by asking Z3 for a counterexample: unsat means proved.
#include "props/proofs.h"

#include "engine/decisions.h"
#include "props/stopwatch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <z3++.h>

#include <functional>
#include <memory>

// decide::if_then_else for z3::expr, found by argument-dependent lookup when the templates are
// instantiated with z3::expr.
namespace z3 {
inline expr if_then_else(const expr& c, const expr& a, const expr& b) { return ite(c, a, b); }
}  // namespace z3

namespace zc::props {

namespace {

ProofResult timed(const std::string& name, const std::string& expected,
                  const std::function<std::pair<std::string, std::string>()>& body) {
  const Stopwatch watch;
  ProofResult r;
  r.name = name;
  r.expected = expected;
  try {
    std::tie(r.verdict, r.detail) = body();
  } catch (const z3::exception& e) {
    r.verdict = "FAILED";
    r.detail = e.msg();
  }
  r.seconds = watch.seconds();
  return r;
}

// "proved" if `claim` holds under `assumptions`, else the model as text.
std::pair<std::string, std::string> prove(z3::context& c, const z3::expr& assumptions, const z3::expr& claim,
                                          unsigned timeout_ms) {
  z3::solver s(c);
  z3::params p(c);
  p.set("timeout", timeout_ms);
  s.set(p);
  s.add(assumptions && !claim);
  switch (s.check()) {
    case z3::unsat: return {"proved", ""};
    case z3::sat: return {"counterexample", s.get_model().to_string()};
    default: return {"unknown", s.reason_unknown()};
  }
}

// ---- 1. DeepCompile gating ----------------------------------------------------------------------

using CF = decide::CompileFacts<z3::expr, z3::expr>;

CF compile_facts(z3::context& c) {
  return CF{c.bool_const("pass_z1"), c.bool_const("pass_z3"), c.bool_const("pass_autosp"),
            c.bool_const("pass_autotp"), c.bool_const("deepcompile"), c.int_const("stage"),
            c.bool_const("autotp_size_gt_1")};
}

// At every lifecycle point (compile, forward, backward, step, destroy) a runtime call happens only
// after init: the hooks run at backward, the cleanup at destroy; init happens at compile.
std::pair<std::string, std::string> deepcompile_gate(bool b1, bool b2, unsigned timeout_ms) {
  z3::context c;
  const CF f = compile_facts(c);
  const z3::expr lifecycle = c.int_const("lifecycle_point");  // 0 compile .. 4 destroy
  const z3::expr hooks = decide::runs_deepcompile_hooks(f, c.bool_val(b1));
  const z3::expr cleanup = decide::destroy_cleans_up_runtime(f, c.bool_val(b2));
  const z3::expr runtime_call = (lifecycle == 2 && hooks) || (lifecycle == 4 && cleanup);
  const z3::expr assumptions = f.stage >= 0 && f.stage <= 3 && lifecycle >= 0 && lifecycle <= 4 &&
                               !decide::compile_is_error(f);
  return prove(c, assumptions, z3::implies(runtime_call, decide::runtime_initialized(f)), timeout_ms);
}

// ---- 2. partition arithmetic (Int theory) --------------------------------------------------------

z3::expr bounds(z3::context& c, const z3::expr& n, const z3::expr& w) {
  return n >= 0 && n <= c.int_val(static_cast<int64_t>(1) << 48) && w >= 1 && w <= 65536;
}

std::pair<std::string, std::string> zero12_partitions(unsigned timeout_ms) {
  z3::context c;
  const z3::expr n = c.int_const("numel"), w = c.int_const("world");
  const z3::expr r1 = c.int_const("r1"), r2 = c.int_const("r2"), e = c.int_const("element");
  const z3::expr P = decide::zero12_padded_numel(n, w), pn = decide::zero12_partition_numel(n, w);
  const z3::expr s1 = decide::partition_start(n, w, r1), s2 = decide::partition_start(n, w, r2);
  const z3::expr owner = e / pn;
  // Padding is the least multiple of 2 x world; partitions tile [0, P) without overlap; every
  // element has an owner inside the world.
  const z3::expr claim = P >= n && P < n + 2 * w && z3::mod(P, 2 * w) == 0 && pn * w == P &&
                         z3::implies(0 <= r1 && r1 < r2 && r2 < w, s1 + pn <= s2) &&
                         z3::implies(0 <= e && e < P, owner >= 0 && owner < w &&
                                     decide::partition_start(n, w, owner) <= e &&
                                     e < decide::partition_start(n, w, owner) + pn);
  return prove(c, bounds(c, n, w), claim, timeout_ms);
}

// A param [o, o + m) inside the group belongs to partition r (decide::param_in_partition) iff r is
// between the partitions of its first and last element: straddling params map to every partition
// they touch, and each element lies in exactly one of them.
std::pair<std::string, std::string> zero12_params(unsigned timeout_ms) {
  z3::context c;
  const z3::expr n = c.int_const("numel"), w = c.int_const("world"), r = c.int_const("rank");
  const z3::expr o = c.int_const("param_offset"), m = c.int_const("param_numel");
  const z3::expr pn = decide::zero12_partition_numel(n, w), s = decide::partition_start(n, w, r);
  const z3::expr in = decide::param_in_partition<z3::expr, z3::expr>(o, m, s, s + pn);
  const z3::expr touches = decide::first_partition_touched(o, pn) <= r && r <= decide::last_partition_touched(o, m, pn);
  const z3::expr assumptions = bounds(c, n, w) && n >= 1 && m >= 1 && o >= 0 && o + m <= n && r >= 0 && r < w;
  return prove(c, assumptions, in == touches, timeout_ms);
}

// FlatLayout::partitions_of_param's slices: partition `first` starts its slice at the param's
// first element, each next partition where the previous one's slice ends, the last one's slice
// ends inside the param, and every slice lies inside its partition. So the slices tile the param.
std::pair<std::string, std::string> zero12_param_slices(unsigned timeout_ms) {
  z3::context c;
  const z3::expr n = c.int_const("numel"), w = c.int_const("world"), p = c.int_const("partition");
  const z3::expr o = c.int_const("param_offset"), m = c.int_const("param_numel");
  const z3::expr pn = decide::zero12_partition_numel(n, w);
  const z3::expr first = decide::first_partition_touched(o, pn), last = decide::last_partition_touched(o, m, pn);
  const z3::expr sp = decide::partition_start(n, w, p), sq = decide::partition_start(n, w, p + 1);
  const z3::expr b = decide::slice_begin_in_param(o, sp), b_next = decide::slice_begin_in_param(o, sq);
  const z3::expr slice_end = z3::ite(p == last, m, b_next);
  const z3::expr claim = z3::implies(p == first, b == 0) && b < slice_end && slice_end <= m &&
                         z3::implies(p < last, b_next < m) && o + b >= sp && o + slice_end <= sp + pn;
  const z3::expr assumptions =
      bounds(c, n, w) && n >= 1 && m >= 1 && o >= 0 && o + m <= n && first <= p && p <= last;
  return prove(c, assumptions, claim, timeout_ms);
}

std::pair<std::string, std::string> zero3_shards(unsigned timeout_ms) {
  z3::context c;
  const z3::expr n = c.int_const("numel"), w = c.int_const("world"), e = c.int_const("element");
  const z3::expr sh = decide::zero3_shard_numel(n, w);
  const z3::expr owner = e / sh;
  const z3::expr start = decide::shard_start(sh, owner);
  const z3::expr claim = sh * w >= n && sh * w < n + w &&
                         z3::implies(0 <= e && e < n, owner >= 0 && owner < w && start <= e && e < start + sh);
  return prove(c, bounds(c, n, w) && n >= 1, claim, timeout_ms);
}

// The real elements of each rank's shard (what the reducer copies in and partition_grads keeps):
// rank 0's start at the param's first element, each next rank's where the previous one's end, the
// last rank's end at the param's end, none is longer than a shard, and a shard with none is one
// whose start lies past the param (the padding-only skip).
std::pair<std::string, std::string> zero3_shard_real_ranges(unsigned timeout_ms) {
  z3::context c;
  const z3::expr n = c.int_const("numel"), w = c.int_const("world"), r = c.int_const("rank");
  const z3::expr sh = decide::zero3_shard_numel(n, w);
  const z3::expr begin = decide::zero3_shard_real_begin(n, w, r), len = decide::zero3_shard_real_numel(n, w, r);
  const z3::expr last = w - 1;
  const z3::expr claim = decide::zero3_shard_real_begin(n, w, c.int_val(0)) == 0 &&
                         decide::zero3_shard_real_begin(n, w, last) + decide::zero3_shard_real_numel(n, w, last) == n &&
                         z3::implies(r + 1 < w, begin + len == decide::zero3_shard_real_begin(n, w, r + 1)) &&
                         len >= 0 && len <= sh && (len == 0) == (decide::shard_start(sh, r) >= n);
  return prove(c, bounds(c, n, w) && n >= 1 && r >= 0 && r < w, claim, timeout_ms);
}

// The reducers' bucket loop (decide::add_to_bucket, the code both Zero12Optimizer and
// Zero3Optimizer run for every param) over six params of any sizes: each param joins exactly one
// bucket (the current one, or a new one after a flush) at the offset where the bucket's elements
// end; a bucket holds more than reduce_bucket_size elements only as a lone oversize param, which
// the next param always flushes (the single-param bucket the oversize path asserts); a param that
// is not oversize fits the contiguous buffer of reduce_bucket_size elements.
std::pair<std::string, std::string> ipg_buckets(bool zero3, unsigned timeout_ms) {
  z3::context c;
  const z3::expr size = c.int_const("reduce_bucket_size");
  z3::expr assumptions = size >= 1 && size <= c.int_val(static_cast<int64_t>(1) << 40);
  z3::expr claim = c.bool_val(true);
  z3::expr elements = c.int_val(0), count = c.int_val(0), bucket = c.int_val(0), prev_oversize = c.bool_val(false);
  for (int i = 0; i < 6; ++i) {
    const z3::expr n = c.int_const(fmt::format("numel{}", i).c_str());
    assumptions = assumptions && n >= 1 && n <= c.int_val(static_cast<int64_t>(1) << 40);
    const decide::BucketAdd<z3::expr, z3::expr> add = decide::add_to_bucket<z3::expr, z3::expr>(elements, n, size, c.bool_val(zero3));
    const z3::expr next_bucket = z3::ite(add.flush_before, bucket + 1, bucket);
    count = z3::ite(add.flush_before, c.int_val(1), count + 1);
    claim = claim && (next_bucket == bucket || next_bucket == bucket + 1) &&
            add.offset == z3::ite(add.flush_before, c.int_val(0), elements) && add.elements_after == add.offset + n &&
            (add.elements_after <= size || (count == 1 && add.oversize)) &&
            z3::implies(!add.oversize, add.elements_after <= size) && z3::implies(prev_oversize, add.flush_before);
    elements = add.elements_after;
    bucket = next_bucket;
    prev_oversize = add.oversize;
  }
  return prove(c, assumptions, claim, timeout_ms);
}

// ---- DeepSpeed's backward all-reduce gate (Engine::allreduce_gradients) ----------------------------

// For every compile request that activates DeepCompile with a parallelization-only pass set
// (autosp or autotp, which leave data-parallel reduction to the engine), the engine all-reduces
// at the end of a backward outside no_sync: runs_backward_allreduce holds and
// skips_allreduce_for_deepcompile does not. With B8's gate the same claim has a counterexample.
std::pair<std::string, std::string> backward_allreduce_gate(bool b8, unsigned timeout_ms) {
  z3::context c;
  const CF f = compile_facts(c);
  const z3::expr enabled = c.bool_const("enable_backward_allreduce"), no_sync = c.bool_const("inside_no_sync");
  const z3::expr reduces = decide::runs_backward_allreduce(enabled, no_sync) &&
                           !decide::skips_allreduce_for_deepcompile(decide::deepcompile_active(f),
                                                                    decide::uses_parallelization_pass_only(f), c.bool_val(b8));
  const z3::expr assumptions = f.stage >= 0 && f.stage <= 3 && !decide::compile_is_error(f) &&
                               decide::deepcompile_active(f) && decide::uses_parallelization_pass_only(f) && enabled &&
                               !no_sync;
  return prove(c, assumptions, reduces, timeout_ms);
}

// And the gate's other half: inside no_sync or with enable_backward_allreduce off, no backward
// all-reduces; a ZeRO DeepCompile backend (z1/z2/z3 passes, no parallelization pass) owns the
// reduction, so the engine's gate skips it.
std::pair<std::string, std::string> backward_allreduce_skips(unsigned timeout_ms) {
  z3::context c;
  const CF f = compile_facts(c);
  const z3::expr enabled = c.bool_const("enable_backward_allreduce"), no_sync = c.bool_const("inside_no_sync");
  const z3::expr claim =
      z3::implies(!enabled || no_sync, !decide::runs_backward_allreduce(enabled, no_sync)) &&
      z3::implies(decide::selects_zero_backend(f),
                  decide::skips_allreduce_for_deepcompile(decide::deepcompile_active(f),
                                                          decide::uses_parallelization_pass_only(f), c.bool_val(false)));
  return prove(c, f.stage >= 0 && f.stage <= 3 && !decide::compile_is_error(f), claim, timeout_ms);
}

// ---- 3. int64 overflow hunt ---------------------------------------------------------------------

// A 64-bit bit-vector that records, for every operation the engine's template performs on it, the
// condition under which that operation overflows signed int64 (z3's *_no_overflow predicates).
// Instantiating decide:: templates with it hunts overflow in the code that runs.
struct CheckedBv {
  struct Op {
    std::string what;
    z3::expr overflows;
  };
  z3::expr e;
  std::shared_ptr<std::vector<Op>> ops;
  CheckedBv(z3::expr x, std::shared_ptr<std::vector<Op>> o) : e(std::move(x)), ops(std::move(o)) {}
  CheckedBv lift(std::int64_t v) const { return {e.ctx().bv_val(v, 64), ops}; }
  CheckedBv record(const char* what, const z3::expr& overflow, z3::expr result) const {
    ops->push_back({fmt::format("#{} {}", ops->size(), what), overflow});
    return {std::move(result), ops};
  }
};
CheckedBv operator+(const CheckedBv& a, const CheckedBv& b) { return a.record("add", !z3::bvadd_no_overflow(a.e, b.e, true), a.e + b.e); }
CheckedBv operator-(const CheckedBv& a, const CheckedBv& b) { return a.record("sub", !z3::bvsub_no_underflow(a.e, b.e, true), a.e - b.e); }
CheckedBv operator*(const CheckedBv& a, const CheckedBv& b) { return a.record("mul", !z3::bvmul_no_overflow(a.e, b.e, true), a.e * b.e); }
CheckedBv operator/(const CheckedBv& a, const CheckedBv& b) { return a.record("div", !z3::bvsdiv_no_overflow(a.e, b.e), a.e / b.e); }
CheckedBv operator-(const CheckedBv& a, std::int64_t b) { return a - a.lift(b); }
CheckedBv operator*(std::int64_t a, const CheckedBv& b) { return b.lift(a) * b; }

// The Int-theory form: every intermediate of the same templates stays below 2^63.
std::pair<std::string, std::string> overflow_in_ints(std::int64_t max_numel, unsigned timeout_ms) {
  z3::context c;
  const z3::expr n = c.int_const("numel"), w = c.int_const("world"), r = c.int_const("rank");
  const z3::expr limit = c.int_val("9223372036854775807");
  const z3::expr align = 2 * w, sum = n + align - 1;
  const z3::expr padded = decide::zero12_padded_numel(n, w), pn = decide::zero12_partition_numel(n, w);
  const z3::expr start = decide::partition_start(n, w, r);
  const z3::expr fits = align <= limit && sum <= limit && padded <= limit && start <= limit && start + pn <= limit;
  const z3::expr in_bounds = n >= 0 && n <= c.int_val(max_numel) && w >= 1 && w <= 65536;
  return prove(c, in_bounds && r >= 0 && r < w, fits, timeout_ms);
}

}  // namespace

// Every operation of decide::zero12_partition_numel and partition_start (and the end offset
// start + pn), over 64-bit bit-vectors with numel <= 2^48, world <= 65536, rank < world: one query
// per operation, in program order, each assuming the earlier ones did not overflow (the first
// overflow is the one hunted). Multiplying two symbolic 64-bit values whose bound comes from a
// division (rank * partition_numel) does not finish within the per-operation budget on z3 4.8.12;
// such operations are settled by the Int-theory query over the same templates, and the detail says
// which ones.
std::pair<std::string, std::string> int64_overflow_hunt(std::int64_t max_numel, unsigned timeout_ms) {
  z3::context c;
  auto ops = std::make_shared<std::vector<CheckedBv::Op>>();
  const CheckedBv n(c.bv_const("numel", 64), ops), w(c.bv_const("world", 64), ops), r(c.bv_const("rank", 64), ops);
  const CheckedBv pn = decide::zero12_partition_numel(n, w);
  const CheckedBv start = decide::partition_start(n, w, r);
  const CheckedBv end = start + pn;
  (void)end;
  z3::solver s(c);
  z3::params p(c);
  p.set("timeout", std::min(timeout_ms, 2000u));
  s.set(p);
  s.add(z3::sge(n.e, c.bv_val(0, 64)) && z3::sle(n.e, c.bv_val(max_numel, 64)) &&
        z3::sge(w.e, c.bv_val(1, 64)) && z3::sle(w.e, c.bv_val(65536, 64)) && z3::sge(r.e, c.bv_val(0, 64)) &&
        z3::slt(r.e, w.e));
  std::vector<std::string> settled, open;
  for (const CheckedBv::Op& op : *ops) {
    s.push();
    s.add(op.overflows);
    const z3::check_result res = s.check();
    if (res == z3::sat) return {"found", fmt::format("{} overflows int64: {}", op.what, s.get_model().to_string())};
    s.pop();
    (res == z3::unsat ? settled : open).push_back(op.what);
    s.add(!op.overflows);
  }
  if (open.empty()) {
    return {"none found", fmt::format("bit-vectors: none of the {} operations overflows int64 for numel <= {}, "
                                      "world <= 65536", ops->size(), max_numel)};
  }
  const auto [int_verdict, int_detail] = overflow_in_ints(max_numel, timeout_ms);
  if (int_verdict != "proved") return {int_verdict == "counterexample" ? "found" : int_verdict, int_detail};
  return {"none found", fmt::format("bit-vectors settled {} of {} operations (no overflow); {} ran past 2 s in "
                                    "bit-vectors and the Int-theory query proves every intermediate < 2^63",
                                    settled.size(), ops->size(), fmt::join(open, ", "))};
}

std::vector<ProofTask> fpa_proof_tasks(unsigned timeout_ms);  // proofs_fpa.cpp

std::vector<ProofTask> proof_tasks(unsigned timeout_ms) {
  std::vector<ProofTask> out;
  // Each task runs lazily: the verify job gives every proof its own work item.
  auto task = [&out](std::string name, std::string expected, std::function<std::pair<std::string, std::string>()> body) {
    out.push_back({name, [name, expected, body] { return timed(name, expected, body); }});
  };
  task("deepcompile-runtime-calls-only-after-init", "proved", [=] { return deepcompile_gate(false, false, timeout_ms); });
  task("deepcompile-gate-with-B1", "counterexample", [=] { return deepcompile_gate(true, false, timeout_ms); });
  task("deepcompile-destroy-with-B2", "counterexample", [=] { return deepcompile_gate(false, true, timeout_ms); });
  task("zero12-partitions-disjoint-and-covering", "proved", [=] { return zero12_partitions(timeout_ms); });
  task("zero12-straddling-params-map-to-every-touched-rank", "proved", [=] { return zero12_params(timeout_ms); });
  task("zero12-param-slices-tile-the-param", "proved", [=] { return zero12_param_slices(timeout_ms); });
  task("zero3-shards-disjoint-and-covering", "proved", [=] { return zero3_shards(timeout_ms); });
  task("zero3-shard-real-ranges-tile-the-param", "proved", [=] { return zero3_shard_real_ranges(timeout_ms); });
  task("ipg-buckets-one-per-param-and-capped-zero12", "proved", [=] { return ipg_buckets(false, timeout_ms); });
  task("ipg-buckets-one-per-param-and-capped-zero3", "proved", [=] { return ipg_buckets(true, timeout_ms); });
  task("backward-allreduce-for-parallelization-only-passes", "proved", [=] { return backward_allreduce_gate(false, timeout_ms); });
  task("backward-allreduce-gate-with-B8", "counterexample", [=] { return backward_allreduce_gate(true, timeout_ms); });
  task("backward-allreduce-skips-no-sync-and-zero-backends", "proved", [=] { return backward_allreduce_skips(timeout_ms); });
  task("int64-overflow-in-partition-offsets", "none found", [=] { return int64_overflow_hunt(std::int64_t{1} << 48, timeout_ms); });
  for (ProofTask& t : fpa_proof_tasks(timeout_ms)) out.push_back(std::move(t));
  return out;
}

std::vector<ProofResult> run_all_proofs(unsigned timeout_ms) {
  std::vector<ProofResult> out;
  for (const ProofTask& t : proof_tasks(timeout_ms)) out.push_back(t.run());
  return out;
}

}  // namespace zc::props
