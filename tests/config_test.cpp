// ds_config parsing: DeepSpeed's defaults, a real user's file, and malformed or contradictory
// configs, each rejected with a message that names the key and the reason.
#include "engine/config.h"
#include "engine/errors.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace zc {
namespace {

using json = nlohmann::json;

TEST(Config, DeepSpeedDefaults) {
  const Config c = Config::from_json(json{{"train_micro_batch_size_per_gpu", 4}}, 2);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_TRUE(c.managed_gradient_accumulation);
  EXPECT_EQ(c.model_dtype(), DType::f32);
  EXPECT_EQ(c.optimizer.type, OptimizerType::adam);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  const Config z3 = Config::from_json(json{{"train_micro_batch_size_per_gpu", 1}, {"zero_optimization", {{"stage", 3}}}}, 1);
  EXPECT_TRUE(z3.zero.overlap_comm) << "overlap_comm defaults to true only for stage 3";
}

TEST(Config, AcceptsARealUsersFile) {
  const char* text = R"({
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_clipping": 1.0,
    "steps_per_print": 100,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "bf16": {"enabled": true},
    "data_types": {"grad_accum_dtype": "fp32"},
    "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true,
                          "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8,
                          "allgather_partitions": true},
    "wall_clock_breakdown": false,
    "my_custom_key": 1
  })";
  const Config c = Config::from_json_text(text, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.model_dtype(), DType::bf16);
  EXPECT_EQ(c.accumulation_dtype(), DType::f32);
  EXPECT_EQ(c.optimizer.type, OptimizerType::adamw);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_TRUE(c.zero.overlap_comm);
  bool warned = false;
  for (const std::string& w : c.warnings) warned |= w.find("unknown key 'my_custom_key'") != std::string::npos;
  EXPECT_TRUE(warned) << "unknown keys warn, they do not fail";
}

