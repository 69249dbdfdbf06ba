// SPDX-License-Identifier: MIT
/// @file
/// `averbs::cq`: a completion queue.
#pragma once

#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/types.hpp>

#include <memory>
#include <span>

namespace averbs {

namespace detail {
void start_cq_notify(const std::shared_ptr<cq_obj>& q, bool solicited_only, completer<void> c) noexcept;
void start_resize_cq(const std::shared_ptr<cq_obj>& q, std::uint32_t cqe, completer<void> c) noexcept;
void start_destroy_cq(const std::shared_ptr<cq_obj>& q, completer<void> c) noexcept;
request_group* group_of(const cq_obj* q) noexcept;
}  // namespace detail

/// A completion queue.  `poll()` is the data path: synchronous, non-blocking,
/// allocation-free.  Notification is an operation whose completion is the
/// notification.
class cq {
 public:
  cq() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }

  /// Moves up to `out.size()` completions into `out`, oldest first, and
  /// returns how many (`ibv_poll_cq`).  Also drives the device (timers,
  /// deferred work).  Returns 0 for an empty, destroyed or removed CQ.
  std::size_t poll(std::span<work_completion> out) const noexcept;

  /// The capacity the CQ was created or resized with.
  std::uint32_t cqe() const noexcept;

  /// The number an `async_event` names this CQ by (`cq_err`); never given
  /// to another CQ of the device (until 2^32 have been created), so an
  /// event read after its CQ was destroyed names no later one; 0 for an
  /// empty or destroyed handle.
  std::uint32_t handle() const noexcept;

  /// Completes when the next completion (`solicited_only`: the next
  /// solicited one) is added to the CQ (`ibv_req_notify_cq` +
  /// `ibv_get_cq_event` as one request).  Completions already queued do not
  /// count.  Any number may be parked; one completion releases all that it
  /// satisfies.  `cancel_notifies()` and destroying the CQ complete them with
  /// `operation_aborted`.  As with `ibv_req_notify_cq`, arm before the last
  /// poll (arm, poll, then wait): with `use_awaitable` the request is made
  /// only when the coroutine suspends, so a completion added by another
  /// thread between its poll and its `co_await` is not counted -- there,
  /// arm with a completion port or a callback and poll again after.  On a
  /// CQ that overflowed it fails at once with `invalid_state`.
  template <completion_token<void> Token>
  auto async_notify(bool solicited_only, Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), detail::group_of(obj_.get()),
                                  std::forward<Token>(token),
                                  [o = obj_, solicited_only](detail::completer<void> c) noexcept {
                                    detail::start_cq_notify(o, solicited_only, c);
                                  });
  }
  /// Cancels every pending `async_notify`; returns how many.
  std::size_t cancel_notifies() const noexcept;

  /// Resizes (`ibv_resize_cq`).  Errors: `invalid_argument` if `cqe` is 0,
  /// above the device limit, or below the completions queued now.
  template <completion_token<void> Token>
  auto async_resize(std::uint32_t cqe, Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_, cqe](detail::completer<void> c) noexcept { detail::start_resize_cq(o, cqe, c); });
  }
  void resize(std::uint32_t cqe) const {
    detail::sync_call<void>([&](auto t) { return async_resize(cqe, t); }, "averbs::cq::resize");
  }
  void resize(std::uint32_t cqe, std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_resize(cqe, t); }, ec);
  }

  /// Destroys (`ibv_destroy_cq`).  Errors: `busy` while a QP uses it.
  template <completion_token<void> Token>
  auto async_destroy(Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_](detail::completer<void> c) noexcept { detail::start_destroy_cq(o, c); });
  }
  void destroy() const { detail::sync_call<void>([&](auto t) { return async_destroy(t); }, "averbs::cq::destroy"); }
  void destroy(std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_destroy(t); }, ec);
  }

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::cq_obj> obj_;
};

}  // namespace averbs
