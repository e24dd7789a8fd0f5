// `zerocheck verify-real`: the seeded scenario list on a real backend, each compared bit for bit
// with the simulator's result for the same scenario, plus cross-rank agreement. Run under mpirun.
#pragma once

#include <cstdint>
#include <string>

namespace zc::cli {

struct VerifyRealOptions {
  std::string backend = "host";
  int scenarios = 12;
  std::uint64_t seed = 1;
  std::string out = "reports/verify-real";
  int timeout_s = 120;
};

int run_verify_real(int argc, char** argv, const VerifyRealOptions& opts);

}  // namespace zc::cli
