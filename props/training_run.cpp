// The simulated training run behind the parity tests.
#include "props/training_run.h"

#include "engine/errors.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

namespace zc::props {

namespace {

std::uint64_t batch_stream(int step, int micro, int chunk) {
  return 0x1000000ull + static_cast<std::uint64_t>(step) * 1000000ull +
         static_cast<std::uint64_t>(micro) * 1000ull + static_cast<std::uint64_t>(chunk);
}

}  // namespace

bool bits_differ(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) != std::bit_cast<std::uint64_t>(b) && !(std::isnan(a) && std::isnan(b));
}

std::optional<std::size_t> first_mismatch(const std::vector<double>& a, const std::vector<double>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (bits_differ(a[i], b[i])) return i;
  }
  if (a.size() != b.size()) return n;
  return std::nullopt;
}

std::string first_difference(const std::vector<double>& a, const std::vector<double>& b, DType dtype) {
  if (a.size() != b.size()) return fmt::format("sizes differ: {} vs {}", a.size(), b.size());
  const std::optional<std::size_t> i = first_mismatch(a, b);
  if (!i) return "";
  return fmt::format("index {}: {} (0x{:016x}) vs {} (0x{:016x}) [{}]", *i, a[*i],
                     std::bit_cast<std::uint64_t>(a[*i]), b[*i], std::bit_cast<std::uint64_t>(b[*i]),
                     dtype_name(dtype));
}

std::string param_element_name(Model& model, std::int64_t flat_index) {
  std::int64_t at = 0;
  for (const Parameter* p : model.named_parameters()) {
    if (flat_index < at + p->numel()) return fmt::format("{}[{}]", p->name, flat_index - at);
    at += p->numel();
  }
  return fmt::format("element {}", flat_index);
}

HostBatch global_batch(const RunSpec& spec, const Model& model, int step, int micro, int chunk) {
  Rng data_rng = Rng(spec.seed).split(batch_stream(spec.same_batch_every_step ? 0 : step, micro, chunk));
  return model.make_batch(data_rng, spec.micro_batch * spec.world, spec.domain, spec.exact);
}

bool keeps_last_backward_only(const RunSpec& spec) {
  if (spec.explicit_boundary || spec.coalesce || spec.n_backward < 2) return false;
  const Config cfg = Config::from_json(effective_config(spec), spec.world);
  if (cfg.zero.stage != 1 && cfg.zero.stage != 2) return false;
  // A 16-bit model with fp32 accumulation sums: ZeRO-1 + bf16 runs BF16_Optimizer, and otherwise
  // DeepSpeed's compact fp32 grad-partition buffer only step() clears.
  if (cfg.model_dtype() != DType::f32 && cfg.accumulation_dtype() == DType::f32) return false;
  if (cfg.zero.offload_optimizer != OffloadDevice::none) {
    // copy_grads_in_partition's own gate decides there (SPEC 4); this oracle does not model it.
    throw UsageError("the gradient oracle does not model offload's implicit-boundary accumulation; use "
                     "the explicit boundary or compare against DeepSpeed");
  }
  return true;
}

