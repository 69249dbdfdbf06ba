// SPDX-License-Identifier: MIT
// RoCEv2 transport codec: opcode table, header (de)serialisation, ICRC,
// IP/UDP headers and the small arithmetic helpers declared in roce.hpp.
#include "wire/roce.hpp"

#include "wire/crc32.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace averbs::wire {

namespace {

// --- big-endian field access -------------------------------------------------

constexpr std::uint8_t ip_proto_udp = 17;  // IPv4 protocol, IPv6 next header

constexpr std::byte byte_of(std::uint64_t v, unsigned shift) noexcept {
  return static_cast<std::byte>((v >> shift) & 0xFF);
}

void put16(std::byte* p, std::uint16_t v) noexcept {
  p[0] = byte_of(v, 8);
  p[1] = byte_of(v, 0);
}
void put24(std::byte* p, std::uint32_t v) noexcept {
  p[0] = byte_of(v, 16);
  p[1] = byte_of(v, 8);
  p[2] = byte_of(v, 0);
}
void put32(std::byte* p, std::uint32_t v) noexcept {
  for (unsigned i = 0; i < 4; ++i) p[i] = byte_of(v, 24 - 8 * i);
}
void put64(std::byte* p, std::uint64_t v) noexcept {
  for (unsigned i = 0; i < 8; ++i) p[i] = byte_of(v, 56 - 8 * i);
}

constexpr std::uint32_t u8(const std::byte* p) noexcept { return std::to_integer<std::uint32_t>(p[0]); }
std::uint16_t get16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>(u8(p) << 8 | u8(p + 1));
}
std::uint32_t get24(const std::byte* p) noexcept { return u8(p) << 16 | u8(p + 1) << 8 | u8(p + 2); }
std::uint32_t get32(const std::byte* p) noexcept { return u8(p) << 24 | get24(p + 1); }
std::uint64_t get64(const std::byte* p) noexcept {
  return static_cast<std::uint64_t>(get32(p)) << 32 | get32(p + 4);
}

// --- opcode table (IBTA vol. 1 9.2 and 9.3) ------------------------------------

constexpr std::uint8_t ext_header_size(header_bits h) noexcept {
  switch (h) {
    case hdr_rdeth:
      return 4;
    case hdr_deth:
      return 8;
    case hdr_reth:
      return 16;
    case hdr_atmeth:
      return 28;
    case hdr_aeth:
      return 4;
    case hdr_atmack:
      return 8;
    case hdr_immdt:
      return 4;
    case hdr_ieth:
      return 4;
    case hdr_feth:
      return 4;
  }
  return 0;
}

constexpr std::uint16_t all_header_bits[] = {hdr_rdeth, hdr_deth,   hdr_feth,  hdr_reth, hdr_atmeth,
                                             hdr_aeth,  hdr_atmack, hdr_immdt, hdr_ieth};

// Shorthands for the rows below.
constexpr std::uint16_t req = op_request, rsp = op_response, pay = op_payload;
constexpr std::uint16_t first = op_first, middle = op_middle, last = op_last;
constexpr std::uint16_t only = op_first | op_last | op_only;
constexpr std::uint16_t send = op_send, write = op_write, read = op_read, atomic = op_atomic;
constexpr std::uint16_t ack = op_ack, imm = op_imm, inv = op_inv;

// CNP (RoCEv2 annex A17): the BTH is followed by 16 reserved bytes.
constexpr std::uint8_t cnp_reserved_size = 16;

struct row {
  opcode op;
  transport tp;
  std::uint16_t headers;
  std::uint16_t ops;
  const char* name;
};

