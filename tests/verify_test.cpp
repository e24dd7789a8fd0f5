// The verify job end to end on the quick profile: every invariant holds on the correct engine,
// every known bug with an invariant that targets it is caught with a small shrunk scenario whose
// saved file replays to the same verdict and trace hash; scenario files are strict.
#include "engine/errors.h"
#include "props/proofs.h"
#include "props/reference.h"
#include "props/verify.h"
#include "real/deepcompile_loader.h"

#include <gtest/gtest.h>
#include "props/training_run.h"
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>

#include <algorithm>

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <set>

namespace zc::props {
namespace {

RunHooks hooks() { return {real::plugin_loaders()}; }

TEST(ScenarioJson, RoundTripsEveryField) {
  Scenario s;
  s.world = 3, s.stage = 3, s.contiguous = false, s.overlap = true, s.reduce_bucket_size = 64;
  s.dtype = "bf16", s.grad_accum_dtype = "f32", s.offload = "both", s.clip = 0.5, s.ga = 2, s.n = 4, s.steps = 3;
  s.coalesce = true, s.model = "mlp", s.shape = {4, 5, 3}, s.passes = {"z3"}, s.deepcompile = false;
  s.domain = "gaussian", s.seed = 77, s.sched_seed = 99, s.fault = "crash", s.commands = {"forward", "coalesce:2"};
  EXPECT_EQ(scenario_from_json(to_json(s)), s);
  EXPECT_EQ(scenario_from_json(nlohmann::json::parse(to_json(s).dump())), s);
}

TEST(ScenarioJson, BadInputNamesTheKey) {
  nlohmann::json j = to_json(Scenario{});
  j["wrold"] = 2;
  try {
    scenario_from_json(j);
    FAIL() << "an unknown key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'wrold'"), std::string::npos) << e.what();
  }
  j = to_json(Scenario{});
  j["world"] = "two";
  EXPECT_THROW(scenario_from_json(j), ConfigError);
  j = to_json(Scenario{});
  j["dtype"] = "fp8";
  EXPECT_THROW(scenario_from_json(j), ConfigError);
  j = to_json(Scenario{});
  j["n_backward"] = 0;
  EXPECT_THROW(scenario_from_json(j), ConfigError);
}

// Activation checkpointing is a transformer scenario's: it round-trips, reaches the ds_config as
// DeepSpeed reads it, and is refused with the reason on a model without decoder layers or by an
// unknown name.
TEST(ScenarioJson, CheckpointingIsATransformersAndNamesWhatItTakes) {
  Scenario s;
  s.model = "llama-tiny", s.shape = {}, s.domain = "gaussian", s.checkpointing = "deepspeed-partition";
  EXPECT_EQ(scenario_from_json(to_json(s)), s);
  EXPECT_NE(describe(s).find("checkpointing deepspeed-partition"), std::string::npos) << describe(s);
  EXPECT_EQ(ds_config(s).at("activation_checkpointing").at("partition_activations"), true);
  s.checkpointing = "torch";
  EXPECT_FALSE(ds_config(s).contains("activation_checkpointing")) << "Hugging Face's checkpoint reads no ds_config block";
  EXPECT_FALSE(to_json(Scenario{}).contains("checkpointing")) << "written only when set";
  nlohmann::json j = to_json(Scenario{});
  j["checkpointing"] = "torch";
  try {
    scenario_from_json(j);
    FAIL() << "checkpointing on a synthetic model was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("only the transformer presets"), std::string::npos) << e.what();
  }
  j = to_json(s);
  j["checkpointing"] = "selective";
  EXPECT_THROW(scenario_from_json(j), ConfigError);
}

