// SPDX-License-Identifier: MIT
/// @file
/// `averbs::srq`: a shared receive queue.
#pragma once

#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/types.hpp>

#include <memory>
#include <span>

namespace averbs {

namespace detail {
void start_modify_srq(const std::shared_ptr<srq_obj>& s, srq_attr attr, std::uint32_t mask,
                      completer<void> c) noexcept;
void start_query_srq(const std::shared_ptr<srq_obj>& s, completer<srq_attr> c) noexcept;
void start_destroy_srq(const std::shared_ptr<srq_obj>& s, completer<void> c) noexcept;
}  // namespace detail

/// A shared receive queue.  Arm the limit with `modify({.srq_limit = n},
/// static_cast<std::uint32_t>(srq_attr_mask::limit))`; when fewer than n receives remain posted the
/// device raises `event_type::srq_limit_reached` once and disarms.
class srq {
 public:
  srq() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }

  /// Posts receives (`ibv_post_srq_recv`).  Errors: `invalid_argument` (too
  /// many SGEs), `message_too_long` (SGEs over 2 GiB together),
  /// `queue_full`; `*bad` is the index of the first not posted.
  std::error_code post_recv(std::span<const recv_wr> wrs, std::size_t* bad = nullptr) const noexcept;
  std::error_code post_recv(const recv_wr& wr) const noexcept { return post_recv({&wr, 1}); }

  /// The number an `async_event` names this SRQ by (`srq_limit_reached`);
  /// never given to another SRQ or CQ of the device (until 2^32 have been
  /// created), so an event read after its SRQ was destroyed names no later
  /// one; 0 for an empty or destroyed handle.
  std::uint32_t handle() const noexcept;

  /// `ibv_modify_srq`: `srq_attr_mask::max_wr` resizes, `limit` arms the
  /// limit, a mask of 0 changes nothing.  Errors: `invalid_argument` (limit
  /// above max_wr, a size below the receives posted, an unknown mask bit).
  template <completion_token<void> Token>
  auto async_modify(const srq_attr& attr, std::uint32_t mask, Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_, attr, mask](detail::completer<void> c) noexcept {
                                    detail::start_modify_srq(o, attr, mask, c);
                                  });
  }
  void modify(const srq_attr& attr, std::uint32_t mask) const {
    detail::sync_call<void>([&](auto t) { return async_modify(attr, mask, t); }, "averbs::srq::modify");
  }
  void modify(const srq_attr& attr, std::uint32_t mask, std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_modify(attr, mask, t); }, ec);
  }

  template <completion_token<srq_attr> Token>
  auto async_query(Token&& token) const {
    return detail::initiate<srq_attr>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                      [o = obj_](detail::completer<srq_attr> c) noexcept { detail::start_query_srq(o, c); });
  }
  srq_attr query() const {
    return detail::sync_call<srq_attr>([&](auto t) { return async_query(t); }, "averbs::srq::query");
  }
  srq_attr query(std::error_code& ec) const noexcept {
    return detail::sync_call<srq_attr>([&](auto t) { return async_query(t); }, ec);
  }

  /// Destroys (`ibv_destroy_srq`).  Errors: `busy` while QPs use it.
  template <completion_token<void> Token>
  auto async_destroy(Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_](detail::completer<void> c) noexcept { detail::start_destroy_srq(o, c); });
  }
  void destroy() const { detail::sync_call<void>([&](auto t) { return async_destroy(t); }, "averbs::srq::destroy"); }
  void destroy(std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_destroy(t); }, ec);
  }

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::srq_obj> obj_;
};

}  // namespace averbs
