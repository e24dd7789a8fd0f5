// Config parsing: a Reader walks the JSON with a key path, checks every type, remembers which keys
// it consumed, and turns the rest into warnings, or, in the blocks DeepSpeed's pydantic models
// close (engine/deepspeed_config_keys.h), refuses what DeepSpeed refuses. Cross-key rules come
// after all keys are read.
#include "engine/config.h"

#include "engine/deepspeed_config_keys.h"
#include "engine/errors.h"
#include "engine/hjson.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>

namespace zc {

namespace {

using json = nlohmann::json;

std::string type_of(const json& v) { return v.type_name(); }

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Reads one JSON object; `path` names it in messages ("zero_optimization").
class Reader {
 public:
  Reader(const json& obj, std::string path, std::vector<std::string>& warnings)
      : obj_(obj), path_(std::move(path)), warnings_(warnings) {
    if (!obj_.is_object()) {
      throw ConfigError(fmt::format("'{}' must be an object, got {}", path_, type_of(obj_)));
    }
  }
  ~Reader() = default;

  std::string key_path(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }
  bool has(const std::string& key) {
    seen_.insert(key);
    return obj_.contains(key) && !obj_.at(key).is_null();
  }
  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    if (!v.is_boolean()) throw wrong_type(key, "true or false", v);
    return v.get<bool>();
  }
  double number(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    if (!v.is_number()) throw wrong_type(key, "a number", v);
    return v.get<double>();
  }
  std::int64_t integer(const std::string& key, std::int64_t fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    // DeepSpeed configs often write sizes as 5e8: accept a float that is a whole number. 2^63
    // bounds the cast (casting a float outside int64 is undefined behaviour).
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!(std::abs(d) < 0x1p63) || d != std::trunc(d)) throw wrong_type(key, "an integer", v);
      return static_cast<std::int64_t>(d);
    }
    if (!v.is_number_integer()) throw wrong_type(key, "an integer", v);
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t{INT64_MAX}) {
      throw error(key, fmt::format("{} is out of range: at most {}", v.dump(), INT64_MAX));
    }
    return v.get<std::int64_t>();
  }
  // An integer that must fit an int (a stage, a parallel degree): never silently truncated.
  int small_integer(const std::string& key, int fallback) {
    const std::int64_t v = integer(key, fallback);
    if (v < INT32_MIN || v > INT32_MAX) {
      throw error(key, fmt::format("{} is out of range: at most {}", v, INT32_MAX));
    }
    return static_cast<int>(v);
  }
  std::string string(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    const json& v = obj_.at(key);
    if (!v.is_string()) throw wrong_type(key, "a string", v);
    return v.get<std::string>();
  }
  const json* object(const std::string& key) {
    if (!has(key)) return nullptr;
    return &obj_.at(key);
  }
  // Warns about keys nobody asked for. Call after all reads.
  void warn_unknown() {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!seen_.count(it.key())) {
        warnings_.push_back(fmt::format("unknown key '{}' ignored", key_path(it.key())));
      }
    }
  }
  // For a block DeepSpeed's pydantic model reads with extra="forbid" (engine/deepspeed_config_keys.h):
  // a key DeepSpeed does not know is refused as DeepSpeed refuses it, naming the closest known key;
  // a key it knows that zerocheck did not read is accepted with a warning that it is not modelled.
  template <std::size_t N>
  void refuse_unknown_as_deepspeed(const std::string_view (&deepspeed)[N], std::string_view model) {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (seen_.count(it.key())) continue;
      if (std::find(std::begin(deepspeed), std::end(deepspeed), it.key()) != std::end(deepspeed)) {
        warnings_.push_back(fmt::format("'{}' accepted and ignored: DeepSpeed reads it, zerocheck does not model it",
                                        key_path(it.key())));
        continue;
      }
      std::string_view nearest;
      std::size_t best = 3;  // suggest within two edits
      for (std::string_view k : deepspeed) {
        const std::size_t d = edit_distance(it.key(), k);
        if (d < best) best = d, nearest = k;
      }
      throw ConfigError(fmt::format("unknown key '{}'{}: DeepSpeed {} refuses it (\"Extra inputs are not permitted\", "
                                    "{}), and so does zerocheck", key_path(it.key()),
                                    nearest.empty() ? std::string() : fmt::format(" (did you mean '{}'?)", nearest),
                                    deepspeed_keys::kVersion, model));
    }
  }
  std::vector<std::string>& warnings() { return warnings_; }

  ConfigError error(const std::string& key, const std::string& why) const {
    return ConfigError(fmt::format("'{}': {}", key_path(key), why));
  }

 private:
  ConfigError wrong_type(const std::string& key, const char* expected, const json& v) const {
    return ConfigError(fmt::format("'{}' must be {}, got {} {}", key_path(key), expected,
                                   type_of(v), v.dump()));
  }
  const json& obj_;
  std::string path_;
  std::vector<std::string>& warnings_;
  std::set<std::string> seen_;
};

