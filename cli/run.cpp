// `zerocheck run`: one simulated training run, with live progress from rank 0.
#include "cli/run.h"

#include "engine/errors.h"
#include "engine/hf_auto.h"
#include "models/mlp.h"
#include "models/synthetic.h"
#include "props/training_run.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace zc::cli {

namespace {

std::function<std::unique_ptr<Model>()> model_factory(const RunOptions& o) {
  if (o.model == "simple") {
    return [o] { return std::make_unique<Mlp>(simple_model_spec(o.hidden, o.layers, LossKind::cross_entropy)); };
  }
  if (o.model == "mlp") {
    return [o] {
      MlpSpec s;
      s.dims.assign(static_cast<std::size_t>(o.layers) + 1, o.hidden);
      s.relu = true;
      s.loss = LossKind::cross_entropy;
      return std::make_unique<Mlp>(s);
    };
  }
  if (o.model == "synthetic") {
    return [o] { return std::make_unique<Synthetic>(std::vector<Shape>{{o.hidden, o.hidden}, {o.hidden}}); };
  }
  throw UsageError(fmt::format("--model {}: use simple, mlp or synthetic", o.model));
}

}  // namespace

int run_training(const RunOptions& o) {
  std::vector<std::string> notes;
  nlohmann::json given = load_ds_config(o.config_path);
  // --micro-batch (= --per-device-train-batch-size) means what it means in plan: the micro-batch
  // per GPU, in place of the config's (a train_batch_size goes with it: the global batch follows).
  if (o.hf.per_device_train_batch_size && given.is_object()) {
    given["train_micro_batch_size_per_gpu"] = *o.hf.per_device_train_batch_size;
    given.erase("train_batch_size");
  }
  nlohmann::json j = as_training_script(std::move(given), o.hf, training_args(o.hf, o.world_size, o.hidden), notes);
  for (const std::string& n : notes) fmt::print("note: {}\n", n);
  const Config cfg = Config::from_json(j, o.world_size);  // validates before anything runs
  for (const std::string& w : cfg.warnings) fmt::print("warning: {}\n", w);
  if (cfg.optimizer.torch_adam && cfg.optimizer.type != OptimizerType::sgd) {
    // Refused before anything runs (HostDevice::adam_step would refuse at the first step).
    throw NotImplementedError(
        "torch.optim.Adam/AdamW (a client optimizer, or torch_adam) computes with torch's CPU arithmetic, which "
        "zerocheck does not model bit for bit (docs/deepspeed-reference.md, class torch-adam-arithmetic), and run "
        "computes values: plan the config instead (memory and time do not depend on it), or run it with DeepSpeed's "
        "own optimizer, \"optimizer\": {\"type\": \"AdamW\"} (FusedAdam); --optimizer sgd runs");
  }
  props::RunSpec spec;
  spec.ds_config = j;
  spec.world = o.world_size;
  spec.steps = o.steps;
  spec.micro_batch = cfg.train_micro_batch_size_per_gpu;
  spec.make_model = model_factory(o);
  spec.domain = o.domain == "exact" ? DataDomain::exact : DataDomain::gaussian;
  spec.exact.grad_multiple = o.world_size * cfg.gradient_accumulation_steps;
  spec.seed = o.seed;
  spec.collect_grads = false;
  const std::string model_desc = spec.make_model()->describe();
  fmt::print("zerocheck run: {} on {} simulated ranks, ZeRO stage {}, {}, GA {}, micro-batch {} (global batch {})\n",
             model_desc, o.world_size, cfg.zero.stage, dtype_name(cfg.model_dtype()),
             cfg.gradient_accumulation_steps, spec.micro_batch,
             spec.micro_batch * cfg.gradient_accumulation_steps * o.world_size);
  spec.after_step = [&](int rank, int step, Engine& e, double loss) {
    if (rank != 0) return;
    fmt::print("  step {:>3}/{}  loss {:.6f}  loss scale {}  skipped {}\n", step + 1, o.steps, loss,
               e.loss_scale(), e.skipped_steps());
    std::fflush(stdout);
  };
  const props::RunResult r = props::run_on_sim(spec);
  const double first_loss = r.losses.front();
  fmt::print("loss {:.6f} -> {:.6f}; ranks agree: {}; rank 0 collectives: {}\n", first_loss,
             r.losses.back(), r.ranks_agree ? "yes" : "NO", r.comm[0].to_string());
  fmt::print("simulated time {:.1f} us, trace hash {:016x}\n", r.sim.makespan_us, r.sim.trace_hash);
  return r.ranks_agree ? 0 : 1;
}

}  // namespace zc::cli
