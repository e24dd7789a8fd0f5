// NCCL's own choice of algorithm and protocol for a collective, and the time its tuning model
// gives it: src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime) and src/enqueue.cc
// (updateCollCostTable, topoGetAlgoInfo) of NCCL 2.30.7, modelled here, not copied.
//
// Note [NCCL tuning model]
// NCCL builds, once per communicator, a latency (us) and a bandwidth (GB/s) for every
// (function, algorithm, protocol) from its topology search's graphs (per channel bandwidths
// inside and between nodes, channel counts) and fixed constants; each collective then takes
// the pair with the least  latency + bytes / (1000 x bandwidth), bytes being the larger
// buffer (the gathered one for all_gather and reduce_scatter). The inputs NCCL measures at run
// time (the search's outcome) are NcclGraph, given per node type in plan/hardware.json with
// their sources; everything after the search is computed here as NCCL computes it, in float as
// NCCL does, so that a tuning table NCCL printed (NCCL_DEBUG_SUBSYS=TUNING) can be compared
// entry by entry (tests/nccl_tuning_test.cpp).
//
// Not modelled: CollNet (SHARP) algorithms, which need a network plugin and are off by default;
// a tuner plugin; NCCL_ALGO/NCCL_PROTO overrides; the fp8 relegation; aggregation of several
// operations in one launch (numPipeOps is 1: DeepSpeed issues its collectives one by one).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace zc::sim {

// NCCL's indices and order (src/include/device.h, nccl_common.h).
enum class NcclFunc : std::uint8_t { broadcast, reduce, all_gather, reduce_scatter, all_reduce };
enum class NcclAlgo : std::uint8_t { tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat };
enum class NcclProto : std::uint8_t { ll, ll128, simple };
inline constexpr int kNcclFuncs = 5, kNcclAlgos = 7, kNcclProtos = 3;
std::string_view nccl_algo_name(NcclAlgo a);    // "Ring", "Tree", "NVLS", "PAT", ... as NCCL prints
std::string_view nccl_proto_name(NcclProto p);  // "LL", "LL128", "Simple"

// One graph of NCCL's topology search (struct ncclTopoGraph), what the tuning reads of it.
struct NcclGraph {
  int channels = 0;           // nChannels after ncclTopoDupChannels
  float bw_intra = 0;         // GB/s per channel inside a node
  float bw_inter = 0;         // GB/s per channel between nodes
  float latency_inter = 0;    // us, the NIC's (net.latency; 0 for InfiniBand verbs)
  bool nvlink = true;         // typeIntra == LINK_NVL: intra-node latencies are NVLink's, else PCI's
  bool same_channels = true;  // sameChannels (broadcast and reduce latency)
  bool operator==(const NcclGraph&) const = default;
};

// What one communicator's tuning depends on.
struct NcclComm {
  int ranks = 1, nodes = 1;
  int comp_cap = 90;            // minCompCap = maxCompCap, x10 (Hopper 90)
  bool amd_cpu = false;         // the CPU vendor: llMaxBw between nodes, the network post overhead
  bool nvls = false;            // NVLink SHARP available (NVSwitch, Hopper or later)
  bool ll128 = true;            // LL128 enabled: the paths allow it (see NcclNode::ll128)
  bool tree_pattern_tree = false;  // maxTreePattern == NCCL_TOPO_PATTERN_TREE (split trees)
  bool net_host = true;         // the network device is the host (PAT needs it)
  NcclGraph ring, tree, nvls_graph;
};

// comm->bandwidths and comm->latencies: 0 bandwidth = not available.
struct NcclTuning {
  std::array<std::array<std::array<float, kNcclProtos>, kNcclAlgos>, kNcclFuncs> bw{};
  std::array<std::array<std::array<float, kNcclProtos>, kNcclAlgos>, kNcclFuncs> lat{};
  float bandwidth(NcclFunc f, NcclAlgo a, NcclProto p) const;
  float latency(NcclFunc f, NcclAlgo a, NcclProto p) const;
};
NcclTuning nccl_tune(const NcclComm& comm);

struct NcclChoice {
  NcclAlgo algo = NcclAlgo::ring;
  NcclProto proto = NcclProto::simple;
  float time_us = 0;  // NCCL's estimate
  std::string str() const;  // "Ring/LL128"
};
// The least-time pair for `bytes` (ncclFuncMaxSendRecvCount x element size). ranks == 1: free.
NcclChoice nccl_choose(const NcclComm& comm, const NcclTuning& t, NcclFunc f, std::int64_t bytes);
// ncclTopoGetAlgoTime: -1 where the pair is not available.
float nccl_algo_time(const NcclComm& comm, const NcclTuning& t, NcclFunc f, NcclAlgo a, NcclProto p,
                     std::int64_t bytes);

// A node type as plan/hardware.json gives it: the search's graphs on one node and across nodes.
struct NcclNode {
  int comp_cap = 90;
  bool amd_cpu = false, nvls = false, ll128 = true, tree_pattern_tree = false;
  NcclGraph ring_one_node, tree_one_node, nvls_one_node;
  NcclGraph ring_nodes, tree_nodes, nvls_nodes;
  // The communicator of `ranks` ranks over `nodes` nodes (ranks per node: NCCL's ranks / nodes).
  NcclComm comm(int ranks, int nodes) const;
  bool operator==(const NcclNode&) const = default;
};

}  // namespace zc::sim
