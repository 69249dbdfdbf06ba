// SPDX-License-Identifier: MIT
/// @file
/// `averbs::soft_device`: registers a software RDMA device in this process.
#pragma once

#include <averbs/async/clock.hpp>
#include <averbs/verbs/types.hpp>

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
  /// The GID table.  Empty: this host's addresses (IPv4 as ::ffff:a.b.c.d,
  /// then IPv6).
  std::vector<gid> gids;
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
  /// pulled or plugged).
  void set_port_state(port_state s);

  /// Internal: the engine.
  soft::device& engine() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace averbs
