// SPDX-License-Identifier: MIT
// Memory windows (rdma-core tests/test_mr.py MWTest, IBTA 10.6.7): type-1
// binds through qp::bind_mw, type-2 binds through bind_mw work requests,
// invalidation (local, remote, zero-length bind, dealloc), and the bind and
// access errors.
#include "verbs_fixture.hpp"

namespace averbs::test {
namespace {

using namespace std::chrono_literals;
constexpr std::uint32_t region_access =
    access_local_write | access_remote_write | access_remote_read | access_remote_atomic | access_mw_bind;

class mw_test : public conformance_test {
 protected:
  /// Binds a type-2 window on `q` over [off, off + len) of `b` with the next
  /// key; returns the key (the bind completion is polled from `c`).
  std::uint32_t bind_type2(const qp& q, const cq& c, mw& w, const buffer& b, std::size_t off, std::size_t len,
                           std::uint32_t acc = access_remote_write | access_remote_read) {
    const std::uint32_t key = inc_rkey(w.rkey());
    send_wr bw = make_wr(wr_opcode::bind_mw, {}, 500);
    bw.bind_mw = &w;
    bw.bind_rkey = key;
    bw.bind_info = {b.m.lkey(), b.addr() + off, len, acc};
    EXPECT_FALSE(q.post_send(bw));
    EXPECT_TRUE(wc_ok(poll_one(c), 500, wc_opcode::bind_mw));
    return key;
  }

  /// A signaled RDMA WRITE of `src` to `raddr` with `rkey` from `p.a`.
  std::error_code write(const pair& p, const buffer& src, std::uint64_t raddr, std::uint32_t rkey,
                        std::uint64_t wr_id) {
    return post_send(p.a, wr_opcode::rdma_write, {src.whole()}, wr_id, send_signaled, raddr, rkey);
  }
};

#define EXPECT_REMOTE_ERROR(p, wr_id, status)                     \
  do {                                                            \
    EXPECT_TRUE(wc_is(poll_one((p).cq_a), (wr_id), (status)));    \
    EXPECT_EQ(query_state((p).a), qp_state::err);                 \
    EXPECT_EQ(query_state((p).b), qp_state::err);                 \
  } while (0)

// ---------------------------------------------------------------------------
// Type 1

TEST_F(mw_test, type1_bind_completes_and_its_new_rkey_grants_remote_write) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  fill_pattern(src, 1);
  region.fill(0);
  mw w = pd_.alloc_mw(mw_type::type1);
  EXPECT_EQ(w.type(), mw_type::type1);
  const std::uint32_t before = w.rkey();
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 77, send_signaled,
                           {region.m.lkey(), region.addr() + 1024, 1024, access_remote_write}, &key));
  EXPECT_EQ(key, inc_rkey(before));
  const auto bwc = poll_one(p.cq_b);
  EXPECT_TRUE(wc_ok(bwc, 77, wc_opcode::bind_mw));
  EXPECT_EQ(w.rkey(), key);
  EXPECT_NE(key, region.m.rkey());
  ASSERT_FALSE(write(p, src, region.addr() + 1024 + 100, key, 1));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 1, wc_opcode::rdma_write));
  EXPECT_TRUE(has_pattern(region, 1, 1124, 64));
}

TEST_F(mw_test, type1_rebind_makes_the_old_key_fail) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t k1 = 0, k2 = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &k1));
  ASSERT_FALSE(p.b.bind_mw(w, 2, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &k2));
  const auto v = poll(p.cq_b, 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_ok(v[0], 1, wc_opcode::bind_mw));
  EXPECT_TRUE(wc_ok(v[1], 2, wc_opcode::bind_mw));
  EXPECT_NE(k1, k2);
  ASSERT_FALSE(write(p, src, region.addr(), k2, 3));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 3, wc_opcode::rdma_write));
  ASSERT_FALSE(write(p, src, region.addr(), k1, 4));
  EXPECT_REMOTE_ERROR(p, 4, wc_status::rem_access_err);
}

