// The proofs. Each claim is checked by asking Z3 for a counterexample: unsat means proved.
#include "props/proofs.h"

#include "engine/decisions.h"
#include "props/stopwatch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <z3++.h>

#include <functional>
#include <memory>

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
  const z3::expr touches = o / pn <= r && r <= (o + m - 1) / pn;
  const z3::expr assumptions = bounds(c, n, w) && n >= 1 && m >= 1 && o >= 0 && o + m <= n && r >= 0 && r < w;
  return prove(c, assumptions, in == touches, timeout_ms);
}

std::pair<std::string, std::string> zero3_shards(unsigned timeout_ms) {
  z3::context c;
  const z3::expr n = c.int_const("numel"), w = c.int_const("world"), e = c.int_const("element");
  const z3::expr sh = decide::zero3_shard_numel(n, w);
  const z3::expr owner = e / sh;
  const z3::expr claim = sh * w >= n && sh * w < n + w &&
                         z3::implies(0 <= e && e < n, owner >= 0 && owner < w && owner * sh <= e && e < owner * sh + sh);
  return prove(c, bounds(c, n, w) && n >= 1, claim, timeout_ms);
}

// Buckets over a sequence of params, decided by decide::flushes_bucket_before exactly as the
// stage 1/2 and stage 3 reducers call it: each param joins exactly one bucket (the current one,
// or a new one after a flush), and a bucket holds more than reduce_bucket_size elements only as a
// lone param larger than the bucket.
std::pair<std::string, std::string> ipg_buckets(bool zero3, unsigned timeout_ms) {
  z3::context c;
  const z3::expr size = c.int_const("reduce_bucket_size");
  z3::expr assumptions = size >= 1 && size <= c.int_val(static_cast<int64_t>(1) << 40);
  z3::expr claim = c.bool_val(true);
  z3::expr elements = c.int_val(0), count = c.int_val(0), bucket = c.int_val(0);
  for (int i = 0; i < 6; ++i) {
    const z3::expr n = c.int_const(fmt::format("numel{}", i).c_str());
    assumptions = assumptions && n >= 1 && n <= c.int_val(static_cast<int64_t>(1) << 40);
    const z3::expr flush = decide::flushes_bucket_before<z3::expr, z3::expr>(elements, n, size, c.bool_val(zero3));
    const z3::expr next_bucket = z3::ite(flush, bucket + 1, bucket);
    elements = z3::ite(flush, n, elements + n);
    count = z3::ite(flush, c.int_val(1), count + 1);
    // Exactly one bucket: the param's bucket is the previous one or the next, never skipped.
    claim = claim && (next_bucket == bucket || next_bucket == bucket + 1) && (elements <= size || count == 1);
    bucket = next_bucket;
  }
  return prove(c, assumptions, claim, timeout_ms);
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

namespace {

}  // namespace

std::vector<ProofResult> fpa_proofs(unsigned timeout_ms);  // proofs_fpa.cpp

std::vector<ProofResult> run_all_proofs(unsigned timeout_ms) {
  std::vector<ProofResult> out;
  out.push_back(timed("deepcompile-runtime-calls-only-after-init", "proved", [&] { return deepcompile_gate(false, false, timeout_ms); }));
  out.push_back(timed("deepcompile-gate-with-B1", "counterexample", [&] { return deepcompile_gate(true, false, timeout_ms); }));
  out.push_back(timed("deepcompile-destroy-with-B2", "counterexample", [&] { return deepcompile_gate(false, true, timeout_ms); }));
  out.push_back(timed("zero12-partitions-disjoint-and-covering", "proved", [&] { return zero12_partitions(timeout_ms); }));
  out.push_back(timed("zero12-straddling-params-map-to-every-touched-rank", "proved", [&] { return zero12_params(timeout_ms); }));
  out.push_back(timed("zero3-shards-disjoint-and-covering", "proved", [&] { return zero3_shards(timeout_ms); }));
  out.push_back(timed("ipg-buckets-one-per-param-and-capped-zero12", "proved", [&] { return ipg_buckets(false, timeout_ms); }));
  out.push_back(timed("ipg-buckets-one-per-param-and-capped-zero3", "proved", [&] { return ipg_buckets(true, timeout_ms); }));
  out.push_back(timed("int64-overflow-in-partition-offsets", "none found", [&] { return int64_overflow_hunt(std::int64_t{1} << 48, timeout_ms); }));
  for (ProofResult& r : fpa_proofs(timeout_ms)) out.push_back(std::move(r));
  return out;
}

}  // namespace zc::props
