// SPDX-License-Identifier: MIT
#include "verbs_fixture.hpp"

namespace averbs::test {
namespace {

using smoke = verbs_test;

TEST_F(smoke, rc_send_recv_loopback) {
  auto p = connected_pair();
  auto src = make_buffer(64), dst = make_buffer(64);
  src.fill('c');
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 7));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 5));
  auto s = poll_one(p.cq_a);
  EXPECT_EQ(s.status, wc_status::success);
  EXPECT_EQ(s.wr_id, 5u);
  EXPECT_EQ(s.opcode, wc_opcode::send);
  auto r = poll_one(p.cq_b);
  EXPECT_EQ(r.status, wc_status::success);
  EXPECT_EQ(r.wr_id, 7u);
  EXPECT_EQ(r.opcode, wc_opcode::recv);
  EXPECT_EQ(r.byte_len, 64u);
  EXPECT_TRUE(dst.all('c'));
}

TEST_F(smoke, rc_write_read_atomic) {
  auto p = connected_pair();
  auto local = make_buffer(8192), remote = make_buffer(8192);
  local.fill('w');
  remote.fill(0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 1, send_signaled, remote.addr(), remote.m.rkey()));
  EXPECT_EQ(poll_one(p.cq_a).status, wc_status::success);
  EXPECT_TRUE(remote.all('w'));
  remote.fill('r');
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 2, send_signaled, remote.addr(), remote.m.rkey()));
  auto wc = poll_one(p.cq_a);
  EXPECT_EQ(wc.status, wc_status::success);
  EXPECT_EQ(wc.opcode, wc_opcode::rdma_read);
  EXPECT_TRUE(local.all('r'));
  std::uint64_t v = 40;
  std::memcpy(remote.bytes.data(), &v, 8);
  send_wr wr;
  sge g = local.part(0, 8);
  wr.wr_id = 3;
  wr.opcode = wr_opcode::atomic_fetch_and_add;
  wr.sg_list = &g;
  wr.num_sge = 1;
  wr.flags = send_signaled;
  wr.remote_addr = remote.addr();
  wr.rkey = remote.m.rkey();
  wr.compare_add = 2;
  ASSERT_FALSE(p.a.post_send(wr));
  EXPECT_EQ(poll_one(p.cq_a).status, wc_status::success);
  std::uint64_t got, now;
  std::memcpy(&got, local.bytes.data(), 8);
  std::memcpy(&now, remote.bytes.data(), 8);
  EXPECT_EQ(got, 40u);
  EXPECT_EQ(now, 42u);
}

}  // namespace
}  // namespace averbs::test