// Binds queued behind unfinished work (a SEND waiting out RNR NAKs) each
// get their own key at once, and the window shows the last one posted, as
// ibv_bind_mw() does; the window then answers to that key.
TEST_F(mw_test, type1_binds_posted_behind_pending_work_get_distinct_keys) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type1);
  ASSERT_FALSE(post_send(p.b, wr_opcode::send, {src.whole()}, 9, send_signaled));  // no receive yet: RNR
  std::uint32_t k1 = 0, k2 = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &k1));
  ASSERT_FALSE(p.b.bind_mw(w, 2, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &k2));
  EXPECT_NE(k1, k2);
  EXPECT_EQ(w.rkey(), k2);
  auto dst = make_buffer(64);
  ASSERT_FALSE(post_recv(p.a, {dst.whole()}, 5));
  const auto v = poll(p.cq_b, 3, std::chrono::milliseconds(1));  // the manual clock runs out the RNR wait
  ASSERT_EQ(v.size(), 3u);
  EXPECT_TRUE(wc_ok(v[1], 1, wc_opcode::bind_mw));
  EXPECT_TRUE(wc_ok(v[2], 2, wc_opcode::bind_mw));
  EXPECT_EQ(poll(p.cq_a, 1).size(), 1u);  // the receive
  ASSERT_FALSE(write(p, src, region.addr(), k2, 3));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 3, wc_opcode::rdma_write));
}

// A bind waits behind pending work; its window is deallocated and a new
// one takes the slot meanwhile.  The bind fails (the window it named is
// gone), as rxe's comparison of the WQE's full key makes it; it used to
// bind the new window to a range nobody asked for.
TEST_F(mw_test, a_bind_queued_for_a_window_deallocated_since_fails) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w1 = pd_.alloc_mw(mw_type::type1);
  ASSERT_FALSE(post_send(p.b, wr_opcode::send, {src.whole()}, 9, send_signaled));  // no receive yet: RNR
  std::uint32_t k1 = 0;
  ASSERT_FALSE(p.b.bind_mw(w1, 1, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &k1));
  w1.dealloc();
  mw w2 = pd_.alloc_mw(mw_type::type1);
  const std::uint32_t w2_key = w2.rkey();
  auto dst = make_buffer(64);
  ASSERT_FALSE(post_recv(p.a, {dst.whole()}, 5));
  const auto v = poll(p.cq_b, 2, std::chrono::milliseconds(1));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_ok(v[0], 9, wc_opcode::send));
  EXPECT_TRUE(wc_is(v[1], 1, wc_status::mw_bind_err));
  EXPECT_EQ(w2.rkey(), w2_key);  // the new window is untouched
  EXPECT_EQ(query_state(p.b), qp_state::err);  // a failed bind stops the QP (rxe)
}

TEST_F(mw_test, type1_zero_length_bind_invalidates_the_window) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0, unbound = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &key));
  ASSERT_FALSE(write(p, src, region.addr(), key, 2));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 2, wc_opcode::rdma_write));
  ASSERT_FALSE(p.b.bind_mw(w, 3, send_signaled, {0, 0, 0, 0}, &unbound));
  const auto v = poll(p.cq_b, 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_ok(v[1], 3, wc_opcode::bind_mw));
  region.fill(0);
  ASSERT_FALSE(write(p, src, region.addr(), unbound, 4));
  EXPECT_REMOTE_ERROR(p, 4, wc_status::rem_access_err);
  EXPECT_TRUE(region.all(0));
}

TEST_F(mw_test, type1_bind_of_a_type2_window_bad_flow) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type2);
  EXPECT_EQ(p.b.bind_mw(w, 1, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}),
            make_error_code(errc::invalid_argument));
  EXPECT_TRUE(drain(p.cq_b).empty());
}

