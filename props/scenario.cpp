// Scenario <-> JSON, the ds_config it trains with, and exact-domain sizing.
#include "props/scenario.h"

#include "engine/errors.h"
#include "models/mlp.h"
#include "models/synthetic.h"
#include "models/transformer.h"
#include "models/tree.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <set>

namespace zc::props {

nlohmann::json to_json(const Scenario& s) {
  nlohmann::json j = {{"world", s.world},
          {"stage", s.stage},
          {"contiguous_gradients", s.contiguous},
          {"overlap_comm", s.overlap},
          {"reduce_bucket_size", s.reduce_bucket_size},
          {"dtype", s.dtype},
          {"grad_accum_dtype", s.grad_accum_dtype},
          {"offload", s.offload},
          {"gradient_clipping", s.clip},
          {"gradient_accumulation_steps", s.ga},
          {"n_backward", s.n},
          {"steps", s.steps},
          {"coalesce", s.coalesce},
          {"model", s.model},
          {"shape", s.shape},
          {"compile_passes", s.passes},
          {"deepcompile", s.deepcompile},
          {"domain", s.domain},
          {"seed", s.seed},
          {"sched_seed", s.sched_seed},
          {"fault", s.fault},
          {"commands", s.commands},
          {"boundary", s.boundary},
          {"optimizer", s.optimizer},
          {"lr", s.lr},
          {"betas", {s.beta1, s.beta2}},
          {"eps", s.eps},
          {"weight_decay", s.weight_decay},
          {"momentum", s.momentum},
          {"torch_adam", s.torch_adam},
          {"adam_w_mode", s.adam_w_mode},
          {"check_grad_overflow", s.check_grad_overflow}};
  if (s.prescale) j["prescale_gradients"] = true;
  if (s.predivide != 1.0) j["gradient_predivide_factor"] = s.predivide;
  if (!s.reduce_scatter) j["reduce_scatter"] = false;
  if (!s.allow_untested_optimizer) j["zero_allow_untested_optimizer"] = false;
  if (!s.extra_optimizer_params.empty()) j["extra_optimizer_params"] = s.extra_optimizer_params;
  if (s.allgather_bucket_size >= 0) j["allgather_bucket_size"] = s.allgather_bucket_size;
  if (!s.comm_dtype.empty()) j["communication_data_type"] = s.comm_dtype;
  if (s.round_robin) j["round_robin_gradients"] = true;
  if (!s.multi_rank_bucket_allreduce) j["use_multi_rank_bucket_allreduce"] = false;
  if (!s.checkpointing.empty()) j["checkpointing"] = s.checkpointing;
  j["ep_size"] = s.ep_size;
  return j;
}

namespace {

// Note [Scenario limits]: a scenario file is untrusted input, and what it names is simulated in
// full (a fiber per rank, every param allocated), so the parser refuses sizes far past what the
// generators draw (world <= 8, shapes of a few dozen) before anything is attempted.
constexpr std::int64_t kMaxWorld = 1024;
constexpr std::int64_t kMaxSteps = 1000;
constexpr std::int64_t kMaxBackwards = 64;                 // n_backward
constexpr std::int64_t kMaxGa = 1024;                      // gradient_accumulation_steps
constexpr std::size_t kMaxShapeEntries = 64;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 24;  // params of the model, all together
constexpr std::int64_t kMaxMlpFan = std::int64_t{1} << 40;    // product of MLP widths past input

// An integer key within [lo, hi]. nlohmann's get<int> casts a float or a too-large integer (for a
// float out of range, undefined behaviour), so the JSON value is checked first.
std::int64_t integer_in(const nlohmann::json& v, const std::string& key, std::int64_t lo,
                        std::int64_t hi) {
  if (!v.is_number_integer()) {
    throw ConfigError(fmt::format("scenario key '{}': an integer, got {}", key, v.dump()));
  }
  const bool too_big =
      v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi);
  if (too_big || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi) {
    throw ConfigError(fmt::format("scenario key '{}': {} is out of range [{}, {}]", key, v.dump(),
                                  lo, hi));
  }
  return v.get<std::int64_t>();
}

template <class T>
void read_int(const nlohmann::json& j, const char* key, T& out, std::int64_t lo, std::int64_t hi) {
  if (j.contains(key)) out = static_cast<T>(integer_in(j.at(key), key, lo, hi));
}

// seed and sched_seed: any unsigned 64-bit integer.
void read_u64(const nlohmann::json& j, const char* key, std::uint64_t& out) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  // A parsed 5 is unsigned, a 5 set from C++ code signed: both are seeds; a float or -1 is not.
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
    throw ConfigError(
        fmt::format("scenario key '{}': an integer in [0, 2^64), got {}", key, v.dump()));
  }
  out = v.get<std::uint64_t>();
}

