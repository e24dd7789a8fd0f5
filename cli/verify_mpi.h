// `mpirun -np K zerocheck verify`: the verify job's work items spread over K ranks (Note [Verify
// over MPI]). Every rank builds the same VerifyJob from the same options; rank 0 hands out item
// indices on request, runs items itself too, journals every result and merges the report. Each
// rank runs its items in forked children (--jobs per rank), as one process does.
#pragma once

#include "props/soak.h"
#include "props/verify.h"

#include <functional>
#include <optional>

namespace zc::cli {

// True when launched by mpirun/srun with more than one rank (their variables say so; torchrun's
// RANK/WORLD_SIZE alone do not count).
bool verify_under_mpi();

// Initialises MPI, runs the job over MPI_COMM_WORLD and finalises MPI. The report on rank 0,
// nullopt on the other ranks. ConfigError on every rank if the ranks' jobs differ (another
// binary or other options on some node). A rank that dies ends the whole job (OpenMPI has no
// fault tolerance); rank 0's journal keeps what finished, and --resume reruns only the rest.
std::optional<props::VerifyReport> run_verify_mpi(const props::VerifyOptions& opts);

// The soak run over MPI: rank 0 reads the budget (opts.keep_going) and stops handing out items
// when it is spent. The report (and soak.json) on rank 0, nullopt elsewhere.
std::optional<props::SoakReport> run_soak_mpi(const props::SoakOptions& opts,
                                              const std::function<void(const props::SoakReport&)>& progress);

}  // namespace zc::cli