// Names as tshark 4.0 resolves infiniband.bth.opcode, with the transport
// abbreviated ("Reliable Connection (RC) - SEND Only" -> "RC SEND Only").
constexpr row rows[] = {
    {opcode::rc_send_first, transport::rc, 0, req | first | send | pay, "RC SEND First"},
    {opcode::rc_send_middle, transport::rc, 0, req | middle | send | pay, "RC SEND Middle"},
    {opcode::rc_send_last, transport::rc, 0, req | last | send | pay, "RC SEND Last"},
    {opcode::rc_send_last_imm, transport::rc, hdr_immdt, req | last | send | imm | pay,
     "RC SEND Last with Immediate"},
    {opcode::rc_send_only, transport::rc, 0, req | only | send | pay, "RC SEND Only"},
    {opcode::rc_send_only_imm, transport::rc, hdr_immdt, req | only | send | imm | pay,
     "RC SEND Only with Immediate"},
    {opcode::rc_write_first, transport::rc, hdr_reth, req | first | write | pay, "RC RDMA WRITE First"},
    {opcode::rc_write_middle, transport::rc, 0, req | middle | write | pay, "RC RDMA WRITE Middle"},
    {opcode::rc_write_last, transport::rc, 0, req | last | write | pay, "RC RDMA WRITE Last"},
    {opcode::rc_write_last_imm, transport::rc, hdr_immdt, req | last | write | imm | pay,
     "RC RDMA WRITE Last with Immediate"},
    {opcode::rc_write_only, transport::rc, hdr_reth, req | only | write | pay, "RC RDMA WRITE Only"},
    {opcode::rc_write_only_imm, transport::rc, hdr_reth | hdr_immdt, req | only | write | imm | pay,
     "RC RDMA WRITE Only with Immediate"},
    {opcode::rc_read_request, transport::rc, hdr_reth, req | only | read, "RC RDMA READ Request"},
    {opcode::rc_read_response_first, transport::rc, hdr_aeth, rsp | first | read | pay,
     "RC RDMA READ response First"},
    {opcode::rc_read_response_middle, transport::rc, 0, rsp | middle | read | pay,
     "RC RDMA READ response Middle"},
    {opcode::rc_read_response_last, transport::rc, hdr_aeth, rsp | last | read | pay,
     "RC RDMA READ response Last"},
    {opcode::rc_read_response_only, transport::rc, hdr_aeth, rsp | only | read | pay,
     "RC RDMA READ response Only"},
    {opcode::rc_ack, transport::rc, hdr_aeth, rsp | only | ack, "RC Acknowledge"},
    {opcode::rc_atomic_ack, transport::rc, hdr_aeth | hdr_atmack, rsp | only | ack | atomic,
     "RC ATOMIC Acknowledge"},
    {opcode::rc_compare_swap, transport::rc, hdr_atmeth, req | only | atomic, "RC CmpSwap"},
    {opcode::rc_fetch_add, transport::rc, hdr_atmeth, req | only | atomic, "RC FetchAdd"},
    {opcode::rc_send_last_inv, transport::rc, hdr_ieth, req | last | send | inv | pay,
     "RC SEND Last with Invalidate"},
    {opcode::rc_send_only_inv, transport::rc, hdr_ieth, req | only | send | inv | pay,
     "RC SEND Only with Invalidate"},
    {opcode::rc_flush, transport::rc, hdr_feth | hdr_reth, req | only | op_flush, "RC FLUSH"},
    {opcode::rc_atomic_write, transport::rc, hdr_reth, req | only | op_atomic_write | pay, "RC ATOMIC WRITE"},

    {opcode::uc_send_first, transport::uc, 0, req | first | send | pay, "UC SEND First"},
    {opcode::uc_send_middle, transport::uc, 0, req | middle | send | pay, "UC SEND Middle"},
    {opcode::uc_send_last, transport::uc, 0, req | last | send | pay, "UC SEND Last"},
    {opcode::uc_send_last_imm, transport::uc, hdr_immdt, req | last | send | imm | pay,
     "UC SEND Last with Immediate"},
    {opcode::uc_send_only, transport::uc, 0, req | only | send | pay, "UC SEND Only"},
    {opcode::uc_send_only_imm, transport::uc, hdr_immdt, req | only | send | imm | pay,
     "UC SEND Only with Immediate"},
    {opcode::uc_write_first, transport::uc, hdr_reth, req | first | write | pay, "UC RDMA WRITE First"},
    {opcode::uc_write_middle, transport::uc, 0, req | middle | write | pay, "UC RDMA WRITE Middle"},
    {opcode::uc_write_last, transport::uc, 0, req | last | write | pay, "UC RDMA WRITE Last"},
    {opcode::uc_write_last_imm, transport::uc, hdr_immdt, req | last | write | imm | pay,
     "UC RDMA WRITE Last with Immediate"},
    {opcode::uc_write_only, transport::uc, hdr_reth, req | only | write | pay, "UC RDMA WRITE Only"},
    {opcode::uc_write_only_imm, transport::uc, hdr_reth | hdr_immdt, req | only | write | imm | pay,
     "UC RDMA WRITE Only with Immediate"},

    {opcode::ud_send_only, transport::ud, hdr_deth, req | only | send | pay, "UD SEND Only"},
    {opcode::ud_send_only_imm, transport::ud, hdr_deth | hdr_immdt, req | only | send | imm | pay,
     "UD SEND Only with Immediate"},

    {opcode::cnp, transport::cnp, 0, 0, "CNP"},
};

constexpr std::array<opcode_info, 256> make_table() noexcept {
  std::array<opcode_info, 256> t{};
  for (const row& r : rows) {
    opcode_info& i = t[static_cast<std::uint8_t>(r.op)];
    i.valid = true;
    i.tp = r.tp;
    i.headers = r.headers;
    i.ops = r.ops;
    std::size_t len = bth_size;
    for (std::uint16_t h : all_header_bits) {
      if (r.headers & h) len += ext_header_size(static_cast<header_bits>(h));
    }
    if (r.tp == transport::cnp) len += cnp_reserved_size;
    i.length = static_cast<std::uint8_t>(len);
    i.name = r.name;
  }
  return t;
}

constexpr std::array<opcode_info, 256> opcode_table = make_table();

static_assert(opcode_table[0x13].length == 40 && opcode_table[0x0B].length == 32 &&
              opcode_table[0x65].length == 24 && opcode_table[0x81].length == 28);
