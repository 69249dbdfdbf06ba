// SPDX-License-Identifier: MIT
// The RoCEv2 transport codec: opcode table, encode/decode, ICRC, IP/UDP
// headers, UDP source port and timers.  Reference vectors from
// shared/reference/roce.md section 7 (cross-checked against scapy).
#include "wire/roce.hpp"

#include <gtest/gtest.h>

#include <random>
#include <zlib.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace w = averbs::wire;
using bytes = std::vector<std::byte>;

bytes from_hex(std::string_view hex) {
  bytes out;
  int hi = -1;
  for (char c : hex) {
    int v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      v = c - 'A' + 10;
    } else {
      continue;  // spaces separate the parts of a vector
    }
    if (hi < 0) {
      hi = v;
    } else {
      out.push_back(static_cast<std::byte>(hi << 4 | v));
      hi = -1;
    }
  }
  return out;
}

bytes from_string(std::string_view s) {
  bytes out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::array<std::byte, 16> gid_v4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  std::array<std::byte, 16> g{};
  g[10] = g[11] = std::byte{0xFF};
  g[12] = std::byte{a}, g[13] = std::byte{b}, g[14] = std::byte{c}, g[15] = std::byte{d};
  return g;
}

std::array<std::byte, 16> gid_fd00(std::uint8_t last) {
  std::array<std::byte, 16> g{};
  g[0] = std::byte{0xFD};
  g[15] = std::byte{last};
  return g;
}

// A captured packet split at the IP/UDP | transport | ICRC boundaries.
struct vector_packet {
  bytes all;
  std::size_t ip_udp_len;

  std::span<const std::byte> ip_udp() const { return std::span(all).first(ip_udp_len); }
  std::span<const std::byte> transport_with_icrc() const { return std::span(all).subspan(ip_udp_len); }
  std::span<const std::byte> transport() const {
    return std::span(all).subspan(ip_udp_len, all.size() - ip_udp_len - w::icrc_size);
  }
  std::uint32_t wire_icrc() const {  // little-endian, assembled by hand
    const std::size_t n = all.size();
    return std::to_integer<std::uint32_t>(all[n - 4]) | std::to_integer<std::uint32_t>(all[n - 3]) << 8 |
           std::to_integer<std::uint32_t>(all[n - 2]) << 16 |
           std::to_integer<std::uint32_t>(all[n - 1]) << 24;
  }
};

// IPv4 RC SEND_ONLY, DQPN 0x11, PSN 100, AckReq, "hello" + 3 pad, ID 0x1234 DF, sport 0xC123.
const vector_packet v4_send{
    from_hex("45000034123440004011a481c0000201c0000202 c12312b700200000 0430ffff0000001180000064 "
             "68656c6c6f 000000 c9bbd7a0"),
    28};
// IPv4 RC ACK, DQPN 0x12, PSN 100, AETH 0x1F / MSN 1.
const vector_packet v4_ack{
    from_hex("45000030123440004011a485c0000201c0000202 c12312b7001c0000 1100ffff0000001200000064 "
             "1f000001 73ea64c4"),
    28};
// IPv6 RC SEND_ONLY, TC 0x12, FL 0xABCDE, hop 64, UDP checksum 0x1234, fd00::1 -> fd00::2,
// DQPN 0x22, PSN 5, "abcdefg" + 1 pad.
const vector_packet v6_send{
    from_hex("612abcde00201140 fd000000000000000000000000000001 fd000000000000000000000000000002 "
             "c00112b700201234 0410ffff0000002280000005 61626364656667 00 a6125167"),
    48};

w::packet_view decode_ok(std::span<const std::byte> pkt, bool has_icrc) {
  w::packet_view v;
  EXPECT_EQ(w::decode(pkt, has_icrc, v), w::decode_error::ok);
  return v;
}

// Feeds the transport bytes to an icrc_builder cut at the given offsets.
std::uint32_t icrc_in_pieces(const vector_packet& v, std::initializer_list<std::size_t> cuts) {
  w::icrc_builder b(v.ip_udp());
  const auto t = v.transport();
  std::size_t at = 0;
  for (std::size_t cut : cuts) {
    b.add(t.subspan(at, cut - at));
    at = cut;
  }
  b.add(t.subspan(at));
  return b.value();
}

bytes encode_bytes(const w::transport_headers& h) {
  bytes out(w::max_header_size);
  out.resize(w::encode(h, out));
  return out;
}

// ---------------------------------------------------------------------------
// Reference vectors

TEST(roce_vectors, ipv4_send_only_decodes_every_field) {
  const auto v = decode_ok(v4_send.transport_with_icrc(), true);
  ASSERT_NE(v.op, nullptr);
  EXPECT_EQ(v.op, &w::info(w::opcode::rc_send_only));
  const w::bth& b = v.hdr.bth;
  EXPECT_EQ(b.opcode, 0x04);
  EXPECT_FALSE(b.se);
  EXPECT_FALSE(b.mig_req);
  EXPECT_EQ(b.pad, 3);
  EXPECT_EQ(b.tver, 0);
  EXPECT_EQ(b.pkey, 0xFFFF);
  EXPECT_FALSE(b.fecn);
  EXPECT_FALSE(b.becn);
  EXPECT_EQ(b.dest_qp, 0x11u);
  EXPECT_TRUE(b.ack_req);
  EXPECT_EQ(b.psn, 100u);
  EXPECT_EQ(v.payload.size(), 5u);
  EXPECT_TRUE(std::equal(v.payload.begin(), v.payload.end(), from_string("hello").begin()));
  EXPECT_EQ(v.icrc, 0xA0D7BBC9u);
}

TEST(roce_vectors, ipv4_send_only_icrc_matches_vector) {
  EXPECT_EQ(w::icrc(v4_send.ip_udp(), v4_send.transport()), v4_send.wire_icrc());
}

TEST(roce_vectors, ipv4_send_only_icrc_builder_in_pieces_matches_vector) {
  // BTH longer than 12 bytes in the first piece, then payload and pad apart.
  EXPECT_EQ(icrc_in_pieces(v4_send, {14, 17}), v4_send.wire_icrc());
  // Headers alone, payload, pad: the engine's zero-copy order.
  EXPECT_EQ(icrc_in_pieces(v4_send, {12, 17}), v4_send.wire_icrc());
  // Every two-piece split, including those that cut the BTH before or at
  // its byte 4 (masked wherever it falls), and the BTH a byte at a time.
  for (std::size_t cut = 1; cut <= v4_send.transport().size(); ++cut) {
    EXPECT_EQ(icrc_in_pieces(v4_send, {cut}), v4_send.wire_icrc()) << "cut at " << cut;
  }
  EXPECT_EQ(icrc_in_pieces(v4_send, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), v4_send.wire_icrc());
}

TEST(roce_vectors, ipv4_send_only_reencodes_byte_identical) {
  const auto v = decode_ok(v4_send.transport_with_icrc(), true);
  const bytes hdr = encode_bytes(v.hdr);
  ASSERT_EQ(hdr.size(), 12u);
  EXPECT_TRUE(std::equal(hdr.begin(), hdr.end(), v4_send.transport().begin()));

  w::ip_udp_params p;
  p.src_gid = gid_v4(192, 0, 2, 1);
  p.dst_gid = gid_v4(192, 0, 2, 2);
  p.src_port = 0xC123;
  p.ip_id = 0x1234;
  bytes ip(64);
  ASSERT_EQ(w::build_ip_udp(p, v4_send.transport_with_icrc().size(), ip), 28u);
  EXPECT_TRUE(std::equal(v4_send.ip_udp().begin(), v4_send.ip_udp().end(), ip.begin()));
}

TEST(roce_vectors, ipv4_ack_decodes_every_field) {
  const auto v = decode_ok(v4_ack.transport_with_icrc(), true);
  EXPECT_EQ(v.op, &w::info(w::opcode::rc_ack));
  const w::bth& b = v.hdr.bth;
  EXPECT_EQ(b.opcode, 0x11);
  EXPECT_FALSE(b.se);
  EXPECT_FALSE(b.mig_req);
  EXPECT_EQ(b.pad, 0);
  EXPECT_EQ(b.pkey, 0xFFFF);
  EXPECT_FALSE(b.fecn);
  EXPECT_FALSE(b.becn);
  EXPECT_EQ(b.dest_qp, 0x12u);
  EXPECT_FALSE(b.ack_req);
  EXPECT_EQ(b.psn, 100u);
  EXPECT_EQ(v.hdr.aeth.syndrome, w::aeth_ack_unlimited);
  EXPECT_EQ(w::aeth_type_of(v.hdr.aeth.syndrome), w::aeth_type::ack);
  EXPECT_EQ(v.hdr.aeth.msn, 1u);
  EXPECT_TRUE(v.payload.empty());
  EXPECT_EQ(v.icrc, 0xC464EA73u);
}

TEST(roce_vectors, ipv4_ack_icrc_matches_vector) {
  EXPECT_EQ(w::icrc(v4_ack.ip_udp(), v4_ack.transport()), v4_ack.wire_icrc());
}

TEST(roce_vectors, ipv4_ack_icrc_builder_in_pieces_matches_vector) {
  EXPECT_EQ(icrc_in_pieces(v4_ack, {12}), v4_ack.wire_icrc());
  EXPECT_EQ(icrc_in_pieces(v4_ack, {6, 13, 14}), v4_ack.wire_icrc());
}

