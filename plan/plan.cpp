// run_plan: the engine in meta mode on N simulated ranks (plan.h), and the --fit search.
//
// Note [Plan time model]
// A step's time is the simulated clock of the worst rank over the last simulated step: every
// device op is charged max(FLOPs / (peak x efficiency.compute), bytes / (HBM x efficiency.bus))
// (a roofline per op; no launch overhead); every collective takes the time NCCL's own tuning
// model gives the algorithm and protocol NCCL would choose for its size and group (Note [NCCL
// tuning model] in sim/nccl_tuning.h), from the node type's search graphs in hardware.json; where
// the file has none for the node (or --network / --gpus-per-node leave the node type), alpha x
// ring steps + bytes x nccl-tests' bus factor / (link x efficiency.bus), over NVLink inside a node
// and the NIC between nodes. A collective starts once every member issued it and every member's
// communication stream is free (a rank's collectives run one after another in its issue order,
// as on one NCCL stream: Note [Stream order] in sim/rendezvous.cpp). Time a rank
// spends blocked in wait() is exposed communication; the rest of the collective time overlapped
// compute (overlap_comm's async reductions, ZeRO-3's prefetch). Under offload the CPU side (the
// CPU device's FLOPs and bytes at the host's rates) and the PCIe transfers are added after the
// step, not overlapped (DeepSpeedCPUAdam runs on the step's critical path).
#include "plan/plan.h"

#include "engine/config.h"
#include "engine/errors.h"
#include "engine/host_device.h"
#include "props/training_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace zc::plan {

