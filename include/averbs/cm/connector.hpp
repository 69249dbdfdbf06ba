// SPDX-License-Identifier: MIT
/// @file
/// `averbs::cm::connector`: one connection's endpoint, NetworkDirect style.
///
/// A connector connects, accepts, rejects and disconnects one queue pair.
/// Each of those is a single request whose phases drive the whole exchange
/// (IB CM over QP1: REQ, REP, RTU, REJ, MRA, DREQ, DREP; SIDR for UD) and
/// the QP's state changes: `async_connect` takes the QP from RESET (or
/// INIT) through INIT, RTR and RTS; `async_accept` does the same on the
/// passive side; `async_disconnect` moves it to ERR.  Progress is made by
/// whoever waits on the device's context (the library starts no threads).
///
/// The wire carries what a kernel rdma_cm peer expects: REQ private data
/// starts with rdma_cm's 36-byte IP header, service IDs are rdma_cm's TCP
/// (RC, UC) and UDP (UD) port spaces.
#pragma once

#include <averbs/cm/address.hpp>
#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/device.hpp>
#include <averbs/verbs/qp.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace averbs::cm {

/// Private data each message can carry (IBTA 12.6, minus rdma_cm's IP
/// header in a REQ).  Received private data is always the message's whole
/// field, zero-padded, as on the wire.
inline constexpr std::size_t max_connect_private_data = 56;   // REQ (92 - 36)
inline constexpr std::size_t max_accept_private_data = 196;   // REP
inline constexpr std::size_t max_reject_private_data = 148;   // REJ
inline constexpr std::size_t max_ud_connect_private_data = 180;  // SIDR_REQ (216 - 36)
inline constexpr std::size_t max_ud_accept_private_data = 136;   // SIDR_REP

/// Connection parameters.  Timeouts use the IBTA encoding: 4.096 us * 2^t.
struct conn_params {
  /// RDMA READ and atomic operations this side accepts in flight from the
  /// peer (its QP's `max_dest_rd_atomic`; ND's inbound read limit).
  std::uint8_t responder_resources = 16;
  /// RDMA READ and atomic operations this side issues in flight (its QP's
  /// `max_rd_atomic`, capped by the peer's responder resources).
  std::uint8_t initiator_depth = 16;
  /// Transport retries of the QPs (`retry_cnt`; REQ only: both sides use
  /// the requester's value).
  std::uint8_t retry_count = 7;
  /// RNR retries the *peer* may make towards this side (7 = infinite).
  std::uint8_t rnr_retry_count = 7;
  /// This side's RNR NAK timer (`min_rnr_timer`; 12 = 0.64 ms).
  std::uint8_t min_rnr_timer = 12;
  /// Local ACK timeout of the QPs (`timeout`; 14 = 67 ms).
  std::uint8_t ack_timeout = 14;
  /// How long the CM waits for the peer's answer before resending
  /// (16 = 268 ms), and how many times it resends.
  std::uint8_t cm_response_timeout = 16;
  std::uint8_t max_cm_retries = 10;
  /// UD: the Q_Key (rdma_cm's RDMA_UDP_QKEY).
  std::uint32_t qkey = 0x01234567;
};

/// What a completed `async_connect` reports.
struct connect_result {
  /// The peer's private data (REP: 196 bytes; SIDR_REP: 136).
  std::vector<std::byte> private_data;
  /// Negotiated: READs/atomics the peer accepts from us in flight, and
  /// those it may issue to us.
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  /// The peer's QP number, and for UD its Q_Key.
  std::uint32_t remote_qpn = 0;
  std::uint32_t remote_qkey = 0;
};

/// Where the connection stands.
enum class conn_state : std::uint8_t {
  idle,          ///< nothing started
  connecting,    ///< REQ or SIDR_REQ sent, no answer yet
  requested,     ///< passive: a request waiting for accept or reject
  accepting,     ///< passive: REP sent, waiting for RTU
  established,
  disconnecting, ///< DREQ sent or received
  timewait,
  closed,        ///< rejected, timed out, aborted, or after timewait
};

