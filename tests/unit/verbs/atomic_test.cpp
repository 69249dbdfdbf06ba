// SPDX-License-Identifier: MIT
// Atomic operations (rdma-core tests/test_atomic.py; IBTA 9.4.5, 10.8.3):
// compare-and-swap and fetch-and-add results, the access, alignment and
// key errors, and several atomics outstanding.
#include "verbs_fixture.hpp"

#include <cstring>
#include <limits>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;

class atomic_test : public conformance_test {
 protected:
  static std::uint64_t load(const buffer& b, std::size_t off = 0) {
    std::uint64_t v;
    std::memcpy(&v, b.bytes.data() + off, 8);
    return v;
  }
  static void store(buffer& b, std::uint64_t v, std::size_t off = 0) { std::memcpy(b.bytes.data() + off, &v, 8); }

  /// Posts one atomic from `p.a`: the old value lands in [off, off + 8) of
  /// `result`.
  std::error_code post_atomic(const pair& p, wr_opcode op, const buffer& result, std::size_t off,
                              std::uint64_t raddr, std::uint32_t rkey, std::uint64_t compare_add,
                              std::uint64_t swap, std::uint64_t wr_id, std::uint32_t length = 8) {
    const std::vector<sge> sg{result.part(off, length)};
    send_wr w = make_wr(op, sg, wr_id, send_signaled, raddr, rkey);
    w.compare_add = compare_add;
    w.swap = swap;
    return p.a.post_send(w);
  }
};

#define EXPECT_REMOTE_ERROR(p, wr_id, status)                     \
  do {                                                            \
    EXPECT_TRUE(wc_is(poll_one((p).cq_a), (wr_id), (status)));    \
    EXPECT_EQ(query_state((p).a), qp_state::err);                 \
    EXPECT_EQ(query_state((p).b), qp_state::err);                 \
  } while (0)

TEST_F(atomic_test, cas_with_a_matching_compare_swaps_and_returns_the_old_value) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(16);
  store(remote, 0x1111111111111111ull);
  store(remote, 0x7777777777777777ull, 8);
  store(local, 0);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_cmp_and_swp, local, 0, remote.addr(), remote.m.rkey(),
                           0x1111111111111111ull, 0x2222222222222222ull, 1));
  const auto wc = poll_one(p.cq_a);
  EXPECT_TRUE(wc_ok(wc, 1, wc_opcode::comp_swap));
  EXPECT_EQ(wc.byte_len, 8u);
  EXPECT_EQ(load(local), 0x1111111111111111ull);
  EXPECT_EQ(load(remote), 0x2222222222222222ull);
  EXPECT_EQ(load(remote, 8), 0x7777777777777777ull) << "the neighbouring word changed";
}

TEST_F(atomic_test, cas_with_a_mismatching_compare_returns_the_old_value_and_leaves_memory) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 5);
  store(local, 0xFFFF);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_cmp_and_swp, local, 0, remote.addr(), remote.m.rkey(), 6, 9, 2));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 2, wc_opcode::comp_swap));
  EXPECT_EQ(load(local), 5u);
  EXPECT_EQ(load(remote), 5u);
}

TEST_F(atomic_test, fetch_and_add_adds_and_returns_the_old_value) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 1000);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), remote.m.rkey(), 234, 0, 3));
  const auto wc = poll_one(p.cq_a);
  EXPECT_TRUE(wc_ok(wc, 3, wc_opcode::fetch_add));
  EXPECT_EQ(wc.byte_len, 8u);
  EXPECT_EQ(load(local), 1000u);
  EXPECT_EQ(load(remote), 1234u);
}

TEST_F(atomic_test, fetch_and_add_wraps_around_modulo_2_to_the_64) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8);
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  store(remote, max - 1);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), remote.m.rkey(), 3, 0, 4));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 4, wc_opcode::fetch_add));
  EXPECT_EQ(load(local), max - 1);
  EXPECT_EQ(load(remote), 1u);
}

TEST_F(atomic_test, atomics_at_the_last_aligned_word_of_a_region_succeed) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(64);
  store(remote, 40, 56);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr() + 56, remote.m.rkey(), 2, 0,
                           5));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 5, wc_opcode::fetch_add));
  EXPECT_EQ(load(remote, 56), 42u);
}