GradOracle prescribed_grad_oracle(const RunSpec& spec, int ga, double loss_scale, int step, bool pytorch_sum) {
  GradOracle o;
  const std::unique_ptr<Model> model = spec.make_model();
  const bool last_only = !pytorch_sum && keeps_last_backward_only(spec);
  for (int m = 0; m < ga; ++m) {
    for (int c = 0; c < spec.n_backward; ++c) {
      if (last_only && (m != ga - 1 || c != spec.n_backward - 1)) {  // still sized: every chunk has every param
        const HostBatch hb = global_batch(spec, *model, step, m, c);
        std::size_t at = 0;
        for (int id = 0; hb.arrays.contains(fmt::format("g{}", id)); ++id) at += static_cast<std::size_t>(hb.arrays.at(fmt::format("g{}", id)).shape[1]);
        if (o.value.size() < at) o.value.resize(at, 0.0), o.abs_sum.resize(at, 0.0);
        continue;
      }
      const HostBatch hb = global_batch(spec, *model, step, m, c);
      std::size_t at = 0;
      for (int id = 0; hb.arrays.contains(fmt::format("g{}", id)); ++id) {  // parameter order
        const HostArray& a = hb.arrays.at(fmt::format("g{}", id));
        const std::int64_t cols = a.shape[1];
        const std::size_t need = at + static_cast<std::size_t>(cols);
        if (o.value.size() < need) o.value.resize(need, 0.0), o.abs_sum.resize(need, 0.0);
        const double w = loss_scale / static_cast<double>(hb.samples) / ga;
        for (std::int64_t j = 0; j < cols; ++j) {
          double sum = 0, abs = 0;
          for (std::int64_t r = 0; r < hb.samples; ++r) {
            const double g = a.values[static_cast<std::size_t>(r * cols + j)];
            sum += g;
            abs += std::fabs(g);
          }
          o.value[at + static_cast<std::size_t>(j)] += sum * w;
          o.abs_sum[at + static_cast<std::size_t>(j)] += abs * w;
        }
        at = need;
      }
    }
  }
  return o;
}

RunSpec single_rank_reference(const RunSpec& spec) {
  RunSpec ref = spec;
  ref.world = 1;
  ref.micro_batch = spec.micro_batch * spec.world;
  if (spec.ep_size > 0) ref.ep_size = 1;
  ref.after_step = nullptr;
  return ref;
}

nlohmann::json effective_config(const RunSpec& spec) {
  nlohmann::json j = spec.ds_config;
  j["train_micro_batch_size_per_gpu"] = spec.micro_batch;
  j.erase("train_batch_size");
  return j;
}

namespace {

// Draws each global batch once and lets `world` ranks slice it (on the simulator, where ranks
// share memory; a real process has its own cache and slices it itself).
class BatchCache {
 public:
  BatchCache(const RunSpec& spec, int consumers) : spec_(spec), consumers_(consumers) {}
  HostBatch slice_for(const Model& model, int s, int m, int c, int rank) {
    const std::lock_guard<std::mutex> lock(mutex_);  // ranks on threads (SimOptions::threads)
    const auto key = std::make_tuple(s, m, c);
    auto it = batches_.find(key);
    if (it == batches_.end()) it = batches_.emplace(key, std::make_pair(global_batch(spec_, model, s, m, c), 0)).first;
    HostBatch mine = it->second.first.slice(rank * spec_.micro_batch, spec_.micro_batch);
    if (++it->second.second == consumers_) batches_.erase(it);
    return mine;
  }

