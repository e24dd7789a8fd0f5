// `zerocheck plan` (cli/plan.h).
#include "cli/plan.h"

#include "engine/errors.h"
#include "engine/hf_auto.h"
#include "plan/plan.h"
#include "reports/text.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

namespace zc::cli {

namespace {

plan::PlanOptions options_of(const PlanCliOptions& o) {
  plan::PlanOptions p;
  p.ds_config = load_ds_config(o.config_path);
  if (!o.model_json.empty()) {
    std::ifstream mj(o.model_json);
    if (!mj) throw ConfigError(fmt::format("cannot read --model-json {}", o.model_json));
    try {
      std::vector<std::string> model_notes;
      p.model = transformer_spec_from_json(nlohmann::json::parse(mj), &model_notes);
      for (const std::string& n : model_notes) fmt::print(stderr, "note: {}\n", n);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("--model-json {} is not valid JSON: {}", o.model_json, e.what()));
    }
  } else {
    p.model = transformer_preset(o.model);
  }
  p.model.attention = o.attention == "fused" ? AttentionMemory::fused : AttentionMemory::materialised;
  p.model.gradient_checkpointing = o.gradient_checkpointing || o.activation_checkpointing;
  if (o.activation_checkpointing) p.model.checkpoint_function = CheckpointFunction::deepspeed;
  // --micro-batch overrides the config (plan.cpp), so it overrides before "auto" is resolved.
  if (o.micro_batch && p.ds_config.is_object()) {
    p.ds_config["train_micro_batch_size_per_gpu"] = *o.micro_batch;
    p.ds_config.erase("train_batch_size");
  }
  HfCliArgs hf = o.hf;
  hf.per_device_train_batch_size = o.micro_batch;
  std::vector<std::string> notes;
  p.ds_config = as_training_script(p.ds_config, hf, training_args(hf, o.world_size, p.model.dim), notes);
  for (const std::string& n : notes) fmt::print(stderr, "note: {}\n", n);
  p.world = o.world_size;
  p.gpu = o.gpu;
  p.gpus_per_node = o.gpus_per_node;
  p.network = o.network;
  if (o.micro_batch) p.micro_batch = *o.micro_batch;
  if (o.seq) p.seq = *o.seq;
  p.steps = o.steps;
  p.ranks = o.ranks == "all"              ? plan::PlanOptions::Ranks::all
            : o.ranks == "representative" ? plan::PlanOptions::Ranks::representative
                                          : plan::PlanOptions::Ranks::automatic;
  if (o.schedule == "decoupled") p.schedule = sim::Schedule::decoupled;
  if (o.schedule == "interleaved") p.schedule = sim::Schedule::interleaved;
  p.ring_collectives = o.collectives == "ring";
  return p;
}

void write(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file);
  out << text;
  if (!out) throw UsageError(fmt::format("cannot write {}", file.string()));
}

