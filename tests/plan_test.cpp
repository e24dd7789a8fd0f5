// zerocheck plan (plan/plan.h): a small model's memory checked by hand, representative ranks
// against the full simulation, the time model's parts, and bad input (a world the batch sizes
// cannot divide, a model that does not fit, unknown hardware, split under representative ranks).
#include "engine/errors.h"
#include "plan/plan.h"
#include "sim/sim_cluster.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

namespace zc::plan {
namespace {

const Hardware& hardware() {
  static const Hardware hw = load_hardware(default_hardware_path());
  return hw;
}

std::size_t k(MemCategory c) { return static_cast<std::size_t>(c); }

PlanOptions tiny(int stage, int world, nlohmann::json zero_extra = nlohmann::json::object()) {
  PlanOptions o;
  o.ds_config = {{"train_micro_batch_size_per_gpu", 1},
                 {"gradient_accumulation_steps", 1},
                 {"bf16", {{"enabled", true}}},
                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                 {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 1000}}}};
  for (const auto& [key, v] : zero_extra.items()) o.ds_config["zero_optimization"][key] = v;
  o.model = transformer_preset("llama-tiny");
  o.world = world;
  return o;
}

// llama-tiny has 8,016 params: ZeRO-2 at world 2 pads the flat group to a multiple of 2 x 2 (no
// padding here) and gives each rank 4,008.
TEST(Plan, SmallModelMemoryMatchesTheArithmeticByHand) {
  const PlanResult r = run_plan(tiny(2, 2), hardware());
  ASSERT_EQ(r.params, 8016);
  const MemBytes& peak = r.device.category_peaks;
  EXPECT_EQ(peak[k(MemCategory::params)], 8016 * 2) << "the bf16 flat group";
  EXPECT_EQ(peak[k(MemCategory::master)], 4008 * 4) << "this rank's fp32 partition";
  EXPECT_EQ(peak[k(MemCategory::optimizer_states)], 4008 * 8) << "exp_avg and exp_avg_sq";
  EXPECT_EQ(peak[k(MemCategory::ipg_buckets)], 1000 * 2) << "one bf16 ipg buffer of reduce_bucket_size";
  EXPECT_EQ(r.cpu.peak, 0) << "no offload";
  // Construction flattens the model into the flat group while the model's own params still live.
  EXPECT_GE(r.device.construction_peak, 2 * 8016 * 2);
  EXPECT_TRUE(r.fits);
  EXPECT_EQ(mem_total(r.device.at_peak), r.device.peak) << "the composition sums to the peak";

  // Offloading the optimizer moves the master and states to the CPU side, byte for byte.
  const PlanResult off = run_plan(tiny(2, 2, {{"offload_optimizer", {{"device", "cpu"}}}}), hardware());
  EXPECT_EQ(off.device.category_peaks[k(MemCategory::master)], 0);
  EXPECT_EQ(off.device.category_peaks[k(MemCategory::optimizer_states)], 0);
  EXPECT_EQ(off.cpu.category_peaks[k(MemCategory::master)], 4008 * 4);
  EXPECT_EQ(off.cpu.category_peaks[k(MemCategory::optimizer_states)], 4008 * 8);
  EXPECT_GT(off.offload_us, 0) << "CPU Adam and the PCIe transfers take time";
}

