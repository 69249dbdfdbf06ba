// SPDX-License-Identifier: MIT
// Out-of-band exchange over TCP, as ibv_rc_pingpong and perftest do it: the
// two sides swap what their queue pairs need (QPN, PSN, GID, R_Key and
// address of a buffer) before any RDMA traffic, and use the socket again
// to agree that a test is over.
#pragma once

#include <averbs/verbs/types.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace averbs::perf {

/// What one side tells the other.  Fixed layout, network byte order on the
/// wire (see oob.cpp).
struct peer_info {
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  gid g{};
  std::uint32_t rkey = 0;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
};

class oob {
 public:
  oob() = default;
  ~oob();
  oob(oob&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  oob& operator=(oob&& o) noexcept;
  oob(const oob&) = delete;

  /// Server: listens on `port` (0: any; `bound_port()` tells) at `bind_addr`.
  static oob listen(const std::string& bind_addr, std::uint16_t port);
  /// Accepts one client (the listening socket is closed).
  oob accept(std::chrono::milliseconds timeout) const;
  /// Client: connects, retrying until `timeout` (the server may still be
  /// starting).
  static oob connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);

  std::uint16_t bound_port() const;
  void send_info(const peer_info& i) const;
  peer_info recv_info() const;
  /// A one-word message: "ready", "done", a checksum.
  void send_word(std::uint64_t w) const;
  std::uint64_t recv_word() const;
  /// True if a message from the peer is waiting (does not block).
  bool readable() const;

 private:
  explicit oob(int fd) : fd_(fd) {}
  void send_all(const void* p, std::size_t n) const;
  void recv_all(void* p, std::size_t n) const;
  int fd_ = -1;
};

}  // namespace averbs::perf