TEST_F(atomic_test, atomic_beyond_the_region_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(64);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr() + 64, remote.m.rkey(), 2, 0,
                           6));
  EXPECT_REMOTE_ERROR(p, 6, wc_status::rem_access_err);
}

TEST_F(atomic_test, responder_qp_without_remote_atomic_is_rem_inv_req_err) {
  qp_options ob;
  ob.access = access_local_write | access_remote_write | access_remote_read;
  auto p = connect(qp_options{}, ob);
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 10);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), remote.m.rkey(), 1, 0, 7));
  EXPECT_REMOTE_ERROR(p, 7, wc_status::rem_inv_req_err);
  EXPECT_EQ(load(remote), 10u);
}

TEST_F(atomic_test, region_without_remote_atomic_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8, access_local_write | access_remote_write | access_remote_read);
  store(remote, 10);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_cmp_and_swp, local, 0, remote.addr(), remote.m.rkey(), 10, 11, 8));
  EXPECT_REMOTE_ERROR(p, 8, wc_status::rem_access_err);
  EXPECT_EQ(load(remote), 10u);
}

TEST_F(atomic_test, misaligned_remote_address_bad_flow) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  EXPECT_EQ(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr() + 1, remote.m.rkey(), 1, 0, 9),
            make_error_code(errc::invalid_argument));
  EXPECT_EQ(post_atomic(p, wr_opcode::atomic_cmp_and_swp, local, 0, remote.addr() + 4, remote.m.rkey(), 1, 0, 9),
            make_error_code(errc::invalid_argument));
  EXPECT_TRUE(drain(p.cq_a).empty());
  EXPECT_EQ(query_state(p.a), qp_state::rts);
}

TEST_F(atomic_test, atomic_length_other_than_8_bad_flow) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  for (std::uint32_t len : {0u, 4u, 9u, 16u}) {
    EXPECT_EQ(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), remote.m.rkey(), 1, 0, 10,
                          len),
              make_error_code(errc::invalid_argument))
        << len;
  }
}

TEST_F(atomic_test, inline_atomic_bad_flow) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8);
  const std::vector<sge> sg{local.whole()};
  send_wr w = make_wr(wr_opcode::atomic_fetch_and_add, sg, 11, send_signaled | send_inline, remote.addr(),
                      remote.m.rkey());
  EXPECT_EQ(p.a.post_send(w), make_error_code(errc::invalid_argument));
}

TEST_F(atomic_test, wrong_rkey_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 3);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), inc_rkey(remote.m.rkey()),
                           1, 0, 12));
  EXPECT_REMOTE_ERROR(p, 12, wc_status::rem_access_err);
  EXPECT_EQ(load(remote), 3u);
}

TEST_F(atomic_test, bad_local_lkey_for_the_result_is_loc_prot_err) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8);
  const std::vector<sge> sg{{local.addr(), 8, inc_rkey(local.m.lkey())}};
  send_wr w = make_wr(wr_opcode::atomic_fetch_and_add, sg, 13, send_signaled, remote.addr(), remote.m.rkey());
  w.compare_add = 1;
  ASSERT_FALSE(p.a.post_send(w));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 13, wc_status::loc_prot_err));
  EXPECT_EQ(query_state(p.a), qp_state::err);
}

TEST_F(atomic_test, result_region_without_local_write_is_loc_prot_err) {
  auto p = connected_pair();
  auto local = make_buffer(8, access_remote_read), remote = make_buffer(8);
  store(local, 77);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), remote.m.rkey(), 1, 0, 14));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 14, wc_status::loc_prot_err));
  EXPECT_EQ(load(local), 77u);
}

TEST_F(atomic_test, responder_max_dest_rd_atomic_0_is_rem_inv_req_err) {
  qp_options ob;
  ob.max_dest_rd_atomic = 0;
  auto p = connect(qp_options{}, ob);
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 1);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_cmp_and_swp, local, 0, remote.addr(), remote.m.rkey(), 1, 2, 15));
  EXPECT_REMOTE_ERROR(p, 15, wc_status::rem_inv_req_err);
  EXPECT_EQ(load(remote), 1u);
}