// The MoE transformer's ep_size: it round-trips, reaches the ds_config as zerocheck's moe block and
// the description, and is refused with the reason above 1 on a model without experts or when it
// does not divide the experts and the world.
TEST(ScenarioJson, EpSizeIsAnMoeModelsAndMustDivideItsExperts) {
  Scenario s;
  s.model = "mixtral-tiny", s.shape = {}, s.domain = "gaussian", s.ep_size = 2;
  EXPECT_EQ(scenario_from_json(to_json(s)), s);
  EXPECT_NE(describe(s).find("ep_size 2"), std::string::npos) << describe(s);
  EXPECT_EQ(ds_config(s).at("moe").at("ep_size"), 2);
  EXPECT_FALSE(ds_config(Scenario{}).contains("moe"));
  EXPECT_EQ(scenario_from_json(to_json(Scenario{})), Scenario{}) << "ep_size 1 is every model's";
  auto refusal = [](const nlohmann::json& j) -> std::string {
    try {
      scenario_from_json(j);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "accepted";
  };
  nlohmann::json j = to_json(Scenario{});
  j["ep_size"] = 2;
  EXPECT_NE(refusal(j).find("has no experts to spread"), std::string::npos) << refusal(j);
  j = to_json(s);
  j["ep_size"] = 3;  // 4 experts, world 2
  EXPECT_NE(refusal(j).find("must divide the experts (4) and the world (2)"), std::string::npos) << refusal(j);
  j["ep_size"] = 4;
  EXPECT_NE(refusal(j).find("must divide"), std::string::npos) << refusal(j);
  j["world"] = 4;
  EXPECT_EQ(refusal(j), "accepted");
}

// Note [Scenario limits]. Found by fuzz/scenario_fuzz.cpp under UBSan: integers were read with
// get<int>, which casts a float or a too-large integer (4294967298 became world 2), and sizes had
// no bound (a shape of 10^12 elements, an MLP whose exact-domain sizing overflowed int64).
TEST(ScenarioJson, RefusesSizesPastTheLimitsNamingTheKey) {
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {{{"world", 4294967298}}, "'world': 4294967298 is out of range [1, 1024]"},
      {{{"world", 1000000000}}, "'world': 1000000000 is out of range [1, 1024]"},
      {{{"world", 2.5}}, "'world': an integer, got 2.5"},
      {{{"steps", 1e300}}, "'steps': an integer"},
      {{{"stage", 7}}, "'stage': 7 is out of range [0, 3]"},
      {{{"seed", -1}}, "'seed': an integer in [0, 2^64)"},
      {{{"shape", {1000000000000}}}, "'shape': 1000000000000 is out of range"},
      {{{"shape", {1e12}}}, "'shape': an integer"},
      {{{"shape", {16777216, 16777216}}}, "'shape': synthetic 16777216,16777216 has more than"},
      {{{"model", "mlp"}, {"shape", {1, 65536, 1, 65536, 1, 65536}}},
       "'shape': the widths of mlp 1,65536,1,65536,1,65536 after the input multiply to more"}};
  for (const auto& [changes, fragment] : bad) {
    nlohmann::json j = to_json(Scenario{});
    j.update(changes);
    try {
      scenario_from_json(j);
      ADD_FAILURE() << changes.dump() << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  }
  nlohmann::json largest = to_json(Scenario{});
  largest.update(
      {{"world", 1024}, {"n_backward", 64}, {"model", "mlp"}, {"shape", {8, 1024, 1024}}});
  EXPECT_EQ(scenario_from_json(largest).world, 1024);
  largest["seed"] = std::int64_t{5};  // a signed JSON integer, as C++ code builds one
  EXPECT_EQ(scenario_from_json(largest).seed, 5u);
}

// Found by fuzz/counterexample_fuzz.cpp: a trace_hash that is not hex escaped as std::stoull's
// invalid_argument, and a float rc_seed was cast to uint64 (undefined behaviour under UBSan).
TEST(SavedCaseJson, ABadTraceHashOrSeedIsAConfigError) {
  SavedCase c;
  c.invariant = "I1-coalesced-bit-exact";
  nlohmann::json j = to_json(c);
  j["trace_hash"] = "zz";
  EXPECT_THROW(saved_case_from_json(j), ConfigError);
  j["trace_hash"] = "0x1";
  j["rc_seed"] = 1e30;
  EXPECT_THROW(saved_case_from_json(j), ConfigError);
  j["rc_seed"] = 5;
  EXPECT_EQ(saved_case_from_json(j).rc_seed, 5u);
  EXPECT_EQ(saved_case_from_json(j).trace_hash, 1u);
}

TEST(Verify, UnknownInvariantOrBugIsAClearError) {
  VerifyOptions o;
  o.only = {"I9-nonsense"};
  o.out = std::filesystem::temp_directory_path() / ("zc-verify-bad-" + std::to_string(getpid()));
  EXPECT_THROW(run_verify(o), ConfigError);
  o.only.clear();
  o.bugs = {"B99"};
  EXPECT_THROW(run_verify(o), ConfigError);
}

class QuickVerify : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    VerifyOptions o;
    o.profile = profile_named("quick");
    o.jobs = 2;
    o.proofs = false;  // the zerocheck_prove test runs them
    o.hooks = hooks();
    o.out = std::filesystem::temp_directory_path() / ("zc-verify-quick-" + std::to_string(getpid()));
    report_ = new VerifyReport(run_verify(o));
  }
  static void TearDownTestSuite() { delete report_; }
  static VerifyReport* report_;
};
VerifyReport* QuickVerify::report_ = nullptr;

TEST_F(QuickVerify, EveryInvariantHoldsOnTheCorrectEngine) {
  EXPECT_TRUE(report_->errors.empty()) << report_->errors.front();
  ASSERT_EQ(report_->invariants.size(), invariants().size());
  for (const InvariantResult& i : report_->invariants) {
    EXPECT_TRUE(i.holds) << i.name << ": " << i.failure;
    EXPECT_EQ(i.cases, profile_named("quick").cases) << i.name;
  }
}

