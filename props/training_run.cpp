// The simulated training run behind the parity tests.
#include "props/training_run.h"

#include "engine/errors.h"

#include <bit>
#include <cstring>
#include <map>
#include <tuple>

namespace zc::props {

namespace {

std::uint64_t batch_stream(int step, int micro, int chunk) {
  return 0x1000000ull + static_cast<std::uint64_t>(step) * 1000000ull +
         static_cast<std::uint64_t>(micro) * 1000ull + static_cast<std::uint64_t>(chunk);
}

}  // namespace

std::string first_difference(const std::vector<double>& a, const std::vector<double>& b, DType dtype) {
  if (a.size() != b.size()) return fmt::format("sizes differ: {} vs {}", a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint64_t>(a[i]) != std::bit_cast<std::uint64_t>(b[i]) &&
        !(std::isnan(a[i]) && std::isnan(b[i]))) {
      return fmt::format("index {}: {} (0x{:016x}) vs {} (0x{:016x}) [{}]", i, a[i],
                         std::bit_cast<std::uint64_t>(a[i]), b[i], std::bit_cast<std::uint64_t>(b[i]),
                         dtype_name(dtype));
    }
  }
  return "";
}

HostBatch global_batch(const RunSpec& spec, const Model& model, int step, int micro, int chunk) {
  Rng data_rng = Rng(spec.seed).split(batch_stream(spec.same_batch_every_step ? 0 : step, micro, chunk));
  return model.make_batch(data_rng, spec.micro_batch * spec.world, spec.domain, spec.exact);
}

RunSpec single_rank_reference(const RunSpec& spec) {
  RunSpec ref = spec;
  ref.world = 1;
  ref.micro_batch = spec.micro_batch * spec.world;
  if (spec.ep_size > 0) ref.ep_size = 1;
  ref.after_step = nullptr;
  return ref;
}

RunResult run_on_sim(const RunSpec& spec) {
  RunResult result;
  const int W = spec.world;
  std::vector<std::vector<std::vector<double>>> params(static_cast<std::size_t>(W));
  std::vector<std::vector<std::vector<double>>> grads(static_cast<std::size_t>(W));
  result.comm.resize(static_cast<std::size_t>(W));
  nlohmann::json cfg_json = spec.ds_config;
  cfg_json["train_micro_batch_size_per_gpu"] = spec.micro_batch;
  cfg_json.erase("train_batch_size");
  // Each global batch is drawn once and sliced by every rank (drawing it per rank would cost
  // O(world^2)); it is dropped when the last rank has taken its slice.
  std::map<std::tuple<int, int, int>, std::pair<HostBatch, int>> batches;
  sim::SimCluster cluster(W, spec.seed, spec.sim);
  result.sim = cluster.run([&](sim::RankContext& ctx) {
    const Config cfg = Config::from_json(cfg_json, W);
    std::unique_ptr<Comm> ep, edp;
    Options opts;
    if (spec.ep_size > 0) {
      if (W % spec.ep_size != 0) throw UsageError(fmt::format("world {} is not a multiple of ep_size {}", W, spec.ep_size));
      ep = ctx.world.split(ctx.rank / spec.ep_size, ctx.rank);
      edp = ctx.world.split(ctx.rank % spec.ep_size, ctx.rank);
      opts.expert_parallel = ep.get();
      opts.expert_data_parallel = edp.get();
    }
    std::unique_ptr<Model> model = spec.ep_size > 0 ? spec.make_moe_model(*ep) : spec.make_model();
    Rng init_rng = Rng(spec.seed).split(7);
    model->init_params(ctx.device, cfg.model_dtype(), spec.domain, spec.exact, init_rng);
    opts.bugs = spec.bugs;
    opts.trace = &ctx.trace;
    Engine engine(cfg, *model, ctx.device, ctx.world, opts);
    const std::int64_t ga = cfg.gradient_accumulation_steps;
    if (spec.coalesce && ga != 1) throw UsageError("RunSpec: coalesce needs gradient_accumulation_steps 1");
    for (int s = 0; s < spec.steps; ++s) {
      double loss_sum = 0;
      for (int m = 0; m < ga; ++m) {
        auto chunks = [&] {
          for (int c = 0; c < spec.n_backward; ++c) {
            const auto key = std::make_tuple(s, static_cast<int>(m), c);
            auto it = batches.find(key);
            if (it == batches.end()) {
              it = batches.emplace(key, std::make_pair(global_batch(spec, *model, s, static_cast<int>(m), c), 0)).first;
            }
            const Batch mine = upload_batch(ctx.device, it->second.first.slice(ctx.rank * spec.micro_batch, spec.micro_batch),
                                            cfg.model_dtype());
            if (++it->second.second == W) batches.erase(it);
            if (spec.explicit_boundary && !spec.coalesce) {
              engine.set_gradient_accumulation_boundary(m + 1 == ga && c + 1 == spec.n_backward);
            }
            const Engine::Loss loss = engine.forward(mine);
            loss_sum += loss.value;
            engine.backward(loss);
          }
        };
        if (spec.coalesce) {
          engine.coalesce_grad_reduction(chunks);
          if (ctx.rank == 0) result.flush_micro_step_ids.push_back(engine.last_flush_micro_step_id());
        } else {
          chunks();
        }
        if (m + 1 == ga) {
          if (spec.collect_grads) grads[static_cast<std::size_t>(ctx.rank)].push_back(engine.full_grads());
          if (ctx.rank == 0) result.loss_scales.push_back(engine.loss_scale());
        }
        engine.step();
      }
      params[static_cast<std::size_t>(ctx.rank)].push_back(engine.full_params());
      if (ctx.rank == 0) result.masters.push_back(to_f64(ctx.device, engine.master_partitions().at(0)));
      if (ctx.rank == 0) result.losses.push_back(loss_sum / static_cast<double>(ga * spec.n_backward));
      if (spec.after_step) spec.after_step(ctx.rank, s, engine, loss_sum / static_cast<double>(ga * spec.n_backward));
    }
    result.comm[static_cast<std::size_t>(ctx.rank)] = ctx.world.stats();
  });
  result.params = params[0];
  result.grads = grads[0];
  for (int r = 1; r < W && result.ranks_agree; ++r) {
    for (int s = 0; s < spec.steps; ++s) {
      std::string d = first_difference(params[0][static_cast<std::size_t>(s)], params[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)], DType::f64);
      if (d.empty() && spec.collect_grads) {
        d = first_difference(grads[0][static_cast<std::size_t>(s)], grads[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)], DType::f64);
      }
      if (!d.empty()) {
        result.ranks_agree = false;
        result.disagreement = fmt::format("rank {} vs rank 0 after step {}: {}", r, s, d);
        break;
      }
    }
  }
  return result;
}

}  // namespace zc::props