TEST_F(atomic_test, uc_refuses_atomics_bad_flow) {
  qp_options o;
  o.type = qp_type::uc;
  auto p = connected_pair(o);
  auto local = make_buffer(8), remote = make_buffer(8);
  EXPECT_EQ(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), remote.m.rkey(), 1, 0, 16),
            make_error_code(errc::invalid_argument));
}

TEST_F(atomic_test, eight_atomics_outstanding_with_max_rd_atomic_4_complete_in_order) {
  qp_options o;
  o.max_rd_atomic = 4;
  o.max_dest_rd_atomic = 4;
  auto p = connected_pair(o);
  auto local = make_buffer(8 * 8), remote = make_buffer(8);
  store(remote, 100);
  std::vector<std::vector<sge>> sgs;
  for (std::size_t i = 0; i < 8; ++i) sgs.push_back({local.part(i * 8, 8)});
  std::vector<send_wr> wrs;
  for (std::size_t i = 0; i < 8; ++i) {
    wrs.push_back(make_wr(wr_opcode::atomic_fetch_and_add, sgs[i], 20 + i, send_signaled, remote.addr(),
                          remote.m.rkey()));
    wrs.back().compare_add = 1;
  }
  ASSERT_FALSE(p.a.post_send(wrs));
  const auto v = poll(p.cq_a, 8);
  ASSERT_EQ(v.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(wc_ok(v[i], 20 + i, wc_opcode::fetch_add));
    EXPECT_EQ(load(local, i * 8), 100 + i) << i;
  }
  EXPECT_EQ(load(remote), 108u);
}

TEST_F(atomic_test, cas_after_faa_sees_its_result) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(8);
  store(remote, 1);
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_fetch_and_add, local, 0, remote.addr(), remote.m.rkey(), 1, 0, 30));
  ASSERT_FALSE(post_atomic(p, wr_opcode::atomic_cmp_and_swp, local, 8, remote.addr(), remote.m.rkey(), 2, 50, 31));
  const auto v = poll(p.cq_a, 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_ok(v[0], 30, wc_opcode::fetch_add));
  EXPECT_TRUE(wc_ok(v[1], 31, wc_opcode::comp_swap));
  EXPECT_EQ(load(local, 0), 1u);
  EXPECT_EQ(load(local, 8), 2u);
  EXPECT_EQ(load(remote), 50u);
}

// ---------------------------------------------------------------------------
// ATOMIC WRITE (IBTA 1.5; rxe since Linux 6.2, IBV_WR_ATOMIC_WRITE): eight
// bytes stored in one 64-bit store, answered without a result.

class atomic_write_test : public atomic_test {
 protected:
  /// Posts an ATOMIC WRITE of the 8 bytes at [off, off + 8) of `src`.
  std::error_code post_atomic_write(const pair& p, const buffer& src, std::size_t off, std::uint64_t raddr,
                                    std::uint32_t rkey, std::uint64_t wr_id,
                                    std::uint32_t flags = send_signaled, std::uint32_t length = 8) {
    const std::vector<sge> sg{src.part(off, length)};
    return p.a.post_send(make_wr(wr_opcode::atomic_write, sg, wr_id, flags, raddr, rkey));
  }
};

TEST_F(atomic_write_test, stores_the_eight_bytes_and_completes_as_atomic_write) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(24);
  store(local, 0x0123456789ABCDEFull);
  store(remote, 0x1111111111111111ull);
  store(remote, 0x2222222222222222ull, 8);
  store(remote, 0x3333333333333333ull, 16);
  ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr() + 8, remote.m.rkey(), 1));
  const auto wc = poll_one(p.cq_a);
  EXPECT_TRUE(wc_ok(wc, 1, wc_opcode::atomic_write));
  EXPECT_EQ(wc.byte_len, 8u);
  EXPECT_EQ(load(remote, 8), 0x0123456789ABCDEFull);
  EXPECT_EQ(load(remote, 0), 0x1111111111111111ull) << "the word before changed";
  EXPECT_EQ(load(remote, 16), 0x3333333333333333ull) << "the word after changed";
  EXPECT_TRUE(drain(p.cq_b).empty()) << "the responder consumes no receive and completes nothing";
}

