// A training run on the simulated cluster, shared by the tests, the properties and the CLI: every
// rank builds the same model, trains `steps` steps of GA micro-steps with N backward chunks each,
// and records what the verifiers compare. The global batch of each (step, micro, chunk) is drawn
// once from the seed; rank r trains on samples [r*B, (r+1)*B) of it, so a world-1 run with
// micro-batch W*B sees exactly the same data.
#pragma once

#include "engine/engine.h"
#include "sim/sim_cluster.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>

namespace zc::props {

struct RunSpec {
  nlohmann::json ds_config;  // train_micro_batch_size_per_gpu is set from micro_batch
  int world = 1;
  std::function<std::unique_ptr<Model>()> make_model;
  int steps = 2;
  int n_backward = 1;  // backward chunks per micro-step
  // Multi-backward as DeepSpeed formalised it (#7665): set_gradient_accumulation_boundary(false)
  // before every backward but the last of a step. When false, the boundary follows micro_steps
  // and GA, so all N backwards of the last micro-step are at the boundary.
  bool explicit_boundary = true;
  // Run each step's N backwards inside Engine::coalesce_grad_reduction (GA must be 1).
  bool coalesce = false;
  // MoE: ep_size > 0 splits the world into expert-parallel groups of ep_size consecutive ranks
  // and expert-data-parallel groups across them, and builds the model with make_moe_model.
  int ep_size = 0;
  std::function<std::unique_ptr<Model>(Comm& ep)> make_moe_model;
  // engine.compile() right after construction, with this loader factory for the runtime.
  std::optional<CompileConfig> compile;
  std::function<std::unique_ptr<RuntimeLoader>()> make_loader;
  std::int64_t micro_batch = 2;
  DataDomain domain = DataDomain::exact;
  ExactSpec exact;
  std::uint64_t seed = 1;
  std::uint64_t sched_seed = 0;  // the simulator's interleaving; 0 = seed
  bool same_batch_every_step = false;
  bool collect_grads = true;  // gather full grads each step (a collective; off for plain training)
  // Read back params and masters after each step (params: a collective at ZeRO-3). Off: the
  // record has no values and the run's memory and collectives are the engine's alone. A meta
  // run (sim.meta) never reads back.
  bool record_values = true;
  // With record_values: gather every param's fp32 master and optimizer state after each step
  // (RunResult::state; collectives, counted apart as the getters' are). The DeepSpeed comparison
  // sets it.
  bool collect_optimizer_state = false;
  BugSet bugs;
  // Options::adam_simd_width. 1 here, a position-independent Adam (every element in the vector
  // body's order), so that I1 compares partitionings, not where each rank's vector tail falls:
  // with DeepSpeed's real build (16 on AVX-512) Adam's bits move with the partition boundaries
  // (SPEC 5, I1). The DeepSpeed comparison sets the width DeepSpeed was built with.
  int adam_simd_width = 1;
  // Options::torch_sqrt: the DeepSpeed comparison sets what torch runs on this machine.
  TorchSqrt torch_sqrt = TorchSqrt::correctly_rounded;
  // sim.meta: a meta run (Note [Meta mode]): batches from batch_shapes(), nothing read back, so
  // the record holds no values; its memory and collectives are what the run is for.
  sim::SimOptions sim;
  // engine.destroy() after the last step (the lifecycle I3 checks).
  bool destroy_at_end = false;
  // Count the device and the CPU side as one memory too (RankMemory::both; Note [The device and
  // the CPU as one memory] in training_run.cpp): the DeepSpeed comparison sets it under offload,
  // whose reference holds both in one memory. One more ledger update per allocation, so off else.
  bool one_memory = false;
  // Called on every rank once its Engine is built, before compile() and training (e.g. to
  // register_external_parameter).
  std::function<void(int, Engine&)> after_init;
  // Called on every rank after each step with (rank, step, engine, this rank's mean loss).
  std::function<void(int, int, Engine&, double)> after_step;
};

// One device's memory over a run (memory.h): the ledger as construction left it (the model built
// and the engine initialised), and as the steps left it, its high-water marks counted from the
// end of construction; with the allocator's own stats where the device keeps them (HostDevice).
struct DeviceMemory {
  MemoryLedger construction, steps;
  std::vector<StepMemory> per_step;
  std::optional<AllocatorStats> allocator_construction, allocator_steps;
};
struct RankMemory {
  DeviceMemory device;  // the accelerator (the rank's Device)
  DeviceMemory cpu;     // the CPU side of offload (RankContext::cpu)
  // Both as one memory, where RunSpec::one_memory asked for it (Note [The device and the CPU as
  // one memory] in training_run.cpp): what a CPU-only run of the same code holds.
  std::optional<DeviceMemory> both;
};

struct RunResult {
  std::vector<std::vector<double>> params;  // [step] rank 0's full params after the step
  std::vector<std::vector<double>> grads;   // [step] rank 0's full averaged grads before it
  std::vector<std::vector<double>> masters; // [step] rank 0's fp32 master partition after it
  std::vector<double> losses;               // [step] rank 0's mean loss over the step's backwards
  std::vector<double> loss_scales;          // [step] the loss scale the step's grads carry
  std::vector<int> flush_micro_step_ids;    // [step] rank 0's micro_step_id at the coalesce flush
  std::vector<std::int64_t> skipped_steps;  // [step] rank 0's engine.skipped_steps() after it
  // RunSpec::collect_optimizer_state: by DeepSpeed's name ("fp32", "exp_avg", "exp_avg_sq",
  // "momentum_buffer"; only what the optimizer keeps), [step] every param's full state after it.
  std::map<std::string, std::vector<std::vector<double>>> state;
  bool ranks_agree = true;                  // every rank held rank 0's params and grads
  std::string disagreement;                 // the first difference, if any
  std::vector<CommStats> comm;              // per rank, at the end
  std::vector<CommStats> engine_comm;       // per rank: comm and group_comm less the record's own getters (full grads/params)
  // The simulated ranks (every rank, or SimOptions::simulated_ranks); every per-rank vector
  // here is indexed like it (by rank in a full run).
  std::vector<int> ranks;
  std::vector<RankMemory> memory;           // per rank
  // Per rank: the clock after construction, then after each step (timing[r][s + 1]).
  std::vector<std::vector<sim::RankTiming>> timing;
  std::vector<std::vector<std::vector<sim::NcclCalls>>> nccl;  // per rank, NCCL's choices at each sample
  std::vector<CommStats> comm_after_init;   // per rank: the collectives of construction
  // Per rank, MoE: the expert-parallel and expert-data-parallel groups' collectives (not in comm,
  // which is the world's), at the end and after construction.
  std::vector<CommStats> group_comm, group_comm_after_init;
  // Per rank: the steps' device ops, CPU-side ops and offload transfers (RankRecord's).
  std::vector<DeviceCounters> step_device_ops, step_cpu_ops;
  std::vector<OffloadStats> step_offload;
  sim::SimResult sim;
};

// One rank's record of a run.
struct RankRecord {
  std::vector<std::vector<double>> params, grads, masters;
  std::vector<double> losses, loss_scales;
  std::vector<int> flush_micro_step_ids;
  std::vector<std::int64_t> skipped_steps;
  std::map<std::string, std::vector<std::vector<double>>> state;
  CommStats comm;
  CommStats getter_comm;  // the collectives of full_grads()/full_params() (part of comm)
  CommStats group_comm, group_comm_after_init;  // MoE groups' (RunResult::group_comm)
  RankMemory memory;
  // What the steps did (construction excluded): the device's and the CPU side's kernels, FLOPs
  // and bytes; the transfers between them under offload.
  DeviceCounters step_device_ops, step_cpu_ops;
  OffloadStats step_offload;
};

RunResult run_on_sim(const RunSpec& spec);

// The expert groups of an MoE run (spec.ep_size > 0), DeepSpeed's layout: the world's split 0
// gives the expert-parallel groups (blocks of ep_size consecutive ranks), its split 1 the
// expert-data-parallel groups (the ranks at one index of their blocks). train() makes them with
// these arguments, and run_on_sim declares them to the decoupled schedule.
sim::SplitArgs moe_split(int nth, int rank, int ep_size);
// The same training on one rank of any backend (MPI processes, GPUs): every rank calls it with
// its own Device and its world Comm; data and init are drawn from the seed exactly as on the
// simulator, so the records compare bit for bit.
// `cpu` is the CPU side of offload (null: the optimizer's own host memory).
RankRecord train_rank(const RunSpec& spec, int rank, Device& dev, Comm& world, Trace* trace,
                      Device* cpu = nullptr);
// The model every rank of the run starts from: built, and initialised on `dev` in `dtype` from the
// spec's seed (the DeepSpeed reference writes these weights for its twin).
std::unique_ptr<Model> initial_model(const RunSpec& spec, Device& dev, DType dtype);
// The ds_config as the run uses it (micro-batch set from the spec).
nlohmann::json effective_config(const RunSpec& spec);
// The global batch of (step, micro, chunk), exactly as run_on_sim draws it.
HostBatch global_batch(const RunSpec& spec, const Model& model, int step, int micro, int chunk);
// The same spec as a single rank on the global batch (world 1, micro-batch W*B).
RunSpec single_rank_reference(const RunSpec& spec);

// The analytic averaged gradient of a model with prescribed per-sample gradients (Synthetic,
// TreeModel: batch arrays g0, g1, ... in parameter order): per element, the loss-scaled mean over
// the global batch, summed over the step's GA micro-steps and N chunks, divided by GA (SPEC 2: N
// backwards SUM); and the same sum of absolute values, the scale of any rounding error.
struct GradOracle {
  std::vector<double> value, abs_sum;
};
GradOracle prescribed_grad_oracle(const RunSpec& spec, int ga, double loss_scale, int step,
                                  bool pytorch_sum = false);
// DeepSpeed's ZeRO-1/2, N >= 2 backwards and the implicit boundary: the step sees only the last
// backward's gradient (Note [Implicit boundary keeps the last backward]), except with a 16-bit
// model and fp32 accumulation, which sums. UsageError under offload_optimizer (not modelled here).
bool keeps_last_backward_only(const RunSpec& spec);

// The first index where a and b differ bit for bit (NaNs compare equal), or where one ends.
std::optional<std::size_t> first_mismatch(const std::vector<double>& a, const std::vector<double>& b);
// The element rule first_mismatch applies: different bits, unless both are NaN.
bool bits_differ(double a, double b);
// "param.name[local index]" for an index into full_params()/full_grads() of `model`.
std::string param_element_name(Model& model, std::int64_t flat_index);

// "" if a and b are bit-identical, else the first difference (index, both values and bits).
std::string first_difference(const std::vector<double>& a, const std::vector<double>& b,
                             DType dtype);

}  // namespace zc::props
