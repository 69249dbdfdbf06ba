// SPDX-License-Identifier: MIT
// libFuzzer target for the CM MAD codec (src/wire/cm.cpp).
//
// Each input is decoded as every CM message type.  A decode that succeeds
// must agree with decode_header(), and the message it produced must survive
// encode -> decode unchanged, field by field (the encoder only drops
// reserved bits, which the first decode already ignored).  The re-encoded
// MAD must keep the input's header.  A refused decode must report the same
// reason as decode_header() (or wrong_attribute for another message's MAD).
//
// The input's first 36 bytes are also decoded as an rdma_cm IP header,
// with the same encode -> decode check.
//
// Any mismatch aborts, which libFuzzer reports as a crash.
#include "wire/cm.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

namespace {

namespace cm = averbs::wire::cm;

[[noreturn]] void fail(const char* msg, const char* what) {
  std::fprintf(stderr, "cm_decode_fuzz: %s: %s\n", msg, what);
  std::abort();
}

#define SAME(a, b, field)                             \
  do {                                                \
    if (!((a).field == (b).field)) fail(msg, #field); \
  } while (0)

void same(const cm::path& a, const cm::path& b, const char* msg) {
  SAME(a, b, local_lid);
  SAME(a, b, remote_lid);
  SAME(a, b, local_gid);
  SAME(a, b, remote_gid);
  SAME(a, b, flow_label);
  SAME(a, b, packet_rate);
  SAME(a, b, traffic_class);
  SAME(a, b, hop_limit);
  SAME(a, b, sl);
  SAME(a, b, subnet_local);
  SAME(a, b, local_ack_timeout);
}

void same(const cm::req& a, const cm::req& b, const char* msg) {
  SAME(a, b, local_comm_id);
  SAME(a, b, vendor_id);
  SAME(a, b, service_id);
  SAME(a, b, local_ca_guid);
  SAME(a, b, local_qkey);
  SAME(a, b, local_qpn);
  SAME(a, b, responder_resources);
  SAME(a, b, local_eecn);
  SAME(a, b, initiator_depth);
  SAME(a, b, remote_eecn);
  SAME(a, b, remote_cm_response_timeout);
  SAME(a, b, transport_type);
  SAME(a, b, e2e_flow_control);
  SAME(a, b, starting_psn);
  SAME(a, b, local_cm_response_timeout);
  SAME(a, b, retry_count);
  SAME(a, b, pkey);
  SAME(a, b, path_mtu);
  SAME(a, b, rdc_exists);
  SAME(a, b, rnr_retry_count);
  SAME(a, b, max_cm_retries);
  SAME(a, b, srq);
  SAME(a, b, extended_transport);
  same(a.primary, b.primary, msg);
  SAME(a, b, has_alternate);
  same(a.alternate, b.alternate, msg);
  SAME(a, b, private_data);
}

void same(const cm::rep& a, const cm::rep& b, const char* msg) {
  SAME(a, b, local_comm_id);
  SAME(a, b, remote_comm_id);
  SAME(a, b, local_qkey);
  SAME(a, b, local_qpn);
  SAME(a, b, local_eecn);
  SAME(a, b, starting_psn);
  SAME(a, b, responder_resources);
  SAME(a, b, initiator_depth);
  SAME(a, b, target_ack_delay);
  SAME(a, b, failover_accepted);
  SAME(a, b, e2e_flow_control);
  SAME(a, b, rnr_retry_count);
  SAME(a, b, srq);
  SAME(a, b, local_ca_guid);
  SAME(a, b, vendor_id);
  SAME(a, b, private_data);
}

void same(const cm::rtu& a, const cm::rtu& b, const char* msg) {
  SAME(a, b, local_comm_id);
  SAME(a, b, remote_comm_id);
  SAME(a, b, private_data);
}

void same(const cm::rej& a, const cm::rej& b, const char* msg) {
  SAME(a, b, local_comm_id);
  SAME(a, b, remote_comm_id);
  SAME(a, b, message_rejected);
  SAME(a, b, reject_info_length);
  SAME(a, b, reason);
  SAME(a, b, ari);
  SAME(a, b, private_data);
}

void same(const cm::mra& a, const cm::mra& b, const char* msg) {
  SAME(a, b, local_comm_id);
  SAME(a, b, remote_comm_id);
  SAME(a, b, message_mraed);
  SAME(a, b, service_timeout);
  SAME(a, b, private_data);
}

void same(const cm::dreq& a, const cm::dreq& b, const char* msg) {
  SAME(a, b, local_comm_id);
  SAME(a, b, remote_comm_id);
  SAME(a, b, remote_qpn);
  SAME(a, b, private_data);
}

void same(const cm::drep& a, const cm::drep& b, const char* msg) {
  SAME(a, b, local_comm_id);
  SAME(a, b, remote_comm_id);
  SAME(a, b, private_data);
}

void same(const cm::sidr_req& a, const cm::sidr_req& b, const char* msg) {
  SAME(a, b, request_id);
  SAME(a, b, pkey);
  SAME(a, b, service_id);
  SAME(a, b, private_data);
}

void same(const cm::sidr_rep& a, const cm::sidr_rep& b, const char* msg) {
  SAME(a, b, request_id);
  SAME(a, b, status);
  SAME(a, b, additional_info_length);
  SAME(a, b, qpn);
  SAME(a, b, service_id);
  SAME(a, b, qkey);
  SAME(a, b, class_port_info);
  SAME(a, b, private_data);
}

void same(const cm::mad_header& a, const cm::mad_header& b, const char* msg) {
  SAME(a, b, base_version);
  SAME(a, b, mgmt_class);
  SAME(a, b, class_version);
  SAME(a, b, method);
  SAME(a, b, status);
  SAME(a, b, class_specific);
  SAME(a, b, tid);
  SAME(a, b, attr_id);
  SAME(a, b, attr_mod);
}

void same(const cm::ip_header& a, const cm::ip_header& b, const char* msg) {
  SAME(a, b, ip_version);
  SAME(a, b, src_port);
  SAME(a, b, src_ip);
  SAME(a, b, dst_ip);
}

#undef SAME

template <typename Msg>
void check(std::span<const std::byte> in, cm::attr id, const char* msg) {
  cm::mad_header h;
  const cm::mad_error herr = cm::decode_header(in, h);

  Msg first{};
  const cm::mad_error err = cm::decode(in, first);
  if (err != cm::mad_error::ok) {
    const cm::mad_error want = herr != cm::mad_error::ok ? herr : cm::mad_error::wrong_attribute;
    if (err != want) fail(msg, "refusal differs from decode_header's verdict");
    if (herr == cm::mad_error::ok && h.attr_id == id) fail(msg, "refused its own attribute");
    return;
  }
  if (herr != cm::mad_error::ok || h.attr_id != id) fail(msg, "accepted a MAD decode_header refuses");

  std::array<std::byte, cm::mad_size> out;
  out.fill(std::byte{0x5A});
  if (cm::encode(h, first, out) != cm::mad_size) fail(msg, "encode length");
  cm::mad_header h2;
  if (cm::decode_header(out, h2) != cm::mad_error::ok) fail(msg, "re-encoded header refused");
  same(h, h2, msg);

  Msg second{};
  if (cm::decode(out, second) != cm::mad_error::ok) fail(msg, "re-encoded MAD refused");
  same(first, second, msg);
}

void check_ip_header(std::span<const std::byte> in) {
  cm::ip_header first;
  if (!cm::decode(in, first)) return;
  std::array<std::byte, cm::ip_header_size> out;
  if (cm::encode(first, out) != cm::ip_header_size) fail("ip_header", "encode refused a decoded header");
  cm::ip_header second;
  if (!cm::decode(out, second)) fail("ip_header", "re-encoded header refused");
  same(first, second, "ip_header");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check<cm::req>(in, cm::attr::req, "req");
  check<cm::rep>(in, cm::attr::rep, "rep");
  check<cm::rtu>(in, cm::attr::rtu, "rtu");
  check<cm::rej>(in, cm::attr::rej, "rej");
  check<cm::mra>(in, cm::attr::mra, "mra");
  check<cm::dreq>(in, cm::attr::dreq, "dreq");
  check<cm::drep>(in, cm::attr::drep, "drep");
  check<cm::sidr_req>(in, cm::attr::sidr_req, "sidr_req");
  check<cm::sidr_rep>(in, cm::attr::sidr_rep, "sidr_rep");
  check_ip_header(in);
  // The same bytes as a MAD body behind a valid CM header, so that the
  // fuzzer reaches the body decoders without first guessing the header.
  if (size >= 1) {
    std::array<std::byte, cm::mad_size> mad{};
    static constexpr std::array<std::uint8_t, 4> prefix{1, cm::mgmt_class_cm, cm::cm_class_version,
                                                        cm::method_send};
    for (std::size_t i = 0; i < prefix.size(); ++i) mad[i] = std::byte{prefix[i]};
    mad[16] = std::byte{0};
    mad[17] = in[0];  // the attribute ID's low byte
    const std::size_t body = std::min(size - 1, cm::mad_size - cm::mad_header_size);
    for (std::size_t i = 0; i < body; ++i) mad[cm::mad_header_size + i] = in[1 + i];
    const std::span<const std::byte> m(mad);
    check<cm::req>(m, cm::attr::req, "req (framed)");
    check<cm::rep>(m, cm::attr::rep, "rep (framed)");
    check<cm::rtu>(m, cm::attr::rtu, "rtu (framed)");
    check<cm::rej>(m, cm::attr::rej, "rej (framed)");
    check<cm::mra>(m, cm::attr::mra, "mra (framed)");
    check<cm::dreq>(m, cm::attr::dreq, "dreq (framed)");
    check<cm::drep>(m, cm::attr::drep, "drep (framed)");
    check<cm::sidr_req>(m, cm::attr::sidr_req, "sidr_req (framed)");
    check<cm::sidr_rep>(m, cm::attr::sidr_rep, "sidr_rep (framed)");
  }
  return 0;
}