namespace detail {
struct connector_obj;
void start_connect(const std::shared_ptr<connector_obj>& c, const qp& q, const address& to,
                   std::vector<std::byte> pdata, const conn_params& p,
                   averbs::detail::completer<connect_result> done) noexcept;
void start_accept(const std::shared_ptr<connector_obj>& c, const qp& q, std::vector<std::byte> pdata,
                  const conn_params& p, averbs::detail::completer<void> done) noexcept;
void start_reject(const std::shared_ptr<connector_obj>& c, std::vector<std::byte> pdata,
                  averbs::detail::completer<void> done) noexcept;
void start_disconnect(const std::shared_ptr<connector_obj>& c, averbs::detail::completer<void> done) noexcept;
void start_notify_disconnect(const std::shared_ptr<connector_obj>& c, averbs::detail::completer<void> done) noexcept;
context& context_of(const connector_obj* c);
std::shared_ptr<connector_obj> make_connector(const device& d);
}  // namespace detail

/// One connection endpoint.  Copies share it.  When the last copy goes, an
/// established connection is disconnected (DREQ, QP to ERR) and pending
/// requests complete with `operation_aborted`.
///
/// Errors every request may report: `invalid_argument` for a bad argument,
/// `invalid_state` when the connector or QP is in the wrong state,
/// `device_removed`, and `operation_aborted` when the QP or the connector
/// was destroyed while it was pending.  An empty connector has no context
/// to complete on: its `async_*` calls throw `std::system_error`
/// (`invalid_argument`) at the call, whatever the token.
class connector {
 public:
  connector() noexcept = default;
  /// A connector on `dev`, for `async_connect`.  (Passive connectors come
  /// from `listener::async_get_request`.)
  explicit connector(const device& dev) : obj_(detail::make_connector(dev)) {}
  explicit operator bool() const noexcept { return obj_ != nullptr; }

  /// Connects `q` (RC or UC, in RESET or INIT; UD for a SIDR lookup) to
  /// the listener at `to`, carrying `private_data`: sends REQ, and on REP
  /// moves the QP to RTR and RTS and sends RTU.  Completes with the peer's
  /// answer.  Errors: `connection_refused` (nothing listens there),
  /// `connection_rejected` (the application rejected: `private_data()`
  /// holds its data, `reject_reason()` the IBTA reason), `timed_out`,
  /// `address_unreachable` (no route from the QP's device), and
  /// `invalid_argument` for private data above `max_connect_private_data`
  /// (`max_ud_connect_private_data` for UD).  On failure the QP is left in
  /// INIT (UD: RTS), ready for another try -- except after `disconnect()`
  /// during the connect, or a REP the QP could not take: then it is in ERR.
  template <completion_token<connect_result> Token>
  auto async_connect(const qp& q, const address& to, std::span<const std::byte> private_data,
                     const conn_params& params, Token&& token) const {
    return averbs::detail::initiate<connect_result>(
        detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
        [o = obj_, q, to, pd = std::vector<std::byte>(private_data.begin(), private_data.end()),
         params](averbs::detail::completer<connect_result> c) mutable noexcept {
          detail::start_connect(o, q, to, std::move(pd), params, c);
        });
  }
  template <completion_token<connect_result> Token>
  auto async_connect(const qp& q, const address& to, std::span<const std::byte> private_data, Token&& token) const {
    return async_connect(q, to, private_data, conn_params{}, std::forward<Token>(token));
  }
  connect_result connect(const qp& q, const address& to, std::span<const std::byte> private_data = {},
                         const conn_params& params = {}) const {
    return averbs::detail::sync_call<connect_result>(
        [&](auto t) { return async_connect(q, to, private_data, params, t); }, "averbs::cm::connector::connect");
  }
  connect_result connect(const qp& q, const address& to, std::span<const std::byte> private_data,
                         const conn_params& params, std::error_code& ec) const noexcept {
    return averbs::detail::sync_call<connect_result>(
        [&](auto t) { return async_connect(q, to, private_data, params, t); }, ec);
  }

  /// Accepts the request this connector came with: moves `q` (RESET or
  /// INIT, the request's transport) to RTR and RTS, sends REP with
  /// `private_data`, and completes when the RTU arrives (UD: sends SIDR_REP
  /// and completes at once).  Errors: `timed_out` (no RTU after the
  /// retries; the QP goes to ERR), `timed_out` or `connection_rejected`
  /// (the peer gave up on the request: its REJ said "timeout", or another
  /// reason), `invalid_argument` for private data above
  /// `max_accept_private_data` (`max_ud_accept_private_data`).
  template <completion_token<void> Token>
  auto async_accept(const qp& q, std::span<const std::byte> private_data, const conn_params& params,
                    Token&& token) const {
    return averbs::detail::initiate<void>(
        detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
        [o = obj_, q, pd = std::vector<std::byte>(private_data.begin(), private_data.end()),
         params](averbs::detail::completer<void> c) mutable noexcept {
          detail::start_accept(o, q, std::move(pd), params, c);
        });
  }
  template <completion_token<void> Token>
  auto async_accept(const qp& q, std::span<const std::byte> private_data, Token&& token) const {
    return async_accept(q, private_data, conn_params{}, std::forward<Token>(token));
  }
  void accept(const qp& q, std::span<const std::byte> private_data = {}, const conn_params& params = {}) const {
    averbs::detail::sync_call<void>([&](auto t) { return async_accept(q, private_data, params, t); },
                                    "averbs::cm::connector::accept");
  }
  void accept(const qp& q, std::span<const std::byte> private_data, const conn_params& params,
              std::error_code& ec) const noexcept {
    averbs::detail::sync_call<void>([&](auto t) { return async_accept(q, private_data, params, t); }, ec);
  }

