// The one file in engine/, sim/ and props/ that may read a clock (tests/tidy_test.cpp fails on any
// other). Note [Wall time never decides]: a Stopwatch's seconds go only into report fields (seconds
// per property, per proof, per DeepSpeed call, per run), and a Deadline only bounds how long we wait
// on an external process (the DeepSpeed worker pool) before tearing it down as hung, which is an
// error, never a verdict. Neither may feed a verdict, a trace hash, a scenario or a seed: a rerun
// by seed gives the same bits however fast or loaded the machine is.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace zc::props {

// Wall time since construction, in seconds, for the reports.
class Stopwatch {
 public:
  Stopwatch() : t0_(Clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_;
};

// A point `seconds` of wall time after construction, for waits on external processes.
class Deadline {
 public:
  explicit Deadline(double seconds) : at_(Clock::now() + after(seconds)) {}
  bool passed() const { return Clock::now() >= at_; }
  // Whole milliseconds left; <= 0 once passed.
  std::int64_t ms_left() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
  }
  // Brings the deadline forward to `seconds` from now, if that is sooner.
  void tighten(double seconds) { at_ = std::min(at_, Clock::now() + after(seconds)); }

 private:
  using Clock = std::chrono::steady_clock;
  static Clock::duration after(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  Clock::time_point at_;
};

}  // namespace zc::props