namespace {

// The FLOPs one micro-step's recomputation adds under gradient checkpointing (Note [Gradient
// checkpointing]): one rank's forward and backward of the model alone in meta mode, with it and
// without it. MFU counts the model's FLOPs, not the recomputation's (the step's time includes it).
std::int64_t recompute_flops(TransformerSpec model, DType dtype, std::int64_t micro_batch) {
  if (!model.gradient_checkpointing) return 0;
  std::int64_t flops[2] = {0, 0};
  for (const bool ckpt : {false, true}) {
    model.gradient_checkpointing = ckpt;
    MetaDevice dev, host;
    Transformer t(model);
    t.set_host_device(&host);
    Rng rng(0);
    t.init_params(dev, dtype, DataDomain::gaussian, ExactSpec{}, rng);
    const Batch b = upload_batch(dev, t.batch_shapes(micro_batch), dtype);
    const std::int64_t before = dev.counters().flops;
    t.forward(dev, b);
    t.backward(dev, 1.0, 1);
    flops[ckpt ? 1 : 0] = dev.counters().flops - before;
  }
  return flops[1] - flops[0];
}

std::string offload_name(const Config& c) {
  const bool opt = c.zero.offload_optimizer == OffloadDevice::cpu;
  const bool par = c.zero.offload_param == OffloadDevice::cpu && c.zero.stage == 3;
  if (opt && par) return "optimizer+param";
  if (opt) return "optimizer";
  if (par) return "param";
  return "none";
}

double peak_tflops(const GpuSpec& g, DType dt) {
  switch (dt) {
    case DType::bf16: return g.bf16_tflops;
    case DType::f16: return g.fp16_tflops;
    default: return g.fp32_tflops;
  }
}

// The workspace torch gives each cuBLAS handle and stream on its first matmul, from its caching
// allocator, so max_memory_allocated counts it (aten/src/ATen/cuda/CublasHandlePool.cpp,
// parseChosenWorkspaceSize without CUBLAS_WORKSPACE_CONFIG): 4096 KiB x 8 on Hopper, else
// 4096 KiB x 2 + 16 KiB x 8. Handles are per thread: the forward's and autograd's each take one
// (seen on an H200: 32 MiB after the first forward, 32 MiB more after the first backward).
std::int64_t torch_cublas_workspace_bytes(const GpuSpec& g) {
  return g.compute_capability >= 9.0 ? 4096LL * 8 * 1024 : 4096LL * 1024 * 2 + 16LL * 1024 * 8;
}

MemoryFigures figures(const props::DeviceMemory& m) {
  MemoryFigures f;
  f.peak = m.steps.peak_total();
  f.at_peak = m.steps.at_peak();
  f.category_peaks = m.steps.peak();
  f.construction_peak = m.construction.peak_total();
  f.peak_label = m.steps.peak_label();
  f.timeline = m.steps.timeline();
  f.per_step = m.per_step;
  return f;
}

// NCCL's graphs describe the node type as hardware.json gives it: its own network and size.
const NcclNodeSpec* nccl_node(const PlanOptions& o, const GpuSpec& g, const NetworkSpec& net, int gpus_per_node,
                              const Hardware& hw) {
  if (o.ring_collectives || g.nccl_node.empty() || net.key != g.inter_node || gpus_per_node != g.gpus_per_node) {
    return nullptr;
  }
  return &hw.nccl_node(g.nccl_node);
}

std::string collective_model(const PlanOptions& o, const GpuSpec& g, const NetworkSpec& net, int gpus_per_node,
                             const Hardware& hw) {
  if (const NcclNodeSpec* n = nccl_node(o, g, net, gpus_per_node, hw)) {
    return fmt::format("NCCL 2.30.7's tuning model on {} (nccl_nodes.{})", n->name, n->key);
  }
  if (o.ring_collectives) return "ring formula (--collectives ring)";
  if (g.nccl_node.empty()) {
    return fmt::format("ring formula: {} has no NCCL graphs in {}", g.key, hw.path);
  }
  return fmt::format("ring formula: NCCL's graphs in {} are for {} GPUs per node on {}, not {} on {}", hw.path,
                     g.gpus_per_node, g.inter_node, gpus_per_node, net.key);
}

sim::CostModel cost_model(const PlanOptions& o, const GpuSpec& g, const NetworkSpec& net, int gpus_per_node,
                          DType dt, const Hardware& hw) {
  sim::CostModel c;
  if (const NcclNodeSpec* n = nccl_node(o, g, net, gpus_per_node, hw)) {
    c.nccl = std::make_shared<const sim::NcclNode>(n->node);
  }
  c.device_tflops = peak_tflops(g, dt) * hw.compute_efficiency;
  c.device_gb_per_s = g.hbm_gb_per_s * hw.bus_efficiency;
  c.alpha_us = hw.nvlink_alpha_us;
  c.link_gb_per_s = g.nvlink_gb_per_s * hw.bus_efficiency;
  c.gpus_per_node = gpus_per_node;
  c.inter_alpha_us = net.alpha_us;
  c.inter_gb_per_s = net.gb_per_s * hw.bus_efficiency;
  return c;
}

// NCCL's choices for collectives of `kind` between two samples, most calls first.
std::vector<sim::NcclCalls> nccl_calls_between(const std::vector<sim::NcclCalls>& a,
                                               const std::vector<sim::NcclCalls>& b, CollectiveKind kind) {
  std::vector<sim::NcclCalls> out;
  for (const sim::NcclCalls& e : b) {
    if (e.kind != kind) continue;
    sim::NcclCalls d = e;
    for (const sim::NcclCalls& before : a) {
      if (before.kind == e.kind && before.algo == e.algo && before.proto == e.proto) {
        d.calls -= before.calls;
        d.bytes -= before.bytes;
        d.us -= before.us;
      }
    }
    if (d.calls > 0) out.push_back(d);
  }
  std::stable_sort(out.begin(), out.end(), [](const sim::NcclCalls& x, const sim::NcclCalls& y) {
    return x.calls > y.calls;
  });
  return out;
}

// One simulated rank's memory, collectives per step and clock split over the last step.
PlanResult::RankFigures rank_figures(const props::RunResult& run, std::size_t i, int steps) {
  PlanResult::RankFigures f;
  f.rank = run.ranks[i];
  f.device = figures(run.memory[i].device);
  f.cpu = figures(run.memory[i].cpu);
  // The world's collectives and, with MoE, the expert groups' (all_to_all, the experts' reductions).
  const CommStats& end = run.comm[i];
  const CommStats& init = run.comm_after_init[i];
  const CommStats& gend = run.group_comm[i];
  const CommStats& ginit = run.group_comm_after_init[i];
  for (int c = 0; c < kCollectiveKinds; ++c) {
    const auto j = static_cast<std::size_t>(c);
    const std::int64_t calls = end.by_kind[j].calls - init.by_kind[j].calls +
                               gend.by_kind[j].calls - ginit.by_kind[j].calls;
    if (calls == 0) continue;
    const std::int64_t bytes = end.by_kind[j].bytes - init.by_kind[j].bytes +
                               gend.by_kind[j].bytes - ginit.by_kind[j].bytes;
    f.collectives.push_back({static_cast<CollectiveKind>(c), calls / steps, bytes / steps, {}});
  }
  const std::vector<sim::RankTiming>& t = run.timing[i];
  ZC_ASSERT(t.size() == static_cast<std::size_t>(steps) + 1, "{} clock samples for {} steps",
            t.size(), steps);
  const sim::RankTiming& a = t[t.size() - 2];
  const sim::RankTiming& b = t.back();
  if (!run.nccl.empty() && !run.nccl[i].empty()) {
    const std::vector<std::vector<sim::NcclCalls>>& n = run.nccl[i];
    ZC_ASSERT(n.size() == t.size(), "{} NCCL samples for {} clock samples", n.size(), t.size());
    // Over the steps, per step, as the calls column (the first sample is after construction).
    for (CollectiveFigure& c : f.collectives) {
      c.nccl = nccl_calls_between(n.front(), n.back(), c.kind);
      for (sim::NcclCalls& e : c.nccl) {
        e.calls /= steps;
        e.bytes /= steps;
        e.us /= steps;
      }
      std::erase_if(c.nccl, [](const sim::NcclCalls& e) { return e.calls == 0; });  // under one a step
    }
  }
  f.compute_us = b.compute_us - a.compute_us;
  f.comm_us = b.comm_us - a.comm_us;
  f.wait_us = b.wait_us - a.wait_us;
  f.step_us = b.now_us - a.now_us;
  return f;
}

// The CPU side of offload over the steps (Note [Plan time model]): DeepSpeedCPUAdam's FLOPs and
// bytes at the host's rates, plus the PCIe transfers.
double offload_us(const DeviceCounters& cpu_ops, const OffloadStats& off, const HostSpec& host,
                  const Hardware& hw) {
  const double cpu_us = std::max(
      static_cast<double>(cpu_ops.flops) / (host.cpu_tflops * hw.compute_efficiency * 1e6),
      static_cast<double>(cpu_ops.bytes_read + cpu_ops.bytes_written) /
          (host.cpu_gb_per_s * hw.bus_efficiency * 1e3));
  const double pcie_us = static_cast<double>(off.to_cpu_bytes + off.to_device_bytes) /
                         (host.pcie_gb_per_s * hw.bus_efficiency * 1e3);
  return cpu_us + pcie_us;
}

}  // namespace

