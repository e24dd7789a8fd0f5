// DeepSpeed's own estimators beside zerocheck plan (label deepspeed: the reference environment must
// exist): the figures the installed package returns are its formulas (stage_1_and_2.py:4017,
// stage3.py:4016), recomputed here from their text, and the plan matches the row of its setting.
#include "plan/plan.h"

#include <gtest/gtest.h>

namespace zc::plan {
namespace {

PlanResult plan_of(int stage, const char* offload) {
  PlanOptions o;
  o.ds_config = {{"train_micro_batch_size_per_gpu", 1},
                 {"bf16", {{"enabled", true}}},
                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                 {"zero_optimization", {{"stage", stage}}}};
  if (std::string(offload) != "none") o.ds_config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  o.model = transformer_preset("llama-tiny");
  o.world = 4;
  return run_plan(o, load_hardware(default_hardware_path()));
}

TEST(PlanDeepSpeed, EstimatorsAreDeepSpeedsFormulasAndMatchThePlansSetting) {
  const PlanResult z2 = plan_of(2, "none");
  const DeepSpeedEstimates e = deepspeed_estimates(z2);
  ASSERT_TRUE(e.available) << e.missing;  // label deepspeed: the environment must be there
  EXPECT_EQ(e.raw.at("deepspeed"), "0.19.8");
  const std::int64_t P = z2.params, N = 4;
  const nlohmann::json m2 = deepspeed_json(z2, e).at("matching");
  EXPECT_EQ(m2.at("offload_optimizer"), false);
  EXPECT_EQ(m2.at("gpu_bytes").get<std::int64_t>(), 2 * P + 18 * P / N);  // 2P + 18P/N
  const PlanResult z2o = plan_of(2, "optimizer");
  EXPECT_EQ(deepspeed_json(z2o, deepspeed_estimates(z2o)).at("matching").at("gpu_bytes").get<std::int64_t>(), 2 * P);
  const PlanResult z3 = plan_of(3, "none");
  const nlohmann::json m3 = deepspeed_json(z3, deepspeed_estimates(z3)).at("matching");
  EXPECT_EQ(m3.at("gpu_bytes").get<std::int64_t>(), 4 * z3.largest_param + 18 * P / N);
  EXPECT_NE(compare_with_deepspeed(z3, deepspeed_estimates(z3)).find("does not count"), std::string::npos);
  const PlanResult z1 = plan_of(1, "none");
  EXPECT_NE(compare_with_deepspeed(z1, deepspeed_estimates(z1)).find("no estimator for ZeRO-1"), std::string::npos);
}

}  // namespace
}  // namespace zc::plan
