// zerocheck plan: "will this config fit, and how fast, at N ranks?" answered by the engine itself.
// One or two training steps of the real ZeRO code run in meta mode (shapes only, Note [Meta mode])
// on N simulated ranks; every allocation is counted by category (engine/memory.h), every
// collective is timed by the alpha-beta model over a two-level topology (sim/cost_model.h), and
// compute by the meta FLOP and byte counts at the device's stated peak and efficiency. Device,
// network and host figures come from one data file with their sources (plan/hardware.json).
#pragma once

#include "engine/comm.h"
#include "engine/memory.h"
#include "models/transformer.h"
#include "sim/sim_cluster.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace zc::plan {

// ---- hardware (plan/hardware.json) ----
struct GpuSpec {
  std::string key, name;
  std::int64_t memory_bytes = 0;
  double compute_capability = 0;  // 9.0 for Hopper
  double bf16_tflops = 0, fp16_tflops = 0, fp32_tflops = 0;
  double hbm_gb_per_s = 0, nvlink_gb_per_s = 0;
  int gpus_per_node = 8;
  std::string inter_node, host;  // keys of networks and hosts
  std::string nccl_node;         // key of nccl_nodes; "": collectives on the ring formula
};
// What NCCL's topology search finds on a node type (Note [NCCL tuning model]).
struct NcclNodeSpec {
  std::string key, name;
  sim::NcclNode node;
};
struct NetworkSpec {
  std::string key, name;
  double gb_per_s = 0, alpha_us = 0;
};
struct HostSpec {
  std::string key, name;
  double cpu_gb_per_s = 0, cpu_tflops = 0, pcie_gb_per_s = 0;
};
struct Hardware {
  std::vector<GpuSpec> gpus;
  std::vector<NetworkSpec> networks;
  std::vector<HostSpec> hosts;
  std::vector<NcclNodeSpec> nccl_nodes;
  double nvlink_alpha_us = 0;
  double compute_efficiency = 0, bus_efficiency = 0;
  std::string path;
  const GpuSpec& gpu(const std::string& key) const;  // ConfigError naming the known keys
  const NetworkSpec& network(const std::string& key) const;
  const HostSpec& host(const std::string& key) const;
  const NcclNodeSpec& nccl_node(const std::string& key) const;
};
// The file's default location (the source tree's plan/hardware.json), overridable.
std::string default_hardware_path();
Hardware load_hardware(const std::string& path);

// ---- a plan ----
struct PlanOptions {
  nlohmann::json ds_config;  // the user's ds_config.json
  TransformerSpec model;
  int world = 8;
  std::string gpu = "h100";
  int gpus_per_node = 0;        // 0: the GPU's node default
  std::string network;          // "": the GPU's node default
  std::optional<std::int64_t> micro_batch;  // else the config's
  std::optional<std::int64_t> seq;          // else the model's
  int steps = 2;
  // Simulate every rank, or only a few representative ones (Note [Representative ranks]);
  // auto: all up to kFullSimulationRanks.
  enum class Ranks : std::uint8_t { automatic, all, representative } ranks = Ranks::automatic;
  // How the simulated ranks take turns (Note [Decoupled schedule] in sim/sim_cluster.h); unset:
  // decoupled, or interleaved for an MoE model (its expert-parallel groups need split()).
  std::optional<sim::Schedule> schedule;
  // Time collectives by the ring formula even where the node type has NCCL graphs (--collectives
  // ring: the model before NCCL's, for comparison).
  bool ring_collectives = false;
  // The memory a rank may use (--fit GiB); unset: the GPU's capacity. Never above the capacity
  // (a larger budget is the caller's to refuse or cap: cli/plan.cpp warns and caps).
  std::optional<std::int64_t> memory_budget;
};
inline constexpr int kFullSimulationRanks = 4096;  // about 7 s for Llama-2 7B at ZeRO-3 (decoupled)
// Threads a decoupled plan runs its ranks on (SimOptions::threads; the figures do not depend on it).
inline constexpr int kPlanThreads = 2;
inline constexpr std::size_t kTimelineSamples = 240;  // per device, over the steps  // above it, automatic mode is representative

// Note [Representative ranks] (sim/sim_cluster.h): the ranks a representative plan simulates,
// the first two, the middle one and the last (where partitions and padding differ).
std::vector<int> representative_ranks(int world);

