// Seeded scenario lists for backends that cannot run the property campaign itself (MPI
// processes, GPUs): each is a RunSpec in the exact domain with a one-line description, drawn from
// the configuration space (stage, contiguous, overlap, dtype, offload, bucket, GA, N, coalesce,
// model) the same way on every rank.
#pragma once

#include "props/training_run.h"

#include <string>
#include <vector>

namespace zc::props {

struct NamedSpec {
  std::string description;
  RunSpec spec;
};

std::vector<NamedSpec> real_backend_scenarios(int world, std::uint64_t seed, int count);

// One scenario on a real backend, from this rank's point of view.
struct BackendOutcome {
  std::string description;
  std::string sim_mismatch;  // "" when params, grads and master weights equal the simulator's bit for bit
  bool ranks_agree = true;   // every rank holds the same params and grads (hash min == max)
  double seconds = 0;
};

// Trains the scenario on this rank with `dev` and `engine_comm` (HostDevice + MpiComm, or
// CudaDevice + NcclComm), replays it on the simulator and compares every step's params, grads and
// (rank 0) master weights bit for bit; then agrees across ranks over `host_world`, a Comm on host
// memory (nullptr for a single process without MPI: nothing to agree with). Collective over both
// communicators.
BackendOutcome check_on_backend(const NamedSpec& ns, Device& dev, Comm& engine_comm, Comm* host_world);

}  // namespace zc::props