TEST_F(QuickVerify, EveryKnownBugIsCaughtShrunkAndReplaysExactly) {
  ASSERT_EQ(report_->bugs.size(), known_bugs().size() + hazards().size());
  for (const BugResult& b : report_->bugs) {
    if (b.id.rfind('H', 0) == 0) continue;  // DeepSpeed's hazards: the next test
    const bool has_invariant = find_invariant("I4-owner-kept-on-copy") != nullptr || (b.id != "B5" && b.id != "B6");
    if (!has_invariant) {
      EXPECT_FALSE(b.caught) << b.id;  // nothing checks module copies yet
      continue;
    }
    ASSERT_TRUE(b.caught) << b.id << " survived " << b.cases_to_catch << " cases";
    EXPECT_GT(b.cases_to_catch, 0);
    const Scenario s = scenario_from_json(b.scenario);
    EXPECT_LE(s.world, 2) << b.id << " shrank to " << describe(s);
    EXPECT_LE(s.n, 2) << b.id << " shrank to " << describe(s);
    const SavedCase saved = load_case(b.scenario_file);
    EXPECT_EQ(saved.scenario, s);
    EXPECT_EQ(saved.bugs.str(), b.id);
    const Verdict again = find_invariant(saved.invariant)->check(saved.scenario, CheckContext{saved.bugs, hooks()});
    EXPECT_FALSE(again.holds) << b.id;
    EXPECT_EQ(again.trace_hash, saved.trace_hash) << b.id;
    EXPECT_EQ(again.failure, saved.failure) << b.id;
    // Switched off, the same scenario passes: the bug, not the scenario, fails it.
    EXPECT_TRUE(find_invariant(saved.invariant)->check(saved.scenario, CheckContext{{}, hooks()}).holds) << b.id;
  }
  EXPECT_EQ(report_->determinism.mismatches, 0) << report_->determinism.detail;
  EXPECT_GT(report_->determinism.runs, 0);
}

// BF16_Optimizer (ZeRO-1 + bf16 + fp32 accumulation) reduces its fp32 grads in the communication
// dtype, bf16 unless communication_data_type says otherwise, and post-scales there: at world 7 one
// rank's 3 comes back as 21 x f32(1/7) rounded to bf16 = 3, and in f32 as 3.0000002. sharded-parity
// expected the f32 figure whatever the dtype and failed make run's case 456 (this scenario) from
// 987c349 on; it must hold with either dtype, which it does only if it follows the one in use.
TEST(ShardedParity, PostScalingRoundsInTheCommunicationDtype) {
  Scenario s = scenario_from_json(nlohmann::json::parse(R"({"adam_w_mode":true,"betas":[0.9,0.999],
    "boundary":"explicit","check_grad_overflow":true,"coalesce":false,"commands":[],"compile_passes":[],
    "contiguous_gradients":false,"deepcompile":true,"domain":"exact","dtype":"bf16","eps":1e-08,"fault":"",
    "grad_accum_dtype":"f32","gradient_accumulation_steps":1,"gradient_clipping":0.0,"lr":0.001,
    "model":"synthetic","momentum":0.0,"n_backward":1,"offload":"none","optimizer":"","overlap_comm":false,
    "reduce_bucket_size":16,"sched_seed":1,"seed":93,"shape":[1],"stage":1,"steps":1,"torch_adam":false,
    "weight_decay":0.0,"world":7})"));
  const Invariant& parity = *find_invariant("sharded-parity");
  for (const char* comm : {"", "bf16", "f32"}) {
    s.comm_dtype = comm;
    const Verdict v = parity.check(s, CheckContext{{}, hooks()});
    ASSERT_TRUE(v.applies) << comm;
    EXPECT_TRUE(v.holds) << "communication dtype '" << comm << "': " << v.failure;
  }
}

// A hazard's property fails on the correct engine (no bug switched on), because the engine does
// what DeepSpeed does; the shrunk counterexample replays, and the fix DeepSpeed documents (the
// explicit boundary) makes the same scenario hold.
TEST_F(QuickVerify, EveryDeepSpeedHazardIsShownWithACounterexample) {
  for (const Hazard& h : hazards()) {
    const auto it = std::find_if(report_->bugs.begin(), report_->bugs.end(), [&](const BugResult& b) { return b.id == h.code; });
    ASSERT_NE(it, report_->bugs.end()) << h.code;
    ASSERT_TRUE(it->caught) << h.code << ": " << it->failure;
    const SavedCase saved = load_case(it->scenario_file);
    EXPECT_EQ(saved.bugs.str(), "none");
    const Verdict again = find_invariant(saved.invariant)->check(saved.scenario, CheckContext{{}, hooks()});
    EXPECT_FALSE(again.holds) << h.code;
    EXPECT_EQ(again.trace_hash, saved.trace_hash) << h.code;
    EXPECT_LE(saved.scenario.world, 2) << describe(saved.scenario);
  }
  const auto h1 = std::find_if(report_->bugs.begin(), report_->bugs.end(), [](const BugResult& b) { return b.id == "H1"; });
  ASSERT_NE(h1, report_->bugs.end());
  Scenario fixed = load_case(h1->scenario_file).scenario;
  fixed.boundary = "explicit";
  EXPECT_TRUE(find_invariant("H1-implicit-backwards-sum")->check(fixed, CheckContext{{}, hooks()}).holds) << describe(fixed);
}