// ds_configs as DeepSpeed's hjson reader takes them (Note [DeepSpeed's hjson]): comments (#, //,
// /* */, not inside strings) and trailing commas in JSON; quoteless keys and values, commas left
// out, the root's braces left out, '...' and '''...''' strings; numbers as hjson-py makes them.
// Each expected value worked by hand from hjson-py's decoder (DeepSpeedReference.Hjson* runs
// hjson-py itself on a corpus).
TEST(Config, DsConfigTextIsHjsonAsDeepSpeedReadsIt) {
  const nlohmann::json j = parse_ds_config_text(R"({
    # hjson's comment
    "train_micro_batch_size_per_gpu": 2,  // a line comment
    "note": "a # and // inside a string /* stay */",
    /* a block
       comment */
    "zero_optimization": {"stage": 2, "overlap_comm": true,},
    "list": [1, 2,
             3,  // after the last element
    ],
  })");
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 2);
  EXPECT_EQ(j["note"], "a # and // inside a string /* stay */");
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);
  EXPECT_EQ(j["list"], nlohmann::json::array({1, 2, 3}));

  const nlohmann::json q = parse_ds_config_text(R"(# no braces at the root, no quotes, no commas
train_micro_batch_size_per_gpu: 2
gradient_clipping: 1.0
reduce_bucket_size: 5e8
big: 1e10
optimizer: {
  type: AdamW
  params: { lr: 3e-4, betas: [0.9, 0.999] }
}
note: AdamW, # a quoteless string runs to the end of its line
flag: true # a literal ends at a comment
'a key': 'it\'s "x"'
quoted: "true"
text:
  '''
  first
    second
  '''
)");
  EXPECT_EQ(q["train_micro_batch_size_per_gpu"], 2);
  EXPECT_TRUE(q["gradient_clipping"].is_number_integer()) << "hjson-py makes 1.0 the integer 1";
  EXPECT_EQ(q["gradient_clipping"], 1);
  EXPECT_TRUE(q["reduce_bucket_size"].is_number_integer());
  EXPECT_EQ(q["reduce_bucket_size"], 500000000);
  EXPECT_TRUE(q["big"].is_number_float()) << "1e10 is not below 1e10: it stays a float";
  EXPECT_EQ(q["optimizer"]["type"], "AdamW");
  EXPECT_EQ(q["optimizer"]["params"]["lr"], 3e-4);
  EXPECT_EQ(q["optimizer"]["params"]["betas"], nlohmann::json::array({0.9, 0.999}));
  EXPECT_EQ(q["note"], "AdamW, # a quoteless string runs to the end of its line");
  EXPECT_EQ(q["flag"], true);
  EXPECT_EQ(q["a key"], "it's \"x\"");
  EXPECT_EQ(q["quoted"], "true");
  EXPECT_EQ(q["text"], "first\n  second");
  EXPECT_EQ(parse_ds_config_text("  # only a comment\n"), nlohmann::json::object());

  const auto refused = [](const std::string& text, const std::string& want, const std::string& where) {
    try {
      parse_ds_config_text(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
  };
  refused("{\n  \"a\": 1,\n  \"a\": 2\n}", "key 'a' twice in one object", "Duplicate keys in DeepSpeed config");
  refused("{\"zero_optimization\": {\"stage\": 1, \"stage\": 3}}", "key 'stage' twice", "Duplicate keys");
  refused("{\n  zero stage: 2\n}", "Found whitespace in your key name", "line 2 column 7");
  refused("{\"a\": 1,, }", "Found ',' where a key name was expected", "line 1 column 9");
  refused("{\"a\" 1}", "Expecting ':' delimiter", "line 1 column 6");
  refused("{\"a\": 1} x", "Extra data", "line 1 column 10");
  refused("{\"a\": [1, 2", "Expecting value", "line 1 column 12");
  refused("{\"a\": 1} /* open", "Unterminated /* comment", "line 1 column 10");
  refused("{\"a\": 1e400}", "beyond a double", "line 1 column 7");
  // Found by review: 100,000 '[' would have overflowed the stack; refused at 257 levels.
  refused(std::string(100000, '[') + std::string(100000, ']'), "nested deeper than 256 levels", "line 1 column 257");
  EXPECT_NO_THROW(parse_ds_config_text(std::string(256, '[') + std::string(256, ']')));
  // hjson's trap: a quoteless string runs to the end of its line, closing braces included (a number
  // or literal ends at the brace). DeepSpeed says "Bad key name (eof)"; zerocheck also says which
  // value took the brace.
  refused("{\n  offload_param: { device: cpu }\n}\n", "Bad key name (eof): line 4 column 1",
          "the quoteless value at line 2 column 28 holds a closing brace");
}

// Where DeepSpeed's pydantic models forbid extras (zero_optimization, its offload blocks, fp16,
// bf16, tensor_parallel), a key DeepSpeed does not know is refused as DeepSpeed refuses it, with
// the nearest known key; a key DeepSpeed knows and zerocheck does not model is accepted with a
// warning; DeepSpeed's field names beside their stage3_ aliases are read.
TEST(Config, UnknownKeysAreRefusedWhereDeepSpeedRefusesThem) {
  const auto refused = [](const std::string& text, const std::string& want) {
    try {
      Config::from_json_text(text, 2);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Extra inputs are not permitted"), std::string::npos) << e.what();
    }
  };
  refused(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "overlap_com": true}})",
          "unknown key 'zero_optimization.overlap_com' (did you mean 'overlap_comm'?): DeepSpeed 0.19.8 refuses it");
  refused(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memry": true}}})",
          "'zero_optimization.offload_param.pin_memry' (did you mean 'pin_memory'?)");
  refused(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true, "loss_scale": 0}})", "'bf16.loss_scale'");
  refused(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "xyzzy": 1}})", "'fp16.xyzzy':");
  const Config c = Config::from_json_text(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "zero_quantized_weights": false,
          "prefetch_bucket_size": 1234, "stage3_max_live_parameters": 99}})", 2);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 1234) << "DeepSpeed's field name beside its stage3_ alias";
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 99);
  bool warned = false;
  for (const std::string& w : c.warnings) {
    warned |= w.find("'zero_optimization.zero_quantized_weights' accepted and ignored: DeepSpeed reads it") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

// As DeepSpeed 0.19.8: offload_param below stage 3 and offload_optimizer at stage 0 are accepted
// and ignored, with a warning that names the key (zerocheck used to refuse them).
// The activation_checkpointing block is deepspeed.checkpointing's: DeepSpeed's engine parses it
// without checking (configure() asserts, where a model calls it), so a Megatron-style block with
// contiguous buffers and no number_checkpoints, or "number_checkpoints": false, is accepted, with
// the block's warning; the plan checks it under --activation-checkpointing (plan_test).
TEST(Config, ActivationCheckpointingIsReadAsDeepSpeedReadsIt) {
  const Config c = Config::from_json(nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 1,
      "activation_checkpointing": {"partition_activations": true, "contiguous_memory_optimization": true,
                                   "cpu_checkpointing": true, "number_checkpoints": false}})"), 1);
  EXPECT_TRUE(c.activation_checkpointing.given);
  EXPECT_TRUE(c.activation_checkpointing.partition_activations);
  EXPECT_TRUE(c.activation_checkpointing.contiguous_memory_optimization);
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 0);
  bool number = false, block = false;
  for (const std::string& w : c.warnings) {
    number |= w.find("'activation_checkpointing.number_checkpoints' is false: taken as not given") != std::string::npos;
    block |= w.find("takes effect only where the model calls deepspeed.checkpointing.checkpoint") != std::string::npos;
  }
  EXPECT_TRUE(number && block) << fmt::format("{}", fmt::join(c.warnings, " | "));
}

