// Floating-point proofs (Z3's FPA theory): (a) for f32, bf16 and f16, concrete gradients at world
// 2, N 2 where the per-backward reduction (ZeRO-2 baseline) and the coalesced reduction round
// differently, modelled exactly as the engine computes (16-bit: f32 arithmetic, one rounding on
// store; divide by the world before a linear all-reduce); the simulator then runs both and must
// reproduce both results bit for bit. (b) The exact-domain claim for small integers: every
// pairwise sum is exact, so association orders agree.
#include "engine/engine.h"
#include "models/synthetic.h"
#include "props/proofs.h"
#include "props/scenario.h"
#include "props/stopwatch.h"
#include "sim/sim_cluster.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <z3++.h>

#include <bit>
#include <functional>

namespace zc::props {

namespace {

struct Fmt {
  DType dtype;
  unsigned ebits, sbits;
};

// The engine's arithmetic on a 16-bit (or f32) value: compute in f32, round once to the dtype.
struct Arith {
  z3::context& c;
  Fmt f;
  z3::sort s32() const { return c.fpa_sort(8, 24); }
  z3::sort sd() const { return c.fpa_sort(f.ebits, f.sbits); }
  z3::expr to32(const z3::expr& x) const { return f.dtype == DType::f32 ? x : z3::fpa_to_fpa(x, s32()); }
  z3::expr store(const z3::expr& x32) const { return f.dtype == DType::f32 ? x32 : z3::fpa_to_fpa(x32, sd()); }
  z3::expr add(const z3::expr& a, const z3::expr& b) const { return store(to32(a) + to32(b)); }
  z3::expr half(const z3::expr& a) const { return store(to32(a) / c.fpa_val(2.0f)); }
  z3::expr constant(float v) const { return f.dtype == DType::f32 ? c.fpa_val(v) : z3::fpa_to_fpa(c.fpa_val(v), sd()); }
};

double bits_to_double(std::uint64_t bits, DType t) {
  switch (t) {
    case DType::f32: return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
    case DType::f16: return static_cast<double>(f16_bits_to_f32(static_cast<std::uint16_t>(bits)));
    default: return static_cast<double>(bf16_bits_to_f32(static_cast<std::uint16_t>(bits)));
  }
}

double value_of(const z3::model& m, const z3::expr& x, DType t) {
  const z3::expr bv = m.eval(z3::expr(x.ctx(), Z3_mk_fpa_to_ieee_bv(x.ctx(), x)), true);
  return bits_to_double(std::stoull(bv.get_decimal_string(0)), t);
}

// The engine's averaged gradient for one element at world 2, N 2, ZeRO-2, loss scale 1.
std::vector<double> simulate(DType t, const double g[2][2], bool coalesce) {
  std::vector<double> got(2);
  sim::SimCluster(2, 1).run([&](sim::RankContext& ctx) {
    nlohmann::json j = {{"optimizer", {{"type", "Adam"}}}, {"train_micro_batch_size_per_gpu", 1},
                        {"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 100}}}};
    if (t == DType::f16) j["fp16"] = {{"enabled", true}, {"loss_scale", 1}};
    if (t == DType::bf16) j["bf16"] = {{"enabled", true}};
    Synthetic model(std::vector<Shape>{{1}});
    Rng rng(1);
    model.init_params(ctx.device, t, DataDomain::exact, {}, rng);
    Engine e(Config::from_json(j, 2), model, ctx.device, ctx.world);
    auto chunks = [&] {
      for (int k = 0; k < 2; ++k) {
        if (!coalesce) e.set_gradient_accumulation_boundary(k == 1);
        HostBatch hb;
        hb.samples = 1;
        hb.arrays.emplace("g0", HostArray{{1, 1}, {g[ctx.rank][k]}});
        e.backward(e.forward(upload_batch(ctx.device, hb, t)));
      }
    };
    if (coalesce) {
      e.coalesce_grad_reduction(chunks);
    } else {
      chunks();
    }
    got[static_cast<std::size_t>(ctx.rank)] = e.full_grads()[0];
  });
  return got;
}

std::optional<FpaWitness> find_witness(Fmt f, unsigned timeout_ms) {
  z3::context c;
  Arith a{c, f};
  z3::expr g[2][2] = {{c.fpa_const("g00", f.ebits, f.sbits), c.fpa_const("g01", f.ebits, f.sbits)},
                      {c.fpa_const("g10", f.ebits, f.sbits), c.fpa_const("g11", f.ebits, f.sbits)}};
  z3::expr sane = c.bool_val(true);
  for (auto& row : g) {
    for (auto& x : row) {
      sane = sane && z3::expr(c, Z3_mk_fpa_is_normal(c, x)) && z3::abs(x) >= a.constant(0.0625f) && z3::abs(x) <= a.constant(64.0f);
    }
  }
  // Baseline: reduce each chunk (halve, then rank 0 + rank 1), accumulate chunk 0 then chunk 1.
  const z3::expr red0 = a.add(a.half(g[0][0]), a.half(g[1][0]));
  const z3::expr red1 = a.add(a.half(g[0][1]), a.half(g[1][1]));
  const z3::expr baseline = a.add(red0, red1);
  // Coalesced: each rank sums its chunks locally, then one reduction.
  const z3::expr coalesced = a.add(a.half(a.add(g[0][0], g[0][1])), a.half(a.add(g[1][0], g[1][1])));
  z3::solver s(c);
  z3::params p(c);
  p.set("timeout", timeout_ms);
  s.set(p);
  s.add(sane && !z3::expr(c, Z3_mk_fpa_eq(c, baseline, coalesced)));
  if (s.check() != z3::sat) return std::nullopt;
  const z3::model m = s.get_model();
  FpaWitness w;
  w.dtype = f.dtype;
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 2; ++k) w.g[i][k] = value_of(m, g[i][k], f.dtype);
  }
  w.per_backward = value_of(m, baseline, f.dtype);
  w.coalesced = value_of(m, coalesced, f.dtype);
  return w;
}

ProofResult rounding_witness(Fmt f, unsigned timeout_ms) {
  const Stopwatch watch;
  ProofResult r;
  r.name = fmt::format("fpa-coalesced-vs-per-backward-rounding-{}", dtype_name(f.dtype));
  r.expected = "found";
  const std::optional<FpaWitness> w = find_witness(f, timeout_ms);
  if (!w) {
    r.verdict = "none found";
  } else {
    const std::vector<double> sim_base = simulate(f.dtype, w->g, false), sim_co = simulate(f.dtype, w->g, true);
    const double want_base = w->per_backward, want_co = w->coalesced;
    const bool reproduced = sim_base[0] == want_base && sim_base[1] == want_base && sim_co[0] == want_co && sim_co[1] == want_co;
    r.verdict = reproduced ? "found" : "FAILED";
    r.detail = fmt::format("rank 0 grads ({:.9g}, {:.9g}), rank 1 grads ({:.9g}, {:.9g}): per-backward {:.9g}, "
                           "coalesced {:.9g}; simulator {:.9g} / {:.9g}{}", w->g[0][0], w->g[0][1], w->g[1][0], w->g[1][1],
                           want_base, want_co, sim_base[0], sim_co[0], reproduced ? " (reproduced bit for bit)" : " (MISMATCH)");
  }
  r.seconds = watch.seconds();
  return r;
}

// Exact domain (SPEC 8), as a lemma: adding two integers a, b whose sum stays within |K| (each
// turned into the dtype exactly, added as the engine adds: in f32, rounded once on store) gives
// exactly a + b. By induction every partial sum of a reduction over such integers is exact, so
// any two association orders (per-backward vs coalesced, linear vs ring) give the same value;
// scaling by 2^-e changes no rounding while nothing underflows. (The 3-term form, both orders
// asked at once, costs z3 4.8.12 22 s for bf16 alone and does not finish for f32; the lemma takes
// seconds per dtype.)
ProofResult exact_add_lemma(Fmt f, std::int64_t max_k, unsigned timeout_ms) {
  const Stopwatch watch;
  ProofResult r;
  r.name = fmt::format("exact-domain-integer-sums-exact-{}-|partial|<={}", dtype_name(f.dtype), max_k);
  r.expected = "proved";
  z3::context c;
  Arith a{c, f};
  // a and b range over the dtype's values that are integers within K; their sum is taken exactly
  // in f64 (53 bits hold every such sum) and must equal the engine's sum bit for bit.
  const z3::expr x = c.fpa_const("a", f.ebits, f.sbits), y = c.fpa_const("b", f.ebits, f.sbits);
  const z3::sort s64 = c.fpa_sort(11, 53);
  const z3::expr limit = c.fpa_val(static_cast<double>(max_k));
  auto to64 = [&](const z3::expr& v) { return z3::fpa_to_fpa(v, s64); };
  auto integral_within = [&](const z3::expr& v) {
    const z3::expr v64 = to64(v);
    return !v.mk_is_nan() && !v.mk_is_inf() &&
           z3::expr(c, Z3_mk_fpa_round_to_integral(c, c.fpa_rounding_mode(), v64)) == v64 && z3::abs(v64) <= limit;
  };
  const z3::expr exact = to64(x) + to64(y);
  z3::solver s(c);
  z3::params p(c);
  p.set("timeout", timeout_ms);
  s.set(p);
  s.add(integral_within(x) && integral_within(y) && z3::abs(exact) <= limit &&
        !z3::expr(c, Z3_mk_fpa_eq(c, to64(a.add(x, y)), exact)));
  const z3::check_result res = s.check();
  r.verdict = res == z3::unsat ? "proved" : res == z3::sat ? "counterexample" : "unknown";
  if (res == z3::sat) r.detail = s.get_model().to_string();
  if (res == z3::unknown) r.detail = s.reason_unknown();
  if (res == z3::unsat) {
    r.detail = fmt::format("every f32-computed, {}-stored sum of two integers with |a|, |b|, |a + b| <= {} is exact, "
                           "so every association order of such a reduction gives the same value", dtype_name(f.dtype), max_k);
  }
  r.seconds = watch.seconds();
  return r;
}

}  // namespace

namespace {

Fmt fmt_of(DType dtype) {
  return dtype == DType::f32 ? Fmt{dtype, 8, 24} : dtype == DType::bf16 ? Fmt{dtype, 8, 8} : Fmt{dtype, 5, 11};
}

}  // namespace

ProofResult exact_integer_sum_lemma(DType dtype, std::int64_t max_k, unsigned timeout_ms) {
  return exact_add_lemma(fmt_of(dtype), max_k, timeout_ms);
}

std::optional<FpaWitness> fpa_rounding_witness(DType dtype, unsigned timeout_ms) {
  return find_witness(fmt_of(dtype), timeout_ms);
}

namespace {

ProofResult guarded(const std::string& name, const std::string& expected, const std::function<ProofResult()>& f) {
  try {
    return f();
  } catch (const z3::exception& e) {
    return ProofResult{name, "FAILED", expected, 0, e.msg()};
  }
}

}  // namespace

std::vector<ProofTask> fpa_proof_tasks(unsigned timeout_ms) {
  const Fmt f32{DType::f32, 8, 24}, bf16{DType::bf16, 8, 8}, f16{DType::f16, 5, 11};
  std::vector<ProofTask> out;
  for (Fmt f : {f32, bf16, f16}) {
    const std::string name = fmt::format("fpa-{}", dtype_name(f.dtype));
    out.push_back({name, [=] { return guarded(name, "found", [&] { return rounding_witness(f, timeout_ms); }); }});
  }
  // Each dtype at the bound its generated exact data keeps to (exact_domain_max_integer).
  for (Fmt f : {f32, bf16, f16}) {
    const std::string name = fmt::format("exact-{}", dtype_name(f.dtype));
    out.push_back({name, [=] {
      return guarded(name, "proved", [&] { return exact_add_lemma(f, exact_domain_max_integer(f.dtype), timeout_ms); });
    }});
  }
  return out;
}

}  // namespace zc::props