// The ATOMIC WRITE waits behind a SEND that found no receive (RNR) while
// its source changes: inline, it carries the bytes of the post; from an
// SGE, the bytes there when it leaves (as a WRITE does).
TEST_F(atomic_write_test, inline_data_is_taken_at_post_time_an_sge_when_sent) {
  for (const bool inl : {true, false}) {
    SCOPED_TRACE(inl ? "inline" : "sge");
    auto p = connected_pair();
    auto src = make_buffer(16), dst = make_buffer(16), local = make_buffer(8), remote = make_buffer(8);
    const std::uint64_t rnr0 = dev.counters().rnr_naks_sent;
    ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 1));
    EXPECT_GT(dev.counters().rnr_naks_sent, rnr0) << "the SEND found a receive";
    store(local, 42);
    ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 2,
                                   send_signaled | (inl ? send_inline : 0u)));
    store(local, 99);
    EXPECT_EQ(load(remote), 0u) << "it did not wait behind the SEND";
    ASSERT_FALSE(post_recv(p.b, {dst.whole()}));
    advance(std::chrono::milliseconds(2));  // the RNR timer (min_rnr_timer 12: 0.64 ms)
    const auto v = poll(p.cq_a, 2, std::chrono::milliseconds(1));
    ASSERT_EQ(v.size(), 2u);
    EXPECT_TRUE(wc_ok(v[0], 1, wc_opcode::send));
    EXPECT_TRUE(wc_ok(v[1], 2, wc_opcode::atomic_write));
    EXPECT_EQ(load(remote), inl ? 42u : 99u);
  }
}

// The inline form's 8 bytes are the operand (ibv_wr_atomic_write takes
// them from a pointer), not inline data: a QP with max_inline_data 0
// posts it (helper-119 #3: it was invalid_argument).
TEST_F(atomic_write_test, inline_needs_no_max_inline_data) {
  qp_options o;
  o.cap = {16, 16, 1, 4, 0};
  auto p = connect(o, o);
  auto local = make_buffer(8), remote = make_buffer(8);
  store(local, 0x5A5A5A5A12345678ull);
  ASSERT_FALSE(
      post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 7, send_signaled | send_inline));
  store(local, 0);  // taken at post time
  const auto wc = poll_one(p.cq_a);
  EXPECT_TRUE(wc_ok(wc, 7, wc_opcode::atomic_write));
  EXPECT_EQ(load(remote), 0x5A5A5A5A12345678ull);
}

// rxe: the responder's QP and the region need remote write, not remote
// atomic access.
TEST_F(atomic_write_test, needs_remote_write_not_remote_atomic) {
  qp_options ob;
  ob.access = access_local_write | access_remote_write;
  auto p = connect(qp_options{}, ob);
  auto local = make_buffer(8), remote = make_buffer(8, access_local_write | access_remote_write);
  store(local, 7);
  ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 3));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 3, wc_opcode::atomic_write));
  EXPECT_EQ(load(remote), 7u);
}

TEST_F(atomic_write_test, responder_qp_without_remote_write_is_rem_inv_req_err) {
  qp_options ob;
  ob.access = access_local_write | access_remote_read | access_remote_atomic;
  auto p = connect(qp_options{}, ob);
  auto local = make_buffer(8), remote = make_buffer(8);
  store(local, 7);
  store(remote, 10);
  ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 4));
  EXPECT_REMOTE_ERROR(p, 4, wc_status::rem_inv_req_err);
  EXPECT_EQ(load(remote), 10u);
}

TEST_F(atomic_write_test, region_without_remote_write_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(8),
       remote = make_buffer(8, access_local_write | access_remote_read | access_remote_atomic);
  store(local, 7);
  store(remote, 10);
  ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 5));
  EXPECT_REMOTE_ERROR(p, 5, wc_status::rem_access_err);
  EXPECT_EQ(load(remote), 10u);
}

TEST_F(atomic_write_test, beyond_the_region_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(64);
  ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr() + 64, remote.m.rkey(), 6));
  EXPECT_REMOTE_ERROR(p, 6, wc_status::rem_access_err);
}

TEST_F(atomic_write_test, responder_max_dest_rd_atomic_0_is_rem_inv_req_err) {
  qp_options ob;
  ob.max_dest_rd_atomic = 0;
  auto p = connect(qp_options{}, ob);
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 1);
  ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 7));
  EXPECT_REMOTE_ERROR(p, 7, wc_status::rem_inv_req_err);
  EXPECT_EQ(load(remote), 1u);
}