static_assert([] {
  for (const opcode_info& i : opcode_table) {
    if (i.length > max_header_size) return false;
  }
  return true;
}());

// --- ICRC ---------------------------------------------------------------------

constexpr std::byte all_ones{0xFF};

// Byte 4 of the BTH: FECN, BECN, Resv6 (IBTA A17.3.3 masks it).
constexpr std::size_t bth_variant_byte = 4;

constexpr std::size_t ipv4_min_header = 20;
constexpr std::size_t ipv6_header = 40;
constexpr std::size_t udp_header = 8;

}  // namespace

const opcode_info& info(std::uint8_t op) noexcept { return opcode_table[op]; }

// --- encode / decode ------------------------------------------------------------

std::size_t encode(const transport_headers& h, std::span<std::byte> out) noexcept {
  const opcode_info& oi = info(h.bth.opcode);
  if (!oi.valid || out.size() < oi.length) return 0;
  std::byte* const base = out.data();
  std::byte* p = base;

  // BTH, IBTA 9.2.  Reserved bits are sent as zero.
  const bth& b = h.bth;
  p[0] = static_cast<std::byte>(b.opcode);
  p[1] =
      static_cast<std::byte>((b.se ? 0x80 : 0) | (b.mig_req ? 0x40 : 0) | (b.pad & 3) << 4 | (b.tver & 0xF));
  put16(p + 2, b.pkey);
  p[4] = static_cast<std::byte>((b.fecn ? 0x80 : 0) | (b.becn ? 0x40 : 0));
  put24(p + 5, b.dest_qp & qpn_mask);
  p[8] = static_cast<std::byte>(b.ack_req ? 0x80 : 0);
  put24(p + 9, b.psn & psn_mask);
  p += bth_size;

  // Extension headers in wire order, IBTA 9.3.
  if (oi.headers & hdr_deth) {
    put32(p, h.deth.qkey);
    p[4] = std::byte{0};
    put24(p + 5, h.deth.src_qp & qpn_mask);
    p += 8;
  }
  if (oi.headers & hdr_feth) {
    put32(p, h.feth & 0x3F);
    p += 4;
  }
  if (oi.headers & hdr_reth) {
    put64(p, h.reth.va);
    put32(p + 8, h.reth.rkey);
    put32(p + 12, h.reth.length);
    p += 16;
  }
  if (oi.headers & hdr_atmeth) {
    put64(p, h.atomic.va);
    put32(p + 8, h.atomic.rkey);
    put64(p + 12, h.atomic.swap_add);
    put64(p + 20, h.atomic.compare);
    p += 28;
  }
  if (oi.headers & hdr_aeth) {
    p[0] = static_cast<std::byte>(h.aeth.syndrome);
    put24(p + 1, h.aeth.msn & 0xFFFFFF);
    p += 4;
  }
  if (oi.headers & hdr_atmack) {
    put64(p, h.atomic_ack);
    p += 8;
  }
  if (oi.headers & hdr_immdt) {  // opaque, already in network order
    std::memcpy(p, &h.imm, 4);
    p += 4;
  }
  if (oi.headers & hdr_ieth) {
    put32(p, h.ieth_rkey);
    p += 4;
  }
  // Whatever the opcode reserves beyond its headers (CNP's 16 bytes) is zero.
  const auto written = static_cast<std::size_t>(p - base);
  if (written < oi.length) std::memset(p, 0, oi.length - written);
  return oi.length;
}

namespace {

// Reads the BTH and the extension headers `oi` lists.  The caller checked
// that `p` holds oi.length bytes.
void parse_headers(const std::byte* p, const opcode_info& oi, std::uint8_t pad, transport_headers& h) noexcept {
  const std::uint32_t b1 = u8(p + 1);
  bth& b = h.bth;
  b.opcode = std::to_integer<std::uint8_t>(p[0]);
  b.se = (b1 & 0x80) != 0;
  b.mig_req = (b1 & 0x40) != 0;
  b.pad = pad;
  b.tver = 0;
  b.pkey = get16(p + 2);
  b.fecn = (u8(p + 4) & 0x80) != 0;
  b.becn = (u8(p + 4) & 0x40) != 0;
  b.dest_qp = get24(p + 5);
  b.ack_req = (u8(p + 8) & 0x80) != 0;
  b.psn = get24(p + 9);
  p += bth_size;

  if (oi.headers & hdr_deth) {
    h.deth.qkey = get32(p);
    h.deth.src_qp = get24(p + 5);
    p += 8;
  }
  if (oi.headers & hdr_feth) {
    h.feth = get32(p) & 0x3F;
    p += 4;
  }
  if (oi.headers & hdr_reth) {
    h.reth.va = get64(p);
    h.reth.rkey = get32(p + 8);
    h.reth.length = get32(p + 12);
    p += 16;
  }
  if (oi.headers & hdr_atmeth) {
    h.atomic.va = get64(p);
    h.atomic.rkey = get32(p + 8);
    h.atomic.swap_add = get64(p + 12);
    h.atomic.compare = get64(p + 20);
    p += 28;
  }
  if (oi.headers & hdr_aeth) {
    h.aeth.syndrome = static_cast<std::uint8_t>(u8(p));
    h.aeth.msn = get24(p + 1);
    p += 4;
  }
  if (oi.headers & hdr_atmack) {
    h.atomic_ack = get64(p);
    p += 8;
  }
  if (oi.headers & hdr_immdt) {
    std::memcpy(&h.imm, p, 4);
    p += 4;
  }
  if (oi.headers & hdr_ieth) {
    h.ieth_rkey = get32(p);
    p += 4;
  }

}

}  // namespace

