// SPDX-License-Identifier: MIT
/// @file
/// `averbs::device`: an open RDMA device, and `open_device()`.
///
/// Devices are found by name.  `embedded` (also the empty name) is the soft
/// device hosted in this process; `soft_device` registers more.  Opening a
/// device makes it a progress source of the context, so every wait on the
/// context also runs the device's timers.
#pragma once

#include <averbs/verbs/cq.hpp>
#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/pd.hpp>
#include <averbs/verbs/types.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace averbs {

/// The devices this process can open, by name: "embedded", the ones it
/// created, and those the environment (`AVERBS_DEVICES`) or the
/// configuration file names.  Listing opens nothing (as
/// `ibv_get_device_list`): a named device binds its address only when
/// opened, and an entry with a bad value is listed and says why when
/// opened (a configuration line without an address is not listed).
std::vector<std::string> list_devices();
/// Why a source of device names cannot be read (`AVERBS_DEVICES`, the
/// configuration file): one message per broken source, naming it and the
/// place, as opening one of its devices would say.  Empty when every
/// source reads (a device's own bad value still shows only when opened).
/// `list_devices()` lists nothing from a broken source; `averbs devices`
/// prints these as warnings.
std::vector<std::string> device_source_errors();

namespace detail {
void start_open_device(context& ctx, const std::string& name, completer<device> c) noexcept;
void start_query_device(const std::shared_ptr<device_obj>& d, completer<device_attr> c) noexcept;
void start_query_port(const std::shared_ptr<device_obj>& d, std::uint8_t port, completer<port_attr> c) noexcept;
void start_query_gid(const std::shared_ptr<device_obj>& d, std::uint8_t port, std::uint32_t index,
                     completer<gid> c) noexcept;
void start_query_pkey(const std::shared_ptr<device_obj>& d, std::uint8_t port, std::uint16_t index,
                      completer<std::uint16_t> c) noexcept;
void start_alloc_pd(const std::shared_ptr<device_obj>& d, completer<pd> c) noexcept;
void start_create_cq(const std::shared_ptr<device_obj>& d, std::uint32_t cqe, completer<cq> c) noexcept;
void start_get_event(const std::shared_ptr<device_obj>& d, completer<async_event> c) noexcept;
request_group* group_of(const device_obj* d) noexcept;
}  // namespace detail

