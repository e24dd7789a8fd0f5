// Launcher environment detection and agreement checks.
#include "real/bootstrap.h"

#include "engine/errors.h"

#include <cstdlib>

namespace zc::real {

namespace {

struct Source {
  const char* name;
  const char* rank;
  const char* world;
  const char* local;
};

constexpr Source kSources[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

int parse_int(const std::string& key, const std::string& value) {
  try {
    std::size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used != value.size() || v < 0) throw std::invalid_argument(value);
    return v;
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("environment variable {}='{}' is not a non-negative integer", key, value));
  }
}

}  // namespace

LaunchEnv detect_launch_env(const EnvLookup& env) {
  LaunchEnv out;
  std::optional<LaunchEnv> first;
  std::string first_name;
  for (const Source& s : kSources) {
    const auto rank = env(s.rank), world = env(s.world);
    if (!rank && !world) continue;
    if (!rank || !world) {
      throw ConfigError(fmt::format("{} launcher: {} and {} must both be set", s.name, s.rank, s.world));
    }
    LaunchEnv e;
    e.rank = parse_int(s.rank, *rank);
    e.world = parse_int(s.world, *world);
    const auto local = env(s.local);
    e.local_rank = local ? parse_int(s.local, *local) : 0;
    if (e.world < 1 || e.rank >= e.world) {
      throw ConfigError(fmt::format("{} launcher: rank {} is outside a world of {}", s.name, e.rank, e.world));
    }
    if (!first) {
      first = e;
      first_name = s.name;
      out = e;
      out.source = s.name;
    } else if (e.rank != first->rank || e.world != first->world) {
      throw ConfigError(fmt::format("launchers disagree: {} says rank {} of {}, {} says rank {} of {}; "
                                    "unset the stale variables", first_name, first->rank, first->world,
                                    s.name, e.rank, e.world));
    } else {
      out.source += std::string("+") + s.name;
    }
  }
  return out;
}

LaunchEnv detect_launch_env() {
  return detect_launch_env([](const std::string& key) -> std::optional<std::string> {
    const char* v = std::getenv(key.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

void check_against_comm(const LaunchEnv& env, int comm_rank, int comm_size) {
  if (env.source == "none") return;
  if (env.rank != comm_rank || env.world != comm_size) {
    throw ConfigError(fmt::format("the {} environment says rank {} of {}, but MPI says rank {} of {}",
                                  env.source, env.rank, env.world, comm_rank, comm_size));
  }
}

}  // namespace zc::real
