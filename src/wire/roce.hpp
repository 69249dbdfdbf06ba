// SPDX-License-Identifier: MIT
// RoCEv2 transport codec: the InfiniBand base and extended transport headers
// (IBTA vol. 1 ch. 9), the opcode table, the ICRC and rxe's UDP source port.
//
// Implementation overview
// -----------------------
// The engine keeps headers decoded in `transport_headers` and serialises
// them with `encode()` into a small buffer in front of the payload; the
// payload itself travels separately (zero copy).  `decode()` validates a
// received packet (BTH, extension headers for its opcode, pad, lengths) and
// returns views into the caller's bytes; it never reads past the span and
// never trusts a length field.  All multi-byte fields are big-endian on the
// wire; ImmDt stays in network order (verbs hands it to the user unchanged).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

namespace averbs::wire {

inline constexpr std::uint16_t roce_udp_port = 4791;
inline constexpr std::size_t bth_size = 12;
inline constexpr std::size_t icrc_size = 4;
inline constexpr std::uint32_t gsi_qkey = 0x80010000;  // QP1's Q_Key
inline constexpr std::uint16_t default_pkey = 0xFFFF;
inline constexpr std::uint32_t psn_mask = 0xFFFFFF;
inline constexpr std::uint32_t qpn_mask = 0xFFFFFF;

/// Transport opcodes (BTH byte 0): transport in bits 7:5, operation in 4:0.
enum class opcode : std::uint8_t {
  rc_send_first = 0x00,
  rc_send_middle = 0x01,
  rc_send_last = 0x02,
  rc_send_last_imm = 0x03,
  rc_send_only = 0x04,
  rc_send_only_imm = 0x05,
  rc_write_first = 0x06,
  rc_write_middle = 0x07,
  rc_write_last = 0x08,
  rc_write_last_imm = 0x09,
  rc_write_only = 0x0A,
  rc_write_only_imm = 0x0B,
  rc_read_request = 0x0C,
  rc_read_response_first = 0x0D,
  rc_read_response_middle = 0x0E,
  rc_read_response_last = 0x0F,
  rc_read_response_only = 0x10,
  rc_ack = 0x11,
  rc_atomic_ack = 0x12,
  rc_compare_swap = 0x13,
  rc_fetch_add = 0x14,
  rc_send_last_inv = 0x16,
  rc_send_only_inv = 0x17,
  rc_flush = 0x1C,         ///< IBTA 1.5; received only, and refused (no QP has flush access)
  rc_atomic_write = 0x1D,  ///< IBTA 1.5

  uc_send_first = 0x20,
  uc_send_middle = 0x21,
  uc_send_last = 0x22,
  uc_send_last_imm = 0x23,
  uc_send_only = 0x24,
  uc_send_only_imm = 0x25,
  uc_write_first = 0x26,
  uc_write_middle = 0x27,
  uc_write_last = 0x28,
  uc_write_last_imm = 0x29,
  uc_write_only = 0x2A,
  uc_write_only_imm = 0x2B,

  ud_send_only = 0x64,
  ud_send_only_imm = 0x65,

