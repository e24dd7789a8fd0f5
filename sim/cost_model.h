// Simulated time: collectives by NCCL's own tuning model where a node type is given
// (Note [NCCL tuning model] in sim/nccl_tuning.h: the algorithm and protocol NCCL would choose,
// and its time), else by alpha-beta links with ring formulas whose bus-bandwidth factors equal
// nccl-tests' (2(n-1)/n all-reduce, (n-1)/n reduce-scatter and all-gather); compute at a device
// model's FLOP and byte rates. Time is simulated only; no wall clock enters a result.
#pragma once

#include "engine/comm.h"
#include "sim/nccl_tuning.h"

#include <cstdint>
#include <memory>
#include <optional>

namespace zc::sim {

// A collective's time, and NCCL's choice where NCCL's model timed it.
struct CollectiveCost {
  double us = 0.0;
  std::optional<NcclChoice> nccl;
};

// Two levels (zerocheck plan): ranks r and s share a node when r / gpus_per_node == s /
// gpus_per_node. A ring over a group inside one node runs over the intra-node link (alpha_us,
// link_gb_per_s: NVLink). A ring over a group that spans k nodes (its ranks contiguous, as
// data-parallel groups are) crosses the network k times per lap: its bandwidth is the network
// link's per rank (inter_gb_per_s; every rank's NIC carries the ring's traffic), and of its ring
// steps the fraction k / n pays the network's latency (inter_alpha_us), the rest NVLink's. That
// ring is what a plan without `nccl` uses; with it, all_reduce, reduce_scatter, all_gather,
// reduce and broadcast take NCCL's choice among ring, tree, NVLS and PAT (all_to_all, which NCCL
// runs as send/recv pairs outside its tuning model, stays on the ring formula). gpus_per_node
// 0: one node.
struct CostModel {
  double alpha_us = 5.0;          // per ring step latency
  double link_gb_per_s = 100.0;   // per-rank link bandwidth (GB/s = 1e3 bytes/us)
  double device_tflops = 100.0;   // compute rate
  double device_gb_per_s = 2000.0;  // memory bandwidth
  int gpus_per_node = 0;
  double inter_alpha_us = 10.0;
  double inter_gb_per_s = 25.0;
  std::shared_ptr<const NcclNode> nccl;  // set: NCCL's tuning model for the collectives it tunes

  // nccl-tests' busBw / algBw factor.
  static double bus_factor(CollectiveKind k, int n) {
    if (n <= 1) return 0.0;
    const double f = static_cast<double>(n - 1) / n;
    switch (k) {
      case CollectiveKind::all_reduce: return 2.0 * f;
      case CollectiveKind::reduce_scatter:
      case CollectiveKind::all_gather:
      case CollectiveKind::all_to_all: return f;
      case CollectiveKind::reduce:
      case CollectiveKind::broadcast: return 1.0;
      default: return 0.0;
    }
  }
  // Ring steps of latency.
  static int ring_steps(CollectiveKind k, int n) {
    if (n <= 1) return 0;
    return k == CollectiveKind::all_reduce ? 2 * (n - 1) : n - 1;
  }
  // bytes is nccl-tests' "size" (the larger buffer).
  // `nodes`: how many nodes the group's ranks span (nodes_spanned).
  CollectiveCost cost(CollectiveKind k, std::int64_t bytes, int n, int nodes = 1) const;
  double collective_us(CollectiveKind k, std::int64_t bytes, int n, int nodes = 1) const {
    return cost(k, bytes, n, nodes).us;
  }
  double ring_us(CollectiveKind k, std::int64_t bytes, int n, int nodes = 1) const {
    const bool across = nodes > 1;
    const double crossing = across ? static_cast<double>(nodes) / n : 0.0;
    const double alpha = alpha_us * (1.0 - crossing) + inter_alpha_us * crossing;
    const double bw = across ? inter_gb_per_s : link_gb_per_s;
    return alpha * ring_steps(k, n) + static_cast<double>(bytes) * bus_factor(k, n) / (bw * 1e3);
  }
  // How many nodes a group from global rank first_rank to last_rank spans.
  int nodes_spanned(int first_rank, int last_rank) const {
    if (gpus_per_node <= 0) return 1;
    return last_rank / gpus_per_node - first_rank / gpus_per_node + 1;
  }
  double compute_us(std::int64_t flops, std::int64_t bytes) const {
    const double t_flops = static_cast<double>(flops) / (device_tflops * 1e6);
    const double t_bytes = static_cast<double>(bytes) / (device_gb_per_s * 1e3);
    return t_flops > t_bytes ? t_flops : t_bytes;
  }
};

}  // namespace zc::sim