TEST(Config, GradientScalingIsReadAtStageZeroAndIgnoredWithAWarningAtZeroOne) {
  const Config z0 = Config::from_json_text(
      R"({"train_micro_batch_size_per_gpu": 1, "prescale_gradients": true, "gradient_predivide_factor": 2.5})", 4);
  EXPECT_TRUE(z0.prescale_gradients);
  EXPECT_EQ(z0.gradient_predivide_factor, 2.5);
  EXPECT_TRUE(z0.warnings.empty()) << z0.warnings.front();
  const Config z1 = Config::from_json_text(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 1}})", 4);
  ASSERT_EQ(z1.warnings.size(), 1u);
  EXPECT_NE(z1.warnings[0].find("average_tensor"), std::string::npos) << z1.warnings[0];
}

TEST(Config, OffloadWhereNothingIsPartitionedIsIgnoredWithAWarning) {
  const Config p = Config::from_json_text(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", 2);
  EXPECT_EQ(p.zero.offload_param, OffloadDevice::none);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("'zero_optimization.offload_param' ignored at stage 2"), std::string::npos) << p.warnings[0];
  const Config o = Config::from_json_text(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})", 2);
  EXPECT_EQ(o.zero.offload_optimizer, OffloadDevice::none);
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_NE(o.warnings[0].find("'zero_optimization.offload_optimizer' ignored at stage 0"), std::string::npos) << o.warnings[0];
}