// mixtral-tiny (13,008 params; per layer 2,304 params in each expert-parallel rank's 2 of the 4
// experts) at world 4, ep_size 2, ZeRO-2: a rank holds the 3,792 dense params and 4,608 expert
// params in bf16; ZeRO-2 partitions the dense ones over the 4 ranks (948 each) and the experts
// over the 2 ranks of the expert-data-parallel group (2,304 each). With 8 tokens, 4 experts and
// top-2, DeepSpeed's capacity is max(ceil(8 / 4 * 2), 4) = 4 slots per expert, so each of the 4
// all_to_alls per layer (dispatch, combine and their backwards) moves [4 x 4, 16] bf16 = 512 bytes.
TEST(Plan, MoeMemoryAndAllToAllMatchTheArithmeticByHand) {
  PlanOptions o = tiny(2, 4);
  o.model = transformer_preset("mixtral-tiny");
  o.ds_config["moe"] = {{"ep_size", 2}};
  const PlanResult r = run_plan(o, hardware());
  ASSERT_EQ(r.params, 13008);
  EXPECT_EQ(r.ep_size, 2);
  const MemBytes& peak = r.device.category_peaks;
  EXPECT_EQ(peak[k(MemCategory::params)], (3792 + 4608) * 2) << "dense + local experts, bf16";
  EXPECT_EQ(peak[k(MemCategory::master)], (948 + 2304) * 4);
  EXPECT_EQ(peak[k(MemCategory::optimizer_states)], (948 + 2304) * 8);
  bool seen = false;
  for (const CollectiveFigure& c : r.collectives) {
    if (c.kind != CollectiveKind::all_to_all) continue;
    seen = true;
    EXPECT_EQ(c.calls, 2 * 4);
    EXPECT_EQ(c.bytes, 2 * 4 * 512);
  }
  EXPECT_TRUE(seen) << "the expert group's all_to_alls are in the plan's collectives";

  o.ranks = PlanOptions::Ranks::representative;
  try {
    run_plan(o, hardware());
    ADD_FAILURE() << "representative ranks planned an MoE model";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--ranks all"), std::string::npos) << e.what();
  }
  o.ranks = PlanOptions::Ranks::automatic;
  o.ds_config["zero_optimization"]["stage"] = 3;
  try {
    run_plan(o, hardware());
    ADD_FAILURE() << "ZeRO-3 planned an MoE model";
  } catch (const ZcError& e) {
    EXPECT_NE(std::string(e.what()).find("MoE expert params with ZeRO stage 3 are not modelled"),
              std::string::npos) << e.what();
  }
}

TEST(Plan, ZeroThreeShardsWhatZeroTwoReplicates) {
  PlanOptions o = tiny(3, 4, {{"stage3_param_persistence_threshold", 0}});
  const PlanResult z3 = run_plan(o, hardware());
  // Every param padded to a multiple of 4 and sharded: the partition is the sum of ceil(n / 4).
  std::int64_t shards = 0;
  Transformer t(o.model);
  for (Parameter* p : t.named_parameters()) shards += (p->numel() + 3) / 4;
  EXPECT_EQ(z3.device.category_peaks[k(MemCategory::params)], shards * 2);
  EXPECT_EQ(z3.device.category_peaks[k(MemCategory::master)], shards * 4);
  EXPECT_GT(z3.device.category_peaks[k(MemCategory::gathered_params)], 0);
}

TEST(Plan, TimeSplitsIntoComputeAndCommunication) {
  const PlanResult r = run_plan(tiny(2, 4), hardware());
  EXPECT_GT(r.compute_us, 0);
  EXPECT_GT(r.comm_us, 0);
  // Blocked time includes waiting for slower ranks, so it may exceed the collectives' own time.
  EXPECT_GE(r.exposed_comm_us, 0);
  EXPECT_NEAR(r.overlap_us, std::max(0.0, r.comm_us - r.exposed_comm_us), 1e-6);
  EXPECT_GE(r.step_us + 1e-9, r.compute_us + r.exposed_comm_us);
  EXPECT_GT(r.flops_per_step, 0);
  // Across nodes the same collectives take longer (the NIC is slower than NVLink).
  PlanOptions across = tiny(2, 4);
  across.gpus_per_node = 1;
  EXPECT_GT(run_plan(across, hardware()).comm_us, r.comm_us);
}

