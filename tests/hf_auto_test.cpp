// Hugging Face "auto" values (engine/hf_auto.h) and DeepSpeed's WarmupLR / WarmupDecayLR in the
// engine: every auto filled as the integration fills it, each missing option named, every
// disagreement listed; the schedule's first two steps run at warmup_min_lr as DeepSpeed's do.
#include "engine/config.h"
#include "engine/errors.h"
#include "engine/hf_auto.h"
#include "engine/optimizer.h"
#include "models/mlp.h"
#include "props/training_run.h"

#include <gtest/gtest.h>

#include <fstream>

namespace zc {
namespace {

nlohmann::json hf_config() {
  std::ifstream in(std::string(ZC_SOURCE_DIR) + "/examples/hf/ds_config_zero2.json");
  return nlohmann::json::parse(in);
}

HfTrainingArgs full_args() {
  HfTrainingArgs a;
  a.world_size = 4;
  a.per_device_train_batch_size = 3;
  a.gradient_accumulation_steps = 2;
  a.max_grad_norm = 1.0;
  a.learning_rate = 2e-5;
  a.adam_beta1 = 0.9;
  a.adam_beta2 = 0.95;
  a.adam_epsilon = 1e-8;
  a.weight_decay = 0.1;
  a.warmup_ratio = 0.1;
  a.num_training_steps = 95;
  a.bf16 = true;
  a.hidden_size = 4096;
  return a;
}

std::string error_of(const nlohmann::json& cfg, const HfTrainingArgs& a) {
  try {
    resolve_hf_auto(cfg, a);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(HfAuto, FillsEveryAutoAsTheIntegrationDoes) {
  const nlohmann::json j = resolve_hf_auto(hf_config(), full_args());
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 3);
  EXPECT_EQ(j["gradient_accumulation_steps"], 2);
  EXPECT_EQ(j["train_batch_size"], 24);  // world 4 x 3 x 2
  EXPECT_EQ(j["gradient_clipping"], 1.0);
  EXPECT_EQ(j["optimizer"]["params"]["lr"], 2e-5);
  EXPECT_EQ(j["optimizer"]["params"]["betas"], nlohmann::json::array({0.9, 0.95}));
  EXPECT_EQ(j["optimizer"]["params"]["eps"], 1e-8);
  EXPECT_EQ(j["optimizer"]["params"]["weight_decay"], 0.1);
  EXPECT_EQ(j["scheduler"]["params"]["warmup_min_lr"], 0);
  EXPECT_EQ(j["scheduler"]["params"]["warmup_max_lr"], 2e-5);
  EXPECT_EQ(j["scheduler"]["params"]["warmup_num_steps"], 10);  // ceil(95 x 0.1)
  EXPECT_EQ(j["fp16"]["enabled"], false);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 4096 * 4096);
  nlohmann::json z3 = hf_config();
  z3["zero_optimization"] = {{"stage", 3}, {"stage3_prefetch_bucket_size", "auto"},
                             {"stage3_param_persistence_threshold", "auto"}};
  z3 = resolve_hf_auto(z3, full_args());
  EXPECT_EQ(z3["zero_optimization"]["stage3_prefetch_bucket_size"], 15099494);  // int(0.9 * 4096 * 4096)
  EXPECT_EQ(z3["zero_optimization"]["stage3_param_persistence_threshold"], 40960);
  const Config cfg = Config::from_json(j, 4);  // the resolved file is a valid ds_config
  EXPECT_EQ(cfg.optimizer.schedule.type, LrScheduleType::warmup);
  EXPECT_EQ(cfg.zero.reduce_bucket_size, 4096 * 4096);
}

TEST(HfAuto, AnAutoNoOptionFillsNamesTheKeyAndTheOption) {
  HfTrainingArgs a = full_args();
  a.per_device_train_batch_size.reset();  // changes memory: never defaulted
  const std::string e = error_of(hf_config(), a);
  EXPECT_NE(e.find("'train_micro_batch_size_per_gpu' is \"auto\": give --per-device-train-batch-size"),
            std::string::npos) << e;
  a = full_args();
  a.hidden_size.reset();
  EXPECT_NE(error_of(hf_config(), a).find("'zero_optimization.reduce_bucket_size' is \"auto\": give --hidden"),
            std::string::npos);
  nlohmann::json other = hf_config();
  other["zero_optimization"]["sub_group_size"] = "auto";  // the integration fills no such key
  EXPECT_NE(error_of(other, full_args()).find("'zero_optimization.sub_group_size' is \"auto\", which the Hugging "
                                              "Face integration does not fill"), std::string::npos);
}

// The values that change neither memory nor collectives take TrainingArguments' defaults when
// their option is not given, as the Trainer's do, each named in a note.
TEST(HfAuto, ValueOnlyAutosTakeTheTrainersDefaultsWithANote) {
  HfTrainingArgs a = full_args();
  a.learning_rate.reset();
  a.adam_beta1.reset();
  a.adam_beta2.reset();
  a.adam_epsilon.reset();
  a.weight_decay.reset();
  a.max_grad_norm.reset();
  std::vector<std::string> notes;
  const nlohmann::json j = resolve_hf_auto(hf_config(), a, &notes);
  EXPECT_DOUBLE_EQ(j["optimizer"]["params"]["lr"].get<double>(), 5e-5);
  EXPECT_EQ(j["optimizer"]["params"]["betas"], nlohmann::json::array({0.9, 0.999}));
  EXPECT_DOUBLE_EQ(j["optimizer"]["params"]["eps"].get<double>(), 1e-8);
  EXPECT_DOUBLE_EQ(j["optimizer"]["params"]["weight_decay"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["gradient_clipping"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["scheduler"]["params"]["warmup_max_lr"].get<double>(), 5e-5);
  bool named = false;
  for (const std::string& n : notes) {
    named |= n.find("'optimizer.params.lr' \"auto\" <- 5e-05 (TrainingArguments' default; --learning-rate sets it)") !=
             std::string::npos;
  }
  EXPECT_TRUE(named);
  EXPECT_EQ(notes.size(), 6u);
}

TEST(HfAuto, EveryDisagreementWithAGivenOptionIsListed) {
  nlohmann::json cfg = hf_config();
  cfg["optimizer"]["params"]["lr"] = 1e-3;
  cfg["gradient_clipping"] = 0.5;
  cfg["gradient_accumulation_steps"] = 2;  // agrees (2 == 2): no line
  const std::string e = error_of(cfg, full_args());
  EXPECT_NE(e.find("- ds optimizer.params.lr=0.001 vs --learning-rate=2e-05"), std::string::npos) << e;
  EXPECT_NE(e.find("- ds gradient_clipping=0.5 vs --max-grad-norm=1.0"), std::string::npos) << e;
  EXPECT_EQ(e.find("gradient_accumulation_steps"), std::string::npos) << e;
  // A number not checked against an option nobody gave; a flag only when given.
  HfTrainingArgs a = full_args();
  a.learning_rate.reset();
  cfg["scheduler"]["params"]["warmup_max_lr"] = 1e-3;
  cfg["gradient_clipping"] = 1.0;
  EXPECT_EQ(error_of(cfg, a), "");
  cfg["bf16"]["enabled"] = false;
  EXPECT_NE(error_of(cfg, a).find("- ds bf16.enabled=false vs --bf16=true"), std::string::npos);
  a.bf16 = false;
  cfg["bf16"]["enabled"] = true;  // no --bf16: not a claim about the config
  EXPECT_EQ(error_of(cfg, a), "");
}

// A client optimizer (what a script passes to deepspeed.initialize) takes the place of the config's
// block as DeepSpeed's does: torch's arithmetic, torch's defaults, a warning when a block is
// replaced; ZeRO-Offload refuses it unless zero_force_ds_cpu_optimizer is false; SGD under ZeRO
// still needs zero_allow_untested_optimizer; the Trainer's default is torch AdamW at lr 5e-5.
TEST(ClientOptimizer, TakesThePlaceOfTheConfigsBlockAsInDeepSpeed) {
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", 1}, {"zero_optimization", {{"stage", 2}}}};
  std::vector<std::string> notes;
  ClientOptimizer adamw{"adamw", 3e-4, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, "--optimizer adamw"};
  const nlohmann::json with = with_client_optimizer(cfg, adamw, notes);
  EXPECT_TRUE(notes.empty());
  const Config c = Config::from_json(with, 2);
  EXPECT_TRUE(c.optimizer_given);
  EXPECT_TRUE(c.optimizer.torch_adam);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01) << "torch.optim.AdamW's default";

  cfg["optimizer"] = {{"type", "Adam"}, {"params", {{"lr", 1.0}}}};
  const nlohmann::json replaced = with_client_optimizer(cfg, adamw, notes);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("\"optimizer\" block is ignored: --optimizer adamw takes its place"), std::string::npos) << notes[0];
  EXPECT_DOUBLE_EQ(Config::from_json(replaced, 2).optimizer.lr, 3e-4);

  cfg["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  try {
    with_client_optimizer(cfg, adamw, notes);
    ADD_FAILURE() << "ZeRO-Offload with a client optimizer accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_force_ds_cpu_optimizer"), std::string::npos) << e.what();
  }
  cfg["zero_force_ds_cpu_optimizer"] = false;
  EXPECT_TRUE(Config::from_json(with_client_optimizer(cfg, adamw, notes), 2).optimizer.torch_adam);

