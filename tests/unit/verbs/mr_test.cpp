// SPDX-License-Identifier: MIT
// Memory regions (rdma-core tests/test_mr.py, IBTA 10.6): registration
// access rules, keys, remote and local protection checks as completion
// statuses, re-registration, zero-based regions, deregistration.
#include "verbs_fixture.hpp"

#include "soft/memory.hpp"

#include <cstdio>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;
using mr_test = conformance_test;

constexpr std::uint32_t lw = access_local_write, rw = access_remote_write, rr = access_remote_read,
                        ra = access_remote_atomic;

// The requester's one error completion, and both QPs in ERR (an RC
// responder error, docs/verbs.md "Completion statuses").
#define EXPECT_REMOTE_ERROR(p, wr_id, status)                     \
  do {                                                            \
    EXPECT_TRUE(wc_is(poll_one((p).cq_a), (wr_id), (status)));    \
    EXPECT_EQ(query_state((p).a), qp_state::err);                 \
    EXPECT_EQ(query_state((p).b), qp_state::err);                 \
  } while (0)

// ---------------------------------------------------------------------------
// Registration

TEST_F(mr_test, reg_with_every_legal_access_combination_succeeds) {
  std::vector<std::byte> mem(4096);
  const std::uint32_t flags[] = {lw, rw, rr, ra, access_mw_bind};
  for (std::uint32_t bits = 0; bits < 32; ++bits) {
    std::uint32_t acc = 0;
    for (int i = 0; i < 5; ++i)
      if ((bits & (1u << i)) != 0) acc |= flags[i];
    if ((acc & (rw | ra)) != 0 && (acc & lw) == 0) continue;  // illegal, tested below
    SCOPED_TRACE(acc);
    std::error_code ec;
    mr m = pd_.reg_mr(mem.data(), mem.size(), acc, ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(m.access(), acc);
    EXPECT_EQ(m.addr(), mem.data());
    EXPECT_EQ(m.length(), mem.size());
    EXPECT_NE(m.lkey(), 0u);
    m.dereg();
  }
}

// A peer may keep an R_Key after its region is gone.  The next regions
// registered must not answer to it: their keys use other indices (a freed
// one comes back only after a thousand others) with random bytes.  The
// old rule -- last freed, first reused, the byte counting up -- gave the
// same key back on the 256th registration after.
TEST_F(mr_test, a_stale_key_does_not_come_back_with_the_next_regions) {
  std::vector<std::byte> mem(4096);
  EXPECT_EQ(dev.counters().memory_keys, 0u) << "a new device holds no key";
  std::uint32_t stale = 0;
  {
    mr a = pd_.reg_mr(mem.data(), mem.size(), lw | rw);
    stale = a.rkey();
  }
  std::vector<std::uint32_t> bytes;
  for (int i = 0; i < 300; ++i) {
    mr b = pd_.reg_mr(mem.data(), mem.size(), lw | rw);
    ASSERT_NE(b.rkey(), stale) << "registration " << i << " answers to the stale key";
    EXPECT_NE(b.rkey() >> 8, stale >> 8) << "the freed index came back at once";
    EXPECT_NE(b.rkey() & 0xFF, 0u);
    bytes.push_back(b.rkey() & 0xFF);
    EXPECT_EQ(dev.counters().memory_keys, 1u);
  }
  EXPECT_EQ(dev.counters().memory_keys, 0u);
  // Random bytes, not a count: consecutive keys are not one apart.
  std::size_t ones = 0;
  for (std::size_t i = 1; i < bytes.size(); ++i) ones += ((bytes[i] - bytes[i - 1]) & 0xFF) == 1;
  EXPECT_LT(ones, 20u);
}

TEST_F(mr_test, reg_remote_write_without_local_write_bad_flow) {
  std::vector<std::byte> mem(64);
  std::error_code ec;
  pd_.reg_mr(mem.data(), mem.size(), rw, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  pd_.reg_mr(mem.data(), mem.size(), rw | rr, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
}

TEST_F(mr_test, reg_remote_atomic_without_local_write_bad_flow) {
  std::vector<std::byte> mem(64);
  std::error_code ec;
  pd_.reg_mr(mem.data(), mem.size(), ra, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  pd_.reg_mr(mem.data(), mem.size(), ra | rr | access_mw_bind, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
}

TEST_F(mr_test, reg_zero_length_bad_flow) {
  // include/averbs/verbs/pd.hpp: zero length is invalid_argument (as
  // ib_umem_get: EINVAL).
  std::vector<std::byte> mem(64);
  std::error_code ec;
  mr m = pd_.reg_mr(mem.data(), 0, lw, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_FALSE(m);
}

// The kernel's ib_check_mr_access(): an unknown bit is EINVAL; the huge-page
// hint and the optional range (bits 20-29, relaxed ordering among them)
// are accepted.
TEST_F(mr_test, reg_with_an_unknown_access_bit_bad_flow) {
  std::vector<std::byte> mem(64);
  std::error_code ec;
  for (const std::uint32_t bit : {1u << 10, 1u << 12, 1u << 19, 1u << 30, 1u << 31}) {
    mr m = pd_.reg_mr(mem.data(), mem.size(), lw | bit, ec);
    EXPECT_EQ(ec, make_error_code(errc::invalid_argument)) << bit;
    EXPECT_FALSE(m);
  }
}

// IBV_ACCESS_FLUSH_GLOBAL and _PERSISTENT (bits 8, 9) are known to the
// kernel, which answers EOPNOTSUPP for a device without FLUSH.
TEST_F(mr_test, reg_with_a_flush_access_bit_is_not_supported) {
  std::vector<std::byte> mem(64);
  std::error_code ec;
  for (const std::uint32_t bit : {1u << 8, 1u << 9}) {
    mr m = pd_.reg_mr(mem.data(), mem.size(), lw | bit, ec);
    EXPECT_EQ(ec, make_error_code(errc::not_supported)) << bit;
    EXPECT_FALSE(m);
  }
}

TEST_F(mr_test, reg_with_the_hugetlb_hint_or_an_optional_bit_succeeds) {
  std::vector<std::byte> mem(64);
  for (const std::uint32_t bit : {std::uint32_t{access_hugetlb}, std::uint32_t{access_relaxed_ordering}, 1u << 29}) {
    std::error_code ec;
    mr m = pd_.reg_mr(mem.data(), mem.size(), lw | bit, ec);
    EXPECT_FALSE(ec) << bit << ": " << ec.message();
    EXPECT_TRUE(m);
  }
}

// The kernel pins a region's pages (ib_umem_get) and fails with EFAULT
// where there are none, or where they do not allow the access: a region
// the device could later fault on is never registered.
TEST_F(mr_test, reg_of_unmapped_memory_is_bad_address) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<std::byte*>(m);
  ASSERT_EQ(::munmap(base + page, page), 0);  // a hole in the middle
  std::error_code ec;
  EXPECT_FALSE(pd_.reg_mr(base + page, page, lw | rw, ec));
  EXPECT_EQ(ec, make_error_code(errc::bad_address));
  EXPECT_FALSE(pd_.reg_mr(base, 3 * page, lw, ec)) << "a range across the hole";
  EXPECT_EQ(ec, make_error_code(errc::bad_address));
  mr ok = pd_.reg_mr(base, page, lw | rw, ec);  // the pages around it still register
  EXPECT_FALSE(ec) << ec.message();
  mr ok2 = pd_.reg_mr(base + 2 * page + 10, page - 10, lw | rw, ec);
  EXPECT_FALSE(ec) << ec.message();
  // Re-registration to the hole is refused and leaves the region as it was.
  const std::uint32_t key = ok.lkey();
  ok.rereg(rereg_change_translation, nullptr, base + page, page, 0, ec);
  EXPECT_EQ(ec, make_error_code(errc::bad_address));
  EXPECT_EQ(ok.lkey(), key);
  EXPECT_EQ(ok.addr(), base);
  ok.dereg();
  ok2.dereg();
  ::munmap(base, page);
  ::munmap(base + 2 * page, page);
}

TEST_F(mr_test, reg_of_read_only_memory_needs_read_only_access) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  std::error_code ec;
  for (const std::uint32_t acc : {lw, lw | rw, lw | ra, std::uint32_t{access_mw_bind}}) {
    EXPECT_FALSE(pd_.reg_mr(m, page, acc, ec));
    EXPECT_EQ(ec, make_error_code(errc::bad_address)) << acc;
  }
  mr r = pd_.reg_mr(m, page, rr, ec);  // remote read only: the pages need not be writable
  EXPECT_FALSE(ec) << ec.message();
  r.dereg();
  ASSERT_EQ(::mprotect(m, page, PROT_NONE), 0);
  EXPECT_FALSE(pd_.reg_mr(m, page, rr, ec));
  EXPECT_EQ(ec, make_error_code(errc::bad_address)) << "not even readable";
  ::munmap(m, page);
}

// Kernels before 6.11 have no PROCMAP_QUERY: the check reads the text.
TEST(mr_maps_text, a_range_is_covered_only_by_mappings_without_holes_and_with_the_access) {
  static const char text[] =
      "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/prog\n"
      "00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/prog\n"
      "00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/prog\n"
      "00e03000-00e24000 rw-p 00000000 00:00 0           [heap]\n"
      "7f0000000000-7f0000001000 ---p 00000000 00:00 0\n";
  auto covers = [](std::uint64_t a, std::uint64_t e, bool w) {
    std::FILE* f = ::fmemopen(const_cast<char*>(text), sizeof text - 1, "r");
    const bool r = soft::maps_text_covers(f, a, e, w);
    std::fclose(f);
    return r;
  };
  EXPECT_TRUE(covers(0x400000, 0x452000, false));
  EXPECT_FALSE(covers(0x400000, 0x452000, true)) << "not writable";
  EXPECT_TRUE(covers(0x651800, 0x654000, false)) << "two adjacent mappings";
  EXPECT_FALSE(covers(0x651800, 0x654000, true)) << "the first is read-only";
  EXPECT_TRUE(covers(0x652000, 0x655000, true));
  EXPECT_FALSE(covers(0x654000, 0xe04000, false)) << "a hole between";
  EXPECT_TRUE(covers(0xe10000, 0xe10008, true));
  EXPECT_FALSE(covers(0xe20000, 0xe30000, true)) << "runs off the end of the heap";
  EXPECT_FALSE(covers(0x7f0000000000, 0x7f0000000010, false)) << "no access at all";
  EXPECT_FALSE(covers(0x1000, 0x2000, false)) << "below every mapping";
}

TEST_F(mr_test, reg_on_demand_paging_not_supported_bad_flow) {
  std::vector<std::byte> mem(64);
  std::error_code ec;
  pd_.reg_mr(mem.data(), mem.size(), lw | access_on_demand, ec);
  EXPECT_EQ(ec, make_error_code(errc::not_supported));
}

TEST_F(mr_test, lkey_equals_rkey_and_regions_have_distinct_keys) {
  auto b1 = make_buffer(64), b2 = make_buffer(64);
  mr again = pd_.reg_mr(b1.bytes.data(), 64, lw);  // the same memory twice
  for (const mr* m : {&b1.m, &b2.m, &again}) EXPECT_EQ(m->lkey(), m->rkey());
  EXPECT_NE(b1.m.lkey(), b2.m.lkey());
  EXPECT_NE(b1.m.lkey(), again.lkey());
  EXPECT_NE(b2.m.lkey(), again.lkey());
}

TEST_F(mr_test, dereg_twice_is_stale_handle) {
  auto b = make_buffer(64);
  b.m.dereg();
  std::error_code ec;
  b.m.dereg(ec);
  EXPECT_EQ(ec, make_error_code(errc::stale_handle));
}

// Copies of one handle destroyed by two threads at once: one destroy
// frees the region, the other is told it is stale; nothing is freed twice
// (the address sanitizer run would report it).
TEST_F(mr_test, two_threads_deregistering_copies_of_one_handle_free_it_once) {
  std::vector<std::byte> bytes(64);
  for (int i = 0; i < 300; ++i) {
    mr a = pd_.reg_mr(bytes.data(), bytes.size(), access_local_write);
    mr b = a;  // the same region
    std::error_code ea, eb;
    std::atomic<int> ready{0};
    std::thread t([&] {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      b.dereg(eb);
    });
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    a.dereg(ea);
    t.join();
    ASSERT_TRUE(!ea != !eb) << "exactly one succeeds: " << ea.message() << " / " << eb.message();
    EXPECT_EQ(ea ? ea : eb, make_error_code(errc::stale_handle));
  }
}

// ---------------------------------------------------------------------------
// Remote access checks (responder)

TEST_F(mr_test, write_to_region_without_remote_write_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(64), remote = make_buffer(64, lw | rr | ra);
  remote.fill(0);
  local.fill('x');
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 1, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 1, wc_status::rem_access_err);
  EXPECT_TRUE(remote.all(0));
}

TEST_F(mr_test, read_from_region_without_remote_read_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(64), remote = make_buffer(64, lw | rw);
  local.fill(0);
  remote.fill('r');
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 2, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 2, wc_status::rem_access_err);
  EXPECT_TRUE(local.all(0));
}

TEST_F(mr_test, write_ending_at_the_last_byte_succeeds) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(100);
  fill_pattern(local, 1);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 3, send_signaled, remote.addr() + 84,
                         remote.m.rkey()));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 3, wc_opcode::rdma_write));
  EXPECT_TRUE(has_pattern(remote, 1, 84, 16));
}

