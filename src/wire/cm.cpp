// SPDX-License-Identifier: MIT
// InfiniBand CM MAD codec (IBTA vol. 1 ch. 12, tables 106-120) and
// rdma_cm's IP addressing (annex A11), as declared in cm.hpp.
//
// Layout source: the kernel's include/rdma/ibta_vol1_c12.h, whose offsets
// are relative to the message body (MAD byte 24).  A field "byte b, bits
// hi:lo" there is written here as put_bits(body + b, hi, width, value).
// Every encoder zero-fills the whole MAD first, so reserved bits and the
// fields a message leaves unset go out as zero; decoders never look at
// reserved bits.
//
// Bits the structs do not model, ignored on decode and sent as zero (body
// offsets): REQ byte 4 and bytes 24-27 (reserved) and byte 139 bit 2
// (alternate SAPSupported); DREQ byte 11; SIDR_REQ bytes 6-7; SIDR_REP
// bytes 6-7 and 11 (its ECE vendor ID, absent from struct sidr_rep).
#include "wire/cm.hpp"

#include <algorithm>
#include <cstring>

namespace averbs::wire::cm {

namespace {

// --- big-endian field access --------------------------------------------------

constexpr std::uint32_t u8(const std::byte* p) noexcept { return std::to_integer<std::uint32_t>(p[0]); }

std::uint16_t get16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>(u8(p) << 8 | u8(p + 1));
}
std::uint32_t get24(const std::byte* p) noexcept { return u8(p) << 16 | u8(p + 1) << 8 | u8(p + 2); }
std::uint32_t get32(const std::byte* p) noexcept { return u8(p) << 24 | get24(p + 1); }
std::uint64_t get64(const std::byte* p) noexcept { return std::uint64_t{get32(p)} << 32 | get32(p + 4); }

void put_be(std::byte* p, std::uint64_t v, unsigned bytes) noexcept {
  for (unsigned i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>((v >> (8 * (bytes - 1 - i))) & 0xFF);
}
void put8(std::byte* p, std::uint8_t v) noexcept { p[0] = std::byte{v}; }
void put16(std::byte* p, std::uint16_t v) noexcept { put_be(p, v, 2); }
void put24(std::byte* p, std::uint32_t v) noexcept { put_be(p, v & 0xFFFFFF, 3); }
void put32(std::byte* p, std::uint32_t v) noexcept { put_be(p, v, 4); }
void put64(std::byte* p, std::uint64_t v) noexcept { put_be(p, v, 8); }

// A bit field of `width` bits whose most significant bit is bit `hi` of the
// byte at `p` (bit 7 = MSB), as IBTA tables write "Byte[Bit]".  The byte
// must already hold zero in the field (the encoders zero-fill).
constexpr std::uint8_t field_mask(unsigned hi, unsigned width) noexcept {
  return static_cast<std::uint8_t>(((1u << width) - 1) << (hi + 1 - width));
}
void put_bits(std::byte* p, unsigned hi, unsigned width, std::uint32_t v) noexcept {
  const unsigned shift = hi + 1 - width;
  p[0] |= static_cast<std::byte>((v << shift) & field_mask(hi, width));
}
std::uint8_t get_bits(const std::byte* p, unsigned hi, unsigned width) noexcept {
  return static_cast<std::uint8_t>((u8(p) & field_mask(hi, width)) >> (hi + 1 - width));
}

template <std::size_t N>
void put_bytes(std::byte* p, const std::array<std::byte, N>& a) noexcept {
  std::memcpy(p, a.data(), N);
}
template <std::size_t N>
void get_bytes(const std::byte* p, std::array<std::byte, N>& a) noexcept {
  std::memcpy(a.data(), p, N);
}

// --- the common header (IBTA 13.4.3) --------------------------------------------

// Starts an encode: zero-fills the MAD, writes the header with the
// message's attribute ID, and returns the body (MAD byte 24).
std::byte* begin(mad_header h, attr id, std::span<std::byte, mad_size> out) noexcept {
  std::fill(out.begin(), out.end(), std::byte{0});
  std::byte* p = out.data();
  put8(p + 0, h.base_version);
  put8(p + 1, h.mgmt_class);
  put8(p + 2, h.class_version);
  put8(p + 3, h.method);
  put16(p + 4, h.status);
  put16(p + 6, h.class_specific);
  put64(p + 8, h.tid);
  put16(p + 16, static_cast<std::uint16_t>(id));
  // bytes 18-19 reserved
  put32(p + 20, h.attr_mod);
  return p + mad_header_size;
}

// Validates the header and the attribute; on success returns the body.
const std::byte* open_body(std::span<const std::byte> mad, attr id, mad_error& err) noexcept {
  mad_header h;
  err = decode_header(mad, h);
  if (err != mad_error::ok) return nullptr;
  if (h.attr_id != id) {
    err = mad_error::wrong_attribute;
    return nullptr;
  }
  return mad.data() + mad_header_size;
}

// --- REQ paths (IBTA table 106; primary at body 52, alternate at 96) -------------

// Each path is a 44-byte block; put_path/get_path offsets are inside it.
constexpr std::size_t path_size = 44;
constexpr std::size_t primary_path_at = 52;
constexpr std::size_t alternate_path_at = 96;
static_assert(primary_path_at + path_size == alternate_path_at && alternate_path_at + path_size == 140,
              "REQ paths: 44 bytes each, private data at body 140");

void put_path(std::byte* p, const path& a) noexcept {
  put16(p + 0, a.local_lid);
  put16(p + 2, a.remote_lid);
  put_bytes(p + 4, a.local_gid);
  put_bytes(p + 20, a.remote_gid);
  // One 32-bit word: flow label 31:12, reserved 11:6, packet rate 5:0.
  put32(p + 36, (a.flow_label & 0xFFFFF) << 12 | (a.packet_rate & 0x3Fu));
  put8(p + 40, a.traffic_class);
  put8(p + 41, a.hop_limit);
  put_bits(p + 42, 7, 4, a.sl);
  put_bits(p + 42, 3, 1, a.subnet_local ? 1 : 0);
  put_bits(p + 43, 7, 5, a.local_ack_timeout);
}

void get_path(const std::byte* p, path& a) noexcept {
  a.local_lid = get16(p + 0);
  a.remote_lid = get16(p + 2);
  get_bytes(p + 4, a.local_gid);
  get_bytes(p + 20, a.remote_gid);
  const std::uint32_t w = get32(p + 36);
  a.flow_label = w >> 12;
  a.packet_rate = static_cast<std::uint8_t>(w & 0x3F);
  a.traffic_class = std::to_integer<std::uint8_t>(p[40]);
  a.hop_limit = std::to_integer<std::uint8_t>(p[41]);
  a.sl = get_bits(p + 42, 7, 4);
  a.subnet_local = get_bits(p + 42, 3, 1) != 0;
  a.local_ack_timeout = get_bits(p + 43, 7, 5);
}

// An alternate path is present when any field it carries is non-zero (an
// absent one is all zero on the wire).  The kernel looks only at the
// alternate local LID (cm_req_has_alt_path), which RoCE may send as 0 for
// an on-link path, so every field counts here.
bool path_is_zero(const path& a) noexcept {
  constexpr gid_bytes zero{};
  return a.local_lid == 0 && a.remote_lid == 0 && a.local_gid == zero && a.remote_gid == zero &&
         a.flow_label == 0 && a.packet_rate == 0 && a.traffic_class == 0 && a.hop_limit == 0 && a.sl == 0 &&
         !a.subnet_local && a.local_ack_timeout == 0;
}

}  // namespace

const char* to_string(mad_error e) noexcept {
  switch (e) {
    case mad_error::ok:
      return "ok";
    case mad_error::too_short:
      return "MAD shorter than 256 bytes";
    case mad_error::bad_base_version:
      return "MAD base version is not 1";
    case mad_error::not_cm:
      return "management class is not CM (0x07)";
    case mad_error::bad_class_version:
      return "CM class version is not 2";
    case mad_error::bad_method:
      return "MAD method is not Send (0x03)";
    case mad_error::wrong_attribute:
      return "attribute ID is not the expected CM message";
  }
  return "unknown mad_error";
}

// Fills `out` whenever the span holds a whole MAD, even when a check then
// fails, so that a caller can log (or answer) what it refuses.
mad_error decode_header(std::span<const std::byte> mad, mad_header& out) noexcept {
  if (mad.size() < mad_size) return mad_error::too_short;
  const std::byte* p = mad.data();
  out.base_version = std::to_integer<std::uint8_t>(p[0]);
  out.mgmt_class = std::to_integer<std::uint8_t>(p[1]);
  out.class_version = std::to_integer<std::uint8_t>(p[2]);
  out.method = std::to_integer<std::uint8_t>(p[3]);
  out.status = get16(p + 4);
  out.class_specific = get16(p + 6);
  out.tid = get64(p + 8);
  out.attr_id = static_cast<attr>(get16(p + 16));
  out.attr_mod = get32(p + 20);
  if (out.base_version != 1) return mad_error::bad_base_version;
  if (out.mgmt_class != mgmt_class_cm) return mad_error::not_cm;
  if (out.class_version != cm_class_version) return mad_error::bad_class_version;
  if (out.method != method_send) return mad_error::bad_method;
  return mad_error::ok;
}

// --- REQ (table 106) -------------------------------------------------------------

std::size_t encode(mad_header h, const req& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::req, out);
  put32(b + 0, m.local_comm_id);
  put24(b + 5, m.vendor_id);
  put64(b + 8, m.service_id);
  put64(b + 16, m.local_ca_guid);
  put32(b + 28, m.local_qkey);
  put24(b + 32, m.local_qpn);
  put8(b + 35, m.responder_resources);
  put24(b + 36, m.local_eecn);
  put8(b + 39, m.initiator_depth);
  put24(b + 40, m.remote_eecn);
  put_bits(b + 43, 7, 5, m.remote_cm_response_timeout);
  put_bits(b + 43, 2, 2, m.transport_type);
  put_bits(b + 43, 0, 1, m.e2e_flow_control ? 1 : 0);
  put24(b + 44, m.starting_psn);
  put_bits(b + 47, 7, 5, m.local_cm_response_timeout);
  put_bits(b + 47, 2, 3, m.retry_count);
  put16(b + 48, m.pkey);
  put_bits(b + 50, 7, 4, m.path_mtu);
  put_bits(b + 50, 3, 1, m.rdc_exists ? 1 : 0);
  put_bits(b + 50, 2, 3, m.rnr_retry_count);
  put_bits(b + 51, 7, 4, m.max_cm_retries);
  put_bits(b + 51, 3, 1, m.srq ? 1 : 0);
  put_bits(b + 51, 2, 3, m.extended_transport);
  put_path(b + primary_path_at, m.primary);
  if (m.has_alternate) put_path(b + alternate_path_at, m.alternate);
  put_bytes(b + 140, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, req& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::req, err);
  if (b == nullptr) return err;
  out.local_comm_id = get32(b + 0);
  out.vendor_id = get24(b + 5);
  out.service_id = get64(b + 8);
  out.local_ca_guid = get64(b + 16);
  out.local_qkey = get32(b + 28);
  out.local_qpn = get24(b + 32);
  out.responder_resources = std::to_integer<std::uint8_t>(b[35]);
  out.local_eecn = get24(b + 36);
  out.initiator_depth = std::to_integer<std::uint8_t>(b[39]);
  out.remote_eecn = get24(b + 40);
  out.remote_cm_response_timeout = get_bits(b + 43, 7, 5);
  out.transport_type = get_bits(b + 43, 2, 2);
  out.e2e_flow_control = get_bits(b + 43, 0, 1) != 0;
  out.starting_psn = get24(b + 44);
  out.local_cm_response_timeout = get_bits(b + 47, 7, 5);
  out.retry_count = get_bits(b + 47, 2, 3);
  out.pkey = get16(b + 48);
  out.path_mtu = get_bits(b + 50, 7, 4);
  out.rdc_exists = get_bits(b + 50, 3, 1) != 0;
  out.rnr_retry_count = get_bits(b + 50, 2, 3);
  out.max_cm_retries = get_bits(b + 51, 7, 4);
  out.srq = get_bits(b + 51, 3, 1) != 0;
  out.extended_transport = get_bits(b + 51, 2, 3);
  get_path(b + primary_path_at, out.primary);
  path alt;
  get_path(b + alternate_path_at, alt);
  out.has_alternate = !path_is_zero(alt);
  out.alternate = out.has_alternate ? alt : path{};
  get_bytes(b + 140, out.private_data);
  return mad_error::ok;
}