void read_shape(const nlohmann::json& j, std::vector<std::int64_t>& out) {
  if (!j.contains("shape")) return;
  const nlohmann::json& v = j.at("shape");
  if (!v.is_array() || v.size() > kMaxShapeEntries) {
    throw ConfigError(fmt::format("scenario key 'shape': a list of at most {} integers, got {}",
                                  kMaxShapeEntries, v.dump()));
  }
  out.clear();
  for (const nlohmann::json& d : v) out.push_back(integer_in(d, "shape", 0, kMaxElements));
}

// The model's param count (Synthetic: the sum; MLP: weights and biases) and, for an MLP, the
// fan product exact_spec sizes sums by, each refused past its limit.
void check_model_size(const Scenario& s) {
  std::int64_t elements = 0, fan = 1;
  for (std::size_t i = 0; i < s.shape.size() && s.model != "tree"; ++i) {
    if (s.model == "synthetic") {
      elements += s.shape[i];
    } else if (i + 1 < s.shape.size()) {
      elements += (s.shape[i] + 1) * s.shape[i + 1];  // each factor <= 2^24: no overflow
      fan = fan > kMaxMlpFan / s.shape[i + 1] ? kMaxMlpFan + 1 : fan * s.shape[i + 1];
    }
    if (elements > kMaxElements) {
      throw ConfigError(fmt::format("scenario key 'shape': {} {} has more than {} params",
                                    s.model, fmt::join(s.shape, ","), kMaxElements));
    }
  }
  if (fan > kMaxMlpFan) {
    throw ConfigError(fmt::format("scenario key 'shape': the widths of mlp {} after the input "
                                  "multiply to more than {}", fmt::join(s.shape, ","), kMaxMlpFan));
  }
}

template <class T>
void read(const nlohmann::json& j, const char* key, T& out) {
  if (!j.contains(key)) return;  // absent: the default
  try {
    out = j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("scenario key '{}': {} (got {})", key, e.what(), j.at(key).dump()));
  }
}

void check_one_of(const char* key, const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (v == a) return;
  }
  throw ConfigError(fmt::format("scenario key '{}': '{}' is not one of {}", key, v, fmt::join(allowed, ", ")));
}

}  // namespace