TEST_F(QuickVerify, ReportsCollectivesPerStepForThePlot) {
  ASSERT_EQ(report_->collectives.size(), 12u);  // stages 1-3 x N 1-4
  for (const CollectivePoint& p : report_->collectives) {
    if (p.n_backward == 1) {
      EXPECT_EQ(p.coalesced, p.baseline) << "stage " << p.stage;
    } else if (p.stage >= 2) {
      EXPECT_LT(p.coalesced, p.baseline) << "stage " << p.stage << " N " << p.n_backward;
    }
  }
}

TEST(Replay, TheRapidCheckReproduceStringRegeneratesTheSavedScenario) {
  const Invariant& inv = *find_invariant("I1-coalesced-bit-exact");
  const CheckContext ctx{BugSet{KnownBug::B7_flush_with_coalescing_set}, hooks()};
  const Campaign c = run_campaign(inv, ctx, 200, 5);
  ASSERT_TRUE(c.failed);
  const Campaign again = run_campaign(inv, ctx, 1, 5, c.reproduce);
  EXPECT_TRUE(again.failed);
  EXPECT_EQ(again.counterexample, c.counterexample);
}

// The overflow hunt can find one: with numel near 2^63, numel + 2 * world - 1 passes int64.
TEST(Proofs, TheInt64OverflowHuntFindsOneWhereItExists) {
  const auto [verdict, detail] = int64_overflow_hunt(std::numeric_limits<std::int64_t>::max() - 4, 20000);
  EXPECT_EQ(verdict, "found") << detail;
  EXPECT_NE(detail.find("overflows int64"), std::string::npos) << detail;
}

// The exact-domain lemma fails where it must: bf16 holds integers exactly only up to 256, so
// 129 + 128 = 257 rounds.
TEST(Proofs, TheExactDomainLemmaFailsPastTheMantissa) {
  EXPECT_EQ(exact_integer_sum_lemma(DType::bf16, 300, 60000).verdict, "counterexample");
  EXPECT_EQ(exact_integer_sum_lemma(DType::bf16, 64, 60000).verdict, "proved");
  // One past the generators' bound (exact_domain_max_integer) there is a sum that rounds: 2048 + 1.
  EXPECT_EQ(exact_integer_sum_lemma(DType::f16, exact_domain_max_integer(DType::f16) + 2, 60000).verdict, "counterexample");
  EXPECT_EQ(exact_domain_max_integer(DType::f32), (1 << 24) - 1);
  EXPECT_EQ(exact_domain_max_integer(DType::bf16), 255);
}

}  // namespace
}  // namespace zc::props

namespace zc::props {
namespace {

// The simulator's own faults in the failure-modes invariant: a dropped collective ends in a named
// Deadlock or CollectiveMismatch (never a hang), a slow rank changes no bit and takes longer (the
// sim-level tests in sim_test.cpp show each fault's own effect).
TEST(FailureModes, SimulatorFaultsGiveTheirPredictedOutcome) {
  const Invariant& inv = *find_invariant("failure-modes-clear-errors");
  Scenario s;
  s.world = 3;
  s.stage = 2;
  s.n = 2;
  s.steps = 2;
  for (const char* fault : {"dropped-collective", "slow-rank"}) {
    s.fault = fault;
    const Verdict v = inv.check(s, CheckContext{{}, hooks()});
    EXPECT_TRUE(v.holds) << fault << ": " << v.failure;
  }
  s.world = 1;  // nothing to mismatch with: a dropped collective at world 1 changes nothing
  s.fault = "dropped-collective";
  EXPECT_TRUE(inv.check(s, CheckContext{{}, hooks()}).holds);
}

}  // namespace
}  // namespace zc::props

