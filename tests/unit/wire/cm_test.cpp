// SPDX-License-Identifier: MIT
// The CM MAD codec (src/wire/cm.cpp): round trips of every message, the
// exact byte and bit positions of IBTA vol. 1 tables 106-120 (offsets as in
// shared/reference/roce.md section 3.3, here as MAD offsets = body + 24),
// header refusals, rdma_cm service IDs and IP header, CM timeouts, and an
// independent cross-check of REQ/REP/RTU/REJ/DREQ/DREP against tshark.
#include "wire/cm.hpp"
#include "environment.hpp"
#include "wire/roce.hpp"

#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace cm = averbs::wire::cm;
namespace w = averbs::wire;
using mad_bytes = std::array<std::byte, cm::mad_size>;

// --- helpers -------------------------------------------------------------------------

template <std::size_t N>
std::array<std::byte, N> pattern(std::uint8_t seed) {
  std::array<std::byte, N> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = static_cast<std::byte>(seed + 7 * i);
  return a;
}

cm::gid_bytes gid_v4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  cm::gid_bytes g{};
  g[10] = g[11] = std::byte{0xFF};
  g[12] = std::byte{a}, g[13] = std::byte{b}, g[14] = std::byte{c}, g[15] = std::byte{d};
  return g;
}

cm::gid_bytes gid_fd00(std::uint8_t last) {
  cm::gid_bytes g{};
  g[0] = std::byte{0xFD};
  g[7] = std::byte{0x42};
  g[15] = std::byte{last};
  return g;
}

std::uint8_t at(const mad_bytes& m, std::size_t i) { return std::to_integer<std::uint8_t>(m[i]); }
std::uint64_t be_at(const mad_bytes& m, std::size_t i, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < n; ++k) v = v << 8 | at(m, i + k);
  return v;
}
template <std::size_t N>
bool bytes_at(const mad_bytes& m, std::size_t i, const std::array<std::byte, N>& want) {
  return std::memcmp(m.data() + i, want.data(), N) == 0;
}

cm::mad_header header(std::uint64_t tid) {
  cm::mad_header h;
  h.status = 0x1234;
  h.class_specific = 0x5678;
  h.tid = tid;
  h.attr_id = cm::attr::class_port_info;  // encode must replace it
  h.attr_mod = 0x9ABCDEF0;
  return h;
}

template <typename Msg>
mad_bytes encoded(const Msg& m, cm::mad_header h = header(0x0102030405060708)) {
  mad_bytes out;
  out.fill(std::byte{0xAA});  // encode must zero-fill
  EXPECT_EQ(cm::encode(h, m, out), cm::mad_size);
  return out;
}

// --- field-by-field comparisons --------------------------------------------------------

void expect_eq(const cm::path& a, const cm::path& b, const char* which) {
  SCOPED_TRACE(which);
  EXPECT_EQ(a.local_lid, b.local_lid);
  EXPECT_EQ(a.remote_lid, b.remote_lid);
  EXPECT_EQ(a.local_gid, b.local_gid);
  EXPECT_EQ(a.remote_gid, b.remote_gid);
  EXPECT_EQ(a.flow_label, b.flow_label);
  EXPECT_EQ(a.packet_rate, b.packet_rate);
  EXPECT_EQ(a.traffic_class, b.traffic_class);
  EXPECT_EQ(a.hop_limit, b.hop_limit);
  EXPECT_EQ(a.sl, b.sl);
  EXPECT_EQ(a.subnet_local, b.subnet_local);
  EXPECT_EQ(a.local_ack_timeout, b.local_ack_timeout);
}

void expect_eq(const cm::req& a, const cm::req& b) {
  EXPECT_EQ(a.local_comm_id, b.local_comm_id);
  EXPECT_EQ(a.vendor_id, b.vendor_id);
  EXPECT_EQ(a.service_id, b.service_id);
  EXPECT_EQ(a.local_ca_guid, b.local_ca_guid);
  EXPECT_EQ(a.local_qkey, b.local_qkey);
  EXPECT_EQ(a.local_qpn, b.local_qpn);
  EXPECT_EQ(a.responder_resources, b.responder_resources);
  EXPECT_EQ(a.local_eecn, b.local_eecn);
  EXPECT_EQ(a.initiator_depth, b.initiator_depth);
  EXPECT_EQ(a.remote_eecn, b.remote_eecn);
  EXPECT_EQ(a.remote_cm_response_timeout, b.remote_cm_response_timeout);
  EXPECT_EQ(a.transport_type, b.transport_type);
  EXPECT_EQ(a.e2e_flow_control, b.e2e_flow_control);
  EXPECT_EQ(a.starting_psn, b.starting_psn);
  EXPECT_EQ(a.local_cm_response_timeout, b.local_cm_response_timeout);
  EXPECT_EQ(a.retry_count, b.retry_count);
  EXPECT_EQ(a.pkey, b.pkey);
  EXPECT_EQ(a.path_mtu, b.path_mtu);
  EXPECT_EQ(a.rdc_exists, b.rdc_exists);
  EXPECT_EQ(a.rnr_retry_count, b.rnr_retry_count);
  EXPECT_EQ(a.max_cm_retries, b.max_cm_retries);
  EXPECT_EQ(a.srq, b.srq);
  EXPECT_EQ(a.extended_transport, b.extended_transport);
  expect_eq(a.primary, b.primary, "primary path");
  EXPECT_EQ(a.has_alternate, b.has_alternate);
  expect_eq(a.alternate, b.alternate, "alternate path");
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::rep& a, const cm::rep& b) {
  EXPECT_EQ(a.local_comm_id, b.local_comm_id);
  EXPECT_EQ(a.remote_comm_id, b.remote_comm_id);
  EXPECT_EQ(a.local_qkey, b.local_qkey);
  EXPECT_EQ(a.local_qpn, b.local_qpn);
  EXPECT_EQ(a.local_eecn, b.local_eecn);
  EXPECT_EQ(a.starting_psn, b.starting_psn);
  EXPECT_EQ(a.responder_resources, b.responder_resources);
  EXPECT_EQ(a.initiator_depth, b.initiator_depth);
  EXPECT_EQ(a.target_ack_delay, b.target_ack_delay);
  EXPECT_EQ(a.failover_accepted, b.failover_accepted);
  EXPECT_EQ(a.e2e_flow_control, b.e2e_flow_control);
  EXPECT_EQ(a.rnr_retry_count, b.rnr_retry_count);
  EXPECT_EQ(a.srq, b.srq);
  EXPECT_EQ(a.local_ca_guid, b.local_ca_guid);
  EXPECT_EQ(a.vendor_id, b.vendor_id);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::rtu& a, const cm::rtu& b) {
  EXPECT_EQ(a.local_comm_id, b.local_comm_id);
  EXPECT_EQ(a.remote_comm_id, b.remote_comm_id);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::rej& a, const cm::rej& b) {
  EXPECT_EQ(a.local_comm_id, b.local_comm_id);
  EXPECT_EQ(a.remote_comm_id, b.remote_comm_id);
  EXPECT_EQ(a.message_rejected, b.message_rejected);
  EXPECT_EQ(a.reject_info_length, b.reject_info_length);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.ari, b.ari);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::mra& a, const cm::mra& b) {
  EXPECT_EQ(a.local_comm_id, b.local_comm_id);
  EXPECT_EQ(a.remote_comm_id, b.remote_comm_id);
  EXPECT_EQ(a.message_mraed, b.message_mraed);
  EXPECT_EQ(a.service_timeout, b.service_timeout);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::dreq& a, const cm::dreq& b) {
  EXPECT_EQ(a.local_comm_id, b.local_comm_id);
  EXPECT_EQ(a.remote_comm_id, b.remote_comm_id);
  EXPECT_EQ(a.remote_qpn, b.remote_qpn);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::drep& a, const cm::drep& b) {
  EXPECT_EQ(a.local_comm_id, b.local_comm_id);
  EXPECT_EQ(a.remote_comm_id, b.remote_comm_id);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::sidr_req& a, const cm::sidr_req& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.pkey, b.pkey);
  EXPECT_EQ(a.service_id, b.service_id);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::sidr_rep& a, const cm::sidr_rep& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.additional_info_length, b.additional_info_length);
  EXPECT_EQ(a.qpn, b.qpn);
  EXPECT_EQ(a.service_id, b.service_id);
  EXPECT_EQ(a.qkey, b.qkey);
  EXPECT_EQ(a.class_port_info, b.class_port_info);
  EXPECT_EQ(a.private_data, b.private_data);
}

void expect_eq(const cm::mad_header& a, const cm::mad_header& b) {
  EXPECT_EQ(a.base_version, b.base_version);
  EXPECT_EQ(a.mgmt_class, b.mgmt_class);
  EXPECT_EQ(a.class_version, b.class_version);
  EXPECT_EQ(a.method, b.method);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.class_specific, b.class_specific);
  EXPECT_EQ(a.tid, b.tid);
  EXPECT_EQ(a.attr_id, b.attr_id);
  EXPECT_EQ(a.attr_mod, b.attr_mod);
}

template <typename Msg>
Msg round_trip(const Msg& m) {
  const mad_bytes mad = encoded(m);
  Msg out;
  EXPECT_EQ(cm::decode(mad, out), cm::mad_error::ok);
  return out;
}

// --- sample messages: every field non-trivial, bit fields at their boundaries ----------

cm::path sample_primary() {
  cm::path p;
  p.local_lid = 0xFFFF;
  p.remote_lid = 0xFFFE;
  p.local_gid = gid_v4(192, 0, 2, 1);
  p.remote_gid = gid_v4(192, 0, 2, 2);
  p.flow_label = 0xFFFFF;  // all 20 bits
  p.packet_rate = 0x3F;    // all 6 bits
  p.traffic_class = 0xB8;
  p.hop_limit = 0xFF;
  p.sl = 0xF;
  p.subnet_local = true;
  p.local_ack_timeout = 0x1F;
  return p;
}

