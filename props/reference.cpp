// The DeepSpeed reference, zerocheck's side (reference.h): inputs for the twin, records, the
// field-by-field comparison and its classification against the known divergence classes.
#include "props/reference.h"

#include "engine/errors.h"
#include "engine/host_device.h"
#include "engine/trace.h"
#include "models/transformer.h"
#include "props/scenario_gen.h"
#include "props/stopwatch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>

namespace zc::props {

namespace {

void write_f64(const std::filesystem::path& file, const std::vector<double>& v) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(double)));
  if (!out) throw UsageError(fmt::format("cannot write {}", file.string()));
}

// A scratch directory for one scenario's files, removed when it goes out of scope (kept when
// ZC_DS_KEEP_SCRATCH is set: the twin's input and DeepSpeed's records, for debugging).
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() / fmt::format("zerocheck-ref-{}-{}", ::getpid(), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    if (std::getenv("ZC_DS_KEEP_SCRATCH") != nullptr) return;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::string bits(double v) { return fmt::format("{} (0x{:016x})", v, std::bit_cast<std::uint64_t>(v)); }

// The first differing element of a step's flat vector, named by its param.
std::string first_element_diff(const Scenario& s, int step, const std::vector<double>& sim, const std::vector<double>& ds) {
  if (sim.size() != ds.size()) return fmt::format("step {}: {} elements on zerocheck, {} on DeepSpeed", step, sim.size(), ds.size());
  const std::optional<std::size_t> i = first_mismatch(sim, ds);
  if (!i) return "";
  std::size_t count = 0;
  for (std::size_t k = 0; k < sim.size(); ++k) count += bits_differ(sim[k], ds[k]);
  return fmt::format("step {}, {}: zerocheck {} vs DeepSpeed {} ({} of {} elements differ)", step,
                     element_name(s, static_cast<std::int64_t>(*i)), bits(sim[*i]), bits(ds[*i]), count, sim.size());
}

// The distance of two values of `dtype` (f32 or bf16, held exactly in doubles) in units in its
// last place: the difference of their ordered f32 bit patterns, over 2^16 for bf16.
std::int64_t ulps_apart(double a, double b, DType dtype) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  auto ordered = [](double v) {
    const auto i = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(static_cast<float>(v)));
    return i < 0 ? std::int64_t{INT32_MIN} - i : i;
  };
  const std::int64_t d = std::llabs(ordered(a) - ordered(b));
  return dtype == DType::bf16 ? d >> 16 : d;
}

// max |a - b| over max |b| (FieldDiff::max_rel); infinite for different sizes or a NaN.
double max_rel_apart(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (!std::isnan(a[i])) diff = std::max(diff, std::fabs(a[i] - b[i]));
    if (!std::isnan(b[i])) scale = std::max(scale, std::fabs(b[i]));
  }
  return diff == 0 ? 0 : scale == 0 ? INFINITY : diff / scale;
}

std::int64_t max_ulps_apart(const std::vector<double>& a, const std::vector<double>& b, DType dtype) {
  if (a.size() != b.size()) return INT64_MAX;
  std::int64_t m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, ulps_apart(a[i], b[i], dtype));
  return m;
}

}  // namespace

std::uint64_t hash_values(std::uint64_t h, std::string_view name, const std::vector<double>& v) {
  h = fnv1a(name, h);
  return fnv1a(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double)), h);
}

std::vector<std::string> optimizer_state_keys(const Scenario& s) {
  if (s.optimizer != "SGD") return {"exp_avg", "exp_avg_sq"};
  if (s.momentum != 0) return {"momentum_buffer"};
  return {};
}

bool runs_deepspeed_adam_ops(const Scenario& s) {
  return s.optimizer != "SGD" && !s.torch_adam;
}

