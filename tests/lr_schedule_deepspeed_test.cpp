// The engine's WarmupLR / WarmupDecayLR learning rate of every applied step equals DeepSpeed
// 0.19.8's own scheduler classes, bit for bit (reference/deepspeed/lr_schedule.py in the
// reference environment). Label deepspeed: fails, naming the reason, without that environment.
#include "engine/config.h"
#include "engine/optimizer.h"
#include "props/reference_pool.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <memory>

namespace zc {
namespace {

std::vector<double> deepspeed_lrs(const nlohmann::json& spec) {
  const props::ReferenceEnv env = props::reference_env();  // ConfigError naming what is missing
  const std::string cmd = fmt::format("DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= '{}' '{}/reference/deepspeed/lr_schedule.py' "
                                      "'{}' 2>/dev/null", env.python.string(), ZC_SOURCE_DIR, spec.dump());
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe && std::fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const std::size_t brace = out.rfind('{');
  EXPECT_NE(brace, std::string::npos) << cmd << "\n" << out;
  const nlohmann::json j = nlohmann::json::parse(out.substr(brace == std::string::npos ? 0 : brace));
  EXPECT_EQ(j.value("deepspeed", ""), "0.19.8");
  std::vector<double> lrs;
  for (const auto& h : j["lrs"]) lrs.push_back(std::strtod(h.get<std::string>().c_str(), nullptr));
  return lrs;
}

TEST(LrScheduleOnDeepSpeed, EveryStepsLearningRateIsDeepSpeedsBitForBit) {
  const std::vector<nlohmann::json> schedulers = {
      {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0}, {"warmup_max_lr", 3e-4}, {"warmup_num_steps", 5}}}},
      {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 1e-5}, {"warmup_num_steps", 7}, {"warmup_type", "linear"}}}},
      {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 1}}}},
      {{"type", "WarmupDecayLR"}, {"params", {{"warmup_min_lr", 0}, {"warmup_max_lr", 1e-3}, {"warmup_num_steps", 3},
                                              {"total_num_steps", 9}}}},
      {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 4}, {"total_num_steps", 4},
                                              {"warmup_type", "linear"}}}},
  };
  for (const nlohmann::json& sched : schedulers) {
    const double lr = 7e-4;
    const int steps = 12;
    nlohmann::json spec = sched;
    spec["lr"] = lr;
    spec["steps"] = steps;
    const std::vector<double> ds = deepspeed_lrs(spec);
    ASSERT_EQ(ds.size(), static_cast<std::size_t>(steps)) << sched.dump();
    const Config cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 1}, {"scheduler", sched},
                                          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", lr}}}}}}, 1);
    for (int k = 0; k < steps; ++k) {
      const double ours = scheduled_lr(cfg.optimizer, k);
      EXPECT_EQ(fmt::format("{:a}", ours), fmt::format("{:a}", ds[static_cast<std::size_t>(k)]))
          << sched.dump() << " step " << k;
    }
  }
}

}  // namespace
}  // namespace zc