template <class T>
void require(bool ok, Reader& r, const std::string& key, T&& why) {
  if (!ok) throw r.error(key, std::forward<T>(why));
}

OffloadDevice read_offload(Reader& zr, const std::string& key) {
  const json* o = zr.object(key);
  if (o == nullptr) return OffloadDevice::none;
  Reader r(*o, zr.key_path(key), zr.warnings());
  const std::string dev = r.string("device", "none");
  r.boolean("pin_memory", false);
  r.number("buffer_count", 4);
  if (key == "offload_optimizer") {
    r.refuse_unknown_as_deepspeed(deepspeed_keys::kOffloadOptimizerKeys, deepspeed_keys::kOffloadOptimizerKeysModel);
  } else {
    r.refuse_unknown_as_deepspeed(deepspeed_keys::kOffloadParamKeys, deepspeed_keys::kOffloadParamKeysModel);
  }
  if (dev == "none") return OffloadDevice::none;
  if (dev == "cpu") return OffloadDevice::cpu;
  if (dev == "nvme") {
    throw NotImplementedError(fmt::format("'{}.device': nvme offload is not modelled; use cpu or none",
                                          zr.key_path(key)));
  }
  throw r.error("device", fmt::format("'{}' is not an offload device: use cpu or none", dev));
}

void read_zero(Config& c, Reader& top) {
  const json* z = top.object("zero_optimization");
  if (z == nullptr) return;
  Reader r(*z, "zero_optimization", c.warnings);
  ZeroConfig& zc = c.zero;
  zc.stage = r.small_integer("stage", 0);
  require(zc.stage >= 0 && zc.stage <= 3, r, "stage", fmt::format("{} is not a ZeRO stage: use 0, 1, 2 or 3", zc.stage));
  zc.contiguous_gradients = r.boolean("contiguous_gradients", true);
  zc.overlap_comm = r.boolean("overlap_comm", zc.stage == 3);
  zc.reduce_bucket_size = r.integer("reduce_bucket_size", zc.reduce_bucket_size);
  require(zc.reduce_bucket_size > 0, r, "reduce_bucket_size", "must be a positive number of elements");  // DeepSpeed: gt=0
  zc.allgather_bucket_size = r.integer("allgather_bucket_size", zc.allgather_bucket_size);
  require(zc.allgather_bucket_size >= 0, r, "allgather_bucket_size", "must be >= 0 elements");  // DeepSpeed: ge=0
  zc.reduce_scatter = r.boolean("reduce_scatter", true);
  zc.round_robin_gradients = r.boolean("round_robin_gradients", false);
  zc.parameter_alignment = r.boolean("parameter_alignment", false);
  zc.use_multi_rank_bucket_allreduce = r.boolean("use_multi_rank_bucket_allreduce", true);
  zc.offload_optimizer = read_offload(r, "offload_optimizer");
  zc.offload_param = read_offload(r, "offload_param");
  zc.stage3_param_persistence_threshold =
      r.integer("stage3_param_persistence_threshold", r.integer("param_persistence_threshold", zc.stage3_param_persistence_threshold));
  require(zc.stage3_param_persistence_threshold >= 0, r, "stage3_param_persistence_threshold", "must be >= 0");
  zc.stage3_prefetch_bucket_size = r.integer("stage3_prefetch_bucket_size", r.integer("prefetch_bucket_size", zc.stage3_prefetch_bucket_size));
  require(zc.stage3_prefetch_bucket_size >= 0, r, "stage3_prefetch_bucket_size", "must be >= 0");
  zc.stage3_max_live_parameters = r.integer("stage3_max_live_parameters", r.integer("max_live_parameters", zc.stage3_max_live_parameters));
  require(zc.stage3_max_live_parameters >= 0, r, "stage3_max_live_parameters", "must be >= 0");
  zc.stage3_max_reuse_distance = r.integer("stage3_max_reuse_distance", r.integer("max_reuse_distance", zc.stage3_max_reuse_distance));
  require(zc.stage3_max_reuse_distance >= 0, r, "stage3_max_reuse_distance", "must be >= 0");
  for (const char* k : {"allgather_partitions", "load_from_fp32_weights", "elastic_checkpoint",
                        "sub_group_size",
                        "stage3_gather_16bit_weights_on_model_save", "ignore_unused_parameters"}) {
    if (r.has(k)) c.warnings.push_back(fmt::format("'zero_optimization.{}' accepted and ignored: it does not change what zerocheck models", k));
  }
  r.refuse_unknown_as_deepspeed(deepspeed_keys::kZeroKeys, deepspeed_keys::kZeroKeysModel);
  // DeepSpeed 0.19.8 accepts both and acts on neither (only ZeRO-3 partitions parameters; stage 0
  // builds no ZeRO optimizer to offload): zerocheck does the same, and says so.
  if (zc.offload_param == OffloadDevice::cpu && zc.stage != 3) {
    c.warnings.push_back(fmt::format("'zero_optimization.offload_param' ignored at stage {}: only ZeRO-3 partitions "
                                     "(and so offloads) parameters, and DeepSpeed ignores it there too", zc.stage));
    zc.offload_param = OffloadDevice::none;
  }
  if (zc.offload_optimizer == OffloadDevice::cpu && zc.stage == 0) {
    c.warnings.push_back("'zero_optimization.offload_optimizer' ignored at stage 0: there is no partitioned "
                         "optimizer state to offload, and DeepSpeed ignores it there too");
    zc.offload_optimizer = OffloadDevice::none;
  }
}