cm::path sample_alternate() {
  cm::path p;
  p.local_lid = 0x1234;
  p.remote_lid = 0x5678;
  p.local_gid = gid_fd00(1);
  p.remote_gid = gid_fd00(2);
  p.flow_label = 0x80001;  // MSB and LSB of the 20 bits
  p.packet_rate = 0x21;
  p.traffic_class = 0x11;
  p.hop_limit = 1;
  p.sl = 0x9;
  p.subnet_local = false;
  p.local_ack_timeout = 0x11;
  return p;
}

cm::req sample_req() {
  cm::req m;
  m.local_comm_id = 0xC0FFEE01;
  m.vendor_id = 0xABCDEF;
  m.service_id = cm::service_id(cm::port_space::tcp, 7471);
  m.local_ca_guid = 0x0002C90300A1B2C3;
  m.local_qkey = 0x80010000;
  m.local_qpn = 0xFFFFFE;
  m.responder_resources = 0xFE;
  m.local_eecn = 0x800001;
  m.initiator_depth = 0x81;
  m.remote_eecn = 0x7FFFFF;
  m.remote_cm_response_timeout = 0x1F;
  m.transport_type = 3;
  m.e2e_flow_control = true;
  m.starting_psn = 0xFFFFFF;
  m.local_cm_response_timeout = 0x10;
  m.retry_count = 7;
  m.pkey = 0x8001;
  m.path_mtu = 0xF;
  m.rdc_exists = true;
  m.rnr_retry_count = 7;
  m.max_cm_retries = 0xF;
  m.srq = true;
  m.extended_transport = 7;
  m.primary = sample_primary();
  m.has_alternate = true;
  m.alternate = sample_alternate();
  m.private_data = pattern<92>(0x31);
  return m;
}

cm::rep sample_rep() {
  cm::rep m;
  m.local_comm_id = 0x11223344;
  m.remote_comm_id = 0xC0FFEE01;
  m.local_qkey = 0x01234567;
  m.local_qpn = 0xFFFFFF;
  m.local_eecn = 0x800001;
  m.starting_psn = 0x7FFFFE;
  m.responder_resources = 0x10;
  m.initiator_depth = 0xF0;
  m.target_ack_delay = 0x1F;
  m.failover_accepted = 3;
  m.e2e_flow_control = true;
  m.rnr_retry_count = 7;
  m.srq = true;
  m.local_ca_guid = 0xFEDCBA9876543210;
  m.vendor_id = 0xA1B2C3;
  m.private_data = pattern<196>(0x52);
  return m;
}

cm::rtu sample_rtu() {
  cm::rtu m;
  m.local_comm_id = 0xC0FFEE01;
  m.remote_comm_id = 0x11223344;
  m.private_data = pattern<224>(0x63);
  return m;
}

cm::rej sample_rej() {
  cm::rej m;
  m.local_comm_id = 0x11223344;
  m.remote_comm_id = 0xC0FFEE01;
  m.message_rejected = cm::msg_ref::other;
  m.reject_info_length = 72;  // all of the ARI (the 7-bit field's largest valid value)
  m.reason = static_cast<std::uint16_t>(cm::rej_reason::consumer_defined);
  m.ari = pattern<72>(0x74);
  m.private_data = pattern<148>(0x85);
  return m;
}

cm::mra sample_mra() {
  cm::mra m;
  m.local_comm_id = 0x11223344;
  m.remote_comm_id = 0xC0FFEE01;
  m.message_mraed = cm::msg_ref::rep;
  m.service_timeout = 0x1F;
  m.private_data = pattern<222>(0x96);
  return m;
}

cm::dreq sample_dreq() {
  cm::dreq m;
  m.local_comm_id = 0xC0FFEE01;
  m.remote_comm_id = 0x11223344;
  m.remote_qpn = 0xFFFFFF;
  m.private_data = pattern<220>(0xA7);
  return m;
}

cm::drep sample_drep() {
  cm::drep m;
  m.local_comm_id = 0x11223344;
  m.remote_comm_id = 0xC0FFEE01;
  m.private_data = pattern<224>(0xB8);
  return m;
}

cm::sidr_req sample_sidr_req() {
  cm::sidr_req m;
  m.request_id = 0xDEADBEEF;
  m.pkey = 0x7FFF;
  m.service_id = cm::service_id(cm::port_space::udp, 0xFFFF);
  m.private_data = pattern<216>(0xC9);
  return m;
}

cm::sidr_rep sample_sidr_rep() {
  cm::sidr_rep m;
  m.request_id = 0xDEADBEEF;
  m.status = cm::sidr_status::redirect;
  m.additional_info_length = 72;
  m.qpn = 0xFFFFFF;
  m.service_id = cm::service_id(cm::port_space::udp, 0xFFFF);
  m.qkey = 0x01234567;
  m.class_port_info = pattern<72>(0xDA);
  m.private_data = pattern<136>(0xEB);
  return m;
}

// ---------------------------------------------------------------------------
// Round trips

TEST(cm_codec, req_round_trip_with_alternate_path_preserves_every_field) {
  const cm::req m = sample_req();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, req_round_trip_without_alternate_path_leaves_the_alternate_zero_on_the_wire) {
  cm::req m = sample_req();
  m.has_alternate = false;
  m.alternate = sample_alternate();  // must be ignored
  const mad_bytes mad = encoded(m);
  for (std::size_t i = 24 + 96; i < 24 + 140; ++i) EXPECT_EQ(at(mad, i), 0) << "byte " << i;
  cm::req out;
  ASSERT_EQ(cm::decode(mad, out), cm::mad_error::ok);
  EXPECT_FALSE(out.has_alternate);
  m.alternate = cm::path{};  // an absent alternate decodes as the default path
  expect_eq(out, m);
}

TEST(cm_codec, req_alternate_path_with_only_a_gid_is_present) {
  cm::req m = sample_req();
  m.alternate = cm::path{};
  m.alternate.local_lid = m.alternate.remote_lid = 0;
  m.alternate.hop_limit = 0;
  m.alternate.remote_gid[15] = std::byte{1};
  const cm::req out = round_trip(m);
  EXPECT_TRUE(out.has_alternate);
  expect_eq(out, m);
}

TEST(cm_codec, req_fields_are_masked_to_their_widths_without_touching_neighbours) {
  cm::req m;  // zero apart from the oversized fields
  m.pkey = 0;
  m.primary = cm::path{};
  m.primary.local_lid = m.primary.remote_lid = 0;
  m.primary.hop_limit = 0;
  m.vendor_id = 0xFF123456;
  m.local_qpn = 0x12345678;
  m.local_eecn = 0xFFABCDEF;
  m.remote_eecn = 0x01000002;
  m.starting_psn = 0xFF000001;
  m.retry_count = 0xFF;
  m.rnr_retry_count = 0x0F;
  m.extended_transport = 0xF8;  // no bit inside the 3-bit field
  m.primary.flow_label = 0xFFF00001;
  m.primary.packet_rate = 0xC1;
  m.primary.sl = 0xF3;
  m.primary.local_ack_timeout = 0xE1;

  const mad_bytes mad = encoded(m);
  EXPECT_EQ(be_at(mad, 28, 4), 0x00123456u);  // byte 28 (body 4) reserved stays 0
  EXPECT_EQ(be_at(mad, 56, 4), 0x34567800u);  // QPN, then ResponderResources 0
  EXPECT_EQ(be_at(mad, 60, 4), 0xABCDEF00u);
  EXPECT_EQ(be_at(mad, 64, 4), 0x00000200u);  // remote EECN, timeouts/type 0
  EXPECT_EQ(be_at(mad, 68, 4), 0x00000107u);  // PSN 1, LocalCMRespTimeout 0, retry 7
  EXPECT_EQ(at(mad, 74), 0x07);               // MTU 0, RDC 0, RNR retry 7
  EXPECT_EQ(at(mad, 75), 0x00);
  EXPECT_EQ(be_at(mad, 112, 4), 0x00001001u);  // flow label 1, reserved 0, rate 1
  EXPECT_EQ(at(mad, 118), 0x30);               // SL 3, SubnetLocal 0, reserved 0
  EXPECT_EQ(at(mad, 119), 0x08);               // ack timeout 1, reserved 0

  cm::req out;
  ASSERT_EQ(cm::decode(mad, out), cm::mad_error::ok);
  EXPECT_EQ(out.vendor_id, 0x123456u);
  EXPECT_EQ(out.local_qpn, 0x345678u);
  EXPECT_EQ(out.local_eecn, 0xABCDEFu);
  EXPECT_EQ(out.remote_eecn, 0x000002u);
  EXPECT_EQ(out.starting_psn, 0x000001u);
  EXPECT_EQ(out.retry_count, 7);
  EXPECT_EQ(out.rnr_retry_count, 7);
  EXPECT_EQ(out.extended_transport, 0);
  EXPECT_EQ(out.primary.flow_label, 0x00001u);
  EXPECT_EQ(out.primary.packet_rate, 0x01);
  EXPECT_EQ(out.primary.sl, 3);
  EXPECT_EQ(out.primary.local_ack_timeout, 1);
}

