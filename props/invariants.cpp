// The invariants and the scenario generators they are checked over.
#include "props/invariants.h"

#include "engine/errors.h"
#include "engine/rng.h"
#include "props/memory_checks.h"
#include "props/module_checks.h"
#include "props/module_checks_gen.h"
#include "props/scenario_gen.h"
#include "props/state_machine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <cmath>
#include <memory>

namespace zc::props {

namespace {

std::string bits_in(double v, DType dt) {
  switch (dt) {
    case DType::f16: return fmt::format("0x{:04x}", f32_to_f16_bits(static_cast<float>(v)));
    case DType::bf16: return fmt::format("0x{:04x}", f32_to_bf16_bits(static_cast<float>(v)));
    case DType::f32: return fmt::format("0x{:08x}", std::bit_cast<std::uint32_t>(static_cast<float>(v)));
    default: return fmt::format("0x{:016x}", std::bit_cast<std::uint64_t>(v));
  }
}

// Runs spec on the simulator; an exception becomes the verdict's failure.
struct Outcome {
  bool ok = true;
  RunResult result;
  std::string error;
};

Outcome run(const RunSpec& spec) {
  Outcome o;
  try {
    o.result = run_on_sim(spec);
  } catch (const ZcError& e) {
    o.ok = false;
    o.error = e.what();
    o.result.sim.trace_hash = e.trace_hash();  // the failed run's trace up to the failure
  } catch (const std::exception& e) {
    o.ok = false;
    o.error = e.what();
  }
  return o;
}

// v, with the hash of the runs it made, failing for `why`.
Verdict fail(Verdict v, std::string why) {
  v.holds = false;
  v.failure = std::move(why);
  return v;
}

Verdict not_applicable() {
  Verdict v;
  v.applies = false;
  return v;
}

// Number of steps whose grads are exact in the exact domain.
int exact_steps(const Scenario& s) { return grads_param_independent(s) ? s.steps : 1; }

// Compares two runs' grads, params (and masters when same_world) step by step.
std::string compare(const Scenario& s, const RunResult& a, const RunResult& b, int steps, bool masters,
                    const char* a_name, const char* b_name) {
  for (int k = 0; k < steps; ++k) {
    const auto at = static_cast<std::size_t>(k);
    std::string d = first_divergence(s, 0, k, fmt::format("averaged grads ({} vs {})", a_name, b_name), a.grads.at(at), b.grads.at(at));
    if (d.empty()) d = first_divergence(s, 0, k, fmt::format("params after the step ({} vs {})", a_name, b_name), a.params.at(at), b.params.at(at));
    if (d.empty() && masters) {
      d = first_divergence(s, 0, k, fmt::format("fp32 master partition ({} vs {})", a_name, b_name), a.masters.at(at), b.masters.at(at));
    }
    if (!d.empty()) return d;
  }
  return "";
}

// ---- the checks ----

Verdict check_i1_exact(const Scenario& s, const CheckContext& ctx) {
  if (!exact_infeasible(s).empty()) return not_applicable();
  Scenario base = s, co = s;
  base.coalesce = false;
  co.coalesce = true;
  const Outcome b = run(to_run_spec(base, ctx.bugs, ctx.hooks));
  const Outcome c = run(to_run_spec(co, ctx.bugs, ctx.hooks));
  Verdict v;
  v.trace_hash = mix64(b.result.sim.trace_hash, c.result.sim.trace_hash);
  v.failure = !b.ok   ? "baseline run failed: " + b.error
              : !c.ok ? "coalesced run failed: " + c.error
                      : compare(s, c.result, b.result, exact_steps(s), true, "coalesced", "baseline");
  v.holds = v.failure.empty();
  return v;
}

Verdict check_i1_ulp(const Scenario& s, const CheckContext& ctx) {
  Scenario base = s, co = s;
  base.coalesce = false;
  co.coalesce = true;
  const RunSpec bs = to_run_spec(base, ctx.bugs, ctx.hooks);
  const Outcome b = run(bs);
  const Outcome c = run(to_run_spec(co, ctx.bugs, ctx.hooks));
  Verdict v;
  v.trace_hash = mix64(b.result.sim.trace_hash, c.result.sim.trace_hash);
  if (!b.ok) return fail(v, "baseline run failed: " + b.error);
  if (!c.ok) return fail(v, "coalesced run failed: " + c.error);
  // SPEC 6: bit-identical for any floats when N = 1, world = 1 or stage 1 -- provided both runs
  // accumulate the N chunks in the same dtype. A 16-bit model with fp32 grad accumulation or CPU
  // offload accumulates the baseline's chunks in fp32 (grad_accum, the CPU buffer) but the
  // coalesced chunks in the model dtype (.grad, while the hooks return at once), as DeepSpeed does;
  // there only the rounding bound below holds.
  const bool same_accumulation = !(is_16bit(dtype_of(s)) && (!s.grad_accum_dtype.empty() || s.offload != "none"));
  if (s.n == 1 || ((s.world == 1 || s.stage == 1) && same_accumulation)) {
    v.failure = compare(s, c.result, b.result, s.steps, true, "coalesced", "baseline");
    v.holds = v.failure.empty();
    return v;
  }
  // Otherwise both association orders are within gamma_k * sum|terms| of the exact sum, where k
  // counts the roundings on the longest chain: the local mean over the micro-batch, the scale,
  // N accumulations, the division by the world, world - 1 reduction adds, the final cast.
  const DType dt = dtype_of(s);
  const double u = std::ldexp(1.0, -dtype_mantissa_bits(dt));
  const double k = 2.0 + static_cast<double>(s.n) + 2.0 + static_cast<double>(s.world) + 1.0;
  const double gamma = k * u / (1.0 - k * u);
  for (int step = 0; step < s.steps; ++step) {
    const GradOracle o = prescribed_grad_oracle(bs, s.ga, b.result.loss_scales.at(static_cast<std::size_t>(step)), step);
    for (const auto* run_result : {&b.result, &c.result}) {
      const std::vector<double>& g = run_result->grads.at(static_cast<std::size_t>(step));
      for (std::size_t i = 0; i < g.size(); ++i) {
        const double bound = gamma * o.abs_sum[i];
        if (!(std::fabs(g[i] - o.value[i]) <= bound)) {
          return fail(v, fmt::format("rank 0, step {}, averaged grads ({}) {}: {} ({}) is {:.3g} from the exact {} "
                                  "(bound gamma_{} * sum|g| = {:.3g})", step, run_result == &b.result ? "baseline" : "coalesced",
                                  element_name(s, static_cast<std::int64_t>(i)), g[i], bits_in(g[i], dt),
                                  std::fabs(g[i] - o.value[i]), o.value[i], k, bound));
        }
      }
    }
  }
  return v;
}

Verdict check_i2(const Scenario& s, const CheckContext& ctx) {
  Scenario co = s;
  co.coalesce = true;
  const Outcome c = run(to_run_spec(co, ctx.bugs, ctx.hooks));
  Verdict v;
  v.trace_hash = c.result.sim.trace_hash;
  if (!c.ok) return fail(v, "coalesced run failed: " + c.error);
  for (std::size_t k = 0; k < c.result.flush_micro_step_ids.size(); ++k) {
    if (c.result.flush_micro_step_ids[k] != 0) {
      return fail(v, fmt::format("rank 0, step {}: micro_step_id is {} at the coalesce flush (must be 0: "
                              "partition_grads would add into the previous step's buffer)", k,
                              c.result.flush_micro_step_ids[k]));
    }
  }
  return v;
}

// Forwards to a loader and keeps what the runtime saw after the engine is gone.
class ObservingLoader final : public RuntimeLoader {
 public:
  struct Seen {
    bool loaded = false;
    std::vector<std::string> calls;
  };
  ObservingLoader(std::unique_ptr<RuntimeLoader> inner, std::shared_ptr<Seen> seen)
      : inner_(std::move(inner)), seen_(std::move(seen)) {}
  ~ObservingLoader() override {
    if (inner_->loaded()) {
      seen_->loaded = true;
      seen_->calls = inner_->get_handle().calls();
    }
  }
  DeepCompileRuntime& get_handle() override { return inner_->get_handle(); }
  bool loaded() const override { return inner_->loaded(); }