bool continues_run(const std::byte* head, const std::byte* seg, std::uint32_t k) noexcept {
  // P_Key (bytes 2-3), destination QP (5-7), PSN (9-11).
  return std::memcmp(seg + 2, head + 2, 2) == 0 && std::memcmp(seg + 5, head + 5, 3) == 0 &&
         get24(seg + 9) == ((get24(head + 9) + k) & psn_mask);
}

std::size_t run_segment_size(std::span<const std::byte> dgram) noexcept {
  constexpr std::size_t min_packet = bth_size + icrc_size;
  const std::size_t len = dgram.size();
  if (len < 2 * min_packet) return len;
  const std::byte* d = dgram.data();
  // Segment k (k >= 1) at offset k * seg continues the run.
  auto continues = [&](std::size_t off, std::uint32_t k) { return continues_run(d, d + off, k); };
  // Every segment after the first continues it, and none is shorter than a packet.
  auto splits_at = [&](std::size_t seg) {
    std::uint32_t k = 1;
    for (std::size_t off = seg; off < len; off += seg, ++k)
      if (len - off < min_packet || !continues(off, k)) return false;
    return true;
  };
  // No RoCE packet is longer than its headers, a 4096-byte payload, pad
  // and ICRC: a segment size past that is no run, and not searching there
  // bounds the work a junk 64 KiB datagram costs (was ~65,000 probes).
  const std::size_t max_seg = std::min(len - min_packet, max_packet_size);  // the last may be shorter
  for (std::size_t seg = min_packet; seg <= max_seg; ++seg)
    if (continues(seg, 1) && splits_at(seg)) return seg;
  return len;
}

decode_error decode(std::span<const std::byte> pkt, bool has_icrc, packet_view& out) noexcept {
  out = packet_view{};
  const std::size_t trailer = has_icrc ? icrc_size : 0;
  if (pkt.size() < bth_size + trailer) return decode_error::too_short;

  const std::byte* p = pkt.data();
  const opcode_info& oi = info(std::to_integer<std::uint8_t>(p[0]));
  if (!oi.valid) return decode_error::bad_opcode;
  const std::uint32_t b1 = u8(p + 1);
  if ((b1 & 0xF) != 0) return decode_error::bad_tver;
  if (pkt.size() < oi.length + trailer) return decode_error::too_short;

  const std::size_t area = pkt.size() - oi.length - trailer;  // payload + pad
  const std::uint8_t pad = static_cast<std::uint8_t>((b1 >> 4) & 3);
  if (pad > area) return decode_error::bad_pad;
  const std::size_t payload_len = area - pad;
  // Opcodes without payload (READ request, ACK, atomics, CNP) carry no pad
  // either: any byte after their headers is a length error.
  if (!(oi.ops & op_payload) && area != 0) return decode_error::bad_length;
  // The pad aligns the payload to 4 bytes, no more and no less (as
  // decode_headers() has it).
  if (pad != pad_for(payload_len)) return decode_error::bad_pad;

  parse_headers(p, oi, pad, out.hdr);
  out.op = &oi;
  out.payload = pkt.subspan(oi.length, payload_len);
  if (has_icrc) out.icrc = load_icrc(pkt.last<icrc_size>());
  return decode_error::ok;
}

decode_error decode_headers(std::span<const std::byte> headers, std::size_t payload_len,
                            packet_view& out) noexcept {
  out = packet_view{};
  return decode_headers(headers, payload_len, out.hdr, out.op);
}

decode_error decode_headers(std::span<const std::byte> headers, std::size_t payload_len, transport_headers& hdr,
                            const opcode_info*& op) noexcept {
  op = nullptr;
  if (headers.size() < bth_size) return decode_error::too_short;
  const opcode_info& oi = info(std::to_integer<std::uint8_t>(headers[0]));
  if (!oi.valid) return decode_error::bad_opcode;
  const std::uint32_t b1 = u8(headers.data() + 1);
  if ((b1 & 0xF) != 0) return decode_error::bad_tver;
  if (headers.size() < oi.length) return decode_error::too_short;
  if (headers.size() > oi.length) return decode_error::bad_length;  // not this opcode's headers
  const auto pad = static_cast<std::uint8_t>((b1 >> 4) & 3);
  if (pad != pad_for(payload_len)) return decode_error::bad_pad;
  if (!(oi.ops & op_payload) && payload_len != 0) return decode_error::bad_length;
  parse_headers(headers.data(), oi, pad, hdr);
  op = &oi;
  return decode_error::ok;
}