namespace zc::props {
namespace {

// Note [Reaching every cell]: the DeepSpeed comparison's generator draws only cells of the coverage
// space, and 3,000 draws reach every one of its 270 (the old independent draws left a third of them
// out of a 100-case campaign, among them the two clip + bf16 communication scenarios). Every draw is
// a scenario the parser accepts; the MoE ones train at ZeRO-1/2 with every ep_size.
TEST(ReferenceCoverage, TheGeneratorReachesEveryCellOfTheCoverageSpace) {
  const std::vector<std::string> cells = reference_coverage_cells();
  ASSERT_EQ(cells.size(), 270u);
  const std::set<std::string> space(cells.begin(), cells.end());
  ASSERT_EQ(space.size(), cells.size()) << "cells are distinct";
  const rc::Gen<Scenario> gen = gen_reference_scenario();
  std::set<std::string> drawn;
  std::set<int> moe_stages, moe_ep_sizes;
  for (int i = 0; i < 3000; ++i) {
    const Scenario s = gen(rc::Random(rc::Random::Key{20261204u, static_cast<std::uint64_t>(i), 0, 0}), 100).value();
    const std::string cell = coverage_cell(s);
    ASSERT_TRUE(space.contains(cell)) << "drawn outside the space: " << cell;
    drawn.insert(cell);
    ASSERT_EQ(scenario_from_json(to_json(s)), s) << "a drawn scenario is a valid one: " << describe(s);
    if (is_moe(s)) {  // at the stages DeepSpeed's MoE trains at, experts over 1, 2 or 4 ranks
      moe_stages.insert(s.stage);
      moe_ep_sizes.insert(s.ep_size);
    }
  }
  EXPECT_EQ(drawn.size(), space.size());
  EXPECT_EQ(moe_stages, (std::set<int>{1, 2}));
  EXPECT_EQ(moe_ep_sizes, (std::set<int>{1, 2, 4}));
}

// One soak round's count of `cases` scenarios, `unlisted` of them in the class `key`.
nlohmann::json round_count(int cases, int unlisted, const std::string& key, bool shrunk) {
  nlohmann::json j = {{"seeds", {cases}}, {"cases", cases}, {"discarded", 0}, {"matched", cases - unlisted},
                      {"values_bit_for_bit", cases - unlisted}, {"listed", 0}, {"refused_by_both", 0},
                      {"unlisted", unlisted}, {"listed_by_class", {{"torch-adam-arithmetic", 1}}},
                      {"class_ulps", nlohmann::json::object()}, {"conformance", nlohmann::json::array()},
                      {"coverage", {{{"cell", "stage 0 | f32 | comm default | clip off | offload none | SGD"},
                                     {"scenarios", cases}, {"matched", cases - unlisted}, {"listed", 0},
                                     {"unlisted", unlisted}}}},
                      {"deepspeed_seconds", 1.5}, {"unlisted_classes", nlohmann::json::array()}};
  if (unlisted > 0) {
    nlohmann::json k = {{"key", key}, {"cases", unlisted}, {"failure", "x"}};
    if (shrunk) k["counterexample"] = to_json(Scenario{});
    j["unlisted_classes"].push_back(k);
  }
  return j;
}

// A soak adds its rounds' counts: sums, every cell kept, an unlisted class seen twice counted once
// with its cases summed and the first shrunk counterexample kept.
TEST(ReferenceCoverage, MergingCountsSumsThemAndKeepsEachUnlistedClassOnce) {
  nlohmann::json total;
  merge_conformance_counts(total, round_count(10, 2, "params | a", false));
  merge_conformance_counts(total, round_count(20, 3, "params | a", true));
  merge_conformance_counts(total, round_count(30, 1, "grads | b", true));
  EXPECT_EQ(total["cases"], 60);
  EXPECT_EQ(total["unlisted"], 6);
  EXPECT_EQ(total["matched"], 54);
  EXPECT_EQ(total["seeds"].size(), 3u);
  EXPECT_EQ(total["listed_by_class"]["torch-adam-arithmetic"], 3);
  EXPECT_DOUBLE_EQ(total["deepspeed_seconds"].get<double>(), 4.5);
  ASSERT_EQ(total["coverage"].size(), 1u);
  EXPECT_EQ(total["coverage"][0]["scenarios"], 60);
  ASSERT_EQ(total["unlisted_classes"].size(), 2u);
  EXPECT_EQ(total["unlisted_classes"][0]["cases"], 5);
  EXPECT_TRUE(total["unlisted_classes"][0].contains("counterexample")) << "the later shrunk case is kept";
  EXPECT_EQ(coverage_summary(total)["drawn"], 1);
}

// The scenarios whose memory was not measured, counted by reason over rounds: a reason said by one
// rank in a round and by rank 1 in another is one, its first scenario kept; past 12 reasons, the
// rest are counted together, and every scenario is counted once.
TEST(ReferenceCoverage, NotMeasuredMemoryIsCountedByReason) {
  auto round = [](const nlohmann::json& reasons) {
    nlohmann::json j = round_count(4, 0, "", false);
    j["memory"] = {{"scenarios", 4}, {"not_measured_reasons", reasons}};
    int n = 0;
    for (const nlohmann::json& r : reasons) n += r["scenarios"].get<int>();
    j["memory"]["not_measured"] = n;
    return j;
  };
  nlohmann::json total;
  // The first round as count_memory writes it (its reasons already without the rank).
  const nlohmann::json refused0 = {{"reason", "refused by zerocheck: a rank failed: torch_adam"},
                                    {"scenarios", 2}, {"first", "z1 w2"}};
  const nlohmann::json refused1 = {{"reason", "refused by zerocheck: rank 1 failed: torch_adam"},
                                    {"scenarios", 1}, {"first", "z2 w3"}};
  const nlohmann::json boom = {{"reason", "memory.py: boom"}, {"scenarios", 1}, {"first", "z3 w2"}};
  merge_conformance_counts(total, round(nlohmann::json::array({refused0, boom})));
  merge_conformance_counts(total, round(nlohmann::json::array({refused1})));
  const nlohmann::json& m = total["memory"];
  ASSERT_EQ(m["not_measured_reasons"].size(), 2u) << m.dump();
  EXPECT_EQ(m["not_measured_reasons"][0]["reason"], "refused by zerocheck: a rank failed: torch_adam");
  EXPECT_EQ(m["not_measured_reasons"][0]["scenarios"], 3);
  EXPECT_EQ(m["not_measured_reasons"][0]["first"], "z1 w2");
  EXPECT_EQ(m["not_measured_reasons"][1]["scenarios"], 1);
  nlohmann::json many = nlohmann::json::array();
  for (int k = 0; k < 12; ++k) {
    many.push_back({{"reason", fmt::format("reason {}", k)}, {"scenarios", 1}, {"first", "z0"}});
  }
  merge_conformance_counts(total, round(many));
  ASSERT_EQ(m["not_measured_reasons"].size(), 12u);
  EXPECT_EQ(m.value("not_measured_other_reasons", 0), 2) << "reasons 10 and 11 counted together";
  int counted = m.value("not_measured_other_reasons", 0);
  for (const nlohmann::json& r : m["not_measured_reasons"]) counted += r["scenarios"].get<int>();
  EXPECT_EQ(counted, m["not_measured"].get<int>());
}

}  // namespace
}  // namespace zc::props

