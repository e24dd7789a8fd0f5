// Deterministic randomness: one root seed, split per rank and per component (STYLE.md 6).
// xoshiro256** seeded through SplitMix64, with our own distributions because std's differ between
// standard libraries. No rand(), random_device or clock anywhere in engine/, sim/ or props/.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace zc {

constexpr std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A 64-bit mix of two values, for deriving sub-seeds and hashing.
constexpr std::uint64_t mix64(std::uint64_t a, std::uint64_t b) {
  std::uint64_t s = a ^ (b * 0x9e3779b97f4a7c15ull);
  return splitmix64(s);
}

__extension__ typedef unsigned __int128 Uint128;  // for Lemire's method only

class Rng {
 public:
  explicit constexpr Rng(std::uint64_t seed) {
    std::uint64_t sm = seed;
    for (auto& w : s_) w = splitmix64(sm);
  }

  constexpr std::uint64_t next() {
    const std::uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return result;
  }

  // A child stream: the same (parent seed, stream id) always gives the same child.
  constexpr Rng split(std::uint64_t stream_id) const { return Rng(mix64(s_[0] ^ s_[3], stream_id)); }

  // Uniform in [0, n), n > 0, without modulo bias (Lemire's multiply-and-reject).
  constexpr std::uint64_t below(std::uint64_t n) {
    Uint128 m = static_cast<Uint128>(next()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<Uint128>(next()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }
  // Uniform integer in [lo, hi].
  constexpr std::int64_t range(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }
  // Uniform in [0, 1) with 53 random bits.
  constexpr double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  constexpr bool chance(double p) { return uniform01() < p; }
  // Standard normal by Box-Muller (one value per call; glibc's log/cos/sqrt are deterministic).
  double normal() {
    double u1 = uniform01();
    while (u1 <= 0.0) u1 = uniform01();
    const double u2 = uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }

 private:
  std::uint64_t s_[4]{};
};

}  // namespace zc
