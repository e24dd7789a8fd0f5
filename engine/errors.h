// The error hierarchy (STYLE.md "Errors") and ZC_ASSERT, the always-on check of internal invariants.
// A user's mistake or an unsupported combination is one of the exceptions below, with a message that
// names the key, call or rank and says what to do; a broken internal invariant is ZC_ASSERT.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace zc {

class ZcError : public std::runtime_error {
 public:
  explicit ZcError(const std::string& what) : std::runtime_error(what) {}
  // The simulator stamps an error that ends a run with the hash of every rank's trace up to the
  // failure (their events in rank order, then the schedule), so a failing verdict carries the hash
  // of its real run. 0 when no simulated run was under way.
  std::uint64_t trace_hash() const { return trace_hash_; }
  void set_trace_hash(std::uint64_t h) { trace_hash_ = h; }

 private:
  std::uint64_t trace_hash_ = 0;
};

// A config key with a wrong type, value or impossible combination.
class ConfigError : public ZcError { using ZcError::ZcError; };
// A combination DeepSpeed does not support either.
class NotImplementedError : public ZcError { using ZcError::ZcError; };
// An API called in a state where it is not allowed (step() inside coalesce, bad shapes, ...).
class UsageError : public ZcError { using ZcError::ZcError; };
// Ranks of one group issued different collectives at the same sequence number.
class CollectiveMismatch : public ZcError { using ZcError::ZcError; };
// No rank can run while some have not finished.
class Deadlock : public ZcError { using ZcError::ZcError; };
// A buffer of a pending async collective was written, or its output read before wait().
class DataRace : public ZcError { using ZcError::ZcError; };
// A limit (ranks, in-flight work, scheduler steps, ...) was passed.
class LimitExceeded : public ZcError { using ZcError::ZcError; };
// Training cannot go on (DeepSpeed raises and ends the run): fp16 gradients still overflow with
// the dynamic loss scale already at min_loss_scale.
class TrainingError : public ZcError { using ZcError::ZcError; };
// A CUDA or NCCL call of a real backend failed (the message names the call and the error string).
class BackendError : public ZcError { using ZcError::ZcError; };
// ZC_ASSERT failed: a bug in zerocheck or in the engine under test.
class InternalError : public ZcError { using ZcError::ZcError; };

// A rank failed with an error that is not one of the simulator's own; carries the rank and cause.
class RankFailure : public ZcError {
 public:
  RankFailure(int rank, const std::string& cause, std::exception_ptr original)
      : ZcError(fmt::format("rank {} failed: {}", rank, cause)),
        rank_(rank), cause_(cause), original_(std::move(original)) {}
  int rank() const { return rank_; }
  const std::string& cause() const { return cause_; }
  [[noreturn]] void rethrow_original() const { std::rethrow_exception(original_); }

 private:
  int rank_;
  std::string cause_;
  std::exception_ptr original_;
};

// The rank whose code is running, for diagnostics only (ZC_ASSERT messages). The simulator sets it
// on every fiber switch; a real backend sets it once per process. -1 when unknown.
int current_rank();
void set_current_rank(int rank);

[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace zc

// Always on, never <cassert>. Throws InternalError naming rank, file and line. The message is
// formatted in a cold out-of-line lambda, so that the check costs its caller a compare and a call,
// not stack space for the formatting (the simulator's hot frames are cold in cache at every fiber
// switch: each stack line they span is a miss).
#define ZC_ASSERT(cond, ...)                                                            \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      [&]() __attribute__((noinline, cold, noreturn)) {                                 \
        ::zc::assert_fail(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__));    \
      }();                                                                              \
    }                                                                                   \
  } while (0)
