// Launcher environments: OpenMPI, SLURM and torchrun-style variables, their agreement, and their
// agreement with the communicator.
#include "engine/errors.h"
#include "real/bootstrap.h"

#include <gtest/gtest.h>

#include <map>

namespace zc::real {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Bootstrap, ReadsEachLauncher) {
  LaunchEnv e = detect_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}));
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.source, "openmpi");
  e = detect_launch_env(env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  e = detect_launch_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}));
  EXPECT_EQ(e.source, "slurm+torchrun");
  EXPECT_EQ(detect_launch_env(env_of({})).source, "none");
}

TEST(Bootstrap, DisagreementIsAnErrorNamingBothLaunchers) {
  try {
    detect_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"RANK", "3"}, {"WORLD_SIZE", "4"}}));
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("launchers disagree: openmpi says rank 0 of 4, torchrun says rank 3 of 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(detect_launch_env(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), ConfigError);
  EXPECT_THROW(detect_launch_env(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})), ConfigError);
  EXPECT_THROW(detect_launch_env(env_of({{"RANK", "0"}})), ConfigError);
  const LaunchEnv e = detect_launch_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  EXPECT_THROW(check_against_comm(e, 0, 2), ConfigError);
  EXPECT_NO_THROW(check_against_comm(e, 1, 2));
}

}  // namespace
}  // namespace zc::real