std::string reference_unexpressible(const Scenario& s) {
  if (s.world > 4) return fmt::format("world {}: the reference pools hold 1-4 ranks", s.world);
  if (s.model != "synthetic" && s.model != "mlp" && !is_transformer(s)) {
    return fmt::format("model '{}': the twin has Synthetic, MLP and the tiny transformers (gpt2-tiny, llama-tiny, "
                       "llama-gqa-tiny, mixtral-tiny) only", s.model);
  }
  if (s.dtype == "f16") {
    return "dtype f16: DeepSpeed 0.19.8 refuses fp16 on a CPU without mkldnn fp16 support (this machine's accelerator "
           "reports is_fp16_supported() falsy); the reference leaves fp16 out";
  }
  if (!s.passes.empty()) return "compile passes: the twin does not run DeepCompile (the I3 check on DeepSpeed is separate)";
  if (!s.fault.empty()) return fmt::format("fault '{}': the reference runs no injected faults", s.fault);
  if (!s.commands.empty()) return "a command sequence: the twin runs the scenario's training loop only";
  if (s.coalesce && s.ga != 1) return "coalesce with gradient_accumulation_steps > 1";
  if (s.clip > 0) {  // DeepSpeed's clip coefficient goes through torch's sqrt (Note [Probing torch's sqrt])
    std::string unknown;
    try {
      unknown = reference_env().torch_sqrt_unknown;
    } catch (const ConfigError&) {  // no environment: the comparison itself will say so
    }
    if (!unknown.empty()) {
      return "gradient_clipping: torch's f32 sqrt on this CPU is neither correctly rounded nor MKL's SSE kernel, so "
             "DeepSpeed's clip coefficient cannot be modelled here (" + unknown + ")";
    }
  }
  return "";
}

void write_reference_input(const Scenario& s, const std::filesystem::path& dir, const BatchSource& source,
                           bool memory) {
  if (const std::string why = reference_unexpressible(s); !why.empty()) {
    throw NotImplementedError("the DeepSpeed twin cannot express this scenario: " + why);
  }
  const RunSpec spec = to_run_spec(s, {}, {});
  const nlohmann::json config = effective_config(spec);
  // The scenario's model dtype, not a parsed Config: a config the engine refuses (as DeepSpeed
  // may too) must still reach DeepSpeed, whose refusal is what the comparison records.
  const DType dtype = dtype_of(s);
  HostDevice dev;
  const std::unique_ptr<Model> model = initial_model(spec, dev, dtype);
  nlohmann::json params = nlohmann::json::array();
  std::vector<double> init;
  for (Parameter* p : model->named_parameters()) {
    params.push_back({{"name", p->name}, {"shape", p->shape}});
    const std::vector<double> v = to_f64(dev, p->data);  // exactly the engine's initial values
    init.insert(init.end(), v.begin(), v.end());
  }
  nlohmann::json arrays = nlohmann::json::array();
  std::vector<double> batches;
  for (int step = 0; step < s.steps; ++step) {
    for (int m = 0; m < s.ga; ++m) {
      for (int c = 0; c < s.n; ++c) {
        const HostBatch hb = source ? source(step, m, c) : global_batch(spec, *model, step, m, c);
        const Batch up = upload_batch(dev, hb, dtype);  // rounded to the model dtype as the engine sees it
        for (const auto& [name, t] : up.tensors) {
          // Token ids and labels: int64 on DeepSpeed's side, as Hugging Face's models take them (the
          // engine's f64, batch_array_dtype: the same 8 bytes).
          const bool tokens = name == "ids" || name == "labels";
          if (step == 0 && m == 0 && c == 0) {
            arrays.push_back({{"name", name}, {"row", t.numel() / hb.samples}, {"dtype", tokens ? "int64" : s.dtype}});
          }
          const std::vector<double> v = to_f64(dev, t);
          batches.insert(batches.end(), v.begin(), v.end());
        }
      }
    }
  }
  nlohmann::json model_j;
  if (s.model == "synthetic") {
    nlohmann::json shapes = nlohmann::json::array();
    for (std::int64_t n : s.shape) shapes.push_back({n});
    model_j = {{"kind", "synthetic"}, {"shapes", shapes}};
  } else if (is_transformer(s)) {
    const TransformerSpec t = transformer_preset(s.model);
    model_j = {{"kind", "transformer"},
               {"preset", s.model},
               {"vocab", t.vocab},
               {"dim", t.dim},
               {"layers", t.layers},
               {"heads", t.heads},
               {"kv_heads", t.kv_heads},
               {"ffn", t.ffn},
               {"seq", t.seq},
               {"norm", t.norm == NormKind::layernorm ? "layernorm" : "rmsnorm"},
               {"mlp", t.mlp == MlpKind::gelu ? "gelu" : "swiglu"},
               {"positions", t.pos == PositionKind::learned ? "learned" : "rotary"},
               {"tied_embeddings", t.tied_embeddings},
               {"bias", t.bias},
               {"eps", t.eps},
               {"rope_base", t.rope_base},
               {"checkpointing", s.checkpointing},
               // Note [MoE routing]: DeepSpeed's MoE layer with zerocheck's gating
               {"experts", t.experts},
               {"top_k", t.top_k},
               {"capacity_factor", t.capacity_factor},
               {"min_capacity", t.min_capacity},
               {"ep_size", is_moe(s) ? s.ep_size : 1}};
  } else {
    model_j = {{"kind", "mlp"}, {"dims", s.shape}, {"relu", s.shape.size() > 2}};
  }
  const nlohmann::json input = {
      {"ds_config", config}, {"dtype", s.dtype}, {"model", model_j}, {"params", params}, {"batch_arrays", arrays},
      {"world", s.world}, {"micro_batch", spec.micro_batch}, {"steps", s.steps}, {"ga", s.ga}, {"n", s.n},
      {"coalesce", s.coalesce}, {"explicit_boundary", s.boundary == "explicit"},
      {"optimizer_state_keys", optimizer_state_keys(s)}, {"memory", memory}};
  std::ofstream(dir / "input.json") << input.dump(1) << "\n";
  write_f64(dir / "init.f64", init);
  write_f64(dir / "batches.f64", batches);
}

