// Trace hashing: each event's category and detail hashed (FNV-1a), folded with its payload into the
// stream's state.
#include "engine/trace.h"

#include <bit>
#include <cstring>
#include <utility>

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

std::uint64_t trace_line_hash(std::string_view category, std::string_view detail) {
  return fnv1a(detail, fnv1a(std::string_view("\x1f", 1), fnv1a(category)));
}

TraceLine::TraceLine(std::string category_, std::string detail_)
    : category(std::move(category_)), detail(std::move(detail_)),
      hash(trace_line_hash(category, detail)) {}

namespace {
std::uint64_t fmix64(std::uint64_t h) {  // MurmurHash3's finalizer: a bijection that mixes every bit
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}
}  // namespace

// The stream's hash folds each event's line hash and payload into the previous state, so that
// the order of events counts as well as their contents.
void Trace::fold(std::uint64_t line_hash, std::uint64_t payload) {
  hash_ = fmix64(fmix64(hash_ * 0x100000001b3ull + line_hash) ^ payload);
}

void Trace::keep(std::shared_ptr<const TraceLine> line, std::uint64_t payload) {
  events_.push_back({count_, std::move(line), payload, now_us_});
}

void Trace::record(std::string_view category, std::string_view detail, std::uint64_t payload) {
  if (!keeps()) {
    fold(trace_line_hash(category, detail), payload);
    ++count_;
    return;
  }
  record(std::make_shared<const TraceLine>(std::string(category), std::string(detail)), payload);
}

void Trace::record(const std::shared_ptr<const TraceLine>& line, std::uint64_t payload) {
  fold(line->hash, payload);
  if (keeps()) keep(line, payload);
  ++count_;
}

}  // namespace zc