namespace zc::props {
namespace {

// A rank{R}.mem.json as reference/deepspeed/memory.py writes it.
nlohmann::json mem_phase(const std::string& name, std::int64_t peak, std::int64_t grads, std::int64_t gloo = 0,
                         std::int64_t host = 0, std::int64_t cpu_kernel = 0,
                         std::int64_t log_format = 0) {
  nlohmann::json cats = {{"params", 8}, {"grads", grads}, {"temporaries", peak - 8 - grads}};
  nlohmann::json by = cats;
  by["cpu_backend"] = gloo;
  by["host"] = host;
  by["cpu_kernel"] = cpu_kernel;
  by["log_format"] = log_format;
  return {{"name", name}, {"peak", peak}, {"at_peak", cats}, {"peak_by_category", by}, {"peak_site", "x"},
          {"marks", {{"after_forward", 10}, {"after_step", 12}}}};
}

std::filesystem::path write_mem(const std::string& file, const nlohmann::json& j) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / fmt::format("zc-mem-{}-{}", ::getpid(), file);
  std::ofstream(p) << j.dump();
  return p;
}

TEST(DeepSpeedMemoryRecord, ReadsPhasesKeepsGlooStagingApartAndNamesBadFiles) {
  const auto p = write_mem("ok.json", {{"phases", {mem_phase("construction", 24, 0, 0, 0, 0, 90),
                                                   mem_phase("step0", 40, 16, 112, 5056, 12),
                                                   mem_phase("step1", 44, 16)}}});
  const DeepSpeedMemory m = read_deepspeed_memory(p);
  EXPECT_EQ(m.construction.peak, 24);
  ASSERT_EQ(m.steps.size(), 2u);
  EXPECT_EQ(m.steps[0].peak_by_category[static_cast<std::size_t>(MemCategory::grads)], 16);
  EXPECT_EQ(m.steps[0].cpu_backend_peak, 112) << "gloo's staging is read apart from the categories";
  EXPECT_EQ(m.steps[0].host_peak, 5056) << "what a GPU run keeps in host memory is read apart too";
  EXPECT_EQ(m.steps[0].cpu_kernel_peak, 12) << "and what only a CPU kernel allocates";
  EXPECT_EQ(m.construction.log_format_peak, 90) << "and torch's printing of ZeRO-3's log line";
  EXPECT_EQ(m.steps[1].marks.at("after_step"), 12);
  // Bad input: a missing file, a file that is not a record, an unknown category: each names the file.
  for (const auto& [file, body] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"none.json", nullptr}, {"notrecord.json", {{"x", 1}}},
           {"badcat.json", {{"phases", {{{"name", "construction"}, {"peak", 1}, {"at_peak", {{"weights", 1}}},
                                          {"peak_by_category", nlohmann::json::object()}, {"marks", nlohmann::json::object()}}}}}}}) {
    const auto q = body.is_null() ? std::filesystem::temp_directory_path() / "zc-mem-does-not-exist.json" : write_mem(file, body);
    try {
      read_deepspeed_memory(q);
      ADD_FAILURE() << file << " was read";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(body.is_null() ? "missing" : q.filename().string()), std::string::npos) << e.what();
    }
  }
  // The worker's profiler failed: the record says why, and the comparison is "not measured" with it.
  const DeepSpeedMemory failed = read_deepspeed_memory(write_mem("err.json", {{"error", "memory.py: RuntimeError: boom"}}));
  EXPECT_EQ(failed.error, "memory.py: RuntimeError: boom");
  const DeepSpeedMemoryComparison c = compare_memory(RunResult{}, {failed});
  EXPECT_FALSE(c.measured);
  EXPECT_EQ(c.verdict(), "");
  EXPECT_NE(c.error.find("rank 0's memory was not measured: memory.py: RuntimeError: boom"), std::string::npos) << c.error;
}

