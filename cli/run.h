// `zerocheck run`: trains a model on the simulated cluster with a user's ds_config.json and prints
// progress per step (loss, loss scale, collectives).
#pragma once

#include "cli/hf_options.h"

#include <cstdint>
#include <string>

namespace zc::cli {

struct RunOptions {
  std::string config_path;
  std::string model = "simple";  // simple | mlp | synthetic
  int world_size = 8;
  int steps = 20;
  std::int64_t hidden = 16;
  int layers = 2;
  HfCliArgs hf;  // fill the config's "auto" values (--per-device-train-batch-size is --micro-batch)
  std::uint64_t seed = 1;
  std::string domain = "gaussian";
};

int run_training(const RunOptions& opts);

}  // namespace zc::cli
