// SPDX-License-Identifier: MIT
/// @file
/// `averbs::qp`: a queue pair.
#pragma once

#include <averbs/verbs/cq.hpp>
#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/srq.hpp>
#include <averbs/verbs/types.hpp>

#include <memory>
#include <span>

namespace averbs {

/// `struct ibv_qp_init_attr`.  The CQs and the SRQ are handles (copies).
struct qp_init_attr {
  cq send_cq;
  cq recv_cq;
  averbs::srq srq;
  qp_cap cap{};
  qp_type type = qp_type::rc;
  bool sq_sig_all = false;
};

namespace detail {
void start_modify_qp(const std::shared_ptr<qp_obj>& q, const qp_attr& attr, std::uint32_t mask,
                     completer<void> c) noexcept;
void start_query_qp(const std::shared_ptr<qp_obj>& q, completer<qp_attr> c) noexcept;
void start_destroy_qp(const std::shared_ptr<qp_obj>& q, completer<void> c) noexcept;
}  // namespace detail

/// A queue pair.  Control verbs are operations; `post_send` and `post_recv`
/// are the data path: synchronous, non-blocking, allocation-free, reporting
/// through their return value.
class qp {
 public:
  qp() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }
  std::uint32_t num() const noexcept;
  qp_type type() const noexcept;

  /// Moves the QP through the IBTA state table and sets attributes
  /// (`ibv_modify_qp`).  The mask must hold exactly the attributes the
  /// transition requires plus any it allows.  Errors: `invalid_argument`
  /// (mask or value), `not_supported` (a mask bit past the standard
  /// attributes; on-demand paging or FLUSH access), `invalid_state` (a
  /// transition the table does not list).  Nothing changes on error.
  template <completion_token<void> Token>
  auto async_modify(const qp_attr& attr, std::uint32_t mask, Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_, attr, mask](detail::completer<void> c) noexcept {
                                    detail::start_modify_qp(o, attr, mask, c);
                                  });
  }
  void modify(const qp_attr& attr, std::uint32_t mask) const {
    detail::sync_call<void>([&](auto t) { return async_modify(attr, mask, t); }, "averbs::qp::modify");
  }
  void modify(const qp_attr& attr, std::uint32_t mask, std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_modify(attr, mask, t); }, ec);
  }

  /// Current attributes (`ibv_query_qp`); `sq_psn`/`rq_psn` are the next
  /// PSNs to send and to expect.
  template <completion_token<qp_attr> Token>
  auto async_query(Token&& token) const {
    return detail::initiate<qp_attr>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                     [o = obj_](detail::completer<qp_attr> c) noexcept { detail::start_query_qp(o, c); });
  }
  qp_attr query() const {
    return detail::sync_call<qp_attr>([&](auto t) { return async_query(t); }, "averbs::qp::query");
  }
  qp_attr query(std::error_code& ec) const noexcept {
    return detail::sync_call<qp_attr>([&](auto t) { return async_query(t); }, ec);
  }
  /// The QP state, from the last modify or error (no query needed).
  qp_state state() const noexcept;

  /// Posts send work requests (`ibv_post_send`).  Errors (nothing after
  /// `*bad` was posted): `invalid_state` (RESET, INIT, RTR),
  /// `invalid_argument` (opcode not valid for the QP type, too many SGEs,
  /// inline too long, atomic not 8 bytes or not 8-byte aligned, missing AH
  /// or window), `message_too_long`, `queue_full`.
  std::error_code post_send(std::span<const send_wr> wrs, std::size_t* bad = nullptr) const noexcept;
  std::error_code post_send(const send_wr& wr) const noexcept { return post_send({&wr, 1}); }

  /// Posts receive work requests (`ibv_post_recv`).  Errors:
  /// `invalid_state` (RESET), `invalid_argument` (SRQ attached, too many
  /// SGEs), `message_too_long` (SGEs over 2 GiB together), `queue_full`.
  std::error_code post_recv(std::span<const recv_wr> wrs, std::size_t* bad = nullptr) const noexcept;
  std::error_code post_recv(const recv_wr& wr) const noexcept { return post_recv({&wr, 1}); }

  /// Binds a type-1 window (`ibv_bind_mw`): posts the bind and returns the
  /// window's new R_Key at once; the bind itself completes in order
  /// (`wc_opcode::bind_mw`, or `mw_bind_err`).  Errors as `post_send`,
  /// `invalid_argument` for a type-2 window, a zero-based bind or a range
  /// without a region (lkey 0), and `permission_denied` for a region in
  /// another PD than the window's (as `ibv_bind_mw`).
  std::error_code bind_mw(const mw& w, std::uint64_t wr_id, std::uint32_t flags, const mw_bind_info& info,
                          std::uint32_t* new_rkey = nullptr) const noexcept;

  /// Destroys (`ibv_destroy_qp`).  Outstanding work is discarded without
  /// completions and the QP's completions still in its CQs are removed, as
  /// on a move to RESET (mlx5); move the QP to ERR and drain its CQs first
  /// to see every request complete.  (Receives an SRQ gave it keep their
  /// completions, and one taken for an unfinished message completes
  /// flushed.)
  template <completion_token<void> Token>
  auto async_destroy(Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_](detail::completer<void> c) noexcept { detail::start_destroy_qp(o, c); });
  }
  void destroy() const { detail::sync_call<void>([&](auto t) { return async_destroy(t); }, "averbs::qp::destroy"); }
  void destroy(std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_destroy(t); }, ec);
  }

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::qp_obj> obj_;
};

}  // namespace averbs
