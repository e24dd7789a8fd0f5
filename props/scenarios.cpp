// The seeded scenario list for real backends.
#include "props/scenarios.h"

#include "models/mlp.h"
#include "models/synthetic.h"

#include <fmt/format.h>

namespace zc::props {

std::vector<NamedSpec> real_backend_scenarios(int world, std::uint64_t seed, int count) {
  std::vector<NamedSpec> out;
  for (int k = 0; k < count; ++k) {
    Rng rng = Rng(seed).split(static_cast<std::uint64_t>(k));
    const int stage = static_cast<int>(rng.below(4));
    const bool contiguous = rng.chance(0.5), overlap = rng.chance(0.5);
    const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
    const DType dtype = dtypes[rng.below(3)];
    const int n = static_cast<int>(rng.range(1, 3));
    const int ga = rng.chance(0.7) ? 1 : 2;
    const std::int64_t bucket = std::int64_t{8} << (2 * rng.below(3));
    const bool offload = stage > 0 && rng.chance(0.3);
    const bool coalesce = stage > 0 && ga == 1 && rng.chance(0.5) &&
                          !(stage == 1 && dtype == DType::bf16);  // keep clear of the BF16 wrapper
    const bool simple = rng.chance(0.5);
    RunSpec spec;
    spec.ds_config = {{"gradient_accumulation_steps", ga},
                      {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                      {"zero_optimization", {{"stage", stage}, {"contiguous_gradients", contiguous},
                                             {"overlap_comm", overlap}, {"reduce_bucket_size", bucket}}}};
    if (offload) spec.ds_config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    if (dtype == DType::f16) spec.ds_config["fp16"] = {{"enabled", true}, {"initial_scale_power", 4}};
    if (dtype == DType::bf16) spec.ds_config["bf16"] = {{"enabled", true}};
    if (simple) {
      spec.make_model = [] { return std::make_unique<Mlp>(simple_model_spec(6, 1, LossKind::linear)); };
    } else {
      spec.make_model = [] { return std::make_unique<Synthetic>(std::vector<Shape>{{5}, {3, 2}, {13}, {1}}); };
    }
    spec.world = world;
    spec.steps = 2;
    spec.n_backward = n;
    spec.coalesce = coalesce;
    spec.exact.grad_multiple = static_cast<std::int64_t>(world) * ga;
    spec.seed = seed + static_cast<std::uint64_t>(k);
    const std::string desc = fmt::format(
        "{} stage {} {} contiguous {} overlap {} offload {} bucket {} GA {} N {}{}",
        simple ? "simple(6,1)" : "synthetic", stage, dtype_name(dtype), contiguous, overlap, offload,
        bucket, ga, n, coalesce ? " coalesced" : "");
    out.push_back({desc, std::move(spec)});
  }
  return out;
}

}  // namespace zc::props
