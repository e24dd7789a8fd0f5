// `zerocheck nccl`: what NCCL's tuning model (Note [NCCL tuning model] in sim/nccl_tuning.h)
// chooses and predicts for one collective over a size sweep on a node type of hardware.json, its
// latency/bandwidth table as NCCL prints it (NCCL_DEBUG_SUBSYS=TUNING), and the published
// nccl-tests figures (plan/nccl_published.json) beside the model's.
#pragma once

#include "plan/plan.h"
#include "sim/nccl_tuning.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace zc::plan {

std::optional<sim::NcclFunc> nccl_function(const std::string& name);  // "all_reduce", ...
// nccl-tests' busbw / algbw: 2(n-1)/n all_reduce, (n-1)/n all_gather and reduce_scatter, else 1.
double nccl_bus_factor(sim::NcclFunc f, int ranks);

struct NcclSweepRow {
  std::int64_t bytes = 0;
  sim::NcclChoice choice;
  double algbw_gb_per_s = 0, busbw_gb_per_s = 0;  // bytes / time, and x the bus factor
};
struct NcclSweep {
  std::string node_name, function;
  int ranks = 0, nodes = 0;
  sim::NcclComm comm;
  sim::NcclTuning tuning;
  std::vector<NcclSweepRow> rows;
};
// The node type of `gpu` (its nccl_nodes entry; a ConfigError naming the GPU if it has none), at
// `ranks` ranks, gpus_per_node to a node (0: the GPU's node).
NcclSweep nccl_sweep(const Hardware& hw, const std::string& gpu, int ranks, int gpus_per_node,
                     sim::NcclFunc f, const std::vector<std::int64_t>& sizes);
std::string to_text(const NcclSweep& s);  // the sweep and NCCL's table for the function
nlohmann::json to_json(const NcclSweep& s);

struct NcclPublished {
  std::string system, gpu, function, algorithm, source;
  int ranks = 0;
  std::int64_t bytes = 0;
  std::optional<double> time_us;
  double busbw_gb_per_s = 0;
  // The model's, for the same system, function, size (and algorithm where the row forces one).
  sim::NcclChoice model;
  double model_busbw_gb_per_s = 0;
};
// Reads the published rows (a ConfigError naming the file and row on bad input) and predicts each.
std::vector<NcclPublished> nccl_published(const Hardware& hw, const std::string& path);
std::string default_nccl_published_path();
std::string to_text(const std::vector<NcclPublished>& rows);

}  // namespace zc::plan
