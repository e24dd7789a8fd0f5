// Note [NCCL tuning model] (nccl_tuning.h). Line references are to NCCL 2.30.7
// (github.com/NVIDIA/nccl at 5067397c): src/graph/tuning.cc unless said otherwise.
#include "sim/nccl_tuning.h"

#include "engine/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>

namespace zc::sim {
namespace {

constexpr int kHwNvlink = 0, kHwPci = 1, kHwNet = 2;
constexpr int kLL = 0, kLL128 = 1, kSimple = 2;
constexpr int kTree = 0, kRing = 1, kCollnetDirect = 2, kCollnetChain = 3, kNvls = 4, kNvlsTree = 5,
              kPat = 6;
constexpr int kBroadcast = 0, kReduce = 1, kAllGather = 2, kReduceScatter = 3, kAllReduce = 4;
constexpr int kMaxNvlsArity = 32;  // NCCL_MAX_NVLS_ARITY (src/include/device.h)
constexpr int kMaxChannels = 64;   // MAXCHANNELS

// ncclTunerConstantsDefaults (tuning.cc:146-215), [algorithm][protocol].
constexpr float kBaseLat[kNcclAlgos][kNcclProtos] = {
    {6.8f, 14.0f, 8.4f}, {6.6f, 14.0f, 8.4f}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0},
    {8.0f, 8.0f, 8.0f}};
constexpr float kHwLat[3][kNcclAlgos][kNcclProtos] = {
    {{0.6f, 1.25f, 4.0f}, {0.6f, 1.9f, 3.4f}, {0, 0, 3.7f}, {0, 0, 2.8f}, {0, 0, 25}, {0, 0, 25},
     {0, 0, 4.0f}},  // NVLink
    {{1.0f, 1.9f, 4.0f}, {1.0f, 2.5f, 5.7f}, {0, 0, 3.7f}, {0, 0, 2.8f}, {0, 0, 0}, {0, 0, 0},
     {0, 0, 4.0f}},  // PCI
    {{5.0f, 8.5f, 14}, {2.7f, 4.0f, 14.0f}, {0, 0, 31}, {0, 0, 30}, {0, 0, 18}, {0, 0, 20.9f},
     {0, 0, 14}}};  // network
// [compCapIndex or CPU index][nodes index: 1, 2, more].
constexpr float kLlMaxBw[4][3] = {
    {39.0f, 39.0f, 20.4f}, {87.7f, 22.5f, 19.0f}, {141.0f, 45.0f, 35.0f}, {2 * 141.0f, 2 * 45.0f, 2 * 35.0f}};
constexpr float kPerChMaxRingLL128Bw[4][3] = {
    {20.0f, 20.0f, 20.0f}, {20.0f, 20.0f, 20.0f}, {36.7f, 36.7f, 36.7f}, {40.0f, 40.0f, 40.0f}};
constexpr float kPerChMaxTreeLL128Bw[4][3] = {
    {20.0f, 20.0f, 20.0f}, {20.0f, 20.0f, 20.0f}, {36.7f, 36.7f, 29.0f}, {55.6f, 31.67f, 20.0f}};
constexpr float kPerChMaxTreeBw[4][3] = {
    {26.5f, 18.5f, 10.0f}, {24.0f, 23.6f, 17.8f}, {38.7f, 41.4f, 36.0f}, {70.0f, 42.8f, 24.0f}};
constexpr float kPerChMaxNvlsTreeBw[4][3] = {
    {26.5f, 18.5f, 10.0f}, {24.0f, 23.6f, 17.8f}, {0.0f, 57.7f, 45.5f}, {0.0f, 96.0f, 80.0f}};
constexpr float kNvlsEfficiency[4] = {0.0f, 0.0f, 0.85f, 0.74f};  // Volta, Ampere, Hopper, Blackwell
// treeCorrectionFactor (tuning.cc:620-626): powers of two from 64 B.
constexpr float kTreeCorrection[kNcclProtos][24] = {
    {1.0f, 1.0f, 1.0f, 1.0f, .9f, .8f, .7f, .7f, .7f, .7f, .6f, .5f, .4f, .4f, .5f, .6f, .7f, .8f,
     .9f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f},
    {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, .9f, .8f, .8f, .8f, .7f, .6f, .6f, .6f, .6f, .6f, .6f, .8f, .9f,
     .9f, .9f, .9f, 1.0f, 1.0f, 1.0f},
    {.9f, .9f, .9f, .9f, .9f, .9f, .9f, .8f, .7f, .6f, .6f, .5f, .5f, .5f, .5f, .6f, .7f, .8f, .7f,
     .7f, .8f, .9f, .9f, .9f}};

// log2Down (src/include/bitops.h): floor(log2 n), -1 for 0.
int log2i(std::int64_t n) {
  return n <= 0 ? -1 : 63 - std::countl_zero(static_cast<std::uint64_t>(n));
}
int comp_cap_index(int cc) { return cc >= 100 ? 3 : cc >= 90 ? 2 : cc >= 80 ? 1 : 0; }

const NcclGraph& graph_of(const NcclComm& c, int a) {
  // init.cc:980: {tree, ring, collnet direct, collnet chain, nvls, nvls (NVLS tree), tree (PAT)}.
  switch (a) {
    case kRing: return c.ring;
    case kNvls:
    case kNvlsTree: return c.nvls_graph;
    default: return c.tree;
  }
}

bool pat_enabled(const NcclComm& c) {  // ncclPatEnable, tuning.cc:217
  return c.comp_cap >= 60 && c.nodes == c.ranks && c.net_host;
}

// Whether the tuning loop computes (func, algo, proto) at all (tuning.cc:268-281).
bool tuned(const NcclComm& c, int coll, int a, int p) {
  if ((coll == kBroadcast || coll == kReduce) && a != kRing) return false;
  if ((coll == kReduceScatter || coll == kAllGather) && a != kPat && a != kRing && a != kNvls &&
      a != kCollnetDirect)
    return false;
  if (coll == kAllReduce && a == kPat) return false;
  if ((a == kNvls || a == kNvlsTree) && p != kSimple) return false;
  if ((coll == kReduceScatter || coll == kAllGather) && a == kPat && (p != kSimple || !pat_enabled(c)))
    return false;
  return true;
}

// busBw before the conversion to algorithm bandwidth (tuning.cc:282-354).
float bus_bandwidth(const NcclComm& c, int coll, int a, int p) {
  const int cci = comp_cap_index(c.comp_cap);
  const int index2 = c.nodes <= 2 ? c.nodes - 1 : 2;
  const int index1 = c.nodes == 1 ? cci : (c.amd_cpu ? 1 : 0);
  const float ll_max_bw = kLlMaxBw[index1][index2];
  const float ppn = static_cast<float>(c.ranks) / static_cast<float>(c.nodes);
  const NcclGraph& g = graph_of(c, a);
  float bw = c.nodes <= 2 ? g.bw_intra : g.bw_inter;  // CollNet is not modelled
  if (a == kNvlsTree || a == kNvls) {
    float intra_bw = g.bw_intra * kNvlsEfficiency[cci] * static_cast<float>(g.channels - 1) /
                     static_cast<float>(g.channels);
    if (coll == kAllReduce) intra_bw *= 2.0f;
    else intra_bw *= (ppn - 1) / ppn;
    const float inter_bw = g.bw_inter * ((c.nodes <= 2 && a == kNvlsTree) ? 2 : 1);
    bw = std::min({intra_bw, inter_bw,
                   a == kNvlsTree ? kPerChMaxNvlsTreeBw[cci][index2] : std::numeric_limits<float>::max()});
  }
  float bus = static_cast<float>(g.channels) * bw;
  const auto ch = static_cast<float>(g.channels);
  if (a == kRing && p == kLL) bus = std::min(ll_max_bw, static_cast<float>(bus * .5));
  if (a == kRing && p == kLL128)
    bus = std::min(static_cast<float>(bus * 0.92), ch * kPerChMaxRingLL128Bw[cci][index2]);
  if (a == kTree && coll == kAllReduce)
    bus = std::min(static_cast<float>(bus * .92), ch * kPerChMaxTreeBw[cci][index2]);
  if (a == kTree && p == kLL) bus = std::min(static_cast<float>(bus * 1.0 / 3.8), ll_max_bw);
  if (a == kTree && p == kLL128)
    bus = std::min(static_cast<float>(bus * (c.nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0)),
                   ch * kPerChMaxTreeLL128Bw[cci][index2]);
  if (a == kTree && c.tree_pattern_tree) bus *= .85f;
  if (a == kPat) bus *= .75f;
  // NVLS all_gather and reduce_scatter across nodes need CollNet (tuning.cc:331-354).
  if (a == kNvls && (coll == kAllGather || coll == kReduceScatter) && c.nodes > 1) bus = 0;
  return bus;
}

// comm->latencies (tuning.cc:365-418).
float latency_of(const NcclComm& c, int coll, int a, int p, int nsteps) {
  const float ppn = static_cast<float>(c.ranks) / static_cast<float>(c.nodes);
  const NcclGraph& g = graph_of(c, a);
  const int intra_hw = g.nvlink ? kHwNvlink : kHwPci;
  const int hw = c.nodes == 1 ? intra_hw : kHwNet;
  float lat = kBaseLat[a][p];
  float intra_lat = kHwLat[intra_hw][a][p];
  float inter_lat = ppn == 1 ? kHwLat[kHwNet][kTree][p] : kHwLat[kHwNet][a][p];
  inter_lat += g.latency_inter;
  if (p == kSimple) inter_lat += g.latency_inter;  // the flush
  const int local = c.ranks / c.nodes;
  const int lognodes = log2i(c.nodes);
  if (a == kRing) {
    float l = kHwLat[hw][a][p];
    if (coll == kReduce || coll == kBroadcast) {
      if (g.same_channels) {
        lat += l;
      } else {
        if (p == kSimple) l = kHwLat[hw][kTree][p];
        lat += static_cast<float>(nsteps) * l;
      }
    } else {
      float net_overhead = 0.0f;  // getNetOverhead: 1 us on Intel, 2 on AMD; x3 for Simple
      if (c.nodes > 1) {
        net_overhead = c.amd_cpu ? 2.0f : 1.0f;
        if (p == kSimple) net_overhead *= 3;
      }
      intra_lat = std::max(intra_lat, net_overhead);
      const int inter_steps = c.nodes == 1 ? 0 : coll == kAllReduce ? 2 * (c.nodes - 1) : c.nodes - 1;
      lat += static_cast<float>(nsteps - inter_steps) * intra_lat +
             static_cast<float>(inter_steps) * inter_lat;
    }
  } else if (a == kTree) {
    if (coll == kAllReduce)
      lat += 2 * (static_cast<float>(local - 1) * intra_lat + static_cast<float>(lognodes) * inter_lat);
  } else if (a == kNvls) {
    lat = intra_lat;
    if (c.nodes > 1) lat += inter_lat;
  } else if (a == kNvlsTree) {
    lat += intra_lat + 2 * static_cast<float>(lognodes) * inter_lat;
  } else if (a == kPat) {
    if (coll == kAllGather || coll == kReduceScatter)
      lat += static_cast<float>(lognodes) * (inter_lat / 3.5f) + static_cast<float>(c.ranks) * 2.8f;
  }
  return lat;
}

// Algorithms NCCL switches off for this communicator (tuning.cc:476-492, enqueue.cc:1998-2006).
bool algo_enabled(const NcclComm& c, int coll, int a) {
  if (a == kCollnetDirect || a == kCollnetChain) return false;  // CollNet not modelled: off
  if (a == kNvlsTree && c.nodes == 1) return false;
  if (a == kNvls && c.nodes > 1) return false;  // needs CollNet across nodes
  if ((a == kNvls || a == kNvlsTree) &&
      (!c.nvls || (coll != kAllReduce && c.ranks / c.nodes > kMaxNvlsArity)))
    return false;
  return true;
}

}  // namespace

