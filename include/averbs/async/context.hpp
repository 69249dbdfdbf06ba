// SPDX-License-Identifier: MIT
/// @file
/// `averbs::context`: the request slab, the progress engine and the waits.
///
/// The library starts no threads.  Progress (timers, links, daemon replies)
/// happens inside the caller's own calls: every wait blocks in `epoll` on the
/// registered progress sources and on the wake descriptor of the waiting
/// thread, and drives progress itself.  A program with its own event loop
/// instead watches `native_handle()` (call `poll()` when it is readable) and
/// `thread_handle()` (call `alertable_wait(0ns)` when it is readable).
#pragma once

#include <averbs/async/clock.hpp>
#include <averbs/async/detail/core.hpp>

#include <chrono>
#include <cstdint>
#include <system_error>

namespace averbs {

/// Blocks without a time limit.
inline constexpr std::chrono::nanoseconds infinite = std::chrono::nanoseconds::max();

namespace detail {
/// A caller's timeout in nanoseconds, saturating: `std::chrono::seconds::max()`
/// or three centuries is `infinite`, not the overflow of an implicit
/// conversion (which left a negative value: no wait at all).
template <class Rep, class Period>
constexpr std::chrono::nanoseconds timeout_ns(std::chrono::duration<Rep, Period> d) noexcept {
  using wide = std::chrono::duration<long double, std::nano>;
  const long double x = std::chrono::duration_cast<wide>(d).count();
  if (x != x) return std::chrono::nanoseconds::zero();  // NaN: a poll
  if (x >= static_cast<long double>(infinite.count())) return infinite;
  if (x <= static_cast<long double>(std::chrono::nanoseconds::min().count()))
    return std::chrono::nanoseconds::min();
  // From the wide value: a double just under 2^63 ns would round up to
  // 2^63 in the duration's own arithmetic.
  return std::chrono::nanoseconds(static_cast<std::chrono::nanoseconds::rep>(x));
}
}  // namespace detail

/// Something the context drives: a pollable descriptor plus a non-blocking
/// `progress()` that does the work the descriptor announced.
///
/// `progress()` may be called concurrently from several waiting threads and
/// must serialise itself (a try-lock is enough: a second caller can return).
/// It must never block and never call application code.
class progress_source {
 public:
  /// A descriptor that is readable (level-triggered) while `progress()` has
  /// work to do.
  virtual int native_handle() const noexcept = 0;

  /// Does the pending work.  Never blocks.
  virtual void progress() noexcept = 0;

  /// True if `progress()` should also be called on every busy-poll spin, for
  /// sources whose work does not show on the descriptor (shared rings).
  virtual bool busy_poll() const noexcept { return false; }

  /// For busy-polled sources: called with true before a context sleeps on
  /// the descriptor and with false once it woke up.  A source whose
  /// descriptor would cost something on every event while it is polled
  /// anyway (a socket's wake-up callbacks) can make the descriptor show
  /// its work only while someone sleeps.  The context polls once more
  /// after arming, so an event between the last poll and the arming is
  /// not missed.
  virtual void sleeping(bool armed) noexcept { (void)armed; }

 protected:
  ~progress_source() = default;
};

struct context_options {
  /// Time source for every protocol timer; null selects the real clock.
  /// Must outlive the context.
  averbs::clock* clock = nullptr;
  /// Starts the opt-in progress thread at construction.
  bool progress_thread = false;
  /// How long a wait busy-polls before it blocks in the kernel.  Blocking
  /// wake-ups cost tens of microseconds on virtual machines, so latency paths
  /// spin first.  Zero blocks at once.
  std::chrono::nanoseconds spin = std::chrono::microseconds(20);
};

/// Counters kept by a context (monotonic, approximate under concurrency).
struct context_stats {
  std::uint64_t started = 0;           ///< requests initiated
  std::uint64_t completed = 0;         ///< requests completed (any status)
  std::uint64_t cancelled = 0;         ///< completed by cancellation
  std::uint64_t stale_ignored = 0;     ///< completions naming a finished request
  std::uint64_t duplicate_ignored = 0; ///< second completions of a live request
  std::uint64_t handlers_run = 0;      ///< handlers invoked in alertable waits
  std::uint64_t handlers_dropped = 0;  ///< handlers destroyed unrun (thread exited)
  std::uint64_t slots = 0;             ///< slab capacity
  std::uint64_t in_flight = 0;         ///< slots in use now
  std::uint64_t timers = 0;            ///< timers queued now (a few cancelled ones included)
};

/// The request slab, progress sources, timers and waits of one program part.
///
/// Thread safety: every member may be called from any thread.  A context
/// must outlive the objects created on it; requests still pending when it is
/// destroyed complete with `errc::operation_aborted`.
class context {
 public:
  explicit context(const context_options& opts = {});
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  /// Registers a progress source.  Fails with `errc::already_exists` if it
  /// is registered, or with the `epoll_ctl` error.
  void add_source(progress_source& s);
  void add_source(progress_source& s, std::error_code& ec) noexcept;

  /// Unregisters a source.  On return no thread is inside its `progress()`.
  /// Must not be called from inside a `progress()` call.
  void remove_source(progress_source& s) noexcept;

  /// Drives progress once without blocking: expired timers and every source
  /// whose descriptor is ready.  Runs no handlers.  Returns the number of
  /// sources that had work.
  std::size_t poll() noexcept;

  /// Runs the completion handlers queued for the calling thread; if there
  /// are none, waits (driving progress) up to `timeout` for one to arrive.
  /// Returns the number of handlers run; 0 on timeout.
  ///
  /// Errors (`ec` overload): `errc::timed_out`; `errc::would_deadlock` when
  /// called inside a handler with a positive timeout; the system error that
  /// kept the thread from waiting (EMFILE: no descriptor left for its
  /// wake-up).  The throwing overload throws for all but `timed_out`.  A handler that throws
  /// propagates its exception out of this call after its request was freed.
  std::size_t alertable_wait(std::chrono::nanoseconds timeout);
  std::size_t alertable_wait(std::chrono::nanoseconds timeout, std::error_code& ec);
  /// Any duration, saturating at `infinite` (detail::timeout_ns).
  template <class Rep, class Period>
  std::size_t alertable_wait(std::chrono::duration<Rep, Period> timeout) {
    return alertable_wait(detail::timeout_ns(timeout));
  }
  template <class Rep, class Period>
  std::size_t alertable_wait(std::chrono::duration<Rep, Period> timeout, std::error_code& ec) {
    return alertable_wait(detail::timeout_ns(timeout), ec);
  }

  /// A descriptor readable while progress may be needed (an epoll set).
  int native_handle() const noexcept;

  /// The calling thread's wake descriptor: readable while handlers are
  /// queued for this thread.  Valid until the thread exits.
  int thread_handle() const;

  /// The time source of this context's timers.
  averbs::clock& clock() const noexcept;

  /// Starts or stops the opt-in progress thread.  It only drives progress:
  /// handlers still run on their initiating threads.
  void start_progress_thread();
  void stop_progress_thread() noexcept;

  context_stats stats() const noexcept;

  /// Internal: the implementation behind this context.
  detail::context_impl& detail_impl() const noexcept { return *impl_; }

 private:
  detail::context_impl* impl_;
};

}  // namespace averbs