// --- REP (table 110) ---------------------------------------------------------------

std::size_t encode(mad_header h, const rep& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::rep, out);
  put32(b + 0, m.local_comm_id);
  put32(b + 4, m.remote_comm_id);
  put32(b + 8, m.local_qkey);
  put24(b + 12, m.local_qpn);
  put8(b + 15, static_cast<std::uint8_t>(m.vendor_id >> 16));  // VendorID_H
  put24(b + 16, m.local_eecn);
  put8(b + 19, static_cast<std::uint8_t>(m.vendor_id >> 8));  // VendorID_M
  put24(b + 20, m.starting_psn);
  put8(b + 23, static_cast<std::uint8_t>(m.vendor_id));  // VendorID_L
  put8(b + 24, m.responder_resources);
  put8(b + 25, m.initiator_depth);
  put_bits(b + 26, 7, 5, m.target_ack_delay);
  put_bits(b + 26, 2, 2, m.failover_accepted);
  put_bits(b + 26, 0, 1, m.e2e_flow_control ? 1 : 0);
  put_bits(b + 27, 7, 3, m.rnr_retry_count);
  put_bits(b + 27, 4, 1, m.srq ? 1 : 0);
  put64(b + 28, m.local_ca_guid);
  put_bytes(b + 36, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, rep& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::rep, err);
  if (b == nullptr) return err;
  out.local_comm_id = get32(b + 0);
  out.remote_comm_id = get32(b + 4);
  out.local_qkey = get32(b + 8);
  out.local_qpn = get24(b + 12);
  out.local_eecn = get24(b + 16);
  out.starting_psn = get24(b + 20);
  out.vendor_id = u8(b + 15) << 16 | u8(b + 19) << 8 | u8(b + 23);
  out.responder_resources = std::to_integer<std::uint8_t>(b[24]);
  out.initiator_depth = std::to_integer<std::uint8_t>(b[25]);
  out.target_ack_delay = get_bits(b + 26, 7, 5);
  out.failover_accepted = get_bits(b + 26, 2, 2);
  out.e2e_flow_control = get_bits(b + 26, 0, 1) != 0;
  out.rnr_retry_count = get_bits(b + 27, 7, 3);
  out.srq = get_bits(b + 27, 4, 1) != 0;
  out.local_ca_guid = get64(b + 28);
  get_bytes(b + 36, out.private_data);
  return mad_error::ok;
}