TEST_F(atomic_write_test, requester_without_initiator_depth_fails_it_locally) {
  qp_options oa;
  oa.max_rd_atomic = 0;
  auto p = connect(oa, qp_options{});
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 1);
  ASSERT_FALSE(post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 8));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 8, wc_status::loc_qp_op_err));
  EXPECT_EQ(load(remote), 1u);
}

TEST_F(atomic_write_test, bad_local_lkey_is_loc_prot_err) {
  auto p = connected_pair();
  auto local = make_buffer(8), remote = make_buffer(8);
  store(remote, 1);
  const std::vector<sge> sg{{local.addr(), 8, inc_rkey(local.m.lkey())}};
  ASSERT_FALSE(
      p.a.post_send(make_wr(wr_opcode::atomic_write, sg, 9, send_signaled, remote.addr(), remote.m.rkey())));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 9, wc_status::loc_prot_err));
  EXPECT_EQ(load(remote), 1u);
}

TEST_F(atomic_write_test, misaligned_or_not_eight_bytes_or_not_rc_bad_flow) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  EXPECT_EQ(post_atomic_write(p, local, 0, remote.addr() + 4, remote.m.rkey(), 10),
            make_error_code(errc::invalid_argument));
  for (std::uint32_t len : {0u, 4u, 9u, 16u}) {
    EXPECT_EQ(post_atomic_write(p, local, 0, remote.addr(), remote.m.rkey(), 10, send_signaled, len),
              make_error_code(errc::invalid_argument))
        << len;
  }
  EXPECT_TRUE(drain(p.cq_a).empty());
  EXPECT_EQ(query_state(p.a), qp_state::rts);
  qp_options o;
  o.type = qp_type::uc;
  auto u = connected_pair(o);
  EXPECT_EQ(post_atomic_write(u, local, 0, remote.addr(), remote.m.rkey(), 11),
            make_error_code(errc::invalid_argument));
}

// They take initiator-depth credits like READs and atomics, and complete in
// order among WRITEs and READs: the READ behind them sees the last value.
TEST_F(atomic_write_test, several_outstanding_complete_in_order_with_writes_and_reads) {
  qp_options o;
  o.max_rd_atomic = 2;
  o.max_dest_rd_atomic = 2;
  auto p = connected_pair(o);
  auto local = make_buffer(8 * 8 + 8), remote = make_buffer(8);
  std::vector<std::vector<sge>> sgs;
  for (std::size_t i = 0; i < 8; ++i) {
    store(local, 1000 + i, i * 8);
    sgs.push_back({local.part(i * 8, 8)});
  }
  std::vector<send_wr> wrs;
  for (std::size_t i = 0; i < 8; ++i) {
    const wr_opcode op = i % 3 == 2 ? wr_opcode::rdma_write : wr_opcode::atomic_write;
    wrs.push_back(make_wr(op, sgs[i], 40 + i, send_signaled, remote.addr(), remote.m.rkey()));
  }
  const std::vector<sge> back{local.part(64, 8)};
  wrs.push_back(make_wr(wr_opcode::rdma_read, back, 48, send_signaled, remote.addr(), remote.m.rkey()));
  ASSERT_FALSE(p.a.post_send(wrs));
  const auto v = poll(p.cq_a, 9);
  ASSERT_EQ(v.size(), 9u);
  for (std::size_t i = 0; i < 8; ++i)
    EXPECT_TRUE(wc_ok(v[i], 40 + i, i % 3 == 2 ? wc_opcode::rdma_write : wc_opcode::atomic_write)) << i;
  EXPECT_TRUE(wc_ok(v[8], 48, wc_opcode::rdma_read));
  EXPECT_EQ(load(local, 64), 1007u);
  EXPECT_EQ(load(remote), 1007u);
}

TEST_F(atomic_write_test, the_device_reports_it_in_its_extended_capabilities) {
  const device_attr a = dev.query();
  EXPECT_NE(a.device_cap_flags_ex & device_cap_atomic_write, 0u);
  EXPECT_EQ(a.device_cap_flags_ex & 0xFFFFFFFFu, a.device_cap_flags);
}

}  // namespace
}  // namespace averbs::test
