// The DeepSpeed reference backend, zerocheck's side: a Scenario is written out for the torch twin
// (reference/deepspeed/twin.py: initial weights and every global batch as the engine holds them),
// run on real DeepSpeed through the worker pool and on the simulator, and the two records are
// compared field by field, bit for bit. A difference is either explained by a listed divergence
// class (reference/deepspeed/known_divergences.json: DeepSpeed's file:line, the scenarios it
// covers, the fields it affects, a witness) or it fails the comparison. The comparison's hash
// covers both sides' records, so a replay that reproduces it reproduced both runs.
#pragma once

#include "engine/memory.h"
#include "props/invariants.h"
#include "props/reference_pool.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace zc::props {

// "" when the twin can run the scenario, else the feature it cannot express and why.
// The twin's domain: world <= 4, Synthetic and MLP models, fp32 and bf16, an optimizer in the
// config, no compile passes, no injected faults or command sequences.
std::string reference_unexpressible(const Scenario& s);

// The optimizer states the comparison reads, by DeepSpeed's names (exp_avg and exp_avg_sq for
// Adam/AdamW, momentum_buffer for SGD with momentum).
std::vector<std::string> optimizer_state_keys(const Scenario& s);

// Whether DeepSpeed runs the scenario with one of its own Adam ops (FusedAdam, or CPU Adam under
// offload), which a release's environment must build first (reference_env's with_adam_ops): an
// Adam or AdamW block without torch_adam. SGD and torch's Adam need none.
bool runs_deepspeed_adam_ops(const Scenario& s);

struct DeepSpeedMemory;

// A step's (step, micro-step, chunk) global batch, in place of the scenario's generated one (the
// Z3 witnesses' prescribed gradients).
using BatchSource = std::function<HostBatch(int step, int micro, int chunk)>;

// Writes input.json, init.f64 and batches.f64 for the twin into `dir`; with `memory`, the twin
// also measures DeepSpeed's memory (rank{R}.mem.json).
void write_reference_input(const Scenario& s, const std::filesystem::path& dir, const BatchSource& batches = {},
                           bool memory = false);

// A record file (reference/deepspeed/record.py's format): name -> values.
using ReferenceRecord = std::map<std::string, std::vector<double>>;
ReferenceRecord read_reference_record(const std::filesystem::path& file);
// FNV-1a of a named vector's name and bytes, chained from h: the one hash every reference verdict
// uses for its records (so a replay that reproduces the numbers reproduces the hash).
std::uint64_t hash_values(std::uint64_t h, std::string_view name, const std::vector<double>& v);

// One field on which the two sides differ: grads, params, masters, opt:<key>, loss_scale, skipped, msid,
// comm:<kind>:calls, comm:<kind>:bytes, ranks (DeepSpeed's ranks disagree), refusal (one side raised, the other did not).
struct FieldDiff {
  std::string field;
  std::string detail;  // step, param[index], both values and bit patterns
  // grads, params, masters: the largest distance of any element on any step, in units in the
  // last place of the dtype (f32 or bf16); -1 for the other fields.
  std::int64_t max_ulps = -1;
  // grads, params, masters, opt:<key>: the largest |zerocheck - DeepSpeed| of any element over the
  // largest |DeepSpeed| of the field at that step, over all steps (a scale-free distance for values
  // no exact domain holds: a transformer's); -1 for the other fields.
  double max_rel = -1;
};