// The engine's ledgers of a run: construction (params 8 B, a 16 B temporary), one step (a 16 B
// gradient, a 20 B temporary); `late`: a 1 B temporary freed only after the step's peak.
RunResult ledger_run(bool late) {
  RunResult sim;
  sim.ranks = {0};
  sim.memory.resize(1);
  DeviceMemory& d = sim.memory[0].device;
  d.construction.on_alloc(MemCategory::params, 8, "p");
  d.construction.on_alloc(MemCategory::temporaries, 16, "t");
  d.construction.on_free(MemCategory::temporaries, 16);
  d.steps = d.construction;
  d.steps.reset_peak();
  d.steps.on_alloc(MemCategory::grads, 16, "g");
  if (late) d.steps.on_alloc(MemCategory::temporaries, 1, "late");
  d.steps.on_alloc(MemCategory::temporaries, 20, "t");
  d.steps.on_free(MemCategory::temporaries, 20);
  if (late) d.steps.on_free(MemCategory::temporaries, 1);
  d.per_step = {{44, 10, 12}};
  return sim;
}

TEST(DeepSpeedMemoryRecord, ComparesTotalsCategoriesAndStepsRankByRank) {
  RunResult sim = ledger_run(false);
  DeepSpeedMemory ds;
  ds.construction = read_deepspeed_memory(write_mem("c.json", {{"phases", {mem_phase("construction", 24, 0)}}})).construction;
  ds.steps = read_deepspeed_memory(write_mem("s.json", {{"phases", {mem_phase("step0", 44, 16)}}})).steps;
  DeepSpeedMemoryComparison c = compare_memory(sim, {ds});
  ASSERT_TRUE(c.measured);
  EXPECT_EQ(c.verdict(), "exact") << fmt::format("{}", fmt::join(c.differences(10), "; "));
  // One buffer freed late on the engine's side: the figures that moved are named, worst first.
  c = compare_memory(ledger_run(true), {ds});
  EXPECT_EQ(c.verdict(), "beyond");
  ASSERT_FALSE(c.differences(1).empty());
  EXPECT_EQ(c.differences(1)[0], "rank 0 steps peak: zerocheck 45 B, DeepSpeed 44 B");
  EXPECT_TRUE((MemoryFigure{"x", 1010, 1000, "total", ""}.within_1pct()));
  EXPECT_FALSE((MemoryFigure{"x", 1011, 1000, "total", ""}.within_1pct()));
}

// Note [The device and the CPU as one memory]: under offload the comparison reads the ledger both
// devices feed, whose peaks are those of their sum (the full params on the device, then the
// partition on the CPU: 104 B at once, not 104 + 52).
TEST(DeepSpeedMemoryRecord, UnderOffloadTheDeviceAndTheCpuAreOneMemory) {
  MemoryLedger dev, cpu;
  auto both = std::make_shared<MemoryLedger>();
  dev.also_count_in(both);
  cpu.also_count_in(both);
  dev.on_alloc(MemCategory::params, 104, "full params");
  cpu.on_alloc(MemCategory::master, 52, "fp32 partition");
  dev.on_free(MemCategory::params, 104);
  cpu.on_alloc(MemCategory::params, 52, "partition");
  EXPECT_EQ(both->peak()[0], 104);
  EXPECT_EQ(dev.peak()[0] + cpu.peak()[0], 156);
  EXPECT_EQ(both->peak_total(), 156);
  MemoryLedger snapshot = cpu;  // a copy forwards nothing
  snapshot.on_alloc(MemCategory::grads, 8, "g");
  EXPECT_EQ(both->live_total(), 104);
  RunResult sim;
  sim.ranks = {0};
  sim.memory.resize(1);
  sim.memory[0].device.construction = dev;
  sim.memory[0].cpu.construction = cpu;
  sim.memory[0].both.emplace().construction = *both;
  DeepSpeedMemory ds;
  ds.construction.peak = 156;
  ds.construction.peak_by_category[0] = 104;
  ds.construction.peak_by_category[2] = 52;
  const DeepSpeedMemoryComparison c = compare_memory(sim, {ds});
  EXPECT_EQ(c.verdict(), "exact") << fmt::format("{}", fmt::join(c.differences(10), "; "));
  ASSERT_EQ(c.figures.size(), 4u);  // the totals too, under offload (the steps' 0 against 0)
  EXPECT_EQ(c.figures[0].what, "rank 0 construction peak");
  EXPECT_EQ(c.figures[1].what, "rank 0 construction peak of params");
  EXPECT_EQ(c.figures[2].what, "rank 0 construction peak of master");
}

