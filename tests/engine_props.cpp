// RapidCheck properties over random engine scenarios (shrinking to small worlds, few chunks):
// coalesced reduction equals the per-backward baseline bit for bit (I1), and a sharded run equals
// one rank on the global batch, in the exact domain. On failure the seed and a replay command
// are printed (prop_main.cpp).
#include "models/synthetic.h"
#include "props/training_run.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

namespace zc::props {
namespace {

struct Scenario {
  int stage, world, n;
  bool contiguous, overlap, offload;
  int dtype;  // 0 f32, 1 f16, 2 bf16
  std::int64_t bucket;
  std::vector<std::int64_t> sizes;
  std::uint64_t seed;
};

rc::Gen<Scenario> scenarios(int min_stage) {
  return rc::gen::build<Scenario>(
      rc::gen::set(&Scenario::stage, rc::gen::inRange(min_stage, 4)),
      rc::gen::set(&Scenario::world, rc::gen::inRange(1, 9)),
      rc::gen::set(&Scenario::n, rc::gen::inRange(1, 5)),
      rc::gen::set(&Scenario::contiguous, rc::gen::arbitrary<bool>()),
      rc::gen::set(&Scenario::overlap, rc::gen::arbitrary<bool>()),
      rc::gen::set(&Scenario::offload, rc::gen::arbitrary<bool>()),
      rc::gen::set(&Scenario::dtype, rc::gen::inRange(0, 3)),
      rc::gen::set(&Scenario::bucket, rc::gen::element<std::int64_t>(4, 16, 1000)),
      rc::gen::set(&Scenario::sizes, rc::gen::resize(6, rc::gen::nonEmpty(rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, 30))))),
      rc::gen::set(&Scenario::seed, rc::gen::arbitrary<std::uint64_t>()));
}

RunSpec spec_of(const Scenario& s) {
  RunSpec spec;
  std::vector<Shape> shapes;
  for (std::int64_t n : s.sizes) shapes.push_back({n});
  spec.make_model = [shapes] { return std::make_unique<Synthetic>(shapes); };
  spec.ds_config = {{"zero_optimization", {{"stage", s.stage}, {"contiguous_gradients", s.contiguous},
                                           {"overlap_comm", s.overlap}, {"reduce_bucket_size", s.bucket}}}};
  if (s.offload && s.stage > 0) spec.ds_config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (s.dtype == 1) spec.ds_config["fp16"] = {{"enabled", true}, {"initial_scale_power", 2}};
  if (s.dtype == 2) spec.ds_config["bf16"] = {{"enabled", true}};
  spec.world = s.world;
  spec.steps = 2;
  spec.n_backward = s.n;
  spec.exact.grad_multiple = s.world;
  spec.seed = s.seed;
  return spec;
}

DType dtype_of(const Scenario& s) { return s.dtype == 0 ? DType::f32 : s.dtype == 1 ? DType::f16 : DType::bf16; }

RC_GTEST_PROP(EngineProps, CoalescedReductionEqualsTheBaselineBitForBit, ()) {
  const Scenario s = *scenarios(1);
  RC_TAG(s.stage, s.world > 1 ? "multi-rank" : "one rank");
  RunSpec base = spec_of(s);
  RunSpec co = base;
  co.coalesce = true;
  const RunResult b = run_on_sim(base), c = run_on_sim(co);
  for (std::size_t k = 0; k < b.params.size(); ++k) {
    RC_ASSERT(first_difference(c.grads[k], b.grads[k], dtype_of(s)) == "");
    RC_ASSERT(first_difference(c.params[k], b.params[k], dtype_of(s)) == "");
  }
}

RC_GTEST_PROP(EngineProps, AShardedRunEqualsOneRankOnTheGlobalBatch, ()) {
  const Scenario s = *scenarios(0);
  const RunSpec spec = spec_of(s);
  const RunResult sharded = run_on_sim(spec), single = run_on_sim(single_rank_reference(spec));
  RC_ASSERT(sharded.ranks_agree);
  for (std::size_t k = 0; k < single.params.size(); ++k) {
    RC_ASSERT(first_difference(sharded.grads[k], single.grads[k], dtype_of(s)) == "");
    RC_ASSERT(first_difference(sharded.params[k], single.params[k], dtype_of(s)) == "");
  }
}

}  // namespace
}  // namespace zc::props