TEST_F(mr_test, write_one_byte_past_the_end_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(100);
  remote.fill(0);
  local.fill('x');
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 4, send_signaled, remote.addr() + 85,
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 4, wc_status::rem_access_err);
  EXPECT_TRUE(remote.all(0));
}

TEST_F(mr_test, read_longer_than_the_region_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(101), remote = make_buffer(100);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 5, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 5, wc_status::rem_access_err);
}

TEST_F(mr_test, write_below_the_region_start_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(100);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 6, send_signaled, remote.addr() - 1,
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 6, wc_status::rem_access_err);
}

TEST_F(mr_test, wrong_key_byte_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 7, send_signaled, remote.addr(),
                         inc_rkey(remote.m.rkey())));
  EXPECT_REMOTE_ERROR(p, 7, wc_status::rem_access_err);
}

// A WRITE with immediate refused for its R_Key has taken a receive
// (receives are checked first); that receive completes with
// loc_access_err, the status ibv_poll_cq(3) names for "a protection error
// on a local data buffer during an RDMA Write with Immediate" (rxe says
// rem_access_err).
TEST_F(mr_test, a_write_with_imm_refused_for_its_key_completes_the_receive_loc_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16), r = make_buffer(16);
  ASSERT_FALSE(post_recv(p.b, {r.whole()}, 30));
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write_with_imm, {local.whole()}, 8, send_signaled,
                         remote.addr(), inc_rkey(remote.m.rkey())));
  EXPECT_REMOTE_ERROR(p, 8, wc_status::rem_access_err);
  const auto wc = poll_one(p.cq_b);
  EXPECT_TRUE(wc_is(wc, 30, wc_status::loc_access_err)) << static_cast<int>(wc.status);
}