// The engine counts the one memory only where asked (the reference's comparison under offload):
// ZeRO-3 with offload_param builds the full params on the device and keeps the partition on the
// CPU, so the one memory's construction peak of params is the device's, not the two peaks summed.
TEST(DeepSpeedMemoryRecord, TheOneMemoryIsCountedWhereTheRunAsksForIt) {
  Scenario s;
  s.world = 1;
  s.stage = 3;
  s.model = "mlp";
  s.shape = {3, 4, 2};
  s.steps = 1;
  s.offload = "param";
  RunSpec spec = to_run_spec(s, {}, {});
  spec.record_values = false;
  spec.collect_grads = false;
  EXPECT_FALSE(run_on_sim(spec).memory.at(0).both.has_value());
  spec.one_memory = true;
  const RunResult r = run_on_sim(spec);
  const RankMemory& m = r.memory.at(0);
  ASSERT_TRUE(m.both.has_value());
  const auto params = static_cast<std::size_t>(MemCategory::params);
  const std::int64_t dev = m.device.construction.peak()[params], cpu = m.cpu.construction.peak()[params];
  EXPECT_GT(cpu, 0);
  EXPECT_EQ(m.both->construction.peak()[params], std::max(dev, cpu)) << dev << " + " << cpu;
  EXPECT_EQ(m.both->steps.live_total(), m.device.steps.live_total() + m.cpu.steps.live_total());
  EXPECT_EQ(m.both->per_step.size(), 1u);
}

// A divergence list of one class, `extra` merged into a memory class's entry.
std::filesystem::path write_classes(const std::string& name, const nlohmann::json& extra) {
  nlohmann::json c = {{"id", "late-temporary"}, {"summary", "s"}, {"deepspeed", "x.py:1"}, {"when", {{"stage", {0}}}},
                      {"affects", {"memory:temporaries"}}, {"witness", {{"world", 1}}}};
  c.merge_patch(extra);
  return write_mem(name, {{"classes", {c}}});
}

TEST(DeepSpeedMemoryRecord, AListedClassExplainsOnlyTheFiguresItBoundsAndItsScenarios) {
  DeepSpeedMemory ds;
  ds.construction = read_deepspeed_memory(write_mem("c.json", {{"phases", {mem_phase("construction", 24, 0)}}})).construction;
  ds.steps = read_deepspeed_memory(write_mem("s.json", {{"phases", {mem_phase("step0", 44, 16)}}})).steps;
  const DeepSpeedMemoryComparison late = compare_memory(ledger_run(true), {ds});  // total and temporaries 1 B over
  Scenario s;
  s.stage = 0;
  auto listed = [&](const nlohmann::json& extra) {
    DeepSpeedMemoryComparison c = late;
    list_memory_differences(s, c, load_divergence_classes(write_classes("classes.json", extra)));
    return c;
  };
  DeepSpeedMemoryComparison c = listed({{"max_bytes", 1}});
  EXPECT_EQ(c.classes(), std::vector<std::string>{"late-temporary"});
  EXPECT_EQ(c.verdict(), "beyond");  // the total's 1 B is not the class's
  ASSERT_EQ(c.differences(5).size(), 1u);
  EXPECT_EQ(c.differences(5)[0], "rank 0 steps peak: zerocheck 45 B, DeepSpeed 44 B");
  EXPECT_EQ(listed({{"max_bytes", 1}, {"affects", {"memory:temporaries", "memory:total"}}}).verdict(), "listed");
  // Past its bound, outside its scenarios, or where DeepSpeed allocated some: not explained.
  EXPECT_TRUE(listed({{"max_bytes", 0}}).classes().empty());
  EXPECT_TRUE(listed({{"deepspeed_none", true}}).classes().empty());
  EXPECT_TRUE(listed({{"max_bytes", 1}, {"when", {{"stage", {3}}}}}).classes().empty());
  // A memory class with no bound, a category that is none, one that also affects a value field.
  for (const auto& [extra, says] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json::object(), "must bound what it covers"},
           {{{"max_bytes", 1}, {"affects", {"memory:weights"}}}, "names no memory category"},
           {{{"max_bytes", 1}, {"affects", {"memory:grads", "grads"}}}, "not both"}}) {
    try {
      load_divergence_classes(write_classes("bad.json", extra));
      ADD_FAILURE() << extra.dump() << " was loaded";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace zc::props
