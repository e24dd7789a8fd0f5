// Trace: one rank's event stream (collectives, hooks, engine state, DeepCompile runtime calls),
// folded into a 64-bit hash as it grows. Running a scenario twice must give the same hash: the
// determinism self-check. Events hold no pointers and no wall-clock time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zc {

// An event's category and detail with their hash, taken once: the simulator records the same line
// on every member of a collective, and hashing it once spares each rank the pass over its bytes.
struct TraceLine {
  TraceLine(std::string category, std::string detail);
  std::string category;
  std::string detail;
  std::uint64_t hash = 0;
};

// A kept event shares its line: the members of one collective keep one copy of it.
struct TraceEvent {
  std::uint64_t index = 0;                // position in this rank's stream
  std::shared_ptr<const TraceLine> line;  // category "comm", "hook", "engine", "deepcompile", ...;
                                          // detail human-readable: "issue all_reduce(...) on ..."
  std::uint64_t payload = 0;              // e.g. a hash of the data the event produced
  double time_us = 0;  // the rank's simulated clock when recorded (not hashed; 0 off the simulator)
  const std::string& category() const { return line->category; }
  const std::string& detail() const { return line->detail; }
};

class Trace {
 public:
  explicit Trace(std::size_t max_kept_events = 1 << 16) : max_kept_(max_kept_events) {}

  void record(std::string_view category, std::string_view detail, std::uint64_t payload = 0);
  // The same event as record(line->category, line->detail, payload), hash included.
  void record(const std::shared_ptr<const TraceLine>& line, std::uint64_t payload = 0);
  std::uint64_t hash() const { return hash_; }
  // The simulator sets its rank's clock here; events are stamped with it (timelines only).
  void set_time(double us) { now_us_ = us; }
  std::uint64_t size() const { return count_; }
  // The first max_kept_events events (all of them for small runs); the hash covers every event.
  const std::vector<TraceEvent>& events() const { return events_; }
  // Where the next kept event goes (its vector's end; nullptr when no more are kept): the
  // simulator prefetches it (Note [Prefetch on resume] in sim/cluster_state.cpp).
  const void* next_slot() const { return keeps() ? events_.data() + events_.size() : nullptr; }

 private:
  std::size_t max_kept_;
  std::uint64_t count_ = 0;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;  // FNV offset basis
  std::vector<TraceEvent> events_;
  double now_us_ = 0;

  void fold(std::uint64_t line_hash, std::uint64_t payload);
  bool keeps() const { return events_.size() < max_kept_; }
  void keep(std::shared_ptr<const TraceLine> line, std::uint64_t payload);
};

// The hash of one event's category and detail (FNV-1a, with a separator so that the boundary counts).
std::uint64_t trace_line_hash(std::string_view category, std::string_view detail);
// FNV-1a over bytes, continuing from `h`: for short strings.
std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = 0xcbf29ce484222325ull);
// A 64-bit hash of a data buffer, eight bytes per step (tensor contents in traces).
std::uint64_t hash_data(const void* data, std::size_t bytes);

}  // namespace zc
