// `zerocheck demo`: a short tour of the simulated cluster (see demo.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace zc::cli {

struct DemoOptions {
  int world_size = 8;
  std::uint64_t seed = 1;
  std::int64_t shard_numel = 1024;
  std::string order = "linear";  // linear | ring | gloo (sim/reduction.h)
};

int run_demo(const DemoOptions& opts);

}  // namespace zc::cli