TEST_F(mw_test, type1_zero_based_bind_bad_flow) {
  // IBTA o10-36.2.2: only a type-2 window may be zero-based (rxe refuses
  // it with EINVAL).  The window keeps its binding and key.
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &key));
  std::uint32_t refused = 0;
  EXPECT_EQ(p.b.bind_mw(w, 2, send_signaled,
                        {region.m.lkey(), region.addr(), 4096, access_remote_write | access_zero_based}, &refused),
            make_error_code(errc::invalid_argument));
  EXPECT_TRUE(drain(p.cq_b).empty());
  EXPECT_EQ(w.rkey(), key);
}

// libibverbs' ibv_bind_mw(): a region in another PD than the window's is
// EPERM at the call, and a range without a region EINVAL; nothing is
// posted and the QP carries on.
TEST_F(mw_test, type1_bind_to_a_region_of_another_pd_bad_flow) {
  auto p = connected_pair();
  pd other = dev.alloc_pd();
  std::vector<std::byte> mem(4096);
  mr foreign = other.reg_mr(mem.data(), mem.size(), region_access);
  mw w = pd_.alloc_mw(mw_type::type1);
  EXPECT_EQ(p.b.bind_mw(w, 1, send_signaled,
                        {foreign.lkey(), reinterpret_cast<std::uintptr_t>(mem.data()), 4096, access_remote_write}),
            make_error_code(errc::permission_denied));
  EXPECT_EQ(p.b.bind_mw(w, 2, send_signaled,
                        {0, reinterpret_cast<std::uintptr_t>(mem.data()), 4096, access_remote_write}),
            make_error_code(errc::invalid_argument));
  EXPECT_TRUE(drain(p.cq_b).empty());
  EXPECT_EQ(query_state(p.b), qp_state::rts);
}

TEST_F(mw_test, type1_bind_on_a_ud_qp_bad_flow) {
  qp_options o;
  o.type = qp_type::ud;
  auto p = connected_pair(o);
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type1);
  EXPECT_EQ(p.b.bind_mw(w, 1, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}),
            make_error_code(errc::invalid_argument));
}

TEST_F(mw_test, window_narrower_than_the_region_refuses_access_outside_it) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  fill_pattern(src, 2);
  region.fill(0);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr() + 1000, 1000, access_remote_write}, &key));
  // Inside: [1000, 2000).
  ASSERT_FALSE(write(p, src, region.addr() + 2000 - 64, key, 2));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 2, wc_opcode::rdma_write));
  EXPECT_TRUE(has_pattern(region, 2, 2000 - 64, 64));
  // One byte past the window, still inside the region.
  ASSERT_FALSE(write(p, src, region.addr() + 2000 - 63, key, 3));
  EXPECT_REMOTE_ERROR(p, 3, wc_status::rem_access_err);
  EXPECT_TRUE(region.all(0, 2000, 2096));
}

TEST_F(mw_test, window_without_remote_write_refuses_writes) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64), local = make_buffer(64);
  fill_pattern(region, 3);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr(), 4096, access_remote_read}, &key));
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 2, send_signaled, region.addr(), key));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 2, wc_opcode::rdma_read));
  EXPECT_TRUE(has_pattern(local, 3, 0, 64));
  ASSERT_FALSE(write(p, src, region.addr(), key, 3));
  EXPECT_REMOTE_ERROR(p, 3, wc_status::rem_access_err);
}

TEST_F(mw_test, dealloc_of_a_bound_window_makes_writes_fail) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &key));
  ASSERT_FALSE(write(p, src, region.addr(), key, 2));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 2, wc_opcode::rdma_write));
  w.dealloc();
  ASSERT_FALSE(write(p, src, region.addr(), key, 3));
  EXPECT_REMOTE_ERROR(p, 3, wc_status::rem_access_err);
  // The region has no window left: it can be deregistered.
  std::error_code ec;
  region.m.dereg(ec);
  EXPECT_FALSE(ec) << ec.message();
}

