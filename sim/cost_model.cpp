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
  // NCCL tunes once per communicator; a plan's collectives come in runs on one group, so each
  // thread keeps the last communicator's tuning (a pure function of its key: no effect on results).
  struct Last {
    std::optional<NcclNode> node;  // by value: another plan's node may reuse an address
    int n = 0, nodes = 0;
    NcclComm comm;
    NcclTuning tuning;
  };
  thread_local Last last;
  const int spanned = std::min(nodes, n);
  if (!last.node || !(*last.node == *nccl) || last.n != n || last.nodes != spanned) {
    last.comm = nccl->comm(n, spanned);
    last.tuning = nccl_tune(last.comm);
    last.node = *nccl;
    last.n = n;
    last.nodes = spanned;
  }
  const NcclChoice choice = nccl_choose(last.comm, last.tuning, *f, bytes);
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