// One phase of DeepSpeed's CPU memory on one rank (reference/deepspeed/memory.py): the peak of live
// bytes, the composition at it, each category's own peak, what allocation made the peak, and the
// live bytes at the phase's marks (after_forward, after_step).
struct DeepSpeedMemoryPhase {
  std::string name;  // construction, step0, step1, ...
  std::int64_t peak = 0;
  MemBytes at_peak{}, peak_by_category{};
  std::string peak_site;
  std::map<std::string, std::int64_t> marks;
  // What torch's gloo backend allocated inside collectives (staging that NCCL does not do), apart
  // from `peak` and the categories: its own peak over the phase.
  std::int64_t cpu_backend_peak = 0;
  // What a GPU run keeps in host memory (checkpoints' RNG states, deepspeed.checkpointing's size
  // tensors, the 0-dim tensors torch wraps Python numbers in), apart likewise.
  std::int64_t host_peak = 0;
  // What only torch's CPU kernels allocate: the cast of a Python number to the op's dtype
  // (memory.py's CPU_KERNEL; a CUDA kernel casts it in registers), apart likewise.
  std::int64_t cpu_kernel_peak = 0;
  // What torch's printing of a tensor allocated: ZeRO-3's constructor formats every full param into
  // a log line it does not print (memory.py's LOG_FORMAT, stage3.py:214), apart likewise.
  std::int64_t log_format_peak = 0;
};
struct DeepSpeedMemory {
  DeepSpeedMemoryPhase construction;
  std::vector<DeepSpeedMemoryPhase> steps;
  std::string error;  // the worker's profiler failed: why (the values are still compared)
};
// Reads rank{R}.mem.json; UsageError naming the file and what is wrong.
DeepSpeedMemory read_deepspeed_memory(const std::filesystem::path& file);

// One memory figure on both sides ("rank 0 step 1 peak", "rank 1 steps peak of grads").
struct MemoryFigure {
  std::string what;
  std::int64_t zerocheck = 0, deepspeed = 0;
  std::string category = "total";  // a MemCategory's name, or "total" for a peak or a mark of every category
  std::string listed;              // the class that explains the difference, if one does (never on an exact figure)
  bool exact() const { return zerocheck == deepspeed; }
  bool within_1pct() const;  // |zerocheck - deepspeed| <= 1 % of DeepSpeed's (exact when it is 0)
};
// The scenario's memory on both sides (Note [DeepSpeed's memory, measured] in reference_memory.cpp).
struct DeepSpeedMemoryComparison {
  bool measured = false;    // both sides ran and DeepSpeed's memory was read
  std::string error;        // why not (a profiler failure, a missing file)
  std::vector<MemoryFigure> figures;
  // "exact", "listed" (every difference explained by a class: list_memory_differences),
  // "within 1%" (the unexplained ones within 1 %), "beyond" over every figure; "" when not measured.
  std::string verdict() const;
  std::vector<std::string> classes() const;  // the classes that explained a figure, each once
  // The figures that differ and no class explains, worst first, at most `n`, one line each.
  std::vector<std::string> differences(std::size_t n) const;
};
struct RunResult;
DeepSpeedMemoryComparison compare_memory(const RunResult& sim, const std::vector<DeepSpeedMemory>& ds);
struct DivergenceClass;
// Names, on each differing figure of `c`, the first class that covers it (class_covers_memory).
void list_memory_differences(const Scenario& s, DeepSpeedMemoryComparison& c, const std::vector<DivergenceClass>& classes);

struct ReferenceComparison {
  std::vector<FieldDiff> diffs;   // empty: bit for bit the same
  std::string sim_error, ds_error;  // a refusal on either side (both: they agree)
  std::uint64_t hash = 0;         // both sides' records
  double ds_seconds = 0;
  DeepSpeedMemoryComparison memory;        // not part of matched() (yet): reported beside it
  bool matched() const { return diffs.empty(); }
};
// Runs the scenario on the simulator and on DeepSpeed and compares. RankFailure when a worker
// crashes or hangs (the pool restarts on the next scenario).
// With `memory`, DeepSpeed's memory is measured too and compared with the engine's
// (ReferenceComparison::memory; the campaign and its memory test; it costs the worker a profiled
// run, about three times the scenario's time).
// `engine_side`, when given, adjusts the engine's memory run (RunSpec) before it runs: a test's
// way to break the engine's accounting and see the comparison notice.
ReferenceComparison compare_with_deepspeed(const Scenario& s, ReferencePools& pools, bool memory = false,
                                           const std::function<void(RunSpec&)>& engine_side = {});
// DeepSpeed's own record of a scenario, rank by rank (for the invariants on DeepSpeed itself).
// With `memory`, DeepSpeed's memory rank by rank too (Note [DeepSpeed's memory, measured]).
std::vector<ReferenceRecord> run_on_deepspeed(const Scenario& s, ReferencePools& pools, const BatchSource& batches = {},
                                              std::vector<DeepSpeedMemory>* memory = nullptr);