// ---------------------------------------------------------------------------
// Type 2

TEST_F(mw_test, type2_bind_with_the_next_key_grants_remote_write) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  fill_pattern(src, 4);
  mw w = pd_.alloc_mw(mw_type::type2);
  EXPECT_EQ(w.type(), mw_type::type2);
  const std::uint32_t old_key = w.rkey();
  const std::uint32_t key = bind_type2(p.b, p.cq_b, w, region, 0, 4096);
  EXPECT_EQ(key, inc_rkey(old_key));
  EXPECT_EQ(w.rkey(), key);
  ASSERT_FALSE(write(p, src, region.addr() + 4096 - 64, key, 1));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 1, wc_opcode::rdma_write));
  EXPECT_TRUE(has_pattern(region, 4, 4096 - 64, 64));
}

TEST_F(mw_test, type2_local_invalidate_makes_writes_fail) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type2);
  const std::uint32_t key = bind_type2(p.b, p.cq_b, w, region, 0, 4096);
  send_wr inv = make_wr(wr_opcode::local_inv, {}, 501);
  inv.imm_data = key;
  ASSERT_FALSE(p.b.post_send(inv));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_b), 501, wc_opcode::local_inv));
  region.fill(0);
  ASSERT_FALSE(write(p, src, region.addr(), key, 1));
  EXPECT_REMOTE_ERROR(p, 1, wc_status::rem_access_err);
  EXPECT_TRUE(region.all(0));
}

TEST_F(mw_test, type2_send_with_invalidate_frees_the_window) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64), dst = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type2);
  const std::uint32_t key = bind_type2(p.b, p.cq_b, w, region, 0, 4096);
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 502));
  std::vector<sge> none;
  send_wr s = make_wr(wr_opcode::send_with_inv, none, 1);
  s.imm_data = key;
  ASSERT_FALSE(p.a.post_send(s));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 1, wc_opcode::send));
  const auto r = poll_one(p.cq_b);
  EXPECT_TRUE(wc_ok(r, 502, wc_opcode::recv));
  EXPECT_EQ(r.byte_len, 0u);
  EXPECT_EQ(r.wc_flags & (wc_with_inv | wc_with_imm), static_cast<std::uint32_t>(wc_with_inv));
  EXPECT_EQ(r.imm_data, key);
  ASSERT_FALSE(write(p, src, region.addr(), key, 2));
  EXPECT_REMOTE_ERROR(p, 2, wc_status::rem_access_err);
}

TEST_F(mw_test, type2_window_can_be_bound_again_after_invalidation) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type2);
  const std::uint32_t k1 = bind_type2(p.b, p.cq_b, w, region, 0, 4096);
  send_wr inv = make_wr(wr_opcode::local_inv, {}, 501);
  inv.imm_data = k1;
  ASSERT_FALSE(p.b.post_send(inv));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_b), 501, wc_opcode::local_inv));
  const std::uint32_t k2 = bind_type2(p.b, p.cq_b, w, region, 0, 4096);
  EXPECT_EQ(k2, inc_rkey(k1));
  ASSERT_FALSE(write(p, src, region.addr(), k2, 1));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 1, wc_opcode::rdma_write));
}

TEST_F(mw_test, type2_window_used_through_another_qp_is_rem_access_err) {
  auto p1 = connected_pair();
  auto p2 = connected_pair();  // same PD, other QPs
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type2);
  const std::uint32_t key = bind_type2(p1.b, p1.cq_b, w, region, 0, 4096);
  ASSERT_FALSE(write(p2, src, region.addr(), key, 1));
  EXPECT_REMOTE_ERROR(p2, 1, wc_status::rem_access_err);
  // Through the QP that bound it, it still works.
  ASSERT_FALSE(write(p1, src, region.addr(), key, 2));
  EXPECT_TRUE(wc_ok(poll_one(p1.cq_a), 2, wc_opcode::rdma_write));
}

