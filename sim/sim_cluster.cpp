// SimCluster: the public face of ClusterState; every run() starts a fresh state from the seed.
#include "sim/sim_cluster.h"

#include "sim/cluster_state.h"

namespace zc::sim {

SimCluster::SimCluster(int world_size, std::uint64_t seed, SimOptions options)
    : world_size_(world_size), seed_(seed), options_(std::move(options)) {
  check_faults(options_.faults, world_size_);  // Note [Injected faults]: refused before any run
}

SimResult SimCluster::run(const std::function<void(RankContext&)>& fn) const {
  ClusterState state(world_size_, seed_, options_);
  return state.run(fn);
}

}  // namespace zc::sim