TEST_F(mr_test, region_of_another_pd_is_rem_access_err) {
  auto p = connected_pair();
  pd other = dev.alloc_pd();
  std::vector<std::byte> mem(64);
  mr foreign = other.reg_mr(mem.data(), mem.size(), lw | rw | rr);
  auto local = make_buffer(16);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 8, send_signaled,
                         reinterpret_cast<std::uintptr_t>(mem.data()), foreign.rkey()));
  EXPECT_REMOTE_ERROR(p, 8, wc_status::rem_access_err);
}

TEST_F(mr_test, deregistered_region_rkey_is_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  const std::uint32_t rkey = remote.m.rkey();
  remote.m.dereg();
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 9, send_signaled, remote.addr(), rkey));
  EXPECT_REMOTE_ERROR(p, 9, wc_status::rem_access_err);
}

TEST_F(mr_test, zero_length_write_with_a_bad_rkey_succeeds) {
  // IBTA C9-88: a zero-length RDMA request names no memory; its R_Key is
  // not checked.
  auto p = connected_pair();
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {}, 10, send_signaled, 0x1234, 0xDEADBE00));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 10, wc_opcode::rdma_write));
  EXPECT_EQ(query_state(p.a), qp_state::rts);
  EXPECT_EQ(query_state(p.b), qp_state::rts);
}