  cnp = 0x81,  // congestion notification: received and dropped
};

enum class transport : std::uint8_t { rc = 0, uc = 1, rd = 2, ud = 3, cnp = 4, invalid = 0xFF };

/// Which extension headers follow the BTH, in wire order.
enum header_bits : std::uint16_t {
  hdr_rdeth = 1u << 0,
  hdr_deth = 1u << 1,
  hdr_reth = 1u << 2,
  hdr_atmeth = 1u << 3,
  hdr_aeth = 1u << 4,
  hdr_atmack = 1u << 5,
  hdr_immdt = 1u << 6,
  hdr_ieth = 1u << 7,
  hdr_feth = 1u << 8,  ///< FLUSH: before the RETH on the wire
};

/// Properties of an opcode, from the IBTA tables (and rxe's rxe_opcode.c).
enum op_bits : std::uint16_t {
  op_request = 1u << 0,   ///< sent by a requester (SEND, WRITE, READ req, atomics)
  op_response = 1u << 1,  ///< sent by a responder (ACK, READ response, atomic ACK)
  op_first = 1u << 2,
  op_middle = 1u << 3,
  op_last = 1u << 4,  ///< LAST or ONLY
  op_only = 1u << 5,  ///< ONLY implies first and last too
  op_send = 1u << 6,
  op_write = 1u << 7,
  op_read = 1u << 8,    ///< READ request or READ response
  op_atomic = 1u << 9,  ///< compare-swap or fetch-add request, or atomic ACK
  op_ack = 1u << 10,    ///< ACK or atomic ACK
  op_imm = 1u << 11,
  op_inv = 1u << 12,
  op_payload = 1u << 13,       ///< may carry payload
  op_atomic_write = 1u << 14,  ///< ATOMIC WRITE request (RETH and 8 bytes of payload)
  op_flush = 1u << 15,         ///< FLUSH request
};

struct opcode_info {
  bool valid = false;
  transport tp = transport::invalid;
  std::uint16_t headers = 0;  ///< header_bits
  std::uint16_t ops = 0;      ///< op_bits
  std::uint8_t length = 0;    ///< BTH + extension headers, bytes
  const char* name = "";      ///< as Wireshark names it, e.g. "RC SEND Only"
};

/// The table entry for an opcode byte; `valid` is false for unassigned ones.
const opcode_info& info(std::uint8_t op) noexcept;
inline const opcode_info& info(opcode op) noexcept { return info(static_cast<std::uint8_t>(op)); }

struct bth {
  std::uint8_t opcode = 0;
  bool se = false;        ///< solicited event
  bool mig_req = false;   ///< sent as 0, ignored on receive
  std::uint8_t pad = 0;   ///< 0..3
  std::uint8_t tver = 0;  ///< must be 0
  std::uint16_t pkey = default_pkey;
  bool fecn = false, becn = false;
  std::uint32_t dest_qp = 0;  ///< 24 bits
  bool ack_req = false;
  std::uint32_t psn = 0;      ///< 24 bits
};

struct reth {
  std::uint64_t va = 0;
  std::uint32_t rkey = 0;
  std::uint32_t length = 0;  ///< the whole message's length
};

struct aeth {
  std::uint8_t syndrome = 0;  ///< bit 7 zero; 6:5 type; 4:0 value
  std::uint32_t msn = 0;      ///< 24 bits
};

struct atomic_eth {
  std::uint64_t va = 0;
  std::uint32_t rkey = 0;
  std::uint64_t swap_add = 0;
  std::uint64_t compare = 0;
};

struct deth {
  std::uint32_t qkey = 0;
  std::uint32_t src_qp = 0;  ///< 24 bits
};

/// Every header of one packet.  `bth.opcode` decides which of the others are
/// present on the wire; absent ones are ignored by `encode()` and left
/// value-initialised by `decode()`.
struct transport_headers {
  wire::bth bth;
  wire::deth deth;
  wire::reth reth;
  wire::atomic_eth atomic;
  wire::aeth aeth;
  std::uint64_t atomic_ack = 0;  ///< AtomicAckETH: the original remote value
  std::uint32_t imm = 0;         ///< ImmDt, network byte order (opaque)
  std::uint32_t ieth_rkey = 0;   ///< IETH: the R_Key to invalidate
  std::uint32_t feth = 0;        ///< FETH: bits 3:0 placement type, 5:4 selectivity level
};

/// Room for the BTH and extension headers of any opcode (the longest,
/// CMP_SWAP, is 40 bytes), rounded up to 48 for the buffers that hold them.
inline constexpr std::size_t max_header_size = 48;

/// The longest RoCEv2 packet above UDP: headers, the largest path MTU's
/// payload (4096), pad and ICRC.
inline constexpr std::size_t max_packet_size = max_header_size + 4096 + 3 + 4;

/// Serialises the headers for `h.bth.opcode` into `out`, which must hold
/// `info(op).length` bytes.  Returns the number of bytes written, or 0 if
/// the opcode is not valid or `out` is too small.  Field values are masked
/// to their widths.
std::size_t encode(const transport_headers& h, std::span<std::byte> out) noexcept;

/// Pad count for a payload length: `(-len) & 3`.
constexpr std::uint8_t pad_for(std::size_t payload_len) noexcept {
  return static_cast<std::uint8_t>((0u - payload_len) & 3u);
}

/// Why a received packet was refused.  Every refusal is a silent drop on
/// the wire (rxe counts them); the engine counts them per reason.
enum class decode_error {
  ok = 0,
  too_short,           ///< shorter than the BTH + its headers (+ ICRC)
  bad_opcode,          ///< unassigned opcode
  bad_tver,            ///< transport header version not 0
  bad_pad,             ///< pad count longer than the payload area, or not what aligns the payload
  bad_length,          ///< payload beyond what the opcode allows
};
const char* to_string(decode_error e) noexcept;

/// A received packet, viewed in place.
struct packet_view {
  transport_headers hdr;
  const opcode_info* op = nullptr;
  std::span<const std::byte> payload;  ///< without pad and ICRC
  std::uint32_t icrc = 0;              ///< as found on the wire (if present)
};

/// Parses `pkt` (BTH first).  If `has_icrc`, the last 4 bytes are the ICRC
/// and are excluded from the payload (the caller verifies them with
/// `icrc_*`).  Does not check the ICRC.
decode_error decode(std::span<const std::byte> pkt, bool has_icrc, packet_view& out) noexcept;

/// Parses the BTH and extension headers of a packet whose payload is held
/// elsewhere (the engine's zero-copy path).  `headers` holds exactly the
/// opcode's header length; `payload_len` is the payload without pad.  The
/// same checks as `decode()` apply; `out.payload` is left empty.
decode_error decode_headers(std::span<const std::byte> headers, std::size_t payload_len,
                            packet_view& out) noexcept;
/// Same, into caller storage: only the headers the opcode carries are
/// written (the rest of `hdr` keeps its values).
decode_error decode_headers(std::span<const std::byte> headers, std::size_t payload_len, transport_headers& hdr,
                            const opcode_info*& op) noexcept;

/// The segment size of a UDP GSO run that arrived as one datagram without
/// it (queued while the socket had UDP_GRO on, read after it went off: the
/// kernel reports the size only while the option is on).  A run is packets
/// of one flow sent back to back: each segment starts with a BTH of the
/// first one's P_Key and destination QP and the next PSN, all of one size
/// but the last, which may be shorter.  Returns the smallest size that
/// splits `dgram` so, or `dgram.size()` if none does (one packet).  Costs
/// up to a few compares per byte: for the rare datagram that may be a run.
std::size_t run_segment_size(std::span<const std::byte> dgram) noexcept;

/// Whether a packet whose BTH starts at `next` can be segment `k` (k >= 1)
/// of a run whose first packet's BTH starts at `first`: the same P_Key and
/// destination QP, and PSN + k.  The rule run_segment_size() splits by, and
/// so the rule a sender must build its runs by.
bool continues_run(const std::byte* first, const std::byte* next, std::uint32_t k) noexcept;

// ---------------------------------------------------------------------------
// ICRC (IBTA vol. 1 annex A17.3.3): CRC-32 over 8 bytes of 0xFF (the masked
// LRH), the IP header, the UDP header and the transport packet, with the
// variant fields set to all ones (IPv4 TOS, TTL, checksum; IPv6 traffic
// class, flow label, hop limit; UDP checksum; BTH byte 4).  Sent
// least-significant byte first.

/// Accumulates the ICRC of one packet whose transport bytes may arrive in
/// several pieces (headers, then payload straight from memory, then pad).
class icrc_builder {
 public:
  /// `ip_udp` is the IPv4 (20 bytes, no options) or IPv6 (40 bytes) header
  /// followed by the UDP header, exactly as on the wire.
  explicit icrc_builder(std::span<const std::byte> ip_udp) noexcept;
  /// Continues from `icrc_prefix()` of the packet's IP and UDP headers.
  static icrc_builder after_prefix(std::uint32_t prefix) noexcept;
  /// Adds transport bytes, from the BTH on, in as many pieces as the
  /// caller has (the BTH's byte 4 is masked wherever they cut it).
  void add(std::span<const std::byte> bytes) noexcept;
  /// The ICRC value; store it with `store_icrc()`.
  std::uint32_t value() const noexcept;