Scenario scenario_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw ConfigError("a scenario is a JSON object; got " + j.dump());
  static const std::set<std::string> known = {
      "world", "stage", "contiguous_gradients", "overlap_comm", "reduce_bucket_size", "dtype",
      "grad_accum_dtype", "offload", "gradient_clipping", "gradient_accumulation_steps", "n_backward",
      "steps", "coalesce", "model", "shape", "compile_passes", "deepcompile", "domain", "seed", "sched_seed", "fault", "commands",
      "boundary", "optimizer", "lr", "betas", "eps", "weight_decay", "momentum", "torch_adam", "adam_w_mode",
      "check_grad_overflow",
      "prescale_gradients", "gradient_predivide_factor", "reduce_scatter", "zero_allow_untested_optimizer",
      "allgather_bucket_size", "communication_data_type", "round_robin_gradients",
      "use_multi_rank_bucket_allreduce", "extra_optimizer_params", "checkpointing", "ep_size"};
  for (const auto& [k, v] : j.items()) {
    if (!known.contains(k)) {
      throw ConfigError(fmt::format("unknown scenario key '{}': the keys are {}", k, fmt::join(known, ", ")));
    }
  }
  Scenario s;
  read_int(j, "world", s.world, 1, kMaxWorld);
  read_int(j, "stage", s.stage, 0, 3);
  read(j, "contiguous_gradients", s.contiguous);
  read(j, "overlap_comm", s.overlap);
  // 0 is read so that a scenario can carry it to both sides, which refuse it.
  read_int(j, "reduce_bucket_size", s.reduce_bucket_size, 0, std::int64_t{1} << 62);
  read(j, "dtype", s.dtype);
  read(j, "grad_accum_dtype", s.grad_accum_dtype);
  read(j, "offload", s.offload);
  read(j, "gradient_clipping", s.clip);
  read_int(j, "gradient_accumulation_steps", s.ga, 1, kMaxGa);
  read_int(j, "n_backward", s.n, 1, kMaxBackwards);
  read_int(j, "steps", s.steps, 1, kMaxSteps);
  read(j, "coalesce", s.coalesce);
  read(j, "model", s.model);
  read_shape(j, s.shape);
  read(j, "compile_passes", s.passes);
  read(j, "deepcompile", s.deepcompile);
  read(j, "domain", s.domain);
  read_u64(j, "seed", s.seed);
  read_u64(j, "sched_seed", s.sched_seed);
  read(j, "fault", s.fault);
  read(j, "commands", s.commands);
  read(j, "boundary", s.boundary);
  read(j, "optimizer", s.optimizer);
  read(j, "lr", s.lr);
  if (j.contains("betas")) {
    std::vector<double> betas;
    read(j, "betas", betas);
    if (betas.size() != 2) throw ConfigError(fmt::format("scenario key 'betas': two numbers, got {}", j.at("betas").dump()));
    s.beta1 = betas[0];
    s.beta2 = betas[1];
  }
  read(j, "eps", s.eps);
  read(j, "weight_decay", s.weight_decay);
  read(j, "momentum", s.momentum);
  read(j, "torch_adam", s.torch_adam);
  read(j, "adam_w_mode", s.adam_w_mode);
  read(j, "check_grad_overflow", s.check_grad_overflow);
  read(j, "prescale_gradients", s.prescale);
  read(j, "gradient_predivide_factor", s.predivide);
  read(j, "reduce_scatter", s.reduce_scatter);
  read(j, "zero_allow_untested_optimizer", s.allow_untested_optimizer);
  if (j.contains("extra_optimizer_params")) {
    if (!j["extra_optimizer_params"].is_object()) {
      throw ConfigError("scenario key 'extra_optimizer_params' must be an object of optimizer.params keys");
    }
    s.extra_optimizer_params = j["extra_optimizer_params"];
  }
  read_int(j, "allgather_bucket_size", s.allgather_bucket_size, 0, std::int64_t{1} << 62);
  read(j, "communication_data_type", s.comm_dtype);
  read(j, "round_robin_gradients", s.round_robin);
  read(j, "use_multi_rank_bucket_allreduce", s.multi_rank_bucket_allreduce);
  read(j, "checkpointing", s.checkpointing);
  read_int(j, "ep_size", s.ep_size, 1, kMaxWorld);
  if (!(s.predivide > 0) || !std::isfinite(s.predivide)) {
    throw ConfigError(fmt::format("scenario key 'gradient_predivide_factor': {} must be a positive number", s.predivide));
  }
  check_one_of("boundary", s.boundary, {"explicit", "implicit"});
  check_one_of("optimizer", s.optimizer, {"", "Adam", "AdamW", "SGD"});
  check_one_of("fault", s.fault, {"", "crash", "mismatch", "deadlock", "step-in-coalesce", "coalesce-in-no-sync", "stale-backward",
                                  "dropped-collective", "slow-rank"});
  check_one_of("dtype", s.dtype, {"f32", "f16", "bf16"});
  check_one_of("grad_accum_dtype", s.grad_accum_dtype, {"", "f32"});
  check_one_of("communication_data_type", s.comm_dtype, {"", "f32", "f16", "bf16"});
  check_one_of("offload", s.offload, {"none", "optimizer", "param", "both"});
  check_one_of("model", s.model, {"synthetic", "mlp", "tree", "gpt2-tiny", "llama-tiny", "llama-gqa-tiny", "mixtral-tiny"});
  check_one_of("domain", s.domain, {"exact", "gaussian"});
  check_one_of("checkpointing", s.checkpointing, {"", "torch", "deepspeed", "deepspeed-partition"});
  if (!s.checkpointing.empty() && !is_transformer(s)) {
    throw ConfigError(fmt::format("scenario key 'checkpointing': {} has no decoder layers to checkpoint; only the "
                                  "transformer presets (gpt2-tiny, llama-tiny, llama-gqa-tiny, mixtral-tiny) take it", s.model));
  }
  if (s.ep_size != 1 && !is_moe(s)) {
    throw ConfigError(fmt::format("scenario key 'ep_size': {} has no experts to spread; only mixtral-tiny takes it",
                                  s.model));
  }
  if (is_moe(s)) {
    const int experts = transformer_preset(s.model).experts;
    if (experts % s.ep_size != 0 || s.world % s.ep_size != 0) {
      throw ConfigError(fmt::format("scenario key 'ep_size': {} must divide the experts ({}) and the world ({})",
                                    s.ep_size, experts, s.world));
    }
  }
  if (is_transformer(s)) {
    if (!s.shape.empty()) throw ConfigError(fmt::format("scenario key 'shape': the transformer preset {} takes none ([])", s.model));
    if (s.domain != "gaussian") {
      throw ConfigError(fmt::format("scenario key 'domain': {} has no exact-domain data (softmax, norms and "
                                    "rotary positions are never exact); use gaussian", s.model));
    }
  }
  if (s.world < 1 || s.n < 1 || s.ga < 1 || s.steps < 1) {
    throw ConfigError(fmt::format("scenario: world ({}), n_backward ({}), gradient_accumulation_steps ({}) "
                                  "and steps ({}) must be >= 1", s.world, s.n, s.ga, s.steps));
  }
  if ((s.shape.empty() && s.model != "tree" && !is_transformer(s)) || (s.model == "mlp" && s.shape.size() < 2)) {
    throw ConfigError(fmt::format("scenario key 'shape': {} needs {} entries", s.model, s.model == "mlp" ? "at least 2" : "at least 1"));
  }
  for (std::int64_t d : s.shape) {
    if (d < (s.model == "tree" ? 0 : 1)) throw ConfigError(fmt::format("scenario key 'shape': sizes must be >= 1, got {}", d));
  }
  check_model_size(s);
  return s;
}