TEST_F(mr_test, zero_length_read_with_a_bad_rkey_succeeds) {
  auto p = connected_pair();
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {}, 11, send_signaled, 0x1234, 0xDEADBE00));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 11, wc_opcode::rdma_read));
  EXPECT_EQ(query_state(p.a), qp_state::rts);
  EXPECT_EQ(query_state(p.b), qp_state::rts);
}

// ---------------------------------------------------------------------------
// Local protection checks

TEST_F(mr_test, bad_lkey_in_a_send_sge_is_loc_prot_err) {
  auto p = connected_pair();
  auto src = make_buffer(16), dst = make_buffer(16);
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 20));
  sge g = src.whole();
  g.lkey = inc_rkey(g.lkey);
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {g}, 12));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 13));
  const auto v = poll(p.cq_a, 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_is(v[0], 12, wc_status::loc_prot_err));
  EXPECT_TRUE(wc_is(v[1], 13, wc_status::wr_flush_err));
  EXPECT_EQ(query_state(p.a), qp_state::err);
  EXPECT_TRUE(drain(p.cq_b).empty()) << "nothing was sent";
  EXPECT_EQ(query_state(p.b), qp_state::rts);
}

TEST_F(mr_test, bad_lkey_in_a_write_source_is_loc_prot_err) {
  auto p = connected_pair();
  auto src = make_buffer(16), remote = make_buffer(16);
  remote.fill(0);
  sge g = src.whole();
  g.lkey = inc_rkey(g.lkey);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {g}, 14, send_signaled, remote.addr(), remote.m.rkey()));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 14, wc_status::loc_prot_err));
  EXPECT_EQ(query_state(p.a), qp_state::err);
  EXPECT_TRUE(remote.all(0));
}

