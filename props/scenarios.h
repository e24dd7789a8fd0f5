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

}  // namespace zc::props
