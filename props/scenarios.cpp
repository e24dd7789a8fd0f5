// The seeded scenario list for real backends.
#include "props/scenarios.h"

#include "engine/errors.h"
#include "engine/host_device.h"
#include "models/mlp.h"
#include "models/synthetic.h"
#include "props/stopwatch.h"

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
    const bool offload_param = stage == 3 && rng.chance(0.3);  // ZeRO-Infinity's param offload to the CPU
    RunSpec spec;
    spec.ds_config = {{"gradient_accumulation_steps", ga},
                      {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                      {"zero_optimization", {{"stage", stage}, {"contiguous_gradients", contiguous},
                                             {"overlap_comm", overlap}, {"reduce_bucket_size", bucket}}}};
    if (offload) spec.ds_config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    if (offload_param) spec.ds_config["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
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
        "{} stage {} {} contiguous {} overlap {} offload {}{} bucket {} GA {} N {}{}",
        simple ? "simple(6,1)" : "synthetic", stage, dtype_name(dtype), contiguous, overlap, offload,
        offload_param ? " offload_param" : "",
        bucket, ga, n, coalesce ? " coalesced" : "");
    out.push_back({desc, std::move(spec)});
  }
  return out;
}

namespace {
std::uint64_t hash_values(const std::vector<std::vector<double>>& steps) {
  std::uint64_t h = 0;
  for (const auto& v : steps) h = mix64(h, hash_data(v.data(), v.size() * sizeof(double)));
  return h;
}
}  // namespace

BackendOutcome check_on_backend(const NamedSpec& ns, Device& dev, Comm& engine_comm, Comm* host_world) {
  BackendOutcome o;
  o.description = ns.description;
  const Stopwatch watch;
  const int rank = engine_comm.rank();
  const RankRecord got = train_rank(ns.spec, rank, dev, engine_comm, nullptr);
  const RunResult sim = run_on_sim(ns.spec);
  for (std::size_t s = 0; s < sim.params.size() && o.sim_mismatch.empty(); ++s) {
    std::string d = first_difference(got.params[s], sim.params[s], DType::f64);
    if (d.empty()) d = first_difference(got.grads[s], sim.grads[s], DType::f64);
    if (d.empty() && rank == 0) d = first_difference(got.masters[s], sim.masters[s], DType::f32);
    if (!d.empty()) o.sim_mismatch = fmt::format("rank {} step {}: {}", rank, s, d);
  }
  // Cross-rank agreement: every rank's hash of its params and grads, min == max over the world.
  if (host_world == nullptr) {
    ZC_ASSERT(engine_comm.size() == 1, "a world of {} ranks needs a host communicator to agree over", engine_comm.size());
    o.seconds = watch.seconds();
    return o;
  }
  HostDevice host;
  const std::uint64_t h = mix64(hash_values(got.params), hash_values(got.grads));
  const std::vector<double> halves{static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)};
  const Tensor lo = tensor_from_f64(host, DType::f64, {2}, halves);
  const Tensor hi = tensor_from_f64(host, DType::f64, {2}, halves);
  host_world->all_reduce(lo, {.op = ReduceOp::min});
  host_world->all_reduce(hi, {.op = ReduceOp::max});
  o.ranks_agree = to_f64(host, lo) == to_f64(host, hi);
  const Tensor bad = tensor_from_f64(host, DType::f64, {1}, std::vector<double>{o.sim_mismatch.empty() ? 0.0 : 1.0});
  host_world->all_reduce(bad, {.op = ReduceOp::max});
  if (o.sim_mismatch.empty() && to_f64(host, bad)[0] != 0.0) o.sim_mismatch = "another rank differs from the simulator";
  o.seconds = watch.seconds();
  return o;
}

}  // namespace zc::props
