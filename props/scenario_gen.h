// RapidCheck generators for Scenario: every field has its own generator, so RapidCheck shrinks
// each toward its smallest value (world 1, stage low, N 1, one small param, ...) independently;
// a final map makes the combination valid (offload_param only on stage 3, fp32 accumulation only
// for bf16 on ZeRO 1+, ...). GenDomain narrows the space to where an invariant applies.
#pragma once

#include "props/module_checks_gen.h"
#include "props/scenario.h"

#include <rapidcheck.h>

namespace zc::props {

struct GenDomain {
  int min_stage = 0, max_stage = 3;
  int max_world = 8;
  int min_n = 1, max_n = 4;
  int max_ga = 3;
  int max_steps = 3;
  bool exact = true, gaussian = false;  // data domains drawn from
  bool mlp = true;                      // MLPs besides Synthetic
  bool tree = true;                     // random module trees (models/tree.h)
  bool offload = true;
  bool coalescible = false;  // GA 1 and no BF16_Optimizer wrapper (coalesce_grad_reduction's domain)
  bool passes = false;       // compile with a single pass (none, z1/z3, autosp) as the engine would
  bool any_passes = false;   // every subset of {z1, z3, autosp, autotp} and deepcompile on/off
  bool faults = false;       // one of Scenario::fault's faults