ReferenceRecord read_reference_record(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UsageError(fmt::format("the DeepSpeed record {} is missing", file.string()));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string magic = "ZCREC1\n";
  if (data.compare(0, magic.size(), magic) != 0) throw UsageError(fmt::format("{} is not a reference record", file.string()));
  ReferenceRecord rec;
  std::size_t at = magic.size();
  auto take = [&](void* dst, std::size_t n) {
    if (at + n > data.size()) throw UsageError(fmt::format("{} is truncated at byte {}", file.string(), at));
    std::memcpy(dst, data.data() + at, n);
    at += n;
  };
  while (at < data.size()) {
    std::uint32_t name_len = 0;
    take(&name_len, sizeof name_len);
    std::string name(name_len, '\0');
    take(name.data(), name_len);
    std::uint64_t count = 0;
    take(&count, sizeof count);
    std::vector<double> v(count);
    take(v.data(), count * sizeof(double));
    rec.emplace(std::move(name), std::move(v));
  }
  return rec;
}

std::vector<ReferenceRecord> run_on_deepspeed(const Scenario& s, ReferencePools& pools, const BatchSource& batches,
                                              std::vector<DeepSpeedMemory>* memory) {
  ScratchDir dir;
  write_reference_input(s, dir.path, batches, memory != nullptr);
  pools.get(s.world).run(dir.path);
  std::vector<ReferenceRecord> recs;
  for (int r = 0; r < s.world; ++r) {
    recs.push_back(read_reference_record(dir.path / fmt::format("rank{}.rec", r)));
    if (memory != nullptr) memory->push_back(read_deepspeed_memory(dir.path / fmt::format("rank{}.mem.json", r)));
  }
  return recs;
}

nlohmann::json probe_deepspeed(const std::string& name, ReferencePools& pools, int world, const nlohmann::json& args) {
  ScratchDir dir;
  pools.get(world).probe(name, dir.path, args.dump());
  std::ifstream in(dir.path / fmt::format("probe_{}.json", name));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) throw UsageError(fmt::format("the DeepSpeed probe '{}' wrote no facts", name));
  return j;
}