std::string_view nccl_algo_name(NcclAlgo a) {
  static constexpr std::string_view kNames[kNcclAlgos] = {"Tree", "Ring", "CollNetDirect", "CollNetChain",
                                                          "NVLS", "NVLSTree", "PAT"};
  return kNames[static_cast<int>(a)];
}
std::string_view nccl_proto_name(NcclProto p) {
  static constexpr std::string_view kNames[kNcclProtos] = {"LL", "LL128", "Simple"};
  return kNames[static_cast<int>(p)];
}
std::string NcclChoice::str() const {
  return fmt::format("{}/{}", nccl_algo_name(algo), nccl_proto_name(proto));
}

float NcclTuning::bandwidth(NcclFunc f, NcclAlgo a, NcclProto p) const {
  return bw[static_cast<int>(f)][static_cast<int>(a)][static_cast<int>(p)];
}
float NcclTuning::latency(NcclFunc f, NcclAlgo a, NcclProto p) const {
  return lat[static_cast<int>(f)][static_cast<int>(a)][static_cast<int>(p)];
}

NcclTuning nccl_tune(const NcclComm& c) {
  ZC_ASSERT(c.ranks >= 1 && c.nodes >= 1 && c.nodes <= c.ranks,
            "an NCCL communicator of {} ranks over {} nodes", c.ranks, c.nodes);
  NcclTuning t;
  if (c.ranks <= 1) return t;
  for (int coll = 0; coll < kNcclFuncs; ++coll) {
    const int nsteps = coll == kAllReduce ? 2 * (c.ranks - 1)
                       : (coll == kReduceScatter || coll == kAllGather) ? c.ranks - 1
                                                                         : c.ranks;
    for (int a = 0; a < kNcclAlgos; ++a) {
      for (int p = 0; p < kNcclProtos; ++p) {
        if (!tuned(c, coll, a, p)) continue;
        // NVLS and the NVLS tree need two channels; else nothing is set (tuning.cc:286).
        if ((a == kNvls || a == kNvlsTree) && graph_of(c, a).channels < 2) continue;
        float bus = bus_bandwidth(c, coll, a, p);
        // Bus bandwidth to algorithm bandwidth (tuning.cc:357-362).
        if (!(a != kRing && (coll == kAllGather || coll == kReduceScatter))) {
          float ratio = 1.0f;
          if (a == kRing || a == kNvls || a == kNvlsTree)
            ratio *= static_cast<float>((1.0 * c.ranks) / nsteps);
          else ratio *= .5f;
          bus *= ratio;
        }
        // LL128 only where the paths allow it (tuning.cc:498-519); disabled algorithms get 0.
        if (p == kLL128 && (!c.ll128 || c.comp_cap < 70)) bus = 0;
        if (!algo_enabled(c, coll, a)) bus = 0;
        t.bw[coll][a][p] = bus;
        t.lat[coll][a][p] = latency_of(c, coll, a, p, nsteps);
      }
    }
  }
  return t;
}

