// Meta against host memory (issue: zerocheck plan): the same run on the simulator twice, once on
// host devices and once in meta mode (Note [Meta mode] in engine/model.h). Every rank's
// high-water marks must agree category by category, byte for byte, on the accelerator and on the
// CPU side of offload, for construction and for the steps; the host figures are the allocator's
// own accounting (AllocatorStats, kept around calloc/free), not the ledger the meta figures come
// from, so the check compares two measures of two runs.
#pragma once

#include "props/training_run.h"

#include <string>

namespace zc::props {

struct MemoryComparison {
  bool applies = true;   // false: the host run left meta mode's path (a skipped step), or failed
  std::string why_not;   // when !applies
  std::string difference;  // "" when every figure agrees
  std::uint64_t trace_hash = 0;  // of both runs
  // Rank 0's accelerator figures (meta), for reports.
  std::int64_t peak_bytes = 0;
};

// Runs `host` (spec.sim.meta must be false) and the same spec in meta mode, and compares.
MemoryComparison compare_meta_with_host(const RunSpec& host);

// The same comparison for one rank of a real backend (CudaDevice + NcclComm on a GPU, or the CPU
// rehearsal of it): trains `spec` on `dev` with `cpu` as the CPU side of offload over `world`,
// then runs the spec in meta mode on the simulator, and compares this rank's accelerator and CPU
// figures with what `dev`'s and `cpu`'s allocators counted. Collective over `world`. A device
// without allocator stats is a difference, named.
MemoryComparison compare_meta_with_backend(const RunSpec& spec, Device& dev, Device& cpu, Comm& world);

// "" when `meta` (a ledger) and `host` (the allocator's stats) have the same peak per category,
// the same total peak and the same composition at it; else the first difference, named.
std::string memory_difference(const MemoryLedger& meta, const AllocatorStats& host,
                              const std::string& where);

}  // namespace zc::props
