// verify --config (props/user_config.h).
#include "props/user_config.h"

#include "engine/config.h"
#include "engine/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <rapidcheck.h>

#include <functional>
#include <map>
#include <set>

namespace zc::props {

namespace {

std::string scenario_dtype(DType t) { return std::string(dtype_name(t)); }

// A pinned setting the applicability check compares: its name in messages and its value in a
// scenario. Only settings the generators draw are compared; the rest are pinned without a check
// (the engine supports them, the generators simply never vary them).
struct Setting {
  const char* name;
  std::function<std::string(const Scenario&)> value;
};

const std::vector<Setting>& compared_settings() {
  static const std::vector<Setting> settings = {
      {"zero_optimization.stage", [](const Scenario& s) { return std::to_string(s.stage); }},
      {"the dtype (fp16 / bf16 / fp32)", [](const Scenario& s) { return s.dtype; }},
      {"data_types.grad_accum_dtype", [](const Scenario& s) { return s.grad_accum_dtype.empty() ? "default" : s.grad_accum_dtype; }},
      {"communication_data_type", [](const Scenario& s) { return s.comm_dtype.empty() ? "default" : s.comm_dtype; }},
      {"offload (offload_optimizer / offload_param)", [](const Scenario& s) { return s.offload; }},
      {"gradient_clipping on", [](const Scenario& s) { return s.clip > 0 ? "on" : "off"; }},
      {"the optimizer (SGD or the Adam family)", [](const Scenario& s) { return s.optimizer == "SGD" ? "SGD" : "Adam"; }},
      {"optimizer.params.torch_adam", [](const Scenario& s) { return s.torch_adam ? "true" : "false"; }},
      {"zero_optimization.contiguous_gradients", [](const Scenario& s) { return s.contiguous ? "true" : "false"; }},
      {"zero_optimization.overlap_comm", [](const Scenario& s) { return s.overlap ? "true" : "false"; }},
      {"zero_optimization.round_robin_gradients", [](const Scenario& s) { return s.round_robin ? "true" : "false"; }},
  };
  return settings;
}

constexpr int kApplicabilitySamples = 400;

}  // namespace

UserConfig user_config_from_json(const nlohmann::json& ds_config, const std::string& path) {
  if (!ds_config.is_object()) throw ConfigError(fmt::format("--config {}: a ds_config is an object", path));
  UserConfig u;
  u.path = path;
  u.ds_config = ds_config;
  // The batch is drawn (world sizes, backward counts, accumulation): parse the rest as run would.
  nlohmann::json probe = ds_config;
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    probe.erase(k);
  }
  probe["train_micro_batch_size_per_gpu"] = 1;
  const Config c = Config::from_json(probe, 1);
  u.warnings = c.warnings;
  if (!c.optimizer_given) {
    throw ConfigError(fmt::format("--config {}: no \"optimizer\" block; add the one you train with, or name the client "
                                  "optimizer with --optimizer", path));
  }
  Scenario& p = u.pins;
  p.stage = c.zero.stage;
  p.dtype = scenario_dtype(c.model_dtype());
  p.grad_accum_dtype = c.grad_accum_dtype && *c.grad_accum_dtype != c.model_dtype() ? scenario_dtype(*c.grad_accum_dtype) : "";
  p.comm_dtype = c.communication_data_type ? scenario_dtype(*c.communication_data_type) : "";
  const bool opt_off = c.zero.offload_optimizer == OffloadDevice::cpu && c.zero.stage > 0;
  const bool param_off = c.zero.offload_param == OffloadDevice::cpu && c.zero.stage == 3;
  p.offload = opt_off && param_off ? "both" : opt_off ? "optimizer" : param_off ? "param" : "none";
  p.clip = c.gradient_clipping;
  p.contiguous = c.zero.contiguous_gradients;
  p.overlap = c.zero.overlap_comm;
  p.reduce_bucket_size = c.zero.reduce_bucket_size;
  p.allgather_bucket_size = c.zero.allgather_bucket_size;
  p.reduce_scatter = c.zero.reduce_scatter;
  p.round_robin = c.zero.round_robin_gradients;
  p.multi_rank_bucket_allreduce = c.zero.use_multi_rank_bucket_allreduce;
  p.prescale = c.prescale_gradients;
  p.predivide = c.gradient_predivide_factor;
  p.check_grad_overflow = c.bf16.check_grad_overflow;
  const OptimizerConfig& o = c.optimizer;
  p.optimizer = o.type == OptimizerType::sgd ? "SGD" : o.type == OptimizerType::adamw ? "AdamW" : "Adam";
  p.lr = o.lr;
  p.beta1 = o.beta1;
  p.beta2 = o.beta2;
  p.eps = o.eps;
  p.weight_decay = o.weight_decay;
  p.momentum = o.momentum;
  // torch.optim.Adam/AdamW's CPU arithmetic is not modelled bit for bit (HostDevice::adam_step refuses
  // it): the scenarios step with DeepSpeed's Adam, the same update with other roundings. Every
  // invariant compares runs that share their optimizer, so what they check does not depend on it.
  p.torch_adam = false;
  if (o.torch_adam) {
    u.not_checked.push_back("torch.optim's Adam arithmetic (a client optimizer or torch_adam): the scenarios step "
                            "with DeepSpeed's Adam, the same update with other roundings; the invariants compare "
                            "runs that share their optimizer");
  }
  p.adam_w_mode = o.adam_w_mode;
  p.allow_untested_optimizer = c.zero_allow_untested_optimizer;
  // What the scenarios do not carry: said, never silently dropped.
  if (o.schedule.type != LrScheduleType::none) u.not_checked.push_back("scheduler (the scenarios run at a constant lr)");
  if (c.fp16.enabled) {
    u.not_checked.push_back("fp16's loss-scaler settings (the scenarios start the dynamic scaler at 2^4 so that "
                            "overflow and skipped steps happen within a few steps)");
  }
  if (c.zero.stage == 3) {
    u.not_checked.push_back("ZeRO-3's prefetch, persistence and live-parameter limits (the scenarios' models are "
                            "smaller than any of them)");
  }
  if (!c.compile.passes.empty()) u.not_checked.push_back("compile passes (I3 draws its own)");
  return u;
}

