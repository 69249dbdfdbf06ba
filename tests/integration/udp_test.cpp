// SPDX-License-Identifier: MIT
// RoCEv2 over real UDP sockets between two devices of one process.
#include "udp_pair.hpp"

namespace averbs::test {
namespace {

using udp = udp_pair_test;

TEST_F(udp, rc_send_write_read_over_udp) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 1 << 20);
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 7);
  sge g{reinterpret_cast<std::uintptr_t>(b.buf.data()), 1 << 20, b.m.lkey()};
  recv_wr r;
  r.sg_list = &g;
  r.num_sge = 1;
  ASSERT_FALSE(b.q.post_recv(r));
  sge s{reinterpret_cast<std::uintptr_t>(a.buf.data()), 100000, a.m.lkey()};
  send_wr w;
  w.opcode = wr_opcode::send;
  w.sg_list = &s;
  w.num_sge = 1;
  w.flags = send_signaled;
  ASSERT_FALSE(a.q.post_send(w));
  auto wa = poll(a.c, 1);
  auto wb = poll(b.c, 1);
  ASSERT_EQ(wa.size(), 1u);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wa[0].status, wc_status::success);
  EXPECT_EQ(wb[0].status, wc_status::success);
  EXPECT_EQ(wb[0].byte_len, 100000u);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), 100000), 0);
  EXPECT_GT(a.dev.counters().packets_sent, 90u);
  EXPECT_EQ(b.dev.counters().icrc_errors, 0u);
}

}  // namespace
}  // namespace averbs::test