// DeepSpeed's WarmupLR / WarmupDecayLR: their constructor arguments, their defaults and checks.
void read_scheduler(Config& c, Reader& top) {
  const json* o = top.object("scheduler");
  if (o == nullptr) return;
  Reader r(*o, "scheduler", c.warnings);
  const std::string type = r.string("type", "");
  LrSchedule& s = c.optimizer.schedule;
  if (type == "WarmupLR") {
    s.type = LrScheduleType::warmup;
  } else if (type == "WarmupDecayLR") {
    s.type = LrScheduleType::warmup_decay;
  } else if (type == "OneCycle" || type == "LRRangeTest" || type == "WarmupCosineLR") {
    throw NotImplementedError(fmt::format("'scheduler.type': {} is not modelled; use WarmupLR or WarmupDecayLR, or "
                                          "drop the scheduler block (a constant learning rate)", type));
  } else {
    throw r.error("type", fmt::format("'{}' is not a DeepSpeed scheduler: use WarmupLR or WarmupDecayLR", type));
  }
  const json* p = r.object("params");
  r.warn_unknown();
  if (s.type == LrScheduleType::warmup_decay && p == nullptr) {
    throw ConfigError("'scheduler.params.total_num_steps' is required by WarmupDecayLR");
  }
  if (p == nullptr) return;
  Reader pr(*p, "scheduler.params", c.warnings);
  s.warmup_min_lr = pr.number("warmup_min_lr", 0.0);
  if (pr.has("warmup_max_lr")) {
    s.warmup_max_lr = pr.number("warmup_max_lr", 0.0);
  } else if (s.type == LrScheduleType::warmup_decay) {
    s.warmup_max_lr = 0.001;  // WarmupDecayLR's own default (lr_schedules.py:818); WarmupLR's is the optimizer's lr
  }
  s.warmup_num_steps = pr.integer("warmup_num_steps", 1000);
  require(s.warmup_num_steps > 0, pr, "warmup_num_steps", "must be a positive integer (DeepSpeed raises otherwise)");
  const std::string wt = pr.string("warmup_type", "log");
  s.linear = wt == "linear";
  if (wt != "log" && wt != "linear") {
    c.warnings.push_back(fmt::format("'scheduler.params.warmup_type' {} is unknown: log is used, as DeepSpeed does", wt));
  }
  if (s.type == LrScheduleType::warmup_decay) {
    require(pr.has("total_num_steps"), pr, "total_num_steps", "is required by WarmupDecayLR");
    s.total_num_steps = pr.integer("total_num_steps", 0);
  }
  pr.integer("last_batch_iteration", -1);
  pr.warn_unknown();
}

