// Trace hashing: FNV-1a over each event's fields, with separators so that field boundaries count.
#include "engine/trace.h"

namespace zc {

std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
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
    events_.push_back({count_, std::string(category), std::string(detail), payload});
  }
  ++count_;
}

}  // namespace zc
