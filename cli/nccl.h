// `zerocheck nccl`: NCCL's algorithm and protocol choice and its predicted time for a collective
// over a size sweep on a node type of plan/hardware.json (plan/nccl.h), and the published
// nccl-tests figures beside the model's (--published).
#pragma once

#include <string>
#include <vector>

namespace zc::cli {

struct NcclCliOptions {
  std::string gpu = "h100";
  int world_size = 8;
  int gpus_per_node = 0;
  std::string function = "all_reduce";
  std::vector<std::string> sizes;  // "8", "64K", "2G" (binary units, as nccl-tests' -b/-e)
  std::string hardware;
  bool published = false;
  bool json = false;
};

int run_nccl_cli(const NcclCliOptions& o);

}  // namespace zc::cli
