// `zerocheck verify --config FILE`: the invariants over scenarios drawn around a user's own
// ds_config. What the config decides is pinned in every scenario (the stage, the dtypes, the
// buckets and their flags, offload, clipping, the optimizer and its hyper-parameters); what a
// training run varies is drawn as usual (world sizes, backward counts and boundaries, models and
// data, accumulation). An invariant whose scenarios never take one of the config's settings
// (I2 is about ZeRO-3; the exact-domain ones never clip) is reported not applicable, naming the
// setting, rather than run vacuously. What the config holds beyond a Scenario (a scheduler, loss
// scaling's window, ZeRO-3's prefetch sizes) is listed as not checked.
#pragma once

#include "props/invariants.h"
#include "props/scenario.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace zc::props {

struct UserConfig {
  std::string path;          // for the report
  nlohmann::json ds_config;  // as given
  Scenario pins;             // the pinned fields' values (the others unused)
  std::vector<std::string> not_checked;  // settings of the config the scenarios do not carry
  std::vector<std::string> warnings;     // the config's own (Config::warnings)
};

// ConfigError for what DeepSpeed or zerocheck refuses, as `zerocheck run` would.
UserConfig user_config_from_json(const nlohmann::json& ds_config, const std::string& path);

// The scenario with every pinned field set from the config.
Scenario pin(Scenario s, const UserConfig& u);

// "" when the invariant's scenarios can take every pinned setting, else which one they never take
// (from a sample of its generator, so it follows the generators as they change).
std::string not_applicable_reason(const Invariant& inv, const UserConfig& u);

// The invariant with its generator pinned to the config.
Invariant pinned(const Invariant& inv, const UserConfig& u);

}  // namespace zc::props