// DeepSpeed passes optimizer.params to the optimizer it picks as keyword arguments, after
// refusing max_grad_norm: a key that constructor does not take is Python's TypeError, and
// FusedAdam / DeepSpeedCPUAdam refuse amsgrad. Each case names what DeepSpeed raises.
TEST(Config, OptimizerParamsAreRefusedWhereDeepSpeedsConstructorRefusesThem) {
  struct Case {
    const char* type;
    const char* params;
    const char* zero;
    const char* error;  // "" = accepted
  };
  const Case cases[] = {
      {"Adam", R"("max_grad_norm": 1.0)", R"({"stage": 1})", "'max_grad_norm' is not supported as an optimizer parameter"},
      {"SGD", R"("max_grad_norm": 1.0)", R"({"stage": 0})", "'max_grad_norm' is not supported as an optimizer parameter"},
      {"Adam", R"("amsgrad": true)", R"({"stage": 1})", "FusedAdam does not support the AMSGrad variant."},
      {"AdamW", R"("amsgrad": true)", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})",
       "DeepSpeedCPUAdam does not support the AMSGrad variant."},
      {"Adam", R"("amsgrad": false)", R"({"stage": 1})", ""},
      {"Adam", R"("momentum": 0.9)", R"({"stage": 0})", "FusedAdam.__init__() got an unexpected keyword argument 'momentum'"},
      {"Adam", R"("set_grad_none": true)", R"({"stage": 3, "offload_optimizer": {"device": "cpu"}})",
       "DeepSpeedCPUAdam.__init__() got an unexpected keyword argument 'set_grad_none'"},
      {"SGD", R"("amsgrad": false)", R"({"stage": 0})", "SGD.__init__() got an unexpected keyword argument 'amsgrad'"},
      {"SGD", R"("betas": [0.9, 0.99])", R"({"stage": 0})", "SGD.__init__() got an unexpected keyword argument 'betas'"},
      {"Adam", R"("torch_adam": true, "bias_correction": true, "adam_w_mode": false)", R"({"stage": 0})",
       "Adam.__init__() got an unexpected keyword argument 'bias_correction'"},
  };
  for (const Case& k : cases) {
    const std::string text = fmt::format(
        R"({{"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": true, "zero_optimization": {},
            "optimizer": {{"type": "{}", "params": {{"lr": 0.1, {}}}}}}})", k.zero, k.type, k.params);
    SCOPED_TRACE(text);
    if (*k.error == '\0') {
      EXPECT_NO_THROW(Config::from_json_text(text, 2));
      continue;
    }
    try {
      Config::from_json_text(text, 2);
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(k.error), std::string::npos) << e.what();
    }
  }
}

// DeepSpeed's ZeRO asserts on an optimizer outside ZERO_SUPPORTED_OPTIMIZERS (SGD here) unless
// zero_allow_untested_optimizer is set, and then warns; stage 0 does not ask. DeepSpeed
// lower-cases its own optimizers' names and takes SGD from torch.optim by its exact name.
TEST(Config, ZeroWithSgdNeedsZeroAllowUntestedOptimizer) {
  const std::string sgd = R"("optimizer": {"type": "SGD", "params": {"lr": 0.1}})";
  for (int stage : {1, 2, 3}) {
    const std::string zero = fmt::format(R"("zero_optimization": {{"stage": {}}})", stage);
    try {
      Config::from_json_text(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, {}, {}}})", sgd, zero), 2);
      ADD_FAILURE() << "stage " << stage << ": SGD without zero_allow_untested_optimizer was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(R"(Please add <"zero_allow_untested_optimizer": true>)"), std::string::npos) << e.what();
    }
    const Config ok = Config::from_json_text(
        fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, {}, {}, "zero_allow_untested_optimizer": true}})", sgd, zero), 2);
    EXPECT_EQ(ok.optimizer.type, OptimizerType::sgd);
    ASSERT_EQ(ok.warnings.size(), 1u);
    EXPECT_NE(ok.warnings[0].find("untested optimizer"), std::string::npos) << ok.warnings[0];
  }
  const Config z0 = Config::from_json_text(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, {}}})", sgd), 2);
  EXPECT_TRUE(z0.warnings.empty());
  const Config adam = Config::from_json_text(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "ADAMW"}, "zero_optimization": {"stage": 2}})", 2);
  EXPECT_EQ(adam.optimizer.type, OptimizerType::adamw);
  try {
    Config::from_json_text(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "sgd"}})", 2);
    ADD_FAILURE() << "\"sgd\" was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(R"(spell it "SGD")"), std::string::npos) << e.what();
  }
}