DType dtype_of(const Scenario& s) { return parse_dtype(s.dtype); }

bool is_transformer(const Scenario& s) {
  return s.model == "gpt2-tiny" || s.model == "llama-tiny" || s.model == "llama-gqa-tiny" || is_moe(s);
}

bool is_moe(const Scenario& s) { return s.model == "mixtral-tiny"; }

std::string describe(const Scenario& s) {
  std::string out = fmt::format("z{} w{} n{} ga{} steps{} {}", s.stage, s.world, s.n, s.ga, s.steps, s.dtype);
  if (!s.grad_accum_dtype.empty()) out += "+acc" + s.grad_accum_dtype;
  if (s.contiguous) out += " contiguous";
  if (s.overlap) out += " overlap";
  out += fmt::format(" bucket {}", s.reduce_bucket_size);
  if (s.offload != "none") out += " offload-" + s.offload;
  if (s.clip > 0) out += fmt::format(" clip {}", s.clip);
  if (s.coalesce) out += " coalesced";
  out += fmt::format(" {}[{}] {}", s.model, fmt::join(s.shape, ","), s.domain);
  if (!s.checkpointing.empty()) out += " checkpointing " + s.checkpointing;
  if (!s.passes.empty()) out += fmt::format(" compile[{}]{}", fmt::join(s.passes, ","), s.deepcompile ? "" : " deepcompile off");
  if (!s.fault.empty()) out += " fault " + s.fault;
  if (!s.commands.empty()) out += fmt::format(" commands [{}]", fmt::join(s.commands, " "));
  if (s.boundary != "explicit") out += " boundary " + s.boundary;
  if (!s.optimizer.empty()) {
    out += fmt::format(" {} lr {}", s.optimizer, s.lr);
    if (s.weight_decay != 0) out += fmt::format(" wd {}", s.weight_decay);
    if (s.momentum != 0) out += fmt::format(" momentum {}", s.momentum);
    if (s.torch_adam) out += " torch_adam";
    if (s.optimizer == "Adam" && !s.adam_w_mode) out += " adam_w_mode false";
  }
  if (s.dtype == "bf16" && !s.check_grad_overflow) out += " check_grad_overflow false";
  if (s.prescale) out += " prescale_gradients";
  if (s.predivide != 1.0) out += fmt::format(" predivide {}", s.predivide);
  if (!s.reduce_scatter) out += " reduce_scatter false";
  if (!s.allow_untested_optimizer) out += " without zero_allow_untested_optimizer";
  if (!s.extra_optimizer_params.empty()) out += " optimizer params " + s.extra_optimizer_params.dump();
  if (s.allgather_bucket_size >= 0) out += fmt::format(" allgather_bucket_size {}", s.allgather_bucket_size);
  if (!s.comm_dtype.empty()) out += fmt::format(" comm {}", s.comm_dtype);
  if (s.round_robin) out += " round_robin_gradients";
  if (!s.multi_rank_bucket_allreduce) out += " use_multi_rank_bucket_allreduce false";
  if (is_moe(s)) out += fmt::format(" ep_size {}", s.ep_size);
  out += fmt::format(" seed {} sched {}", s.seed, s.sched_seed);
  return out;
}