// A probe of DeepSpeed itself (reference/deepspeed/probes.py) on a world of `world`, with keyword
// arguments `args`: its facts.
// "i4" (world 1): copies, __reduce__ and fake-tensor reads of a ZeRO-3 module's ZeROOrderedDict.
// "i3" (world 2; args {"runs": "autosp:0,..."} narrows it): DeepCompile's handle with autosp/autotp.
nlohmann::json probe_deepspeed(const std::string& name, ReferencePools& pools, int world = 1,
                               const nlohmann::json& args = nlohmann::json::object());

// I3 on DeepSpeed: the i3 probe at world 2 on a pool of its own, retired after it (AutoTP leaves
// DeepSpeed's process-wide TP groups behind), with a deadline of `timeout_s`. lifecycles: "all" (autosp,
// autotp x stages 0-3), "off" (a row saying it did not run, probe untouched), or the probe's list
// of pass:stage. The report's invariant row:
// holds when the recorder sees every site, the three positive controls (DeepCompile's ZeRO-1 pass;
// B1's and B2's historical gates put back) request the handle, no autosp/autotp lifecycle does, and
// every lifecycle completes but where DeepSpeed itself is known to stop (AutoTP at stage 3, after
// compile). `cases`: the complete lifecycles.
nlohmann::json i3_on_deepspeed(ReferencePools& pools, const std::string& lifecycles, double timeout_s);

// A known divergence between the engine and DeepSpeed 0.19.8.
struct DivergenceClass {
  std::string id, summary, deepspeed;  // deepspeed: the installed package's file:line
  nlohmann::json when;                 // {scenario key: [allowed values] | {"min": x, "max": y}}
  std::vector<std::string> affects;    // fields (a "comm:" prefix covers every kind)
  std::int64_t max_ulps = -1;          // >= 0: a value field is covered only within this many ulps
  double max_rel = -1;                 // >= 0: a value field is covered only within this FieldDiff::max_rel
  // A memory class affects "memory:<category>" (a MemCategory's name, or "total") and must bound
  // what it covers, by one of these or both (the list is refused otherwise: an unbounded memory
  // class would hide any accounting bug of its category):
  std::int64_t max_bytes = -1;  // >= 0: a figure is covered only when |zerocheck - DeepSpeed| <= this
  bool deepspeed_none = false;  // a figure is covered only when DeepSpeed allocated none of it (0 B)
  Scenario witness;
  bool is_memory() const;       // affects memory figures (its witness is measured)
};
std::vector<DivergenceClass> load_divergence_classes(const std::filesystem::path& file);
std::filesystem::path divergence_classes_file();  // the source tree's reference/deepspeed/known_divergences.json
bool class_covers(const DivergenceClass& c, const Scenario& s, const FieldDiff& diff);
bool class_covers_memory(const DivergenceClass& c, const Scenario& s, const MemoryFigure& f);

// The comparison's verdict: holds when every differing field is covered by a class that applies.
struct ReferenceVerdict {
  Verdict verdict;
  std::vector<std::string> classes;  // the classes that explained differences
  std::vector<std::string> unlisted; // the fields no class explains (the verdict fails)
  std::map<std::string, std::int64_t> class_ulps;  // per class with an ulp bound: the largest value distance it explained
  std::map<std::string, double> class_rel;         // per class with a max_rel bound: the largest max_rel it explained
  bool matched = false;              // no difference at all
  bool values_match = false;         // no difference in grads, params, masters, loss scale, skips, micro_step_id, ranks
  bool comm_match = false;           // the same collective calls and bytes per kind
  bool refused = false;              // both sides refused the scenario
};
ReferenceVerdict classify(const Scenario& s, const ReferenceComparison& c, const std::vector<DivergenceClass>& classes);

// The scenarios the comparison draws (the twin's domain, exact data; optimizer drawn from SGD with
// lr 2^-k, Adam and AdamW; both multi-backward forms).
rc::Gen<Scenario> gen_reference_scenario();
// The conformance comparison runs the scenario: the twin expresses it, and its data is exact
// (Synthetic, MLP) or it is a tiny transformer (gaussian, compared within the float classes).
bool reference_comparable(const Scenario& s);