std::vector<int> representative_ranks(int world) {
  std::vector<int> r = {0, 1, world / 2, world - 1};
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  r.erase(std::remove_if(r.begin(), r.end(), [&](int x) { return x < 0 || x >= world; }), r.end());
  return r;
}

PlanResult run_plan(const PlanOptions& o, const Hardware& hw) {
  if (o.world < 1) throw ConfigError(fmt::format("--world-size {} must be at least 1", o.world));
  if (o.steps < 1 || o.steps > 4) throw ConfigError("plan runs 1 to 4 steps");
  PlanResult r;
  r.options = o;
  const GpuSpec& gpu = hw.gpu(o.gpu);
  r.gpus_per_node = o.gpus_per_node > 0 ? o.gpus_per_node : gpu.gpus_per_node;
  const NetworkSpec& net = hw.network(o.network.empty() ? gpu.inter_node : o.network);
  const HostSpec& host = hw.host(gpu.host);
  TransformerSpec model = o.model;
  if (o.seq) model.seq = *o.seq;
  model.blas_workspace_bytes = torch_cublas_workspace_bytes(gpu);
  if (const std::string why = model.invalid(); !why.empty()) {
    throw ConfigError(fmt::format("model {}: {}", model.preset, why));
  }
  // The user's config, checked for this world as DeepSpeed checks it (batch sizes name their keys).
  nlohmann::json cfg_json = o.ds_config;
  if (o.micro_batch) {
    cfg_json["train_micro_batch_size_per_gpu"] = *o.micro_batch;
    cfg_json.erase("train_batch_size");
  }
  const Config cfg = Config::from_json(cfg_json, o.world);
  if (model.checkpoint_function == CheckpointFunction::deepspeed) {  // deepspeed.checkpointing.configure
    const ActivationCheckpointingConfig& ac = cfg.activation_checkpointing;
    model.ds_partition_activations = ac.partition_activations;
    model.ds_contiguous_memory_optimization = ac.contiguous_memory_optimization;
    model.ds_cpu_checkpointing = ac.cpu_checkpointing;
    model.ds_number_checkpoints = ac.number_checkpoints;
    if (const std::string why = model.invalid(); !why.empty()) throw ConfigError(why);
  }
  r.warnings = cfg.warnings;
  if (!cfg.optimizer_given) {  // Note [No optimizer] in engine/engine.cpp
    throw ConfigError(fmt::format(
        "the ds_config has no \"optimizer\" block, so DeepSpeed 0.19.8 cannot train this config (ZeRO-1/2 refuse it at "
        "initialize; stage 0 and ZeRO-3 fail at the first backward or step) and plan has no step to measure; add the "
        "optimizer you train with, e.g. \"optimizer\": {{\"type\": \"AdamW\"}}, or name the client optimizer your "
        "script passes to deepspeed.initialize: --optimizer adamw --learning-rate LR"));
  }
  r.micro_batch = cfg.train_micro_batch_size_per_gpu > 0 ? cfg.train_micro_batch_size_per_gpu : 1;
  r.ga = static_cast<int>(cfg.gradient_accumulation_steps);
  r.stage = cfg.zero.stage;
  r.dtype = std::string(dtype_name(cfg.model_dtype()));
  r.offload = offload_name(cfg);
  r.seq = model.seq;
  r.params = model.param_count();
  r.largest_param = model.largest_param();
  r.experts = model.experts;
  r.ep_size = model.experts > 0 ? cfg.ep_size : 1;
  r.model_name = model.preset;
  r.gpu_name = gpu.name;
  r.network_name = net.name;
  r.collective_model = collective_model(o, gpu, net, r.gpus_per_node, hw);
  r.device_capacity = gpu.memory_bytes;
  r.memory_budget = std::min(o.memory_budget.value_or(gpu.memory_bytes), gpu.memory_bytes);
  if (peak_tflops(gpu, cfg.model_dtype()) <= 0) {
    throw ConfigError(fmt::format("{} has no {} peak in {} (it does not support that dtype)",
                                  gpu.name, r.dtype, hw.path));
  }

  props::RunSpec spec;
  spec.ds_config = cfg_json;
  spec.world = o.world;
  spec.steps = o.steps;
  spec.micro_batch = r.micro_batch;
  spec.domain = DataDomain::gaussian;
  spec.collect_grads = false;
  spec.record_values = false;
  spec.adam_simd_width = 16;
  spec.make_model = [model] { return std::make_unique<Transformer>(model); };
  if (model.experts > 0) {  // Note [MoE routing]: experts over groups of the config's moe.ep_size
    spec.ep_size = cfg.ep_size;
    spec.make_moe_model = [model](Comm& ep) {
      return std::make_unique<Transformer>(model, "transformer", &ep);
    };
  }
  spec.sim.meta = true;
  spec.sim.fiber_stack_bytes = 128 * 1024;
  spec.sim.limits.max_trace_events_kept = 0;
  spec.sim.limits.max_scheduler_steps = 2'000'000'000;
  spec.sim.cost = cost_model(o, gpu, net, r.gpus_per_node, cfg.model_dtype(), hw);
  spec.after_init = [](int, Engine& e) { e.device().memory().enable_timeline(kTimelineSamples); };
  // Expert-parallel groups need Comm::split, which representative ranks do not model: an MoE
  // model simulates every rank (up to the simulator's 8,192).
  r.representative = o.ranks == PlanOptions::Ranks::representative ||
                     (o.ranks == PlanOptions::Ranks::automatic && o.world > kFullSimulationRanks &&
                      model.experts == 0);
  if (r.representative && model.experts > 0) {
    throw ConfigError(fmt::format("{}: an MoE model's expert-parallel groups are not modelled under "
                                  "representative ranks; use --ranks all (up to 8,192 ranks)",
                                  model.preset));
  }
  if (r.representative) spec.sim.simulated_ranks = representative_ranks(o.world);
  r.schedule = o.schedule.value_or(sim::Schedule::decoupled);  // MoE's splits declared (props::moe_split)
  spec.sim.schedule = r.schedule;
  spec.sim.threads = kPlanThreads;
  const props::RunResult run = props::run_on_sim(spec);

  r.simulated_ranks = run.ranks;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < run.ranks.size(); ++i) {
    r.ranks.push_back(rank_figures(run, i, o.steps));
    if (r.ranks[i].device.peak > r.ranks[worst].device.peak) worst = i;
  }
  const PlanResult::RankFigures& w = r.ranks[worst];
  r.worst_rank = w.rank;
  r.device = w.device;
  r.cpu = w.cpu;
  r.fits = r.device.peak <= r.memory_budget && r.device.construction_peak <= r.memory_budget;
  r.collectives = w.collectives;
  r.compute_us = w.compute_us;
  r.comm_us = w.comm_us;
  r.exposed_comm_us = w.wait_us;
  r.overlap_us = std::max(0.0, r.comm_us - r.exposed_comm_us);
  r.offload_us = offload_us(run.step_cpu_ops[worst], run.step_offload[worst], host, hw) / o.steps;
  r.step_us = w.step_us + r.offload_us;
  r.flops_per_step = run.step_device_ops[worst].flops / o.steps;
  r.recompute_flops_per_step = recompute_flops(model, cfg.model_dtype(), r.micro_batch) * r.ga;
  r.kernels_per_step = run.step_device_ops[worst].kernels / o.steps;
  const double tokens = static_cast<double>(r.micro_batch * r.seq * r.ga) * o.world;
  r.tokens_per_s = r.step_us > 0 ? tokens / (r.step_us * 1e-6) : 0;
  r.mfu = r.step_us > 0 ? static_cast<double>(r.flops_per_step - r.recompute_flops_per_step) /
                              (r.step_us * 1e-6 * peak_tflops(gpu, cfg.model_dtype()) * 1e12)
                        : 0;
  r.config_summary = fmt::format("ZeRO-{} {} offload {} micro-batch {} x seq {} x GA {} (global batch {}){}{}{}",
                                 r.stage, r.dtype, r.offload, r.micro_batch, r.seq, r.ga, r.global_batch(),
                                 r.experts > 0 ? fmt::format(", {} experts over ep_size {}",
                                                             r.experts, r.ep_size)
                                               : std::string(),
                                 o.model.attention == AttentionMemory::fused ? ", fused attention" : "",
                                 model.checkpointing_summary());
  return r;
}