/// An open device.  Copies share the device; it closes with the last copy
/// and the objects created on it.
///
/// Every `async_*` member completes as its token asks (see
/// docs/async.md); the handler runs exactly once, never inside the call.
/// The synchronous twins throw `std::system_error` or report through `ec`.
/// Errors common to all: `errc::invalid_argument` for an empty handle (the
/// operation could not start), `errc::device_removed` after the device went
/// away.
class device {
 public:
  device() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }
  const std::string& name() const;
  context& get_context() const { return detail::context_of(obj_.get()); }

  /// Device attributes (`ibv_query_device`).
  template <completion_token<device_attr> Token>
  auto async_query(Token&& token) const {
    return detail::initiate<device_attr>(get_context(), nullptr, std::forward<Token>(token),
                                         [o = obj_](detail::completer<device_attr> c) noexcept {
                                           detail::start_query_device(o, c);
                                         });
  }
  device_attr query() const {
    return detail::sync_call<device_attr>([&](auto t) { return async_query(t); }, "averbs::device::query");
  }
  device_attr query(std::error_code& ec) const noexcept {
    return detail::sync_call<device_attr>([&](auto t) { return async_query(t); }, ec);
  }

  /// Port attributes (`ibv_query_port`); ports are numbered from 1.
  /// Errors: `invalid_argument` for a port that does not exist.
  template <completion_token<port_attr> Token>
  auto async_query_port(std::uint8_t port, Token&& token) const {
    return detail::initiate<port_attr>(get_context(), nullptr, std::forward<Token>(token),
                                       [o = obj_, port](detail::completer<port_attr> c) noexcept {
                                         detail::start_query_port(o, port, c);
                                       });
  }
  port_attr query_port(std::uint8_t port) const {
    return detail::sync_call<port_attr>([&](auto t) { return async_query_port(port, t); },
                                        "averbs::device::query_port");
  }
  port_attr query_port(std::uint8_t port, std::error_code& ec) const noexcept {
    return detail::sync_call<port_attr>([&](auto t) { return async_query_port(port, t); }, ec);
  }

  /// One GID table entry (`ibv_query_gid`); unused entries are zero.
  template <completion_token<gid> Token>
  auto async_query_gid(std::uint8_t port, std::uint32_t index, Token&& token) const {
    return detail::initiate<gid>(get_context(), nullptr, std::forward<Token>(token),
                                 [o = obj_, port, index](detail::completer<gid> c) noexcept {
                                   detail::start_query_gid(o, port, index, c);
                                 });
  }
  gid query_gid(std::uint8_t port, std::uint32_t index) const {
    return detail::sync_call<gid>([&](auto t) { return async_query_gid(port, index, t); },
                                  "averbs::device::query_gid");
  }
  gid query_gid(std::uint8_t port, std::uint32_t index, std::error_code& ec) const noexcept {
    return detail::sync_call<gid>([&](auto t) { return async_query_gid(port, index, t); }, ec);
  }

  /// One P_Key table entry (`ibv_query_pkey`), in host byte order.
  template <completion_token<std::uint16_t> Token>
  auto async_query_pkey(std::uint8_t port, std::uint16_t index, Token&& token) const {
    return detail::initiate<std::uint16_t>(get_context(), nullptr, std::forward<Token>(token),
                                           [o = obj_, port, index](detail::completer<std::uint16_t> c) noexcept {
                                             detail::start_query_pkey(o, port, index, c);
                                           });
  }
  std::uint16_t query_pkey(std::uint8_t port, std::uint16_t index) const {
    return detail::sync_call<std::uint16_t>([&](auto t) { return async_query_pkey(port, index, t); },
                                            "averbs::device::query_pkey");
  }
  std::uint16_t query_pkey(std::uint8_t port, std::uint16_t index, std::error_code& ec) const noexcept {
    return detail::sync_call<std::uint16_t>([&](auto t) { return async_query_pkey(port, index, t); }, ec);
  }

  /// The used part of the GID table of port 1.
  std::vector<gid> gids() const;
  /// The index of `g` in port `port`'s GID table (`ibv_find_gid_index`).
  /// Errors: `not_found` (not in the table), `invalid_argument` (a port
  /// other than 1, an empty handle).
  std::uint32_t find_gid(std::uint8_t port, const gid& g) const;
  std::uint32_t find_gid(std::uint8_t port, const gid& g, std::error_code& ec) const noexcept;
  /// The address vector that answers a UD receive (`ibv_init_ah_from_wc`),
  /// from its completion and the first 40 bytes of its buffer (the GRH
  /// area): the destination is the sender's GID, the source GID the one the
  /// datagram was sent to, the traffic class the one it came with, the
  /// flow label what the area holds (over IPv6 the datagram's: 0 from
  /// averbs and rxe peers, which send 0), the hop
  /// limit 0xFF (the route's replaces it when the AH is created, as the
  /// kernel does).  For `pd::create_ah`.  Errors: `invalid_argument` (no
  /// `wc_grh` flag, a port other than 1, an area holding no IP header, a
  /// datagram sent to a multicast or broadcast address), `not_found` (sent
  /// to a GID this device does not have).
  ah_attr init_ah_from_wc(std::uint8_t port, const work_completion& wc,
                          std::span<const std::byte, 40> grh) const;
  ah_attr init_ah_from_wc(std::uint8_t port, const work_completion& wc, std::span<const std::byte, 40> grh,
                          std::error_code& ec) const noexcept;
  /// Packet and error counters.
  device_counters counters() const;
  /// The UDP port of the device's RoCEv2 link; 0 for an in-process
  /// (loopback) device.
  std::uint16_t udp_port() const;

  /// Allocates a protection domain (`ibv_alloc_pd`).
  template <completion_token<pd> Token>
  auto async_alloc_pd(Token&& token) const {
    return detail::initiate<pd>(get_context(), nullptr, std::forward<Token>(token),
                                [o = obj_](detail::completer<pd> c) noexcept { detail::start_alloc_pd(o, c); });
  }
  pd alloc_pd() const {
    return detail::sync_call<pd>([&](auto t) { return async_alloc_pd(t); }, "averbs::device::alloc_pd");
  }
  pd alloc_pd(std::error_code& ec) const noexcept {
    return detail::sync_call<pd>([&](auto t) { return async_alloc_pd(t); }, ec);
  }

  /// Creates a completion queue of at least `cqe` entries (`ibv_create_cq`).
  /// Errors: `invalid_argument` when `cqe` is 0 or above `max_cqe`.
  template <completion_token<cq> Token>
  auto async_create_cq(std::uint32_t cqe, Token&& token) const {
    return detail::initiate<cq>(get_context(), nullptr, std::forward<Token>(token),
                                [o = obj_, cqe](detail::completer<cq> c) noexcept { detail::start_create_cq(o, cqe, c); });
  }
  cq create_cq(std::uint32_t cqe) const {
    return detail::sync_call<cq>([&](auto t) { return async_create_cq(cqe, t); }, "averbs::device::create_cq");
  }
  cq create_cq(std::uint32_t cqe, std::error_code& ec) const noexcept {
    return detail::sync_call<cq>([&](auto t) { return async_create_cq(cqe, t); }, ec);
  }

  /// Completes with the next asynchronous event of this device and its
  /// objects (the seeds' IRP-based events; `ibv_get_async_event`).  Park as
  /// many as you like; each event completes one, oldest first.  Each opened
  /// handle has its own events, as each `ibv_context` has: port and device
  /// events reach every handle, a QP's, CQ's or SRQ's only the handle that
  /// created it (the QP's and SRQ's through their PD).
  /// `cancel_events()` and closing the device complete them with
  /// `operation_aborted`.  When the device is removed the first parked
  /// request (or the next one) receives `event_type::device_fatal`; the
  /// others, and every later one, complete with `device_removed`.
  template <completion_token<async_event> Token>
  auto async_get_event(Token&& token) const {
    return detail::initiate<async_event>(get_context(), detail::group_of(obj_.get()), std::forward<Token>(token),
                                         [o = obj_](detail::completer<async_event> c) noexcept {
                                           detail::start_get_event(o, c);
                                         });
  }
  async_event get_event() const {
    return detail::sync_call<async_event>([&](auto t) { return async_get_event(t); },
                                          "averbs::device::get_event");
  }
  async_event get_event(std::error_code& ec) const noexcept {
    return detail::sync_call<async_event>([&](auto t) { return async_get_event(t); }, ec);
  }
  /// Cancels every parked `async_get_event`.
  std::size_t cancel_events() const noexcept;

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::device_obj> obj_;
};

/// Opens a device by name ("" or "embedded": the in-process soft device).
/// Errors: `not_found` for an unknown name.
template <completion_token<device> Token>
auto async_open_device(context& ctx, std::string_view name, Token&& token) {
  return detail::initiate<device>(ctx, nullptr, std::forward<Token>(token),
                                  [c = &ctx, n = std::string(name)](detail::completer<device> done) noexcept {
                                    detail::start_open_device(*c, n, done);
                                  });
}
device open_device(context& ctx, std::string_view name = "embedded");
device open_device(context& ctx, std::string_view name, std::error_code& ec) noexcept;

}  // namespace averbs