// The comparison's invariant name (its saved counterexamples replay under it).
inline constexpr const char* kConformanceInvariant = "deepspeed-matches-or-listed";
// A counting comparison shrinks the first case of at most this many unlisted classes (each shrink
// reruns DeepSpeed tens of times); later classes are counted with their first scenario.
inline constexpr int kMaxUnlistedShrinks = 8;

// The comparison counted, not stopped (Note [Counting the comparison] in reference_count.cpp):
// every scenario of cases [0, cases) of `seed` runs and is sorted into matched, listed (by class),
// refused by both, or unlisted (by class: the first case of each shrunk, the rest counted); a
// comparison that raised (a worker crashed or hung) is an error, counted apart. JSON:
// seeds, cases, discarded, matched, values_bit_for_bit, listed, refused_by_both, unlisted, errors,
// error_cases [{seed, index, failure, scenario}] (the first five),
// listed_by_class, class_ulps, unlisted_classes [{key, cases, seed, index, failure, scenario,
// shrunk, counterexample, counterexample_failure, trace_hash, reproduce}], conformance (rows by
// feature), coverage (rows by coverage_cell, every cell of reference_coverage_cells()),
// deepspeed_seconds.
nlohmann::json count_conformance(ReferencePools& pools, const std::vector<DivergenceClass>& classes, int cases,
                                 std::uint64_t seed);
// Adds one count into another (a soak's rounds): sums, classes merged by key.
void merge_conformance_counts(nlohmann::json& into, const nlohmann::json& more);
// A scenario's coverage cell: stage x dtype x communication dtype x clipping x offload x optimizer.
std::string coverage_cell(const Scenario& s);
// The coverage space as scenarios (stage, dtype, comm_dtype, clip, offload and optimizer set; the
// rest default): gen_reference_scenario draws one of them uniformly.
std::vector<Scenario> reference_coverage_space();
// Every cell gen_reference_scenario can draw (communication dtype: the default, bf16 or f16 for an
// f32 model, f32 for bf16; offload by stage; SGD, Adam, AdamW).
std::vector<std::string> reference_coverage_cells();
// {cells, drawn, never_drawn: [cell]} of a count.
nlohmann::json coverage_summary(const nlohmann::json& count);
// The coverage as a grid for the reports: rows stage x dtype x communication dtype, columns
// clipping x offload, cells the scenarios drawn summed over the optimizers. {columns, rows:
// [{row, cells}], what}.
nlohmann::json coverage_grid(const nlohmann::json& count);

// What `zerocheck verify --against deepspeed` runs.
struct ReferenceOptions {
  int cases = 100;
  std::uint64_t seed = 1;
  std::filesystem::path out;  // counterexamples/ are written here
  // I3 on DeepSpeed: "all" (eight lifecycles), "off" (the row says it did not run), or the probe's
  // list of pass:stage.
  std::string i3 = "all";
};
// The Z3 FPA witnesses (fpa_rounding_witness, f32 and bf16) run on DeepSpeed: world 2, ZeRO-2, one
// element, each rank's two chunks the witness's gradients, per-backward (explicit boundary) and
// coalesced. Per dtype: the gradients, Z3's two predicted results, DeepSpeed's on both ranks, and
// `as_predicted`; `holds` when every witness rounds apart on DeepSpeed as predicted.
nlohmann::json fpa_witnesses_on_deepspeed(ReferencePools& pools, unsigned timeout_ms);

// The report's `reference` object (docs/deepspeed-reference.md: the reference object in results.json), with `saved_cases`: the
// counterexamples and witnesses ({saved_file, saved_case}) for the caller to write.
nlohmann::json run_reference_campaigns(const ReferenceOptions& opts, ReferencePools& pools);

// The invariants on DeepSpeed itself and the comparison, as Invariants whose check needs the pool
// (zerocheck replay of a saved "deepspeed-..." counterexample uses them).
std::vector<Invariant> reference_invariants(ReferencePools& pools);
// The invariant of reference_invariants() that states an engine invariant on DeepSpeed alone
// (I1-coalesced-bit-exact -> deepspeed-I1-coalesced-bit-exact, I2-micro-step-zero-at-flush ->
// deepspeed-I2-zero3-flush-micro-step-id); "" when the engine invariant has none.
std::string deepspeed_counterpart(std::string_view engine_invariant);

}  // namespace zc::props