 private:
  // Nothing held; the CRC so far is `prefix`.
  explicit icrc_builder(std::uint32_t prefix) noexcept : crc_(prefix) {}
  void append(const std::byte* p, std::size_t n) noexcept;

  // Short pieces (the masked LRH, IP, UDP and transport headers, a small
  // payload, pad) gather here and go through the CRC in one call: a call
  // per piece costs three times as much for a small packet.
  std::array<std::byte, 192> buf_;
  std::size_t held_ = 0;
  std::uint32_t crc_ = 0;  // of what left buf_ already
  std::size_t bth_seen_ = 0;  // bytes of the BTH added so far
};

/// The CRC of the ICRC's masked LRH, IP and UDP headers (`ip_udp` as for
/// icrc_builder): what a flow's packets of one length have in common, for
/// icrc_builder::after_prefix().
std::uint32_t icrc_prefix(std::span<const std::byte> ip_udp) noexcept;

/// Writes the ICRC in wire order (least-significant byte first).
void store_icrc(std::uint32_t icrc, std::span<std::byte, 4> out) noexcept;
std::uint32_t load_icrc(std::span<const std::byte, 4> in) noexcept;

/// The ICRC of a complete packet given as IP+UDP headers and transport bytes
/// (BTH ... pad, without the ICRC).
std::uint32_t icrc(std::span<const std::byte> ip_udp, std::span<const std::byte> transport) noexcept;

/// How an IPv4 packet's ICRC changes with its IP identification, which the
/// ICRC covers (unlike TTL, TOS and the checksums).  The ICRC is affine in
/// the packet's bits, so the ICRC with ID k is the ICRC with ID 0 XORed
/// with a value that depends only on k and the packet's length: the XOR of
/// one precomputed value per set bit of k.  A UDP GSO send gives its
/// segments IDs 0, 1, 2 ...; and a connected socket numbers its datagrams
/// from a random start.  This fixes their ICRCs without recomputing them,
/// and lets a receiver that cannot see the ID (a UDP socket) find the one
/// ID, if any, under which a packet's ICRC is right.
class ipv4_id_icrc {
 public:
  /// XOR this into the ID-0 ICRC of a packet of `transport_len` transport
  /// bytes (BTH ... pad, no ICRC) to get its ICRC with ID `id`.
  /// A length not cached costs a few microseconds (no allocation).
  std::uint32_t delta(std::size_t transport_len, std::uint16_t id) noexcept;
  /// The ID whose delta is `d` (the received ICRC XOR the ID-0 one), or
  /// nullopt if none is: the 16 per-bit deltas are independent (CRC-32
  /// tells apart every error pattern within 32 bits), so there is at most
  /// one.  Only 2^16 of the 2^32 values of `d` have an ID: a corrupted
  /// packet passes for a numbered one with odds 2^-16, so a receiver
  /// checks that the ID is one the sender can have used, too.  A length
  /// not cached costs about a microsecond and is cached only if `d` has
  /// an ID, so junk of many lengths evicts nothing.
  std::optional<std::uint16_t> solve(std::size_t transport_len, std::uint32_t d) noexcept;
  /// Whether the tables for `transport_len` are cached.
  bool cached(std::size_t transport_len) const noexcept;