// --- RTU (table 111) ---------------------------------------------------------------

std::size_t encode(mad_header h, const rtu& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::rtu, out);
  put32(b + 0, m.local_comm_id);
  put32(b + 4, m.remote_comm_id);
  put_bytes(b + 8, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, rtu& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::rtu, err);
  if (b == nullptr) return err;
  out.local_comm_id = get32(b + 0);
  out.remote_comm_id = get32(b + 4);
  get_bytes(b + 8, out.private_data);
  return mad_error::ok;
}

// --- REJ (table 108) ---------------------------------------------------------------

std::size_t encode(mad_header h, const rej& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::rej, out);
  put32(b + 0, m.local_comm_id);
  put32(b + 4, m.remote_comm_id);
  put_bits(b + 8, 7, 2, static_cast<std::uint8_t>(m.message_rejected));
  put_bits(b + 9, 7, 7, m.reject_info_length);
  put16(b + 10, m.reason);
  put_bytes(b + 12, m.ari);
  put_bytes(b + 84, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, rej& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::rej, err);
  if (b == nullptr) return err;
  out.local_comm_id = get32(b + 0);
  out.remote_comm_id = get32(b + 4);
  out.message_rejected = static_cast<msg_ref>(get_bits(b + 8, 7, 2));
  // A length past the 72-byte ARI (the field allows 127) is clamped: a
  // reader indexing `ari` by it stays inside.
  out.reject_info_length = std::min<std::uint8_t>(get_bits(b + 9, 7, 7), sizeof out.ari);
  out.reason = get16(b + 10);
  get_bytes(b + 12, out.ari);
  get_bytes(b + 84, out.private_data);
  return mad_error::ok;
}