const char* to_string(decode_error e) noexcept {
  switch (e) {
    case decode_error::ok:
      return "ok";
    case decode_error::too_short:
      return "too_short";
    case decode_error::bad_opcode:
      return "bad_opcode";
    case decode_error::bad_tver:
      return "bad_tver";
    case decode_error::bad_pad:
      return "bad_pad";
    case decode_error::bad_length:
      return "bad_length";
  }
  return "unknown";
}

// --- ICRC (IBTA vol. 1 annex A17.3.3) ---------------------------------------------

icrc_builder::icrc_builder(std::span<const std::byte> ip_udp) noexcept {
  // The LRH that RoCEv2 lacks counts as 8 bytes of ones.
  constexpr std::size_t lrh = 8;
  std::fill_n(buf_.begin(), lrh, all_ones);
  // Room for an IPv4 header with options (IHL 15) and the UDP header.
  constexpr std::size_t max_ip_udp = 60 + udp_header;
  std::byte* h = buf_.data() + lrh;
  const std::size_t n = std::min(ip_udp.size(), max_ip_udp);
  std::copy_n(ip_udp.begin(), n, h);
  auto mask = [&](std::size_t i) {
    if (i < n) h[i] = all_ones;
  };
  std::size_t udp_offset = ipv4_min_header;
  if (n > 0 && (u8(h) >> 4) == 6) {
    h[0] |= std::byte{0x0F};  // traffic class (high nibble), flow label
    mask(1), mask(2), mask(3);
    mask(7);  // hop limit
    udp_offset = ipv6_header;
  } else {
    mask(1);             // TOS
    mask(8);             // TTL
    mask(10), mask(11);  // header checksum
    if (n > 0) udp_offset = (u8(h) & 0xF) * 4u;
  }
  mask(udp_offset + 6), mask(udp_offset + 7);  // UDP checksum
  held_ = lrh + n;
  append(ip_udp.data() + n, ip_udp.size() - n);
}

icrc_builder icrc_builder::after_prefix(std::uint32_t prefix) noexcept { return icrc_builder(prefix); }

std::uint32_t icrc_prefix(std::span<const std::byte> ip_udp) noexcept {
  const icrc_builder b(ip_udp);
  return b.value();
}

void icrc_builder::append(const std::byte* p, std::size_t n) noexcept {
  if (n == 0) return;
  if (n > buf_.size() - held_) {
    crc_ = crc32(crc_, buf_.data(), held_);
    held_ = 0;
    if (n > buf_.size() / 2) {  // long: straight from where it is
      crc_ = crc32(crc_, p, n);
      return;
    }
  }
  std::memcpy(buf_.data() + held_, p, n);
  held_ += n;
}

void icrc_builder::add(std::span<const std::byte> bytes) noexcept {
  // The BTH's byte 4 is masked wherever the pieces cut the BTH.
  if (bth_seen_ < bth_size && !bytes.empty()) {
    std::array<std::byte, bth_size> bth_copy{};
    const std::size_t n = std::min(bytes.size(), bth_size - bth_seen_);
    std::copy_n(bytes.begin(), n, bth_copy.begin());
    if (bth_seen_ <= bth_variant_byte && bth_variant_byte < bth_seen_ + n)
      bth_copy[bth_variant_byte - bth_seen_] = all_ones;
    append(bth_copy.data(), n);
    bth_seen_ += n;
    bytes = bytes.subspan(n);
  }
  if (!bytes.empty()) append(bytes.data(), bytes.size());
}

std::uint32_t icrc_builder::value() const noexcept { return crc32(crc_, buf_.data(), held_); }

void store_icrc(std::uint32_t icrc, std::span<std::byte, 4> out) noexcept {
  for (unsigned i = 0; i < 4; ++i) out[i] = byte_of(icrc, 8 * i);
}

std::uint32_t load_icrc(std::span<const std::byte, 4> in) noexcept {
  return u8(&in[0]) | u8(&in[1]) << 8 | u8(&in[2]) << 16 | u8(&in[3]) << 24;
}

std::uint32_t icrc(std::span<const std::byte> ip_udp, std::span<const std::byte> transport) noexcept {
  icrc_builder b(ip_udp);
  b.add(transport);
  return b.value();
}