  ClientOptimizer sgd{"sgd", 0.1, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0.9, "--optimizer sgd"};
  cfg.erase("zero_force_ds_cpu_optimizer");
  cfg["zero_optimization"].erase("offload_optimizer");
  EXPECT_THROW(Config::from_json(with_client_optimizer(cfg, sgd, notes), 2), ConfigError) << "untested at ZeRO-2";
  cfg["zero_allow_untested_optimizer"] = true;
  const Config s = Config::from_json(with_client_optimizer(cfg, sgd, notes), 2);
  EXPECT_EQ(s.optimizer.type, OptimizerType::sgd);
  EXPECT_DOUBLE_EQ(s.optimizer.momentum, 0.9);
  sgd.lr.reset();
  EXPECT_THROW(with_client_optimizer(cfg, sgd, notes), ConfigError) << "torch.optim.SGD needs lr";

  const ClientOptimizer trainer = trainer_default_optimizer(HfTrainingArgs{});
  EXPECT_EQ(trainer.type, "adamw");
  EXPECT_DOUBLE_EQ(*trainer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(*trainer.weight_decay, 0.0);
  EXPECT_TRUE(has_hf_auto(hf_config()));
  EXPECT_FALSE(has_hf_auto(cfg));
}

TEST(LrSchedule, UnmodelledSchedulersAndBadParamsAreRefused) {
  const nlohmann::json base = {{"train_micro_batch_size_per_gpu", 1}};
  nlohmann::json j = base;
  j["scheduler"] = {{"type", "OneCycle"}, {"params", nlohmann::json::object()}};
  EXPECT_THROW(Config::from_json(j, 1), NotImplementedError);
  j["scheduler"] = {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 3}}}};
  EXPECT_THROW(Config::from_json(j, 1), ConfigError);  // total_num_steps is required
  j["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 0}}}};
  EXPECT_THROW(Config::from_json(j, 1), ConfigError);
  j["scheduler"] = {{"type", "warmuplr"}};
  EXPECT_THROW(Config::from_json(j, 1), ConfigError);
}

