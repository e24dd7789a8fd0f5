// A training run of a transformer preset (models/transformer.h) for the memory checks: two
// gaussian-domain AdamW steps at micro-batch 2, small buckets and persistence threshold so that
// every ZeRO path (ipg buckets, gathers, persistent params) allocates. Used by transformer_test
// (meta against the host allocator), mpi_test (against the emulated GPU's) and gpu_test (against
// CudaDevice's).
#pragma once

#include "models/transformer.h"
#include "props/scenarios.h"
#include "props/training_run.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace zc {

inline props::RunSpec transformer_run(const std::string& preset, int stage, int world, bool offload,
                                      const std::string& dtype, bool gradient_checkpointing = false) {
  props::RunSpec spec;
  spec.world = world;
  spec.steps = 2;
  spec.micro_batch = 2;
  spec.domain = DataDomain::gaussian;
  nlohmann::json cfg = {{"gradient_accumulation_steps", 1},
                        {"zero_optimization",
                         {{"stage", stage}, {"reduce_bucket_size", 500},
                          {"stage3_param_persistence_threshold", 20}}},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  if (dtype == "bf16") cfg["bf16"] = {{"enabled", true}};
  if (offload) cfg["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  spec.ds_config = cfg;
  spec.make_model = [preset, gradient_checkpointing] {
    TransformerSpec t = transformer_preset(preset);
    t.gradient_checkpointing = gradient_checkpointing;
    return std::make_unique<Transformer>(t);
  };
  return spec;
}

// The transformer runs a real backend's memory is checked on against meta mode (zerocheck plan's
// figures): gpt2-tiny and llama-gqa-tiny at stages 0-3, bf16, one with optimizer offload and one
// with gradient checkpointing (its recomputation refetches ZeRO-3's params in the backward).
inline std::vector<props::NamedSpec> transformer_memory_runs(int world) {
  std::vector<props::NamedSpec> runs;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* preset : {"gpt2-tiny", "llama-gqa-tiny"}) {
      runs.push_back({fmt::format("{} stage {} bf16", preset, stage), transformer_run(preset, stage, world, false, "bf16")});
    }
  }
  runs.push_back({"llama-gqa-tiny stage 2 bf16 offload true", transformer_run("llama-gqa-tiny", 2, world, true, "bf16")});
  runs.push_back({"gpt2-tiny stage 3 bf16 gradient checkpointing",
                  transformer_run("gpt2-tiny", 3, world, false, "bf16", true)});
  return runs;
}

}  // namespace zc