TEST(roce_vectors, ipv4_ack_reencodes_byte_identical) {
  const auto v = decode_ok(v4_ack.transport_with_icrc(), true);
  const bytes hdr = encode_bytes(v.hdr);
  ASSERT_EQ(hdr.size(), 16u);
  EXPECT_TRUE(std::equal(hdr.begin(), hdr.end(), v4_ack.transport().begin()));

  w::ip_udp_params p;
  p.src_gid = gid_v4(192, 0, 2, 1);
  p.dst_gid = gid_v4(192, 0, 2, 2);
  p.src_port = 0xC123;
  p.ip_id = 0x1234;
  bytes ip(28);
  ASSERT_EQ(w::build_ip_udp(p, v4_ack.transport_with_icrc().size(), ip), 28u);
  EXPECT_TRUE(std::equal(v4_ack.ip_udp().begin(), v4_ack.ip_udp().end(), ip.begin()));
}

TEST(roce_vectors, ipv6_send_only_decodes_every_field) {
  const auto v = decode_ok(v6_send.transport_with_icrc(), true);
  EXPECT_EQ(v.op, &w::info(w::opcode::rc_send_only));
  const w::bth& b = v.hdr.bth;
  EXPECT_EQ(b.opcode, 0x04);
  EXPECT_FALSE(b.se);
  EXPECT_FALSE(b.mig_req);
  EXPECT_EQ(b.pad, 1);
  EXPECT_EQ(b.pkey, 0xFFFF);
  EXPECT_FALSE(b.fecn);
  EXPECT_FALSE(b.becn);
  EXPECT_EQ(b.dest_qp, 0x22u);
  EXPECT_TRUE(b.ack_req);
  EXPECT_EQ(b.psn, 5u);
  ASSERT_EQ(v.payload.size(), 7u);
  EXPECT_TRUE(std::equal(v.payload.begin(), v.payload.end(), from_string("abcdefg").begin()));
  EXPECT_EQ(v.icrc, 0x675112A6u);
}

TEST(roce_vectors, ipv6_send_only_icrc_matches_vector_with_masked_tc_flow_label_and_udp_checksum) {
  EXPECT_EQ(w::icrc(v6_send.ip_udp(), v6_send.transport()), v6_send.wire_icrc());
}

TEST(roce_vectors, ipv6_send_only_icrc_builder_in_pieces_matches_vector) {
  EXPECT_EQ(icrc_in_pieces(v6_send, {12, 19}), v6_send.wire_icrc());
  EXPECT_EQ(icrc_in_pieces(v6_send, {16, 17, 18}), v6_send.wire_icrc());
}

TEST(roce_vectors, ipv6_send_only_reencodes_byte_identical_except_udp_checksum) {
  const auto v = decode_ok(v6_send.transport_with_icrc(), true);
  const bytes hdr = encode_bytes(v.hdr);
  ASSERT_EQ(hdr.size(), 12u);
  EXPECT_TRUE(std::equal(hdr.begin(), hdr.end(), v6_send.transport().begin()));

  w::ip_udp_params p;
  p.src_gid = gid_fd00(1);
  p.dst_gid = gid_fd00(2);
  p.src_port = 0xC001;
  p.traffic_class = 0x12;
  p.flow_label = 0xABCDE;
  p.hop_limit = 64;
  bytes ip(48);
  ASSERT_EQ(w::build_ip_udp(p, v6_send.transport_with_icrc().size(), ip), 48u);
  // We send UDP checksum 0; the vector carries 0x1234 (masked in the ICRC).
  EXPECT_TRUE(std::equal(ip.begin(), ip.begin() + 46, v6_send.ip_udp().begin()));
  EXPECT_EQ(ip[46], std::byte{0});
  EXPECT_EQ(ip[47], std::byte{0});
  EXPECT_EQ(w::icrc(ip, v6_send.transport()), v6_send.wire_icrc());
}

// Guards against a mistake the implementation and these tests could share:
// zlib's CRC-32 over a buffer masked here, byte by byte, per roce.md 1.6.
TEST(roce_vectors, ipv4_icrc_matches_zlib_over_explicitly_masked_buffer) {
  bytes buf(8, std::byte{0xFF});
  buf.insert(buf.end(), v4_send.all.begin(), v4_send.all.end() - 4);
  const std::size_t ip = 8, udp = ip + 20, bth = udp + 8;
  for (std::size_t i : {ip + 1, ip + 8, ip + 10, ip + 11, udp + 6, udp + 7, bth + 4})
    buf[i] = std::byte{0xFF};
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(buf.size()));
  EXPECT_EQ(static_cast<std::uint32_t>(crc), v4_send.wire_icrc());
  EXPECT_EQ(static_cast<std::uint32_t>(crc), w::icrc(v4_send.ip_udp(), v4_send.transport()));
}

// The builder gathers short pieces and sends long ones straight through the
// CRC: any cutting of a packet of any length gives zlib's CRC-32 over the
// explicitly masked bytes.
TEST(roce_icrc, builder_in_pieces_of_every_size_matches_zlib_over_masked_packet) {
  std::uint32_t seed = 12345;
  auto rnd = [&] { return seed = seed * 1103515245u + 12345u, seed >> 8; };
  for (std::size_t payload : {0u, 4u, 100u, 150u, 160u, 200u, 333u, 1024u, 4096u}) {
    bytes pkt = v4_send.all;  // IPv4 + UDP + BTH, then a payload of our own
    pkt.resize(28 + 12);
    for (std::size_t i = 0; i < payload; ++i) pkt.push_back(static_cast<std::byte>(rnd()));
    bytes masked(8 + pkt.size(), std::byte{0xFF});
    std::copy(pkt.begin(), pkt.end(), masked.begin() + 8);
    for (std::size_t i : {8u + 1, 8u + 8, 8u + 10, 8u + 11, 8u + 26, 8u + 27, 8u + 32}) masked[i] = std::byte{0xFF};
    const auto want = static_cast<std::uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(masked.data()), static_cast<uInt>(masked.size())));
    const auto ip_udp = std::span<const std::byte>(pkt).first(28);
    const auto transport = std::span<const std::byte>(pkt).subspan(28);
    EXPECT_EQ(w::icrc(ip_udp, transport), want) << "payload " << payload;
    for (int trial = 0; trial < 50; ++trial) {
      w::icrc_builder b(ip_udp);
      std::size_t at = 0;
      bool first = true;
      while (at < transport.size()) {
        // The first piece holds the whole BTH (the builder's contract);
        // later ones are 1 to 300 bytes, so some fill the gather buffer
        // exactly, some overflow it and some bypass it.
        std::size_t n = first ? 12 + rnd() % 40 : 1 + rnd() % 300;
        n = std::min(n, transport.size() - at);
        b.add(transport.subspan(at, n));
        at += n;
        first = false;
      }
      ASSERT_EQ(b.value(), want) << "payload " << payload << " trial " << trial;
    }
  }
}

// ---------------------------------------------------------------------------
// ICRC properties

TEST(roce_icrc, ignores_ipv4_tos_ttl_checksum_udp_checksum_and_bth_byte_4) {
  bytes pkt = v4_send.all;
  pkt[1] = std::byte{0x03};             // ECN CE
  pkt[8] = std::byte{0x01};             // TTL
  pkt[10] = pkt[11] = std::byte{0x5A};  // IP checksum
  pkt[26] = pkt[27] = std::byte{0xA5};  // UDP checksum
  pkt[28 + 4] = std::byte{0xC0};        // FECN, BECN
  const auto ip_udp = std::span<const std::byte>(pkt).first(28);
  const auto transport = std::span<const std::byte>(pkt).subspan(28, pkt.size() - 28 - 4);
  EXPECT_EQ(w::icrc(ip_udp, transport), v4_send.wire_icrc());
}

TEST(roce_icrc, covers_the_ipv4_identification) {
  bytes pkt = v4_send.all;
  pkt[5] ^= std::byte{0x01};
  const auto ip_udp = std::span<const std::byte>(pkt).first(28);
  EXPECT_NE(w::icrc(ip_udp, v4_send.transport()), v4_send.wire_icrc());
}

TEST(roce_icrc, covers_udp_ports_length_and_payload) {
  for (std::size_t i : {20u, 21u, 22u, 23u, 24u, 25u, 28u + 12u, 28u + 17u}) {
    bytes pkt = v4_send.all;
    pkt[i] ^= std::byte{0x80};
    const auto ip_udp = std::span<const std::byte>(pkt).first(28);
    const auto transport = std::span<const std::byte>(pkt).subspan(28, pkt.size() - 32);
    EXPECT_NE(w::icrc(ip_udp, transport), v4_send.wire_icrc()) << "byte " << i;
  }
}

TEST(roce_icrc, store_writes_least_significant_byte_first_and_load_reads_it_back) {
  std::array<std::byte, 4> out{};
  w::store_icrc(0xA0D7BBC9u, out);
  EXPECT_EQ(out[0], std::byte{0xC9});
  EXPECT_EQ(out[1], std::byte{0xBB});
  EXPECT_EQ(out[2], std::byte{0xD7});
  EXPECT_EQ(out[3], std::byte{0xA0});
  EXPECT_EQ(w::load_icrc(out), 0xA0D7BBC9u);
}

// ---------------------------------------------------------------------------
// Opcode table

struct expected_op {
  w::opcode op;
  std::uint8_t length;
  std::uint16_t headers;
};

