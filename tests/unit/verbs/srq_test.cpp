// SPDX-License-Identifier: MIT
// Shared receive queues (rdma-core tests/test_srq.py; IBTA 10.2.9, 11.2.3):
// traffic through an SRQ shared by two QPs, the limit event, resize, the
// post and destroy errors, and the last-WQE event.
#include "verbs_fixture.hpp"

namespace averbs::test {
namespace {

using namespace std::chrono_literals;

class srq_test : public conformance_test {
 protected:
  srq make_srq(std::uint32_t max_wr, std::uint32_t max_sge = 1, std::uint32_t limit = 0) {
    return pd_.create_srq({max_wr, max_sge, limit});
  }
  /// Posts `n` receives (wr_id first, first + 1, ...) of `len` bytes each at
  /// consecutive offsets of `b`.
  static void post_srq_recvs(const srq& s, const buffer& b, std::uint64_t first, std::size_t n, std::size_t len) {
    for (std::size_t i = 0; i < n; ++i) {
      const sge g = b.part(i * len, len);
      recv_wr r;
      r.wr_id = first + i;
      r.sg_list = &g;
      r.num_sge = 1;
      ASSERT_FALSE(s.post_recv(r)) << i;
    }
  }
  /// One SEND of `len` bytes from `src` on `q`, completed on `c`.
  void send_and_complete(const qp& q, const cq& c, const buffer& src, std::size_t len, std::uint64_t wr_id) {
    ASSERT_FALSE(post_send(q, wr_opcode::send, {src.part(0, len)}, wr_id));
    EXPECT_TRUE(wc_ok(poll_one(c), wr_id, wc_opcode::send));
  }
};

TEST_F(srq_test, two_qps_sharing_an_srq_consume_its_receives_in_order) {
  srq s = make_srq(16);
  qp_options o;
  auto p1 = connect(o, o, 256, 256, s);
  auto p2 = connect(o, o, 256, 256, s);
  auto src = make_buffer(256), dst = make_buffer(4 * 256);
  fill_pattern(src, 1);
  dst.fill(0);
  post_srq_recvs(s, dst, 100, 4, 256);
  send_and_complete(p1.a, p1.cq_a, src, 10, 1);
  send_and_complete(p2.a, p2.cq_a, src, 20, 2);
  send_and_complete(p2.a, p2.cq_a, src, 30, 3);
  send_and_complete(p1.a, p1.cq_a, src, 40, 4);
  const auto r1 = poll(p1.cq_b, 2);
  const auto r2 = poll(p2.cq_b, 2);
  ASSERT_EQ(r1.size(), 2u);
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_TRUE(wc_ok(r1[0], 100, wc_opcode::recv));
  EXPECT_EQ(r1[0].byte_len, 10u);
  EXPECT_EQ(r1[0].qp_num, p1.b.num());
  EXPECT_TRUE(wc_ok(r2[0], 101, wc_opcode::recv));
  EXPECT_EQ(r2[0].byte_len, 20u);
  EXPECT_EQ(r2[0].qp_num, p2.b.num());
  EXPECT_TRUE(wc_ok(r2[1], 102, wc_opcode::recv));
  EXPECT_EQ(r2[1].byte_len, 30u);
  EXPECT_TRUE(wc_ok(r1[1], 103, wc_opcode::recv));
  EXPECT_EQ(r1[1].byte_len, 40u);
  EXPECT_TRUE(has_pattern(dst, 1, 0, 10));
  EXPECT_TRUE(has_pattern(dst, 1, 256, 20));
  EXPECT_TRUE(has_pattern(dst, 1, 512, 30));
  EXPECT_TRUE(has_pattern(dst, 1, 768, 40));
}

TEST_F(srq_test, limit_event_fires_once_when_fewer_than_the_limit_remain) {
  srq s = make_srq(16);
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  auto src = make_buffer(8), dst = make_buffer(10 * 8);
  post_srq_recvs(s, dst, 1, 10, 8);
  s.modify({0, 0, 7}, static_cast<std::uint32_t>(srq_attr_mask::limit));
  EXPECT_EQ(s.query().srq_limit, 7u);
  for (std::uint64_t i = 1; i <= 3; ++i) send_and_complete(p.a, p.cq_a, src, 8, i);
  EXPECT_EQ(count_events(event_type::srq_limit_reached), 0u) << "7 receives left: not below the limit";
  send_and_complete(p.a, p.cq_a, src, 8, 4);  // 6 left
  EXPECT_EQ(count_events(event_type::srq_limit_reached), 1u);
  EXPECT_EQ(s.query().srq_limit, 0u) << "the limit disarms when it fires";
  send_and_complete(p.a, p.cq_a, src, 8, 5);
  EXPECT_EQ(count_events(event_type::srq_limit_reached), 1u);
  EXPECT_EQ(poll(p.cq_b, 5).size(), 5u);
}

TEST_F(srq_test, limit_armed_at_create_fires_too) {
  srq s = make_srq(8, 1, 2);
  EXPECT_EQ(s.query().srq_limit, 2u);
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  auto src = make_buffer(8), dst = make_buffer(3 * 8);
  post_srq_recvs(s, dst, 1, 3, 8);
  EXPECT_EQ(count_events(event_type::srq_limit_reached), 0u);
  send_and_complete(p.a, p.cq_a, src, 8, 1);
  EXPECT_EQ(count_events(event_type::srq_limit_reached), 0u);
  send_and_complete(p.a, p.cq_a, src, 8, 2);
  EXPECT_EQ(count_events(event_type::srq_limit_reached), 1u);
}

TEST_F(srq_test, limit_above_max_wr_bad_flow) {
  srq s = make_srq(8);
  std::error_code ec;
  s.modify({0, 0, 9}, static_cast<std::uint32_t>(srq_attr_mask::limit), ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_EQ(s.query().srq_limit, 0u);
}

// ibv_create_srq(3) calls srq_limit "irrelevant" at creation and rxe does
// not check it there: a limit above max_wr is taken as it is.
TEST_F(srq_test, a_limit_above_max_wr_at_create_is_accepted) {
  std::error_code ec;
  srq s = pd_.create_srq({8, 1, 9}, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(s.query().max_wr, 8u);
}

TEST_F(srq_test, modify_with_an_unknown_mask_bad_flow) {
  srq s = make_srq(8);
  std::error_code ec;
  s.modify({16, 0, 1}, 4, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
}

// ibv_modify_srq(3): the mask is "either 0 or" a set of bits; 0 changes
// nothing (rxe).
TEST_F(srq_test, modify_with_mask_0_changes_nothing) {
  srq s = make_srq(8);
  std::error_code ec;
  s.modify({16, 0, 1}, 0, ec);
  EXPECT_FALSE(ec) << ec.message();
  const srq_attr a = s.query();
  EXPECT_EQ(a.max_wr, 8u);
  EXPECT_EQ(a.srq_limit, 0u);
}

TEST_F(srq_test, resize_bigger_holds_at_least_the_requested_receives) {
  srq s = make_srq(4);
  auto dst = make_buffer(64 * 8);
  post_srq_recvs(s, dst, 1, 4, 8);
  s.modify({64, 0, 0}, static_cast<std::uint32_t>(srq_attr_mask::max_wr));
  EXPECT_GE(s.query().max_wr, 64u);
  post_srq_recvs(s, dst, 5, 60, 8);  // 64 posted in all
  // The receives posted before the resize are still first in line.
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  auto src = make_buffer(8);
  send_and_complete(p.a, p.cq_a, src, 8, 1);
  EXPECT_TRUE(wc_ok(poll_one(p.cq_b), 1, wc_opcode::recv));
}

TEST_F(srq_test, shrink_below_the_posted_receives_bad_flow) {
  srq s = make_srq(16);
  auto dst = make_buffer(6 * 8);
  post_srq_recvs(s, dst, 1, 6, 8);
  std::error_code ec;
  s.modify({5, 0, 0}, static_cast<std::uint32_t>(srq_attr_mask::max_wr), ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_GE(s.query().max_wr, 16u);
}

TEST_F(srq_test, posting_more_than_max_wr_is_queue_full) {
  srq s = make_srq(4);
  auto dst = make_buffer(5 * 8);
  std::vector<sge> g;
  for (std::size_t i = 0; i < 5; ++i) g.push_back(dst.part(i * 8, 8));
  std::vector<recv_wr> wrs(5);
  for (std::size_t i = 0; i < 5; ++i) wrs[i] = {i + 1, &g[i], 1};
  std::size_t bad = 99;
  EXPECT_EQ(s.post_recv(wrs, &bad), make_error_code(errc::queue_full));
  EXPECT_EQ(bad, 4u);
}

TEST_F(srq_test, a_receive_longer_than_the_largest_message_bad_flow) {
  srq s = make_srq(4, 2);
  auto dst = make_buffer(16);
  const std::array<sge, 2> g{sge{dst.addr(), 0x80000000u, dst.m.lkey()}, sge{dst.addr(), 1, dst.m.lkey()}};
  const recv_wr w{1, g.data(), 2};
  std::size_t bad = 99;
  EXPECT_EQ(s.post_recv({&w, 1}, &bad), make_error_code(errc::message_too_long));
  EXPECT_EQ(bad, 0u);
}

TEST_F(srq_test, too_many_sges_bad_flow) {
  srq s = make_srq(4, 2);
  auto dst = make_buffer(24);
  const std::vector<sge> g{dst.part(0, 8), dst.part(8, 8), dst.part(16, 8)};
  recv_wr r{1, g.data(), 3};
  std::size_t bad = 99;
  EXPECT_EQ(s.post_recv({&r, 1}, &bad), make_error_code(errc::invalid_argument));
  EXPECT_EQ(bad, 0u);
}

TEST_F(srq_test, create_with_bad_sizes_bad_flow) {
  const auto attr = dev.query();
  std::error_code ec;
  pd_.create_srq({0, 1, 0}, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  pd_.create_srq({attr.max_srq_wr + 1, 1, 0}, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  pd_.create_srq({8, attr.max_srq_sge + 1, 0}, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
}

TEST_F(srq_test, destroy_while_a_qp_uses_it_bad_flow) {
  srq s = make_srq(4);
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  std::error_code ec;
  s.destroy(ec);
  EXPECT_EQ(ec, make_error_code(errc::busy));
  p.b.destroy();
  s.destroy(ec);
  EXPECT_FALSE(ec) << ec.message();
  // Destroyed, it refuses a post as a whole and says the first was not posted.
  auto dst = make_buffer(8);
  const sge g = dst.whole();
  const std::array<recv_wr, 2> wrs{recv_wr{1, &g, 1}, recv_wr{2, &g, 1}};
  std::size_t bad = 99;
  EXPECT_EQ(s.post_recv(wrs, &bad), make_error_code(errc::stale_handle));
  EXPECT_EQ(bad, 0u);
}

// A destroyed QP's completions leave its CQs, but not those of receives
// the SRQ gave it: those requests were the SRQ's, and their buffers would
// be lost without them.
TEST_F(srq_test, a_destroyed_qp_leaves_its_srq_receive_completions_in_the_cq) {
  srq s = make_srq(4);
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  auto src = make_buffer(256), dst = make_buffer(256);
  fill_pattern(src, 1);
  post_srq_recvs(s, dst, 100, 1, 256);
  send_and_complete(p.a, p.cq_a, src, 10, 1);
  ctx->poll();
  p.b.destroy();
  const auto r = poll(p.cq_b, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_ok(r[0], 100, wc_opcode::recv));
  EXPECT_EQ(r[0].byte_len, 10u);
}

TEST_F(srq_test, post_recv_on_a_qp_with_an_srq_bad_flow) {
  srq s = make_srq(4);
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  auto dst = make_buffer(8);
  EXPECT_EQ(post_recv(p.b, {dst.whole()}, 1), make_error_code(errc::invalid_argument));
}

TEST_F(srq_test, qp_with_an_srq_entering_err_raises_last_wqe_reached) {
  srq s = make_srq(4);
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  EXPECT_EQ(count_events(event_type::qp_last_wqe_reached), 0u);
  qp_attr e;
  e.state = qp_state::err;
  p.b.modify(e, qp_attr_state);
  EXPECT_EQ(count_events(event_type::qp_last_wqe_reached, p.b.num()), 1u);
  EXPECT_EQ(count_events(event_type::qp_last_wqe_reached), 1u);
}

TEST_F(srq_test, srq_receives_survive_a_qp_entering_err) {
  srq s = make_srq(8);
  qp_options o;
  auto p1 = connect(o, o, 256, 256, s);
  auto p2 = connect(o, o, 256, 256, s);
  auto src = make_buffer(8), dst = make_buffer(2 * 8);
  post_srq_recvs(s, dst, 1, 2, 8);
  qp_attr e;
  e.state = qp_state::err;
  p1.b.modify(e, qp_attr_state);
  EXPECT_TRUE(drain(p1.cq_b).empty()) << "the SRQ's receives were flushed through one of its QPs";
  send_and_complete(p2.a, p2.cq_a, src, 8, 1);
  EXPECT_TRUE(wc_ok(poll_one(p2.cq_b), 1, wc_opcode::recv));
}

TEST_F(srq_test, srq_receive_smaller_than_the_send_is_loc_len_err) {
  srq s = make_srq(4);
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  auto src = make_buffer(64), dst = make_buffer(32);
  post_srq_recvs(s, dst, 7, 1, 32);
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 1));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 7, wc_status::loc_len_err));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 1, wc_status::rem_inv_req_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

// A receive of an SRQ that a UD datagram does not fit completes in error
// (class E); when its CQ cannot take that completion the QP moves to ERR
// (rxe: CQ overflow is class G), instead of running on with it lost.
TEST_F(srq_test, a_ud_receive_error_its_full_cq_cannot_take_moves_the_qp_to_err) {
  srq s = make_srq(4);
  qp_options o;
  o.type = qp_type::ud;
  auto p = connect(o, o, 256, 1, s);
  auto h = make_ah();
  auto src = make_buffer(64), dst = make_buffer(2 * 56);
  post_srq_recvs(s, dst, 9, 2, 56);
  ASSERT_FALSE(post_ud(p.a, h, p.b.num(), ud_qkey, {src.part(0, 16)}, 1));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 1, wc_opcode::send));
  // The receiver's one-entry CQ is full now; 64 bytes do not fit a
  // 56-byte receive behind the 40-byte GRH area.
  ASSERT_FALSE(post_ud(p.a, h, p.b.num(), ud_qkey, {src.whole()}, 2));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 2, wc_opcode::send));
  for (int i = 0; i < 10 && query_state(p.b) != qp_state::err; ++i) ctx->poll();
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(srq_test, ud_qp_receives_through_an_srq) {
  srq s = make_srq(4);
  qp_options o;
  o.type = qp_type::ud;
  auto p = connect(o, o, 256, 256, s);
  auto h = make_ah();
  auto src = make_buffer(16), dst = make_buffer(40 + 16);
  fill_pattern(src, 3);
  post_srq_recvs(s, dst, 9, 1, 56);
  ASSERT_FALSE(post_ud(p.a, h, p.b.num(), ud_qkey, {src.whole()}, 1));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 1, wc_opcode::send));
  const auto r = poll_one(p.cq_b);
  EXPECT_TRUE(wc_ok(r, 9, wc_opcode::recv));
  EXPECT_EQ(r.byte_len, 56u);
  EXPECT_EQ(r.src_qp, p.a.num());
  EXPECT_TRUE(has_pattern(dst, 3, 40, 16));
}

}  // namespace
}  // namespace averbs::test