TEST(Plan, TwoLevelTopologyChargesTheNetworkForRingsThatLeaveANode) {
  sim::CostModel c;
  c.gpus_per_node = 8;
  c.alpha_us = 3, c.link_gb_per_s = 400, c.inter_alpha_us = 14, c.inter_gb_per_s = 40;
  EXPECT_EQ(c.nodes_spanned(0, 7), 1);
  EXPECT_EQ(c.nodes_spanned(0, 15), 2);
  EXPECT_EQ(c.nodes_spanned(6, 9), 2);
  const std::int64_t bytes = 1 << 30;
  // Inside a node: NVLink's latency and bandwidth.
  EXPECT_DOUBLE_EQ(c.collective_us(CollectiveKind::all_gather, bytes, 8, 1),
                   3.0 * 7 + static_cast<double>(bytes) * 7 / 8 / (400 * 1e3));
  // Two nodes of 8: 2 of 16 ring steps cross the network, the NIC bounds the bandwidth.
  const double alpha = 3.0 * (1 - 2.0 / 16) + 14.0 * (2.0 / 16);
  EXPECT_DOUBLE_EQ(c.collective_us(CollectiveKind::all_reduce, bytes, 16, 2),
                   alpha * 30 + static_cast<double>(bytes) * 2 * 15 / 16 / (40 * 1e3));
}

// Note [NCCL tuning model]: on a node type with NCCL graphs every collective NCCL tunes is named
// with NCCL's choice, the choices account for every call and byte, and the time is NCCL's; the
// ring formula where asked (--collectives ring) or where the node type no longer applies.
TEST(PlanNccl, NamesNcclsChoiceForEveryCollectiveItTunes) {
  PlanOptions o = tiny(3, 16);  // two nodes of eight H100s
  const PlanResult r = run_plan(o, hardware());
  EXPECT_EQ(r.collective_model.rfind("NCCL 2.30.7's tuning model on DGX H100/H200", 0), 0u) << r.collective_model;
  ASSERT_FALSE(r.collectives.empty());
  for (const CollectiveFigure& c : r.collectives) {
    ASSERT_FALSE(c.nccl.empty()) << collective_name(c.kind);
    std::int64_t calls = 0, bytes = 0;
    for (const sim::NcclCalls& n : c.nccl) {
      EXPECT_EQ(n.kind, c.kind);
      calls += n.calls;
      bytes += n.bytes;
    }
    // Per step (over 2 steps), each entry rounded down on its own.
    EXPECT_LE(calls, c.calls) << collective_name(c.kind);
    EXPECT_GE(calls, c.calls - static_cast<std::int64_t>(c.nccl.size())) << collective_name(c.kind);
    EXPECT_LE(bytes, c.bytes) << collective_name(c.kind);
    EXPECT_GE(bytes, c.bytes - static_cast<std::int64_t>(c.nccl.size()) * c.bytes / std::max<std::int64_t>(1, c.calls))
        << collective_name(c.kind);
  }
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j.at("collective_model"), r.collective_model);
  EXPECT_FALSE(j.at("collectives_per_step")[0].at("nccl").empty());

  o.ring_collectives = true;
  const PlanResult ring = run_plan(o, hardware());
  EXPECT_EQ(ring.collective_model, "ring formula (--collectives ring)");
  for (const CollectiveFigure& c : ring.collectives) EXPECT_TRUE(c.nccl.empty()) << collective_name(c.kind);
  EXPECT_NE(ring.comm_us, r.comm_us);
  // Memory does not depend on how collectives are timed.
  EXPECT_EQ(ring.device.peak, r.device.peak);

  o.ring_collectives = false;
  o.network = "ib-hdr";  // not the DGX H100's own network: its graphs no longer describe the node
  const PlanResult hdr = run_plan(o, hardware());
  EXPECT_NE(hdr.collective_model.find("are for 8 GPUs per node on ib-ndr, not 8 on ib-hdr"), std::string::npos)
      << hdr.collective_model;
  for (const CollectiveFigure& c : hdr.collectives) EXPECT_TRUE(c.nccl.empty());
}

TEST(PlanBadInput, AnNcclGraphThatIsNotOneNamesWhere) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(default_hardware_path()));
  j["nccl_nodes"]["dgx-h100"]["one_node"]["ring"]["channels"] = 1.5;
  const std::string path = ::testing::TempDir() + "/hardware_bad_nccl.json";
  std::ofstream(path) << j.dump();
  try {
    load_hardware(path);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl_nodes.dgx-h100.one_node.ring: 'channels' must be a whole number"),
              std::string::npos) << e.what();
  }
  j = nlohmann::json::parse(std::ifstream(default_hardware_path()));
  j["node_defaults"]["h100"]["nccl"] = "dgx-h900";
  std::ofstream(path) << j.dump();
  try {
    load_hardware(path);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown nccl node 'dgx-h900'"), std::string::npos) << e.what();
  }
}