TEST(cm_codec, five_bit_timeouts_and_small_fields_are_masked) {
  cm::req r;
  r.remote_cm_response_timeout = 0x21;  // -> 1
  r.local_cm_response_timeout = 0xFF;   // -> 31
  r.transport_type = 0x06;              // -> 2
  r.path_mtu = 0x15;                    // -> 5
  r.max_cm_retries = 0x1F;              // -> 15
  const cm::req ro = round_trip(r);
  EXPECT_EQ(ro.remote_cm_response_timeout, 1);
  EXPECT_EQ(ro.local_cm_response_timeout, 31);
  EXPECT_EQ(ro.transport_type, 2);
  EXPECT_EQ(ro.path_mtu, 5);
  EXPECT_EQ(ro.max_cm_retries, 15);

  cm::rep p;
  p.target_ack_delay = 0x3F;
  p.failover_accepted = 0x05;
  p.rnr_retry_count = 0x09;
  p.local_qpn = 0xFF000010;
  p.vendor_id = 0xFF010203;
  const cm::rep po = round_trip(p);
  EXPECT_EQ(po.target_ack_delay, 31);
  EXPECT_EQ(po.failover_accepted, 1);
  EXPECT_EQ(po.rnr_retry_count, 1);
  EXPECT_EQ(po.local_qpn, 0x000010u);
  EXPECT_EQ(po.vendor_id, 0x010203u);

  cm::mra a;
  a.service_timeout = 0x3E;  // -> 30
  EXPECT_EQ(round_trip(a).service_timeout, 30);

  cm::rej j;
  j.reject_info_length = 0xC8;  // 7 bits -> 72
  EXPECT_EQ(round_trip(j).reject_info_length, 72);

  cm::dreq d;
  d.remote_qpn = 0xAB123456;
  EXPECT_EQ(round_trip(d).remote_qpn, 0x123456u);

  cm::sidr_rep s;
  s.qpn = 0x80FFFFFF;
  EXPECT_EQ(round_trip(s).qpn, 0xFFFFFFu);
}

TEST(cm_codec, rep_round_trip_preserves_every_field) {
  const cm::rep m = sample_rep();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, rtu_round_trip_preserves_every_field) {
  const cm::rtu m = sample_rtu();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, rej_round_trip_preserves_every_field) {
  const cm::rej m = sample_rej();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, mra_round_trip_preserves_every_field) {
  const cm::mra m = sample_mra();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, dreq_round_trip_preserves_every_field) {
  const cm::dreq m = sample_dreq();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, drep_round_trip_preserves_every_field) {
  const cm::drep m = sample_drep();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, sidr_req_round_trip_preserves_every_field) {
  const cm::sidr_req m = sample_sidr_req();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, sidr_rep_round_trip_preserves_every_field) {
  const cm::sidr_rep m = sample_sidr_rep();
  expect_eq(round_trip(m), m);
}

TEST(cm_codec, every_message_round_trips_with_msg_ref_values_0_to_2) {
  for (auto r : {cm::msg_ref::req, cm::msg_ref::rep, cm::msg_ref::other}) {
    cm::rej j = sample_rej();
    j.message_rejected = r;
    EXPECT_EQ(round_trip(j).message_rejected, r);
    cm::mra a = sample_mra();
    a.message_mraed = r;
    EXPECT_EQ(round_trip(a).message_mraed, r);
  }
}

// ---------------------------------------------------------------------------
// Header and encode contract

TEST(cm_codec, encode_writes_the_header_with_the_messages_attribute_and_zero_fills) {
  const mad_bytes mad = encoded(cm::rtu{});
  EXPECT_EQ(at(mad, 0), 1);     // BaseVersion
  EXPECT_EQ(at(mad, 1), 0x07);  // MgmtClass CM
  EXPECT_EQ(at(mad, 2), 2);     // ClassVersion
  EXPECT_EQ(at(mad, 3), 0x03);  // Method Send
  EXPECT_EQ(be_at(mad, 4, 2), 0x1234u);
  EXPECT_EQ(be_at(mad, 6, 2), 0x5678u);
  EXPECT_EQ(be_at(mad, 8, 8), 0x0102030405060708u);
  EXPECT_EQ(be_at(mad, 16, 2), 0x0014u);  // RTU, not the header's class_port_info
  EXPECT_EQ(be_at(mad, 18, 2), 0u);       // reserved
  EXPECT_EQ(be_at(mad, 20, 4), 0x9ABCDEF0u);
  for (std::size_t i = 24; i < cm::mad_size; ++i) EXPECT_EQ(at(mad, i), 0) << "byte " << i;
}

TEST(cm_codec, encode_sets_each_messages_attribute_id) {
  EXPECT_EQ(be_at(encoded(cm::req{}), 16, 2), 0x0010u);
  EXPECT_EQ(be_at(encoded(cm::mra{}), 16, 2), 0x0011u);
  EXPECT_EQ(be_at(encoded(cm::rej{}), 16, 2), 0x0012u);
  EXPECT_EQ(be_at(encoded(cm::rep{}), 16, 2), 0x0013u);
  EXPECT_EQ(be_at(encoded(cm::rtu{}), 16, 2), 0x0014u);
  EXPECT_EQ(be_at(encoded(cm::dreq{}), 16, 2), 0x0015u);
  EXPECT_EQ(be_at(encoded(cm::drep{}), 16, 2), 0x0016u);
  EXPECT_EQ(be_at(encoded(cm::sidr_req{}), 16, 2), 0x0017u);
  EXPECT_EQ(be_at(encoded(cm::sidr_rep{}), 16, 2), 0x0018u);
}

TEST(cm_codec, decode_header_reads_every_field) {
  const mad_bytes mad = encoded(sample_dreq());
  cm::mad_header h;
  ASSERT_EQ(cm::decode_header(mad, h), cm::mad_error::ok);
  cm::mad_header want = header(0x0102030405060708);
  want.attr_id = cm::attr::dreq;
  expect_eq(h, want);
}

TEST(cm_codec, decode_header_fills_the_header_even_when_refusing_it) {
  mad_bytes mad = encoded(sample_rtu());
  mad[2] = std::byte{1};
  cm::mad_header h;
  EXPECT_EQ(cm::decode_header(mad, h), cm::mad_error::bad_class_version);
  EXPECT_EQ(h.class_version, 1);
  EXPECT_EQ(h.attr_id, cm::attr::rtu);
  EXPECT_EQ(h.tid, 0x0102030405060708u);
}

TEST(cm_codec, decode_ignores_reserved_bits) {
  const cm::req m = sample_req();
  mad_bytes mad = encoded(m);
  mad[18] = mad[19] = std::byte{0xFF};                             // header reserved
  mad[28] = std::byte{0xFF};                                       // REQ byte 4
  for (std::size_t i = 48; i < 52; ++i) mad[i] = std::byte{0xFF};  // REQ bytes 24-27
  mad[114] |= std::byte{0x0F};                                     // flow word bits 11:8
  mad[115] |= std::byte{0xC0};                                     // flow word bits 7:6
  mad[118] |= std::byte{0x07};                                     // SL byte bits 2:0
  mad[119] |= std::byte{0x07};                                     // ack timeout byte bits 2:0
  mad[163] |= std::byte{0x07};                                     // alternate ack byte (incl. SAP)
  cm::req out;
  ASSERT_EQ(cm::decode(mad, out), cm::mad_error::ok);
  expect_eq(out, m);

  const cm::rep p = sample_rep();
  mad_bytes rmad = encoded(p);
  rmad[51] |= std::byte{0x0F};  // REP byte 27 bits 3:0
  cm::rep rout;
  ASSERT_EQ(cm::decode(rmad, rout), cm::mad_error::ok);
  expect_eq(rout, p);
}

// The REJ's 7-bit info length may say up to 127 and the SIDR_REP's 8-bit
// one up to 255, but their arrays hold 72 bytes: a peer's larger value is
// clamped, so a reader indexing the array by the length stays inside it.
TEST(cm_codec, decode_clamps_info_lengths_to_their_arrays) {
  mad_bytes mad = encoded(sample_rej());
  mad[24 + 9] = std::byte{0xFE};  // REJ byte 9: info length 127 (bits 7:1)
  cm::rej j;
  ASSERT_EQ(cm::decode(mad, j), cm::mad_error::ok);
  EXPECT_EQ(j.reject_info_length, 72);
  mad_bytes smad = encoded(sample_sidr_rep());
  smad[24 + 5] = std::byte{0xFF};  // SIDR_REP byte 5: additional info length
  cm::sidr_rep r;
  ASSERT_EQ(cm::decode(smad, r), cm::mad_error::ok);
  EXPECT_EQ(r.additional_info_length, 72);
}

TEST(cm_codec, decode_accepts_a_longer_buffer_and_reads_only_the_first_256_bytes) {
  const cm::drep m = sample_drep();
  const mad_bytes mad = encoded(m);
  std::vector<std::byte> longer(mad.begin(), mad.end());
  longer.resize(300, std::byte{0xEE});
  cm::drep out;
  ASSERT_EQ(cm::decode(longer, out), cm::mad_error::ok);
  expect_eq(out, m);
}

// ---------------------------------------------------------------------------
// Exact byte positions (roce.md section 3.3 body offsets + 24)