 private:
  struct entry {
    std::size_t transport_len = ~std::size_t{0};
    std::array<std::uint32_t, 16> bit{};  // delta of each ID bit
    // delta() by table, for the ID's low and high byte: a loop over the
    // bits mispredicts a branch per changed bit of a counting ID.
    std::array<std::uint32_t, 256> low{}, high{};
    // solve() by table, built at its first use for the length: the ID bits
    // that each byte of a delta stands for.
    std::array<std::array<std::uint16_t, 256>, 4> inverse{};
    bool has_inverse = false;
  };
  entry* find(std::size_t transport_len) noexcept;  // cached, or nullptr
  entry& lookup(std::size_t transport_len) noexcept;  // cached, or built in place of the oldest
  static void fill(entry& e, std::size_t transport_len) noexcept;
  static void build_inverse(entry& e) noexcept;
  std::array<entry, 8> cache_{};  // a handful of lengths: MTU-sized packets, then the rest
  std::size_t next_ = 0;          // round-robin replacement
  std::size_t last_ = 0;          // the one lookup() found last
};

// ---------------------------------------------------------------------------
// IP and UDP headers as RoCEv2 (and rxe) writes them.

struct ip_udp_params {
  std::array<std::byte, 16> src_gid{};  ///< IPv4-mapped (::ffff:a.b.c.d) or IPv6
  std::array<std::byte, 16> dst_gid{};
  std::uint16_t src_port = 0;           ///< UDP source port (entropy)
  std::uint16_t dst_port = roce_udp_port;
  std::uint8_t traffic_class = 0;       ///< IPv4 TOS / IPv6 traffic class
  std::uint8_t hop_limit = 64;          ///< IPv4 TTL / IPv6 hop limit
  std::uint32_t flow_label = 0;         ///< IPv6 only (rxe sends 0)
  std::uint16_t ip_id = 0;              ///< IPv4 identification (0 with DF)
};

/// True if the GID is an IPv4-mapped IPv6 address (::ffff:a.b.c.d).
/// Inline: every packet sent asks (averbs::gid::is_ipv4_mapped() too).
inline bool is_ipv4_mapped(std::span<const std::byte, 16> gid) noexcept {
  static constexpr std::uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};  // ::ffff:0:0/96
  return std::memcmp(gid.data(), prefix, sizeof prefix) == 0;
}