float nccl_algo_time(const NcclComm& c, const NcclTuning& t, NcclFunc f, NcclAlgo algo, NcclProto proto,
                     std::int64_t bytes) {
  const int coll = static_cast<int>(f), a = static_cast<int>(algo), p = static_cast<int>(proto);
  float bw = t.bw[coll][a][p];
  float lat = t.lat[coll][a][p];
  if (bw == 0) return -1.0f;
  const int log_size = log2i(bytes >> 6);
  if (a == kTree && coll == kAllReduce && log_size >= 0 && log_size < 23)
    bw *= kTreeCorrection[p][log_size];
  if (a == kNvlsTree && coll == kAllReduce && log_size >= 0 && log_size < 24 && c.comp_cap >= 100)
    bw *= kTreeCorrection[p][log_size];  // x86 hosts assumed
  // The ring's plateau across nodes (tuning.cc:646-649); comm->nChannels after ncclTopoPostset.
  int comm_channels = std::min(kMaxChannels, 2 * std::min(c.ring.channels, c.tree.channels));
  if (c.comp_cap >= 90 && c.nodes > 1 && c.ring.bw_intra > 45.0f && comm_channels < 16) comm_channels *= 2;
  if (a == kRing && p == kSimple && c.nodes > 1 && coll == kAllReduce && comm_channels > 0 &&
      bytes / (static_cast<std::int64_t>(comm_channels) * c.ranks) >= 64)
    lat *= c.comp_cap < 80 ? 1.9f : 1.4f;
  return lat * 1 + static_cast<float>(bytes) / (1000 * bw);  // one operation per launch
}