// A SEND with Invalidate that names a type-2 window bound through another
// QP (same PD) fails its receive with rem_inv_req_err and leaves the
// window to its own QP: a peer of another connection cannot revoke what
// it cannot use.
TEST_F(mw_test, type2_window_invalidated_through_another_qp_stays_bound) {
  auto p1 = connected_pair();
  auto p2 = connected_pair();  // same PD, other QPs
  auto region = make_buffer(4096, region_access), src = make_buffer(64), dst = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type2);
  const std::uint32_t key = bind_type2(p1.b, p1.cq_b, w, region, 0, 4096);
  ASSERT_FALSE(post_recv(p2.b, {dst.whole()}, 503));
  std::vector<sge> none;
  send_wr s = make_wr(wr_opcode::send_with_inv, none, 1);
  s.imm_data = key;
  ASSERT_FALSE(p2.a.post_send(s));
  EXPECT_TRUE(wc_is(poll_one(p2.cq_b), 503, wc_status::rem_inv_req_err));
  EXPECT_EQ(query_state(p2.b), qp_state::err);
  // The window still serves the QP that bound it.
  ASSERT_FALSE(write(p1, src, region.addr(), key, 2));
  EXPECT_TRUE(wc_ok(poll_one(p1.cq_a), 2, wc_opcode::rdma_write));
}

// A type-2 window outlives the QP it was bound through, and no other QP
// can use it, even one that gets the destroyed QP's memory (destroying
// the old pair responder first, then requester, makes the allocator hand
// their memory to the new pair in the same roles).
TEST_F(mw_test, type2_window_of_a_destroyed_qp_is_refused_to_every_later_qp) {
  auto region = make_buffer(4096, region_access), src = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type2);
  std::uint32_t key;
  {
    auto p1 = connected_pair();
    key = bind_type2(p1.b, p1.cq_b, w, region, 0, 4096);
    p1.b.destroy();
    p1.a.destroy();
  }
  auto p2 = connected_pair();
  ASSERT_FALSE(write(p2, src, region.addr(), key, 1));
  EXPECT_REMOTE_ERROR(p2, 1, wc_status::rem_access_err);
}

TEST_F(mw_test, type2_bind_while_bound_is_mw_bind_err) {
  // IBTA 10.6.7.2.3 / rxe: a bound type-2 window must be invalidated first.
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type2);
  const std::uint32_t key = bind_type2(p.b, p.cq_b, w, region, 0, 4096);
  send_wr bw = make_wr(wr_opcode::bind_mw, {}, 503);
  bw.bind_mw = &w;
  bw.bind_rkey = inc_rkey(key);
  bw.bind_info = {region.m.lkey(), region.addr(), 4096, access_remote_write};
  ASSERT_FALSE(p.b.post_send(bw));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 503, wc_status::mw_bind_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, bind_wr_without_a_window_bad_flow) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  send_wr bw = make_wr(wr_opcode::bind_mw, {}, 504);
  bw.bind_rkey = 0x1234;
  bw.bind_info = {region.m.lkey(), region.addr(), 4096, access_remote_write};
  EXPECT_EQ(p.b.post_send(bw), make_error_code(errc::invalid_argument));
  EXPECT_TRUE(drain(p.cq_b).empty());
}

// ---------------------------------------------------------------------------
// Bind and invalidate errors