nlohmann::json ds_config(const Scenario& s) {
  nlohmann::json j = {{"gradient_accumulation_steps", s.ga},
                      {"gradient_clipping", s.clip},
                      {"zero_optimization", {{"stage", s.stage},
                                             {"contiguous_gradients", s.contiguous},
                                             {"overlap_comm", s.overlap},
                                             {"reduce_bucket_size", s.reduce_bucket_size}}}};
  if (s.dtype == "f16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 4}};
  if (s.dtype == "bf16") j["bf16"] = {{"enabled", true}};
  if (s.grad_accum_dtype == "f32") j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  if (s.offload == "optimizer" || s.offload == "both") j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (s.offload == "param" || s.offload == "both") j["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  if (!s.passes.empty()) j["tensor_parallel"] = {{"autotp_size", 2}};
  if (s.dtype == "bf16") j["bf16"]["check_grad_overflow"] = s.check_grad_overflow;  // explicit either way
  if (s.prescale) j["prescale_gradients"] = true;
  if (s.predivide != 1.0) j["gradient_predivide_factor"] = s.predivide;
  if (!s.reduce_scatter) j["zero_optimization"]["reduce_scatter"] = false;
  if (s.allgather_bucket_size >= 0) j["zero_optimization"]["allgather_bucket_size"] = s.allgather_bucket_size;
  if (s.round_robin) j["zero_optimization"]["round_robin_gradients"] = true;
  if (!s.multi_rank_bucket_allreduce) j["zero_optimization"]["use_multi_rank_bucket_allreduce"] = false;
  if (is_moe(s)) j["moe"] = {{"ep_size", s.ep_size}};  // zerocheck's key; DeepSpeed's MoE layer takes it as an argument
  if (s.checkpointing == "deepspeed" || s.checkpointing == "deepspeed-partition") {
    j["activation_checkpointing"] = {{"partition_activations", s.checkpointing == "deepspeed-partition"}};
  }
  if (!s.comm_dtype.empty()) {
    j["communication_data_type"] = s.comm_dtype == "f32" ? "fp32" : s.comm_dtype == "f16" ? "fp16" : s.comm_dtype;
  }
  if (!s.optimizer.empty()) {
    nlohmann::json params = {{"lr", s.lr}, {"weight_decay", s.weight_decay}};
    if (s.optimizer == "SGD") {
      params["momentum"] = s.momentum;
      if (s.allow_untested_optimizer) j["zero_allow_untested_optimizer"] = true;
    } else {
      params["betas"] = {s.beta1, s.beta2};
      params["eps"] = s.eps;
      params["torch_adam"] = s.torch_adam;
      if (s.optimizer == "Adam") params["adam_w_mode"] = s.adam_w_mode;
    }
    params.update(s.extra_optimizer_params);
    j["optimizer"] = {{"type", s.optimizer}, {"params", params}};
  } else {
    j["optimizer"] = {{"type", "Adam"}};  // both sides' defaults (Note [No optimizer] in engine/engine.cpp)
  }
  return j;
}

namespace {

constexpr std::int64_t kMicroBatch = kScenarioMicroBatch;

int bits_for(std::int64_t v) {
  int bits = 0;
  while ((std::int64_t{1} << bits) <= v) ++bits;
  return bits;
}

// The most terms any gradient element sums (each a +-2^-e monomial in the exact domain): the
// global batch, times every width an MLP's backward and forward paths fan through.
std::int64_t largest_sum(const Scenario& s) {
  std::int64_t terms = kMicroBatch * s.world;
  if (s.model == "mlp") {
    for (std::size_t i = 1; i < s.shape.size(); ++i) terms *= s.shape[i];
  }
  return terms;
}

// The scenario's fault, as an after_step hook (see Scenario::fault).
std::function<void(int, int, Engine&, double)> fault_injector(const Scenario& s) {
  const std::string fault = s.fault;
  const int last_rank = s.world - 1;
  const int last_step = s.steps - 1;
  const Scenario copy = s;
  return [fault, last_rank, last_step, copy](int rank, int step, Engine& engine, double) {
    Device& dev = engine.device();
    if (fault == "crash" && rank == last_rank && step == 0) {
      throw std::runtime_error(fmt::format("injected crash of rank {} after step 0", rank));
    }
    if ((fault == "mismatch" && step == 0) || (fault == "deadlock" && step == last_step)) {
      if (rank != last_rank) return;
      Tensor t = dev.alloc(DType::f64, {7}, "injected-collective");
      dev.fill(t, 1.0);
      AllReduceOptions o;
      o.op = ReduceOp::min;
      engine.comm().all_reduce(t, o)->wait();
      return;
    }
    if (step != 0) return;
    if (fault == "step-in-coalesce") {
      engine.coalesce_grad_reduction([&] { engine.step(); });
    } else if (fault == "coalesce-in-no-sync") {
      engine.no_sync([&] { engine.coalesce_grad_reduction([] {}); });
    } else if (fault == "stale-backward") {
      Model& model = engine.model();
      Rng rng(99);
      const Batch b = upload_batch(dev, model.make_batch(rng, kMicroBatch, DataDomain::exact, exact_spec(copy)),
                                   engine.config().model_dtype());
      const Engine::Loss first = engine.forward(b);
      engine.forward(b);
      engine.backward(first);
    }
  };
}

}  // namespace

ExactSpec exact_spec(const Scenario& s) {
  ExactSpec ex;
  ex.max_k = 1;
  ex.grad_multiple = static_cast<std::int64_t>(s.ga) * s.world;  // every division: by GA, then by the world
  if (s.dtype == "f16") {
    // Keep fp16 grads (times the loss scale 16, summed over N chunks) below 2^14.
    const double peak = 2.0 * static_cast<double>(ex.grad_multiple) * s.n * 16.0 * 4.0 *
                        static_cast<double>(largest_sum(s)) / static_cast<double>(kMicroBatch * s.world);
    ex.scale_exp = std::max(0, static_cast<int>(std::ceil(std::log2(peak))) - 14);
  }
  return ex;
}

std::string exact_infeasible(const Scenario& s) {
  if (is_transformer(s)) return fmt::format("no exact data: {}'s softmax, norms and rotary positions are never exact", s.model);
  std::int64_t odd = exact_spec(s).grad_multiple;
  while (odd % 2 == 0) odd /= 2;
  const int odd_bits = bits_for(odd);
  const std::int64_t span = largest_sum(s) * s.n;
  const int span_bits = bits_for(span);
  const DType accum = s.grad_accum_dtype.empty() ? dtype_of(s) : DType::f32;
  // Every integer the data reaches is below 2^(odd_bits + span_bits).
  const DType comm = s.comm_dtype.empty() ? dtype_of(s) : parse_dtype(s.comm_dtype);  // reductions run in it
  const std::int64_t bound = std::min({exact_domain_max_integer(dtype_of(s)), exact_domain_max_integer(accum),
                                       exact_domain_max_integer(comm)});
  if (odd_bits + span_bits < 63 && (std::int64_t{1} << (odd_bits + span_bits)) - 1 <= bound) return "";
  return fmt::format("no exact data: odd part {} of the divisors ({} bits) and sums of up to {} terms ({} bits) "
                     "exceed the exact-domain bound {} of {}", odd, odd_bits, span, span_bits, bound, s.dtype);
}

bool grads_param_independent(const Scenario& s) { return s.model != "mlp" || s.shape.size() == 2; }

RunSpec to_run_spec(const Scenario& s, const BugSet& bugs, const RunHooks& hooks) {
  RunSpec spec;
  if (s.model == "synthetic") {
    std::vector<Shape> shapes;
    for (std::int64_t n : s.shape) shapes.push_back({n});
    spec.make_model = [shapes] { return std::make_unique<Synthetic>(shapes); };
  } else if (s.model == "tree") {
    spec.make_model = [code = s.shape] { return std::make_unique<TreeModel>(code); };
  } else if (is_transformer(s)) {
    TransformerSpec t = transformer_preset(s.model);
    t.gradient_checkpointing = !s.checkpointing.empty();
    if (s.checkpointing != "torch") t.checkpoint_function = CheckpointFunction::deepspeed;
    t.ds_partition_activations = s.checkpointing == "deepspeed-partition";
    spec.make_model = [t] { return std::make_unique<Transformer>(t); };  // MoE: every expert, for names and init
    if (is_moe(s)) {  // Note [MoE routing]: experts over groups of ep_size ranks
      spec.ep_size = s.ep_size;
      spec.make_moe_model = [t](Comm& ep) { return std::make_unique<Transformer>(t, "transformer", &ep); };
    }
  } else {
    const MlpSpec m{s.shape, s.shape.size() > 2, LossKind::linear};
    spec.make_model = [m] { return std::make_unique<Mlp>(m); };
  }
  spec.ds_config = ds_config(s);
  spec.world = s.world;
  spec.steps = s.steps;
  spec.n_backward = s.n;
  spec.coalesce = s.coalesce;
  spec.explicit_boundary = s.boundary == "explicit";
  spec.micro_batch = kMicroBatch;
  spec.domain = s.domain == "exact" ? DataDomain::exact : DataDomain::gaussian;
  spec.exact = exact_spec(s);
  spec.seed = s.seed;
  spec.sched_seed = s.sched_seed;
  spec.bugs = bugs;
  if (s.fault == "dropped-collective") {
    spec.sim.faults.push_back({sim::FaultKind::drop, s.world - 1, 0});
  } else if (s.fault == "slow-rank") {
    spec.sim.faults.push_back({sim::FaultKind::slow_rank, s.world - 1, 0, 8.0});
  } else if (!s.fault.empty()) {
    spec.after_step = fault_injector(s);
  }
  if (!s.passes.empty()) {
    spec.compile = CompileConfig{s.deepcompile, s.passes};
    spec.make_loader = hooks.make_loader;
  }
  return spec;
}

std::string element_name(const Scenario& s, std::int64_t flat_index) {
  const RunSpec spec = to_run_spec(s, {}, {});
  const std::unique_ptr<Model> model = spec.make_model();
  return param_element_name(*model, flat_index);
}

}  // namespace zc::props
