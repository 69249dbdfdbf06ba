// SPDX-License-Identifier: MIT
// libFuzzer target for the RoCEv2 transport decoder (src/wire/roce.cpp).
//
// Each input is decoded as a transport packet (BTH first) with and without a
// trailing ICRC.  Whatever decodes must describe the input exactly: the
// opcode's table entry, a payload span inside the input that ends where the
// pad (and ICRC) begin, and headers that `encode()` turns back into the
// input's header bytes.  The encoder normalises only reserved fields, which
// the comparison ignores:
//   - BTH byte 4 bits 5:0 (Resv6) and byte 8 bits 6:0 (Resv7): sent as zero;
//   - DETH byte 4 (reserved): sent as zero;
//   - the 16 reserved bytes after a CNP's BTH: sent as zero.
// (TVer is not among them: decode refuses a non-zero TVer.)
//
// It also checks that the ICRC of the input computed in one call equals the
// ICRC fed to `icrc_builder` in two pieces; that `decode_headers()` (the
// in-process path, payload held elsewhere) agrees with `decode()`; that
// `run_segment_size()` (a 64 KiB datagram a peer controls) splits only
// where every segment continues the run; that `ipv4_id_icrc::solve()` finds
// the ID whose delta it is given, for any length; and that
// `parse_grh_area()` takes any 40 bytes.
//
// Any mismatch aborts, which libFuzzer reports as a crash.
#include "wire/roce.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

