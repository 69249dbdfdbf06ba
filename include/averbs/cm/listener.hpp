// SPDX-License-Identifier: MIT
/// @file
/// `averbs::cm::listener`: waits for connection requests at an address and
/// port (rdma_cm's TCP port space for RC and UC, UDP for UD services).
#pragma once

#include <averbs/cm/address.hpp>
#include <averbs/cm/connector.hpp>
#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/device.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace averbs::cm {

/// rdma_cm's port spaces: which requests a listener hears.
enum class port_space : std::uint16_t {
  tcp = 0x0106,  ///< connected services (REQ): RC and UC
  udp = 0x0111,  ///< datagram services (SIDR_REQ): UD
};

/// A connection request, as `listener::async_get_request` delivers it.
struct connection_request {
  /// Accept or reject through this connector.
  connector conn;
  address local;   ///< the address the peer connected to
  address peer;    ///< the peer's address and (rdma_cm) port
  qp_type type = qp_type::rc;
  /// The requester's private data (REQ: 56 bytes after rdma_cm's header;
  /// SIDR_REQ: 180).
  std::vector<std::byte> private_data;
  /// The peer's READ/atomic resources: how many it accepts from us in
  /// flight, and how many it will issue to us.
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint32_t remote_qpn = 0;
};

class listener;

namespace detail {
struct listener_obj;
void start_listen(const device& d, const address& at, int backlog, port_space ps,
                  averbs::detail::completer<listener> c) noexcept;
void start_get_request(const std::shared_ptr<listener_obj>& l,
                       averbs::detail::completer<connection_request> c) noexcept;
context& context_of(const listener_obj* l);
address local_address_of(const listener_obj* l);
std::size_t cancel_get_requests(const std::shared_ptr<listener_obj>& l) noexcept;
}  // namespace detail

/// A bound listener.  Copies share it; it stops listening with the last
/// copy, or `close()`.  Requests that arrive while no `async_get_request`
/// is parked wait in the backlog; beyond it they are dropped (the requester
/// resends, as a TCP SYN beyond a full backlog).  Requests still in the
/// backlog when the listener closes are rejected ("invalid service ID").
class listener {
 public:
  listener() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }

  /// Completes with the next connection request.  Park as many as you
  /// like; requests are handed out oldest first.  Closing the listener
  /// completes parked ones with `operation_aborted`; a wait whose request
  /// handle was dropped takes none.  On an empty listener it throws
  /// `std::system_error` (`invalid_argument`) at the call: there is no
  /// context to complete on.
  template <completion_token<connection_request> Token>
  auto async_get_request(Token&& token) const {
    return averbs::detail::initiate<connection_request>(
        detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
        [o = obj_](averbs::detail::completer<connection_request> c) noexcept { detail::start_get_request(o, c); });
  }
  connection_request get_request() const {
    return averbs::detail::sync_call<connection_request>([&](auto t) { return async_get_request(t); },
                                                         "averbs::cm::listener::get_request");
  }
  connection_request get_request(std::error_code& ec) const noexcept {
    return averbs::detail::sync_call<connection_request>([&](auto t) { return async_get_request(t); }, ec);
  }

  /// The bound address (with the port chosen when bound to port 0).
  address local_address() const { return detail::local_address_of(obj_.get()); }
  /// Completes every parked `async_get_request` with `operation_aborted`;
  /// returns how many.
  std::size_t cancel() const noexcept { return detail::cancel_get_requests(obj_); }
  /// Stops listening now (as dropping the last copy does).
  void close() noexcept;

 private:
  friend struct averbs::detail::handle_access;
  std::shared_ptr<detail::listener_obj> obj_;
};

/// Binds a listener on `dev` at `at` (the device's address or the wildcard;
/// port 0 picks a free port) with room for `backlog` waiting requests.
/// Errors: `address_in_use` (another listener of this device has that
/// address and port), `address_unreachable` (`at` is not the device's),
/// `invalid_argument` (backlog below 1).
template <completion_token<listener> Token>
auto async_listen(const device& dev, const address& at, int backlog, port_space ps, Token&& token) {
  return averbs::detail::initiate<listener>(dev.get_context(), nullptr, std::forward<Token>(token),
                                            [dev, at, backlog, ps](averbs::detail::completer<listener> c) noexcept {
                                              detail::start_listen(dev, at, backlog, ps, c);
                                            });
}
template <completion_token<listener> Token>
auto async_listen(const device& dev, const address& at, int backlog, Token&& token) {
  return async_listen(dev, at, backlog, port_space::tcp, std::forward<Token>(token));
}
listener listen(const device& dev, const address& at, int backlog = 128, port_space ps = port_space::tcp);
listener listen(const device& dev, const address& at, int backlog, port_space ps, std::error_code& ec) noexcept;

}  // namespace averbs::cm
