// SPDX-License-Identifier: MIT
// InfiniBand communication management MADs (IBTA vol. 1 ch. 12) as they
// travel on QP1 over RoCEv2, and rdma_cm's IP addressing inside them
// (IBTA annex A11): the codec only, no state.
//
// Every message is one 256-byte MAD: a 24-byte common header, then the
// message body at offset 24.  Multi-byte fields are big-endian; bit fields
// are packed as ibta_vol1_c12.h lays them out.  Decoders validate the
// header (base version 1, class 0x07, class version 2, method Send) and
// never read outside the 256 bytes; fields the codec does not interpret
// (reserved bits) are ignored on decode and written as zero.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace averbs::wire::cm {

inline constexpr std::size_t mad_size = 256;
inline constexpr std::size_t mad_header_size = 24;
inline constexpr std::uint8_t mgmt_class_cm = 0x07;
inline constexpr std::uint8_t cm_class_version = 2;
inline constexpr std::uint8_t method_send = 0x03;
inline constexpr std::uint32_t gsi_qpn = 1;

enum class attr : std::uint16_t {
  class_port_info = 0x0001,
  req = 0x0010,
  mra = 0x0011,
  rej = 0x0012,
  rep = 0x0013,
  rtu = 0x0014,
  dreq = 0x0015,
  drep = 0x0016,
  sidr_req = 0x0017,
  sidr_rep = 0x0018,
  lap = 0x0019,
  apr = 0x001A,
};

/// The MAD common header (IBTA 13.4.3).
struct mad_header {
  std::uint8_t base_version = 1;
  std::uint8_t mgmt_class = mgmt_class_cm;
  std::uint8_t class_version = cm_class_version;
  std::uint8_t method = method_send;
  std::uint16_t status = 0;
  std::uint16_t class_specific = 0;
  std::uint64_t tid = 0;
  attr attr_id = attr::req;
  std::uint32_t attr_mod = 0;
};

using gid_bytes = std::array<std::byte, 16>;

/// A path in a REQ (primary or alternate), IBTA 12.6.5.
struct path {
  std::uint16_t local_lid = 0xFFFF;   // rdma_cm sends 0xFFFF for routed RoCE
  std::uint16_t remote_lid = 0xFFFF;
  gid_bytes local_gid{};
  gid_bytes remote_gid{};
  std::uint32_t flow_label = 0;       // 20 bits
  std::uint8_t packet_rate = 0;       // 6 bits
  std::uint8_t traffic_class = 0;
  std::uint8_t hop_limit = 64;
  std::uint8_t sl = 0;                // 4 bits
  bool subnet_local = false;
  std::uint8_t local_ack_timeout = 0; // 5 bits
};

struct req {
  std::uint32_t local_comm_id = 0;
  std::uint32_t vendor_id = 0;        // 24 bits (ECE)
  std::uint64_t service_id = 0;
  std::uint64_t local_ca_guid = 0;
  std::uint32_t local_qkey = 0;
  std::uint32_t local_qpn = 0;        // 24 bits
  std::uint8_t responder_resources = 0;
  std::uint32_t local_eecn = 0;       // 24 bits
  std::uint8_t initiator_depth = 0;
  std::uint32_t remote_eecn = 0;      // 24 bits
  std::uint8_t remote_cm_response_timeout = 0;  // 5 bits
  std::uint8_t transport_type = 0;    // 2 bits: 0 RC, 1 UC, 3 XRC
  bool e2e_flow_control = false;
  std::uint32_t starting_psn = 0;     // 24 bits
  std::uint8_t local_cm_response_timeout = 0;   // 5 bits
  std::uint8_t retry_count = 0;       // 3 bits
  std::uint16_t pkey = 0xFFFF;
  std::uint8_t path_mtu = 0;          // 4 bits (IB MTU enum)
  bool rdc_exists = false;
  std::uint8_t rnr_retry_count = 0;   // 3 bits
  std::uint8_t max_cm_retries = 0;    // 4 bits
  bool srq = false;
  std::uint8_t extended_transport = 0;  // 3 bits
  path primary{};
  bool has_alternate = false;         // the alternate path is all zero when absent
  path alternate{};
  std::array<std::byte, 92> private_data{};
};

struct rep {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::uint32_t local_qkey = 0;
  std::uint32_t local_qpn = 0;        // 24 bits
  std::uint32_t local_eecn = 0;       // 24 bits
  std::uint32_t starting_psn = 0;     // 24 bits
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t target_ack_delay = 0;  // 5 bits
  std::uint8_t failover_accepted = 0; // 2 bits
  bool e2e_flow_control = false;
  std::uint8_t rnr_retry_count = 0;   // 3 bits
  bool srq = false;
  std::uint64_t local_ca_guid = 0;
  std::uint32_t vendor_id = 0;        // 24 bits, split over three bytes (ECE)
  std::array<std::byte, 196> private_data{};
};

struct rtu {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::array<std::byte, 224> private_data{};
};

/// Which message a REJ or MRA refers to.
enum class msg_ref : std::uint8_t { req = 0, rep = 1, other = 2 };

/// REJ reasons (IBTA table 112; ib_cm.h).
enum class rej_reason : std::uint16_t {
  no_qp = 1,
  no_eec = 2,
  no_resources = 3,
  timeout = 4,
  unsupported = 5,
  invalid_comm_id = 6,
  invalid_comm_instance = 7,
  invalid_service_id = 8,
  invalid_transport_type = 9,
  stale_conn = 10,
  rdc_not_exist = 11,
  invalid_gid = 12,
  invalid_lid = 13,
  invalid_sl = 14,
  invalid_traffic_class = 15,
  invalid_hop_limit = 16,
  invalid_packet_rate = 17,
  port_cm_redirect = 24,
  port_redirect = 25,
  invalid_mtu = 26,
  insufficient_resp_resources = 27,
  consumer_defined = 28,
  invalid_rnr_retry = 29,
  dup_local_comm_id = 30,
  invalid_class_version = 31,
  invalid_flow_label = 32,
  invalid_alt_flow_label = 33,
  vendor_option_not_supported = 35,
};