constexpr expected_op every_opcode[] = {
    {w::opcode::rc_send_first, 12, 0},
    {w::opcode::rc_send_middle, 12, 0},
    {w::opcode::rc_send_last, 12, 0},
    {w::opcode::rc_send_last_imm, 16, w::hdr_immdt},
    {w::opcode::rc_send_only, 12, 0},
    {w::opcode::rc_send_only_imm, 16, w::hdr_immdt},
    {w::opcode::rc_write_first, 28, w::hdr_reth},
    {w::opcode::rc_write_middle, 12, 0},
    {w::opcode::rc_write_last, 12, 0},
    {w::opcode::rc_write_last_imm, 16, w::hdr_immdt},
    {w::opcode::rc_write_only, 28, w::hdr_reth},
    {w::opcode::rc_write_only_imm, 32, w::hdr_reth | w::hdr_immdt},
    {w::opcode::rc_read_request, 28, w::hdr_reth},
    {w::opcode::rc_read_response_first, 16, w::hdr_aeth},
    {w::opcode::rc_read_response_middle, 12, 0},
    {w::opcode::rc_read_response_last, 16, w::hdr_aeth},
    {w::opcode::rc_read_response_only, 16, w::hdr_aeth},
    {w::opcode::rc_ack, 16, w::hdr_aeth},
    {w::opcode::rc_atomic_ack, 24, w::hdr_aeth | w::hdr_atmack},
    {w::opcode::rc_compare_swap, 40, w::hdr_atmeth},
    {w::opcode::rc_fetch_add, 40, w::hdr_atmeth},
    {w::opcode::rc_send_last_inv, 16, w::hdr_ieth},
    {w::opcode::rc_send_only_inv, 16, w::hdr_ieth},
    {w::opcode::rc_flush, 32, w::hdr_feth | w::hdr_reth},
    {w::opcode::rc_atomic_write, 28, w::hdr_reth},
    {w::opcode::uc_send_first, 12, 0},
    {w::opcode::uc_send_middle, 12, 0},
    {w::opcode::uc_send_last, 12, 0},
    {w::opcode::uc_send_last_imm, 16, w::hdr_immdt},
    {w::opcode::uc_send_only, 12, 0},
    {w::opcode::uc_send_only_imm, 16, w::hdr_immdt},
    {w::opcode::uc_write_first, 28, w::hdr_reth},
    {w::opcode::uc_write_middle, 12, 0},
    {w::opcode::uc_write_last, 12, 0},
    {w::opcode::uc_write_last_imm, 16, w::hdr_immdt},
    {w::opcode::uc_write_only, 28, w::hdr_reth},
    {w::opcode::uc_write_only_imm, 32, w::hdr_reth | w::hdr_immdt},
    {w::opcode::ud_send_only, 20, w::hdr_deth},
    {w::opcode::ud_send_only_imm, 24, w::hdr_deth | w::hdr_immdt},
    {w::opcode::cnp, 28, 0},
};

TEST(roce_opcode_table, every_enum_opcode_has_its_headers_and_length) {
  for (const auto& e : every_opcode) {
    const auto& i = w::info(e.op);
    SCOPED_TRACE(i.name);
    EXPECT_TRUE(i.valid);
    EXPECT_EQ(i.length, e.length);
    EXPECT_EQ(i.headers, e.headers);
    EXPECT_LE(i.length, w::max_header_size);
  }
}

TEST(roce_opcode_table, transport_follows_the_opcode_high_bits) {
  for (const auto& e : every_opcode) {
    const auto& i = w::info(e.op);
    const auto op = static_cast<std::uint8_t>(e.op);
    const auto expected = op == 0x81 ? w::transport::cnp : static_cast<w::transport>(op >> 5);
    EXPECT_EQ(i.tp, expected) << i.name;
    const std::string_view prefix = i.tp == w::transport::rc   ? "RC "
                                    : i.tp == w::transport::uc ? "UC "
                                    : i.tp == w::transport::ud ? "UD "
                                                               : "CNP";
    EXPECT_EQ(std::string_view(i.name).substr(0, prefix.size()), prefix);
  }
}

TEST(roce_opcode_table, names_follow_wireshark) {
  EXPECT_STREQ(w::info(w::opcode::rc_send_only).name, "RC SEND Only");
  EXPECT_STREQ(w::info(w::opcode::rc_write_only_imm).name, "RC RDMA WRITE Only with Immediate");
  EXPECT_STREQ(w::info(w::opcode::rc_read_response_middle).name, "RC RDMA READ response Middle");
  EXPECT_STREQ(w::info(w::opcode::rc_ack).name, "RC Acknowledge");
  EXPECT_STREQ(w::info(w::opcode::rc_compare_swap).name, "RC CmpSwap");
  EXPECT_STREQ(w::info(w::opcode::ud_send_only_imm).name, "UD SEND Only with Immediate");
  EXPECT_STREQ(w::info(w::opcode::cnp).name, "CNP");
}

// FLUSH (IBTA 1.5): the FETH comes before the RETH on the wire.
TEST(roce_codec, flush_puts_the_feth_before_the_reth) {
  w::transport_headers h;
  h.bth.opcode = static_cast<std::uint8_t>(w::opcode::rc_flush);
  h.feth = 0x11;  // selectivity 1, placement 1
  h.reth = {0x1122334455667788, 0xAABBCCDD, 0x100};
  const bytes b = encode_bytes(h);
  ASSERT_EQ(b.size(), 32u);
  EXPECT_EQ(b[12], std::byte{0});
  EXPECT_EQ(b[15], std::byte{0x11});
  EXPECT_EQ(b[16], std::byte{0x11});  // the RETH's VA, most significant byte first
  EXPECT_EQ(b[31], std::byte{0x00});  // its length's low byte (0x100)
  EXPECT_EQ(b[30], std::byte{0x01});
}

TEST(roce_opcode_table, unassigned_opcodes_are_invalid) {
  std::set<int> assigned;
  for (const auto& e : every_opcode) assigned.insert(static_cast<int>(e.op));
  for (int op = 0; op < 256; ++op) {
    EXPECT_EQ(w::info(static_cast<std::uint8_t>(op)).valid, assigned.count(op) == 1) << "opcode " << op;
  }
  // RD, unassigned RC slots, vendor space.
  for (int op : {0x15, 0x18, 0x1B, 0x1E, 0x1F, 0x2C, 0x40, 0x60, 0x66, 0x80, 0xE0, 0xFF}) {
    EXPECT_FALSE(w::info(static_cast<std::uint8_t>(op)).valid) << "opcode " << op;
    EXPECT_EQ(w::info(static_cast<std::uint8_t>(op)).tp, w::transport::invalid);
  }
}

TEST(roce_opcode_table, op_bits_classify_requests_responses_and_payload) {
  for (const auto& e : every_opcode) {
    const auto& i = w::info(e.op);
    SCOPED_TRACE(i.name);
    if (e.op == w::opcode::cnp) {
      EXPECT_EQ(i.ops, 0);
      continue;
    }
    EXPECT_NE(!(i.ops & w::op_request), !(i.ops & w::op_response)) << "exactly one of request/response";
    if (i.ops & w::op_only) {
      EXPECT_EQ(i.ops & (w::op_first | w::op_last), w::op_first | w::op_last);
    }
    EXPECT_EQ((i.ops & w::op_imm) != 0, (i.headers & w::hdr_immdt) != 0);
    EXPECT_EQ((i.ops & w::op_inv) != 0, (i.headers & w::hdr_ieth) != 0);
  }
  for (auto op : {w::opcode::rc_read_request, w::opcode::rc_ack, w::opcode::rc_atomic_ack,
                  w::opcode::rc_compare_swap, w::opcode::rc_fetch_add, w::opcode::rc_flush, w::opcode::cnp}) {
    EXPECT_FALSE(w::info(op).ops & w::op_payload) << w::info(op).name;
  }
  EXPECT_TRUE(w::info(w::opcode::rc_read_response_middle).ops & w::op_payload);
  EXPECT_TRUE(w::info(w::opcode::rc_ack).ops & w::op_ack);
  EXPECT_TRUE(w::info(w::opcode::rc_atomic_ack).ops & w::op_ack);
  EXPECT_FALSE(w::info(w::opcode::rc_read_response_only).ops & w::op_ack);
  // ATOMIC WRITE: a request with RETH and payload, neither a WRITE (no
  // message to continue) nor a fetching atomic (no AtomicETH).
  const auto& aw = w::info(w::opcode::rc_atomic_write);
  EXPECT_EQ(aw.ops & (w::op_request | w::op_only | w::op_payload | w::op_atomic_write),
            w::op_request | w::op_only | w::op_payload | w::op_atomic_write);
  EXPECT_EQ(aw.ops & (w::op_write | w::op_atomic | w::op_read | w::op_send), 0);
  EXPECT_TRUE(w::info(w::opcode::rc_flush).ops & w::op_flush);
}

// ---------------------------------------------------------------------------
// encode / decode

// Field values with bits beyond their widths set, to check the masking.
w::transport_headers busy_headers(std::uint8_t op, std::uint8_t pad) {
  w::transport_headers h;
  h.bth.opcode = op;
  h.bth.se = true;
  h.bth.mig_req = true;
  h.bth.pad = pad;
  h.bth.pkey = 0x8001;
  h.bth.fecn = true;
  h.bth.becn = true;
  h.bth.dest_qp = 0xFF123456;
  h.bth.ack_req = true;
  h.bth.psn = 0xAB654321;
  h.deth = {0x11223344, 0xEE000042};
  h.reth = {0x0102030405060708, 0x8899AABB, 0x7FFFFFFF};
  h.atomic = {0xF0E0D0C0B0A09080, 0xCAFEBABE, 0x1111222233334444, 0x5555666677778888};
  h.aeth = {w::aeth_nak(w::nak_code::remote_access_error), 0xFFABCDEF};
  h.atomic_ack = 0x0123456789ABCDEF;
  h.imm = 0xDDCCBBAA;
  h.ieth_rkey = 0x31415926;
  h.feth = 0xFFFFFF21;  // reserved bits set: only 5:0 are the FETH's fields
  return h;
}

