// DeepSpeed's own estimators beside zerocheck plan's figures (plan.h): run in the reference
// environment, matched to the plan's stage and offload, and each difference named.
//
// Note [DeepSpeed's estimators]
// estimate_zero2/3_model_states_mem_needs (DeepSpeed 0.19.8, stage_1_and_2.py:4017,
// stage3.py:4016) are closed formulas over model states: per GPU, ZeRO-2 2P (16-bit params) +
// 18P/N (16-bit and fp32 grads, fp32 params, Adam's two states), or 2P alone under offload;
// ZeRO-3 4 x largest layer + 18P/N (2P/N under optimizer offload, nothing more under param
// offload). Their CPU figures are per node and carry a 1.5 buffer factor. They count no ipg
// buckets, reduce or gather buffers, no prefetch, persistent params or activations, and no
// temporaries; zerocheck counts every allocation the engine makes, so the difference between the
// two is those categories plus where the formulas' model states differ from the engine's.
#include "engine/data_files.h"
#include "engine/errors.h"
#include "plan/plan.h"
#include "props/reference_pool.h"

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <memory>

namespace zc::plan {

namespace {

std::int64_t cat(const MemBytes& b, MemCategory c) { return b[static_cast<std::size_t>(c)]; }

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The estimator row for the plan's stage and offload (zero_init false: the engine builds the
// whole model on every rank before partitioning, as DeepSpeed does without zero.Init).
const nlohmann::json* matching_row(const PlanResult& r, const nlohmann::json& raw) {
  const bool opt = r.offload == "optimizer" || r.offload == "optimizer+param";
  const bool par = r.offload == "optimizer+param" || r.offload == "param";
  if (r.stage == 2) {
    for (const nlohmann::json& row : raw.at("zero2")) {
      if (row.at("offload_optimizer").get<bool>() == opt) return &row;
    }
  }
  if (r.stage == 3) {
    for (const nlohmann::json& row : raw.at("zero3")) {
      if (row.at("offload_optimizer").get<bool>() == opt && row.at("offload_param").get<bool>() == par &&
          !row.at("zero_init").get<bool>()) {
        return &row;
      }
    }
  }
  return nullptr;
}

}  // namespace

DeepSpeedEstimates deepspeed_estimates(const PlanResult& r) {
  DeepSpeedEstimates e;
  props::ReferenceEnv env;
  try {
    env = props::reference_env();
  } catch (const ZcError& err) {
    e.missing = err.what();
    return e;
  }
  const int nodes = (r.options.world + r.gpus_per_node - 1) / r.gpus_per_node;
  const std::string cmd = fmt::format(
      "DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= {} {} --params {} --largest-layer {} "
      "--gpus-per-node {} --nodes {} 2>&1",
      shell_quote(env.python.string()),
      shell_quote(data_file("reference/deepspeed/estimators.py", ZC_SOURCE_DIR).string()), r.params,
      r.largest_param, std::min(r.gpus_per_node, r.options.world), nodes);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  if (!pipe) {
    e.missing = "cannot start the DeepSpeed environment's python";
    return e;
  }
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const int rc = ::pclose(pipe.release());
  const std::size_t brace = out.rfind("\n{");
  const std::string last = brace == std::string::npos ? out : out.substr(brace + 1);
  try {
    if (rc != 0) throw std::runtime_error("exit status " + std::to_string(rc));
    e.raw = nlohmann::json::parse(last);
    e.available = true;
  } catch (const std::exception& err) {
    e.missing = fmt::format("DeepSpeed's estimators failed ({}): {}", err.what(),
                            out.substr(out.size() > 400 ? out.size() - 400 : 0));
  }
  return e;
}

std::string compare_with_deepspeed(const PlanResult& r, const DeepSpeedEstimates& e) {
  if (!e.available) return "DeepSpeed's estimators: missing (" + e.missing + ")\n";
  const nlohmann::json* row = matching_row(r, e.raw);
  if (row == nullptr) {
    return fmt::format("DeepSpeed {} has no estimator for ZeRO-{} (only ZeRO-2 and ZeRO-3)\n",
                       e.raw.value("deepspeed", "?"), r.stage);
  }
  const auto ds_gpu = row->at("gpu_bytes").get<std::int64_t>();
  const MemBytes& at = r.device.at_peak;
  const std::int64_t states = cat(at, MemCategory::params) + cat(at, MemCategory::grads) +
                              cat(at, MemCategory::master) + cat(at, MemCategory::optimizer_states);
  const std::int64_t rest = r.device.peak - states;
  std::string out = fmt::format(
      "DeepSpeed {} estimate_zero{}_model_states_mem_needs (Note [DeepSpeed's estimators]):\n"
      "  GPU per rank {} (model states only) vs zerocheck's step peak {}: model states {} "
      "(params {}, grads {}, fp32 master {}, optimizer states {}) + {} the formula does not count "
      "(ipg buckets {}, comm buffers {}, gathered {}, prefetch {}, persistent {}, activations {}, "
      "temporaries {})\n"
      "  CPU per node {} (x1.5 buffer factor) vs zerocheck's CPU peak {} per rank, {} per node\n",
      e.raw.value("deepspeed", "?"), r.stage, format_bytes(ds_gpu), format_bytes(r.device.peak),
      format_bytes(states), format_bytes(cat(at, MemCategory::params)),
      format_bytes(cat(at, MemCategory::grads)), format_bytes(cat(at, MemCategory::master)),
      format_bytes(cat(at, MemCategory::optimizer_states)), format_bytes(rest),
      format_bytes(cat(at, MemCategory::ipg_buckets)), format_bytes(cat(at, MemCategory::comm_buffers)),
      format_bytes(cat(at, MemCategory::gathered_params)), format_bytes(cat(at, MemCategory::prefetch)),
      format_bytes(cat(at, MemCategory::persistent)), format_bytes(cat(at, MemCategory::activations)),
      format_bytes(cat(at, MemCategory::temporaries)),
      format_bytes(row->at("cpu_bytes_per_node").get<std::int64_t>()), format_bytes(r.cpu.peak),
      format_bytes(r.cpu.peak * std::min(r.gpus_per_node, r.options.world)));
  if (r.experts > 0) {
    out += fmt::format(
        "  MoE: the formula counts every param as dense: all of them in 16 bits on every rank "
        "(the plan: the dense params and this rank's 1/{} of the experts) and their states "
        "partitioned over all {} ranks (the plan: the experts' over the {} ranks of each "
        "expert-data-parallel group)\n",
        r.ep_size, r.options.world, r.options.world / std::max(1, r.ep_size));
  }
  return out;
}

nlohmann::json deepspeed_json(const PlanResult& r, const DeepSpeedEstimates& e) {
  if (!e.available) return {{"available", false}, {"missing", e.missing}};
  const nlohmann::json* row = matching_row(r, e.raw);
  return {{"available", true}, {"estimates", e.raw}, {"matching", row ? *row : nlohmann::json()}};
}

}  // namespace zc::plan