 private:
  const RunSpec& spec_;
  int consumers_;
  std::mutex mutex_;
  std::map<std::tuple<int, int, int>, std::pair<HostBatch, int>> batches_;
};

void init_model(const RunSpec& spec, Model& model, Device& dev, DType dtype) {
  Rng init_rng = Rng(spec.seed).split(7);
  model.init_params(dev, dtype, spec.domain, spec.exact, init_rng);
}

// into += sign * s, kind by kind.
void add(CommStats& into, const CommStats& s, std::int64_t sign = 1) {
  for (std::size_t k = 0; k < into.by_kind.size(); ++k) {
    into.by_kind[k].calls += sign * s.by_kind[k].calls;
    into.by_kind[k].bytes += sign * s.by_kind[k].bytes;
  }
}

// The calls of every group the engine issues on (the world, and MoE's groups when present),
// summed: DeepSpeed's reference counts every call whatever its group.
using Groups = std::vector<const Comm*>;
CommStats summed(const Groups& groups) {
  CommStats s;
  for (const Comm* c : groups) {
    if (c != nullptr) add(s, c->stats());
  }
  return s;
}

// Adds what `body` issued on `groups` to `into` (the record's getters, which DeepSpeed's reference
// does not count either).
template <class F>
auto counted_apart(const Groups& groups, CommStats& into, F&& body) {
  const CommStats before = summed(groups);
  auto result = body();
  add(into, summed(groups));
  add(into, before, -1);
  return result;
}

DeviceCounters minus(const DeviceCounters& a, const DeviceCounters& b) {
  return {a.kernels - b.kernels, a.flops - b.flops, a.bytes_read - b.bytes_read,
          a.bytes_written - b.bytes_written, a.bytes_allocated - b.bytes_allocated};
}

DeviceMemory snapshot(const Device& dev) {
  DeviceMemory m;
  m.construction = dev.memory();
  if (const AllocatorStats* a = dev.allocator_stats()) m.allocator_construction = *a;
  return m;
}

void finish(DeviceMemory& m, const Device& dev) {
  m.steps = dev.memory();
  if (const AllocatorStats* a = dev.allocator_stats()) m.allocator_steps = *a;
}

// The MoE groups' collectives, summed (nothing without them).
CommStats group_stats(const Comm* ep, const Comm* edp) { return summed({ep, edp}); }

// Every param's fp32 master and optimizer state, by DeepSpeed's names, counted apart.
void record_state(const Config& cfg, Engine& engine, const Groups& groups, RankRecord& rec) {
  const bool sgd = cfg.optimizer.type == OptimizerType::sgd;
  const std::pair<const char*, OptimizerState> kinds[] = {
      {"fp32", OptimizerState::fp32_master},
      {sgd ? "momentum_buffer" : "exp_avg", OptimizerState::exp_avg},
      {"exp_avg_sq", OptimizerState::exp_avg_sq}};
  for (const auto& [name, what] : kinds) {
    std::vector<double> v = counted_apart(groups, rec.getter_comm, [&] { return engine.full_optimizer_state(what); });
    if (!v.empty()) rec.state[name].push_back(std::move(v));
  }
}

RankRecord train(const RunSpec& spec, int rank, Device& dev, Comm& world, Trace* trace,
                 BatchCache& cache, Device* cpu);

}  // namespace

sim::SplitArgs moe_split(int nth, int rank, int ep_size) {
  ZC_ASSERT(ep_size > 0 && (nth == 0 || nth == 1), "MoE split {} with ep_size {}", nth, ep_size);
  return nth == 0 ? sim::SplitArgs{rank / ep_size, rank} : sim::SplitArgs{rank % ep_size, rank};
}

