// SPDX-License-Identifier: MIT
// Out-of-band exchange over TCP, as ibv_rc_pingpong and perftest do it: the
// two sides swap what their queue pairs need (QPN, PSN, GID, R_Key and
// address of a buffer) before any RDMA traffic, and use the socket again
// to agree that a test is over.
//
// Every receive has a deadline (`set_timeout`, 60 s unless told): a peer
// that stops talking, or something that is not our peer at all, ends the
// run with an error instead of hanging it.
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

/// What `averbs perf` tells its peer before anything else, so that two
/// ends configured differently (another test, other sizes) stop with a
/// clear message instead of deadlocking, and so that they agree on the
/// path MTU and the READ/atomic depth (each takes the smaller of the two,
/// as perftest does).  The first bytes are a magic and a version: a
/// program that is not `averbs perf` is told apart from one that is.
struct test_params {
  std::uint32_t test = 0;       // perf::test_kind
  std::uint32_t mtu_bytes = 0;  // 256 .. 4096
  std::uint32_t outs = 0;       // outstanding READs / atomics
  std::uint32_t all_sizes = 0;  // 1: the -a sweep
  std::uint64_t size = 0;       // the one size, when not all_sizes
  std::uint64_t iters = 0;
  std::uint32_t duration = 0;  // seconds (-D), 0: iterations
  std::uint32_t roce_port = 0;  // the device's RoCEv2 UDP port: both ends must use one
};

class oob {
 public:
  static constexpr std::chrono::milliseconds default_timeout{60'000};

  oob() = default;
  ~oob();
  oob(oob&& o) noexcept : fd_(o.fd_), timeout_(o.timeout_) { o.fd_ = -1; }
  oob& operator=(oob&& o) noexcept;
  oob(const oob&) = delete;

  /// Server: listens on `port` (0: any; `bound_port()` tells) at `bind_addr`.
  static oob listen(const std::string& bind_addr, std::uint16_t port);
  /// Accepts one client.  The listening socket stays open: a second
  /// client waits in the kernel's backlog until it is closed (both servers
  /// close it once their client came, so a second is refused).
  oob accept(std::chrono::milliseconds timeout) const;
  /// Client: connects to the first of `host`'s addresses that answers,
  /// retrying until `timeout` (the server may still be starting).  No one
  /// attempt blocks past the deadline.
  static oob connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);

  std::uint16_t bound_port() const;
  /// How long a receive waits for the peer before it fails.
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }

  void send_info(const peer_info& i) const;
  peer_info recv_info() const;
  void send_params(const test_params& p) const;
  /// Fails with a specific message when the peer is not `averbs perf` or
  /// speaks another version of this exchange.
  test_params recv_params() const;
  /// A one-word message: "ready", "done", a checksum.
  void send_word(std::uint64_t w) const;
  std::uint64_t recv_word() const;
  /// Receives a word that must be `want`; `what` names the step in the
  /// error otherwise.
  void expect_word(std::uint64_t want, const char* what) const;
  /// True if a message from the peer (or its end of the stream) is waiting
  /// (does not block).
  bool readable() const;
  /// True once the peer has closed its end or the connection was reset,
  /// whether or not a message of its is still unread (does not block).
  bool peer_closed() const;

 private:
  explicit oob(int fd) : fd_(fd) {}
  void send_all(const void* p, std::size_t n) const;
  void recv_all(void* p, std::size_t n) const;
  /// Receives `n` bytes by `until`; `of` is the whole message's size, for
  /// the error (a message read in parts, each checked as it comes).
  void recv_all(void* p, std::size_t n, std::chrono::steady_clock::time_point until, std::size_t got_before,
                std::size_t of) const;
  int fd_ = -1;
  std::chrono::milliseconds timeout_ = default_timeout;
};

}  // namespace averbs::perf