namespace {

// What a user can change to make a plan fit, from the settings it ran with; --fit tries the
// stage, offload and micro-batch ones.
std::string fit_levers(const PlanResult& r) {
  std::vector<std::string> levers;
  if (r.device.at_peak[static_cast<std::size_t>(MemCategory::activations)] > 0 && r.options.model.attention == AttentionMemory::materialised) {
    levers.push_back("--attention fused (FlashAttention-style memory)");
  }
  if (r.device.at_peak[static_cast<std::size_t>(MemCategory::activations)] > 0 && !r.options.model.gradient_checkpointing) {
    levers.push_back("--gradient-checkpointing (Hugging Face's, recomputing each layer in the backward)");
  }
  if (r.micro_batch > 1) levers.push_back(fmt::format("a micro-batch below {} (--micro-batch)", r.micro_batch));
  if (r.experts == 0 && r.stage < 3) levers.push_back(fmt::format("ZeRO-{} (zero_optimization.stage)", r.stage + 1));
  if (r.offload == "none" && r.stage > 0) levers.push_back("offload_optimizer to cpu");
  if (r.stage == 3 && r.offload.find("param") == std::string::npos) levers.push_back("offload_param to cpu");
  if (levers.empty()) return "; no lever left: more ranks, or a GPU with more memory (--gpu)";
  std::string out = "; levers: ";
  for (std::size_t i = 0; i < levers.size(); ++i) out += (i ? ", " : "") + levers[i];
  return out + "; --fit searches stage, offload, micro-batch and gradient checkpointing";
}

}  // namespace