nlohmann::json i3_on_deepspeed(ReferencePools& pools, const std::string& lifecycles, double timeout_s) {
  const std::string name = "deepspeed-I3-no-deepcompile-runtime-for-parallel-passes";
  if (lifecycles == "off") return {{"name", name}, {"not_run", "--deepspeed-i3 off"}, {"cases", 0}};
  nlohmann::json row = {
      {"name", name},
      {"explanation", "On DeepSpeed itself, world 2: with compile.deepcompile and only the autosp or autotp pass "
                      "(the lifecycles in lifecycles_asked), through initialize, compile, two forward/backward/step and destroy, "
                      "DeepCompile's handle (compile/util.py get_deepcompile_handle, its builder replaced by a "
                      "recorder) is never requested; positive controls: DeepCompile's ZeRO-1 pass, and B1's and "
                      "B2's historical gates put back, must request it."}};
  // A pool of its own, before and after: earlier scenarios' state must not reach the probe, and
  // the probe's (AutoTP's process-wide TP groups) must not reach later scenarios.
  struct Retire {  // before and after, whatever the probe throws
    ReferencePools& pools;
    explicit Retire(ReferencePools& p) : pools(p) { pools.retire(2); }
    ~Retire() { pools.retire(2); }
  } retire(pools);
  // The list always goes explicitly, so that nothing in the workers' environment (probe.sh's
  // ZC_I3_RUNS) narrows "all".
  const std::string list =
      lifecycles == "all" ? "autosp:0,autosp:1,autosp:2,autosp:3,autotp:0,autotp:1,autotp:2,autotp:3" : lifecycles;
  row["lifecycles_asked"] = list;
  try {
    pools.get(2).set_timeout(timeout_s);
    const nlohmann::json facts = probe_deepspeed("i3", pools, 2, {{"runs", list}});
    row["cases"] = facts.at("complete_lifecycles").size();
    row["holds"] = facts.value("holds", false);
    row["facts"] = facts;
    if (!row["holds"].get<bool>()) {
      std::vector<std::string> why;
      if (!facts.value("recorder_sees_every_site", false)) why.push_back("the recorder missed a site of get_deepcompile_handle");
      if (!facts.value("control_detected", false)) why.push_back("DeepCompile's ZeRO-1 pass did not request the handle (control)");
      if (facts.contains("mutants_detected")) {
        for (const auto& [gate, seen] : facts["mutants_detected"].items()) {
          if (!seen.get<bool>()) why.push_back(fmt::format("with {}'s historical gate the handle was not requested (control)", gate));
        }
      }
      if (facts.contains("handle_requested_with_parallel_passes")) {
        for (const nlohmann::json& r : facts["handle_requested_with_parallel_passes"]) {
          why.push_back(fmt::format("the handle was requested with {}", r.get<std::string>()));
        }
      }
      if (facts.contains("unexpectedly_incomplete")) {
        for (const auto& [lifecycle, where] : facts["unexpectedly_incomplete"].items()) {
          why.push_back(fmt::format("{} stopped at {}, where DeepSpeed is not known to stop: {}", lifecycle,
                                    where.value("reached", "?"), where.value("error", "")));
        }
      }
      row["failure"] = fmt::format("{}", fmt::join(why, "; "));
    }
  } catch (const std::exception& e) {  // a worker failure, or facts without a field the row reads
    row["holds"] = false;
    row["cases"] = 0;
    row["failure"] = e.what();
  }
  return row;
}