TEST_F(mr_test, send_sge_beyond_its_region_is_loc_prot_err) {
  auto p = connected_pair();
  auto src = make_buffer(16), dst = make_buffer(32);
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 21));
  sge g = src.whole();
  g.length = 17;
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {g}, 15));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 15, wc_status::loc_prot_err));
  EXPECT_EQ(query_state(p.a), qp_state::err);
}

TEST_F(mr_test, send_from_a_region_without_access_flags_works) {
  // Local read needs no access flag (IBTA 10.6.3.1).
  auto p = connected_pair();
  auto src = make_buffer(16, 0), dst = make_buffer(16);
  fill_pattern(src, 2);
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 22));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 16));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 16, wc_opcode::send));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_b), 22, wc_opcode::recv));
  EXPECT_TRUE(has_pattern(dst, 2, 0, 16));
}

TEST_F(mr_test, bad_lkey_in_a_receive_sge_is_loc_prot_err_and_rem_op_err) {
  auto p = connected_pair();
  auto src = make_buffer(16), dst = make_buffer(16);
  sge g = dst.whole();
  g.lkey = inc_rkey(g.lkey);
  ASSERT_FALSE(post_recv(p.b, {g}, 23));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 17));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 23, wc_status::loc_prot_err));
  EXPECT_REMOTE_ERROR(p, 17, wc_status::rem_op_err);
}

TEST_F(mr_test, receive_sge_beyond_its_region_is_loc_prot_err_and_rem_op_err) {
  auto p = connected_pair();
  auto src = make_buffer(32), dst = make_buffer(16);
  sge g = dst.whole();
  g.length = 32;
  ASSERT_FALSE(post_recv(p.b, {g}, 27));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 28));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 27, wc_status::loc_prot_err));
  EXPECT_REMOTE_ERROR(p, 28, wc_status::rem_op_err);
}

TEST_F(mr_test, bad_lkey_for_read_data_is_loc_prot_err) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  local.fill(0);
  sge g = local.whole();
  g.lkey = inc_rkey(g.lkey);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {g}, 29, send_signaled, remote.addr(), remote.m.rkey()));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 29, wc_status::loc_prot_err));
  EXPECT_EQ(query_state(p.a), qp_state::err);
  EXPECT_TRUE(local.all(0));
}

TEST_F(mr_test, receive_into_a_region_without_local_write_is_loc_prot_err) {
  auto p = connected_pair();
  auto src = make_buffer(16), dst = make_buffer(16, rr);
  dst.fill(0);
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 24));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 18));
  EXPECT_TRUE(wc_is(poll_one(p.cq_b), 24, wc_status::loc_prot_err));
  EXPECT_REMOTE_ERROR(p, 18, wc_status::rem_op_err);
  EXPECT_TRUE(dst.all(0));
}

