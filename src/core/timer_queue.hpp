// SPDX-License-Identifier: MIT
// Deadline-ordered timers on a context's injectable clock.  Cancellation is
// lazy: a timer whose owner no longer wants it fires into a stale request id
// and is ignored by the core.  Owners that cancel timers long before they
// are due say so (note_cancelled()) and give the timer a liveness check:
// once the cancelled make up half the heap, the dead are swept out, so
// timeouts cancelled by the million do not pile up until their deadlines.
#pragma once

#include <averbs/async/clock.hpp>

#include <cstdint>
#include <mutex>
#include <system_error>
#include <vector>

namespace averbs::detail {

/// Arms the CLOCK_MONOTONIC timerfd `fd` (TFD_TIMER_ABSTIME) for the moment
/// real-time clock `c` reads `deadline`.  The steady clock reads
/// CLOCK_MONOTONIC itself; another real-time clock may count from another
/// epoch, so its deadline is the monotonic now plus what is left on it
/// (an absolute time taken as is would be past at once, or never come).
/// An already-due deadline arms 1 ns (a zero value would disarm).
void arm_timerfd(int fd, const clock& c, bool steady, clock::time_point deadline) noexcept;

/// What a timer hands back to its function when it fires.
struct timer_payload {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  std::error_code ec{};
};

using timer_fn = void (*)(void* arg, const timer_payload& p) noexcept;
/// Whether a timer still has something to do.  Called under the queue's
/// lock: it must not schedule or take locks a timer function holds.
using timer_alive_fn = bool (*)(void* arg, const timer_payload& p) noexcept;

class timer_queue {
 public:
  /// Adds a timer; returns true if it is now the earliest (the caller
  /// re-arms its wake-up).
  bool schedule(clock::time_point deadline, timer_fn fn, void* arg, const timer_payload& p,
                timer_alive_fn alive = nullptr);

  /// One timer scheduled with a liveness check was cancelled.  Sweeps the
  /// dead out once the cancelled make up half the heap.
  void note_cancelled() noexcept;

  /// Runs every timer due at `now`; returns the number run.  Timer functions
  /// run without the lock held and may schedule new timers.
  std::size_t run_expired(clock::time_point now);

  /// The earliest deadline, or `time_point::max()` if none.
  clock::time_point next_deadline() const;

  std::size_t size() const;

  /// Makes room for `n` timers, so that scheduling up to that many does
  /// not allocate (it may throw std::bad_alloc, as schedule may).
  void reserve(std::size_t n);

 private:
  struct entry {
    clock::time_point deadline;
    std::uint64_t seq;
    timer_fn fn;
    void* arg;
    timer_payload payload;
    timer_alive_fn alive;
  };
  struct later {
    bool operator()(const entry& a, const entry& b) const noexcept {
      return a.deadline != b.deadline ? a.deadline > b.deadline : a.seq > b.seq;
    }
  };

  mutable std::mutex mu_;
  std::vector<entry> heap_;  // Must hold mu_.
  std::uint64_t seq_ = 0;    // Must hold mu_.
  std::size_t cancelled_ = 0;  // Must hold mu_: since the last sweep.
};

}  // namespace averbs::detail