namespace {

namespace w = averbs::wire;

[[noreturn]] void fail(const char* what, std::size_t at = 0) {
  std::fprintf(stderr, "wire_decode_fuzz: %s (byte %zu)\n", what, at);
  std::abort();
}

// Bits of header byte `i` that the encoder reproduces for opcode `op`.
std::uint8_t compared_bits(const w::opcode_info& op, std::size_t i) {
  if (i == 4) return 0xC0;  // FECN, BECN
  if (i == 8) return 0x80;  // AckReq
  if ((op.headers & w::hdr_deth) && i == w::bth_size + 4) return 0x00;
  // FETH (FLUSH, right after the BTH): 26 reserved bits, then selectivity
  // level and placement type.
  if ((op.headers & w::hdr_feth) && i >= w::bth_size && i < w::bth_size + 3) return 0x00;
  if ((op.headers & w::hdr_feth) && i == w::bth_size + 3) return 0x3F;
  if (op.tp == w::transport::cnp && i >= w::bth_size) return 0x00;
  return 0xFF;
}

void check_decode(std::span<const std::byte> pkt, bool has_icrc) {
  w::packet_view v;
  if (w::decode(pkt, has_icrc, v) != w::decode_error::ok) {
    if (v.op != nullptr || !v.payload.empty()) fail("refused packet left a view behind");
    return;
  }
  const w::opcode_info& op = w::info(std::to_integer<std::uint8_t>(pkt[0]));
  if (v.op != &op || !op.valid) fail("view does not point at the opcode's table entry");
  const std::size_t trailer = has_icrc ? w::icrc_size : 0;
  if (v.payload.data() != pkt.data() + op.length) fail("payload does not start after the headers");
  if (op.length + v.payload.size() + v.hdr.bth.pad + trailer != pkt.size()) {
    fail("headers + payload + pad + ICRC do not add up to the packet");
  }
  if (!(op.ops & w::op_payload) && (!v.payload.empty() || v.hdr.bth.pad != 0)) {
    fail("payload or pad accepted on an opcode without payload");
  }
  if (v.hdr.bth.dest_qp > w::qpn_mask || v.hdr.bth.psn > w::psn_mask) fail("24-bit field out of range");
  if (has_icrc && v.icrc != w::load_icrc(pkt.last<w::icrc_size>())) fail("ICRC not the last 4 bytes");

  std::array<std::byte, w::max_header_size> out{};
  if (w::encode(v.hdr, out) != op.length) fail("encode length differs from the opcode's");
  for (std::size_t i = 0; i < op.length; ++i) {
    const std::uint8_t mask = compared_bits(op, i);
    if (((std::to_integer<std::uint8_t>(out[i]) ^ std::to_integer<std::uint8_t>(pkt[i])) & mask) != 0) {
      fail("re-encoded header differs from the input", i);
    }
  }
}

// One-shot ICRC versus the builder fed in two pieces, cut anywhere (BTH
// byte 4 is masked wherever the cut falls).
void check_icrc_pieces(std::span<const std::byte> pkt) {
  if (pkt.size() < 2) return;
  static constexpr std::array<std::uint8_t, 28> ipv4_udp{
      0x45, 0x00, 0x00, 0x34, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0xa4, 0x81, 0xc0, 0x00,
      0x02, 0x01, 0xc0, 0x00, 0x02, 0x02, 0xc1, 0x23, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00};
  const auto ip_udp = std::as_bytes(std::span(ipv4_udp));
  const std::size_t cut = 1 + std::to_integer<std::size_t>(pkt.back()) % pkt.size();
  w::icrc_builder b(ip_udp);
  b.add(pkt.first(cut));
  b.add(pkt.subspan(cut));
  if (b.value() != w::icrc(ip_udp, pkt)) fail("icrc_builder in pieces differs from icrc()", cut);
}

// decode_headers() on the headers of whatever decode() took, the payload's
// length given apart, finds the same opcode and the same headers.
void check_decode_headers(std::span<const std::byte> pkt) {
  w::packet_view v;
  if (w::decode(pkt, true, v) != w::decode_error::ok) return;
  w::packet_view h;
  if (w::decode_headers(pkt.first(v.op->length), v.payload.size(), h) != w::decode_error::ok)
    fail("decode_headers refused what decode took");
  if (h.op != v.op || !h.payload.empty()) fail("decode_headers' view differs from decode's");
  std::array<std::byte, w::max_header_size> a{}, b{};
  if (w::encode(v.hdr, a) != w::encode(h.hdr, b) || a != b)
    fail("decode_headers' headers differ from decode's");
}

// A split run_segment_size() finds: every segment after the first continues
// the first one's run, none is shorter than a packet, and the size is one
// a packet can have.
void check_run_segment_size(std::span<const std::byte> dgram) {
  const std::size_t seg = w::run_segment_size(dgram);
  if (seg == dgram.size()) return;
  if (seg < w::bth_size + w::icrc_size || seg > w::max_packet_size || seg > dgram.size())
    fail("run_segment_size out of range", seg);
  std::uint32_t k = 1;
  for (std::size_t off = seg; off < dgram.size(); off += seg, ++k) {
    if (dgram.size() - off < w::bth_size + w::icrc_size) fail("a segment shorter than a packet", off);
    if (!w::continues_run(dgram.data(), dgram.data() + off, k))
      fail("a segment that does not continue the run", off);
  }
}

// For a length and ID the input chooses: solve() inverts delta().
void check_id_solve(std::span<const std::byte> in) {
  if (in.size() < 4) return;
  static w::ipv4_id_icrc ids;  // (its cache of a few lengths is part of what is tested)
  const std::size_t len =
      w::bth_size + (std::to_integer<std::size_t>(in[0]) << 8 | std::to_integer<std::size_t>(in[1])) % 4200;
  const auto id =
      static_cast<std::uint16_t>(std::to_integer<unsigned>(in[2]) << 8 | std::to_integer<unsigned>(in[3]));
  const std::optional<std::uint16_t> got = ids.solve(len, ids.delta(len, id));
  if (!got || *got != id) fail("ipv4_id_icrc::solve did not find the ID of its own delta", len);
}

void check_grh_area(std::span<const std::byte> in) {
  if (in.size() < 40) return;
  w::grh_fields g;
  (void)w::parse_grh_area(in.first<40>(), g);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> pkt(reinterpret_cast<const std::byte*>(data), size);
  check_decode(pkt, false);
  check_decode(pkt, true);
  check_icrc_pieces(pkt);
  check_decode_headers(pkt);
  check_run_segment_size(pkt);
  check_id_solve(pkt);
  check_grh_area(pkt);
  return 0;
}