TEST_F(mr_test, read_into_a_region_without_local_write_is_loc_prot_err) {
  auto p = connected_pair();
  auto local = make_buffer(16, rr), remote = make_buffer(16);
  local.fill(0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 19, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 19, wc_status::loc_prot_err));
  EXPECT_EQ(query_state(p.a), qp_state::err);
  EXPECT_TRUE(local.all(0));
}

// ---------------------------------------------------------------------------
// Re-registration

TEST_F(mr_test, rereg_access_revoking_remote_write_makes_writes_fail) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16, lw | rw);
  local.fill('a');
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 30, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 30, wc_opcode::rdma_write));
  remote.m.rereg(rereg_change_access, nullptr, nullptr, 0, lw);
  EXPECT_EQ(remote.m.access(), lw);
  remote.fill(0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 31, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 31, wc_status::rem_access_err);
  EXPECT_TRUE(remote.all(0));
}

TEST_F(mr_test, rereg_access_granting_remote_write_makes_writes_succeed) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16, lw);
  fill_pattern(local, 3);
  remote.m.rereg(rereg_change_access, nullptr, nullptr, 0, lw | rw);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 32, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 32, wc_opcode::rdma_write));
  EXPECT_TRUE(has_pattern(remote, 3, 0, 16));
}

TEST_F(mr_test, rereg_changes_the_keys_and_the_old_rkey_fails) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  const std::uint32_t old_key = remote.m.rkey();
  remote.m.rereg(rereg_change_access, nullptr, nullptr, 0, lw | rw | rr);
  EXPECT_NE(remote.m.rkey(), old_key);
  EXPECT_EQ(remote.m.lkey(), remote.m.rkey());
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 33, send_signaled, remote.addr(), old_key));
  EXPECT_REMOTE_ERROR(p, 33, wc_status::rem_access_err);
}

// Re-registration checks the access flags as registration does: an
// unknown bit is refused and leaves the region, keys and all, as it was.
TEST_F(mr_test, rereg_with_an_unknown_access_bit_is_refused_and_changes_nothing) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  const std::uint32_t key = remote.m.rkey();
  std::error_code ec;
  remote.m.rereg(rereg_change_access, nullptr, nullptr, 0, lw | rw | (1u << 30), ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_EQ(remote.m.rkey(), key);
  local.fill(7);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 34, send_signaled, remote.addr(), key));
  const auto v = drain(p.cq_a);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].status, wc_status::success);
  EXPECT_TRUE(remote.all(7));
}

TEST_F(mr_test, rereg_translation_moves_the_region_to_the_new_buffer) {
  auto p = connected_pair();
  auto local = make_buffer(256), remote = make_buffer(256);
  fill_pattern(local, 4);
  remote.fill(0);
  std::vector<std::byte> fresh(512, std::byte{0});
  remote.m.rereg(rereg_change_translation, nullptr, fresh.data(), fresh.size(), 0);
  EXPECT_EQ(remote.m.addr(), fresh.data());
  EXPECT_EQ(remote.m.length(), fresh.size());
  const auto fresh_addr = reinterpret_cast<std::uintptr_t>(fresh.data());
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 34, send_signaled, fresh_addr + 256,
                         remote.m.rkey()));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 34, wc_opcode::rdma_write));
  for (std::size_t i = 0; i < 256; ++i) ASSERT_EQ(fresh[256 + i], pattern_byte(i, 4)) << i;
  EXPECT_TRUE(remote.all(0)) << "the old buffer was written";
}

TEST_F(mr_test, rereg_translation_old_address_is_outside_the_region) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(64);
  std::vector<std::byte> fresh(64);
  remote.m.rereg(rereg_change_translation, nullptr, fresh.data(), fresh.size(), 0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 35, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 35, wc_status::rem_access_err);
}