/// Writes the IPv4 (20 bytes, DF set, valid checksum) or IPv6 (40 bytes)
/// header and the UDP header (checksum 0) for a transport packet of
/// `transport_len` bytes including the ICRC.  IPv4 is used when both GIDs
/// are IPv4-mapped.  Returns the bytes written (28 or 48), 0 if `out` is
/// too small or the GIDs mix families.
std::size_t build_ip_udp(const ip_udp_params& p, std::size_t transport_len,
                         std::span<std::byte> out) noexcept;

/// What a UD receive's 40-byte GRH area says of the datagram it came in:
/// its addresses as GIDs, traffic class and flow label.  RoCEv2 puts the
/// IPv6 header there, or 20 bytes of zero and the IPv4 header.
struct grh_fields {
  std::array<std::byte, 16> src{};  ///< the sender's GID
  std::array<std::byte, 16> dst{};  ///< the receiver's
  std::uint8_t traffic_class = 0;
  std::uint32_t flow_label = 0;  ///< IPv6 only
};
/// Reads a GRH area as libibverbs' ibv_init_ah_from_wc does: IPv4 when
/// bytes 20-39 hold an IPv4 header of 20 bytes with a valid checksum (or
/// when bytes 0-3 do not say IPv6), else IPv6 with UDP as next header.
/// False if neither is there.
bool parse_grh_area(std::span<const std::byte, 40> area, grh_fields& out) noexcept;