// The figures a rank's plan must share with another simulation of the same rank: memory (peak,
// composition, every category, construction, the CPU side), collectives, compute and comm time.
void expect_same_rank_figures(const PlanResult::RankFigures& ra, const PlanResult::RankFigures& rb,
                              const std::string& what) {
  EXPECT_EQ(ra.device.peak, rb.device.peak) << what;
  EXPECT_EQ(ra.device.at_peak, rb.device.at_peak) << what;
  EXPECT_EQ(ra.device.category_peaks, rb.device.category_peaks) << what;
  EXPECT_EQ(ra.device.construction_peak, rb.device.construction_peak) << what;
  EXPECT_EQ(ra.cpu.peak, rb.cpu.peak) << what;
  EXPECT_EQ(ra.cpu.category_peaks, rb.cpu.category_peaks) << what;
  ASSERT_EQ(ra.collectives.size(), rb.collectives.size()) << what;
  for (std::size_t i = 0; i < ra.collectives.size(); ++i) {
    EXPECT_EQ(ra.collectives[i].calls, rb.collectives[i].calls) << what;
    EXPECT_EQ(ra.collectives[i].bytes, rb.collectives[i].bytes) << what;
    const std::vector<sim::NcclCalls>& na = ra.collectives[i].nccl;
    const std::vector<sim::NcclCalls>& nb = rb.collectives[i].nccl;
    ASSERT_EQ(na.size(), nb.size()) << what << ": NCCL's choices";
    for (std::size_t j = 0; j < na.size(); ++j) {
      EXPECT_EQ(na[j].algo, nb[j].algo) << what;
      EXPECT_EQ(na[j].proto, nb[j].proto) << what;
      EXPECT_EQ(na[j].calls, nb[j].calls) << what;
      EXPECT_EQ(na[j].bytes, nb[j].bytes) << what;
      EXPECT_EQ(na[j].us, nb[j].us) << what;
    }
  }
  EXPECT_EQ(ra.compute_us, rb.compute_us) << what;
  EXPECT_EQ(ra.comm_us, rb.comm_us) << what;
}

// Note [Representative ranks]: at sizes where both run, the simulated ranks' figures are the full
// simulation's, byte for byte and collective for collective.
TEST(Plan, RepresentativeRanksGiveTheFullSimulationsFigures) {
  for (int stage : {1, 2, 3}) {
    for (int world : {8, 12, 16}) {
      PlanOptions full = tiny(stage, world, {{"overlap_comm", stage == 3}});
      full.ranks = PlanOptions::Ranks::all;
      PlanOptions rep = full;
      rep.ranks = PlanOptions::Ranks::representative;
      const PlanResult a = run_plan(full, hardware()), b = run_plan(rep, hardware());
      ASSERT_TRUE(b.representative);
      ASSERT_EQ(b.simulated_ranks, representative_ranks(world));
      for (const PlanResult::RankFigures& rb : b.ranks) {
        const PlanResult::RankFigures& ra = a.ranks.at(static_cast<std::size_t>(rb.rank));
        expect_same_rank_figures(ra, rb, fmt::format("stage {} world {} rank {}", stage, world, rb.rank));
      }
    }
  }
}

