// SPDX-License-Identifier: MIT
/// @file
/// `averbs::request<T>`: a waitable handle on one pending operation, the
/// OVERLAPPED + GetOverlappedResult model.
#pragma once

#include <averbs/async/completion_port.hpp>
#include <averbs/async/context.hpp>
#include <averbs/error.hpp>

#include <chrono>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

namespace averbs {

namespace detail {
bool request_ready(context_impl& ctx, request_id id) noexcept;
/// Waits for completion.  Returns an empty code once the request completed,
/// else `timed_out`, `alerted` or `would_deadlock`.
std::error_code request_wait(context_impl& ctx, request_id id, std::chrono::nanoseconds timeout,
                             bool alertable);
/// Requires a completed request.  Moves its result into `out` (or destroys it
/// when `out` is null), frees the request and returns the operation's status.
std::error_code request_take(context_impl& ctx, request_id id, void* out) noexcept;
/// Drops the handle: frees a completed request, detaches a pending one.
void request_release(context_impl& ctx, request_id id) noexcept;
int request_native_handle(context_impl& ctx, request_id id, std::error_code& ec) noexcept;
}  // namespace detail

/// A handle on one asynchronous operation whose completion the caller waits
/// for, polls, or watches through a descriptor.
///
/// Destroying the handle of a pending request does not cancel it: the
/// operation runs to completion and its result is discarded.  One thread at
/// a time may wait on a request.
template <class T>
class request {
 public:
  request() noexcept = default;
  request(context& ctx, detail::request_id id) noexcept : ctx_(&ctx.detail_impl()), id_(id) {
    detail::context_add_ref(*ctx_);
  }
  request(request&& o) noexcept
      : ctx_(std::exchange(o.ctx_, nullptr)), id_(o.id_) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      reset();
      ctx_ = std::exchange(o.ctx_, nullptr);
      id_ = o.id_;
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { reset(); }

  /// False for a default-constructed or consumed handle.
  bool valid() const noexcept { return ctx_ != nullptr; }

  /// True once the operation completed (its result is ready to `get()`).
  bool ready() const noexcept { return ctx_ != nullptr && detail::request_ready(*ctx_, id_); }

  /// Waits until the operation completes, driving progress.
  /// Errors: `errc::would_deadlock` inside a handler; the system error that
  /// kept the thread from waiting (EMFILE: no descriptor left for the
  /// thread's wake-up, made on its first wait).  The operation's own status
  /// is reported by `get()`.
  void wait() {
    std::error_code ec;
    wait(ec);
    if (ec) throw_error(ec, "averbs::request::wait");
  }
  void wait(std::error_code& ec) noexcept {
    ec = detail::request_wait(*ctx_, id_, infinite, false);
  }

  /// Waits up to `timeout`; returns true once the operation completed.
  /// Errors (`ec` overload): `timed_out`, `alerted` (alertable mode ran
  /// handlers), `would_deadlock`, or a system error as for `wait()`.  The
  /// throwing overload throws for all but `timed_out` and `alerted`.  In
  /// alertable mode an exception thrown by a handler propagates.
  bool wait_for(std::chrono::nanoseconds timeout, wait_mode mode = wait_mode::normal) {
    std::error_code ec;
    const bool done = wait_for(timeout, mode, ec);
    if (ec && ec != errc::timed_out && ec != errc::alerted) throw_error(ec, "averbs::request::wait_for");
    return done;
  }
  bool wait_for(std::chrono::nanoseconds timeout, wait_mode mode, std::error_code& ec) {
    ec = detail::request_wait(*ctx_, id_, timeout, mode == wait_mode::alertable);
    return !ec;
  }
  /// Any duration, saturating at `infinite` (detail::timeout_ns).
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout, wait_mode mode = wait_mode::normal) {
    return wait_for(detail::timeout_ns(timeout), mode);
  }
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout, wait_mode mode, std::error_code& ec) {
    return wait_for(detail::timeout_ns(timeout), mode, ec);
  }

  /// Requests cancellation.  If the operation was still pending it completes
  /// with `errc::operation_aborted` and this returns true.
  bool cancel() noexcept { return ctx_ != nullptr && detail::cancel_request(*ctx_, id_); }

  /// An eventfd that becomes readable when the operation completes; valid
  /// until the handle is consumed or destroyed.
  int native_handle() {
    std::error_code ec;
    const int fd = native_handle(ec);
    if (ec) throw_error(ec, "averbs::request::native_handle");
    return fd;
  }
  int native_handle(std::error_code& ec) noexcept {
    return detail::request_native_handle(*ctx_, id_, ec);
  }

  /// Waits for completion and consumes the handle.  Returns the result, or
  /// throws `std::system_error` with the operation's error.
  T get() {
    std::error_code ec;
    if constexpr (std::is_void_v<T>) {
      get(ec);
      if (ec) throw_error(ec, "averbs::request::get");
    } else {
      T v = get(ec);
      if (ec) throw_error(ec, "averbs::request::get");
      return v;
    }
  }

  /// Waits for completion and consumes the handle; `ec` receives the
  /// operation's status (or the wait's error, leaving the handle valid).
  T get(std::error_code& ec) noexcept {
    ec = detail::request_wait(*ctx_, id_, infinite, false);
    if (ec) {
      if constexpr (!std::is_void_v<T>) return T{};
      else return;
    }
    if constexpr (std::is_void_v<T>) {
      ec = detail::request_take(*ctx_, id_, nullptr);
      consumed();
    } else {
      alignas(T) unsigned char buf[sizeof(T)];
      ec = detail::request_take(*ctx_, id_, buf);
      consumed();
      T* p = std::launder(reinterpret_cast<T*>(buf));
      T v(std::move(*p));
      p->~T();
      return v;
    }
  }

  detail::request_id id() const noexcept { return id_; }

 private:
  void consumed() noexcept { detail::context_release(*std::exchange(ctx_, nullptr)); }
  void reset() noexcept {
    if (ctx_ != nullptr) {
      detail::request_release(*ctx_, id_);
      consumed();
    }
  }

  detail::context_impl* ctx_ = nullptr;
  detail::request_id id_{};
};

}  // namespace averbs
