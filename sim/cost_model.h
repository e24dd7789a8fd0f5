// Simulated time: alpha-beta links with ring formulas whose bus-bandwidth factors equal
// nccl-tests' (2(n-1)/n all-reduce, (n-1)/n reduce-scatter and all-gather), and compute at a
// device model's FLOP and byte rates. Time is simulated only; no wall clock enters a result.
#pragma once

#include "engine/comm.h"

#include <cstdint>

namespace zc::sim {

// Two levels (zerocheck plan): ranks r and s share a node when r / gpus_per_node == s /
// gpus_per_node; a collective whose group lies in one node runs over the intra-node link
// (alpha_us, link_gb_per_s: NVLink), one that spans nodes is bound by the network link per rank
// (inter_alpha_us, inter_gb_per_s), as a ring through every node's NIC is. gpus_per_node 0: one
// node holds every rank.
struct CostModel {
  double alpha_us = 5.0;          // per ring step latency
  double link_gb_per_s = 100.0;   // per-rank link bandwidth (GB/s = 1e3 bytes/us)
  double device_tflops = 100.0;   // compute rate
  double device_gb_per_s = 2000.0;  // memory bandwidth
  int gpus_per_node = 0;
  double inter_alpha_us = 10.0;
  double inter_gb_per_s = 25.0;

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
  double collective_us(CollectiveKind k, std::int64_t bytes, int n, bool spans_nodes = false) const {
    const double alpha = spans_nodes ? inter_alpha_us : alpha_us;
    const double bw = spans_nodes ? inter_gb_per_s : link_gb_per_s;
    return alpha * ring_steps(k, n) + static_cast<double>(bytes) * bus_factor(k, n) / (bw * 1e3);
  }
  // Whether a group of these global ranks spans more than one node.
  bool spans_nodes(int first_rank, int last_rank) const {
    return gpus_per_node > 0 && first_rank / gpus_per_node != last_rank / gpus_per_node;
  }
  double compute_us(std::int64_t flops, std::int64_t bytes) const {
    const double t_flops = static_cast<double>(flops) / (device_tflops * 1e6);
    const double t_bytes = static_cast<double>(bytes) / (device_gb_per_s * 1e3);
    return t_flops > t_bytes ? t_flops : t_bytes;
  }
};

}  // namespace zc::sim