 private:
  std::unique_ptr<RuntimeLoader> inner_;
  std::shared_ptr<Seen> seen_;
};

bool parallel_only(const Scenario& s) {
  for (const std::string& p : s.passes) {
    if (p == "autosp" || p == "autotp") return true;
  }
  return false;
}

Verdict check_i3(const Scenario& s, const CheckContext& ctx) {
  if (!ctx.hooks.make_loader) throw UsageError("I3 needs a DeepCompile runtime loader (RunHooks::make_loader)");
  auto seen = std::make_shared<std::vector<std::shared_ptr<ObservingLoader::Seen>>>();
  CheckContext observed = ctx;
  observed.hooks.make_loader = [inner = ctx.hooks.make_loader, seen] {
    auto one = std::make_shared<ObservingLoader::Seen>();
    seen->push_back(one);
    return std::make_unique<ObservingLoader>(inner(), one);
  };
  RunSpec spec = to_run_spec(s, ctx.bugs, observed.hooks);
  spec.destroy_at_end = true;
  spec.collect_grads = false;
  const Outcome o = run(spec);
  Verdict v;
  v.trace_hash = o.result.sim.trace_hash;
  bool autotp_combined = false;
  for (const std::string& p : s.passes) autotp_combined |= p == "autotp" && s.passes.size() > 1;
  if (!o.ok && !(autotp_combined && o.error.find("NotImplementedError") != std::string::npos)) {
    return fail(v, "the lifecycle failed: " + o.error);
  }
  for (std::size_t r = 0; r < seen->size(); ++r) {
    const ObservingLoader::Seen& one = *(*seen)[r];
    if (!one.loaded) continue;
    if (parallel_only(s) || autotp_combined) {
      return fail(v, fmt::format("rank {}: the DeepCompile runtime was loaded with passes [{}] (calls: {})", r,
                              fmt::join(s.passes, ","), fmt::join(one.calls, ", ")));
    }
    if (one.calls.size() > 1 && one.calls[1].rfind("init(", 0) != 0) {
      return fail(v, fmt::format("rank {}: '{}' before init() (calls: {})", r, one.calls[1], fmt::join(one.calls, ", ")));
    }
  }
  return v;
}

// Note [Stage 0 post-scaling] (engine/dense_optimizer.cpp): the DenseOptimizer paths (stage 0,
// and BF16_Optimizer at ZeRO-1 + bf16 + fp32 accumulation) sum and then multiply by f32(1/W),
// which rounds where 1/W is not a power of two. They reduce in the communication dtype (the
// model's unless communication_data_type says otherwise: BF16_Optimizer's fp32 grads go through
// bf16), so the sum and the multiply round to it, and the result is cast back to the bucket's.
struct PostScaled {
  DType comm;    // the sum and the multiply round to it
  DType bucket;  // the gradients' dtype it is cast back to
};
std::optional<PostScaled> post_scaled_bucket(const Scenario& s) {
  if (s.world <= 1 || (s.world & (s.world - 1)) == 0) return std::nullopt;
  const DType comm = s.comm_dtype.empty() ? dtype_of(s) : parse_dtype(s.comm_dtype);
  if (s.stage == 0) return PostScaled{comm, dtype_of(s)};
  if (s.stage == 1 && s.dtype == "bf16" && !s.grad_accum_dtype.empty() && s.offload == "none") {
    return PostScaled{comm, DType::f32};
  }
  return std::nullopt;
}

// One rank's exact mean m as W ranks produce it there: W * m summed in the communication dtype,
// times f32(1/W) rounded to it, then cast to the bucket's dtype.
std::vector<double> as_post_scaled(std::vector<double> g, int world, PostScaled p) {
  const float inv = static_cast<float>(1.0 / world);
  for (double& x : g) {
    const double sum = round_to(p.comm, x * world);
    x = round_to(p.bucket, round_to(p.comm, static_cast<double>(static_cast<float>(sum) * inv)));
  }
  return g;
}

Verdict check_sharded_parity(const Scenario& s, const CheckContext& ctx) {
  if (!exact_infeasible(s).empty()) return not_applicable();
  const std::optional<PostScaled> post = post_scaled_bucket(s);
  // The implicit form re-reduces an already post-scaled average at every boundary backward: no
  // expression of one rank's values states those bits.
  if (post && s.boundary == "implicit" && s.n > 1) return not_applicable();
  const RunSpec spec = to_run_spec(s, ctx.bugs, ctx.hooks);
  const Outcome sh = run(spec);
  const Outcome one = run(single_rank_reference(spec));
  Verdict v;
  v.trace_hash = mix64(sh.result.sim.trace_hash, one.result.sim.trace_hash);
  if (!sh.ok) return fail(v, "sharded run failed: " + sh.error);
  if (!one.ok) return fail(v, "single-rank run failed: " + one.error);
  // DeepSpeed's stage-0 clip_grad_norm_ (fp32, clipping on) averages each rank's norm over the world
  // (norm/W, then a SUM all_reduce), so its clip coefficient, and the params after the step, may
  // differ from one rank's in the last bit: there only the first step's gradients must match.
  const bool clip_averaged = s.stage == 0 && s.dtype == "f32" && s.clip > 0.0 && s.world > 1;
  // Post-scaled (Note [Stage 0 post-scaling]): the first step's grads are one rank's as W ranks
  // express them, and the params after it follow those grads, so only that step is compared.
  const auto expected = [&](const std::vector<double>& g) {
    return post ? as_post_scaled(g, s.world, *post) : g;
  };
  if (post) {
    v.failure = first_divergence(s, 0, 0, "averaged grads (sharded vs one rank's, post-scaled by f32(1/W))",
                                 sh.result.grads.at(0), expected(one.result.grads.at(0)));
  } else if (clip_averaged) {
    v.failure = first_divergence(s, 0, 0, "averaged grads (sharded vs one rank)", sh.result.grads.at(0),
                                 one.result.grads.at(0));
  } else {
    v.failure = compare(s, sh.result, one.result, exact_steps(s), false, "sharded", "one rank");
  }
  // And the analytic gradient, which a bug shared by both runs cannot match.
  if (v.failure.empty() && s.model != "mlp") {  // prescribed gradients: Synthetic, module trees
    for (int k = 0; k < (post ? 1 : s.steps) && v.failure.empty(); ++k) {
      const GradOracle o = prescribed_grad_oracle(spec, s.ga, sh.result.loss_scales.at(static_cast<std::size_t>(k)), k);
      v.failure = first_divergence(s, 0, k, "averaged grads (sharded vs analytic oracle)", sh.result.grads.at(static_cast<std::size_t>(k)),
                                   expected(o.value));
    }
  }
  v.holds = v.failure.empty();
  return v;
}

// H1: N backwards without the explicit boundary sum, as PyTorch's autograd would. DeepSpeed's
// ZeRO-1/2 keep only the last (Note [Implicit boundary keeps the last backward]).
Verdict check_implicit_backwards_sum(const Scenario& s, const CheckContext& ctx) {
  if (!exact_infeasible(s).empty()) return not_applicable();
  const RunSpec spec = to_run_spec(s, ctx.bugs, ctx.hooks);
  const Outcome o = run(spec);
  Verdict v;
  v.trace_hash = o.result.sim.trace_hash;
  if (!o.ok) return fail(v, "the run failed: " + o.error);
  for (int k = 0; k < s.steps && v.failure.empty(); ++k) {
    const GradOracle sum = prescribed_grad_oracle(spec, s.ga, o.result.loss_scales.at(static_cast<std::size_t>(k)), k, true);
    v.failure = first_divergence(s, 0, k, fmt::format("averaged grads after {} implicit-boundary backwards vs their sum", s.n),
                                 o.result.grads.at(static_cast<std::size_t>(k)), sum.value);
  }
  v.holds = v.failure.empty();
  return v;
}

Verdict check_i4(const Scenario& s, const CheckContext& ctx) {
  const I4Case c{s.world, s.stage, s.model, s.shape, s.seed, ctx.bugs};
  const I4Outcome o = i4_check(c);
  Verdict v;
  v.failure = o.violation;
  v.holds = v.failure.empty();
  v.trace_hash = o.trace_hash;  // the training step's and the copies' events on every rank
  return v;
}

Verdict check_cross_rank(const Scenario& s, const CheckContext& ctx) {
  const Outcome o = run(to_run_spec(s, ctx.bugs, ctx.hooks));
  Verdict v;
  v.trace_hash = o.result.sim.trace_hash;
  if (!o.ok) return fail(v, "run failed: " + o.error);
  if (!o.result.ranks_agree) return fail(v, o.result.disagreement);
  return v;
}

// Collectives of the reduction pass: all but broadcasts, which are the initial model broadcasts and
// ZeRO-3's trace checks, issued at the first two forwards whatever the reduction does (Note
// [ZeRO-3's trace checks]).
// The reductions rank 0 issued. ZeRO-3's all_gathers are param fetches, whose count depends on
// the number of forwards (DeepSpeed's coordinator prefetches from the second forward on, Note
// [ZeRO-3's parameter coordinator]), and broadcasts are its trace checks: neither is a reduction.
std::int64_t calls(const RunResult& r) {
  const CommStats& c = r.comm.at(0);
  return c[CollectiveKind::all_reduce].calls + c[CollectiveKind::reduce_scatter].calls + c[CollectiveKind::reduce].calls;
}

Verdict check_one_pass(const Scenario& s, const CheckContext& ctx) {
  Scenario co = s, co1 = s, base = s;
  co.coalesce = co1.coalesce = true;
  base.coalesce = false;
  co1.n = 1;
  auto spec_of = [&](const Scenario& x) {
    RunSpec spec = to_run_spec(x, ctx.bugs, ctx.hooks);
    spec.collect_grads = false;
    return spec;
  };
  const Outcome c = run(spec_of(co)), c1 = run(spec_of(co1)), b = run(spec_of(base));
  Verdict v;
  v.trace_hash = mix64(mix64(c.result.sim.trace_hash, c1.result.sim.trace_hash), b.result.sim.trace_hash);
  if (!c.ok || !c1.ok || !b.ok) return fail(v, "a run failed: " + c.error + c1.error + b.error);
  if (calls(c.result) != calls(c1.result)) {
    return fail(v, fmt::format("rank 0: coalescing {} backwards per step issued {} collectives but one backward issues {}: "
                            "not one reduction pass ({} vs {})", s.n, calls(c.result), calls(c1.result),
                            c.result.comm[0].to_string(), c1.result.comm[0].to_string()));
  }
  if (s.n >= 2 && s.stage >= 2 && calls(c.result) >= calls(b.result)) {
    return fail(v, fmt::format("rank 0: coalesced issued {} collectives, not fewer than the baseline's {} with N = {}",
                            calls(c.result), calls(b.result), s.n));
  }
  return v;
}

Verdict check_determinism(const Scenario& s, const CheckContext& ctx) {
  const RunSpec spec = to_run_spec(s, ctx.bugs, ctx.hooks);
  const Outcome a = run(spec), b = run(spec);
  Verdict v;
  v.trace_hash = a.result.sim.trace_hash;
  if (a.ok != b.ok || a.error != b.error) return fail(v, fmt::format("the rerun ended differently: '{}' vs '{}'", a.error, b.error));
  if (a.result.sim.trace_hash != b.result.sim.trace_hash || a.result.sim.schedule_hash != b.result.sim.schedule_hash) {
    return fail(v, fmt::format("trace hash 0x{:016x} then 0x{:016x}, schedule hash 0x{:016x} then 0x{:016x}",
                            a.result.sim.trace_hash, b.result.sim.trace_hash, a.result.sim.schedule_hash, b.result.sim.schedule_hash));
  }
  if (a.ok) v.failure = compare(s, a.result, b.result, s.steps, true, "run", "rerun");
  v.holds = v.failure.empty();
  return v;
}

Verdict check_schedule_independence(const Scenario& s, const CheckContext& ctx) {
  Scenario other = s;
  other.sched_seed = s.sched_seed * 0x9e3779b97f4a7c15ull + 1;
  const Outcome a = run(to_run_spec(s, ctx.bugs, ctx.hooks)), b = run(to_run_spec(other, ctx.bugs, ctx.hooks));
  Verdict v;
  v.trace_hash = mix64(a.result.sim.trace_hash, b.result.sim.trace_hash);
  if (!a.ok || !b.ok) return fail(v, "a run failed: " + a.error + b.error);
  v.failure = compare(s, a.result, b.result, s.steps, true, "schedule A", "schedule B");
  v.holds = v.failure.empty();
  return v;
}

// What a fault must produce: the error's type name (or either of two) and a phrase of its message
// ("" = no error).
struct Expected {
  std::string kind, phrase, other_kind = {};
};

Expected expected_error(const Scenario& s) {
  const std::string last = fmt::format("rank {}", s.world - 1);
  if (s.fault == "crash") return {"RankFailure", "injected crash"};
  if (s.fault == "mismatch") return s.world == 1 ? Expected{} : Expected{"CollectiveMismatch", last};
  if (s.fault == "deadlock") return s.world == 1 ? Expected{} : Expected{"Deadlock", last};
  if (s.fault == "step-in-coalesce") {
    if (s.stage == 0) return {"RankFailure", "requires ZeRO stage 1/2/3"};
    return {"RankFailure", "step() inside no_sync() or coalesce_grad_reduction()"};
  }
  if (s.fault == "coalesce-in-no-sync") {
    if (s.stage >= 2) return {"RankFailure", "incompatible with gradient partitioning"};
    if (s.stage == 0) return {"RankFailure", "requires ZeRO stage 1/2/3"};
    return {"RankFailure", "cannot be nested inside another no_sync"};
  }
  if (s.fault == "stale-backward") return {"RankFailure", "call forward() before each backward()"};
  // Its later collectives meet the peers' earlier ones: a different call is a mismatch, alike
  // calls run on until the peers wait for a call it never makes.
  if (s.fault == "dropped-collective") return s.world == 1 ? Expected{} : Expected{"Deadlock", last, "CollectiveMismatch"};
  return {};
}

// slow-rank: simulated time only. Every number equals the fault-free run's, and the run takes longer.
Verdict check_slow_rank(const Scenario& s, const CheckContext& ctx) {
  Scenario clean = s;
  clean.fault.clear();
  const Outcome a = run(to_run_spec(s, ctx.bugs, ctx.hooks)), b = run(to_run_spec(clean, ctx.bugs, ctx.hooks));
  Verdict v;
  v.trace_hash = mix64(a.result.sim.trace_hash, b.result.sim.trace_hash);
  if (!a.ok || !b.ok) return fail(v, "fault slow-rank: a run failed: " + a.error + b.error);
  v.failure = compare(s, a.result, b.result, s.steps, true, "slow rank", "no fault");
  if (v.failure.empty() && !(a.result.sim.makespan_us > b.result.sim.makespan_us)) {
    v.failure = fmt::format("fault slow-rank: makespan {:.1f} us is not above the fault-free {:.1f} us",
                            a.result.sim.makespan_us, b.result.sim.makespan_us);
  }
  v.holds = v.failure.empty();
  return v;
}

Verdict check_failure_modes(const Scenario& s, const CheckContext& ctx) {
  if (s.fault.empty()) return not_applicable();
  if (s.fault == "slow-rank") return check_slow_rank(s, ctx);
  const Expected want = expected_error(s);
  std::string kind, what;
  Verdict v;
  try {
    v.trace_hash = run_on_sim(to_run_spec(s, ctx.bugs, ctx.hooks)).sim.trace_hash;
  } catch (const RankFailure& e) {
    kind = "RankFailure", what = e.what(), v.trace_hash = e.trace_hash();
  } catch (const CollectiveMismatch& e) {
    kind = "CollectiveMismatch", what = e.what(), v.trace_hash = e.trace_hash();
  } catch (const Deadlock& e) {
    kind = "Deadlock", what = e.what(), v.trace_hash = e.trace_hash();
  } catch (const ZcError& e) {
    kind = "other", what = e.what(), v.trace_hash = e.trace_hash();
  } catch (const std::exception& e) {
    kind = "other", what = e.what();
  }
  v.trace_hash = mix64(v.trace_hash, fnv1a(kind + what));
  if (want.kind.empty() && !kind.empty()) return fail(v, fmt::format("fault {}: expected no error, got {}: {}", s.fault, kind, what));
  if (!want.kind.empty() && kind.empty()) {
    return fail(v, fmt::format("fault {}: the run finished without the expected {} ('{}'): the fault went unreported", s.fault,
                            want.kind, want.phrase));
  }
  if ((kind != want.kind && kind != want.other_kind) || what.find(want.phrase) == std::string::npos) {
    return fail(v, fmt::format("fault {}: expected {}{} mentioning '{}', got {}: {}", s.fault, want.kind,
                            want.other_kind.empty() ? "" : " or " + want.other_kind, want.phrase, kind, what));
  }
  return v;
}

const char* kI1Exact =
    "S6 (docs/invariants.md#s6-coalesce-grad-reduction), I1. In the exact data domain (values k * 2^-e sized so every partial sum fits the mantissa, S8 (docs/invariants.md#s8-exact-data-domain)), "
    "N backwards inside coalesce_grad_reduction and then step() give bit-identical averaged gradients, fp32 master "
    "partitions and 16-bit params to the same N backwards reduced one by one, for every stage 1-3, contiguous, "
    "overlap, offload, dtype, bucket size and world. In this domain float addition is associative, so any difference "
    "is a plumbing bug (a dropped, doubled or stale chunk), never rounding.";
const char* kI1Ulp =
    "S6 (docs/invariants.md#s6-coalesce-grad-reduction), I1 for arbitrary floats (gaussian data, Synthetic model): bit-identical when N = 1, world = 1 or stage 1; "
    "otherwise the baseline's and the coalesced reduction's averaged gradients are each within gamma_k * sum|g| of the "
    "exact (f64) gradient, with k the roundings on the longest chain (micro-batch mean, scale, N accumulations, division "
    "by the world, world - 1 reduction adds, the cast) and gamma_k = k*u/(1-k*u), u the dtype's unit roundoff. "
    "This is the standard bound for two association orders of the same sum; a dropped chunk exceeds it.";
const char* kI2 =
    "S6 (docs/invariants.md#s6-coalesce-grad-reduction), I2. For ZeRO-3, micro_step_id is 0 at every coalesce flush over several steps, so partition_grads copies "
    "the reduced partition into the gradient buffer instead of adding to the previous step's stale one. The seen-flag "
    "must not be set while coalescing (bug B4 sets it and micro_step_id reaches N-1).";
const char* kI3 =
    "S3 (docs/invariants.md#s3-deepcompile), I3. For every stage, every subset of compile passes and deepcompile on/off, over the whole lifecycle "
    "(compile, N forward/backward per step, step, destroy), the DeepCompile runtime is never loaded when a "
    "parallelization pass (autosp, autotp) is in use, and no runtime call other than loading happens before init(). "
    "Checked against the real dlopen'ed runtime plugin, which records every call.";
const char* kI4 =
    "S7 (docs/invariants.md#s7-paramdict-copies-tracing), I4. Every copy of a module tree (clone(), copy construction, serialize + deserialize) rebinds each "
    "ParamDict to its new module (never null, never the original), the original is unchanged (owners, ZeRO status, "
    "shards, data), and tracing (the compile front end: a deep copy run forward with fake meta params) succeeds, also "
    "on a ZeRO-3 model whose params are partitioned. Checked on every rank after a training step, over MLPs, Synthetic "
    "models and random module trees, stages 0-3.";
const char* kParity =
    "A sharded run (world W, micro-batch B per rank) gives bit-identical averaged gradients and params to one rank "
    "training on the same global batch (micro-batch W*B), in the exact domain, for every stage 0-3 and GA; for the "
    "Synthetic and module-tree models the gradients also equal the analytic f64 gradient, which catches a bug the single-rank "
    "reference shares. Adam runs position-independent here (DeepSpeed's CPU kernel rounds its vector tail differently, "
    "so its bits move with partition boundaries), and at stage 0 with fp32 clipping only the first step's gradients "
    "must match (DeepSpeed's clip_grad_norm_ averages each rank's norm over the world, which rounds). Where DeepSpeed "
    "sums and then multiplies by f32(1/W) (stage 0, and BF16_Optimizer at ZeRO-1 + bf16 + fp32 accumulation) and W is "
    "not a power of two, the first step's gradients must be one rank's exact mean m as that arithmetic gives it, "
    "round(round(W m) f32(1/W)), and the implicit multi-backward form is not stated.";
const char* kCrossRank =
    "After every step every rank holds the same full params and the same full averaged gradients, in any data domain. "
    "A rank that steps on its own unreduced gradient (for example when the allreduce gate skips a parallelization-only "
    "compile pass, bug B8) diverges from the others.";
const char* kOnePass =
    "S6 (docs/invariants.md#s6-coalesce-grad-reduction): coalesced N backwards issue exactly one reduction pass per step, counted by the Comm's own statistics: "
    "the reductions (all_reduce, reduce_scatter, reduce) of a coalesced step do not depend on N (same count as one "
    "backward), and for stages 2 and 3 with N >= 2 they are strictly fewer than the per-backward baseline's. ZeRO-3's "
    "param all_gathers are not reductions: DeepSpeed's coordinator prefetches from the second forward on.";
const char* kDeterminism =
    "Running the same scenario twice gives the same trace hash (every collective, hook, engine state change and "
    "runtime call, with data hashes), the same schedule hash and bit-identical results. This is what makes every "
    "counterexample replayable.";
const char* kSchedule =
    "The numbers do not depend on the interleaving: with another scheduler seed (a different order of ranks and of "
    "async completions under overlap_comm), params, gradients and master partitions are bit-identical. A race between "
    "a pending reduction and the engine's buffers would show here (or as a DataRace).";
const char* kFailureModes =
    "Bad input gets a clear error and never a hang or a silently wrong number: a crashed rank, a collective issued by "
    "one rank only (a mismatch, or a deadlock at the end), step() inside coalesce_grad_reduction(), coalescing "
    "inside no_sync() and backward() of a stale loss each raise the predicted error type, naming the cause; so does "
    "a collective the simulator drops on the last rank (a deadlock or a mismatch, never a hang); with one rank, where "
    "a mismatch cannot happen, the run completes. A rank the simulator makes 8x slower changes no bit of any result "
    "and lengthens the simulated run.";
const char* kStateMachine =
    "A RapidCheck state machine (rc::state) over random sequences of engine calls (forward, backward, backward of a "
    "stale loss, boundary, step, zero_grad, no_sync, coalesce, compile, destroy) on two simulated ranks, against a "
    "model that predicts the engine's counters and flags and which calls must raise (and with what).";

const char* kMetaMemory =
    "The same scenario trained twice on the simulator, on host devices and in meta mode (shapes only: "
    "no data allocated, moved or read; zerocheck plan runs this way at real sizes): every rank's memory "
    "high-water mark, per category (params, grads, fp32 master, optimizer states, ipg buckets, comm "
    "buffers, gathered, prefetched and persistent ZeRO-3 params, activations, temporaries), its total "
    "and its composition at the peak are the same bytes, on the accelerator and on the CPU side of "
    "offload, for construction and for the steps, and so are the collectives. The host figures are "
    "the host allocator's own count (kept around calloc and free), not the ledger the meta figures "
    "come from. A host run that skips a step for overflow leaves meta mode's path and is discarded.";

Verdict check_meta_memory(const Scenario& s, const CheckContext& ctx) {
  if (!s.fault.empty()) return not_applicable();
  const MemoryComparison c = compare_meta_with_host(to_run_spec(s, ctx.bugs, ctx.hooks));
  if (!c.applies) return not_applicable();
  Verdict v;
  v.trace_hash = c.trace_hash;
  if (!c.difference.empty()) return fail(v, c.difference);
  return v;
}

std::vector<Invariant> make_invariants() {
  std::vector<Invariant> out;
  out.push_back({"I1-coalesced-bit-exact", kI1Exact, [] { return gen_scenario(GenDomain::coalescing()); }, check_i1_exact});
  out.push_back({"I1-coalesced-ulp-bound", kI1Ulp, [] { return gen_scenario(GenDomain::coalescible_gaussian()); }, check_i1_ulp});
  out.push_back({"I2-micro-step-zero-at-flush", kI2, [] { return gen_scenario(GenDomain::zero3_coalesced()); }, check_i2});
  out.push_back({"I3-no-deepcompile-runtime-for-parallel-passes", kI3, [] { return gen_scenario(GenDomain::compiled()); }, check_i3});
  out.push_back({"I4-owner-kept-on-copy", kI4, [] {
    return rc::gen::map(i4_cases(), [](const I4Case& c) {
      Scenario s;
      s.world = c.world, s.stage = c.stage, s.model = c.model, s.shape = c.shape, s.seed = c.seed, s.steps = 1;
      // The model make_i4_model builds, written out: MLP dims padded with 1s to two, sizes >= 1.
      if (s.model != "tree") {
        for (std::int64_t& d : s.shape) d = std::max<std::int64_t>(d, 1);
        while (s.shape.size() < (s.model == "mlp" ? 2u : 1u)) s.shape.push_back(1);
      }
      s.contiguous = s.overlap = false;
      return s;
    });
  }, check_i4});
  out.push_back({"sharded-parity", kParity, [] { return gen_scenario(GenDomain::any_exact()); }, check_sharded_parity});
  out.push_back({"cross-rank-consistency", kCrossRank, [] { return gen_scenario(GenDomain::anything()); }, check_cross_rank});
  out.push_back({"one-reduction-pass-per-coalesced-step", kOnePass, [] { return gen_scenario(GenDomain::coalescing()); }, check_one_pass});
  out.push_back({"determinism-same-trace-hash", kDeterminism, [] { return gen_scenario(GenDomain::anything()); }, check_determinism});
  out.push_back({"schedule-independence", kSchedule, [] { return gen_scenario(GenDomain::anything()); }, check_schedule_independence});
  out.push_back({"failure-modes-clear-errors", kFailureModes, [] { return gen_scenario(GenDomain::faulty()); }, check_failure_modes});
  out.push_back({"engine-lifecycle-state-machine", kStateMachine, [] { return gen_lifecycle_scenario(); }, check_lifecycle});
  out.push_back({"meta-memory-equals-host", kMetaMemory, [] { return gen_scenario(GenDomain::anything()); },
                 check_meta_memory});
  return out;
}

}  // namespace

std::string first_divergence(const Scenario& s, int rank, int step, const std::string& what,
                             const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) {
    return fmt::format("rank {}, step {}, {}: {} vs {} elements", rank, step, what, a.size(), b.size());
  }
  const std::optional<std::size_t> at = first_mismatch(a, b);
  if (!at) return "";
  const DType dt = dtype_of(s);
  const std::size_t i = *at;
  return fmt::format("rank {}, step {}, {} {}: {} ({}) vs {} ({})", rank, step, what,
                     element_name(s, static_cast<std::int64_t>(i)), a[i], bits_in(a[i], dt), b[i], bits_in(b[i], dt));
}