TEST_F(mr_test, rereg_translation_receives_into_the_new_buffer) {
  // test_mr.py test_mr_rereg_addr: a receive posted after the move lands in
  // the new memory.
  auto p = connected_pair();
  auto src = make_buffer(64), dst = make_buffer(64);
  fill_pattern(src, 5);
  dst.fill(0);
  std::vector<std::byte> fresh(64, std::byte{0});
  dst.m.rereg(rereg_change_translation, nullptr, fresh.data(), fresh.size(), 0);
  const sge g{reinterpret_cast<std::uintptr_t>(fresh.data()), 64, dst.m.lkey()};
  ASSERT_FALSE(post_recv(p.b, {g}, 25));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 36));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 36, wc_opcode::send));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_b), 25, wc_opcode::recv));
  for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(fresh[i], pattern_byte(i, 5)) << i;
  EXPECT_TRUE(dst.all(0));
}

TEST_F(mr_test, rereg_pd_makes_qps_of_the_old_pd_fail_with_rem_access_err) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  pd other = dev.alloc_pd();
  remote.m.rereg(rereg_change_pd, &other, nullptr, 0, 0);
  remote.fill(0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 37, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 37, wc_status::rem_access_err);
  EXPECT_TRUE(remote.all(0));
}

TEST_F(mr_test, rereg_pd_makes_the_lkey_unusable_by_qps_of_the_old_pd) {
  auto p = connected_pair();
  auto src = make_buffer(16), dst = make_buffer(16);
  pd other = dev.alloc_pd();
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 26));
  src.m.rereg(rereg_change_pd, &other, nullptr, 0, 0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 38));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 38, wc_status::loc_prot_err));
}

TEST_F(mr_test, rereg_with_flags_0_bad_flow) {
  auto b = make_buffer(16);
  std::error_code ec;
  b.m.rereg(0, nullptr, nullptr, 0, 0, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
}

TEST_F(mr_test, rereg_with_unknown_flags_bad_flow) {
  auto b = make_buffer(16);
  std::error_code ec;
  b.m.rereg(8, nullptr, nullptr, 0, 0, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
}

TEST_F(mr_test, rereg_access_remote_write_without_local_write_bad_flow) {
  auto b = make_buffer(16);
  const std::uint32_t key = b.m.rkey();
  std::error_code ec;
  b.m.rereg(rereg_change_access, nullptr, nullptr, 0, rw | rr, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_EQ(b.m.rkey(), key) << "a failed rereg changed the region";
  EXPECT_EQ(b.m.access(), lw | rw | rr | ra);
}

TEST_F(mr_test, rereg_translation_with_zero_length_bad_flow) {
  auto b = make_buffer(16);
  std::error_code ec;
  b.m.rereg(rereg_change_translation, nullptr, b.bytes.data(), 0, 0, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
}

// libibverbs' ibv_rereg_mr(): a new translation needs an address, and
// access flags need CHANGE_ACCESS (EINVAL, before the kernel is asked).
TEST_F(mr_test, rereg_translation_without_an_address_or_access_without_its_flag_bad_flow) {
  auto b = make_buffer(16);
  const std::uint32_t key = b.m.rkey();
  std::error_code ec;
  b.m.rereg(rereg_change_translation, nullptr, nullptr, 16, 0, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  pd other = dev.alloc_pd();
  b.m.rereg(rereg_change_pd, &other, nullptr, 0, access_local_write, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_EQ(b.m.rkey(), key) << "a refused rereg changed the region";
}

// ---------------------------------------------------------------------------
// Zero-based regions

TEST_F(mr_test, zero_based_region_remote_addresses_start_at_0) {
  auto p = connected_pair();
  auto local = make_buffer(32), remote = make_buffer(256, lw | rw | rr | access_zero_based);
  fill_pattern(local, 6);
  remote.fill(0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 40, send_signaled, 100, remote.m.rkey()));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 40, wc_opcode::rdma_write));
  EXPECT_TRUE(remote.all(0, 0, 100));
  EXPECT_TRUE(has_pattern(remote, 6, 100, 32));
  local.fill(0);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 41, send_signaled, 100, remote.m.rkey()));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_a), 41, wc_opcode::rdma_read));
  EXPECT_TRUE(has_pattern(local, 6, 0, 32));
}

TEST_F(mr_test, zero_based_region_ends_at_its_length) {
  auto p = connected_pair();
  auto local = make_buffer(32), remote = make_buffer(256, lw | rw | access_zero_based);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 42, send_signaled, 256 - 31,
                         remote.m.rkey()));
  EXPECT_REMOTE_ERROR(p, 42, wc_status::rem_access_err);
}

}  // namespace
}  // namespace averbs::test