namespace {

// CRC-32 arithmetic in GF(2)[x] mod the CRC polynomial, in the CRC's
// reflected bit order (bit 31 is x^0): what carrying a CRC state across
// zero bytes does, without the bytes (the method behind zlib's
// crc32_combine, written from the algebra).
std::uint32_t mul_mod(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if ((a & m) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ crc32_poly_reflected : b >> 1;
  }
  return product;
}

// base^n mod P.
std::uint32_t pow_mod(std::uint32_t base, std::size_t n) noexcept {
  std::uint32_t result = 1u << 31;  // x^0
  for (; n != 0; n >>= 1) {
    if ((n & 1) != 0) result = mul_mod(result, base);
    base = mul_mod(base, base);
  }
  return result;
}

// x^(8n) mod P: the factor that n zero bytes apply to a CRC state.
std::uint32_t zero_bytes_factor(std::size_t n) noexcept { return pow_mod(1u << 23, n); }  // x^8

// x^(-8n) mod P, which undoes it (x is invertible: P has a constant term).
// Dividing by x undoes mul_mod's step: the x^0 bit (bit 31) says whether
// that step reduced by P.
std::uint32_t zero_bytes_inverse(std::size_t n) noexcept {
  std::uint32_t inv_x8 = 1u << 31;  // x^0, divided by x eight times
  for (int i = 0; i < 8; ++i)
    inv_x8 = (inv_x8 & (1u << 31)) != 0 ? ((inv_x8 ^ crc32_poly_reflected) << 1) | 1u : inv_x8 << 1;
  return pow_mod(inv_x8, n);
}

}  // namespace

std::uint32_t ipv4_id_icrc::delta(std::size_t transport_len, std::uint16_t id) noexcept {
  if (id == 0) return 0;
  const entry& e = lookup(transport_len);
  return e.low[id & 0xFF] ^ e.high[id >> 8];
}

std::optional<std::uint16_t> ipv4_id_icrc::solve(std::size_t transport_len, std::uint32_t d) noexcept {
  if (d == 0) return std::uint16_t{0};
  // The inverse map gives the one ID whose delta d can be; d is one only
  // if that ID's delta is d itself.
  auto solve_with = [](entry& e, std::uint32_t v) -> std::optional<std::uint16_t> {
    if (!e.has_inverse) build_inverse(e);
    const auto id = static_cast<std::uint16_t>(e.inverse[0][v & 0xFF] ^ e.inverse[1][(v >> 8) & 0xFF] ^
                                               e.inverse[2][(v >> 16) & 0xFF] ^ e.inverse[3][v >> 24]);
    if ((e.low[id & 0xFF] ^ e.high[id >> 8]) != v) return std::nullopt;
    return id;
  };
  if (entry* e = find(transport_len)) return solve_with(*e, d);
  // A length not cached: d is the length-0 delta times x^(8 * length), so
  // it is solved at length 0 (tables built once) after dividing that out,
  // about a microsecond.  The length is cached only once it has a solution:
  // junk of many lengths (which has none, but for 2^-16 of it) would
  // otherwise rebuild tables for each (tens of microseconds) and evict the
  // lengths in use.
  static entry base = [] {
    entry e;
    fill(e, 0);
    build_inverse(e);
    return e;
  }();
  const std::optional<std::uint16_t> id = solve_with(base, mul_mod(d, zero_bytes_inverse(transport_len)));
  if (id) (void)lookup(transport_len);
  return id;
}

void ipv4_id_icrc::build_inverse(entry& e) noexcept {
  // Gaussian elimination over GF(2): row i is a combination (of ID bits
  // `ids[i]`) of the per-bit deltas whose lowest set bit, `lead[i]`, no
  // later row has.  Reducing a value by the rows in order is linear in
  // the value and takes the delta of each ID bit to that bit: a left
  // inverse of delta(), kept as one table per byte of the value.
  std::array<std::uint32_t, 16> row{}, lead{};
  std::array<std::uint16_t, 16> ids{};
  unsigned n = 0;
  for (unsigned b = 0; b < 16; ++b) {
    std::uint32_t v = e.bit[b];
    auto m = static_cast<std::uint16_t>(1u << b);
    for (unsigned i = 0; i < n; ++i)
      if ((v & lead[i]) != 0) {
        v ^= row[i];
        m ^= ids[i];
      }
    if (v == 0) continue;  // dependent: cannot happen for CRC-32, harmless
    row[n] = v;
    lead[n] = v & (~v + 1);
    ids[n] = m;
    ++n;
  }
  auto reduce = [&](std::uint32_t v) {
    std::uint16_t id = 0;
    for (unsigned i = 0; i < n; ++i)
      if ((v & lead[i]) != 0) {
        v ^= row[i];
        id ^= ids[i];
      }
    return id;
  };
  for (unsigned byte = 0; byte < 4; ++byte) {
    auto& t = e.inverse[byte];
    t[0] = 0;
    for (unsigned v = 1; v < 256; ++v)  // linear: one new bit on an earlier entry
      t[v] = static_cast<std::uint16_t>(t[v & (v - 1)] ^ reduce(1u << (8 * byte + std::countr_zero(v))));
  }
  e.has_inverse = true;
}

bool ipv4_id_icrc::cached(std::size_t transport_len) const noexcept {
  return std::any_of(cache_.begin(), cache_.end(), [&](const entry& e) { return e.transport_len == transport_len; });
}

ipv4_id_icrc::entry* ipv4_id_icrc::find(std::size_t transport_len) noexcept {
  if (cache_[last_].transport_len == transport_len) return &cache_[last_];
  for (std::size_t i = 0; i < cache_.size(); ++i)
    if (cache_[i].transport_len == transport_len) {
      last_ = i;
      return &cache_[i];
    }
  return nullptr;
}