const std::vector<Invariant>& invariants() {
  static const std::vector<Invariant> all = make_invariants();
  return all;
}

const std::vector<Hazard>& hazards() {
  static const std::vector<Hazard> all = [] {
    std::vector<Hazard> out;
    out.push_back({"H1",
                   "DeepSpeed ZeRO-1/2 (no offload) keep only the last of N backwards at the boundary without "
                   "set_gradient_accumulation_boundary(False): chunks 1..N-1 are dropped silently",
                   {"H1-implicit-backwards-sum",
                    "PyTorch's expectation: N backward() calls before step() sum their gradients. With GA 1 and no "
                    "set_gradient_accumulation_boundary(False), every backward is at the boundary, and DeepSpeed "
                    "0.19.8's ZeRO-1/2 epilogue rebuilds averaged_gradients from an accumulator it clears each "
                    "time (stage_1_and_2.py independent_gradient_partition_epilogue), so only the last backward "
                    "reaches the step. The engine does what DeepSpeed does, so this property must fail; the "
                    "counterexample shows a user how much is lost. Use the explicit form (as GradCache does).",
                    [] {
                      GenDomain d;
                      d.min_stage = 1;
                      d.max_stage = 2;
                      d.min_n = 2;
                      d.offload = false;
                      d.mlp = false;
                      d.tree = false;  // the oracle reads Synthetic's prescribed gradients
                      return rc::gen::map(gen_scenario(d), [](Scenario s) {
                        s.boundary = "implicit";
                        s.coalesce = false;
                        // A 16-bit model with fp32 accumulation sums (BF16_Optimizer, the compact buffer).
                        s.grad_accum_dtype = "";
                        return s;
                      });
                    },
                    check_implicit_backwards_sum}});
    return out;
  }();
  return all;
}

const Invariant* find_invariant(std::string_view name) {
  for (const Invariant& i : invariants()) {
    if (i.name == name) return &i;
  }
  for (const Hazard& h : hazards()) {
    if (h.property.name == name) return &h.property;
  }
  return nullptr;
}

}  // namespace zc::props
