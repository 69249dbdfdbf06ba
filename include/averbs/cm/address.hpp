// SPDX-License-Identifier: MIT
/// @file
/// IP addressing for connection management: `cm::address` (an IP address
/// and a port, as rdma_cm uses them), and resolving an address to the
/// device, port and GID that reach it.
#pragma once

#include <averbs/verbs/device.hpp>
#include <averbs/verbs/types.hpp>

#include <cstdint>
#include <string>
#include <string_view>

struct sockaddr;
struct sockaddr_storage;

namespace averbs::cm {

/// An IPv4 or IPv6 address and a port.  IPv4 is held IPv4-mapped
/// (`::ffff:a.b.c.d`), as RoCEv2 GIDs hold it.  The unspecified address
/// (`0.0.0.0` or `::`) is the wildcard a listener may bind to.
struct address {
  gid ip{};
  std::uint16_t port = 0;

  bool is_ipv4() const noexcept { return ip.is_ipv4_mapped(); }
  /// `0.0.0.0` or `::`.
  bool is_any() const noexcept;
  /// "127.0.0.2:7471", "[fd00::1]:7471".
  std::string to_string() const;
  /// Parses "a.b.c.d:port", "[v6]:port", or an address alone (port 0).
  /// Returns false for anything else.
  static bool parse(std::string_view text, address& out);
  /// From a `sockaddr_in` or `sockaddr_in6`; false for another family.
  static bool from_sockaddr(const sockaddr* sa, address& out) noexcept;
  /// To a `sockaddr_in` (IPv4-mapped addresses) or `sockaddr_in6`;
  /// returns its length.
  unsigned to_sockaddr(sockaddr_storage& out) const noexcept;

  friend bool operator==(const address& a, const address& b) noexcept { return a.ip == b.ip && a.port == b.port; }
};

/// How a local device reaches an IP address.
struct route {
  std::string device;          ///< the device to open (`open_device(ctx, route.device)`)
  std::uint8_t port_num = 1;
  std::uint32_t gid_index = 0; ///< the source GID's index in the device's table
  gid sgid{};                  ///< the source address
  gid dgid{};                  ///< the destination address
  mtu path_mtu = mtu::mtu_1024;  ///< the device port's active MTU
  bool local = false;          ///< the address is the device's own
};

namespace detail {
void start_resolve(context& ctx, const gid& ip, averbs::detail::completer<route> c) noexcept;
void start_open_device(context& ctx, const gid& ip, averbs::detail::completer<device> c) noexcept;
}  // namespace detail

/// Resolves an IP address (v4 or v6) to the device that owns it, or else to
/// the device whose address the host's routing reaches it from.  Devices
/// are those `list_devices()` names; the ones this process has opened come
/// first (an owner, then a route), then those the environment or the
/// configuration file names (a route, then the owner: a client resolving
/// its server's address before opening anything gets its own device, not
/// the server's), then the embedded device.  Only the one chosen is
/// created: another may be another process's, and creating it would bind
/// its address.  Errors: `invalid_argument` for the
/// unspecified or a multicast address, `address_unreachable` when no
/// device owns or reaches it.
template <completion_token<route> Token>
auto async_resolve(context& ctx, const gid& ip, Token&& token) {
  return averbs::detail::initiate<route>(ctx, nullptr, std::forward<Token>(token),
                                         [c = &ctx, ip](averbs::detail::completer<route> done) noexcept {
                                           detail::start_resolve(*c, ip, done);
                                         });
}
route resolve(context& ctx, const gid& ip);
route resolve(context& ctx, const gid& ip, std::error_code& ec) noexcept;

/// Opens the device that owns a local address (creating it if the
/// environment or the configuration file names it).  Errors:
/// `invalid_argument` as `async_resolve`; `address_unreachable` when no
/// device owns it or it cannot be created (its address taken).
template <completion_token<device> Token>
auto async_open_device(context& ctx, const gid& local_ip, Token&& token) {
  return averbs::detail::initiate<device>(ctx, nullptr, std::forward<Token>(token),
                                          [c = &ctx, local_ip](averbs::detail::completer<device> done) noexcept {
                                            detail::start_open_device(*c, local_ip, done);
                                          });
}
device open_device(context& ctx, const gid& local_ip);
device open_device(context& ctx, const gid& local_ip, std::error_code& ec) noexcept;

}  // namespace averbs::cm