std::string fit_message(const PlanResult& r) {
  const std::int64_t need = std::max(r.device.peak, r.device.construction_peak);
  if (need <= r.memory_budget) return "";
  std::vector<std::pair<std::int64_t, std::size_t>> cats;
  for (std::size_t k = 0; k < kMemCategories; ++k) cats.emplace_back(r.device.at_peak[k], k);
  std::sort(cats.rbegin(), cats.rend());
  std::string largest;
  for (std::size_t i = 0; i < 3 && i < cats.size() && cats[i].first > 0; ++i) {
    largest += fmt::format("{}{} {}", i ? ", " : "", mem_category_name(static_cast<MemCategory>(cats[i].second)),
                           format_bytes(cats[i].first));
  }
  return fmt::format("does not fit: rank {} needs {} of {}{} ({}{})", r.worst_rank, format_bytes(need),
                     format_bytes(r.memory_budget),
                     r.memory_budget < r.device_capacity
                         ? fmt::format(" (the --fit budget; the GPU has {})", format_bytes(r.device_capacity))
                         : std::string(),
                     r.device.construction_peak > r.device.peak ? "at construction; " : "",
                     "largest categories: " + largest) + fit_levers(r);
}

}  // namespace zc::plan

namespace zc::plan {

// Every stage x offload x gradient checkpointing (off, then on, unless the base asks for it),
// micro-batches 1, 2, 4, ... while they fit (memory grows with the micro-batch, so the first that
// does not fit ends that setting's search).
std::vector<FitCandidate> search_fits(const PlanOptions& base, const Hardware& hw,
                                      std::int64_t budget_bytes, std::vector<FitCandidate>* tried) {
  std::vector<FitCandidate> fits;
  const std::vector<std::pair<int, std::string>> settings = {
      {0, "none"}, {1, "none"}, {1, "optimizer"}, {2, "none"}, {2, "optimizer"},
      {3, "none"}, {3, "optimizer"}, {3, "optimizer+param"}};
  std::vector<bool> checkpointing = {true};
  if (!base.model.gradient_checkpointing) checkpointing.insert(checkpointing.begin(), false);
  for (const auto& [stage, offload] : settings) {
    for (const bool ckpt : checkpointing) {
      for (std::int64_t mb = 1; mb <= 64; mb *= 2) {
        PlanOptions o = base;
        o.micro_batch = mb;
        o.model.gradient_checkpointing = ckpt;
        nlohmann::json& z = o.ds_config["zero_optimization"];
        z["stage"] = stage;
        z.erase("offload_optimizer");
        z.erase("offload_param");
        if (offload != "none") z["offload_optimizer"] = {{"device", "cpu"}};
        if (offload == "optimizer+param") z["offload_param"] = {{"device", "cpu"}};
        o.memory_budget = budget_bytes;
        FitCandidate c{stage, offload, mb, ckpt, run_plan(o, hw)};
        if (tried) tried->push_back(c);
        if (!c.result.fits) break;
        fits.push_back(std::move(c));
      }
    }
  }
  std::sort(fits.begin(), fits.end(), [](const FitCandidate& a, const FitCandidate& b) {
    return a.result.tokens_per_s > b.result.tokens_per_s;
  });
  return fits;
}

}  // namespace zc::plan