TEST(cm_layout, req_fields_sit_at_their_ibta_offsets) {
  cm::req m;
  m.local_comm_id = 0x01020304;
  m.vendor_id = 0x0A0B0C;
  m.service_id = 0x0000000001061D2F;
  m.local_ca_guid = 0x1112131415161718;
  m.local_qkey = 0x21222324;
  m.local_qpn = 0x313233;
  m.responder_resources = 0x34;
  m.local_eecn = 0x414243;
  m.initiator_depth = 0x44;
  m.remote_eecn = 0x515253;
  m.remote_cm_response_timeout = 20;  // 10100
  m.transport_type = 1;               // UC
  m.e2e_flow_control = true;
  m.starting_psn = 0x616263;
  m.local_cm_response_timeout = 22;  // 10110
  m.retry_count = 5;
  m.pkey = 0xFFFF;
  m.path_mtu = 3;
  m.rdc_exists = true;
  m.rnr_retry_count = 6;
  m.max_cm_retries = 15;
  m.srq = true;
  m.extended_transport = 1;
  m.primary.local_lid = 0x7172;
  m.primary.remote_lid = 0x7374;
  m.primary.local_gid = gid_v4(192, 0, 2, 1);
  m.primary.remote_gid = gid_v4(192, 0, 2, 2);
  m.primary.flow_label = 0x12345;
  m.primary.packet_rate = 0x02;
  m.primary.traffic_class = 0x81;
  m.primary.hop_limit = 0x40;
  m.primary.sl = 5;
  m.primary.subnet_local = true;
  m.primary.local_ack_timeout = 17;
  m.has_alternate = true;
  m.alternate.local_lid = 0x9192;
  m.alternate.remote_lid = 0x9394;
  m.alternate.local_gid = gid_fd00(3);
  m.alternate.remote_gid = gid_fd00(4);
  m.alternate.flow_label = 0xFEDCB;
  m.alternate.packet_rate = 0x3F;
  m.alternate.traffic_class = 0xA1;
  m.alternate.hop_limit = 0xA2;
  m.alternate.sl = 0xA;
  m.alternate.subnet_local = false;
  m.alternate.local_ack_timeout = 31;
  m.private_data = pattern<92>(0xC1);
  const mad_bytes mad = encoded(m);

  EXPECT_EQ(be_at(mad, 24, 4), 0x01020304u);             // body 0 LocalCommID
  EXPECT_EQ(at(mad, 28), 0);                             // body 4 reserved
  EXPECT_EQ(be_at(mad, 29, 3), 0x0A0B0Cu);               // body 5-7 VendorID
  EXPECT_EQ(be_at(mad, 32, 8), 0x0000000001061D2Fu);     // body 8 ServiceID
  EXPECT_EQ(be_at(mad, 40, 8), 0x1112131415161718u);     // body 16 LocalCAGUID
  EXPECT_EQ(be_at(mad, 48, 4), 0u);                      // body 24 reserved
  EXPECT_EQ(be_at(mad, 52, 4), 0x21222324u);             // body 28 LocalQ_Key
  EXPECT_EQ(be_at(mad, 56, 3), 0x313233u);               // body 32 LocalQPN
  EXPECT_EQ(at(mad, 59), 0x34);                          // body 35 ResponderResources
  EXPECT_EQ(be_at(mad, 60, 3), 0x414243u);               // body 36 LocalEECN
  EXPECT_EQ(at(mad, 63), 0x44);                          // body 39 InitiatorDepth
  EXPECT_EQ(be_at(mad, 64, 3), 0x515253u);               // body 40 RemoteEECN
  EXPECT_EQ(at(mad, 67), 0b10100'01'1);                  // body 43 timeout[7:3] type[2:1] e2e[0]
  EXPECT_EQ(be_at(mad, 68, 3), 0x616263u);               // body 44 StartingPSN
  EXPECT_EQ(at(mad, 71), 0b10110'101);                   // body 47 timeout[7:3] retry[2:0]
  EXPECT_EQ(be_at(mad, 72, 2), 0xFFFFu);                 // body 48 P_Key
  EXPECT_EQ(at(mad, 74), 0b0011'1'110);                  // body 50 MTU[7:4] RDC[3] RNR[2:0]
  EXPECT_EQ(at(mad, 75), 0b1111'1'001);                  // body 51 MaxCMRetries SRQ ExtTransport
  EXPECT_EQ(be_at(mad, 76, 2), 0x7172u);                 // body 52 primary local LID
  EXPECT_EQ(be_at(mad, 78, 2), 0x7374u);                 // body 54 primary remote LID
  EXPECT_TRUE(bytes_at(mad, 80, gid_v4(192, 0, 2, 1)));  // body 56 primary local GID
  EXPECT_TRUE(bytes_at(mad, 96, gid_v4(192, 0, 2, 2)));  // body 72 primary remote GID
  EXPECT_EQ(be_at(mad, 112, 4), 0x12345002u);            // body 88 flow label, rate (roce.md 12 34 50 02)
  EXPECT_EQ(at(mad, 116), 0x81);                         // body 92 TrafficClass
  EXPECT_EQ(at(mad, 117), 0x40);                         // body 93 HopLimit
  EXPECT_EQ(at(mad, 118), 0b0101'1'000);                 // body 94 SL[7:4] SubnetLocal[3]
  EXPECT_EQ(at(mad, 119), 0b10001'000);                  // body 95 LocalAckTimeout[7:3]
  EXPECT_EQ(be_at(mad, 120, 2), 0x9192u);                // body 96 alternate local LID
  EXPECT_EQ(be_at(mad, 122, 2), 0x9394u);                // body 98 alternate remote LID
  EXPECT_TRUE(bytes_at(mad, 124, gid_fd00(3)));          // body 100 alternate local GID
  EXPECT_TRUE(bytes_at(mad, 140, gid_fd00(4)));          // body 116 alternate remote GID
  EXPECT_EQ(be_at(mad, 156, 4), 0xFEDCB03Fu);            // body 132 flow label, rate
  EXPECT_EQ(at(mad, 160), 0xA1);                         // body 136
  EXPECT_EQ(at(mad, 161), 0xA2);                         // body 137
  EXPECT_EQ(at(mad, 162), 0b1010'0'000);                 // body 138
  EXPECT_EQ(at(mad, 163), 0b11111'000);                  // body 139
  EXPECT_TRUE(bytes_at(mad, 164, pattern<92>(0xC1)));    // body 140 private data
  EXPECT_EQ(164u + 92u, cm::mad_size);
}

TEST(cm_layout, rep_fields_sit_at_their_ibta_offsets) {
  cm::rep m;
  m.local_comm_id = 0x01020304;
  m.remote_comm_id = 0x05060708;
  m.local_qkey = 0x090A0B0C;
  m.local_qpn = 0x111213;
  m.local_eecn = 0x212223;
  m.starting_psn = 0x313233;
  m.vendor_id = 0xA1B2C3;
  m.responder_resources = 0x41;
  m.initiator_depth = 0x42;
  m.target_ack_delay = 0x13;  // 10011
  m.failover_accepted = 2;
  m.e2e_flow_control = true;
  m.rnr_retry_count = 5;
  m.srq = true;
  m.local_ca_guid = 0x5152535455565758;
  m.private_data = pattern<196>(0x61);
  const mad_bytes mad = encoded(m);

  EXPECT_EQ(be_at(mad, 24, 4), 0x01020304u);
  EXPECT_EQ(be_at(mad, 28, 4), 0x05060708u);
  EXPECT_EQ(be_at(mad, 32, 4), 0x090A0B0Cu);
  EXPECT_EQ(be_at(mad, 36, 4), 0x111213A1u);  // body 12 LocalQPN, 15 VendorID_H
  EXPECT_EQ(be_at(mad, 40, 4), 0x212223B2u);  // body 16 LocalEECN, 19 VendorID_M
  EXPECT_EQ(be_at(mad, 44, 4), 0x313233C3u);  // body 20 StartingPSN, 23 VendorID_L
  EXPECT_EQ(at(mad, 48), 0x41);
  EXPECT_EQ(at(mad, 49), 0x42);
  EXPECT_EQ(at(mad, 50), 0b10011'10'1);  // body 26 TargetAckDelay Failover E2E
  EXPECT_EQ(at(mad, 51), 0b101'1'0000);  // body 27 RNRRetryCount[7:5] SRQ[4]
  EXPECT_EQ(be_at(mad, 52, 8), 0x5152535455565758u);
  EXPECT_TRUE(bytes_at(mad, 60, pattern<196>(0x61)));
}

TEST(cm_layout, short_messages_sit_at_their_ibta_offsets) {
  {
    const mad_bytes mad = encoded(sample_rtu());
    EXPECT_EQ(be_at(mad, 24, 4), 0xC0FFEE01u);
    EXPECT_EQ(be_at(mad, 28, 4), 0x11223344u);
    EXPECT_TRUE(bytes_at(mad, 32, pattern<224>(0x63)));
  }
  {
    cm::rej m = sample_rej();
    m.message_rejected = cm::msg_ref::rep;
    m.reject_info_length = 16;
    const mad_bytes mad = encoded(m);
    EXPECT_EQ(be_at(mad, 24, 4), 0x11223344u);
    EXPECT_EQ(be_at(mad, 28, 4), 0xC0FFEE01u);
    EXPECT_EQ(at(mad, 32), 0x40);       // MessageRejected[7:6] = 1
    EXPECT_EQ(at(mad, 33), 16 << 1);    // RejectInfoLength[7:1]
    EXPECT_EQ(be_at(mad, 34, 2), 28u);  // Reason
    EXPECT_TRUE(bytes_at(mad, 36, pattern<72>(0x74)));
    EXPECT_TRUE(bytes_at(mad, 108, pattern<148>(0x85)));
  }
  {
    cm::mra m = sample_mra();
    m.message_mraed = cm::msg_ref::other;
    m.service_timeout = 24;
    const mad_bytes mad = encoded(m);
    EXPECT_EQ(at(mad, 32), 0x80);     // MessageMRAed[7:6] = 2
    EXPECT_EQ(at(mad, 33), 24 << 3);  // ServiceTimeout[7:3]
    EXPECT_TRUE(bytes_at(mad, 34, pattern<222>(0x96)));
  }
  {
    cm::dreq m = sample_dreq();
    m.remote_qpn = 0xA1A2A3;
    const mad_bytes mad = encoded(m);
    EXPECT_EQ(be_at(mad, 32, 4), 0xA1A2A300u);  // RemoteQPN/EECN, reserved byte
    EXPECT_TRUE(bytes_at(mad, 36, pattern<220>(0xA7)));
  }
  {
    const mad_bytes mad = encoded(sample_drep());
    EXPECT_EQ(be_at(mad, 24, 4), 0x11223344u);
    EXPECT_TRUE(bytes_at(mad, 32, pattern<224>(0xB8)));
  }
  {
    const mad_bytes mad = encoded(sample_sidr_req());
    EXPECT_EQ(be_at(mad, 24, 4), 0xDEADBEEFu);
    EXPECT_EQ(be_at(mad, 28, 4), 0x7FFF0000u);  // P_Key, reserved
    EXPECT_EQ(be_at(mad, 32, 8), 0x000000000111FFFFu);
    EXPECT_TRUE(bytes_at(mad, 40, pattern<216>(0xC9)));
  }
  {
    const mad_bytes mad = encoded(sample_sidr_rep());
    EXPECT_EQ(be_at(mad, 24, 4), 0xDEADBEEFu);
    EXPECT_EQ(be_at(mad, 28, 4), 0x04480000u);  // Status, AddInfoLength, reserved (ECE)
    EXPECT_EQ(be_at(mad, 32, 4), 0xFFFFFF00u);  // QPN, reserved (ECE)
    EXPECT_EQ(be_at(mad, 36, 8), 0x000000000111FFFFu);
    EXPECT_EQ(be_at(mad, 44, 4), 0x01234567u);
    EXPECT_TRUE(bytes_at(mad, 48, pattern<72>(0xDA)));
    EXPECT_TRUE(bytes_at(mad, 120, pattern<136>(0xEB)));
  }
}

// ---------------------------------------------------------------------------
// Refusals

TEST(cm_refusals, short_buffer_is_too_short_bad_flow) {
  const mad_bytes mad = encoded(sample_req());
  cm::req out;
  out.local_comm_id = 0x55;
  EXPECT_EQ(cm::decode(std::span(mad).first(255), out), cm::mad_error::too_short);
  EXPECT_EQ(cm::decode(std::span<const std::byte>{}, out), cm::mad_error::too_short);
  EXPECT_EQ(out.local_comm_id, 0x55u);  // untouched
  cm::mad_header h;
  EXPECT_EQ(cm::decode_header(std::span(mad).first(24), h), cm::mad_error::too_short);
}

TEST(cm_refusals, base_version_2_bad_flow) {
  mad_bytes mad = encoded(sample_rep());
  mad[0] = std::byte{2};
  cm::rep out;
  EXPECT_EQ(cm::decode(mad, out), cm::mad_error::bad_base_version);
}

TEST(cm_refusals, management_class_0x04_is_not_cm_bad_flow) {
  mad_bytes mad = encoded(sample_rep());
  mad[1] = std::byte{0x04};
  cm::rep out;
  EXPECT_EQ(cm::decode(mad, out), cm::mad_error::not_cm);
}

TEST(cm_refusals, class_version_1_bad_flow) {
  mad_bytes mad = encoded(sample_rtu());
  mad[2] = std::byte{1};
  cm::rtu out;
  EXPECT_EQ(cm::decode(mad, out), cm::mad_error::bad_class_version);
}

TEST(cm_refusals, method_0x01_get_bad_flow) {
  mad_bytes mad = encoded(sample_dreq());
  mad[3] = std::byte{0x01};
  cm::dreq out;
  EXPECT_EQ(cm::decode(mad, out), cm::mad_error::bad_method);
}

TEST(cm_refusals, header_fields_given_to_encode_are_sent_and_refused_on_decode) {
  cm::mad_header h = header(1);
  h.method = 0x81;  // a GetResp
  const mad_bytes mad = encoded(sample_drep(), h);
  EXPECT_EQ(at(mad, 3), 0x81);
  cm::drep out;
  EXPECT_EQ(cm::decode(mad, out), cm::mad_error::bad_method);
}

// Decodes `mad` as every message type; exactly `ok_attr` must succeed.
void expect_only_decodes_as(const mad_bytes& mad, cm::attr ok_attr) {
  auto want = [&](cm::attr a) { return a == ok_attr ? cm::mad_error::ok : cm::mad_error::wrong_attribute; };
  cm::req q;
  cm::rep p;
  cm::rtu u;
  cm::rej j;
  cm::mra a;
  cm::dreq d;
  cm::drep e;
  cm::sidr_req sq;
  cm::sidr_rep sp;
  EXPECT_EQ(cm::decode(mad, q), want(cm::attr::req));
  EXPECT_EQ(cm::decode(mad, p), want(cm::attr::rep));
  EXPECT_EQ(cm::decode(mad, u), want(cm::attr::rtu));
  EXPECT_EQ(cm::decode(mad, j), want(cm::attr::rej));
  EXPECT_EQ(cm::decode(mad, a), want(cm::attr::mra));
  EXPECT_EQ(cm::decode(mad, d), want(cm::attr::dreq));
  EXPECT_EQ(cm::decode(mad, e), want(cm::attr::drep));
  EXPECT_EQ(cm::decode(mad, sq), want(cm::attr::sidr_req));
  EXPECT_EQ(cm::decode(mad, sp), want(cm::attr::sidr_rep));
}

TEST(cm_refusals, each_message_decodes_only_as_its_own_type_wrong_attribute_bad_flow) {
  expect_only_decodes_as(encoded(sample_req()), cm::attr::req);
  expect_only_decodes_as(encoded(sample_rep()), cm::attr::rep);
  expect_only_decodes_as(encoded(sample_rtu()), cm::attr::rtu);
  expect_only_decodes_as(encoded(sample_rej()), cm::attr::rej);
  expect_only_decodes_as(encoded(sample_mra()), cm::attr::mra);
  expect_only_decodes_as(encoded(sample_dreq()), cm::attr::dreq);
  expect_only_decodes_as(encoded(sample_drep()), cm::attr::drep);
  expect_only_decodes_as(encoded(sample_sidr_req()), cm::attr::sidr_req);
  expect_only_decodes_as(encoded(sample_sidr_rep()), cm::attr::sidr_rep);
}

TEST(cm_refusals, refused_decode_leaves_the_output_untouched) {
  const cm::req before = sample_req();
  cm::req out = before;
  EXPECT_EQ(cm::decode(encoded(cm::rep{}), out), cm::mad_error::wrong_attribute);
  expect_eq(out, before);
}

TEST(cm_refusals, error_strings_name_each_reason) {
  const cm::mad_error all[] = {cm::mad_error::ok,
                               cm::mad_error::too_short,
                               cm::mad_error::bad_base_version,
                               cm::mad_error::not_cm,
                               cm::mad_error::bad_class_version,
                               cm::mad_error::bad_method,
                               cm::mad_error::wrong_attribute};
  std::vector<std::string> seen;
  for (auto e : all) {
    const std::string s = cm::to_string(e);
    EXPECT_FALSE(s.empty());
    for (const auto& other : seen) EXPECT_NE(s, other);
    seen.push_back(s);
  }
  EXPECT_STREQ(cm::to_string(cm::mad_error::ok), "ok");
}

// ---------------------------------------------------------------------------
// rdma_cm service IDs (kernel cma.c rdma_get_service_id, RDMA_IB_IP_PS_*)

static_assert(cm::service_id(cm::port_space::tcp, 7471) == 0x0000000001061D2F);
static_assert(cm::service_id(cm::port_space::udp, 7471) == 0x0000000001111D2F);
static_assert(cm::service_id(cm::port_space::ib, 1) == 0x00000000013F0001);
static_assert(cm::service_id(cm::port_space::ipoib, 0x1234) == 0x0000000000021234);

TEST(cm_service_id, examples_follow_the_annex_a11_layout) {
  EXPECT_EQ(cm::service_id(cm::port_space::tcp, 7471), 0x0000000001061D2Fu);
  EXPECT_EQ(cm::service_id(cm::port_space::tcp, 0), 0x0000000001060000u);
  EXPECT_EQ(cm::service_id(cm::port_space::udp, 0xFFFF), 0x000000000111FFFFu);
  EXPECT_EQ(cm::service_id(cm::port_space::ib, 18515), 0x00000000013F4853u);
}

TEST(cm_service_id, parse_splits_tcp_udp_and_ib_ids) {
  for (auto ps : {cm::port_space::tcp, cm::port_space::udp, cm::port_space::ib}) {
    for (std::uint16_t port : {std::uint16_t{0}, std::uint16_t{7471}, std::uint16_t{0xFFFF}}) {
      cm::port_space got_ps = cm::port_space::ipoib;
      std::uint16_t got_port = 1;
      ASSERT_TRUE(cm::parse_service_id(cm::service_id(ps, port), got_ps, got_port));
      EXPECT_EQ(got_ps, ps);
      EXPECT_EQ(got_port, port);
    }
  }
}

TEST(cm_service_id, parse_rejects_other_prefixes_and_spaces_bad_flow) {
  const std::uint64_t bad[] = {
      0,
      0x0000000000021D2F,  // IPoIB port space: no annex A11 prefix
      0x0000000002061D2F,  // prefix 0x0000000002
      0x0000000101061D2F,  // a bit above the prefix
      0x8000000001061D2F,
      0x0000000001841D2F,  // protocol 0x84 (SCTP): not an rdma_cm port space
      0x0000000001001D2F,
      0x0000000001061D2F ^ 0x0000000000100000,  // 0x0116
  };
  for (std::uint64_t sid : bad) {
    cm::port_space ps = cm::port_space::ipoib;
    std::uint16_t port = 42;
    EXPECT_FALSE(cm::parse_service_id(sid, ps, port)) << std::hex << sid;
    EXPECT_EQ(ps, cm::port_space::ipoib);
    EXPECT_EQ(port, 42);
  }
}

// ---------------------------------------------------------------------------
// rdma_cm IP header in REQ private data (kernel struct cma_hdr)

TEST(cm_ip_header, ipv4_round_trip_writes_zero_pad_and_decodes_ipv4_mapped) {
  cm::ip_header h;
  h.ip_version = 4;
  h.src_port = 0xC3A9;
  h.src_ip = gid_v4(192, 0, 2, 1);
  h.dst_ip = gid_v4(198, 51, 100, 7);
  std::array<std::byte, cm::ip_header_size> out;
  out.fill(std::byte{0xAA});
  ASSERT_EQ(cm::encode(h, out), cm::ip_header_size);
  // cma_version 0, IP version 4 in bits 7:4, port, then each address as
  // 12 zero bytes and the IPv4 address (struct cma_hdr's ip4 {pad[3], addr}).
  std::vector<std::uint8_t> want{0x00, 0x40, 0xC3, 0xA9};
  want.resize(16);
  want.insert(want.end(), {192, 0, 2, 1});
  want.resize(32);
  want.insert(want.end(), {198, 51, 100, 7});
  ASSERT_EQ(want.size(), cm::ip_header_size);
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(std::to_integer<std::uint8_t>(out[i]), want[i]) << i;

  cm::ip_header back;
  ASSERT_TRUE(cm::decode(out, back));
  EXPECT_EQ(back.ip_version, 4);
  EXPECT_EQ(back.src_port, 0xC3A9);
  EXPECT_EQ(back.src_ip, gid_v4(192, 0, 2, 1));
  EXPECT_EQ(back.dst_ip, gid_v4(198, 51, 100, 7));
}

TEST(cm_ip_header, ipv6_round_trip_copies_the_addresses) {
  cm::ip_header h;
  h.ip_version = 6;
  h.src_port = 1;
  h.src_ip = gid_fd00(0x11);
  h.dst_ip = gid_fd00(0x22);
  std::array<std::byte, 40> out{};
  ASSERT_EQ(cm::encode(h, out), cm::ip_header_size);
  EXPECT_EQ(std::to_integer<std::uint8_t>(out[1]), 0x60);
  EXPECT_EQ(std::memcmp(out.data() + 4, h.src_ip.data(), 16), 0);
  EXPECT_EQ(std::memcmp(out.data() + 20, h.dst_ip.data(), 16), 0);
  cm::ip_header back;
  ASSERT_TRUE(cm::decode(out, back));
  EXPECT_EQ(back.ip_version, 6);
  EXPECT_EQ(back.src_port, 1);
  EXPECT_EQ(back.src_ip, h.src_ip);
  EXPECT_EQ(back.dst_ip, h.dst_ip);
}

TEST(cm_ip_header, decode_ignores_reserved_nibble_and_ipv4_pad) {
  cm::ip_header h;
  h.src_ip = gid_v4(10, 0, 0, 1);
  h.dst_ip = gid_v4(10, 0, 0, 2);
  std::array<std::byte, cm::ip_header_size> out{};
  ASSERT_EQ(cm::encode(h, out), cm::ip_header_size);
  out[1] |= std::byte{0x0F};
  out[4] = out[20] = std::byte{0xFF};
  cm::ip_header back;
  ASSERT_TRUE(cm::decode(out, back));
  EXPECT_EQ(back.ip_version, 4);
  EXPECT_EQ(back.src_ip, gid_v4(10, 0, 0, 1));
  EXPECT_EQ(back.dst_ip, gid_v4(10, 0, 0, 2));
}

TEST(cm_ip_header, decode_refuses_version_1_ip_version_5_and_short_input_bad_flow) {
  cm::ip_header h;
  std::array<std::byte, cm::ip_header_size> good{};
  ASSERT_EQ(cm::encode(h, good), cm::ip_header_size);
  cm::ip_header out;
  out.src_port = 77;

  auto v1 = good;
  v1[0] = std::byte{0x10};  // cma_version 1.0
  EXPECT_FALSE(cm::decode(v1, out));
  v1[0] = std::byte{0x01};  // 0.1
  EXPECT_FALSE(cm::decode(v1, out));

  auto v5 = good;
  v5[1] = std::byte{0x50};
  EXPECT_FALSE(cm::decode(v5, out));
  v5[1] = std::byte{0x00};
  EXPECT_FALSE(cm::decode(v5, out));

  EXPECT_FALSE(cm::decode(std::span(good).first(35), out));
  EXPECT_EQ(out.src_port, 77);  // untouched
}

TEST(cm_ip_header, encode_refuses_short_output_and_unknown_ip_version_bad_flow) {
  cm::ip_header h;
  std::array<std::byte, 35> small{};
  EXPECT_EQ(cm::encode(h, small), 0u);
  std::array<std::byte, cm::ip_header_size> out{};
  h.ip_version = 5;
  EXPECT_EQ(cm::encode(h, out), 0u);
}

TEST(cm_ip_header, fits_in_req_private_data_with_56_user_bytes) {
  static_assert(cm::req_user_private_data == 56);
  cm::req m = sample_req();
  cm::ip_header h;
  h.src_port = 40000;
  h.src_ip = gid_v4(192, 0, 2, 1);
  h.dst_ip = gid_v4(192, 0, 2, 2);
  ASSERT_EQ(cm::encode(h, m.private_data), cm::ip_header_size);
  const cm::req out = round_trip(m);
  cm::ip_header back;
  ASSERT_TRUE(cm::decode(out.private_data, back));
  EXPECT_EQ(back.src_port, 40000);
  EXPECT_EQ(back.dst_ip, h.dst_ip);
  EXPECT_TRUE(std::equal(out.private_data.begin() + 36, out.private_data.end(), m.private_data.begin() + 36));
}

// ---------------------------------------------------------------------------
// Timeouts

TEST(cm_timeout, is_4096_ns_times_two_to_the_t_capped_at_31) {
  using std::chrono::nanoseconds;
  EXPECT_EQ(cm::cm_timeout(0), nanoseconds(4096));
  EXPECT_EQ(cm::cm_timeout(1), nanoseconds(8192));
  EXPECT_EQ(cm::cm_timeout(8), nanoseconds(1048576));       // ~1 ms (cm_convert_to_ms: 1)
  EXPECT_EQ(cm::cm_timeout(16), nanoseconds(268435456));    // CMA_IBOE_PACKET_LIFETIME
  EXPECT_EQ(cm::cm_timeout(20), nanoseconds(4294967296));   // ~4.3 s, CMA_CM_RESPONSE_TIMEOUT
  EXPECT_EQ(cm::cm_timeout(24), nanoseconds(68719476736));  // ~68.7 s, MRA service timeout
  EXPECT_EQ(cm::cm_timeout(31), nanoseconds(8796093022208));
  EXPECT_EQ(cm::cm_timeout(32), cm::cm_timeout(31));
  EXPECT_EQ(cm::cm_timeout(255), cm::cm_timeout(31));
}

// ---------------------------------------------------------------------------
// Cross-check with tshark: RoCEv2 frames carrying our MADs, decoded by
// Wireshark's InfiniBand dissector.

// Builds one Ethernet + IPv4 + UDP + BTH(UD SEND_ONLY) + DETH + MAD + ICRC frame.
std::vector<std::byte> roce_gsi_frame(const mad_bytes& mad, bool forward, std::uint32_t psn) {
  w::ip_udp_params p;
  p.src_gid = forward ? gid_v4(192, 0, 2, 1) : gid_v4(192, 0, 2, 2);
  p.dst_gid = forward ? gid_v4(192, 0, 2, 2) : gid_v4(192, 0, 2, 1);
  p.src_port = forward ? 0xC123 : 0xC456;
  p.hop_limit = 64;

  w::transport_headers h;
  h.bth.opcode = static_cast<std::uint8_t>(w::opcode::ud_send_only);
  h.bth.pkey = w::default_pkey;
  h.bth.dest_qp = cm::gsi_qpn;
  h.bth.psn = psn;
  h.deth.qkey = w::gsi_qkey;
  h.deth.src_qp = cm::gsi_qpn;

  std::vector<std::byte> transport(w::max_header_size);
  transport.resize(w::encode(h, transport));
  EXPECT_EQ(transport.size(), 20u);
  transport.insert(transport.end(), mad.begin(), mad.end());

  std::array<std::byte, 48> ip_udp{};
  const std::size_t ip_len = w::build_ip_udp(p, transport.size() + w::icrc_size, ip_udp);
  EXPECT_EQ(ip_len, 28u);
  const auto ip_span = std::span<const std::byte>(ip_udp).first(ip_len);

  std::vector<std::byte> frame;
  const std::uint8_t eth[14] = {0x02, 0,   0, 0, 0, forward ? std::uint8_t{2} : std::uint8_t{1},
                                0x02, 0,   0, 0, 0, forward ? std::uint8_t{1} : std::uint8_t{2},
                                0x08, 0x00};
  for (std::uint8_t b : eth) frame.push_back(std::byte{b});
  frame.insert(frame.end(), ip_span.begin(), ip_span.end());
  frame.insert(frame.end(), transport.begin(), transport.end());
  std::array<std::byte, 4> icrc{};
  w::store_icrc(w::icrc(ip_span, transport), icrc);
  frame.insert(frame.end(), icrc.begin(), icrc.end());
  return frame;
}

void put_le32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_le16(std::string& s, std::uint16_t v) {
  s.push_back(static_cast<char>(v & 0xFF));
  s.push_back(static_cast<char>(v >> 8));
}

// A classic pcap file: global header (microsecond timestamps, LINKTYPE_ETHERNET).
std::string pcap_file(const std::vector<std::vector<std::byte>>& frames) {
  std::string s;
  put_le32(s, 0xA1B2C3D4);
  put_le16(s, 2);
  put_le16(s, 4);
  put_le32(s, 0);      // thiszone
  put_le32(s, 0);      // sigfigs
  put_le32(s, 65535);  // snaplen
  put_le32(s, 1);      // Ethernet
  std::uint32_t usec = 0;
  for (const auto& f : frames) {
    put_le32(s, 1700000000);
    put_le32(s, usec += 1000);
    put_le32(s, static_cast<std::uint32_t>(f.size()));
    put_le32(s, static_cast<std::uint32_t>(f.size()));
    s.append(reinterpret_cast<const char*>(f.data()), f.size());
  }
  return s;
}

bool tshark_available() { return std::system("command -v tshark >/dev/null 2>&1") == 0; }

struct temp_file {
  std::string path;
  temp_file() {
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/averbs_cm_XXXXXX.pcap";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const int fd = mkstemps(buf.data(), 5);
    if (fd >= 0) {
      ::close(fd);
      path = buf.data();
    }
  }
  ~temp_file() {
    if (!path.empty()) ::unlink(path.c_str());
  }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
};

// Runs a command and returns its standard output, or fails the test.
std::string run(const std::string& cmd) {
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return {};
  }
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = ::pclose(f);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "command failed: " << cmd;
  return out;
}

// The fields asked of tshark, one per column.
const std::vector<std::string> tshark_fields = {
    "frame.number",
    "_ws.malformed",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.mad.baseversion",
    "infiniband.mad.mgmtclass",
    "infiniband.mad.classversion",
    "infiniband.mad.method",
    "infiniband.mad.status",
    "infiniband.mad.classspecific",
    "infiniband.mad.transactionid",
    "infiniband.mad.attributeid",
    "infiniband.mad.attributemodifier",
    // REQ
    "infiniband.cm.req",  // Local Communication ID
    "infiniband.cm.req.serviceid",
    "infiniband.cm.req.serviceid.protocol",
    "infiniband.cm.req.serviceid.dport",
    "infiniband.cm.req.localcaguid",
    "infiniband.cm.req.localqkey",
    "infiniband.cm.req.localqpn",
    "infiniband.cm.req.responderres",
    "infiniband.cm.req.localeecn",
    "infiniband.cm.req.initdepth",
    "infiniband.cm.req.remoteeecn",
    "infiniband.cm.req.remoteresptout",
    "infiniband.cm.req.transpsvctype",
    "infiniband.cm.req.e2eflowctrl",
    "infiniband.cm.req.startpsn",
    "infiniband.cm.req.localresptout",
    "infiniband.cm.req.retrcount",
    "infiniband.cm.req.pkey",
    "infiniband.cm.req.pppmtu",
    "infiniband.cm.req.rdcexist",
    "infiniband.cm.req.rnrretrcount",
    "infiniband.cm.req.maxcmretr",
    "infiniband.cm.req.srq",
    "infiniband.cm.req.ext_transport",
    "infiniband.cm.req.prim_locallid",
    "infiniband.cm.req.prim_remotelid",
    "infiniband.cm.req.prim_localgid_ipv4",
    "infiniband.cm.req.prim_remotegid_ipv4",
    "infiniband.cm.req.prim_tfcclass",
    "infiniband.cm.req.prim_hoplim",
    "infiniband.cm.req.prim_sl",
    "infiniband.cm.req.prim_subnetlocal",
    "infiniband.cm.req.prim_localacktout",
    "infiniband.cm.req.alt_locallid",
    "infiniband.cm.req.alt_remotelid",
    "infiniband.cm.req.alt_localgid",
    "infiniband.cm.req.alt_remotegid",
    "infiniband.cm.req.alt_tfcclass",
    "infiniband.cm.req.alt_hoplim",
    "infiniband.cm.req.alt_sl",
    "infiniband.cm.req.alt_subnetlocal",
    "infiniband.cm.req.alt_localacktout",
    "infiniband.cm.req.ip_cm.majv",
    "infiniband.cm.req.ip_cm.minv",
    "infiniband.cm.req.ip_cm.ipv",
    "infiniband.cm.req.ip_cm.sport",
    "infiniband.cm.req.ip_cm.sip4",
    "infiniband.cm.req.ip_cm.dip4",
    "infiniband.cm.req.ip_cm.private",
    // REP
    "infiniband.cm.rep",  // Local Communication ID
    "infiniband.cm.rep.remotecommid",
    "infiniband.cm.rep.localqkey",
    "infiniband.cm.rep.localqpn",
    "infiniband.cm.rep.localeecn",
    "infiniband.cm.rep.startpsn",
    "infiniband.cm.rep.respres",
    "infiniband.cm.rep.initdepth",
    "infiniband.cm.rep.tgtackdelay",
    "infiniband.cm.rep.failoveracc",
    "infiniband.cm.rep.e2eflowctrl",
    "infiniband.cm.rep.rnrretrcount",
    "infiniband.cm.rep.srq",
    "infiniband.cm.rep.localcaguid",
    "infiniband.cm.rep.private",
    // RTU
    "infiniband.cm.rtu.localcommid",
    "infiniband.cm.rtu.remotecommid",
    "infiniband.cm.rtu.private",
    // REJ
    "infiniband.cm.rej.localcommid",
    "infiniband.cm.rej.remotecommid",
    "infiniband.cm.rej.msgrej",
    "infiniband.cm.rej.rejinfolen",
    "infiniband.cm.rej.reason",
    "infiniband.cm.rej.ari",
    "infiniband.cm.rej.private",
    // DREQ (its remote QPN field is named under "req")
    "infiniband.cm.dreq.localcommid",
    "infiniband.cm.dreq.remotecommid",
    "infiniband.cm.req.remoteqpneecn",
    "infiniband.cm.dreq.private",
    // DREP
    "infiniband.cm.drsp.localcommid",
    "infiniband.cm.drsp.remotecommid",
    "infiniband.cm.drsp.private",
};

using tshark_row = std::map<std::string, std::string>;

std::vector<tshark_row> parse_tshark(const std::string& out) {
  std::vector<tshark_row> rows;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    tshark_row row;
    std::size_t start = 0;
    for (std::size_t i = 0; i < tshark_fields.size(); ++i) {
      const std::size_t tab = line.find('\t', start);
      row[tshark_fields[i]] = line.substr(start, tab == std::string::npos ? std::string::npos : tab - start);
      if (tab == std::string::npos) {
        EXPECT_EQ(i + 1, tshark_fields.size()) << "short tshark line: " << line;
        break;
      }
      start = tab + 1;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// tshark prints integers in decimal or 0x-hex depending on the field's base.
std::uint64_t num(const tshark_row& r, const std::string& field) {
  const auto it = r.find(field);
  if (it == r.end() || it->second.empty()) {
    ADD_FAILURE() << field << " missing";
    return ~std::uint64_t{0};
  }
  return std::stoull(it->second, nullptr, 0);
}

std::string str(const tshark_row& r, const std::string& field) {
  const auto it = r.find(field);
  return it == r.end() ? std::string{} : it->second;
}

// FT_BYTES as tshark prints them (hex digits, separators dropped).
std::string hex_of(const tshark_row& r, const std::string& field) {
  std::string s;
  for (char c : str(r, field)) {
    if (c != ':' && c != ' ') s.push_back(c);
  }
  return s;
}
template <std::size_t N>
std::string hex(const std::array<std::byte, N>& a, std::size_t from = 0) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = from; i < N; ++i) {
    const auto v = std::to_integer<unsigned>(a[i]);
    s.push_back(digits[v >> 4]);
    s.push_back(digits[v & 15]);
  }
  return s;
}

void expect_mad_header(const tshark_row& r, std::uint64_t tid, std::uint16_t attr_id,
                       std::uint32_t attr_mod) {
  EXPECT_EQ(num(r, "infiniband.bth.opcode"), 0x64u);
  EXPECT_EQ(num(r, "infiniband.bth.destqp"), 1u);
  EXPECT_EQ(num(r, "infiniband.deth.q_key"), 0x80010000u);
  EXPECT_EQ(num(r, "infiniband.deth.srcqp"), 1u);
  EXPECT_EQ(num(r, "infiniband.mad.baseversion"), 1u);
  EXPECT_EQ(num(r, "infiniband.mad.mgmtclass"), 0x07u);
  EXPECT_EQ(num(r, "infiniband.mad.classversion"), 2u);
  EXPECT_EQ(num(r, "infiniband.mad.method"), 0x03u);
  EXPECT_EQ(num(r, "infiniband.mad.status"), 0x1234u);
  EXPECT_EQ(num(r, "infiniband.mad.classspecific"), 0x5678u);
  EXPECT_EQ(num(r, "infiniband.mad.transactionid"), tid);
  EXPECT_EQ(num(r, "infiniband.mad.attributeid"), attr_id);
  EXPECT_EQ(num(r, "infiniband.mad.attributemodifier"), attr_mod);
}

TEST(cm_tshark, wireshark_decodes_req_rep_rtu_rej_dreq_drep_as_encoded) {
  if (!tshark_available()) AVERBS_SKIP_FOR_ENVIRONMENT("tshark is not installed (apt-get install tshark)");

  // REQ as rdma_cm sends it over RoCE: IP CM service ID and header.  Bit
  // fields hold distinct non-zero values so a shifted or swapped field shows.
  cm::req q = sample_req();
  q.retry_count = 5;
  q.local_cm_response_timeout = 22;
  q.remote_cm_response_timeout = 20;
  q.transport_type = 1;
  q.path_mtu = 3;
  q.rnr_retry_count = 6;
  q.max_cm_retries = 15;
  q.extended_transport = 2;
  q.primary.sl = 5;
  q.primary.local_ack_timeout = 17;
  q.primary.hop_limit = 64;
  q.alternate.sl = 9;
  q.alternate.subnet_local = true;
  q.alternate.local_ack_timeout = 18;
  cm::ip_header iph;
  iph.src_port = 0xC3A9;
  iph.src_ip = gid_v4(192, 0, 2, 1);
  iph.dst_ip = gid_v4(192, 0, 2, 2);
  ASSERT_EQ(cm::encode(iph, q.private_data), cm::ip_header_size);

  cm::rep p = sample_rep();
  p.target_ack_delay = 19;
  p.failover_accepted = 2;
  p.rnr_retry_count = 5;
  cm::rej j = sample_rej();
  j.message_rejected = cm::msg_ref::rep;
  j.reject_info_length = 16;
  j.reason = static_cast<std::uint16_t>(cm::rej_reason::invalid_service_id);
  const cm::rtu u = sample_rtu();
  const cm::dreq d = sample_dreq();
  const cm::drep e = sample_drep();

  const std::uint64_t tid = 0x0000ABCDC0FFEE01;
  std::vector<std::vector<std::byte>> frames;
  frames.push_back(roce_gsi_frame(encoded(q, header(tid)), true, 1));
  frames.push_back(roce_gsi_frame(encoded(p, header(tid)), false, 2));
  frames.push_back(roce_gsi_frame(encoded(u, header(tid)), true, 3));
  frames.push_back(roce_gsi_frame(encoded(j, header(tid + 1)), false, 4));
  frames.push_back(roce_gsi_frame(encoded(d, header(tid + 2)), true, 5));
  frames.push_back(roce_gsi_frame(encoded(e, header(tid + 2)), false, 6));

  temp_file file;
  ASSERT_FALSE(file.path.empty()) << "mkstemps failed";
  {
    const std::string data = pcap_file(frames);
    FILE* f = std::fopen(file.path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
    ASSERT_EQ(std::fclose(f), 0);
  }

  // roce.md section 4: payload heuristics would claim arbitrary private data.
  std::string cmd = "tshark -n -r '" + file.path + "'";
  for (const char* h : {"rpcrdma_infiniband", "smb_direct_infiniband", "iser_infiniband", "smcr_infiniband",
                        "lnet_ib", "sdp_infiniband", "fc_infiniband", "eth_over_ib", "nvme_rdma"}) {
    cmd += std::string(" --disable-heuristic ") + h;
  }
  cmd += " -T fields -E separator=/t -E occurrence=f";
  for (const auto& f : tshark_fields) cmd += " -e " + f;
  cmd += " 2>/dev/null";
  const std::vector<tshark_row> rows = parse_tshark(run(cmd));
  ASSERT_EQ(rows.size(), frames.size()) << cmd;

  for (const auto& r : rows) {
    EXPECT_EQ(str(r, "_ws.malformed"), "") << "frame " << str(r, "frame.number") << " is malformed";
  }

  {
    SCOPED_TRACE("REQ");
    const tshark_row& r = rows[0];
    expect_mad_header(r, tid, 0x0010, 0x9ABCDEF0);
    EXPECT_EQ(num(r, "infiniband.cm.req"), q.local_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.req.serviceid"), 0x0000000001061D2Fu);
    EXPECT_EQ(num(r, "infiniband.cm.req.serviceid.protocol"), 0x06u);
    EXPECT_EQ(num(r, "infiniband.cm.req.serviceid.dport"), 7471u);
    EXPECT_EQ(num(r, "infiniband.cm.req.localcaguid"), q.local_ca_guid);
    EXPECT_EQ(num(r, "infiniband.cm.req.localqkey"), q.local_qkey);
    EXPECT_EQ(num(r, "infiniband.cm.req.localqpn"), q.local_qpn);
    EXPECT_EQ(num(r, "infiniband.cm.req.responderres"), q.responder_resources);
    EXPECT_EQ(num(r, "infiniband.cm.req.localeecn"), q.local_eecn);
    EXPECT_EQ(num(r, "infiniband.cm.req.initdepth"), q.initiator_depth);
    EXPECT_EQ(num(r, "infiniband.cm.req.remoteeecn"), q.remote_eecn);
    EXPECT_EQ(num(r, "infiniband.cm.req.remoteresptout"), 20u);
    EXPECT_EQ(num(r, "infiniband.cm.req.transpsvctype"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.req.e2eflowctrl"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.req.startpsn"), q.starting_psn);
    EXPECT_EQ(num(r, "infiniband.cm.req.localresptout"), 22u);
    EXPECT_EQ(num(r, "infiniband.cm.req.retrcount"), 5u);
    EXPECT_EQ(num(r, "infiniband.cm.req.pkey"), q.pkey);
    EXPECT_EQ(num(r, "infiniband.cm.req.pppmtu"), 3u);
    EXPECT_EQ(num(r, "infiniband.cm.req.rdcexist"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.req.rnrretrcount"), 6u);
    EXPECT_EQ(num(r, "infiniband.cm.req.maxcmretr"), 15u);
    EXPECT_EQ(num(r, "infiniband.cm.req.srq"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.req.ext_transport"), 2u);
    EXPECT_EQ(num(r, "infiniband.cm.req.prim_locallid"), q.primary.local_lid);
    EXPECT_EQ(num(r, "infiniband.cm.req.prim_remotelid"), q.primary.remote_lid);
    // An IPv4 frame makes Wireshark show the GIDs' last four bytes as IPv4.
    EXPECT_EQ(str(r, "infiniband.cm.req.prim_localgid_ipv4"), "192.0.2.1");
    EXPECT_EQ(str(r, "infiniband.cm.req.prim_remotegid_ipv4"), "192.0.2.2");
    EXPECT_EQ(num(r, "infiniband.cm.req.prim_tfcclass"), q.primary.traffic_class);
    EXPECT_EQ(num(r, "infiniband.cm.req.prim_hoplim"), 64u);
    EXPECT_EQ(num(r, "infiniband.cm.req.prim_sl"), 5u);
    EXPECT_EQ(num(r, "infiniband.cm.req.prim_subnetlocal"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.req.prim_localacktout"), 17u);
    EXPECT_EQ(num(r, "infiniband.cm.req.alt_locallid"), q.alternate.local_lid);
    EXPECT_EQ(num(r, "infiniband.cm.req.alt_remotelid"), q.alternate.remote_lid);
    EXPECT_EQ(hex_of(r, "infiniband.cm.req.alt_localgid"), hex(q.alternate.local_gid));
    EXPECT_EQ(hex_of(r, "infiniband.cm.req.alt_remotegid"), hex(q.alternate.remote_gid));
    EXPECT_EQ(num(r, "infiniband.cm.req.alt_tfcclass"), q.alternate.traffic_class);
    EXPECT_EQ(num(r, "infiniband.cm.req.alt_hoplim"), q.alternate.hop_limit);
    EXPECT_EQ(num(r, "infiniband.cm.req.alt_sl"), 9u);
    EXPECT_EQ(num(r, "infiniband.cm.req.alt_subnetlocal"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.req.alt_localacktout"), 18u);
    // Flow labels and packet rates are not asserted: Wireshark 4.0 reads the
    // 32-bit word as 3 bytes (roce.md section 4); cm_layout checks them by hex.
    EXPECT_EQ(num(r, "infiniband.cm.req.ip_cm.majv"), 0u);
    EXPECT_EQ(num(r, "infiniband.cm.req.ip_cm.minv"), 0u);
    EXPECT_EQ(num(r, "infiniband.cm.req.ip_cm.ipv"), 4u);
    EXPECT_EQ(num(r, "infiniband.cm.req.ip_cm.sport"), 0xC3A9u);
    EXPECT_EQ(str(r, "infiniband.cm.req.ip_cm.sip4"), "192.0.2.1");
    EXPECT_EQ(str(r, "infiniband.cm.req.ip_cm.dip4"), "192.0.2.2");
    EXPECT_EQ(hex_of(r, "infiniband.cm.req.ip_cm.private"), hex(q.private_data, cm::ip_header_size));
  }
  {
    SCOPED_TRACE("REP");
    const tshark_row& r = rows[1];
    expect_mad_header(r, tid, 0x0013, 0x9ABCDEF0);
    EXPECT_EQ(num(r, "infiniband.cm.rep"), p.local_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.rep.remotecommid"), p.remote_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.rep.localqkey"), p.local_qkey);
    EXPECT_EQ(num(r, "infiniband.cm.rep.localqpn"), p.local_qpn);
    EXPECT_EQ(num(r, "infiniband.cm.rep.localeecn"), p.local_eecn);
    EXPECT_EQ(num(r, "infiniband.cm.rep.startpsn"), p.starting_psn);
    EXPECT_EQ(num(r, "infiniband.cm.rep.respres"), p.responder_resources);
    EXPECT_EQ(num(r, "infiniband.cm.rep.initdepth"), p.initiator_depth);
    EXPECT_EQ(num(r, "infiniband.cm.rep.tgtackdelay"), 19u);
    EXPECT_EQ(num(r, "infiniband.cm.rep.failoveracc"), 2u);
    EXPECT_EQ(num(r, "infiniband.cm.rep.e2eflowctrl"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.rep.rnrretrcount"), 5u);
    EXPECT_EQ(num(r, "infiniband.cm.rep.srq"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.rep.localcaguid"), p.local_ca_guid);
    EXPECT_EQ(hex_of(r, "infiniband.cm.rep.private"), hex(p.private_data));
  }
  {
    SCOPED_TRACE("RTU");
    const tshark_row& r = rows[2];
    expect_mad_header(r, tid, 0x0014, 0x9ABCDEF0);
    EXPECT_EQ(num(r, "infiniband.cm.rtu.localcommid"), u.local_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.rtu.remotecommid"), u.remote_comm_id);
    EXPECT_EQ(hex_of(r, "infiniband.cm.rtu.private"), hex(u.private_data));
  }
  {
    SCOPED_TRACE("REJ");
    const tshark_row& r = rows[3];
    expect_mad_header(r, tid + 1, 0x0012, 0x9ABCDEF0);
    EXPECT_EQ(num(r, "infiniband.cm.rej.localcommid"), j.local_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.rej.remotecommid"), j.remote_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.rej.msgrej"), 1u);
    EXPECT_EQ(num(r, "infiniband.cm.rej.rejinfolen"), 16u);
    EXPECT_EQ(num(r, "infiniband.cm.rej.reason"), 8u);
    EXPECT_EQ(hex_of(r, "infiniband.cm.rej.ari"), hex(j.ari));
    EXPECT_EQ(hex_of(r, "infiniband.cm.rej.private"), hex(j.private_data));
  }
  {
    SCOPED_TRACE("DREQ");
    const tshark_row& r = rows[4];
    expect_mad_header(r, tid + 2, 0x0015, 0x9ABCDEF0);
    EXPECT_EQ(num(r, "infiniband.cm.dreq.localcommid"), d.local_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.dreq.remotecommid"), d.remote_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.req.remoteqpneecn"), d.remote_qpn);
    EXPECT_EQ(hex_of(r, "infiniband.cm.dreq.private"), hex(d.private_data));
  }
  {
    SCOPED_TRACE("DREP");
    const tshark_row& r = rows[5];
    expect_mad_header(r, tid + 2, 0x0016, 0x9ABCDEF0);
    EXPECT_EQ(num(r, "infiniband.cm.drsp.localcommid"), e.local_comm_id);
    EXPECT_EQ(num(r, "infiniband.cm.drsp.remotecommid"), e.remote_comm_id);
    EXPECT_EQ(hex_of(r, "infiniband.cm.drsp.private"), hex(e.private_data));
  }
}

}  // namespace