std::string lowercase(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

void read_optimizer(Config& c, Reader& top) {
  const json* o = top.object("optimizer");
  if (o == nullptr) {
    c.optimizer_given = false;  // engine.py has_optimizer: no client optimizer, no config block
    return;
  }
  Reader r(*o, "optimizer", c.warnings);
  const std::string type = r.string("type", "Adam");
  OptimizerConfig& oc = c.optimizer;
  // DeepSpeed lower-cases the names of its own optimizers (config.py: DEEPSPEED_OPTIMIZERS) and
  // takes any other from torch.optim by its exact name (engine.py _configure_basic_optimizer).
  const std::string lower = lowercase(type);
  if (lower == "adam") {
    oc.type = OptimizerType::adam;
  } else if (lower == "adamw") {
    oc.type = OptimizerType::adamw;
  } else if (type == "SGD") {
    oc.type = OptimizerType::sgd;
  } else if (lower == "sgd") {
    throw r.error("type", fmt::format("{} is not a supported DeepSpeed Optimizer: DeepSpeed takes SGD from torch.optim "
                                      "by its exact name; spell it \"SGD\"", type));
  } else {
    throw NotImplementedError(fmt::format("'optimizer.type': {} is not modelled; use Adam, AdamW or SGD", type));
  }
  const json* p = r.object("params");
  r.warn_unknown();
  if (p == nullptr) return;
  Reader pr(*p, "optimizer.params", c.warnings);
  for (const auto& [key, value] : p->items()) oc.param_keys.push_back(key);
  oc.lr = pr.number("lr", oc.lr);
  require(oc.lr >= 0, pr, "lr", fmt::format("learning rate {} is negative", oc.lr));
  if (pr.has("betas")) {
    const json& b = p->at("betas");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number()) {
      throw pr.error("betas", fmt::format("must be two numbers [beta1, beta2], got {}", b.dump()));
    }
    oc.beta1 = b[0].get<double>();
    oc.beta2 = b[1].get<double>();
    require(oc.beta1 >= 0 && oc.beta1 < 1 && oc.beta2 >= 0 && oc.beta2 < 1, pr, "betas", "each beta must be in [0, 1)");
  }
  oc.eps = pr.number("eps", oc.eps);
  require(oc.eps > 0, pr, "eps", "must be positive");
  oc.weight_decay = pr.number("weight_decay", oc.weight_decay);
  require(oc.weight_decay >= 0, pr, "weight_decay", "must be >= 0");
  oc.adam_w_mode = pr.boolean("adam_w_mode", true);  // DeepSpeed: Adam is decoupled by default
  if (oc.type == OptimizerType::adamw) oc.adam_w_mode = true;
  oc.bias_correction = pr.boolean("bias_correction", true);
  oc.momentum = pr.number("momentum", 0.0);
  oc.dampening = pr.number("dampening", 0.0);
  oc.nesterov = pr.boolean("nesterov", false);
  oc.torch_adam = pr.boolean("torch_adam", false);
  oc.amsgrad = pr.boolean("amsgrad", false);
  // Every other key is checked against the constructor DeepSpeed calls (check_optimizer_params).
}

// engine.py _configure_basic_optimizer: 'max_grad_norm' is refused first; the other params are
// the chosen optimizer's keyword arguments (adam_w_mode, torch_adam and fp32_optimizer_states
// popped for Adam/AdamW), so a key its constructor does not take is the TypeError Python raises,
// and FusedAdam / DeepSpeedCPUAdam refuse amsgrad. Keys the constructor takes but zerocheck does
// not model are refused where they would change the arithmetic.
void check_optimizer_params(const Config& c) {
  const OptimizerConfig& o = c.optimizer;
  const auto given = [&](std::string_view k) { return std::find(o.param_keys.begin(), o.param_keys.end(), k) != o.param_keys.end(); };
  if (given("max_grad_norm")) {
    throw ConfigError("'max_grad_norm' is not supported as an optimizer parameter, please switch to using the deepspeed "
                      "parameter 'gradient_clipping' (DeepSpeed's ValueError, engine.py _configure_basic_optimizer)");
  }
  const bool adam = o.type != OptimizerType::sgd;
  const bool cpu_adam = adam && !o.torch_adam && c.zero.stage > 0 && c.zero.offload_optimizer == OffloadDevice::cpu;
  std::string impl;
  std::vector<std::string_view> takes;
  if (!adam) {
    impl = "SGD";
    takes = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable", "fused"};
  } else if (o.torch_adam) {
    impl = o.adam_w_mode ? "AdamW" : "Adam";
    takes = {"lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "maximize", "capturable", "differentiable",
             "fused", "decoupled_weight_decay"};
  } else if (cpu_adam) {
    impl = "DeepSpeedCPUAdam";
    takes = {"lr", "bias_correction", "betas", "eps", "weight_decay", "amsgrad"};
  } else {
    impl = "FusedAdam";
    takes = {"lr", "bias_correction", "betas", "eps", "weight_decay", "amsgrad", "set_grad_none"};
  }
  if (adam) takes.insert(takes.end(), {"adam_w_mode", "torch_adam", "fp32_optimizer_states"});  // popped first
  for (const std::string& k : o.param_keys) {
    if (std::find(takes.begin(), takes.end(), k) == takes.end()) {
      throw ConfigError(fmt::format("'optimizer.params.{}': DeepSpeed passes optimizer.params to {} as keyword arguments, "
                                    "and {}.__init__() got an unexpected keyword argument '{}' (TypeError); remove it",
                                    k, impl, impl, k));
    }
  }
  if (o.amsgrad && !o.torch_adam && adam) {
    throw ConfigError(fmt::format("{} does not support the AMSGrad variant. (DeepSpeed's RuntimeError)", impl));
  }
  if (o.amsgrad) throw NotImplementedError("'optimizer.params.amsgrad': torch's AMSGrad is not modelled");
  for (const char* k : {"maximize", "capturable", "differentiable", "decoupled_weight_decay", "foreach", "fused"}) {
    if (given(k)) {
      throw NotImplementedError(fmt::format("'optimizer.params.{}' ({}'s keyword argument) is not modelled: it selects "
                                            "another kernel or update; remove it", k, impl));
    }
  }
  if (given("fp32_optimizer_states") && cpu_adam) {
    throw NotImplementedError("'optimizer.params.fp32_optimizer_states' under offload is not modelled (DeepSpeedCPUAdam's "
                              "state dtype); remove it");
  }
}