// --- MRA (table 107) ---------------------------------------------------------------

std::size_t encode(mad_header h, const mra& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::mra, out);
  put32(b + 0, m.local_comm_id);
  put32(b + 4, m.remote_comm_id);
  put_bits(b + 8, 7, 2, static_cast<std::uint8_t>(m.message_mraed));
  put_bits(b + 9, 7, 5, m.service_timeout);
  put_bytes(b + 10, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, mra& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::mra, err);
  if (b == nullptr) return err;
  out.local_comm_id = get32(b + 0);
  out.remote_comm_id = get32(b + 4);
  out.message_mraed = static_cast<msg_ref>(get_bits(b + 8, 7, 2));
  out.service_timeout = get_bits(b + 9, 7, 5);
  get_bytes(b + 10, out.private_data);
  return mad_error::ok;
}

// --- DREQ (table 112) and DREP (table 113) ------------------------------------------

std::size_t encode(mad_header h, const dreq& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::dreq, out);
  put32(b + 0, m.local_comm_id);
  put32(b + 4, m.remote_comm_id);
  put24(b + 8, m.remote_qpn);
  put_bytes(b + 12, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, dreq& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::dreq, err);
  if (b == nullptr) return err;
  out.local_comm_id = get32(b + 0);
  out.remote_comm_id = get32(b + 4);
  out.remote_qpn = get24(b + 8);
  get_bytes(b + 12, out.private_data);
  return mad_error::ok;
}