TEST(roce_codec, round_trip_every_opcode_preserves_fields_masked_to_their_widths) {
  const bytes payload = from_string("payload");  // 7 bytes + 1 pad
  for (const auto& e : every_opcode) {
    const auto& i = w::info(e.op);
    SCOPED_TRACE(i.name);
    const bool carries = i.ops & w::op_payload;
    const auto in = busy_headers(static_cast<std::uint8_t>(e.op), carries ? 1 : 0);
    bytes pkt(w::max_header_size);
    const std::size_t n = w::encode(in, pkt);
    ASSERT_EQ(n, i.length);
    pkt.resize(n);
    if (carries) {
      pkt.insert(pkt.end(), payload.begin(), payload.end());
      pkt.push_back(std::byte{0});
    }
    pkt.insert(pkt.end(), {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}});

    w::packet_view v;
    ASSERT_EQ(w::decode(pkt, true, v), w::decode_error::ok);
    EXPECT_EQ(v.op, &i);
    EXPECT_EQ(v.icrc, 0x04030201u);
    EXPECT_EQ(v.payload.size(), carries ? payload.size() : 0u);
    if (carries) {
      EXPECT_EQ(v.payload.data(), pkt.data() + n);
    }

    const w::bth& b = v.hdr.bth;
    EXPECT_EQ(b.opcode, in.bth.opcode);
    EXPECT_TRUE(b.se);
    EXPECT_TRUE(b.mig_req);
    EXPECT_EQ(b.pad, carries ? 1 : 0);
    EXPECT_EQ(b.pkey, 0x8001);
    EXPECT_TRUE(b.fecn);
    EXPECT_TRUE(b.becn);
    EXPECT_EQ(b.dest_qp, 0x123456u);
    EXPECT_TRUE(b.ack_req);
    EXPECT_EQ(b.psn, 0x654321u);

    const w::transport_headers none;
    const auto h = v.hdr;
    if (i.headers & w::hdr_deth) {
      EXPECT_EQ(h.deth.qkey, 0x11223344u);
      EXPECT_EQ(h.deth.src_qp, 0x42u);
    } else {
      EXPECT_EQ(h.deth.qkey, none.deth.qkey);
      EXPECT_EQ(h.deth.src_qp, none.deth.src_qp);
    }
    if (i.headers & w::hdr_reth) {
      EXPECT_EQ(h.reth.va, in.reth.va);
      EXPECT_EQ(h.reth.rkey, in.reth.rkey);
      EXPECT_EQ(h.reth.length, in.reth.length);
    } else {
      EXPECT_EQ(h.reth.va, 0u);
      EXPECT_EQ(h.reth.rkey, 0u);
      EXPECT_EQ(h.reth.length, 0u);
    }
    if (i.headers & w::hdr_atmeth) {
      EXPECT_EQ(h.atomic.va, in.atomic.va);
      EXPECT_EQ(h.atomic.rkey, in.atomic.rkey);
      EXPECT_EQ(h.atomic.swap_add, in.atomic.swap_add);
      EXPECT_EQ(h.atomic.compare, in.atomic.compare);
    } else {
      EXPECT_EQ(h.atomic.va, 0u);
      EXPECT_EQ(h.atomic.swap_add, 0u);
      EXPECT_EQ(h.atomic.compare, 0u);
    }
    if (i.headers & w::hdr_aeth) {
      EXPECT_EQ(h.aeth.syndrome, 0x62);
      EXPECT_EQ(h.aeth.msn, 0xABCDEFu);
    } else {
      EXPECT_EQ(h.aeth.syndrome, 0);
      EXPECT_EQ(h.aeth.msn, 0u);
    }
    EXPECT_EQ(h.atomic_ack, (i.headers & w::hdr_atmack) ? in.atomic_ack : 0u);
    EXPECT_EQ(h.imm, (i.headers & w::hdr_immdt) ? in.imm : 0u);
    EXPECT_EQ(h.ieth_rkey, (i.headers & w::hdr_ieth) ? in.ieth_rkey : 0u);
    EXPECT_EQ(h.feth, (i.headers & w::hdr_feth) ? 0x21u : 0u);

    // And back: the decoded headers encode to the same bytes.
    const bytes again = encode_bytes(v.hdr);
    EXPECT_TRUE(std::equal(again.begin(), again.end(), pkt.begin()));
    EXPECT_EQ(again.size(), n);
  }
}

TEST(roce_codec, encode_writes_exactly_info_length_bytes) {
  for (const auto& e : every_opcode) {
    const auto& i = w::info(e.op);
    bytes out(w::max_header_size + 8, std::byte{0xEE});
    EXPECT_EQ(w::encode(busy_headers(static_cast<std::uint8_t>(e.op), 0), out), i.length) << i.name;
    for (std::size_t k = i.length; k < out.size(); ++k) ASSERT_EQ(out[k], std::byte{0xEE}) << i.name;
  }
}

TEST(roce_codec, encode_writes_bth_reserved_bits_and_cnp_reserved_bytes_as_zero) {
  bytes out(w::max_header_size, std::byte{0xFF});
  ASSERT_EQ(w::encode(busy_headers(0x81, 0), out), 28u);
  EXPECT_EQ(out[4], std::byte{0xC0});  // FECN, BECN; Resv6 zero
  EXPECT_EQ(out[8], std::byte{0x80});  // AckReq; Resv7 zero
  for (std::size_t k = 12; k < 28; ++k) EXPECT_EQ(out[k], std::byte{0}) << k;

  ASSERT_EQ(w::encode(busy_headers(0x64, 0), out), 20u);
  EXPECT_EQ(out[12 + 4], std::byte{0});  // DETH reserved byte
}

TEST(roce_codec, encode_refuses_unassigned_opcode) {
  bytes out(w::max_header_size);
  EXPECT_EQ(w::encode(busy_headers(0x15, 0), out), 0u);
  EXPECT_EQ(w::encode(busy_headers(0x40, 0), out), 0u);
}

TEST(roce_codec, encode_refuses_buffer_shorter_than_the_headers) {
  bytes out(39);
  EXPECT_EQ(w::encode(busy_headers(0x13, 0), out), 0u);
  out.resize(40);
  EXPECT_EQ(w::encode(busy_headers(0x13, 0), out), 40u);
}

TEST(roce_codec, immediate_data_keeps_network_byte_order) {
  const bytes pkt = from_hex("0500ffff00000011 00000001 11223344");
  w::packet_view v;
  ASSERT_EQ(w::decode(pkt, false, v), w::decode_error::ok);
  std::uint32_t expected;
  std::memcpy(&expected, pkt.data() + 12, 4);
  EXPECT_EQ(v.hdr.imm, expected);
  const bytes again = encode_bytes(v.hdr);
  EXPECT_TRUE(std::equal(again.begin(), again.end(), pkt.begin()));
}

TEST(roce_codec, decode_truncated_below_header_size_is_too_short) {
  for (const auto& e : every_opcode) {
    const auto& i = w::info(e.op);
    bytes full(w::max_header_size);
    full.resize(w::encode(busy_headers(static_cast<std::uint8_t>(e.op), 0), full));
    full.insert(full.end(), 4, std::byte{0});
    for (std::size_t len = 0; len < i.length + w::icrc_size; ++len) {
      w::packet_view v;
      EXPECT_EQ(w::decode(std::span(full).first(len), true, v), w::decode_error::too_short)
          << i.name << " length " << len;
      if (len < i.length) {
        EXPECT_EQ(w::decode(std::span(full).first(len), false, v), w::decode_error::too_short)
            << i.name << " length " << len << " without ICRC";
      }
    }
  }
}

TEST(roce_codec, decode_unassigned_opcode_is_bad_opcode) {
  bytes pkt(64);
  for (int op = 0; op < 256; ++op) {
    if (w::info(static_cast<std::uint8_t>(op)).valid) continue;
    pkt[0] = static_cast<std::byte>(op);
    w::packet_view v;
    EXPECT_EQ(w::decode(pkt, true, v), w::decode_error::bad_opcode) << "opcode " << op;
    EXPECT_EQ(v.op, nullptr);
  }
}

TEST(roce_codec, decode_nonzero_tver_is_bad_tver) {
  for (std::uint8_t tver = 1; tver < 16; ++tver) {
    bytes pkt = v4_send.all;
    pkt[28 + 1] = static_cast<std::byte>(0x30 | tver);
    w::packet_view v;
    EXPECT_EQ(w::decode(std::span(pkt).subspan(28), true, v), w::decode_error::bad_tver) << int{tver};
  }
}

TEST(roce_codec, decode_pad_longer_than_payload_area_is_bad_pad) {
  // SEND_ONLY, pad 3, only 2 bytes after the BTH (ICRC excluded).
  const bytes pkt = from_hex("0430ffff0000001180000064 6869 00000000");
  w::packet_view v;
  EXPECT_EQ(w::decode(pkt, true, v), w::decode_error::bad_pad);
}