void read_precision(Config& c, Reader& top) {
  if (const json* f = top.object("fp16")) {
    Reader r(*f, "fp16", c.warnings);
    Fp16Config& fc = c.fp16;
    fc.enabled = r.boolean("enabled", false);
    fc.loss_scale = r.number("loss_scale", 0.0);
    require(fc.loss_scale >= 0, r, "loss_scale", "must be >= 0 (0 selects dynamic loss scaling)");
    fc.initial_scale_power = r.small_integer("initial_scale_power", 16);
    require(fc.initial_scale_power >= 0 && fc.initial_scale_power <= 64, r, "initial_scale_power", "must be in [0, 64]");
    fc.loss_scale_window = r.small_integer("loss_scale_window", 1000);
    require(fc.loss_scale_window >= 1, r, "loss_scale_window", "must be >= 1");
    fc.hysteresis = r.small_integer("hysteresis", 2);
    require(fc.hysteresis >= 1, r, "hysteresis", "must be >= 1");
    fc.consecutive_hysteresis = r.boolean("consecutive_hysteresis", false);
    fc.min_loss_scale = r.number("min_loss_scale", 1.0);
    require(fc.min_loss_scale > 0, r, "min_loss_scale", "must be positive");
    r.boolean("auto_cast", false);
    r.refuse_unknown_as_deepspeed(deepspeed_keys::kFp16Keys, deepspeed_keys::kFp16KeysModel);
  }
  for (const char* key : {"bf16", "bfloat16"}) {
    const json* b = top.object(key);
    if (b == nullptr) continue;
    Reader r(*b, key, c.warnings);
    c.bf16.enabled = r.boolean("enabled", false);
    c.bf16.check_grad_overflow = r.boolean("check_grad_overflow", true);  // precision_config.py's default
    r.boolean("immediate_grad_update", false);
    r.refuse_unknown_as_deepspeed(deepspeed_keys::kBf16Keys, deepspeed_keys::kBf16KeysModel);
  }
  if (const json* d = top.object("data_types")) {
    Reader r(*d, "data_types", c.warnings);
    if (r.has("grad_accum_dtype")) {
      const std::string name = r.string("grad_accum_dtype", "");
      try {
        c.grad_accum_dtype = parse_dtype(name);
      } catch (const ConfigError&) {
        throw r.error("grad_accum_dtype", fmt::format("'{}' is not a dtype: use fp32, fp16 or bf16", name));
      }
    }
    r.warn_unknown();
  }
}

void read_parallel(Config& c, Reader& top) {
  c.sequence_parallel_size = top.small_integer("sequence_parallel_size", 1);
  require(c.sequence_parallel_size >= 1, top, "sequence_parallel_size", "must be >= 1");
  if (c.sequence_parallel_size > 1) {
    // DeepSpeed then reduces every ZeRO gradient in fp32 and divides by world / sp (stage_1_and_2.py
    // allreduce_bucket, average_tensor): not modelled, and ignoring it would give other bits.
    throw NotImplementedError(fmt::format("'sequence_parallel_size' {}: sequence parallelism is not modelled (DeepSpeed "
                                          "then reduces gradients in fp32 over world / sp); leave it 1",
                                          c.sequence_parallel_size));
  }
  if (const json* t = top.object("tensor_parallel")) {
    Reader r(*t, "tensor_parallel", c.warnings);
    c.autotp_size = r.small_integer("autotp_size", 1);
    require(c.autotp_size >= 1, r, "autotp_size", "must be >= 1");
    r.refuse_unknown_as_deepspeed(deepspeed_keys::kTensorParallelKeys, deepspeed_keys::kTensorParallelKeysModel);
  }
  if (const json* m = top.object("moe")) {
    Reader r(*m, "moe", c.warnings);
    r.boolean("enabled", true);
    c.ep_size = r.small_integer("ep_size", 1);
    require(c.ep_size >= 1, r, "ep_size", "must be >= 1");
    r.warn_unknown();
  }
  if (const json* k = top.object("compile")) {
    Reader r(*k, "compile", c.warnings);
    c.compile.deepcompile = r.boolean("deepcompile", false);
    if (r.has("passes")) {
      const json& p = k->at("passes");
      if (!p.is_array()) throw r.error("passes", fmt::format("must be a list of pass names, got {}", p.dump()));
      for (const json& name : p) {
        const std::string s = name.is_string() ? name.get<std::string>() : name.dump();
        if (s != "z1" && s != "z3" && s != "autosp" && s != "autotp") {
          throw r.error("passes", fmt::format("unknown pass {}: use z1, z3, autosp or autotp", s));
        }
        c.compile.passes.push_back(s);
      }
    }
    r.warn_unknown();
  }
}