// Note [Decoupled schedule]: every rank's figures are the interleaved scheduler's; memory,
// collectives, compute and communication exactly, the clock (which adds a segment's compute as
// one sum) to a relative 1e-9.
TEST(Plan, TheDecoupledScheduleGivesTheInterleavedSchedulesFigures) {
  auto close = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({std::abs(a), std::abs(b), 1.0}); };
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 8, 12, 16}) {
      for (const nlohmann::json& extra : {nlohmann::json{{"overlap_comm", stage >= 2}},
                                          nlohmann::json{{"offload_optimizer", {{"device", "cpu"}}}}}) {
        if (stage == 0 && extra.contains("offload_optimizer")) continue;
        PlanOptions inter = tiny(stage, world, extra);
        inter.ranks = PlanOptions::Ranks::all;
        inter.schedule = sim::Schedule::interleaved;
        PlanOptions dec = inter;
        dec.schedule = sim::Schedule::decoupled;
        const PlanResult a = run_plan(inter, hardware()), b = run_plan(dec, hardware());
        ASSERT_EQ(b.schedule, sim::Schedule::decoupled);
        ASSERT_EQ(a.ranks.size(), b.ranks.size());
        for (std::size_t i = 0; i < a.ranks.size(); ++i) {
          const PlanResult::RankFigures &ra = a.ranks[i], &rb = b.ranks[i];
          const std::string what = fmt::format("stage {} world {} {} rank {}", stage, world, extra.dump(), ra.rank);
          expect_same_rank_figures(ra, rb, what);
          EXPECT_TRUE(close(ra.wait_us, rb.wait_us)) << what << ": " << ra.wait_us << " vs " << rb.wait_us;
          EXPECT_TRUE(close(ra.step_us, rb.step_us)) << what << ": " << ra.step_us << " vs " << rb.step_us;
        }
        EXPECT_TRUE(close(a.step_us, b.step_us)) << stage << " " << world;
        EXPECT_TRUE(close(a.exposed_comm_us, b.exposed_comm_us)) << stage << " " << world;
      }
    }
  }
}

// An MoE plan runs decoupled, its expert groups declared (props::moe_split), and gives the
// interleaved run's figures: memory, collectives and NCCL's choices exactly, the clock to 1e-9.
TEST(Plan, AnMoePlanRunsDecoupledWithTheInterleavedFigures) {
  auto close = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({std::abs(a), std::abs(b), 1.0}); };
  for (int stage : {1, 2}) {
    for (const auto& [world, ep] : {std::pair{4, 2}, std::pair{16, 4}, std::pair{16, 2}}) {
      PlanOptions o = tiny(stage, world, {{"overlap_comm", true}});
      o.model = transformer_preset("mixtral-tiny");
      o.ds_config["moe"] = {{"ep_size", ep}};
      o.ranks = PlanOptions::Ranks::all;
      const PlanResult dec = run_plan(o, hardware());
      EXPECT_EQ(dec.schedule, sim::Schedule::decoupled);
      o.schedule = sim::Schedule::interleaved;
      const PlanResult inter = run_plan(o, hardware());
      ASSERT_EQ(inter.ranks.size(), dec.ranks.size());
      for (std::size_t i = 0; i < inter.ranks.size(); ++i) {
        const std::string what = fmt::format("stage {} world {} ep {} rank {}", stage, world, ep, inter.ranks[i].rank);
        expect_same_rank_figures(inter.ranks[i], dec.ranks[i], what);
        EXPECT_TRUE(close(inter.ranks[i].step_us, dec.ranks[i].step_us)) << what;
        EXPECT_TRUE(close(inter.ranks[i].wait_us, dec.ranks[i].wait_us)) << what;
      }
      EXPECT_EQ(to_json(inter).at("memory"), to_json(dec).at("memory"));
      EXPECT_EQ(to_json(inter).at("collectives_per_step"), to_json(dec).at("collectives_per_step"));
    }
  }
}

TEST(Plan, RepresentativeRanksPlanAWorldTheFullSimulatorCannotHold) {
  PlanOptions o = tiny(3, 65536);
  const PlanResult r = run_plan(o, hardware());  // automatic: representative above 4,096 ranks
  EXPECT_TRUE(r.representative);
  EXPECT_EQ(r.simulated_ranks.size(), 4u);
  EXPECT_GT(r.comm_us, 0);
}

TEST(PlanBadInput, AWorldTheBatchSizesCannotDivideNamesTheKeys) {
  PlanOptions o = tiny(2, 3);
  o.ds_config["train_batch_size"] = 8;
  o.ds_config.erase("train_micro_batch_size_per_gpu");
  try {
    run_plan(o, hardware());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train_batch_size"), std::string::npos) << e.what();
  }
}

