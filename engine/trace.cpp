// Trace hashing: FNV-1a over each event's fields, with separators so that field boundaries count.
#include "engine/trace.h"

#include <bit>
#include <cstring>

namespace zc {

std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t hash_data(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ bytes;
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = std::rotl((h ^ w) * 0xff51afd7ed558ccdull, 29);
  }
  std::uint64_t tail = 0;
  if (bytes > i) std::memcpy(&tail, p + i, bytes - i);  // never memcpy from a null empty buffer (UB)
  h = (h ^ tail) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

void Trace::record(std::string_view category, std::string_view detail, std::uint64_t payload) {
  std::uint64_t h = fnv1a(category, hash_);
  h = fnv1a(std::string_view("\x1f", 1), h);
  h = fnv1a(detail, h);
  for (int i = 0; i < 8; ++i) {
    h ^= (payload >> (8 * i)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  hash_ = h;
  if (events_.size() < max_kept_) {
    events_.push_back({count_, std::string(category), std::string(detail), payload, now_us_});
  }
  ++count_;
}

}  // namespace zc