namespace {

const ReferenceRecord::mapped_type& entry(const ReferenceRecord& r, const std::string& name) {
  auto it = r.find(name);
  if (it == r.end()) throw UsageError(fmt::format("the DeepSpeed record has no '{}'", name));
  return it->second;
}

void compare_records(const Scenario& s, const RunResult& sim, const std::vector<ReferenceRecord>& ds,
                     ReferenceComparison& out) {
  const ReferenceRecord& d0 = ds.at(0);
  auto note = [&](const std::string& field, const std::string& detail, std::int64_t ulps = -1, double rel = -1) {
    for (FieldDiff& f : out.diffs) {
      if (f.field == field) {  // the first difference per field, the largest distance over all steps
        f.max_ulps = std::max(f.max_ulps, ulps);
        f.max_rel = std::max(f.max_rel, rel);
        return;
      }
    }
    out.diffs.push_back({field, detail, ulps, rel});
  };
  const DType accum = s.grad_accum_dtype.empty() ? dtype_of(s) : DType::f32;
  // `field` at `step`: zerocheck's z against DeepSpeed's "<field>/<step>" (opt:<key>: "opt/<key>/<step>").
  auto value = [&](const std::string& field, int step, const std::vector<double>& z, DType dtype) {
    std::string name = fmt::format("{}/{}", field, step);
    if (name.rfind("opt:", 0) == 0) name[3] = '/';
    const std::vector<double>& d = entry(d0, name);
    if (std::string diff = first_element_diff(s, step, z, d); !diff.empty()) {
      note(field, diff, max_ulps_apart(z, d, dtype), max_rel_apart(z, d));
    }
  };
  for (int step = 0; step < s.steps; ++step) {
    const auto at = static_cast<std::size_t>(step);
    value("grads", step, sim.grads.at(at), s.offload != "none" ? DType::f32 : accum);
    value("params", step, sim.params.at(at), dtype_of(s));
    value("masters", step, sim.state.at("fp32").at(at), DType::f32);
    for (const std::string& key : optimizer_state_keys(s)) {
      const std::string ds_key = fmt::format("opt/{}/{}", key, step);
      const auto z = sim.state.find(key);
      const bool on_sim = z != sim.state.end(), on_ds = d0.contains(ds_key);
      if (on_sim && on_ds) {
        value("opt:" + key, step, z->second.at(at), DType::f32);
      } else if (on_sim != on_ds) {
        note("opt:" + key, fmt::format("step {}: only {} keeps it", step, on_sim ? "zerocheck" : "DeepSpeed"));
      }
    }
    const double ds_scale = entry(d0, fmt::format("loss_scale/{}", step)).at(0);
    if (sim.loss_scales.at(at) != ds_scale) note("loss_scale", fmt::format("step {}: zerocheck {} vs DeepSpeed {}", step, sim.loss_scales.at(at), ds_scale));
    const double ds_skipped = entry(d0, fmt::format("skipped/{}", step)).at(0);
    if (static_cast<double>(sim.skipped_steps.at(at)) != ds_skipped) {
      note("skipped", fmt::format("after step {}: zerocheck skipped {} vs DeepSpeed {}", step, sim.skipped_steps.at(at), ds_skipped));
    }
    for (std::size_t r = 1; r < ds.size(); ++r) {
      for (const char* what : {"grads", "params"}) {
        const std::string key = fmt::format("{}/{}", what, step);
        if (std::string d = first_element_diff(s, step, entry(d0, key), entry(ds[r], key)); !d.empty()) {
          note("ranks", fmt::format("DeepSpeed rank {} {} differ from rank 0's: {}", r, what, d));
        }
      }
    }
  }
  if (s.coalesce) {
    std::vector<double> sim_msid(sim.flush_micro_step_ids.begin(), sim.flush_micro_step_ids.end());
    const std::vector<double> ds_msid = d0.contains("msid") ? d0.at("msid") : std::vector<double>{};
    if (sim_msid != ds_msid) note("msid", fmt::format("zerocheck {} vs DeepSpeed {}", sim_msid, ds_msid));
  }
  static const std::pair<const char*, CollectiveKind> kinds[] = {
      {"all_reduce", CollectiveKind::all_reduce}, {"reduce_scatter", CollectiveKind::reduce_scatter},
      {"all_gather", CollectiveKind::all_gather}, {"reduce", CollectiveKind::reduce},
      {"broadcast", CollectiveKind::broadcast},   {"all_to_all", CollectiveKind::all_to_all},
      {"barrier", CollectiveKind::barrier}};
  for (const auto& [name, kind] : kinds) {
    const std::vector<double>& d = entry(d0, fmt::format("comm/{}", name));
    const OpStats& z = sim.engine_comm.at(0)[kind];
    const std::string both = fmt::format("rank 0 over the run: zerocheck {} calls {} B vs DeepSpeed {} calls {} B",
                                         z.calls, z.bytes, d.at(0), d.at(1));
    if (static_cast<double>(z.calls) != d.at(0)) note(fmt::format("comm:{}:calls", name), both);
    if (static_cast<double>(z.bytes) != d.at(1)) note(fmt::format("comm:{}:bytes", name), both);
  }
}

}  // namespace

