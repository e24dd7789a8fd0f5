// zerocheck's command line (CLI11): verify (the main job; under mpirun it spreads over the ranks),
// replay, prove, run, plan, demo, verify-real.
#include "cli/demo.h"
#include "cli/hf_options.h"
#include "cli/nccl.h"
#include "cli/plan.h"
#include "cli/prove.h"
#include "cli/run.h"
#include "cli/verify.h"
#include "cli/deepspeed_cli.h"
#include "cli/verify_real.h"
#include "engine/errors.h"

#include "zc_version.h"  // generated (cli/CMakeLists.txt)

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <sstream>

int main(int argc, char** argv) {
  CLI::App app{"zerocheck: a ZeRO engine, a deterministic simulated cluster and a verifier"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("zerocheck ") + ZC_VERSION +
#ifdef ZC_HAVE_CUDA
                                        "; GPU backend (CUDA, NCCL) built"
#else
                                        "; no GPU backend in this build"
#endif
                                        "; DeepSpeed reference: deepspeed 0.19.8, torch 2.10.0 "
                                        "(reference/deepspeed/requirements.txt)");

  zc::cli::DemoOptions demo;
  std::string order = "linear";
  CLI::App* demo_cmd = app.add_subcommand("demo", "Run the simulated cluster's demo");
  demo_cmd->add_option("--world-size", demo.world_size, "Ranks")->check(CLI::Range(1, 8192));
  demo_cmd->add_option("--seed", demo.seed, "Root seed");
  demo_cmd->add_option("--shard-numel", demo.shard_numel, "Elements per rank's shard")
      ->check(CLI::Range(1, 1 << 24));
  demo_cmd->add_option("--order", order, "Reduction order")
      ->check(CLI::IsMember({"linear", "ring", "gloo"}));

  zc::cli::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Train a model on the simulated cluster with a ds_config.json");
  run_cmd->add_option("--config", run.config_path, "DeepSpeed ds_config.json")->required()->check(CLI::ExistingFile);
  run_cmd->add_option("--model", run.model, "simple | mlp | synthetic")
      ->check(CLI::IsMember({"simple", "mlp", "synthetic"}));
  run_cmd->add_option("--world-size", run.world_size, "Simulated ranks")->check(CLI::Range(1, 8192));
  run_cmd->add_option("--steps", run.steps, "Optimizer steps")->check(CLI::Range(1, 100000));
  run_cmd->add_option("--hidden", run.hidden, "Hidden size")->check(CLI::Range(1, 1 << 14));
  run_cmd->add_option("--layers", run.layers, "Linear layers")->check(CLI::Range(1, 64));
  zc::cli::add_hf_options(run_cmd, run.hf, /*with_batch=*/true);
  run_cmd->add_option("--seed", run.seed, "Root seed");
  run_cmd->add_option("--domain", run.domain, "gaussian | exact")->check(CLI::IsMember({"gaussian", "exact"}));

  zc::cli::VerifyRealOptions vr;
  CLI::App* vr_cmd = app.add_subcommand("verify-real", "Run seeded scenarios on MPI processes or GPUs (under mpirun) and compare with the simulator bit for bit");
  vr_cmd->add_option("--backend", vr.backend, "host (MPI on CPUs) | cuda (one GPU per process, NCCL)")->check(CLI::IsMember({"host", "cuda"}));
  vr_cmd->add_option("--scenarios", vr.scenarios, "Number of seeded scenarios")->check(CLI::Range(1, 10000));
  vr_cmd->add_option("--seed", vr.seed, "Scenario seed");
  vr_cmd->add_option("--out", vr.out, "Report directory (rank 0 writes results.json and report.md)");
  vr_cmd->add_option("--timeout-s", vr.timeout_s, "Seconds a collective may take before the job ends")->check(CLI::Range(1, 86400));

  unsigned prove_timeout_s = 240;  // the f32 exact-domain lemma takes 30-50 s on 2 busy cores
  CLI::App* prove_cmd = app.add_subcommand("prove", "Run the Z3 proofs over the engine's decisions and arithmetic");
  prove_cmd->add_option("--timeout-s", prove_timeout_s, "Per-proof solver timeout")->check(CLI::Range(1, 3600));

  zc::cli::VerifyCliOptions verify;
  CLI::App* verify_cmd = app.add_subcommand("verify", "Check every invariant over generated scenarios, hunt every known bug, run the proofs; write the reports");
  verify_cmd->add_option("--profile", verify.profile, "quick | default | thorough")->check(CLI::IsMember({"quick", "default", "thorough"}));
  verify_cmd->add_option("--seed", verify.seed, "RapidCheck seed of every campaign");
  CLI::Option* verify_out = verify_cmd->add_option("--out", verify.out, "Report directory (report.md, report.html, results.json, junit.xml, counterexamples/, journal.jsonl)");
  verify_cmd->add_option("--jobs", verify.jobs, "Work items at once (0 = one per core)")->check(CLI::Range(0, 256));
  verify_cmd->add_option("--only", verify.only, "Only these invariants (and bug hunts through them)");
  verify_cmd->add_option("--bugs", verify.bugs, "Only hunt these known bugs (B1 ...) or DeepSpeed hazards (H1)");
  verify_cmd->add_flag("--no-proofs", verify.no_proofs, "Skip the Z3 proofs");
  verify_cmd->add_option("--against", verify.against, "deepspeed: also compare generated scenarios with DeepSpeed 0.19.8 "
                         "(CPU, gloo; the environment scripts/ds-env.sh makes); --only deepspeed runs that alone. "
                         "deepspeed==X.Y.Z (a release, 0.14.0 on) or deepspeed@DIR (a source tree): the seeds' invariants "
                         "on that DeepSpeed alone (made on first use by scripts/ds-release.sh); with --only deepspeed, "
                         "the comparison with it instead");
  verify_cmd->add_option("--seed-cases", verify.seed_cases, "--against a release or tree: cases per randomized seed invariant")
      ->check(CLI::Range(1, 100000));
  verify_cmd->add_option("--deepspeed-cases", verify.deepspeed_cases, "Scenarios the DeepSpeed comparison draws")
      ->check(CLI::Range(1, 1000000));
  verify_cmd->add_option("--deepspeed-i3", verify.deepspeed_i3, "I3 on DeepSpeed (about 2 min of inductor compiles): all "
                         "(autosp and autotp at stages 0-3), off (the report says it did not run), or a list of "
                         "pass:stage (autosp:0,autotp:0)")
      ->check([](const std::string& v) -> std::string {
        if (v == "all" || v == "off") return "";
        if (v.empty() || v.back() == ',') return "an empty entry: give pass:stage items separated by commas";
        std::istringstream list(v);
        for (std::string item; std::getline(list, item, ',');) {
          const auto colon = item.find(':');
          const std::string pass = item.substr(0, colon), stage = colon == std::string::npos ? "" : item.substr(colon + 1);
          if ((pass != "autosp" && pass != "autotp") || stage.size() != 1 || stage[0] < '0' || stage[0] > '3') {
            return "'" + item + "' is not pass:stage with pass autosp or autotp and stage 0-3";
          }
        }
        return "";
      });
  verify_cmd->add_option("--resume", verify.resume, "Finish an interrupted run in this report directory: rerun only "
                         "the work items its journal.jsonl lacks (same options as that run)")->check(CLI::ExistingDirectory);
  verify_cmd->add_option("--item-timeout-s", verify.item_timeout_s, "A work item still running after this many seconds "
                         "is killed and reported as failed")->check(CLI::Range(1.0, 1e7));
  verify_cmd->add_option("--config", verify.config, "Check the invariants around this ds_config.json: its stage, dtypes, "
                         "buckets, offload, clipping and optimizer pinned; worlds, backwards, boundaries, models and "
                         "data drawn. Invariants only (no bug hunt or proof unless --bugs)")->check(CLI::ExistingFile);
  zc::cli::add_hf_options(verify_cmd, verify.hf, /*with_batch=*/false);
  verify_cmd->add_option("--budget", verify.budget, "Soak: draw fresh seeds for this long (90s, 10m, 8h), rerun every "
                         "10th case for determinism; writes soak.json (default --out reports/soak)");

  zc::cli::PlanCliOptions plan;
  CLI::App* plan_cmd = app.add_subcommand("plan", "Per-rank memory by category, collectives and step time for a model at N ranks, from the engine in meta mode");
  plan_cmd->add_option("--config", plan.config_path, "DeepSpeed ds_config.json")->required()->check(CLI::ExistingFile);
  plan_cmd->add_option("--model", plan.model, "gpt2-xl | llama-2-7b | llama-2-13b | llama-2-70b | mixtral-8x7b (or a tiny test shape)");
  plan_cmd->add_option("--model-json", plan.model_json, "A custom transformer shape (format: docs/plan.md)")->check(CLI::ExistingFile);
  plan_cmd->add_option("--world-size", plan.world_size, "Data-parallel ranks")->check(CLI::Range(1, 1 << 20));
  plan_cmd->add_option("--gpus-per-node", plan.gpus_per_node, "GPUs per node (default: the GPU's node)")->check(CLI::Range(1, 1024));
  plan_cmd->add_option("--gpu", plan.gpu, "a100 | a100-40gb | h100 | h200 | v100 | l40s (plan/hardware.json)");
  plan_cmd->add_option("--network", plan.network, "ib-hdr | ib-ndr | ib-edr | roce-100g (default: the GPU's node)");
  plan_cmd->add_option("--micro-batch,--per-device-train-batch-size,--per_device_train_batch_size", plan.micro_batch, "Override train_micro_batch_size_per_gpu")->check(CLI::Range(1, 1 << 16));
  zc::cli::add_hf_options(plan_cmd, plan.hf, /*with_batch=*/false);
  plan_cmd->add_option("--seq", plan.seq, "Sequence length (default: the model's)")->check(CLI::Range(1, 1 << 20));
  plan_cmd->add_option("--steps", plan.steps, "Training steps simulated (the last one is timed)")->check(CLI::Range(1, 4));
  plan_cmd->add_option("--attention", plan.attention, "materialised (eager) | fused (FlashAttention-style memory)")
      ->check(CLI::IsMember({"materialised", "fused"}));
  CLI::Option* plan_gc = plan_cmd->add_flag(
      "--gradient-checkpointing,--gradient_checkpointing", plan.gradient_checkpointing,
      "Hugging Face's gradient checkpointing (the Trainer's --gradient_checkpointing): every layer keeps only its "
      "input and recomputes its forward in the backward");
  plan_cmd->add_flag("--activation-checkpointing", plan.activation_checkpointing,
                     "Every layer under deepspeed.checkpointing.checkpoint (Megatron-style), configured by the "
                     "config's activation_checkpointing block (partition_activations, cpu_checkpointing, "
                     "contiguous_memory_optimization)")
      ->excludes(plan_gc);
  CLI::Option* plan_fit = plan_cmd->add_option("--fit", plan.fit_gib, "Search the stage, offload and micro-batch "
                                               "settings that fit, fastest first; optional budget in GiB per GPU "
                                               "(default: the GPU's capacity)")->expected(0, 1);
  plan_cmd->add_option("--out", plan.out, "Write plan.json and plan.html (fit.json, fit.html with --fit) here");
  plan_cmd->add_option("--hardware", plan.hardware, "Device, network and host figures (default: plan/hardware.json)");
  plan_cmd->add_flag("--json", plan.json, "Print JSON instead of the table");
  plan_cmd->add_flag("--no-deepspeed", plan.no_deepspeed, "Do not run DeepSpeed's estimators beside the plan");
  plan_cmd->add_option("--ranks", plan.ranks, "auto (all up to 4096, else representative) | all | representative")
      ->check(CLI::IsMember({"auto", "all", "representative"}));
  plan_cmd->add_option("--schedule", plan.schedule,
                       "auto (decoupled, interleaved for MoE) | decoupled | interleaved (Note [Decoupled schedule])")
      ->check(CLI::IsMember({"auto", "decoupled", "interleaved"}));
  plan_cmd->add_option("--collectives", plan.collectives,
                       "auto (NCCL's own tuning model where the GPU's node has NCCL graphs in hardware.json, else the "
                       "ring formula) | ring (the ring formula everywhere)")
      ->check(CLI::IsMember({"auto", "ring"}));

  zc::cli::NcclCliOptions nccl;
  CLI::App* nccl_cmd = app.add_subcommand("nccl", "NCCL's algorithm, protocol and time for a collective by size on a node type, from NCCL's own tuning model; --published sets it beside measured nccl-tests figures");
  nccl_cmd->add_option("--gpu", nccl.gpu, "A GPU of plan/hardware.json whose node has NCCL graphs (h100, h200, a100, a100-40gb)");
  nccl_cmd->add_option("--world-size", nccl.world_size, "Ranks in the communicator")->check(CLI::Range(2, 1 << 20));
  nccl_cmd->add_option("--gpus-per-node", nccl.gpus_per_node, "GPUs per node (default: the GPU's node)")->check(CLI::Range(1, 1024));
  nccl_cmd->add_option("--function", nccl.function, "broadcast | reduce | all_gather | reduce_scatter | all_reduce");
  nccl_cmd->add_option("--bytes", nccl.sizes, "Message sizes (nccl-tests' size: 8, 64K, 2M, 8G; default 8 B to 8 GiB by 8x)");
  nccl_cmd->add_option("--hardware", nccl.hardware, "Device, network and NCCL graph figures (default: plan/hardware.json)");
  nccl_cmd->add_flag("--published", nccl.published, "Published nccl-tests figures beside the model's (plan/nccl_published.json)");
  nccl_cmd->add_flag("--json", nccl.json, "Print JSON instead of the table");

  zc::cli::BisectOptions bisect;
  CLI::App* bisect_cmd = app.add_subcommand("bisect", "Find the last DeepSpeed release where a seed invariant fails and the first where it holds, by running them");
  bisect_cmd->add_option("--against", bisect.against, "deepspeed (the released DeepSpeeds on the package index)")->required();
  bisect_cmd->add_option("--invariant", bisect.invariant, "MB, I1, I2, I3 or I4 (or its full name)")->required();
  bisect_cmd->add_option("--releases", bisect.releases, "A..B, either side may be empty (default 0.14.0..the newest)");
  bisect_cmd->add_flag("--all", bisect.all, "Run every release in the range (the matrix) and report every boundary");
  bisect_cmd->add_flag("--json", bisect.json, "Print the answer as JSON (invariant, last_bad, first_good, verdicts, ...)");
  bisect_cmd->add_option("--cases", bisect.cases, "Cases per release for a randomized invariant")->check(CLI::Range(1, 1000));
  bisect_cmd->add_option("--seed", bisect.seed, "RapidCheck seed");
  bisect_cmd->add_option("--out", bisect.out, "Where bisect.json and the counterexamples go");
  zc::cli::ReplayOptions replay;
  CLI::App* replay_cmd = app.add_subcommand("replay", "Rerun a saved counterexample exactly: verdict, trace hash, first divergence");
  replay_cmd->add_option("file", replay.file, "A counterexample file (reports/out/counterexamples/*.json)")->required()->check(CLI::ExistingFile);
  replay_cmd->add_option("--trace", replay.trace, "Write a Chrome/Perfetto timeline of the run here");
  replay_cmd->add_flag("--rapidcheck", replay.rapidcheck, "Also regenerate the case from RapidCheck's reproduce string");
  replay_cmd->add_option("--against", replay.against, "deepspeed | deepspeed==X.Y.Z | deepspeed@DIR: also run the "
                         "scenario on that DeepSpeed (the invariant on DeepSpeed alone where it has a statement there, "
                         "and DeepSpeed's values against the engine's); exit status: DeepSpeed's verdict");

  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) {
      demo.order = order;
      return zc::cli::run_demo(demo);
    }
    if (run_cmd->parsed()) return zc::cli::run_training(run);
    if (plan_cmd->parsed()) {
      plan.fit = plan_fit->count() > 0;
      return zc::cli::run_plan_cli(plan);
    }
    if (vr_cmd->parsed()) return zc::cli::run_verify_real(argc, argv, vr);
    if (prove_cmd->parsed()) return zc::cli::run_prove(prove_timeout_s * 1000);
    if (verify_cmd->parsed()) {
      verify.out_given = verify_out->count() > 0;
      return zc::cli::run_verify_cli(verify);
    }
    if (replay_cmd->parsed()) return zc::cli::run_replay(replay);
    if (bisect_cmd->parsed()) return zc::cli::run_bisect(bisect);
    if (nccl_cmd->parsed()) return zc::cli::run_nccl_cli(nccl);
  } catch (const zc::ZcError& e) {
    fmt::print(stderr, "zerocheck: {}\n", e.what());
    return 2;
  }
  return 0;
}