  /// Rejects the request this connector came with (REJ "consumer defined",
  /// or SIDR_REP "rejected"), carrying `private_data`.  Completes when the
  /// message is sent.  Errors: `invalid_argument` for private data above
  /// `max_reject_private_data` (`max_ud_accept_private_data`); for a
  /// request the peer gave up on, what `accept()` would say (`timed_out`
  /// or `connection_rejected`), and nothing is sent.
  template <completion_token<void> Token>
  auto async_reject(std::span<const std::byte> private_data, Token&& token) const {
    return averbs::detail::initiate<void>(
        detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
        [o = obj_, pd = std::vector<std::byte>(private_data.begin(), private_data.end())](
            averbs::detail::completer<void> c) mutable noexcept { detail::start_reject(o, std::move(pd), c); });
  }
  void reject(std::span<const std::byte> private_data = {}) const {
    averbs::detail::sync_call<void>([&](auto t) { return async_reject(private_data, t); },
                                    "averbs::cm::connector::reject");
  }
  void reject(std::span<const std::byte> private_data, std::error_code& ec) const noexcept {
    averbs::detail::sync_call<void>([&](auto t) { return async_reject(private_data, t); }, ec);
  }

  /// Disconnects the connector's QP: sends DREQ, moves the QP to ERR and
  /// completes once its outstanding work has completed with
  /// `wr_flush_err` (the DREQ/DREP exchange and timewait go on behind).
  /// A connect still in progress is abandoned (it completes with
  /// `operation_aborted`).  Completes at once when already disconnected.
  /// Errors: `not_connected` if nothing was ever connected.
  template <completion_token<void> Token>
  auto async_disconnect(Token&& token) const {
    return averbs::detail::initiate<void>(
        detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
        [o = obj_](averbs::detail::completer<void> c) noexcept { detail::start_disconnect(o, c); });
  }
  void disconnect() const {
    averbs::detail::sync_call<void>([&](auto t) { return async_disconnect(t); }, "averbs::cm::connector::disconnect");
  }
  void disconnect(std::error_code& ec) const noexcept {
    averbs::detail::sync_call<void>([&](auto t) { return async_disconnect(t); }, ec);
  }

  /// Completes when the connection ends: with success when the peer
  /// disconnects (DREQ) or this side does, with `connection_reset` when the
  /// QP fails without one (the peer vanished: retries exhausted).  Errors:
  /// `not_connected` if no connection was ever established or accepted.
  template <completion_token<void> Token>
  auto async_notify_disconnect(Token&& token) const {
    return averbs::detail::initiate<void>(
        detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
        [o = obj_](averbs::detail::completer<void> c) noexcept { detail::start_notify_disconnect(o, c); });
  }
  void notify_disconnect() const {
    averbs::detail::sync_call<void>([&](auto t) { return async_notify_disconnect(t); },
                                    "averbs::cm::connector::notify_disconnect");
  }
  void notify_disconnect(std::error_code& ec) const noexcept {
    averbs::detail::sync_call<void>([&](auto t) { return async_notify_disconnect(t); }, ec);
  }

  // --- queries (synchronous, like ND's GetLocalAddress and friends) ---------
  conn_state state() const;
  address local_address() const;
  address peer_address() const;
  /// The private data of the last message received from the peer (REQ,
  /// REP, REJ, SIDR_REP), whole field.
  std::vector<std::byte> private_data() const;
  /// The reason of a REJ received (IBTA table 112; 28 = consumer defined),
  /// 0 if none.
  std::uint16_t reject_reason() const;
  /// The address vector that reaches the peer (for a UD AH, or to check).
  ah_attr peer_ah() const;

 private:
  friend struct averbs::detail::handle_access;
  std::shared_ptr<detail::connector_obj> obj_;
};

}  // namespace averbs::cm