// A window of another device cannot be bound through this device's QP:
// it would name this device's window of the same index.
TEST_F(mw_test, bind_of_another_devices_window_bad_flow) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  const std::string other_name = std::string("t_mw_test.other_device");
  soft_device other_dev(soft_device_options{other_name, &clock, {gid::from_ipv4(0x7F000001)}});
  device other = open_device(*ctx, other_name);
  pd other_pd = other.alloc_pd();
  mw other1 = other_pd.alloc_mw(mw_type::type1), other2 = other_pd.alloc_mw(mw_type::type2);
  mw mine = pd_.alloc_mw(mw_type::type2);  // the same index on this device
  const std::uint32_t mine_key = mine.rkey();
  EXPECT_EQ(p.a.bind_mw(other1, 1, send_signaled, {region.m.lkey(), region.addr(), 64, access_remote_write}),
            make_error_code(errc::invalid_argument));
  send_wr bw = make_wr(wr_opcode::bind_mw, {}, 2);
  bw.bind_mw = &other2;
  bw.bind_rkey = inc_rkey(other2.rkey());
  bw.bind_info = {region.m.lkey(), region.addr(), 64, access_remote_write};
  EXPECT_EQ(p.a.post_send(bw), make_error_code(errc::invalid_argument));
  EXPECT_EQ(mine.rkey(), mine_key) << "this device's window is untouched";
  EXPECT_TRUE(drain(p.cq_a).empty());
}

TEST_F(mw_test, alloc_of_type_3_bad_flow) {
  std::error_code ec;
  mw w = pd_.alloc_mw(static_cast<mw_type>(3), ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_FALSE(w);
}

TEST_F(mw_test, bind_on_a_region_without_mw_bind_is_mw_bind_err) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access & ~access_mw_bind);
  mw w = pd_.alloc_mw(mw_type::type1);
  ASSERT_FALSE(p.b.bind_mw(w, 9, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}));
  ASSERT_FALSE(post_send(p.b, wr_opcode::send, {}, 10));
  const auto v = poll(p.cq_b, 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_is(v[0], 9, wc_status::mw_bind_err));
  EXPECT_TRUE(wc_is(v[1], 10, wc_status::wr_flush_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, bind_beyond_the_region_is_mw_bind_err) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type1);
  ASSERT_FALSE(p.b.bind_mw(w, 11, send_signaled, {region.m.lkey(), region.addr() + 1, 4096, access_remote_write}));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 11, wc_status::mw_bind_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, type2_bind_beyond_the_region_is_mw_bind_err) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type2);
  send_wr bw = make_wr(wr_opcode::bind_mw, {}, 12);
  bw.bind_mw = &w;
  bw.bind_rkey = inc_rkey(w.rkey());
  bw.bind_info = {region.m.lkey(), region.addr() - 8, 64, access_remote_write};
  ASSERT_FALSE(p.b.post_send(bw));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 12, wc_status::mw_bind_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, type2_zero_length_bind_is_mw_bind_err_and_leaves_the_region_free) {
  // o10-37.2.40, as rxe: a type-2 window is invalidated, not bound to
  // nothing (which would pin its region with no range to grant).
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type2);
  send_wr bw = make_wr(wr_opcode::bind_mw, {}, 13);
  bw.bind_mw = &w;
  bw.bind_rkey = inc_rkey(w.rkey());
  bw.bind_info = {region.m.lkey(), region.addr(), 0, access_remote_write};
  ASSERT_FALSE(p.b.post_send(bw));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 13, wc_status::mw_bind_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
  std::error_code ec;
  region.m.dereg(ec);
  EXPECT_FALSE(ec) << ec.message();
}