NcclChoice nccl_choose(const NcclComm& c, const NcclTuning& t, NcclFunc f, std::int64_t bytes) {
  NcclChoice best;
  if (c.ranks <= 1) return best;  // NCCL: ring/simple, no time
  float min_time = std::numeric_limits<float>::max();
  bool found = false;
  for (int a = 0; a < kNcclAlgos; ++a) {
    for (int p = 0; p < kNcclProtos; ++p) {
      const float time = nccl_algo_time(c, t, f, static_cast<NcclAlgo>(a), static_cast<NcclProto>(p), bytes);
      if (time >= 0.0f && time < min_time) {
        min_time = time;
        best = {static_cast<NcclAlgo>(a), static_cast<NcclProto>(p), time};
        found = true;
      }
    }
  }
  ZC_ASSERT(found, "no NCCL algorithm for a collective of {} B over {} ranks on {} nodes", bytes,
            c.ranks, c.nodes);
  return best;
}

NcclComm NcclNode::comm(int ranks, int nodes) const {
  NcclComm c;
  c.ranks = ranks;
  c.nodes = nodes;
  c.comp_cap = comp_cap;
  c.amd_cpu = amd_cpu;
  c.nvls = nvls;
  c.ll128 = ll128;
  c.tree_pattern_tree = tree_pattern_tree;
  const bool one = nodes == 1;
  c.ring = one ? ring_one_node : ring_nodes;
  c.tree = one ? tree_one_node : tree_nodes;
  c.nvls_graph = one ? nvls_one_node : nvls_nodes;
  // init.cc:1466: rings and trees run on the same channel count.
  c.ring.channels = c.tree.channels = std::min(c.ring.channels, c.tree.channels);
  return c;
}

}  // namespace zc::sim