// Note [No optimizer]: DeepSpeed cannot train a config without an optimizer block at any stage,
// so plan refuses it before simulating, saying what to add.
TEST(PlanBadInput, AConfigWithoutAnOptimizerIsRefusedAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    PlanOptions o = tiny(stage, 2);
    o.ds_config.erase("optimizer");
    try {
      run_plan(o, hardware());
      FAIL() << "stage " << stage << ": no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("no \"optimizer\" block"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("\"optimizer\": {\"type\": \"AdamW\"}"), std::string::npos) << e.what();
    }
  }
}

TEST(PlanBadInput, AModelThatDoesNotFitSaysSoWithoutAllocating) {
  PlanOptions o = tiny(0, 8);
  o.model = transformer_preset("llama-2-70b");
  o.seq = 512;
  o.steps = 1;
  const PlanResult r = run_plan(o, hardware());  // 70B replicated: far beyond 80 GB, in meta mode
  EXPECT_FALSE(r.fits);
  const std::string why = fit_message(r);
  EXPECT_EQ(why.rfind("does not fit: rank ", 0), 0u) << why;
  EXPECT_NE(why.find("largest categories"), std::string::npos) << why;
}

TEST(PlanBadInput, UnknownHardwareNamesWhatIsKnown) {
  PlanOptions o = tiny(1, 2);
  o.gpu = "tpu-v5";
  try {
    run_plan(o, hardware());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("h100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_hardware("/nonexistent/hardware.json"), ConfigError);
}

TEST(PlanBadInput, RepresentativeRanksRefuseWhatTheyCannotModel) {
  sim::SimOptions opts;
  opts.simulated_ranks = {0, 3};
  EXPECT_THROW(sim::SimCluster(4, 1, opts).run([](sim::RankContext&) {}), UsageError)
      << "data without meta mode";
  opts.meta = true;
  EXPECT_THROW(sim::SimCluster(4, 1, opts).run([](sim::RankContext& ctx) { ctx.world.split(0, 0); }),
               RankFailure)
      << "split() depends on the ranks not simulated";
  opts.simulated_ranks = {3, 0};
  EXPECT_THROW(sim::SimCluster(4, 1, opts).run([](sim::RankContext&) {}), UsageError) << "not ascending";
}

TEST(PlanOutput, JsonAndHtmlCarryTheFigures) {
  const PlanResult r = run_plan(tiny(3, 2), hardware());
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j.at("schema"), "zerocheck-plan/1");
  EXPECT_EQ(j.at("memory").at("gpu").at("peak_bytes").get<std::int64_t>(), r.device.peak);
  EXPECT_EQ(j.at("config").at("stage"), 3);
  const std::string html = to_html({r}, "test");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("plan-memory"), std::string::npos);
  EXPECT_NE(html.find("plan-timeline"), std::string::npos);
  const nlohmann::json& tl = j.at("memory").at("gpu").at("timeline");
  ASSERT_FALSE(tl.empty());
  EXPECT_LE(tl.size(), kTimelineSamples);
  std::int64_t highest = 0;  // no sample exceeds the peak, and the samples reach into the steps
  for (const nlohmann::json& t : tl) {
    std::int64_t live = 0;
    for (const auto& [cat, bytes] : t.at("live").items()) live += bytes.get<std::int64_t>();
    highest = std::max(highest, live);
  }
  EXPECT_LE(highest, r.device.peak);
  EXPECT_GT(highest, 0);
  EXPECT_NE(to_text(r).find("collectives per step"), std::string::npos);
}