// DeepSpeed's bucket-size checks: allgather_bucket_size >= 0 (0 accepted), and even at ZeRO-1/2
// outside the BF16_Optimizer wrapper (DeepSpeedZeroOptimizer's alignment assertion).
TEST(Config, AllgatherBucketSizeIsCheckedAsDeepSpeedChecksIt) {
  auto parse = [](int stage, std::int64_t size, const char* extra) {
    return Config::from_json_text(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, {}"zero_optimization": )"
                                              R"({{"stage": {}, "allgather_bucket_size": {}}}}})", extra, stage, size), 2);
  };
  EXPECT_EQ(parse(2, 0, "").zero.allgather_bucket_size, 0);
  for (int stage : {1, 2}) {
    try {
      parse(stage, 7, "");
      ADD_FAILURE() << "stage " << stage << ": an odd allgather_bucket_size was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("multiple of nccl_start_alignment_factor"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse(3, 7, "").zero.allgather_bucket_size, 7);
  EXPECT_EQ(parse(0, 7, "").zero.allgather_bucket_size, 7);
  EXPECT_EQ(parse(1, 7, R"("bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}, )").zero.allgather_bucket_size, 7);
  EXPECT_THROW(parse(2, -2, ""), ConfigError);
}

// communication_data_type as DeepSpeed parses it (case-insensitive fp16/bf16/fp32, null = unset),
// and comm_dtype() as engine.py's communication_data_type property picks it: the key, else the
// model's 16-bit dtype, else fp32.
TEST(Config, CommunicationDataTypeIsReadAsDeepSpeedReadsIt) {
  auto parse = [](const char* precision, const char* comm) {
    return Config::from_json_text(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, {}"communication_data_type": {}, )"
                                              R"("zero_optimization": {{"stage": 2}}}})", precision, comm), 2);
  };
  EXPECT_EQ(parse("", R"("FP32")").communication_data_type, DType::f32);
  EXPECT_EQ(parse(R"("bf16": {"enabled": true}, )", R"("bf16")").communication_data_type, DType::bf16);
  EXPECT_FALSE(parse("", "null").communication_data_type.has_value());
  EXPECT_TRUE(parse("", R"("fp32")").warnings.empty());
  EXPECT_EQ(parse(R"("bf16": {"enabled": true}, )", R"("fp32")").comm_dtype(), DType::f32);
  EXPECT_EQ(parse(R"("bf16": {"enabled": true}, )", "null").comm_dtype(), DType::bf16);
  EXPECT_EQ(parse(R"("fp16": {"enabled": true}, )", "null").comm_dtype(), DType::f16);
  EXPECT_EQ(parse("", "null").comm_dtype(), DType::f32);
  EXPECT_EQ(parse("", R"("Fp16")").comm_dtype(), DType::f16);
  try {
    parse("", R"("fp8")");
    ADD_FAILURE() << "fp8 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Supported data types: ['fp16', 'bf16', 'fp32']. Got: fp8"), std::string::npos)
        << e.what();
  }
}

struct Bad {
  const char* name;
  const char* json_text;
  const char* fragment;  // must appear in the message
  bool not_implemented = false;
};

class ConfigRejects : public ::testing::TestWithParam<Bad> {};