  static GenDomain coalescing() {
    GenDomain d;
    d.min_stage = 1;
    d.max_ga = 1;
    d.coalescible = true;
    return d;
  }
  static GenDomain coalescible_gaussian() {
    GenDomain d = coalescing();
    d.exact = false;
    d.gaussian = true;
    d.mlp = false;
    d.tree = false;  // the rounding oracle reads Synthetic's prescribed gradients
    return d;
  }
  static GenDomain zero3_coalesced() {
    GenDomain d = coalescing();
    d.min_stage = 3;
    return d;
  }
  static GenDomain compiled() {
    GenDomain d;
    d.any_passes = true;
    d.max_world = 4;
    d.offload = false;
    return d;
  }
  static GenDomain any_exact() {
    GenDomain d;
    d.passes = true;
    return d;
  }
  static GenDomain anything() {
    GenDomain d;
    d.gaussian = true;
    d.passes = true;
    return d;
  }
  static GenDomain faulty() {
    GenDomain d;
    d.faults = true;
    d.max_world = 4;
    d.offload = false;
    return d;
  }
};

namespace gen_detail {

inline const std::vector<std::string> kPassNames = {"z1", "z3", "autosp", "autotp"};

inline Scenario make_valid(Scenario s, const GenDomain& d, int pass_mask, std::vector<std::int64_t> mlp_dims,
                           std::vector<std::int64_t> tree_code) {
  if (s.model == "mlp") s.shape = std::move(mlp_dims);
  if (s.model == "tree") s.shape = std::move(tree_code);
  if (s.stage == 0) s.contiguous = s.overlap = false;  // stage 0 has no buckets
  if (s.stage == 0 || !d.offload) s.offload = "none";
  if (s.stage != 3 && (s.offload == "param" || s.offload == "both")) s.offload = "optimizer";
  if (s.dtype != "bf16" || s.stage == 0) s.grad_accum_dtype = "";
  // The ZeRO-1 BF16_Optimizer wrapper (bf16, fp32 accumulation, no offload) cannot coalesce.
  if (d.coalescible && s.stage == 1 && s.offload == "none") s.grad_accum_dtype = "";
  if (s.domain == "gaussian" && s.dtype == "f16") s.clip = 0.0;
  s.passes.clear();
  if (d.any_passes) {
    for (int b = 0; b < 4; ++b) {
      if (pass_mask & (1 << b)) s.passes.push_back(kPassNames[static_cast<std::size_t>(b)]);
    }
  } else if (d.passes) {
    // What a user compiles with: nothing, the ZeRO pass of the stage, or AutoSP (ZeRO 0/1).
    const int choice = pass_mask % 3;
    if (choice == 1 && s.stage >= 1) s.passes = {s.stage == 3 ? "z3" : "z1"};
    if (choice == 2 && s.stage <= 1) s.passes = {"autosp"};
    s.deepcompile = true;
  }
  if (s.fault == "mismatch" && s.steps == 1) s.steps = 2;
  return s;
}

}  // namespace gen_detail

inline rc::Gen<Scenario> gen_scenario(const GenDomain& d) {
  using namespace rc;
  std::vector<std::string> domains;
  if (d.exact) domains.push_back("exact");
  if (d.gaussian) domains.push_back("gaussian");
  std::vector<std::string> models = {"synthetic"};
  if (d.mlp) models.push_back("mlp");
  if (d.tree) models.push_back("tree");
  const std::vector<std::string> faults = {"crash", "mismatch", "deadlock", "step-in-coalesce", "coalesce-in-no-sync",
                                           "stale-backward", "dropped-collective", "slow-rank"};
  // RapidCheck scales inRange and element by its size (small early cases); these draw uniformly
  // from the whole range every time, and still shrink toward the first value.
  auto uniform = [](auto g) { return gen::resize(100, std::move(g)); };
  auto base = gen::build<Scenario>(
      gen::set(&Scenario::world, uniform(gen::inRange(1, d.max_world + 1))),
      gen::set(&Scenario::stage, uniform(gen::inRange(d.min_stage, d.max_stage + 1))),
      gen::set(&Scenario::contiguous, gen::arbitrary<bool>()),
      gen::set(&Scenario::overlap, gen::arbitrary<bool>()),
      gen::set(&Scenario::reduce_bucket_size, uniform(gen::element<std::int64_t>(1000, 4, 16, 64))),
      gen::set(&Scenario::dtype, d.faults ? gen::just<std::string>("f32") : uniform(gen::element<std::string>("f32", "f16", "bf16"))),
      gen::set(&Scenario::grad_accum_dtype, uniform(gen::element<std::string>("", "f32"))),
      gen::set(&Scenario::offload, uniform(gen::element<std::string>("none", "optimizer", "param", "both"))),
      gen::set(&Scenario::clip, uniform(gen::element(0.0, 0.5))),
      gen::set(&Scenario::ga, uniform(gen::inRange(1, d.max_ga + 1))),
      gen::set(&Scenario::n, uniform(gen::inRange(d.min_n, d.max_n + 1))),
      gen::set(&Scenario::steps, uniform(gen::inRange(1, d.max_steps + 1))),
      gen::set(&Scenario::model, uniform(gen::elementOf(models))),
      gen::set(&Scenario::shape, gen::resize(4, gen::nonEmpty(gen::container<std::vector<std::int64_t>>(gen::inRange<std::int64_t>(1, 30))))),
      gen::set(&Scenario::deepcompile, gen::arbitrary<bool>()),
      gen::set(&Scenario::domain, gen::elementOf(domains)),
      gen::set(&Scenario::seed, gen::map(gen::arbitrary<std::uint32_t>(), [](std::uint32_t v) { return std::uint64_t{v} + 1; })),
      gen::set(&Scenario::sched_seed, gen::map(gen::arbitrary<std::uint32_t>(), [](std::uint32_t v) { return std::uint64_t{v} + 1; })),
      gen::set(&Scenario::fault, d.faults ? uniform(gen::elementOf(faults)) : gen::just<std::string>("")));
  auto dims = gen::container<std::vector<std::int64_t>>(2, gen::inRange<std::int64_t>(1, 6));
  auto deeper = gen::container<std::vector<std::int64_t>>(3, gen::inRange<std::int64_t>(1, 5));
  auto mlp_dims = gen::oneOf(dims, deeper);
  using Shape = std::vector<std::int64_t>;
  return gen::map(gen::tuple(base, gen::inRange(0, 16), mlp_dims, i4_shapes("tree")),
                  [d](const std::tuple<Scenario, int, Shape, Shape>& t) {
    return gen_detail::make_valid(std::get<0>(t), d, std::get<1>(t), std::get<2>(t), std::get<3>(t));
  });
}

}  // namespace zc::props