// One fit verdict: under a --fit budget below the GPU's capacity, every candidate's `fits` (what
// the table, fit.json and fit.html show) is its need against that budget, the search stops a
// setting at its first miss, and the message names the budget and the levers.
TEST(PlanFit, EveryCandidateIsJudgedAgainstTheBudgetOnce) {
  PlanOptions o = tiny(1, 2);
  o.model.seq = 128;  // activations above the step's model states, so the need grows with the micro-batch
  o.steps = 1;
  const PlanResult full = run_plan(o, hardware());
  const std::int64_t need1 = std::max(full.device.peak, full.device.construction_peak);
  PlanOptions o2 = o;
  o2.micro_batch = 2;
  const PlanResult two = run_plan(o2, hardware());
  const std::int64_t need2 = std::max(two.device.peak, two.device.construction_peak);
  ASSERT_GT(need2, need1);
  // Micro-batch 1 fits, 2 does not (a tiny model's need is mostly torch's fixed cuBLAS workspaces).
  const std::int64_t budget = need1 + (need2 - need1) / 2;
  std::vector<FitCandidate> tried;
  const std::vector<FitCandidate> fits = search_fits(o, hardware(), budget, &tried);
  ASSERT_FALSE(fits.empty());
  bool some_miss = false;
  for (const FitCandidate& c : tried) {
    const std::int64_t need = std::max(c.result.device.peak, c.result.device.construction_peak);
    EXPECT_EQ(c.result.memory_budget, budget);
    EXPECT_EQ(c.result.fits, need <= budget) << "ZeRO-" << c.stage << " mb " << c.micro_batch;
    EXPECT_EQ(to_json(c.result).at("memory").at("fits").get<bool>(), c.result.fits);
    if (!c.result.fits) {
      some_miss = true;
      const std::string why = fit_message(c.result);
      EXPECT_NE(why.find("the --fit budget"), std::string::npos) << why;
      EXPECT_NE(why.find("levers: "), std::string::npos) << why;
    }
  }
  EXPECT_TRUE(some_miss) << "the budget should stop some micro-batch";
  for (std::size_t i = 1; i < fits.size(); ++i) {
    EXPECT_GE(fits[i - 1].result.tokens_per_s, fits[i].result.tokens_per_s) << "fastest first";
  }
}

// ZeRO-3 with overlap_comm: DeepSpeed lets go of each reduce-scatter's buffers as it issues it
// (Note [Stream-ordered free]), so the comm buffers' peak is one bucket's, whatever the depth; an
// engine that counted them until the epilogue's wait would grow with every layer.
TEST(Plan, Zero3ReduceScatterBuffersAreFreeOnceIssued) {
  std::vector<std::int64_t> comm;
  for (const int layers : {2, 8}) {
    PlanOptions o = tiny(3, 4, {{"overlap_comm", true}, {"stage3_param_persistence_threshold", 0}});
    o.model.layers = layers;
    o.steps = 1;
    const PlanResult r = run_plan(o, hardware());
    comm.push_back(r.device.category_peaks[k(MemCategory::comm_buffers)]);
  }
  EXPECT_EQ(comm[0], comm[1]) << "2 layers against 8";
  EXPECT_GT(comm[0], 0);
}

// A budget that only gradient checkpointing meets (micro-batch 1 at every stage without it is
// over, with it under): the search finds those settings and says so.
TEST(PlanFit, GradientCheckpointingIsALeverTheSearchPulls) {
  PlanOptions o = tiny(3, 2);
  o.steps = 1;
  o.model.seq = 32;  // activations large beside the tiny model's states
  const PlanResult plain = run_plan(o, hardware());
  PlanOptions ck = o;
  ck.model.gradient_checkpointing = true;
  const PlanResult ckpt = run_plan(ck, hardware());
  const auto need = [](const PlanResult& r) { return std::max(r.device.peak, r.device.construction_peak); };
  ASSERT_LT(need(ckpt), need(plain));
  PlanOptions tight = o;
  tight.memory_budget = need(ckpt);
  const std::string why = fit_message(run_plan(tight, hardware()));
  EXPECT_NE(why.find("--gradient-checkpointing"), std::string::npos) << why;
  EXPECT_NE(to_text(ckpt).find("gradient checkpointing"), std::string::npos) << "the config line says so";
  EXPECT_TRUE(to_json(ckpt).at("model").at("gradient_checkpointing").get<bool>());
  // MFU counts the model's FLOPs: the checkpointed step executes the plain one's and the
  // recomputation's, no more.
  EXPECT_EQ(plain.recompute_flops_per_step, 0);
  EXPECT_GT(ckpt.recompute_flops_per_step, 0);
  EXPECT_EQ(ckpt.flops_per_step - ckpt.recompute_flops_per_step, plain.flops_per_step);
  std::vector<FitCandidate> tried;
  const std::vector<FitCandidate> fits = search_fits(o, hardware(), need(ckpt), &tried);
  ASSERT_FALSE(fits.empty());
  bool some_without = false;
  for (const FitCandidate& c : tried) some_without |= !c.gradient_checkpointing;
  EXPECT_TRUE(some_without) << "the search tries both";
  for (const FitCandidate& c : fits) {
    if (c.stage == 3 && c.offload == "none") {
      EXPECT_TRUE(c.gradient_checkpointing) << "ZeRO-3 micro-batch " << c.micro_batch << " fits only with it";
    }
  }
}

