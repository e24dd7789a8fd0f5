#include "sim/cost_model.h"

#include "sim/sim_cluster.h"

namespace zc::sim {
namespace {

std::optional<NcclFunc> nccl_func(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_reduce: return NcclFunc::all_reduce;
    case CollectiveKind::reduce_scatter: return NcclFunc::reduce_scatter;
    case CollectiveKind::all_gather: return NcclFunc::all_gather;
    case CollectiveKind::reduce: return NcclFunc::reduce;
    case CollectiveKind::broadcast: return NcclFunc::broadcast;
    default: return std::nullopt;  // all_to_all: send/recv pairs; barrier and split: no data
  }
}

}  // namespace

CollectiveCost CostModel::cost(CollectiveKind k, std::int64_t bytes, int n, int nodes) const {
  const std::optional<NcclFunc> f = nccl_func(k);
  if (nccl == nullptr || !f || n <= 1) return {ring_us(k, bytes, n, nodes), std::nullopt};
  // One tuning per call: about a hundred table entries, cheaper than caching across threads.
  const NcclComm comm = nccl->comm(n, std::min(nodes, n));
  const NcclChoice choice = nccl_choose(comm, nccl_tune(comm), *f, bytes);
  return {static_cast<double>(choice.time_us), choice};
}

void count_nccl(std::vector<NcclCalls>& calls, CollectiveKind kind, const NcclChoice& choice,
                std::int64_t bytes, double us) {
  for (NcclCalls& c : calls) {
    if (c.kind == kind && c.algo == choice.algo && c.proto == choice.proto) {
      ++c.calls;
      c.bytes += bytes;
      c.us += us;
      return;
    }
  }
  calls.push_back({kind, choice.algo, choice.proto, 1, bytes, us});
}

}  // namespace zc::sim