// WarmupLR from 0: DeepSpeed's first step runs at min_lr (set at construction) and so does the
// second (log(1) = 0), so the params after steps 1 and 2 are the initial ones; step 3 moves them.
TEST(LrSchedule, TheEngineRunsEachStepAtTheScheduledRate) {
  props::RunSpec spec;
  spec.make_model = [] { return std::make_unique<Mlp>(simple_model_spec(8, 2, LossKind::linear)); };
  spec.ds_config = {{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.25}}}}},
                    {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0}, {"warmup_num_steps", 4}}}}},
                    {"zero_optimization", {{"stage", 2}}}, {"zero_allow_untested_optimizer", true}};
  spec.world = 2;
  spec.steps = 4;
  spec.seed = 5;
  const props::RunResult r = props::run_on_sim(spec);
  ASSERT_EQ(r.params.size(), 4u);
  EXPECT_EQ(r.params[0], r.params[1]);
  EXPECT_NE(r.params[1], r.params[2]);
  EXPECT_NE(r.params[2], r.params[3]);
  spec.ds_config.erase("scheduler");  // a constant rate moves them at once
  const props::RunResult flat = props::run_on_sim(spec);
  EXPECT_NE(flat.params[0], flat.params[1]);
}

}  // namespace
}  // namespace zc
