// Launcher environments: OpenMPI (OMPI_COMM_WORLD_*), SLURM (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID) and torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK). Every launcher present must
// agree, and they must agree with the MPI communicator; a disagreement is a ConfigError naming
// both sources, before any collective runs.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace zc::real {

struct LaunchEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string source = "none";  // which launcher(s) set it, e.g. "openmpi+torchrun"
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// From the given environment (std::getenv by default). Throws ConfigError on malformed values or
// launchers that disagree.
LaunchEnv detect_launch_env(const EnvLookup& env);
LaunchEnv detect_launch_env();

// Checks the environment against what the communicator says (rank, size).
void check_against_comm(const LaunchEnv& env, int comm_rank, int comm_size);

}  // namespace zc::real