// The pad count is what aligns the payload to 4 bytes, exactly: 3 bytes
// of pad behind 3 of payload, 3 behind none, or none behind 5 are
// malformed (decode_headers() refused them already; decode() took them).
TEST(roce_codec, decode_pad_not_aligning_the_payload_is_bad_pad) {
  w::packet_view v;
  // Without ICRC: 6 bytes of area with pad 3 (3 + 3).
  EXPECT_EQ(w::decode(from_hex("0430ffff0000001180000064 6869 00000000"), false, v), w::decode_error::bad_pad);
  // Pad 3 filling the whole area: an empty payload takes no pad.
  EXPECT_EQ(w::decode(from_hex("0430ffff0000001180000064 000000 00000000"), true, v), w::decode_error::bad_pad);
  // Five bytes of payload and pad 0.
  EXPECT_EQ(w::decode(from_hex("0400ffff0000001180000064 6869707172 00000000"), true, v), w::decode_error::bad_pad);
  // Five bytes and pad 3: right.
  ASSERT_EQ(w::decode(from_hex("0430ffff0000001180000064 6869707172 000000 00000000"), true, v), w::decode_error::ok);
  EXPECT_EQ(v.payload.size(), 5u);
}

TEST(roce_codec, decode_pad_on_opcode_without_payload_is_bad_pad) {
  // ACK with pad 1 and nothing after the AETH.
  const bytes pkt = from_hex("1110ffff0000001200000064 1f000001");
  w::packet_view v;
  EXPECT_EQ(w::decode(pkt, false, v), w::decode_error::bad_pad);
}

TEST(roce_codec, decode_payload_on_ack_is_bad_length) {
  bytes pkt(v4_ack.transport().begin(), v4_ack.transport().end());
  pkt.insert(pkt.end(), 4, std::byte{0x61});
  w::packet_view v;
  EXPECT_EQ(w::decode(pkt, false, v), w::decode_error::bad_length);
}

TEST(roce_codec, decode_payload_on_read_request_is_bad_length) {
  bytes pkt(w::max_header_size);
  pkt.resize(w::encode(busy_headers(0x0C, 0), pkt));
  pkt.insert(pkt.end(), 8, std::byte{0});  // 4 bytes "payload" + ICRC
  w::packet_view v;
  EXPECT_EQ(w::decode(pkt, true, v), w::decode_error::bad_length);
  pkt.resize(pkt.size() - 4);
  EXPECT_EQ(w::decode(pkt, true, v), w::decode_error::ok);
}

TEST(roce_codec, decode_payload_on_atomics_is_bad_length) {
  for (std::uint8_t op : {0x12, 0x13, 0x14}) {
    bytes pkt(w::max_header_size);
    pkt.resize(w::encode(busy_headers(op, 0), pkt));
    pkt.push_back(std::byte{0});
    w::packet_view v;
    EXPECT_EQ(w::decode(pkt, false, v), w::decode_error::bad_length) << w::info(op).name;
    pkt.pop_back();
    EXPECT_EQ(w::decode(pkt, false, v), w::decode_error::ok) << w::info(op).name;
  }
}

TEST(roce_codec, decode_accepts_cnp_so_the_engine_can_drop_it) {
  bytes pkt = from_hex("8100ffff00000011 00000000");
  pkt.insert(pkt.end(), 16 + 4, std::byte{0});
  w::packet_view v;
  ASSERT_EQ(w::decode(pkt, true, v), w::decode_error::ok);
  EXPECT_EQ(v.op->tp, w::transport::cnp);
  EXPECT_EQ(v.hdr.bth.dest_qp, 0x11u);
  EXPECT_TRUE(v.payload.empty());
}

TEST(roce_codec, decode_payload_excludes_pad_and_icrc) {
  const auto v = decode_ok(v6_send.transport_with_icrc(), true);
  EXPECT_EQ(v.payload.data(), v6_send.transport_with_icrc().data() + 12);
  EXPECT_EQ(v.payload.size(), 7u);
}

TEST(roce_codec, decode_without_icrc_keeps_trailing_bytes_as_payload) {
  const auto v = decode_ok(v4_send.transport(), false);
  EXPECT_EQ(v.payload.size(), 5u);
  EXPECT_EQ(v.icrc, 0u);
  const auto all = decode_ok(v4_send.transport_with_icrc(), false);
  EXPECT_EQ(all.payload.size(), 9u) << "5 payload + 3 pad + 4 ICRC bytes, less 3 pad";
}

TEST(roce_codec, decode_error_strings_name_each_reason) {
  EXPECT_STREQ(w::to_string(w::decode_error::ok), "ok");
  EXPECT_STREQ(w::to_string(w::decode_error::too_short), "too_short");
  EXPECT_STREQ(w::to_string(w::decode_error::bad_opcode), "bad_opcode");
  EXPECT_STREQ(w::to_string(w::decode_error::bad_tver), "bad_tver");
  EXPECT_STREQ(w::to_string(w::decode_error::bad_pad), "bad_pad");
  EXPECT_STREQ(w::to_string(w::decode_error::bad_length), "bad_length");
  EXPECT_STREQ(w::to_string(static_cast<w::decode_error>(99)), "unknown");
}

TEST(roce_codec, pad_for_rounds_payload_up_to_four_bytes) {
  EXPECT_EQ(w::pad_for(0), 0);
  EXPECT_EQ(w::pad_for(1), 3);
  EXPECT_EQ(w::pad_for(5), 3);
  EXPECT_EQ(w::pad_for(6), 2);
  EXPECT_EQ(w::pad_for(7), 1);
  EXPECT_EQ(w::pad_for(4096), 0);
}

// ---------------------------------------------------------------------------
// IP and UDP headers

std::uint32_t ones_complement_sum(std::span<const std::byte> b) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i + 1 < b.size(); i += 2) {
    sum += std::to_integer<std::uint32_t>(b[i]) << 8 | std::to_integer<std::uint32_t>(b[i + 1]);
  }
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return sum;
}

TEST(roce_ip_udp, ipv4_header_has_valid_checksum_df_and_the_given_id) {
  w::ip_udp_params p;
  p.src_gid = gid_v4(10, 1, 2, 3);
  p.dst_gid = gid_v4(10, 4, 5, 6);
  p.src_port = 0xD00D;
  p.dst_port = 14791;
  p.traffic_class = 0x68;
  p.hop_limit = 17;
  p.flow_label = 0x12345;  // IPv4 has none
  p.ip_id = 0xBEEF;
  bytes out(28);
  ASSERT_EQ(w::build_ip_udp(p, 100, out), 28u);
  EXPECT_EQ(ones_complement_sum(std::span(out).first(20)), 0xFFFFu) << "header checksum verifies";
  out[10] = out[11] = std::byte{0};
  // total length 20 + 8 + 100, ID, DF, TTL 17, UDP, addresses; UDP length 108, checksum 0.
  EXPECT_EQ(out, from_hex("4568 0080 beef 4000 1111 0000 0a010203 0a040506 d00d 39c7 006c 0000"));
}

TEST(roce_ip_udp, ipv6_header_carries_traffic_class_flow_label_and_gids) {
  w::ip_udp_params p;
  p.src_gid = gid_fd00(1);
  p.dst_gid = gid_fd00(2);
  p.src_port = 0xC001;
  p.traffic_class = 0xA5;
  p.hop_limit = 3;
  p.flow_label = 0xFFF12345;  // masked to 20 bits
  p.ip_id = 0xBEEF;           // IPv6 has none
  bytes out(64, std::byte{0xEE});
  ASSERT_EQ(w::build_ip_udp(p, 24, out), 48u);
  out.resize(48);
  EXPECT_EQ(out, from_hex("6a512345 0020 11 03 fd000000000000000000000000000001 "
                          "fd000000000000000000000000000002 c00112b7 0020 0000"));
}

TEST(roce_ip_udp, mixed_address_families_are_refused) {
  w::ip_udp_params p;
  p.src_gid = gid_v4(10, 0, 0, 1);
  p.dst_gid = gid_fd00(2);
  bytes out(64);
  EXPECT_EQ(w::build_ip_udp(p, 16, out), 0u);
  std::swap(p.src_gid, p.dst_gid);
  EXPECT_EQ(w::build_ip_udp(p, 16, out), 0u);
}

TEST(roce_ip_udp, too_small_buffer_is_refused) {
  w::ip_udp_params p;
  p.src_gid = gid_v4(10, 0, 0, 1);
  p.dst_gid = gid_v4(10, 0, 0, 2);
  bytes out(27);
  EXPECT_EQ(w::build_ip_udp(p, 16, out), 0u);
  p.src_gid = gid_fd00(1);
  p.dst_gid = gid_fd00(2);
  out.resize(47);
  EXPECT_EQ(w::build_ip_udp(p, 16, out), 0u);
}

TEST(roce_ip_udp, transport_too_long_for_the_length_fields_is_refused) {
  w::ip_udp_params p;
  p.src_gid = gid_v4(10, 0, 0, 1);
  p.dst_gid = gid_v4(10, 0, 0, 2);
  bytes out(48);
  EXPECT_EQ(w::build_ip_udp(p, 65535 - 28, out), 28u);
  EXPECT_EQ(w::build_ip_udp(p, 65535 - 27, out), 0u);
  p.src_gid = gid_fd00(1);
  p.dst_gid = gid_fd00(2);
  EXPECT_EQ(w::build_ip_udp(p, 65535 - 8, out), 48u);
  EXPECT_EQ(w::build_ip_udp(p, 65535 - 7, out), 0u);
}