void derive_batch_sizes(Config& c, Reader& top, int world) {
  const bool has_tbs = top.has("train_batch_size"), has_mb = top.has("train_micro_batch_size_per_gpu");
  const bool has_ga = top.has("gradient_accumulation_steps");
  c.train_batch_size = top.integer("train_batch_size", 0);
  c.train_micro_batch_size_per_gpu = top.integer("train_micro_batch_size_per_gpu", 0);
  c.gradient_accumulation_steps = top.integer("gradient_accumulation_steps", 1);
  require(c.gradient_accumulation_steps >= 1, top, "gradient_accumulation_steps", "must be >= 1");
  require(!has_tbs || c.train_batch_size >= 1, top, "train_batch_size", "must be >= 1");
  require(!has_mb || c.train_micro_batch_size_per_gpu >= 1, top, "train_micro_batch_size_per_gpu", "must be >= 1");
  const std::int64_t ga = c.gradient_accumulation_steps, w = world;
  // Each product of batch factors, refused when it passes int64 (signed overflow is undefined).
  auto product = [](std::int64_t a, std::int64_t b) {
    std::int64_t out = 0;
    if (__builtin_mul_overflow(a, b, &out)) {
      throw ConfigError(fmt::format("batch sizes: {} x {} overflows a 64-bit integer: "
                                    "'train_micro_batch_size_per_gpu', "
                                    "'gradient_accumulation_steps' and the world size multiply "
                                    "to the global batch", a, b));
    }
    return out;
  };
  if (has_tbs && has_mb) {
    const std::int64_t implied = product(c.train_micro_batch_size_per_gpu, w);
    if (!has_ga) {
      if (c.train_batch_size % implied != 0) {
        throw ConfigError(fmt::format("'train_batch_size' {} is not a multiple of train_micro_batch_size_per_gpu {} x world {}",
                                      c.train_batch_size, c.train_micro_batch_size_per_gpu, w));
      }
      c.gradient_accumulation_steps = c.train_batch_size / implied;
    } else if (c.train_batch_size != product(implied, ga)) {
      throw ConfigError(fmt::format(
          "'train_batch_size' {} != train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x world {}; "
          "fix one of the three or drop train_batch_size", c.train_batch_size, c.train_micro_batch_size_per_gpu, ga, w));
    }
  } else if (has_tbs) {
    if (c.train_batch_size % product(ga, w) != 0) {
      throw ConfigError(fmt::format("'train_batch_size' {} is not divisible by gradient_accumulation_steps {} x world {}",
                                    c.train_batch_size, ga, w));
    }
    c.train_micro_batch_size_per_gpu = c.train_batch_size / product(ga, w);
  } else if (has_mb) {
    c.train_batch_size = product(product(c.train_micro_batch_size_per_gpu, ga), w);
  } else {
    throw ConfigError("either 'train_batch_size' or 'train_micro_batch_size_per_gpu' must be set");
  }
}

// prescale_gradients / gradient_predivide_factor where DeepSpeed reads them (Note [Stage 0
// post-scaling]): engine.allreduce_bucket (stage 0, BF16_Optimizer) applies them; ZeRO-2 and 3
// with reduce_scatter assert (stage_1_and_2.py:350-351, stage3.py:395-396, their messages);
// ZeRO-1's average_tensor with reduce_scatter does not read them.
void check_gradient_scaling(Config& c) {
  const double f = c.gradient_predivide_factor;
  if (!(f > 0) || !std::isfinite(f)) {
    throw ConfigError(fmt::format("'gradient_predivide_factor' {} must be a positive number", f));
  }
  if (f == 1.0 && !c.prescale_gradients) return;
  const int stage = c.zero.stage;
  if (stage == 0 || c.uses_bf16_optimizer()) return;
  const std::string where = stage == 3 ? "ZeRO-3" : fmt::format("ZeRO-{}", stage);
  if (stage >= 2 && c.zero.reduce_scatter) {
    if (f != 1.0) {
      throw ConfigError(fmt::format("'gradient_predivide_factor' {}: gradient_predivide_factor != 1.0 is not yet "
                                    "supported with {} with reduce scatter enabled (DeepSpeed's assertion)", f, where));
    }
    throw ConfigError(fmt::format("'prescale_gradients': pre-scale gradients is not yet supported with {} with "
                                  "reduce scatter enabled (DeepSpeed's assertion)", where));
  }
  if (!c.zero.reduce_scatter) {
    if (stage == 3) {
      throw NotImplementedError("'prescale_gradients' / 'gradient_predivide_factor' with ZeRO-3 and "
                                "'zero_optimization.reduce_scatter': false are not modelled");
    }
    return;  // ZeRO-1/2: gradient_reduction_w_predivide applies them
  }
  c.warnings.push_back("'prescale_gradients' / 'gradient_predivide_factor' accepted and ignored at ZeRO-1: "
                       "DeepSpeed's average_tensor with reduce_scatter does not read them");
}

