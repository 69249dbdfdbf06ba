// SPDX-License-Identifier: MIT
/// @file
/// `averbs::soft_device`: registers a software RDMA device in this process.
#pragma once

#include <averbs/async/clock.hpp>
#include <averbs/verbs/types.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace averbs {

namespace soft {
class device;
}

struct soft_device_options {
  /// The name `open_device()` finds it by.
  std::string name;
  /// Time source of the device's retransmit and RNR timers (tests pass a
  /// `manual_clock`).  Must outlive the device.  Null: the real clock.
  averbs::clock* clock = nullptr;
  /// The GID table of a loopback device.  Empty: this host's addresses
  /// (IPv4 as ::ffff:a.b.c.d, then IPv6).
  std::vector<gid> gids;
  /// An IPv4 or IPv6 address: the device speaks RoCEv2 over UDP bound to it
  /// (its GID table is this one address).  Empty: the in-process loopback
  /// link only.
  std::string address;
  /// UDP port of RoCEv2 (4791).  Every device that talks to this one must
  /// use the same port.
  std::uint16_t port = 4791;
  /// Check the ICRC of received packets.  Turn off for peers whose IPv4
  /// identification we cannot see (rxe, NICs): see docs/wire.md.
  bool check_icrc = true;
  /// Send through a raw socket when the process may (CAP_NET_RAW), so each
  /// QP's UDP source port carries rxe's entropy; else the bound port.
  bool raw_send = true;
  /// Send runs of equal-sized packets of one flow as one UDP GSO datagram
  /// (with raw_send): the kernel builds the packets.  On the wire each is
  /// a RoCEv2 packet of its own (IPv4 IDs 0, 1, 2 ..., each ICRC to
  /// match); a capture on the loopback or a veth interface shows the run
  /// before the kernel splits it.  See docs/wire.md.
  bool gso = true;
  /// Injected faults, as "drop=0.01,dup=0.01,reorder=0.01,corrupt=0.01,
  /// delay=0.01,delay_us=200,seed=7" (probabilities per packet).
  std::string faults;
  /// The first QP's number; later ones follow.  0: random, so a process
  /// that restarts with the same device (same CA GUID) does not reuse QP
  /// numbers its peers still hold (their CM rejects such a connection as
  /// stale).  A fixed number is for tests; at least 16, at most 0xEFFFFF.
  std::uint32_t first_qpn = 0;
};

/// A software RDMA device hosted in this process, reachable by name while
/// this object lives.  Its queue pairs talk to each other over the loopback
/// link.  Destroying it removes the device: parked requests complete with
/// `errc::device_removed`, QPs go to error, and later calls on its objects
/// fail with `errc::device_removed` (handles stay valid).
///
/// The `embedded` device exists without a soft_device object.
class soft_device {
 public:
  explicit soft_device(const soft_device_options& opts);
  ~soft_device();
  soft_device(const soft_device&) = delete;
  soft_device& operator=(const soft_device&) = delete;

  const std::string& name() const noexcept;

  /// Sets the port state and raises `port_active` / `port_err` (a cable
  /// pulled or plugged).  A port that is not ACTIVE sends and receives
  /// nothing (counted as `dropped`): RC runs out of retries, as on a link
  /// that went down; connection management stops too.
  void set_port_state(port_state s);

  /// Replaces the injected faults (same syntax as the option; "" for none).
  /// Throws `std::system_error(errc::invalid_argument)` on a syntax error.
  void set_faults(const std::string& spec);

  /// Internal: the engine.
  soft::device& engine() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace averbs