// --activation-checkpointing: the config's activation_checkpointing block reaches the model.
// cpu_checkpointing keeps each layer's input [B*S, d] in bf16 in host memory: the CPU side holds
// them all after the forward, the GPU side that much less than torch's checkpointing; a
// number_checkpoints below the layers is refused naming it.
TEST(Plan, DeepSpeedActivationCheckpointingFollowsTheConfigsBlock) {
  PlanOptions torch_ckpt = tiny(3, 2);
  torch_ckpt.steps = 1;
  torch_ckpt.model.gradient_checkpointing = true;
  PlanOptions ds = torch_ckpt;
  ds.model.checkpoint_function = CheckpointFunction::deepspeed;
  ds.ds_config["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  const PlanResult a = run_plan(torch_ckpt, hardware());
  const PlanResult b = run_plan(ds, hardware());
  const TransformerSpec& m = torch_ckpt.model;
  const std::int64_t inputs = m.layers * m.seq * m.dim * 2;  // micro-batch 1, bf16
  EXPECT_EQ(b.cpu.category_peaks[k(MemCategory::activations)], inputs);
  EXPECT_EQ(a.cpu.category_peaks[k(MemCategory::activations)], 0);
  EXPECT_LT(b.device.category_peaks[k(MemCategory::activations)], a.device.category_peaks[k(MemCategory::activations)]);
  EXPECT_NE(to_text(b).find("deepspeed.checkpointing, cpu_checkpointing"), std::string::npos);
  EXPECT_EQ(to_json(b).at("model").at("checkpoint_function"), "deepspeed.checkpointing");
  ds.ds_config["activation_checkpointing"] = {{"partition_activations", true},
                                              {"contiguous_memory_optimization", true},
                                              {"number_checkpoints", 1}};
  try {
    run_plan(ds, hardware());
    ADD_FAILURE() << "number_checkpoints 1 under 2 layers was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("number_checkpoints 1 is below the 2"), std::string::npos) << e.what();
  }
  ds.ds_config["activation_checkpointing"] = {{"contiguous_memory_optimization", true}, {"number_checkpoints", 2}};
  EXPECT_THROW(run_plan(ds, hardware()), ConfigError) << "contiguous without partition_activations";
  ds.ds_config["activation_checkpointing"] = {{"partition_activations", true}, {"contiguous_memory_optimization", true}};
  EXPECT_THROW(run_plan(ds, hardware()), ConfigError) << "contiguous without number_checkpoints";
  PlanOptions hf = torch_ckpt;  // the same block under Hugging Face's checkpointing: it does nothing
  hf.ds_config["activation_checkpointing"] = ds.ds_config["activation_checkpointing"];
  EXPECT_EQ(run_plan(hf, hardware()).device.peak, a.device.peak);
}

TEST(PlanFit, ABudgetAboveTheCapacityIsTheCapacity) {
  PlanOptions o = tiny(1, 2);
  o.steps = 1;
  o.memory_budget = std::int64_t{1} << 50;
  const PlanResult r = run_plan(o, hardware());
  EXPECT_EQ(r.memory_budget, r.device_capacity);
  EXPECT_EQ(to_json(r).at("memory").at("budget_bytes").get<std::int64_t>(), r.device_capacity);
  EXPECT_EQ(to_json(r).at("config").at("global_batch").get<std::int64_t>(), 2) << "micro-batch 1 x GA 1 x 2 ranks";
  const std::string html = to_html({r}, "t");
  EXPECT_NE(html.find("<p class=\"verdict fits\">fits: rank"), std::string::npos) << "plan.html opens with the verdict";
}

}  // namespace
}  // namespace zc::plan