void check_combinations(Config& c) {
  check_optimizer_params(c);  // DeepSpeed builds the optimizer before its ZeRO sanity check
  if (c.zero.stage > 0 && c.optimizer.type == OptimizerType::sgd) {  // engine.py _do_optimizer_sanity_check
    if (!c.zero_allow_untested_optimizer) {
      throw ConfigError("You are using an untested ZeRO Optimizer. Please add <\"zero_allow_untested_optimizer\": true> in "
                        "the configuration file to use it. (DeepSpeed's assertion: SGD is not in ZERO_SUPPORTED_OPTIMIZERS)");
    }
    c.warnings.push_back("**** You are using ZeRO with an untested optimizer, proceed with caution ***** (SGD)");
  }
  if (c.fp16.enabled && c.bf16.enabled) {
    throw ConfigError("'fp16.enabled' and 'bf16.enabled' are both true: choose one precision");
  }
  const DType model = c.model_dtype(), accum = c.accumulation_dtype();
  // DeepSpeedZeroOptimizer pads each param of its flat buffer to 16 bytes with parameter_alignment:
  // another layout. Stage 0, stage 3 and BF16_Optimizer do not read the key.
  if ((c.zero.stage == 1 || c.zero.stage == 2) && !c.uses_bf16_optimizer() && c.zero.parameter_alignment) {
    throw NotImplementedError("'zero_optimization.parameter_alignment': true is not modelled at ZeRO-1/2 (DeepSpeed then "
                              "pads every param of the flat buffer to 16 bytes); leave it false");
  }
  // DeepSpeedZeroOptimizer (ZeRO-1/2, not the BF16_Optimizer wrapper) asserts the all-gather
  // bucket is a multiple of its 2-element start alignment (stage_1_and_2.py __init__).
  if ((c.zero.stage == 1 || c.zero.stage == 2) && !c.uses_bf16_optimizer() && c.zero.allgather_bucket_size % 2 != 0) {
    throw ConfigError(fmt::format("'zero_optimization.allgather_bucket_size' {}: allgather_bucket_size must be a multiple "
                                  "of nccl_start_alignment_factor, 2 (DeepSpeed's assertion at ZeRO-1/2)",
                                  c.zero.allgather_bucket_size));
  }
  if (model == DType::f16 && accum != DType::f16) {
    throw NotImplementedError(fmt::format("'data_types.grad_accum_dtype' {} with fp16: DeepSpeed supports fp16 "
                                          "accumulation only", dtype_name(accum)));
  }
  if (model == DType::f32 && accum != DType::f32) {
    throw ConfigError(fmt::format("'data_types.grad_accum_dtype' {} is narrower than the fp32 model", dtype_name(accum)));
  }
  if (!c.zero_enabled() && model != accum) {
    throw NotImplementedError(fmt::format("'data_types.grad_accum_dtype' {} with a {} model needs ZeRO stage >= 1 "
                                          "(unsupported mix without ZeRO)", dtype_name(accum), dtype_name(model)));
  }
  if (!c.managed_gradient_accumulation) {
    throw NotImplementedError("'managed_gradient_accumulation': false (caller-owned boundaries) is not modelled "
                              "yet; remove the key or set it to true");
  }
  if (c.gradient_clipping < 0) throw ConfigError("'gradient_clipping' must be >= 0 (0 disables clipping)");
}

}  // namespace