TEST_P(ConfigRejects, WithAMessageNamingTheKey) {
  const Bad& b = GetParam();
  try {
    Config::from_json_text(b.json_text, 4);
    FAIL() << b.name << ": accepted";
  } catch (const NotImplementedError& e) {
    EXPECT_TRUE(b.not_implemented) << b.name << ": NotImplementedError " << e.what();
    EXPECT_NE(std::string(e.what()).find(b.fragment), std::string::npos) << e.what();
  } catch (const ConfigError& e) {
    EXPECT_FALSE(b.not_implemented) << b.name << ": ConfigError " << e.what();
    EXPECT_NE(std::string(e.what()).find(b.fragment), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Malformed, ConfigRejects, ::testing::Values(
  Bad{"no_batch", R"({})", "either 'train_batch_size' or 'train_micro_batch_size_per_gpu'"},
  Bad{"batch_mismatch", R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", "'train_batch_size' 30 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world 4"},
  Bad{"batch_not_divisible", R"({"train_batch_size": 10})", "not divisible by gradient_accumulation_steps 1 x world 4"},
  Bad{"ga_zero", R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 0})", "'gradient_accumulation_steps': must be >= 1"},
  Bad{"stage_string", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": "two"}})", "'zero_optimization.stage' must be an integer, got string \"two\""},
  Bad{"stage_range", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 4}})", "'zero_optimization.stage': 4 is not a ZeRO stage"},
  Bad{"zero_not_object", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": 2})", "'zero_optimization' must be an object"},
  Bad{"fp16_and_bf16", R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true}, "bf16": {"enabled": true}})", "'fp16.enabled' and 'bf16.enabled' are both true"},
  Bad{"bucket_zero", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 0}})", "'zero_optimization.reduce_bucket_size': must be a positive number"},
  Bad{"optimizer_unknown", R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb"}})", "'optimizer.type': Lamb is not modelled", true},
  Bad{"lr_negative", R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": -1}}})", "'optimizer.params.lr': learning rate -1 is negative"},
  Bad{"betas_shape", R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})", "'optimizer.params.betas': must be two numbers"},
  Bad{"offload_device", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}})", "'zero_optimization.offload_optimizer.device': 'gpu' is not an offload device"},
  Bad{"offload_nvme", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})", "nvme offload is not modelled", true},
  Bad{"clip_negative", R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": -1})", "'gradient_clipping' must be >= 0"},
  Bad{"loss_scale_negative", R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "loss_scale": -2}})", "'fp16.loss_scale': must be >= 0"},
  Bad{"scale_power", R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "initial_scale_power": 99}})", "'fp16.initial_scale_power': must be in [0, 64]"},
  Bad{"accum_dtype_name", R"({"train_micro_batch_size_per_gpu": 1, "data_types": {"grad_accum_dtype": "int8"}})", "'data_types.grad_accum_dtype': 'int8' is not a dtype"},
  Bad{"accum_fp32_stage0", R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})", "needs ZeRO stage >= 1", true},
  Bad{"accum_narrower", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "bf16"}})", "narrower than the fp32 model"},
  Bad{"fp16_fp32_accum", R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true}, "zero_optimization": {"stage": 2}, "data_types": {"grad_accum_dtype": "fp32"}})", "with fp16: DeepSpeed supports fp16 accumulation only", true},
  Bad{"unknown_pass", R"({"train_micro_batch_size_per_gpu": 1, "compile": {"deepcompile": true, "passes": ["z2"]}})", "'compile.passes': unknown pass z2: use z1, z3, autosp or autotp"},
  Bad{"autotp_zero", R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 0}})", "'tensor_parallel.autotp_size': must be >= 1"},
  Bad{"unmanaged", R"({"train_micro_batch_size_per_gpu": 1, "managed_gradient_accumulation": false})", "'managed_gradient_accumulation': false", true},
  // DeepSpeed's assertions at ZeRO-2/3 with reduce_scatter (stage_1_and_2.py:350-351, stage3.py:395-396).
  Bad{"predivide_zero2", R"({"train_micro_batch_size_per_gpu": 1, "gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 2}})", "gradient_predivide_factor != 1.0 is not yet supported with ZeRO-2 with reduce scatter enabled"},
  Bad{"prescale_zero3", R"({"train_micro_batch_size_per_gpu": 1, "prescale_gradients": true, "zero_optimization": {"stage": 3}})", "pre-scale gradients is not yet supported with ZeRO-3 with reduce scatter enabled"},
  Bad{"predivide_no_rs_zero3", R"({"train_micro_batch_size_per_gpu": 1, "gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 3, "reduce_scatter": false}})", "with ZeRO-3 and 'zero_optimization.reduce_scatter': false are not modelled", true},
  Bad{"predivide_zero", R"({"train_micro_batch_size_per_gpu": 1, "gradient_predivide_factor": 0})", "'gradient_predivide_factor' 0 must be a positive number"},
  Bad{"bool_type", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "overlap_comm": "yes"}})", "'zero_optimization.overlap_comm' must be true or false"},
  Bad{"not_json", R"({"train_micro_batch_size_per_gpu": 1,)", "ds_config is not hjson as DeepSpeed reads it"},
  // Found by fuzz/config_fuzz.cpp: nlohmann threw out_of_range (not parse_error) for 1e400.
  Bad{"number_overflow", R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1e400})",
      "the number 1e400 is beyond a double"},
  // Found by fuzz/config_fuzz.cpp: a byte that is not UTF-8 reached a string that dump() refused.
  Bad{"not_utf8", "{\"train_micro_batch_size_per_gpu\": 1, \"c\xefntiguous_gradients\": true}",
      "not UTF-8 at byte 0xef (DeepSpeed opens the file as UTF-8 text): line 1 column 41"},
  // Found by fuzz/config_fuzz.cpp under UBSan: sizes past int64 or int were cast, not refused.
  Bad{"batch_overflow", R"({"train_micro_batch_size_per_gpu": 9223372036854775807})",
      "overflows a 64-bit integer"},
  Bad{"batch_float_out_of_range", R"({"train_batch_size": 1e300})",
      "'train_batch_size' must be an integer, got number 1e+300"},
  Bad{"batch_past_int64", R"({"train_micro_batch_size_per_gpu": 18446744073709551615})",
      "'train_micro_batch_size_per_gpu': 18446744073709551615 is out of range"},
  Bad{"stage_past_int", R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 4294967298}})",
      "'zero_optimization.stage': 4294967298 is out of range: at most 2147483647"},
  Bad{"checkpoints_negative", R"({"train_micro_batch_size_per_gpu": 1,
      "activation_checkpointing": {"number_checkpoints": -1}})",
      "'activation_checkpointing.number_checkpoints': must be >= 0"},
  Bad{"checkpointing_flag_type", R"({"train_micro_batch_size_per_gpu": 1,
      "activation_checkpointing": {"cpu_checkpointing": "yes"}})",
      "'activation_checkpointing.cpu_checkpointing' must be true or false"}),
  [](const ::testing::TestParamInfo<Bad>& p) { return std::string(p.param.name); });

// zero_optimization.parameter_alignment: false is DeepSpeed's default and accepted without a
// warning; true (16-byte padding of every param in the ZeRO-1/2 flat buffer) is refused at ZeRO-2,
// naming it, and accepted where DeepSpeed does not read it (stage 3).
TEST(Config, ParameterAlignmentTrueIsRefusedNamingTheKey) {
  auto parse = [](const char* v, int stage = 2) {
    return Config::from_json_text(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, )"
                                              R"("zero_optimization": {{"stage": {}, "parameter_alignment": {}}}}})", stage, v), 2);
  };
  EXPECT_TRUE(parse("false").warnings.empty());
  EXPECT_TRUE(parse("true", 3).zero.parameter_alignment);
  // sequence_parallel_size > 1 changes DeepSpeed's reduction (fp32, divided by world / sp): refused.
  EXPECT_THROW(Config::from_json_text(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2})", 2),
               NotImplementedError);
  EXPECT_EQ(Config::from_json_text(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 1})", 2)
                .sequence_parallel_size, 1);
  try {
    parse("true");
    ADD_FAILURE() << "parameter_alignment true was accepted";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter_alignment"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not modelled"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zc