struct MemoryFigures {  // one device's step peak
  std::int64_t peak = 0;
  MemBytes at_peak{};   // composition at that peak
  MemBytes category_peaks{};
  std::int64_t construction_peak = 0;
  std::string peak_label;  // the allocation that set the peak
  std::vector<MemSample> timeline;  // live bytes by category over the steps (bounded, decimated)
  // Per simulated step: its own peak, live bytes after its first forward and after its step (what
  // reference/deepspeed/gpu_memory.py reads from torch on a GPU).
  std::vector<StepMemory> per_step;
};
struct CollectiveFigure {
  CollectiveKind kind;
  std::int64_t calls = 0, bytes = 0;  // per step, this rank
  // NCCL's choices for these calls, per step as calls (Note [NCCL tuning model]), most calls
  // first; empty where the ring formula timed them (all_to_all, or no NCCL model for the node).
  std::vector<sim::NcclCalls> nccl;
};
struct PlanResult {
  PlanOptions options;
  std::string model_name, config_summary, gpu_name, network_name;
  std::int64_t params = 0, largest_param = 0;
  int stage = 0, gpus_per_node = 8, ga = 1;
  int experts = 0, ep_size = 1;  // MoE (Note [MoE routing] in models/transformer.h)
  std::int64_t micro_batch = 1, seq = 1;
  std::string dtype, offload;  // "bf16", "none" | "optimizer" | "optimizer+param" | "param"
  bool representative = false;
  sim::Schedule schedule = sim::Schedule::decoupled;
  std::vector<int> simulated_ranks;
  int worst_rank = 0;            // the simulated rank with the largest device peak
  // Every simulated rank's figures (by simulated_ranks), the clock split of its last step.
  struct RankFigures {
    int rank = 0;
    MemoryFigures device, cpu;
    double compute_us = 0, comm_us = 0, wait_us = 0, step_us = 0;
    std::vector<CollectiveFigure> collectives;
  };
  std::vector<RankFigures> ranks;
  MemoryFigures device, cpu;     // of worst_rank
  std::int64_t device_capacity = 0;
  std::int64_t memory_budget = 0;  // what fits is judged against: the capacity, or --fit's budget
  bool fits = true;                // the one verdict the table, JSON and HTML all show
  std::vector<CollectiveFigure> collectives;  // worst_rank's, per step
  // Time of one step (the last simulated one), in us, worst_rank's: compute, collective time on
  // its communication stream, the time it sat blocked in collectives (communication not hidden
  // behind compute, and waiting for slower ranks), and the CPU side of offload (CPU Adam, PCIe).
  double step_us = 0, compute_us = 0, comm_us = 0, exposed_comm_us = 0, overlap_us = 0;
  double offload_us = 0;
  std::int64_t flops_per_step = 0;  // executed on the largest rank, recomputation included
  std::int64_t recompute_flops_per_step = 0;  // gradient checkpointing's recomputation
  std::int64_t kernels_per_step = 0;  // device ops the step launched (meta counts them)
  double tokens_per_s = 0;  // micro_batch * seq * ga * world / step time
  // DeepSpeed's train_batch_size: micro-batch x GA x data-parallel ranks.
  std::int64_t global_batch() const { return micro_batch * ga * options.world; }
  double mfu = 0;           // model FLOPs (no recomputation) / (step time * peak), the plan's own figure
  std::string notes;        // how the figures were made
  std::string collective_model;  // how collectives were timed (NCCL's model, or the ring formula and why)
  std::vector<std::string> warnings;  // the config's (Config::warnings), as `zerocheck run` prints them
};

// Runs the plan. ConfigError / NotImplementedError for what the engine or DeepSpeed refuses
// (MoE at stages 0/3, a world the batch sizes cannot divide); a config that does not fit is a
// result with fits = false, not an error.
PlanResult run_plan(const PlanOptions& o, const Hardware& hw);
// "does not fit: rank r needs X GiB of Y (largest categories ...; levers: ...)", or "" when it fits.
std::string fit_message(const PlanResult& r);

// --fit GiB: every stage, offload and micro-batch setting that fits the budget, fastest first.
struct FitCandidate {
  int stage = 0;
  std::string offload;
  std::int64_t micro_batch = 1;
  bool gradient_checkpointing = false;
  PlanResult result;
};
std::vector<FitCandidate> search_fits(const PlanOptions& base, const Hardware& hw,
                                      std::int64_t budget_bytes, std::vector<FitCandidate>* tried);

// ---- DeepSpeed's estimators, beside the plan ----
// estimate_zero2_model_states_mem_needs and estimate_zero3_model_states_mem_needs of the installed
// DeepSpeed (reference/deepspeed/estimators.py in the reference environment of scripts/ds-env.sh).
struct DeepSpeedEstimates {
  bool available = false;
  std::string missing;   // why not, when !available
  nlohmann::json raw;    // the script's output
};
DeepSpeedEstimates deepspeed_estimates(const PlanResult& r);
// The estimator row matching the plan's stage and offload, next to zerocheck's categories, and
// what each difference is. Empty when there is no DeepSpeed estimator for the stage (0 and 1).
std::string compare_with_deepspeed(const PlanResult& r, const DeepSpeedEstimates& e);
nlohmann::json deepspeed_json(const PlanResult& r, const DeepSpeedEstimates& e);

// ---- output ----
std::string to_text(const PlanResult& r);
nlohmann::json to_json(const PlanResult& r);
std::string to_html(const std::vector<PlanResult>& plans, const std::string& title);

}  // namespace zc::plan