TEST_F(mw_test, bind_granting_remote_write_on_a_region_without_local_write_is_mw_bind_err) {
  auto p = connected_pair();
  auto region = make_buffer(4096, access_remote_read | access_mw_bind);
  mw w = pd_.alloc_mw(mw_type::type1);
  ASSERT_FALSE(p.b.bind_mw(w, 13, send_signaled, {region.m.lkey(), region.addr(), 4096, access_remote_write}));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 13, wc_status::mw_bind_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, local_invalidate_of_a_bad_key_is_loc_qp_op_err) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type2);
  const std::uint32_t key = bind_type2(p.b, p.cq_b, w, region, 0, 4096);
  send_wr inv = make_wr(wr_opcode::local_inv, {}, 14);
  inv.imm_data = inc_rkey(key);
  ASSERT_FALSE(p.b.post_send(inv));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 14, wc_status::loc_qp_op_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, local_invalidate_of_a_type1_window_is_loc_qp_op_err) {
  // IBTA 10.6.7.3: only type-2 windows are invalidated by key.
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &key));
  send_wr inv = make_wr(wr_opcode::local_inv, {}, 17);
  inv.imm_data = key;
  ASSERT_FALSE(p.b.post_send(inv));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 17, wc_status::loc_qp_op_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, local_invalidate_of_a_region_key_is_loc_qp_op_err) {
  // docs/verbs.md: plain regions (not fast-registered) cannot be invalidated.
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  send_wr inv = make_wr(wr_opcode::local_inv, {}, 18);
  inv.imm_data = region.m.rkey();
  ASSERT_FALSE(p.b.post_send(inv));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 18, wc_status::loc_qp_op_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
}

TEST_F(mw_test, send_with_invalidate_of_a_type1_key_fails_the_receive) {
  // docs/verbs.md: the message arrived (the requester succeeds); the
  // receive completes rem_inv_req_err and the responder moves to ERR.
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access), dst = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &key));
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 15));
  std::vector<sge> none;
  send_wr s = make_wr(wr_opcode::send_with_inv, none, 16);
  s.imm_data = key;
  ASSERT_FALSE(p.a.post_send(s));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 16, wc_opcode::send));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 15, wc_status::rem_inv_req_err));
  EXPECT_EQ(query_state(p.b), qp_state::err);
  EXPECT_EQ(query_state(p.a), qp_state::rts);
}

// The same for an unsignaled SEND_WITH_INV, whose last packet does not ask
// for an ACK (the responder's lazy ACK covers it): the responder, moving to
// ERR, acknowledges it anyway, so the requester does not resend a message
// that arrived until it runs out of retries.
TEST_F(mw_test, a_failed_invalidation_is_acknowledged_even_unasked) {
  qp_options oa;
  oa.retry_cnt = 1;
  auto p = connect(oa, qp_options{});
  auto region = make_buffer(4096, region_access), dst = make_buffer(64);
  mw w = pd_.alloc_mw(mw_type::type1);
  std::uint32_t key = 0;
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr(), 4096, access_remote_write}, &key));
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 15));
  send_wr s = make_wr(wr_opcode::send_with_inv, {}, 16);
  s.imm_data = key;
  s.flags = 0;  // unsignaled
  ASSERT_FALSE(p.a.post_send(s));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 15, wc_status::rem_inv_req_err));
  advance(std::chrono::seconds(2), std::chrono::milliseconds(10));  // past retry_cnt + 1 timeouts of 67 ms
  EXPECT_TRUE(drain(p.cq_a).empty()) << "the unsignaled SEND_WITH_INV that arrived completed in error";
  EXPECT_EQ(query_state(p.a), qp_state::rts);
}

TEST_F(mw_test, dereg_of_a_region_with_a_bound_window_bad_flow) {
  auto p = connected_pair();
  auto region = make_buffer(4096, region_access);
  mw w = pd_.alloc_mw(mw_type::type1);
  ASSERT_FALSE(p.b.bind_mw(w, 1, 0, {region.m.lkey(), region.addr(), 4096, access_remote_write}));
  EXPECT_TRUE(drain(p.cq_b).empty());
  std::error_code ec;
  region.m.dereg(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_state));
  region.m.rereg(rereg_change_access, nullptr, nullptr, 0, access_local_write, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_state));
  // Unbinding releases the region.
  ASSERT_FALSE(p.b.bind_mw(w, 2, 0, {0, 0, 0, 0}));
  region.m.dereg(ec);
  EXPECT_FALSE(ec) << ec.message();
}

}  // namespace
}  // namespace averbs::test