Config Config::from_json(const json& j, int world_size) {
  if (world_size < 1) throw UsageError(fmt::format("Config: world size {} must be >= 1", world_size));
  Config c;
  Reader top(j, "", c.warnings);
  derive_batch_sizes(c, top, world_size);
  c.gradient_clipping = top.number("gradient_clipping", 0.0);
  c.prescale_gradients = top.boolean("prescale_gradients", false);
  c.gradient_predivide_factor = top.number("gradient_predivide_factor", 1.0);
  c.managed_gradient_accumulation = top.boolean("managed_gradient_accumulation", true);
  c.steps_per_print = top.small_integer("steps_per_print", 10);
  read_optimizer(c, top);
  read_scheduler(c, top);
  read_precision(c, top);
  read_zero(c, top);
  read_parallel(c, top);
  c.zero_allow_untested_optimizer = top.boolean("zero_allow_untested_optimizer", false);
  top.boolean("zero_force_ds_cpu_optimizer", true);  // read where a client optimizer is added (engine/hf_auto.h)
  if (top.has("communication_data_type")) {  // config.py get_communication_data_type
    const std::string v = lowercase(top.string("communication_data_type", ""));
    if (v == "fp32") c.communication_data_type = DType::f32;
    else if (v == "fp16") c.communication_data_type = DType::f16;
    else if (v == "bf16") c.communication_data_type = DType::bf16;
    else throw top.error("communication_data_type", fmt::format("Invalid communication_data_type. Supported data "
                                                                "types: ['fp16', 'bf16', 'fp32']. Got: {}", v));
  }
  for (const char* k : {"wall_clock_breakdown", "flops_profiler", "tensorboard", "wandb", "comms_logger", "dump_state"}) {
    if (top.has(k)) c.warnings.push_back(fmt::format("'{}' accepted and ignored: not modelled", k));
  }
  if (const json* a = top.object("activation_checkpointing")) {  // deepspeed.checkpointing.configure
    Reader r(*a, "activation_checkpointing", c.warnings);
    ActivationCheckpointingConfig& ac = c.activation_checkpointing;
    ac.given = true;
    ac.partition_activations = r.boolean("partition_activations", false);
    ac.contiguous_memory_optimization = r.boolean("contiguous_memory_optimization", false);
    ac.cpu_checkpointing = r.boolean("cpu_checkpointing", false);
    // DeepSpeed reads it with get_scalar_param, whatever its type; Megatron passes the layer count
    // to configure() in code, and public configs write false or null here.
    if (r.has("number_checkpoints") && !(*a)["number_checkpoints"].is_number()) {
      c.warnings.push_back(fmt::format("'activation_checkpointing.number_checkpoints' is {}: taken as not given",
                                       (*a)["number_checkpoints"].dump()));
    } else {
      ac.number_checkpoints = r.integer("number_checkpoints", 0);
      require(ac.number_checkpoints >= 0, r, "number_checkpoints", "must be >= 0");
    }
    ac.synchronize_checkpoint_boundary = r.boolean("synchronize_checkpoint_boundary", false);
    ac.profile = r.boolean("profile", false);
    // DeepSpeed's engine only parses the block; checkpointing.py configure() asserts that
    // contiguous_memory_optimization has partition_activations and number_checkpoints, when a
    // model's code calls it. zerocheck checks them where it models that call (plan
    // --activation-checkpointing: TransformerSpec::invalid()).
    r.warn_unknown();  // DeepSpeed ignores unknown keys here (get_scalar_param): a warning, not a refusal
    c.warnings.push_back("'activation_checkpointing' configures deepspeed.checkpointing: it takes effect only where "
                         "the model calls deepspeed.checkpointing.checkpoint (Megatron-style models; zerocheck plan "
                         "--activation-checkpointing plans a transformer whose layers do). A Hugging Face model's "
                         "gradient checkpointing is torch.utils.checkpoint (zerocheck plan --gradient-checkpointing)");
  }
  top.warn_unknown();
  check_gradient_scaling(c);
  check_combinations(c);
  return c;
}

json parse_ds_config_text(const std::string& text) { return parse_hjson(text); }

Config Config::from_json_text(const std::string& text, int world_size) {
  return from_json(parse_ds_config_text(text), world_size);
}

Config Config::from_file(const std::string& path, int world_size) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot read ds_config file '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), world_size);
}

DType Config::model_dtype() const {
  if (fp16.enabled) return DType::f16;
  if (bf16.enabled) return DType::bf16;
  return DType::f32;
}

DType Config::accumulation_dtype() const { return grad_accum_dtype.value_or(model_dtype()); }

DType Config::comm_dtype() const {
  if (communication_data_type) return *communication_data_type;
  return fp16.enabled ? DType::f16 : bf16.enabled ? DType::bf16 : DType::f32;
}

bool Config::uses_bf16_optimizer() const {
  return zero.stage == 1 && model_dtype() == DType::bf16 && accumulation_dtype() == DType::f32 &&
         zero.offload_optimizer != OffloadDevice::cpu;
}

}  // namespace zc