std::size_t encode(mad_header h, const drep& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::drep, out);
  put32(b + 0, m.local_comm_id);
  put32(b + 4, m.remote_comm_id);
  put_bytes(b + 8, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, drep& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::drep, err);
  if (b == nullptr) return err;
  out.local_comm_id = get32(b + 0);
  out.remote_comm_id = get32(b + 4);
  get_bytes(b + 8, out.private_data);
  return mad_error::ok;
}

// --- SIDR_REQ (table 119) and SIDR_REP (table 120) ------------------------------------

std::size_t encode(mad_header h, const sidr_req& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::sidr_req, out);
  put32(b + 0, m.request_id);
  put16(b + 4, m.pkey);
  put64(b + 8, m.service_id);
  put_bytes(b + 16, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, sidr_req& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::sidr_req, err);
  if (b == nullptr) return err;
  out.request_id = get32(b + 0);
  out.pkey = get16(b + 4);
  out.service_id = get64(b + 8);
  get_bytes(b + 16, out.private_data);
  return mad_error::ok;
}

std::size_t encode(mad_header h, const sidr_rep& m, std::span<std::byte, mad_size> out) noexcept {
  std::byte* b = begin(h, attr::sidr_rep, out);
  put32(b + 0, m.request_id);
  put8(b + 4, static_cast<std::uint8_t>(m.status));
  put8(b + 5, m.additional_info_length);
  put24(b + 8, m.qpn);
  put64(b + 12, m.service_id);
  put32(b + 20, m.qkey);
  put_bytes(b + 24, m.class_port_info);
  put_bytes(b + 96, m.private_data);
  return mad_size;
}