namespace {

// Note [The device and the CPU as one memory]
// Under offload the engine keeps two ledgers, the accelerator's and the CPU's, as a GPU run has two
// memories. DeepSpeed's reference runs on the CPU accelerator, where the two are one: its peak
// is the peak of their sum, and a category's peak (params at construction: the full params on the
// device, then the partition on the CPU) is not the sum of the two ledgers' peaks, which need not
// come at the same moment. So where the run asks for it (RunSpec::one_memory: the reference's
// memory comparison under offload), a third ledger counts every allocation and free of both
// devices from the start of the run (RankMemory::both), with its own per-step figures.
struct OneMemory {
  std::shared_ptr<MemoryLedger> both;
  Device *dev = nullptr, *cpu = nullptr;
  OneMemory(Device& d, Device* c, bool wanted) {
    if (c == nullptr || !wanted) return;
    dev = &d, cpu = c, both = std::make_shared<MemoryLedger>();
    for (std::size_t k = 0; k < kMemCategories; ++k) {  // what either holds already
      const std::int64_t live = d.memory().live()[k] + c->memory().live()[k];
      if (live > 0) both->on_alloc(static_cast<MemCategory>(k), live, "(before the run)");
    }
    both->reset_peak();
    d.memory().also_count_in(both);
    c->memory().also_count_in(both);
  }
  ~OneMemory() {
    if (dev != nullptr) dev->memory().also_count_in(nullptr), cpu->memory().also_count_in(nullptr);
  }
  OneMemory(const OneMemory&) = delete;
  OneMemory& operator=(const OneMemory&) = delete;
};

// One ledger's figures for one step (StepMemory): its peak over the step, its live bytes after
// the step's first forward and after the optimizer step. A null ledger records nothing.
struct StepWindow {
  MemoryLedger* ledger;
  StepMemory fig{};
  explicit StepWindow(MemoryLedger* l) : ledger(l) {
    if (ledger != nullptr) ledger->reset_window_peak();
  }
  void after_forward() {
    if (ledger != nullptr) fig.after_forward = ledger->live_total();
  }
  void close(std::vector<StepMemory>& per_step) {
    if (ledger == nullptr) return;
    fig.peak = ledger->window_peak();
    fig.after_step = ledger->live_total();
    per_step.push_back(fig);
  }
};

RankRecord train(const RunSpec& spec, int rank, Device& dev, Comm& world, Trace* trace,
                 BatchCache& cache, Device* cpu) {
  const int W = world.size();
  const bool meta = dev.placement() == Placement::meta;
  const bool read_back = spec.record_values && !meta;
  RankRecord rec;
  const OneMemory one(dev, cpu, spec.one_memory);
  const Config cfg = Config::from_json(effective_config(spec), W);
  std::unique_ptr<Comm> ep, edp;
  Options opts;
  if (spec.ep_size > 0) {
    if (W % spec.ep_size != 0) throw UsageError(fmt::format("world {} is not a multiple of ep_size {}", W, spec.ep_size));
    const sim::SplitArgs e = moe_split(0, rank, spec.ep_size), d = moe_split(1, rank, spec.ep_size);
    ep = world.split(e.color, e.key);
    edp = world.split(d.color, d.key);
    opts.expert_parallel = ep.get();
    opts.expert_data_parallel = edp.get();
  }
  std::unique_ptr<Model> model = spec.ep_size > 0 ? spec.make_moe_model(*ep) : spec.make_model();
  model->set_host_device(cpu);
  init_model(spec, *model, dev, cfg.model_dtype());
  opts.bugs = spec.bugs;
  opts.trace = trace;
  opts.adam_simd_width = spec.adam_simd_width;
  opts.torch_sqrt = spec.torch_sqrt;
  opts.cpu_device = cpu;
  std::unique_ptr<RuntimeLoader> loader = spec.make_loader ? spec.make_loader() : nullptr;
  opts.deepcompile_loader = loader.get();
  Engine engine(cfg, *model, dev, world, opts);
  rec.group_comm_after_init = group_stats(ep.get(), edp.get());
  const Groups groups = {&world, ep.get(), edp.get()};  // what the record's getters issue, counted apart
  if (spec.after_init) spec.after_init(rank, engine);
  if (spec.compile) engine.compile(*spec.compile);
  rec.memory.device = snapshot(dev);
  dev.reset_peak();
  const DeviceCounters dev_ops0 = dev.counters();
  const DeviceCounters cpu_ops0 = cpu != nullptr ? cpu->counters() : DeviceCounters{};
  const OffloadStats off0 =
      engine.optimizer().offload_stats() ? *engine.optimizer().offload_stats() : OffloadStats{};
  if (cpu != nullptr) {
    rec.memory.cpu = snapshot(*cpu);
    cpu->reset_peak();
  }
  if (one.both) {
    rec.memory.both.emplace().construction = *one.both;
    one.both->reset_peak();
  }
  auto batch = [&](int s, int m, int c) {
    if (meta) return upload_batch(dev, model->batch_shapes(spec.micro_batch), cfg.model_dtype());
    return upload_batch(dev, cache.slice_for(*model, s, m, c, rank), cfg.model_dtype());
  };
  const std::int64_t ga = cfg.gradient_accumulation_steps;
  if (spec.coalesce && ga != 1) throw UsageError("RunSpec: coalesce needs gradient_accumulation_steps 1");
  for (int s = 0; s < spec.steps; ++s) {
    double loss_sum = 0;
    StepWindow dev_step(&dev.memory()), both_step(one.both.get());
    for (int m = 0; m < ga; ++m) {
      auto chunks = [&] {
        for (int c = 0; c < spec.n_backward; ++c) {
          const Batch mine = batch(s, static_cast<int>(m), c);
          if (spec.explicit_boundary && !spec.coalesce) {
            engine.set_gradient_accumulation_boundary(m + 1 == ga && c + 1 == spec.n_backward);
          }
          const Engine::Loss loss = engine.forward(mine);
          if (m == 0 && c == 0) dev_step.after_forward(), both_step.after_forward();
          loss_sum += loss.value;
          engine.backward(loss);
        }
      };
      if (spec.coalesce) {
        engine.coalesce_grad_reduction(chunks);
        rec.flush_micro_step_ids.push_back(engine.last_flush_micro_step_id());
      } else {
        chunks();
      }
      if (m + 1 == ga) {
        if (spec.collect_grads && read_back) rec.grads.push_back(counted_apart(groups, rec.getter_comm, [&] { return engine.full_grads(); }));
        rec.loss_scales.push_back(engine.loss_scale());
      }
      engine.step();
    }
    dev_step.close(rec.memory.device.per_step);
    if (one.both) both_step.close(rec.memory.both->per_step);
    rec.skipped_steps.push_back(engine.skipped_steps());
    if (read_back) {  // a meta run has no values to read back
      rec.params.push_back(counted_apart(groups, rec.getter_comm, [&] { return engine.full_params(); }));
      rec.masters.push_back(to_f64(dev, engine.master_partitions().at(0)));
      if (spec.collect_optimizer_state) record_state(cfg, engine, groups, rec);
    }
    const double mean_loss = loss_sum / static_cast<double>(ga * spec.n_backward);
    rec.losses.push_back(mean_loss);
    if (spec.after_step) spec.after_step(rank, s, engine, mean_loss);
  }
  if (spec.destroy_at_end) engine.destroy();
  rec.comm = world.stats();
  rec.group_comm = group_stats(ep.get(), edp.get());
  finish(rec.memory.device, dev);
  if (cpu != nullptr) finish(rec.memory.cpu, *cpu);
  if (one.both) rec.memory.both->steps = *one.both;
  rec.step_device_ops = minus(dev.counters(), dev_ops0);
  if (cpu != nullptr) rec.step_cpu_ops = minus(cpu->counters(), cpu_ops0);
  if (const OffloadStats* o = engine.optimizer().offload_stats()) {
    rec.step_offload = {o->to_cpu_bytes - off0.to_cpu_bytes, o->to_device_bytes - off0.to_device_bytes,
                        o->transfers - off0.transfers};
  }
  return rec;
}

}  // namespace