/// icrc_prefix() of the headers build_ip_udp() writes, for the last few
/// flows and lengths seen: a packet's IP and UDP headers differ from the
/// last one's of its flow in nothing the ICRC covers but, at most, the
/// length, so most packets skip building and folding them.  Bounded
/// (direct-mapped), no allocation.
class icrc_prefix_cache {
 public:
  /// The prefix for headers from `src`:`src_port` to `dst`:`dst_port`
  /// carrying `transport_len` bytes (BTH ... ICRC) with IPv4 ID 0, or
  /// nullopt where build_ip_udp() fails (mixed families, too long).
  std::optional<std::uint32_t> get(std::span<const std::byte, 16> src, std::span<const std::byte, 16> dst,
                                   std::uint16_t src_port, std::uint16_t dst_port,
                                   std::size_t transport_len) noexcept;

 private:
  struct key {  // no padding: compared with memcmp
    std::array<std::byte, 16> src{}, dst{};
    std::uint16_t src_port = 0, dst_port = 0;
    std::uint32_t transport_len = 0;
  };
  struct entry {
    key k;
    std::uint32_t prefix = 0;
    bool used = false;
  };
  std::array<entry, 16> cache_{};
};

/// rxe's UDP source port for a QP pair (rdma_get_udp_sport): the flow label
/// if non-zero, else one derived from the QP numbers, folded to 14 bits and
/// offset by 0xC000.
std::uint16_t udp_source_port(std::uint32_t flow_label, std::uint32_t lqpn, std::uint32_t rqpn) noexcept;

/// rxe's UDP source port of a UD QP (and QP1), fixed when the QP is made:
/// 0xC000 + the QP number hashed to 14 bits (hash_32: multiply by the
/// 32-bit golden ratio, keep the top bits).
constexpr std::uint16_t ud_source_port(std::uint32_t qpn) noexcept {
  return static_cast<std::uint16_t>(0xC000 | (((qpn * 0x61C88647u) >> (32 - 14)) & 0x3FFF));
}

// ---------------------------------------------------------------------------
// AETH syndromes (IBTA 9.7.5.1.1).

enum class aeth_type : std::uint8_t { ack = 0, rnr_nak = 1, reserved = 2, nak = 3 };
enum class nak_code : std::uint8_t {
  psn_sequence_error = 0,
  invalid_request = 1,
  remote_access_error = 2,
  remote_operational_error = 3,
  invalid_rd_request = 4,
};

inline constexpr std::uint8_t aeth_ack_unlimited = 0x1F;  ///< ACK, credits invalid
constexpr std::uint8_t aeth_rnr_nak(std::uint8_t timer) noexcept { return 0x20 | (timer & 0x1F); }
constexpr std::uint8_t aeth_nak(nak_code c) noexcept { return 0x60 | static_cast<std::uint8_t>(c); }
/// Bits 6:5 of the syndrome; a syndrome with bit 7 set is reserved too
/// (IBTA 9.7.5.2.1 defines 0x00-0x7F only; rxe's check_ack refuses the rest).
constexpr aeth_type aeth_type_of(std::uint8_t syndrome) noexcept {
  return (syndrome & 0x80) != 0 ? aeth_type::reserved : static_cast<aeth_type>((syndrome >> 5) & 3);
}

/// The RNR NAK timer code's delay in nanoseconds (code 0 is 655.36 ms).
std::uint64_t rnr_timer_ns(std::uint8_t code) noexcept;

/// The local ACK timeout for a `timeout` attribute: 4.096 us * 2^t; 0 means
/// no retransmission timer.
std::uint64_t ack_timeout_ns(std::uint8_t timeout) noexcept;

/// PSN arithmetic modulo 2^24: negative if a precedes b.
constexpr std::int32_t psn_compare(std::uint32_t a, std::uint32_t b) noexcept {
  return static_cast<std::int32_t>((a - b) << 8);
}

}  // namespace averbs::wire