Scenario pin(Scenario s, const UserConfig& u) {
  const Scenario& p = u.pins;
  s.stage = p.stage;
  s.dtype = p.dtype;
  s.grad_accum_dtype = p.grad_accum_dtype;
  s.comm_dtype = p.comm_dtype;
  s.offload = p.offload;
  s.clip = p.clip;
  s.contiguous = p.contiguous;
  s.overlap = p.overlap;
  s.reduce_bucket_size = p.reduce_bucket_size;
  s.allgather_bucket_size = p.allgather_bucket_size;
  s.reduce_scatter = p.reduce_scatter;
  s.round_robin = p.round_robin;
  s.multi_rank_bucket_allreduce = p.multi_rank_bucket_allreduce;
  s.prescale = p.prescale;
  s.predivide = p.predivide;
  s.check_grad_overflow = p.check_grad_overflow;
  s.optimizer = p.optimizer;
  s.lr = p.lr;
  s.beta1 = p.beta1;
  s.beta2 = p.beta2;
  s.eps = p.eps;
  s.weight_decay = p.weight_decay;
  s.momentum = p.momentum;
  s.torch_adam = p.torch_adam;
  s.adam_w_mode = p.adam_w_mode;
  s.allow_untested_optimizer = p.allow_untested_optimizer;
  return s;
}

std::string not_applicable_reason(const Invariant& inv, const UserConfig& u) {
  std::map<std::string, std::set<std::string>> drawn;
  const rc::Gen<Scenario> gen = inv.gen();
  rc::Random draws(rc::Random::Key{0x5eed, 0xc0f19, 0, 0});  // fixed: the same answer every run
  for (int i = 0; i < kApplicabilitySamples; ++i) {
    rc::Random r = draws.split();
    const Scenario s = gen(r, i % 100).value();
    for (const Setting& setting : compared_settings()) drawn[setting.name].insert(setting.value(s));
  }
  for (const Setting& setting : compared_settings()) {
    const std::string want = setting.value(u.pins);
    const std::set<std::string>& have = drawn[setting.name];
    if (!have.count(want)) {
      return fmt::format("its scenarios never have {} = {} (they draw {})", setting.name, want, fmt::join(have, ", "));
    }
  }
  return "";
}

Invariant pinned(const Invariant& inv, const UserConfig& u) {
  Invariant p = inv;
  p.gen = [gen = inv.gen, u] { return rc::gen::map(gen(), [u](Scenario s) { return pin(std::move(s), u); }); };
  return p;
}

}  // namespace zc::props