TEST(roce_ip_udp, ipv4_mapped_gids_are_recognised) {
  EXPECT_TRUE(w::is_ipv4_mapped(gid_v4(192, 0, 2, 1)));
  EXPECT_TRUE(w::is_ipv4_mapped(gid_v4(0, 0, 0, 0)));
  EXPECT_FALSE(w::is_ipv4_mapped(gid_fd00(1)));
  auto g = gid_v4(1, 2, 3, 4);
  g[11] = std::byte{0xFE};
  EXPECT_FALSE(w::is_ipv4_mapped(g));
  g = gid_v4(1, 2, 3, 4);
  g[0] = std::byte{0x20};
  EXPECT_FALSE(w::is_ipv4_mapped(g));
}

// ---------------------------------------------------------------------------
// UDP source port, timers, PSN arithmetic

TEST(roce_udp_sport, non_zero_flow_label_is_folded_directly) {
  // fl 0xABCDE: low 14 bits 0x3CDE, bits 19:14 0x2A -> 0x3CDE ^ 0x2A = 0x3CF4.
  EXPECT_EQ(w::udp_source_port(0xABCDE, 1, 2), 0xFCF4);
  // fl 0xFFFFF: 0x3FFF ^ 0x3F = 0x3FC0.
  EXPECT_EQ(w::udp_source_port(0xFFFFF, 0, 0), 0xFFC0);
}

TEST(roce_udp_sport, zero_flow_label_is_derived_from_the_qp_numbers) {
  // 0x11 * 0x12 = 0x132; the shifts add nothing; fold 0x132 ^ 0 = 0x132.
  EXPECT_EQ(w::udp_source_port(0, 0x11, 0x12), 0xC132);
  // 0x123456 * 0xABCDEF = 0xC379A59BA4A; v ^= v >> 20 (0xC379A5) -> 0xC379A9AC3EF;
  // v ^= v >> 40 (0xC) -> 0xC379A9AC3E3; fl = 0xAC3E3; 0x03E3 ^ 0x2B = 0x03C8.
  EXPECT_EQ(w::udp_source_port(0, 0x123456, 0xABCDEF), 0xC3C8);
  // 0xFFFFFF * 0xFFFFFF = 0xFFFFFE000001; v ^= v >> 20 (0xFFFFFE0) -> 0xFFFFF1FFFFE1;
  // v ^= v >> 40 (0xFF) -> 0xFFFFF1FFFF1E; fl = 0xFFF1E; 0x3F1E ^ 0x3F = 0x3F21.
  EXPECT_EQ(w::udp_source_port(0, 0xFFFFFF, 0xFFFFFF), 0xFF21);
  EXPECT_EQ(w::udp_source_port(0, 0, 5), 0xC000);
}

// A UD QP's port (rxe's rxe_qp_init_req): 0xC000 + hash_32(qpn, 14), the
// top 14 bits of qpn * 0x61C88647 (mod 2^32).  Worked by hand:
TEST(roce_udp_sport, a_ud_qps_port_is_its_number_hashed_as_rxe_does) {
  // 1 * 0x61C88647 = 0x61C88647; >> 18 = 0x1872.
  EXPECT_EQ(w::ud_source_port(1), 0xD872);  // QP1, the CM's MADs
  // 0x10 * 0x61C88647 = 0x61C886470 -> 0x1C886470; >> 18 = 0x0722.
  EXPECT_EQ(w::ud_source_port(0x10), 0xC722);
  // 0x123456 * 0x61C88647 = 0x6F41705A187DA -> 0x05A187DA; >> 18 = 0x0168.
  EXPECT_EQ(w::ud_source_port(0x123456), 0xC168);
  // 0xFFFFFF * 0x61C88647 = 0x61C885E53779B9 -> 0xE53779B9; >> 18 = 0x394D.
  EXPECT_EQ(w::ud_source_port(0xFFFFFF), 0xF94D);
}

TEST(roce_udp_sport, stays_within_c000_to_ffff) {
  for (std::uint32_t fl = 0; fl < 0x100000; fl += 0x1F3) {
    const auto port = w::udp_source_port(fl, fl * 7 + 16, fl + 17);
    EXPECT_GE(port, 0xC000) << fl;
  }
  for (std::uint32_t q = 16; q < 4096; q += 37) {
    EXPECT_GE(w::udp_source_port(0, q, q + 1), 0xC000) << q;
  }
}