void ipv4_id_icrc::fill(entry& e, std::size_t transport_len) noexcept {
  // f(x) = icrc(x) ^ icrc(0) is linear: one value per ID bit.  For no
  // transport bytes it comes from headers that are zero but for that bit
  // (and the version nibble, which says where the UDP header is); the
  // transport's zero bytes then multiply it by x^(8 * transport_len).
  static const std::array<std::uint32_t, 16> at_header_end = [] {
    std::array<std::uint32_t, 16> out{};
    std::array<std::byte, ipv4_min_header + udp_header> hdr{};
    hdr[0] = std::byte{0x45};
    const std::uint32_t base = icrc(hdr, {});
    for (unsigned b = 0; b < 16; ++b) {
      put16(hdr.data() + 4, static_cast<std::uint16_t>(1u << b));
      out[b] = icrc(hdr, {}) ^ base;
    }
    return out;
  }();
  e.transport_len = transport_len;
  const std::uint32_t factor = zero_bytes_factor(transport_len);
  for (unsigned b = 0; b < 16; ++b) e.bit[b] = mul_mod(at_header_end[b], factor);
  e.low[0] = e.high[0] = 0;
  for (unsigned v = 1; v < 256; ++v) {  // one new bit on an earlier entry
    const auto b = static_cast<unsigned>(std::countr_zero(v));
    e.low[v] = e.low[v & (v - 1)] ^ e.bit[b];
    e.high[v] = e.high[v & (v - 1)] ^ e.bit[b + 8];
  }
  e.has_inverse = false;
}

ipv4_id_icrc::entry& ipv4_id_icrc::lookup(std::size_t transport_len) noexcept {
  if (entry* e = find(transport_len)) return *e;
  last_ = next_++ % cache_.size();
  fill(cache_[last_], transport_len);
  return cache_[last_];
}

// --- IP and UDP -----------------------------------------------------------------------

std::size_t build_ip_udp(const ip_udp_params& p, std::size_t transport_len,
                         std::span<std::byte> out) noexcept {
  const bool v4 = is_ipv4_mapped(p.src_gid);
  if (v4 != is_ipv4_mapped(p.dst_gid)) return 0;
  const std::size_t ip_len = v4 ? ipv4_min_header : ipv6_header;
  if (out.size() < ip_len + udp_header) return 0;
  // IPv4 total length and IPv6 payload length are 16-bit fields.
  const std::size_t length_field_max = v4 ? 0xFFFF - ipv4_min_header - udp_header : 0xFFFF - udp_header;
  if (transport_len > length_field_max) return 0;
  const auto udp_len = static_cast<std::uint16_t>(udp_header + transport_len);
  std::byte* ip = out.data();

  if (v4) {  // RFC 791
    ip[0] = std::byte{0x45};
    ip[1] = static_cast<std::byte>(p.traffic_class);
    put16(ip + 2, static_cast<std::uint16_t>(ipv4_min_header + udp_len));
    put16(ip + 4, p.ip_id);
    put16(ip + 6, 0x4000);  // DF, fragment offset 0
    ip[8] = static_cast<std::byte>(p.hop_limit);
    ip[9] = std::byte{ip_proto_udp};
    put16(ip + 10, 0);
    std::copy_n(p.src_gid.begin() + 12, 4, ip + 12);
    std::copy_n(p.dst_gid.begin() + 12, 4, ip + 16);
    std::uint32_t sum = 0;
    for (std::size_t i = 0; i < ipv4_min_header; i += 2) sum += get16(ip + i);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    put16(ip + 10, static_cast<std::uint16_t>(~sum));
  } else {  // RFC 8200
    const std::uint32_t word0 = 6u << 28 | std::uint32_t{p.traffic_class} << 20 | (p.flow_label & 0xFFFFF);
    put32(ip, word0);
    put16(ip + 4, udp_len);
    ip[6] = std::byte{ip_proto_udp};  // next header
    ip[7] = static_cast<std::byte>(p.hop_limit);
    std::copy(p.src_gid.begin(), p.src_gid.end(), ip + 8);
    std::copy(p.dst_gid.begin(), p.dst_gid.end(), ip + 24);
  }

  std::byte* udp = ip + ip_len;
  put16(udp, p.src_port);
  put16(udp + 2, p.dst_port);
  put16(udp + 4, udp_len);
  put16(udp + 6, 0);  // rxe sends no UDP checksum, over IPv4 and IPv6 alike
  return ip_len + udp_header;
}

