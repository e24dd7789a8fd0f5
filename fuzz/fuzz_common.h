// What every fuzz target shares (issue 19): input bytes become JSON (a parse failure is not a
// finding), and the contract: on any input the entry point returns or throws a ZcError that says
// what is wrong. Anything else (another exception, ZC_ASSERT's InternalError, a crash, a sanitizer
// report, an oracle below) escapes to the fuzzer, which reports it as a bug.
#pragma once

#include "engine/errors.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace zc::fuzz {

// The largest input a target reads; the campaign's -max_len stays below it.
inline constexpr std::size_t kMaxInputBytes = std::size_t{1} << 16;

inline std::optional<nlohmann::json> parse_json(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// A property beyond "no crash" (a round trip, a derived figure) that failed: a bug.
class OracleFailure : public std::logic_error {
  using std::logic_error::logic_error;
};

inline void check(bool ok, const std::string& what) {
  if (!ok) throw OracleFailure("fuzz oracle failed: " + what);
}

// Runs `body`, swallowing the refusals the contract allows. InternalError is a ZcError too, but it
// is ZC_ASSERT firing, so it escapes with the rest.
template <class Body>
int run_contract(Body&& body) {
  try {
    body();
  } catch (const InternalError&) {
    throw;
  } catch (const ZcError&) {
  }
  return 0;
}

}  // namespace zc::fuzz