std::unique_ptr<Model> initial_model(const RunSpec& spec, Device& dev, DType dtype) {
  std::unique_ptr<Model> model = spec.make_model();
  init_model(spec, *model, dev, dtype);
  return model;
}

RankRecord train_rank(const RunSpec& spec, int rank, Device& dev, Comm& world, Trace* trace,
                      Device* cpu) {
  BatchCache cache(spec, 1);
  return train(spec, rank, dev, world, trace, cache, cpu);
}

RunResult run_on_sim(const RunSpec& spec) {
  RunResult result;
  const int W = spec.world;
  // One record per simulated rank (every rank, or the representative ones).
  result.ranks = spec.sim.simulated_ranks;
  if (result.ranks.empty()) {
    for (int r = 0; r < W; ++r) result.ranks.push_back(r);
  }
  std::vector<int> slot(static_cast<std::size_t>(W), -1);
  for (std::size_t i = 0; i < result.ranks.size(); ++i) {
    if (result.ranks[i] >= 0 && result.ranks[i] < W) slot[static_cast<std::size_t>(result.ranks[i])] = static_cast<int>(i);
  }
  const std::size_t n = result.ranks.size();
  std::vector<RankRecord> recs(n);
  BatchCache cache(spec, static_cast<int>(n));
  sim::SimOptions options = spec.sim;
  if (spec.ep_size > 0 && !options.declared_split) {  // the world's two splits (moe_split)
    options.declared_split = [ep = spec.ep_size](const std::string& parent, int nth, int parent_rank) {
      if (parent != "world" || nth > 1) {
        throw UsageError(fmt::format("an MoE run splits the world twice; split {} of group {} is not one of "
                                     "them", nth, parent));
      }
      return moe_split(nth, parent_rank, ep);
    };
  }
  sim::SimCluster cluster(W, spec.sched_seed != 0 ? spec.sched_seed : spec.seed, options);
  result.comm_after_init.assign(n, CommStats{});
  result.sim = cluster.run([&](sim::RankContext& ctx) {
    const auto r = static_cast<std::size_t>(slot[static_cast<std::size_t>(ctx.rank)]);
    RunSpec mine = spec;  // the clock read after construction and after every step
    mine.after_init = [&, r](int rank, Engine& e) {
      ctx.sample_clock();
      result.comm_after_init[r] = e.comm().stats();
      if (spec.after_init) spec.after_init(rank, e);
    };
    mine.after_step = [&, r](int rank, int step, Engine& e, double loss) {
      ctx.sample_clock();
      if (spec.after_step) spec.after_step(rank, step, e, loss);
    };
    recs[r] = train(mine, ctx.rank, ctx.device, ctx.world, &ctx.trace, cache, &ctx.cpu);
  });
  result.timing = result.sim.clock_samples;  // Note [Decoupled schedule]: known after the run
  result.nccl = result.sim.nccl_samples;
  const RankRecord& r0 = recs[0];
  result.params = r0.params;
  result.grads = r0.grads;
  result.masters = r0.masters;
  result.losses = r0.losses;
  result.loss_scales = r0.loss_scales;
  result.flush_micro_step_ids = r0.flush_micro_step_ids;
  result.skipped_steps = r0.skipped_steps;
  result.state = r0.state;
  for (RankRecord& r : recs) {
    result.memory.push_back(std::move(r.memory));
    result.step_device_ops.push_back(r.step_device_ops);
    result.step_cpu_ops.push_back(r.step_cpu_ops);
    result.step_offload.push_back(r.step_offload);
    result.comm.push_back(r.comm);
    result.group_comm.push_back(r.group_comm);
    result.group_comm_after_init.push_back(r.group_comm_after_init);
    CommStats engine_only = r.comm;  // with MoE's groups' calls: DeepSpeed's counter sees every group
    add(engine_only, r.group_comm);
    add(engine_only, r.getter_comm, -1);
    result.engine_comm.push_back(engine_only);
  }
  // The first element where a rank differs from rank 0, named by its param (MoE experts, which
  // full_params() appends after the model's own params, by index).
  const std::unique_ptr<Model> named = spec.ep_size == 0 && spec.make_model ? spec.make_model() : nullptr;
  auto differ = [&](const std::vector<double>& a, const std::vector<double>& b) -> std::string {
    if (a.size() != b.size()) return fmt::format("{} vs {} elements", b.size(), a.size());
    const std::optional<std::size_t> i = first_mismatch(a, b);
    if (!i) return "";
    const auto at = static_cast<std::int64_t>(*i);
    return fmt::format("{}: {} (0x{:016x}) vs rank 0's {} (0x{:016x})",
                       named ? param_element_name(*named, at) : fmt::format("element {}", at), b[*i],
                       std::bit_cast<std::uint64_t>(b[*i]), a[*i], std::bit_cast<std::uint64_t>(a[*i]));
  };
  for (std::size_t r = 1; r < n && result.ranks_agree && !r0.params.empty(); ++r) {
    const RankRecord& other = recs[static_cast<std::size_t>(r)];
    for (int s = 0; s < spec.steps; ++s) {
      const auto at = static_cast<std::size_t>(s);
      std::string d = differ(r0.params[at], other.params[at]);
      if (!d.empty()) d = "params " + d;
      if (d.empty() && spec.collect_grads) {
        d = differ(r0.grads[at], other.grads[at]);
        if (!d.empty()) d = "averaged grads " + d;
      }
      if (!d.empty()) {
        result.ranks_agree = false;
        result.disagreement = fmt::format("rank {}, step {}, {}", r, s, d);
        break;
      }
    }
  }
  return result;
}

}  // namespace zc::props
