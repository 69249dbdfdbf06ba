// SPDX-License-Identifier: MIT
/// @file
/// The injectable clock behind every protocol timer (retry, RNR, CM, no-op
/// delays).  A context reads time only through a `clock`; tests give it a
/// `manual_clock` and advance time by hand instead of sleeping.
#pragma once

#include <chrono>
#include <mutex>
#include <vector>

namespace averbs {

/// Receives a notification whenever a clock's time moves other than by the
/// passage of real time (a `manual_clock` being advanced).
class clock_listener {
 public:
  virtual void on_clock_changed() noexcept = 0;

 protected:
  ~clock_listener() = default;
};

/// A monotonic time source.
///
/// Thread safety: `now()` may be called from any thread.
class clock {
 public:
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<clock, duration>;

  virtual ~clock() = default;

  /// The current time.  Never goes backwards.
  virtual time_point now() const noexcept = 0;

  /// True if time advances by itself (a timerfd can wait for a deadline);
  /// false if it moves only when told to (`manual_clock`).
  virtual bool is_real_time() const noexcept = 0;

  /// Registers or removes a listener told about non-real-time changes.
  virtual void subscribe(clock_listener& l) = 0;
  virtual void unsubscribe(clock_listener& l) noexcept = 0;
};

/// The real monotonic clock (`CLOCK_MONOTONIC`).  The default clock of a
/// context.
class steady_clock final : public clock {
 public:
  time_point now() const noexcept override;
  bool is_real_time() const noexcept override { return true; }
  void subscribe(clock_listener&) override {}
  void unsubscribe(clock_listener&) noexcept override {}

  /// The process-wide instance.
  static steady_clock& instance() noexcept;
};

/// A clock that moves only when `advance()` or `set()` is called.  Timers of
/// every context using it fire at the next progress pass after time reaches
/// their deadline.
///
/// Thread safety: all members may be called from any thread.  The clock must
/// outlive every context that uses it.
class manual_clock final : public clock {
 public:
  manual_clock() = default;
  explicit manual_clock(time_point start) : now_(start) {}

  time_point now() const noexcept override;
  bool is_real_time() const noexcept override { return false; }
  void subscribe(clock_listener& l) override;
  void unsubscribe(clock_listener& l) noexcept override;

  /// Moves time forward by `d` (negative values are ignored) and tells every
  /// subscribed context to check its timers.
  void advance(duration d);

  /// Moves time to `t` if it is later than now.
  void set(time_point t);

 private:
  void notify();

  mutable std::mutex mu_;
  time_point now_{};
  std::vector<clock_listener*> listeners_;
};

}  // namespace averbs