struct rej {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  msg_ref message_rejected = msg_ref::req;
  std::uint8_t reject_info_length = 0;  // 7 bits; decoded at most ari's size (a larger one is clamped)
  std::uint16_t reason = 0;
  std::array<std::byte, 72> ari{};
  std::array<std::byte, 148> private_data{};
};

struct mra {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  msg_ref message_mraed = msg_ref::req;
  std::uint8_t service_timeout = 0;   // 5 bits
  std::array<std::byte, 222> private_data{};
};

struct dreq {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::uint32_t remote_qpn = 0;       // 24 bits
  std::array<std::byte, 220> private_data{};
};

struct drep {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::array<std::byte, 224> private_data{};
};

struct sidr_req {
  std::uint32_t request_id = 0;
  std::uint16_t pkey = 0xFFFF;
  std::uint64_t service_id = 0;
  std::array<std::byte, 216> private_data{};
};

/// SIDR_REP status values (IBTA table 117).
enum class sidr_status : std::uint8_t {
  ok = 0,
  no_service = 1,
  rejected = 2,
  no_resources = 3,
  redirect = 4,
  unsupported_version = 5,
};

struct sidr_rep {
  std::uint32_t request_id = 0;
  sidr_status status = sidr_status::ok;
  std::uint8_t additional_info_length = 0;  // decoded at most class_port_info's size (clamped)
  std::uint32_t qpn = 0;              // 24 bits
  std::uint64_t service_id = 0;
  std::uint32_t qkey = 0;
  std::array<std::byte, 72> class_port_info{};
  std::array<std::byte, 136> private_data{};
};

enum class mad_error {
  ok = 0,
  too_short,         // fewer than 256 bytes
  bad_base_version,
  not_cm,            // management class is not CM
  bad_class_version,
  bad_method,        // not Send
  wrong_attribute,   // decoded as the wrong message type
};
const char* to_string(mad_error e) noexcept;

/// Reads the common header.
mad_error decode_header(std::span<const std::byte> mad, mad_header& out) noexcept;

/// Each writes the header (with `h.attr_id` set to the message's) and the
/// body into `out`, zero-filling the rest of the 256 bytes, and returns 256.
std::size_t encode(mad_header h, const req& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const rep& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const rtu& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const rej& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const mra& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const dreq& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const drep& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const sidr_req& m, std::span<std::byte, mad_size> out) noexcept;
std::size_t encode(mad_header h, const sidr_rep& m, std::span<std::byte, mad_size> out) noexcept;

/// Each validates the header, checks the attribute ID, and reads the body.
mad_error decode(std::span<const std::byte> mad, req& out) noexcept;
mad_error decode(std::span<const std::byte> mad, rep& out) noexcept;
mad_error decode(std::span<const std::byte> mad, rtu& out) noexcept;
mad_error decode(std::span<const std::byte> mad, rej& out) noexcept;
mad_error decode(std::span<const std::byte> mad, mra& out) noexcept;
mad_error decode(std::span<const std::byte> mad, dreq& out) noexcept;
mad_error decode(std::span<const std::byte> mad, drep& out) noexcept;
mad_error decode(std::span<const std::byte> mad, sidr_req& out) noexcept;
mad_error decode(std::span<const std::byte> mad, sidr_rep& out) noexcept;

// ---------------------------------------------------------------------------
// rdma_cm's IP addressing (IBTA annex A11; librdmacm cma.h, kernel cma.c).

/// rdma_cm port spaces: the high bits of an IP service ID.
enum class port_space : std::uint16_t { ipoib = 0x0002, tcp = 0x0106, udp = 0x0111, ib = 0x013F };

/// ServiceID for a port space and port: 0x0000000001 prefix (annex A11),
/// then the port space, then the port.
constexpr std::uint64_t service_id(port_space ps, std::uint16_t port) noexcept {
  return (std::uint64_t{static_cast<std::uint16_t>(ps)} << 16) | port;
}
/// Splits an IP service ID; false if it is not one (wrong prefix or space).
bool parse_service_id(std::uint64_t sid, port_space& ps, std::uint16_t& port) noexcept;

/// The 36-byte header rdma_cm puts first in REQ private data: version 0,
/// IP version 4 or 6, the source port, the source and destination IP
/// (IPv4 in the last 4 of 16 bytes, as an IPv4-mapped address).
struct ip_header {
  std::uint8_t ip_version = 4;
  std::uint16_t src_port = 0;
  gid_bytes src_ip{};  // IPv4-mapped for IPv4
  gid_bytes dst_ip{};
};
inline constexpr std::size_t ip_header_size = 36;
/// User private data that fits behind the header in a REQ.
inline constexpr std::size_t req_user_private_data = 92 - ip_header_size;

std::size_t encode(const ip_header& h, std::span<std::byte> out) noexcept;
/// False for a version other than 0, an IP version other than 4 or 6, or a
/// span shorter than 36 bytes.
bool decode(std::span<const std::byte> in, ip_header& out) noexcept;

/// 4.096 us * 2^t, the CM's timeout encoding (cm_convert_to_ms rounds this
/// to 2^(t-8) ms).
constexpr std::chrono::nanoseconds cm_timeout(std::uint8_t t) noexcept {
  return std::chrono::nanoseconds(std::uint64_t{4096} << (t > 31 ? 31 : t));
}

}  // namespace averbs::wire::cm