ReferenceComparison compare_with_deepspeed(const Scenario& s, ReferencePools& pools, bool memory,
                                           const std::function<void(RunSpec&)>& engine_side) {
  ReferenceComparison out;
  std::uint64_t h = 0xcbf29ce484222325ull;
  // The scenario as the engine runs it beside DeepSpeed here.
  auto beside_deepspeed = [&] {
    RunSpec spec = to_run_spec(s, {}, {});
    const ReferenceEnv& env = pools.env();
    spec.adam_simd_width = env.adam_simd_width;  // the build DeepSpeed runs here
    spec.torch_sqrt = env.torch_sqrt;            // and the sqrt kernel torch runs on this CPU
    spec.sim.order = sim::ReductionOrder::gloo;  // DeepSpeed's collectives run on gloo here
    return spec;
  };
  RunResult sim;
  try {
    RunSpec spec = beside_deepspeed();
    spec.collect_optimizer_state = true;
    sim = run_on_sim(spec);
    for (std::size_t k = 0; k < sim.grads.size(); ++k) {
      h = hash_values(h, "sim grads", sim.grads[k]);
      h = hash_values(h, "sim params", sim.params[k]);
    }
    for (const auto& [key, steps] : sim.state) {
      for (const std::vector<double>& v : steps) h = hash_values(h, "sim " + key, v);
    }
    h = hash_values(h, "sim scales", sim.loss_scales);
    h = fnv1a(sim.engine_comm.at(0).to_string(), h);
  } catch (const ZcError& e) {
    out.sim_error = e.what();
    h = fnv1a(out.sim_error, h);
  }
  std::vector<ReferenceRecord> ds;
  std::vector<DeepSpeedMemory> ds_memory;
  const Stopwatch watch;
  try {
    ds = run_on_deepspeed(s, pools, {}, memory ? &ds_memory : nullptr);
    for (const ReferenceRecord& r : ds) {
      for (const auto& [name, v] : r) h = hash_values(h, name, v);
    }
  } catch (const RankFailure& e) {
    if (e.cause().rfind("DeepSpeed raised on this scenario: ", 0) != 0) throw;  // a crash or hang: not a verdict
    out.ds_error = e.cause();
    h = fnv1a(out.ds_error, h);
  }
  out.ds_seconds = watch.seconds();
  out.hash = h;
  if (!out.sim_error.empty() || !out.ds_error.empty()) {
    out.memory.error = fmt::format("refused by {}: {}", out.sim_error.empty() ? "DeepSpeed" : out.ds_error.empty() ? "zerocheck" : "both",
                                   (out.sim_error.empty() ? out.ds_error : out.sim_error).substr(0, 300));
    if (out.sim_error.empty() || out.ds_error.empty()) {
      out.diffs.push_back({"refusal", out.sim_error.empty() ? "DeepSpeed refused (" + out.ds_error + "); zerocheck ran it"
                                                             : "zerocheck refused (" + out.sim_error + "); DeepSpeed ran it"});
    }
    return out;
  }
  compare_records(s, sim, ds, out);
  if (!memory) return out;
  try {
    // The memory from a run without the record's getters (full grads, params, states), whose
    // allocations the engine's ledger would count and DeepSpeed's measurement leaves out
    // (memory.py's reading ranges): the same training, nothing read back.
    RunSpec quiet = beside_deepspeed();
    quiet.collect_grads = false;
    quiet.record_values = false;
    quiet.one_memory = s.offload != "none";
    if (std::getenv("ZC_DS_MEMORY_DUMP") != nullptr) {  // the steps' ledger event by event, for the dump below
      quiet.after_init = [](int, Engine& e) { e.device().memory().enable_timeline(1u << 20); };
    }
    if (engine_side) engine_side(quiet);
    const RunResult plain = run_on_sim(quiet);
    out.memory = compare_memory(plain, ds_memory);
    sim.memory = plain.memory;  // for the dump
  } catch (const ZcError& e) {
    out.memory.error = fmt::format("the engine's run without getters failed: {}", e.what());
  }
  if (std::getenv("ZC_DS_MEMORY_DUMP") != nullptr) {
    fmt::print(stderr, "memory {} | {}\n", out.memory.verdict(), describe(s));
    for (const MemoryFigure& f : out.memory.figures) {
      fmt::print(stderr, "  {:50} zerocheck {:8} DeepSpeed {:8}{}\n", f.what, f.zerocheck, f.deepspeed, f.exact() ? "" : "  <>");
    }
    // One rank's steps (ZC_DS_MEMORY_DUMP=R; rank 0 for any other value), event by event: the
    // category that moved, by how much, and the label.
    const std::size_t rank = static_cast<std::size_t>(std::max(0, std::atoi(std::getenv("ZC_DS_MEMORY_DUMP"))));
    if (rank < sim.memory.size()) {
      const std::vector<MemSample>& tl = sim.memory[rank].device.steps.timeline();
      for (std::size_t k = 1; k < tl.size(); ++k) {
        for (std::size_t c = 0; c < kMemCategories; ++c) {
          const std::int64_t d = tl[k].live[c] - tl[k - 1].live[c];
          if (d != 0) {
            fmt::print(stderr, "  zc {:+6} {:14} {:24} live {}\n", d, mem_category_name(static_cast<MemCategory>(c)),
                       tl[k].label, std::accumulate(tl[k].live.begin(), tl[k].live.end(), std::int64_t{0}));
          }
        }
      }
    }
    for (std::size_t r = 0; r < ds_memory.size(); ++r) {
      fmt::print(stderr, "  DeepSpeed rank {} construction peak at {}\n", r, ds_memory[r].construction.peak_site);
      for (const DeepSpeedMemoryPhase& p : ds_memory[r].steps) fmt::print(stderr, "  DeepSpeed rank {} {} peak at {}\n", r, p.name, p.peak_site);
    }
  }
  return out;
}

}  // namespace zc::props