mad_error decode(std::span<const std::byte> mad, sidr_rep& out) noexcept {
  mad_error err = mad_error::ok;
  const std::byte* b = open_body(mad, attr::sidr_rep, err);
  if (b == nullptr) return err;
  out.request_id = get32(b + 0);
  out.status = static_cast<sidr_status>(std::to_integer<std::uint8_t>(b[4]));
  out.additional_info_length =
      std::min<std::uint8_t>(std::to_integer<std::uint8_t>(b[5]), sizeof out.class_port_info);
  out.qpn = get24(b + 8);
  out.service_id = get64(b + 12);
  out.qkey = get32(b + 20);
  get_bytes(b + 24, out.class_port_info);
  get_bytes(b + 96, out.private_data);
  return mad_error::ok;
}

// --- rdma_cm IP addressing (annex A11; kernel cma.c) ----------------------------------

bool parse_service_id(std::uint64_t sid, port_space& ps, std::uint16_t& port) noexcept {
  // Annex A11: bits 63..24 are 0x0000000001; bits 23..16 are the IP
  // protocol, which with the prefix's low byte forms the port space.
  if ((sid >> 24) != 1) return false;
  const auto space = static_cast<std::uint16_t>(sid >> 16);
  switch (static_cast<port_space>(space)) {
    case port_space::tcp:
    case port_space::udp:
    case port_space::ib:
      break;
    default:  // includes ipoib (0x0002), which never carries the prefix
      return false;
  }
  ps = static_cast<port_space>(space);
  port = static_cast<std::uint16_t>(sid & 0xFFFF);
  return true;
}

namespace {

constexpr std::uint8_t cma_version = 0;

// The kernel writes IPv4 as 12 zero bytes then the address (struct
// cma_hdr's ip4 {pad[3], addr}; the private data buffer is zeroed) and
// reads only the address.
void put_ip(std::byte* p, std::uint8_t ip_version, const gid_bytes& ip) noexcept {
  if (ip_version == 4) {
    std::memcpy(p + 12, ip.data() + 12, 4);
  } else {
    std::memcpy(p, ip.data(), ip.size());
  }
}
void get_ip(const std::byte* p, std::uint8_t ip_version, gid_bytes& ip) noexcept {
  if (ip_version == 4) {
    ip = gid_bytes{};
    ip[10] = ip[11] = std::byte{0xFF};  // ::ffff:a.b.c.d
    std::memcpy(ip.data() + 12, p + 12, 4);
  } else {
    std::memcpy(ip.data(), p, ip.size());
  }
}

}  // namespace

// Returns 0 (and writes nothing) for a span shorter than 36 bytes or an IP
// version other than 4 or 6, which decode() would refuse.
std::size_t encode(const ip_header& h, std::span<std::byte> out) noexcept {
  if (out.size() < ip_header_size || (h.ip_version != 4 && h.ip_version != 6)) return 0;
  std::byte* p = out.data();
  std::fill_n(p, ip_header_size, std::byte{0});
  put8(p + 0, cma_version);
  put8(p + 1, static_cast<std::uint8_t>(h.ip_version << 4));  // bits 3:0 reserved
  put16(p + 2, h.src_port);
  put_ip(p + 4, h.ip_version, h.src_ip);
  put_ip(p + 20, h.ip_version, h.dst_ip);
  return ip_header_size;
}

bool decode(std::span<const std::byte> in, ip_header& out) noexcept {
  if (in.size() < ip_header_size) return false;
  const std::byte* p = in.data();
  if (std::to_integer<std::uint8_t>(p[0]) != cma_version) return false;
  const auto ip_version = static_cast<std::uint8_t>(u8(p + 1) >> 4);
  if (ip_version != 4 && ip_version != 6) return false;
  out.ip_version = ip_version;
  out.src_port = get16(p + 2);
  get_ip(p + 4, ip_version, out.src_ip);
  get_ip(p + 20, ip_version, out.dst_ip);
  return true;
}

}  // namespace averbs::wire::cm