bool parse_grh_area(std::span<const std::byte, 40> area, grh_fields& out) noexcept {
  const std::byte* v4 = area.data() + 20;
  const bool says_v6 = (get32(area.data()) >> 28) == 6;
  bool is_v4 = (std::to_integer<unsigned>(v4[0]) >> 4) == 4;
  // Both plausible: the IPv4 header must be whole (IHL 5, as RoCEv2 sends
  // it) and its checksum valid, else the area is an IPv6 header whose
  // addresses happen to look so.
  if (says_v6 && is_v4) {
    std::uint32_t sum = 0;
    for (std::size_t i = 0; i < ipv4_min_header; i += 2) sum += get16(v4 + i);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    is_v4 = (std::to_integer<unsigned>(v4[0]) & 0xF) == 5 && sum == 0xFFFF;
  }
  grh_fields f;
  if (is_v4) {
    constexpr std::array<std::byte, 12> mapped{std::byte{0}, std::byte{0}, std::byte{0},    std::byte{0},
                                               std::byte{0}, std::byte{0}, std::byte{0},    std::byte{0},
                                               std::byte{0}, std::byte{0}, std::byte{0xFF}, std::byte{0xFF}};
    std::copy(mapped.begin(), mapped.end(), f.src.begin());
    std::copy(mapped.begin(), mapped.end(), f.dst.begin());
    std::copy_n(v4 + 12, 4, f.src.begin() + 12);
    std::copy_n(v4 + 16, 4, f.dst.begin() + 12);
    f.traffic_class = std::to_integer<std::uint8_t>(v4[1]);
  } else if (says_v6 && std::to_integer<unsigned>(area[6]) == ip_proto_udp) {
    // (rdma-core takes next header 0x1B too, as RoCEv1's: averbs has no
    // RoCEv1 GID to answer from.)
    const std::uint32_t word0 = get32(area.data());
    f.traffic_class = static_cast<std::uint8_t>(word0 >> 20);
    f.flow_label = word0 & 0xFFFFF;
    std::copy_n(area.data() + 8, 16, f.src.begin());
    std::copy_n(area.data() + 24, 16, f.dst.begin());
  } else {
    return false;
  }
  out = f;
  return true;
}

std::optional<std::uint32_t> icrc_prefix_cache::get(std::span<const std::byte, 16> src,
                                                    std::span<const std::byte, 16> dst, std::uint16_t src_port,
                                                    std::uint16_t dst_port, std::size_t transport_len) noexcept {
  static_assert(sizeof(key) == 40, "icrc_prefix_cache::key must have no padding");
  key k;
  std::memcpy(k.src.data(), src.data(), 16);
  std::memcpy(k.dst.data(), dst.data(), 16);
  k.src_port = src_port;
  k.dst_port = dst_port;
  k.transport_len = static_cast<std::uint32_t>(transport_len);
  // The addresses' last bytes tell flows on one host apart; the ports
  // tell QPs apart.
  std::uint32_t s, d;
  std::memcpy(&s, src.data() + 12, 4);
  std::memcpy(&d, dst.data() + 12, 4);
  std::uint64_t h = (std::uint64_t{s} << 32 | d) ^ (std::uint64_t{src_port} << 16 | dst_port) ^
                    (std::uint64_t{k.transport_len} << 40);
  h *= 0x9E3779B97F4A7C15ull;
  entry& e = cache_[h >> 60];
  if (e.used && std::memcmp(&e.k, &k, sizeof k) == 0 && transport_len == k.transport_len) return e.prefix;
  ip_udp_params p;
  std::copy(src.begin(), src.end(), p.src_gid.begin());
  std::copy(dst.begin(), dst.end(), p.dst_gid.begin());
  p.src_port = src_port;
  p.dst_port = dst_port;
  std::array<std::byte, ipv6_header + udp_header> hdr;
  const std::size_t n = build_ip_udp(p, transport_len, hdr);
  if (n == 0) return std::nullopt;  // and build_ip_udp took the length: 16 bits
  e.k = k;
  e.prefix = icrc_prefix(std::span(hdr.data(), n));
  e.used = true;
  return e.prefix;
}

std::uint16_t udp_source_port(std::uint32_t flow_label, std::uint32_t lqpn, std::uint32_t rqpn) noexcept {
  std::uint32_t fl = flow_label;
  if (fl == 0) {
    std::uint64_t v = std::uint64_t{lqpn} * rqpn;
    v ^= v >> 20;
    v ^= v >> 40;
    fl = static_cast<std::uint32_t>(v & 0xFFFFF);
  }
  // Fold the 20-bit flow label to 14 bits; RoCEv2 source ports are 0xC000-0xFFFF.
  const std::uint32_t folded = (fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14);
  return static_cast<std::uint16_t>(folded | 0xC000);
}

// --- timers -------------------------------------------------------------------------

std::uint64_t rnr_timer_ns(std::uint8_t code) noexcept {
  // IBTA 9.7.5.1.1 RNR NAK timer codes, in units of 10 us; code 0 is the
  // longest (655.36 ms).  Codes above 31 use their low 5 bits.
  static constexpr std::uint32_t ten_us[32] = {
      65536, 1,   2,   3,   4,    6,    8,    12,   16,   24,   32,   48,    64,    96,    128,   192,
      256,   384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  return std::uint64_t{ten_us[code & 0x1F]} * 10'000;
}

std::uint64_t ack_timeout_ns(std::uint8_t timeout) noexcept {
  if (timeout == 0) return 0;
  return std::uint64_t{4096} << std::min<unsigned>(timeout, 31);
}

}  // namespace averbs::wire