TEST(roce_timers, rnr_timer_codes_follow_the_ibta_table) {
  EXPECT_EQ(w::rnr_timer_ns(0), 655'360'000u);
  EXPECT_EQ(w::rnr_timer_ns(1), 10'000u);
  EXPECT_EQ(w::rnr_timer_ns(5), 60'000u);
  EXPECT_EQ(w::rnr_timer_ns(12), 640'000u);
  EXPECT_EQ(w::rnr_timer_ns(14), 1'280'000u);
  EXPECT_EQ(w::rnr_timer_ns(23), 30'720'000u);
  EXPECT_EQ(w::rnr_timer_ns(30), 327'680'000u);
  EXPECT_EQ(w::rnr_timer_ns(31), 491'520'000u);
  EXPECT_EQ(w::rnr_timer_ns(w::aeth_rnr_nak(31) & 0x1F), 491'520'000u);
  for (std::uint8_t c = 2; c < 32; ++c) EXPECT_GT(w::rnr_timer_ns(c), w::rnr_timer_ns(c - 1)) << int{c};
}

TEST(roce_timers, ack_timeout_is_4096_ns_times_two_to_the_t) {
  EXPECT_EQ(w::ack_timeout_ns(0), 0u) << "0 disables the retransmission timer";
  EXPECT_EQ(w::ack_timeout_ns(1), 8'192u);
  EXPECT_EQ(w::ack_timeout_ns(14), 67'108'864u);  // ~67 ms
  EXPECT_EQ(w::ack_timeout_ns(31), 4096ull << 31);
  EXPECT_EQ(w::ack_timeout_ns(32), 4096ull << 31) << "capped at 31";
  EXPECT_EQ(w::ack_timeout_ns(255), 4096ull << 31);
}

TEST(roce_psn, compare_wraps_around_modulo_2_to_the_24) {
  EXPECT_EQ(w::psn_compare(5, 5), 0);
  EXPECT_LT(w::psn_compare(4, 5), 0);
  EXPECT_GT(w::psn_compare(6, 5), 0);
  EXPECT_LT(w::psn_compare(0xFFFFFF, 0), 0) << "0xFFFFFF precedes 0 after the wrap";
  EXPECT_GT(w::psn_compare(0, 0xFFFFFF), 0);
  EXPECT_GT(w::psn_compare(3, 0xFFFFF0), 0);
  EXPECT_GT(w::psn_compare(0x800000 - 1, 0), 0) << "half the space ahead";
  EXPECT_LT(w::psn_compare(0x800000 + 1, 0), 0) << "more than half ahead is behind";
}

TEST(roce_aeth, syndrome_helpers_encode_type_and_value) {
  EXPECT_EQ(w::aeth_rnr_nak(14), 0x2E);
  EXPECT_EQ(w::aeth_nak(w::nak_code::psn_sequence_error), 0x60);
  EXPECT_EQ(w::aeth_nak(w::nak_code::invalid_request), 0x61);
  EXPECT_EQ(w::aeth_type_of(0x1F), w::aeth_type::ack);
  EXPECT_EQ(w::aeth_type_of(0x2E), w::aeth_type::rnr_nak);
  EXPECT_EQ(w::aeth_type_of(0x62), w::aeth_type::nak);
}

// ::ffff:127.0.0.<last>, as a GID.
std::array<std::byte, 16> ipv4_gid(std::uint8_t last) {
  std::array<std::byte, 16> g{};
  g[10] = g[11] = std::byte{0xFF};
  g[12] = std::byte{127};
  g[15] = std::byte{last};
  return g;
}

// A GSO segment k carries IPv4 ID k: its ICRC, computed from scratch with
// that ID, equals the ID-0 ICRC with the precomputed delta XORed in, for
// every length (first, middle, last packets) and ID.
TEST(roce_icrc, ipv4_id_delta_matches_an_icrc_computed_with_the_id) {
  w::ipv4_id_icrc ids;
  std::mt19937 rng(7);
  for (std::size_t transport : {std::size_t{16}, std::size_t{12 + 1024}, std::size_t{28 + 4096}, std::size_t{12 + 4096},
                                std::size_t{12 + 333 + 3}}) {
    std::vector<std::byte> t(transport);
    for (auto& b : t) b = static_cast<std::byte>(rng());
    w::ip_udp_params ip;
    ip.src_gid = ipv4_gid(2);
    ip.dst_gid = ipv4_gid(3);
    ip.src_port = 0xC123;
    std::array<std::byte, 64> hdr;
    const std::size_t hl = w::build_ip_udp(ip, transport + w::icrc_size, hdr);
    ASSERT_EQ(hl, 28u);
    const std::uint32_t id0 = w::icrc(std::span(hdr.data(), hl), t);
    for (std::uint16_t id : {1, 2, 3, 7, 14, 15, 63, 64, 255, 4660, 65535}) {
      ip.ip_id = id;
      w::build_ip_udp(ip, transport + w::icrc_size, hdr);
      EXPECT_EQ(w::icrc(std::span(hdr.data(), hl), t), id0 ^ ids.delta(transport, id))
          << "transport " << transport << " id " << id;
    }
    EXPECT_EQ(ids.delta(transport, 0), 0u);
    ip.ip_id = 0;
  }
}

// The ICRC of transport bytes `t` (BTH ... pad) sent with IPv4 ID `id`,
// the other header fields from `ip`.
std::uint32_t icrc_with_id(w::ip_udp_params ip, std::span<const std::byte> t, std::uint16_t id) {
  ip.ip_id = id;
  std::array<std::byte, 64> hdr;
  const std::size_t hl = w::build_ip_udp(ip, t.size() + w::icrc_size, hdr);
  return w::icrc(std::span(hdr.data(), hl), t);
}

// More lengths than the cache holds, visited twice in turn: every delta
// still matches a full computation as entries are replaced.
TEST(roce_icrc, ipv4_id_delta_stays_right_when_lengths_outnumber_the_cache) {
  w::ipv4_id_icrc ids;
  w::ip_udp_params ip;
  ip.src_gid = ipv4_gid(2);
  ip.dst_gid = ipv4_gid(3);
  std::mt19937 rng(11);
  for (int round = 0; round < 2; ++round) {
    for (std::size_t transport = 12; transport < 12 + 20 * 200; transport += 200) {
      std::vector<std::byte> t(transport);
      for (auto& b : t) b = static_cast<std::byte>(rng());
      const auto id = static_cast<std::uint16_t>(1 + rng() % 65535);
      EXPECT_EQ(icrc_with_id(ip, t, id), icrc_with_id(ip, t, 0) ^ ids.delta(transport, id))
          << "transport " << transport << " id " << id;
    }
  }
}

// A receiver that cannot see the ID finds it from the ICRC: for a packet
// built with any ID, solve() answers that ID; for a corrupted packet it
// answers nothing, but for the 2^-16 of corruptions that look numbered.
TEST(roce_icrc, ipv4_id_solve_finds_the_id_a_packet_was_sent_with) {
  w::ipv4_id_icrc ids;
  w::ip_udp_params ip;
  ip.src_gid = ipv4_gid(2);
  ip.dst_gid = ipv4_gid(3);
  ip.src_port = 0xC001;
  std::mt19937 rng(13);
  std::size_t unsolved = 0, corrupted = 0;
  for (std::size_t transport : {std::size_t{16}, std::size_t{20}, std::size_t{12 + 4096}, std::size_t{12 + 333 + 3}}) {
    std::vector<std::byte> t(transport);
    for (auto& b : t) b = static_cast<std::byte>(rng());
    const std::uint32_t id0 = icrc_with_id(ip, t, 0);
    EXPECT_EQ(ids.solve(transport, 0), std::optional<std::uint16_t>(0));
    for (int k = 0; k < 64; ++k) {
      const auto id = static_cast<std::uint16_t>(k < 2 ? 0xFFFF * k + 1 - k : rng());  // 1, 65535, then random
      const std::uint32_t got = icrc_with_id(ip, t, id);
      EXPECT_EQ(ids.solve(transport, got ^ id0), std::optional<std::uint16_t>(id)) << "transport " << transport;
      // The same packet with one bit of its transport flipped (not in BTH
      // byte 4, which the ICRC does not cover).
      std::vector<std::byte> bad = t;
      std::size_t at = rng() % (bad.size() - 1);
      if (at >= 4) ++at;
      bad[at] ^= static_cast<std::byte>(1u << (rng() % 8));
      ++corrupted;
      if (!ids.solve(transport, got ^ icrc_with_id(ip, bad, 0))) ++unsolved;
    }
  }
  EXPECT_GE(unsolved, corrupted - 1) << "a flipped bit should almost never look like an ID";
}

// solve() undoes delta() for every one of the 2^16 IDs, at a length whose
// entry was replaced and built again in between; for any other value it
// answers nothing (checked on values one bit away from an ID's delta).
TEST(roce_icrc, ipv4_id_solve_inverts_delta_for_every_id) {
  w::ipv4_id_icrc ids;
  constexpr std::size_t transport = 12 + 1024;
  for (int pass = 0; pass < 2; ++pass) {
    std::size_t wrong = 0, false_ids = 0;
    for (std::uint32_t id = 0; id <= 0xFFFF; ++id) {
      const std::uint32_t d = ids.delta(transport, static_cast<std::uint16_t>(id));
      if (ids.solve(transport, d) != std::optional<std::uint16_t>(static_cast<std::uint16_t>(id))) ++wrong;
      if (const auto other = ids.solve(transport, d ^ (1u << (id % 32))); other && ids.delta(transport, *other) != (d ^ (1u << (id % 32))))
        ++false_ids;
    }
    EXPECT_EQ(wrong, 0u) << "pass " << pass;
    EXPECT_EQ(false_ids, 0u) << "an answer must be an ID whose delta is the value";
    // More lengths than the cache holds push this one out.
    for (std::size_t other = 100; other < 100 + 10 * 8; other += 8) (void)ids.delta(other, 1);
    EXPECT_FALSE(ids.cached(transport));
  }
}

// solve() at a length it has no tables for (divided back to length 0)
// answers what it answers with them, and caches the length once it found
// an ID there.
TEST(roce_icrc, ipv4_id_solve_at_an_uncached_length_agrees_with_delta) {
  w::ipv4_id_icrc ref;
  for (std::size_t transport : {std::size_t{16}, std::size_t{21}, std::size_t{12 + 1024}, std::size_t{28 + 4096}})
    for (std::uint16_t id : {1, 2, 63, 64, 4660, 65535}) {
      w::ipv4_id_icrc fresh;
      EXPECT_EQ(fresh.solve(transport, ref.delta(transport, id)), std::optional<std::uint16_t>(id))
          << "transport " << transport << " id " << id;
      EXPECT_TRUE(fresh.cached(transport)) << "an answer caches its length";
    }
}

// Junk of many lengths (a d with no ID, as nearly every corrupted or
// forged datagram has) caches none of them and evicts none of the lengths
// in use: each would cost tens of microseconds of table building.
TEST(roce_icrc, ipv4_id_solve_of_junk_evicts_no_length_in_use) {
  w::ipv4_id_icrc ids;
  constexpr std::size_t in_use = 12 + 4096 + 4;
  (void)ids.delta(in_use, 1);
  ASSERT_TRUE(ids.cached(in_use));
  std::mt19937 rng(17);
  int answered = 0;
  for (std::size_t transport = 20; transport < 20 + 64 * 4; transport += 4) {
    const std::uint32_t d = static_cast<std::uint32_t>(rng());
    if (const auto id = ids.solve(transport, d)) {
      ++answered;
      EXPECT_EQ(ids.delta(transport, *id), d);
    } else {
      EXPECT_FALSE(ids.cached(transport)) << "transport " << transport;
    }
  }
  EXPECT_LE(answered, 1) << "random values are IDs' deltas with odds 2^-16";
  EXPECT_TRUE(ids.cached(in_use)) << "junk evicted a length in use";
}

// The cached header CRC gives the ICRC a full computation gives, for IPv4
// and IPv6, over more flows and lengths than the cache has room for (so
// entries collide and are replaced), and nothing for mixed families.
TEST(roce_icrc, prefix_cache_agrees_with_the_full_icrc) {
  w::icrc_prefix_cache cache;
  std::mt19937 rng(17);
  std::size_t checked = 0;
  for (int round = 0; round < 3; ++round) {
    for (std::uint8_t host = 1; host < 40; ++host) {
      const bool v6 = host % 3 == 0;
      w::ip_udp_params ip;
      ip.src_gid = v6 ? gid_fd00(host) : ipv4_gid(host);
      ip.dst_gid = v6 ? gid_fd00(200) : ipv4_gid(200);
      ip.src_port = static_cast<std::uint16_t>(0xC000 + host * 7);
      ip.dst_port = host % 2 == 0 ? w::roce_udp_port : 4792;
      const std::size_t transport = 16 + (rng() % 5) * 4;
      std::vector<std::byte> t(transport);
      for (auto& b : t) b = static_cast<std::byte>(rng());
      std::array<std::byte, 64> hdr;
      const std::size_t hl = w::build_ip_udp(ip, transport + w::icrc_size, hdr);
      ASSERT_NE(hl, 0u);
      const auto prefix = cache.get(ip.src_gid, ip.dst_gid, ip.src_port, ip.dst_port, transport + w::icrc_size);
      ASSERT_TRUE(prefix.has_value());
      auto b = w::icrc_builder::after_prefix(*prefix);
      b.add(std::span(t).first(5));  // in pieces, as the device adds them
      b.add(std::span(t).subspan(5));
      EXPECT_EQ(b.value(), w::icrc(std::span(hdr.data(), hl), t)) << "host " << int(host) << " round " << round;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3u * 39u);
  EXPECT_FALSE(cache.get(ipv4_gid(1), gid_fd00(2), 0xC000, w::roce_udp_port, 64).has_value());
}

}  // namespace

// ---------------------------------------------------------------------------
// A GSO run read without its segment size (wire::run_segment_size)

namespace {

/// One packet: `op` to QP `qp` at `psn`, `payload_len` bytes of `fill`,
/// pad and a zero ICRC.
bytes run_packet(w::opcode op, std::uint32_t qp, std::uint32_t psn, std::size_t payload_len, std::uint8_t fill) {
  w::transport_headers h;
  h.bth.opcode = static_cast<std::uint8_t>(op);
  h.bth.pkey = w::default_pkey;
  h.bth.dest_qp = qp;
  h.bth.psn = psn;
  h.bth.pad = w::pad_for(payload_len);
  h.reth.length = static_cast<std::uint32_t>(payload_len);
  bytes out(w::max_header_size);
  out.resize(w::encode(h, out));
  out.resize(out.size() + payload_len + h.bth.pad + w::icrc_size, std::byte{fill});
  return out;
}

bytes joined(const std::vector<bytes>& parts) {
  bytes out;
  for (const bytes& b : parts) out.insert(out.end(), b.begin(), b.end());
  return out;
}

}  // namespace

TEST(roce_run, middle_packets_and_a_shorter_last_split_at_the_middle_size) {
  const std::uint32_t qp = 0x12345;
  const bytes run = joined({run_packet(w::opcode::rc_write_middle, qp, 7, 1024, 0xA1),
                            run_packet(w::opcode::rc_write_middle, qp, 8, 1024, 0xA2),
                            run_packet(w::opcode::rc_write_middle, qp, 9, 1024, 0xA3),
                            run_packet(w::opcode::rc_write_last, qp, 10, 300, 0xA4)});
  EXPECT_EQ(w::run_segment_size(run), 12u + 1024 + 4);
}

// The rule a sender builds its runs by: the same P_Key and destination
// QP, PSN + k; across the PSN wrap too.
TEST(roce_run, a_packet_continues_a_run_of_its_qp_at_the_next_psn_only) {
  const bytes first = run_packet(w::opcode::uc_send_only, 0x77, w::psn_mask, 64, 0);
  EXPECT_TRUE(w::continues_run(first.data(), run_packet(w::opcode::uc_send_only, 0x77, 0, 64, 1).data(), 1));
  EXPECT_TRUE(w::continues_run(first.data(), run_packet(w::opcode::uc_send_only, 0x77, 1, 64, 1).data(), 2));
  EXPECT_FALSE(w::continues_run(first.data(), run_packet(w::opcode::uc_send_only, 0x77, 1, 64, 1).data(), 1));
  EXPECT_FALSE(w::continues_run(first.data(), run_packet(w::opcode::uc_send_only, 0x78, 0, 64, 1).data(), 1))
      << "another destination QP";
  bytes other_pkey = run_packet(w::opcode::uc_send_only, 0x77, 0, 64, 1);
  other_pkey[3] ^= std::byte{1};
  EXPECT_FALSE(w::continues_run(first.data(), other_pkey.data(), 1)) << "another P_Key";
}

TEST(roce_run, equal_small_messages_split_at_their_size_across_the_psn_wrap) {
  const std::uint32_t qp = 0x77;
  std::vector<bytes> parts;
  for (std::uint32_t k = 0; k < 5; ++k)
    parts.push_back(run_packet(w::opcode::uc_send_only, qp, (w::psn_mask - 1 + k) & w::psn_mask, 64, 0));
  EXPECT_EQ(w::run_segment_size(joined(parts)), 12u + 64 + 4);
}

// No RoCE packet is longer than max_packet_size (4096 bytes of payload
// and its headers): two "packets" of 5,000 bytes that otherwise continue
// each other are no run, and the search stops short of such sizes (a junk
// 64 KiB datagram cost ~65,000 probes).
TEST(roce_run, segments_longer_than_any_roce_packet_are_not_a_run) {
  const std::uint32_t qp = 0x31;
  const bytes big = joined({run_packet(w::opcode::uc_send_only, qp, 1, 4980, 0),
                            run_packet(w::opcode::uc_send_only, qp, 2, 4980, 0)});
  EXPECT_EQ(w::run_segment_size(big), big.size());
  const bytes max = joined({run_packet(w::opcode::uc_send_only, qp, 1, 4096, 0),
                            run_packet(w::opcode::uc_send_only, qp, 2, 4096, 0)});
  EXPECT_EQ(w::run_segment_size(max), max.size() / 2);  // the largest real packet still splits
  // A full packet and a shorter last, two segments.
  const bytes full_and_short = joined({run_packet(w::opcode::uc_send_middle, qp, 1, 4096, 0),
                                       run_packet(w::opcode::uc_send_last, qp, 2, 100, 0)});
  EXPECT_EQ(w::run_segment_size(full_and_short), 12u + 4096 + 4);
}

TEST(roce_run, one_packet_is_not_a_run) {
  const bytes one = run_packet(w::opcode::rc_send_only, 0x99, 3, 4096, 0x5C);
  EXPECT_EQ(w::run_segment_size(one), one.size());
  const bytes small = run_packet(w::opcode::rc_send_only, 0x99, 3, 8, 0x5C);
  EXPECT_EQ(w::run_segment_size(small), small.size());
  EXPECT_EQ(w::run_segment_size({}), 0u);
}

TEST(roce_run, a_payload_that_holds_the_next_bth_once_is_not_a_run) {
  // The payload holds the BTH of the packet's successor at byte 40 of the
  // packet, but what would be the third segment does not continue it.
  bytes one = run_packet(w::opcode::uc_send_only, 0x42, 100, 88, 0x00);
  const bytes next = run_packet(w::opcode::uc_send_only, 0x42, 101, 0, 0x00);
  std::memcpy(one.data() + 40, next.data(), w::bth_size);
  EXPECT_EQ(w::run_segment_size(one), one.size());
}

TEST(roce_run, packets_of_another_qp_or_pkey_or_a_psn_out_of_order_are_not_a_run) {
  const bytes a = run_packet(w::opcode::rc_send_only, 0x42, 5, 32, 1);
  EXPECT_EQ(w::run_segment_size(joined({a, run_packet(w::opcode::rc_send_only, 0x43, 6, 32, 1)})), 2 * a.size());
  EXPECT_EQ(w::run_segment_size(joined({a, run_packet(w::opcode::rc_send_only, 0x42, 7, 32, 1)})), 2 * a.size());
  bytes other_pkey = run_packet(w::opcode::rc_send_only, 0x42, 6, 32, 1);
  other_pkey[3] = std::byte{0x7E};
  EXPECT_EQ(w::run_segment_size(joined({a, other_pkey})), 2 * a.size());
  // A tail shorter than any packet (BTH and ICRC) is no segment.
  bytes tail = run_packet(w::opcode::rc_send_only, 0x42, 6, 0, 1);
  tail.resize(w::bth_size);
  EXPECT_EQ(w::run_segment_size(joined({a, tail})), a.size() + tail.size());
}

// ---------------------------------------------------------------------------
// A UD receive's GRH area read back (ibv_init_ah_from_wc's rule)

namespace {

/// The 40-byte GRH area a UD receive holds for a datagram with these IP
/// headers: the IPv6 header, or 20 zero bytes and the IPv4 header.
std::array<std::byte, 40> grh_area(const w::ip_udp_params& p) {
  std::array<std::byte, 64> hdr{};
  std::array<std::byte, 40> area{};
  const std::size_t n = w::build_ip_udp(p, 40, hdr);
  if (n == 28) std::copy_n(hdr.begin(), 20, area.begin() + 20);
  if (n == 48) std::copy_n(hdr.begin(), 40, area.begin());
  return area;
}

}  // namespace

TEST(roce_grh, an_ipv4_area_gives_mapped_addresses_and_the_tos) {
  w::ip_udp_params p;
  p.src_gid = gid_v4(192, 0, 2, 7);
  p.dst_gid = gid_v4(192, 0, 2, 9);
  p.traffic_class = 0x68;
  w::grh_fields f;
  ASSERT_TRUE(w::parse_grh_area(grh_area(p), f));
  EXPECT_EQ(f.src, p.src_gid);
  EXPECT_EQ(f.dst, p.dst_gid);
  EXPECT_EQ(f.traffic_class, 0x68);
  EXPECT_EQ(f.flow_label, 0u);
}

TEST(roce_grh, an_ipv6_area_gives_its_addresses_class_and_flow_label) {
  w::ip_udp_params p;
  p.src_gid = gid_fd00(1);
  p.dst_gid = gid_fd00(2);
  p.traffic_class = 0xB8;
  p.flow_label = 0x12345;
  w::grh_fields f;
  ASSERT_TRUE(w::parse_grh_area(grh_area(p), f));
  EXPECT_EQ(f.src, p.src_gid);
  EXPECT_EQ(f.dst, p.dst_gid);
  EXPECT_EQ(f.traffic_class, 0xB8);
  EXPECT_EQ(f.flow_label, 0x12345u);
}

// An IPv6 header whose next header is not UDP carried no RoCEv2 datagram:
// refused (libibverbs: EPROTONOSUPPORT).
TEST(roce_grh, an_ipv6_area_of_another_protocol_is_refused) {
  w::ip_udp_params p;
  p.src_gid = gid_fd00(1);
  p.dst_gid = gid_fd00(2);
  auto area = grh_area(p);
  w::grh_fields f;
  ASSERT_TRUE(w::parse_grh_area(area, f));
  area[6] = std::byte{6};  // TCP
  EXPECT_FALSE(w::parse_grh_area(area, f));
}

// An IPv6 header whose bytes 20-39 (the middle of its addresses) start like
// an IPv4 header is still IPv6 unless that "header" has a valid checksum;
// an area that holds neither is refused.
TEST(roce_grh, ipv6_addresses_that_look_like_an_ipv4_header_stay_ipv6) {
  w::ip_udp_params p;
  p.src_gid = gid_fd00(1);
  p.dst_gid = gid_fd00(2);
  auto area = grh_area(p);
  area[20] = std::byte{0x45};  // (inside the source address)
  w::grh_fields f;
  ASSERT_TRUE(w::parse_grh_area(area, f));
  EXPECT_EQ(f.dst, p.dst_gid);
  std::array<std::byte, 16> src = p.src_gid;
  src[12] = std::byte{0x45};
  EXPECT_EQ(f.src, src);
  EXPECT_FALSE(w::parse_grh_area(std::array<std::byte, 40>{}, f));
}