// --fit [GiB]: the budget is the GPU's capacity unless given; a budget above the capacity is
// capped to it with a warning (a plan never says "fits" where the GPU has less). The table lists
// what fits fastest first, then what does not in search order; each row's verdict is its plan's
// `fits`, the one fit.json and fit.html show.
int run_fit(plan::PlanOptions p, const plan::Hardware& hw, const PlanCliOptions& o) {
  const plan::GpuSpec& gpu = hw.gpu(p.gpu);
  std::int64_t budget = gpu.memory_bytes;
  if (o.fit_gib) {
    if (!(*o.fit_gib > 0)) throw ConfigError(fmt::format("--fit {}: a budget is a positive number of GiB", *o.fit_gib));
    const auto asked = static_cast<std::int64_t>(*o.fit_gib * 1024.0 * 1024 * 1024);
    if (asked > gpu.memory_bytes) {
      fmt::print(stderr, "zerocheck plan: warning: --fit {} GiB is more than the {}'s {}; the budget is the GPU's "
                 "capacity (choose the GPU with --gpu)\n", *o.fit_gib, gpu.name, format_bytes(gpu.memory_bytes));
    }
    budget = std::min(asked, gpu.memory_bytes);
  }
  std::vector<plan::FitCandidate> tried;
  const std::vector<plan::FitCandidate> fits = plan::search_fits(p, hw, budget, &tried);
  if (!tried.empty()) {
    for (const std::string& w : tried.front().result.warnings) fmt::print(stderr, "warning: {}\n", w);
  }
  std::vector<const plan::FitCandidate*> rows;
  for (const plan::FitCandidate& c : fits) rows.push_back(&c);
  for (const plan::FitCandidate& c : tried) {
    if (!c.result.fits) rows.push_back(&c);
  }
  fmt::print("zerocheck plan --fit {} per rank: {} on {} x {}; what fits, fastest first, then what does not\n",
             format_bytes(budget), p.model.preset, p.world, gpu.name);
  fmt::print("  {:<8}{:<18}{:>6}{:>8}{:>6}{:>14}{:>8}{:>12}{:>14}\n", "stage", "offload", "mb", "global", "ckpt",
             "GPU peak", "fits", "step", "tokens/s");
  for (const plan::FitCandidate* c : rows) {
    const std::int64_t need = std::max(c->result.device.peak, c->result.device.construction_peak);
    fmt::print("  {:<8}{:<18}{:>6}{:>8}{:>6}{:>14}{:>8}{:>10.1f}ms{:>14.0f}\n", c->stage, c->offload, c->micro_batch,
               c->result.global_batch(), c->gradient_checkpointing ? "yes" : "no", format_bytes(need),
               c->result.fits ? "yes" : "no", c->result.step_us / 1e3, c->result.tokens_per_s);
  }
  std::vector<plan::PlanResult> results;
  for (const plan::FitCandidate* c : rows) results.push_back(c->result);
  if (!o.out.empty()) {
    std::filesystem::create_directories(o.out);
    nlohmann::json j = nlohmann::json::array();
    for (const plan::PlanResult& r : results) j.push_back(plan::to_json(r));
    write(std::filesystem::path(o.out) / "fit.json", j.dump(2) + "\n");
    write(std::filesystem::path(o.out) / "fit.html",
          plan::to_html(results, fmt::format("zerocheck plan --fit {}", format_bytes(budget))));
  }
  if (fits.empty()) {
    fmt::print("nothing fits in {}: {}\n", format_bytes(budget),
               tried.empty() ? std::string() : plan::fit_message(tried.back().result));
    return 1;
  }
  const plan::FitCandidate& best = fits.front();
  fmt::print("fastest that fits: ZeRO-{} offload {} micro-batch {}{}: {} per rank, {:.1f} ms per step, "
             "{:.0f} tokens/s\n", best.stage, best.offload, best.micro_batch,
             best.gradient_checkpointing ? " with gradient checkpointing" : "",
             format_bytes(std::max(best.result.device.peak, best.result.device.construction_peak)),
             best.result.step_us / 1e3, best.result.tokens_per_s);
  return 0;
}

}  // namespace

int run_plan_cli(const PlanCliOptions& o) {
  const plan::Hardware hw = plan::load_hardware(o.hardware.empty() ? plan::default_hardware_path() : o.hardware);
  const plan::PlanOptions p = options_of(o);
  if (o.fit) return run_fit(p, hw, o);
  const plan::PlanResult r = plan::run_plan(p, hw);
  for (const std::string& w : r.warnings) fmt::print(stderr, "warning: {}\n", w);
  const plan::DeepSpeedEstimates ds = o.no_deepspeed ? plan::DeepSpeedEstimates{false, "--no-deepspeed", {}}
                                                     : plan::deepspeed_estimates(r);
  nlohmann::json j = plan::to_json(r);
  j["deepspeed_estimators"] = plan::deepspeed_json(r, ds);
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}\n{}", plan::to_text(r), plan::compare_with_deepspeed(r, ds));
  }
  if (!o.out.empty()) {
    std::filesystem::create_directories(o.out);
    write(std::filesystem::path(o.out) / "plan.json", j.dump(2) + "\n");
    write(std::filesystem::path(o.out) / "plan.html", plan::to_html({r}, "zerocheck plan: " + r.model_name));
  }
  return r.fits ? 0 : 1;
}

}  // namespace zc::cli
