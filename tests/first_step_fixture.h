// Runs one rank's engine through construction, forward, backward and step on a ds_config, as
// reference/deepspeed/probes.py's no_optimizer probe runs DeepSpeed (a Synthetic model of params
// {3} and {5}, micro-batch 2), and says where it failed: the unit test and the DeepSpeed
// reference test compare the same outcome (Note [No optimizer] in engine/engine.cpp).
#pragma once

#include "engine/engine.h"
#include "engine/errors.h"
#include "models/synthetic.h"
#include "sim/sim_cluster.h"

#include <nlohmann/json.hpp>

#include <string>

namespace zc::testing {

struct FirstStepOutcome {
  std::string failed_at;  // "initialize", "forward", "backward", "step", or "" when all ran
  std::string error;      // the exception's what()
  std::string error_type; // ConfigError, UsageError, ...
};

inline FirstStepOutcome run_first_step(nlohmann::json ds_config) {
  FirstStepOutcome out;
  ds_config["train_micro_batch_size_per_gpu"] = 2;
  sim::SimCluster(1, 1).run([&](sim::RankContext& ctx) {
    out.failed_at = "initialize";
    try {
      const Config cfg = Config::from_json(ds_config, 1);
      Synthetic model(std::vector<Shape>{{3}, {5}});
      Rng rng(1);
      model.init_params(ctx.device, cfg.model_dtype(), DataDomain::exact, {}, rng);
      Engine e(cfg, model, ctx.device, ctx.world);
      out.failed_at = "forward";
      Rng r(2);
      const Engine::Loss loss =
          e.forward(upload_batch(ctx.device, model.make_batch(r, 2, DataDomain::exact, {}), cfg.model_dtype()));
      out.failed_at = "backward";
      e.backward(loss);
      out.failed_at = "step";
      e.step();
      out.failed_at = "";
    } catch (const ConfigError& err) {
      out.error_type = "ConfigError";
      out.error = err.what();
    } catch (const UsageError& err) {
      out.error_type = "UsageError";
      out.error = err.what();
    } catch (const std::exception& err) {
      out.error_type = "other";
      out.error = err.what();
    }
  });
  return out;
}

}  // namespace zc::testing
