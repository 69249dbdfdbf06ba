// SPDX-License-Identifier: MIT
// The engine's side of the general services interface (QP1): where the
// management datagrams that arrive for QP1 go, and how the agent that owns
// them (the connection manager) learns what happens to the QPs it drives.
//
// The engine knows nothing of the CM protocol.  It hands every well-formed
// QP1 datagram to its agent and tells the agent when a QP the agent marked
// (`qp_t::cm`) enters the error state or is destroyed.  Every call is made
// with the device lock held, from inside the engine.
#pragma once

#include <averbs/verbs/types.hpp>

#include <cstdint>
#include <memory>
#include <span>

namespace averbs::soft {

class device;
struct qp_t;

/// A management datagram received on QP1.
struct mad_in {
  gid src;                 // the sender's address (from the IP header)
  gid dst;                 // ours, as the sender addressed it
  std::uint32_t src_qpn;   // DETH source QP (1 for a CM)
  std::uint8_t hop_limit;
  std::uint8_t traffic_class;
  std::span<const std::byte> mad;  // exactly 256 bytes
};

enum class qp_note : std::uint8_t {
  error,      // the QP entered the error state (by the engine or a modify)
  destroyed,  // the QP is about to be freed
};

class gsi_agent {
 public:
  virtual ~gsi_agent() = default;
  virtual void on_mad(const mad_in& m) noexcept = 0;
  virtual void on_qp(qp_t* qp, qp_note n) noexcept = 0;
  /// The device was removed: fail everything parked.
  virtual void on_fatal() noexcept = 0;
  /// Called at the start of the next pass after the agent asked for it
  /// (device::recover_agent_later()), with no QP half-way through anything.
  virtual void recover() noexcept {}
};

/// Implemented by the connection manager (src/cm).
std::unique_ptr<gsi_agent> make_cm_agent(device& d);

}  // namespace averbs::soft
