// SPDX-License-Identifier: MIT
// Posting and polling never allocate in steady state: this program counts
// every operator new in the process (libaverbs included) across a million
// send/receive cycles, a hundred thousand multi-packet writes and reads,
// and a hundred thousand atomics after warm-up, and asserts none.  And
// where the engine does allocate (a timer heap that grows), running out
// of memory loses nothing.
#include "counting_new.hpp"
#include "verbs_fixture.hpp"

#include <filesystem>

namespace averbs::test {
namespace {

class data_path_alloc : public verbs_test {
 protected:
  template <class Body>
  std::uint64_t allocations_during(int n, Body&& body) {
    body(n / 10 + 64);  // warm-up: packet pools and queues reach their size
    const std::uint64_t before = heap_allocations();
    body(n);
    return heap_allocations() - before;
  }
};

TEST_F(data_path_alloc, send_recv_cycles_do_not_allocate) {
  auto p = connected_pair();
  auto src = make_buffer(64), dst = make_buffer(64);
  const sge s = src.part(0, 8), d = dst.part(0, 8);
  send_wr w;
  w.opcode = wr_opcode::send;
  w.sg_list = &s;
  w.num_sge = 1;
  w.flags = send_signaled;
  recv_wr r;
  r.sg_list = &d;
  r.num_sge = 1;
  work_completion wc[2];
  std::uint64_t ok = 0;
  EXPECT_EQ(allocations_during(1'000'000,
                               [&](int n) {
                                 for (int i = 0; i < n; ++i) {
                                   if (p.b.post_recv(r) || p.a.post_send(w)) return;
                                   while (p.cq_a.poll({wc, 1}) == 0) {
                                   }
                                   while (p.cq_b.poll({wc + 1, 1}) == 0) {
                                   }
                                   ok += wc[0].status == wc_status::success && wc[1].status == wc_status::success;
                                 }
                               }),
            0u);
  EXPECT_GT(ok, 1'000'000u);
}

TEST_F(data_path_alloc, multi_packet_writes_reads_and_atomics_do_not_allocate) {
  auto p = connected_pair();
  auto local = make_buffer(16384), remote = make_buffer(16384);
  const sge big = local.part(0, 10000), eight = local.part(0, 8);
  work_completion wc;
  std::uint64_t ok = 0;
  auto run = [&](wr_opcode op, const sge& g) {
    send_wr w;
    w.opcode = op;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.remote_addr = remote.addr();
    w.rkey = remote.m.rkey();
    w.compare_add = 1;
    if (p.a.post_send(w)) return;
    while (p.cq_a.poll({&wc, 1}) == 0) {
    }
    ok += wc.status == wc_status::success;
  };
  EXPECT_EQ(allocations_during(100'000,
                               [&](int n) {
                                 for (int i = 0; i < n; ++i) {
                                   run(wr_opcode::rdma_write, big);
                                   run(wr_opcode::rdma_read, big);
                                   run(wr_opcode::atomic_fetch_and_add, eight);
                                 }
                               }),
            0u);
  EXPECT_GT(ok, 300'000u);
}

// Unsignaled SENDs are acknowledged lazily; an ACK the responder sends
// anyway (for the signaled one) covers them.  The QP waiting for its lazy
// ACK is listed once however often that happens between two lazy timers
// (it used to be added again after every such ACK: with the clock still,
// the list grew for good).
TEST_F(data_path_alloc, unsignaled_sends_do_not_allocate) {
  auto p = connected_pair();
  auto src = make_buffer(64), dst = make_buffer(64);
  const sge s = src.part(0, 8), d = dst.part(0, 8);
  send_wr w;
  w.opcode = wr_opcode::send;
  w.sg_list = &s;
  w.num_sge = 1;
  recv_wr r;
  r.sg_list = &d;
  r.num_sge = 1;
  work_completion wc[16];
  std::uint64_t ok = 0;
  EXPECT_EQ(allocations_during(200'000,
                               [&](int n) {
                                 for (int i = 0; i < n; ++i) {
                                   w.flags = i % 8 == 7 ? std::uint32_t{send_signaled} : 0u;
                                   if (p.b.post_recv(r) || p.a.post_send(w)) return;
                                   while (p.cq_b.poll({wc, 1}) == 0) {
                                   }
                                   if (i % 8 == 7) {
                                     while (p.cq_a.poll({wc + 1, 1}) == 0) {
                                     }
                                     ok += wc[1].status == wc_status::success;
                                   }
                                 }
                               }),
            0u);
  EXPECT_GT(ok, 25'000u);
}

// A retransmit timer the heap has no memory for is not lost: the next
// pass of the engine schedules it again, or, if memory is still short
// then, the QP fails where the application sees it (fatal_err,
// IBV_EVENT_QP_FATAL).  Either way every send completes.  (The entry used
// to be dropped: its QP waited for an ACK that never came, forever.)
using timer_memory = conformance_test;

TEST_F(timer_memory, a_retransmit_timer_with_no_memory_is_not_lost) {
  qp_options o;
  o.retry_cnt = 1;
  auto src = make_buffer(16), dst = make_buffer(16);
  const std::vector<sge> sg{src.whole()};
  {  // warm-up: packet pools and queues reach their size
    auto w = connected_pair(o);
    for (int i = 0; i < 64; ++i) {
      ASSERT_FALSE(post_recv(w.b, {dst.whole()}, 1));
      ASSERT_FALSE(post_send(w.a, wr_opcode::send, sg, 1));
      ASSERT_EQ(poll(w.cq_a, 1).size(), 1u);
    }
  }
  // QPs whose peers do not answer: each send arms its QP's retransmit
  // timer, one more heap entry each, and the heap cannot grow.  More of
  // them than the room a device makes in its heap when created (16).
  constexpr int n = 40;
  std::vector<pair> v;
  for (int i = 0; i < n; ++i) {
    v.push_back(connected_pair(o));
    qp_attr e;
    e.state = qp_state::err;
    v.back().b.modify(e, qp_attr_state);
  }
  send_wr w;
  w.wr_id = 7;
  w.opcode = wr_opcode::send;
  w.sg_list = sg.data();
  w.num_sge = 1;
  w.flags = send_signaled;
  std::error_code ec[n];
  fail_allocations_on_this_thread(true);
  for (int i = 0; i < n; ++i) ec[i] = v[i].a.post_send(w);
  fail_allocations_on_this_thread(false);
  std::size_t fatal = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_FALSE(ec[i]) << ec[i].message();
    const auto c = poll(v[i].cq_a, 1, std::chrono::milliseconds(10));
    ASSERT_EQ(c.size(), 1u) << "send " << i << " never completed: its timer was lost";
    if (c[0].status == wc_status::fatal_err)
      ++fatal;
    else
      EXPECT_TRUE(wc_is(c[0], 7, wc_status::retry_exc_err));
    EXPECT_EQ(query_state(v[i].a), qp_state::err);
  }
  EXPECT_GT(fatal, 0u) << "no timer was short of memory: this test tested nothing";
  EXPECT_LT(fatal, static_cast<std::size_t>(n)) << "the last lost timer was not scheduled again";
  EXPECT_EQ(count_events(event_type::qp_fatal), fatal);
}

// Where a control verb allocates, memory running out at any allocation
// fails the verb with no_resources and changes nothing: no key left
// naming a freed region or window, no half-applied QP attributes, no
// terminate from a noexcept path.  Each test fails every allocation of
// the verb in turn (the first, the second, ...) until one call succeeds.
using control_memory = conformance_test;

/// Calls `verb(ec)` with its first, second, ... allocation failing until
/// it succeeds; `failed(ec)` checks each failed call.  Returns how many
/// failed.
template <class Verb, class Failed>
std::size_t fail_each_allocation(Verb&& verb, Failed&& failed) {
  for (std::uint64_t k = 1; k < 1000; ++k) {
    std::error_code ec;
    fail_nth_allocation_on_this_thread(k);
    verb(ec);
    if (!fail_nth_allocation_on_this_thread(0)) {
      EXPECT_FALSE(ec) << ec.message();
      return k - 1;
    }
    failed(ec);
  }
  ADD_FAILURE() << "never succeeded";
  return 0;
}

// Destroying needs no memory the engine could run short of: with every
// allocation failing, a QP, an SRQ, a CQ, an AH and a PD are destroyed
// (the engine's noexcept paths gave their slots back through lists that
// grew, and a bad_alloc there terminated the process); a destroy the
// handle layer could not start says so and works once memory returns;
// creating works again after.
TEST_F(control_memory, destroying_objects_short_of_memory_terminates_nothing) {
  pd p = dev.alloc_pd();
  cq c = dev.create_cq(4);
  srq s = p.create_srq({4, 1, 0});
  qp_init_attr ia;
  ia.send_cq = c;
  ia.recv_cq = c;
  ia.srq = s;
  ia.cap = {4, 0, 1, 1, 0};
  qp q = p.create_qp(ia);
  ah_attr a;
  a.is_global = true;
  a.port_num = 1;
  a.grh.dgid = gid::from_ipv4(0x7F000001);
  ah h = p.create_ah(a);
  std::error_code ec[5];
  fail_allocations_on_this_thread(true);
  q.destroy(ec[0]);
  h.destroy(ec[1]);
  s.destroy(ec[2]);
  c.destroy(ec[3]);
  p.dealloc(ec[4]);
  fail_allocations_on_this_thread(false);
  // (Any destroy that could not start, short of memory, is done now.)
  if (ec[0]) q.destroy();
  if (ec[1]) h.destroy();
  if (ec[2]) s.destroy();
  if (ec[3]) c.destroy();
  if (ec[4]) p.dealloc();
  pd p2 = dev.alloc_pd();
  cq c2 = dev.create_cq(4);
  ia.send_cq = ia.recv_cq = c2;
  ia.srq = {};
  ia.cap = {4, 4, 1, 1, 0};
  qp q2 = p2.create_qp(ia);
  ah h2 = p2.create_ah(a);
  EXPECT_EQ(query_state(q2), qp_state::reset);
}

TEST_F(control_memory, a_registration_short_of_memory_leaves_no_key_behind) {
  // Forty registrations; one that failed after taking its key used to
  // leave the key naming the freed region.
  auto buf = make_buffer(4096);
  const std::uint64_t base = dev.counters().memory_keys;  // buf's key
  std::vector<mr> held;
  std::size_t failures = 0;
  for (int i = 0; i < 40; ++i) {
    mr m;
    failures += fail_each_allocation(
        [&](std::error_code& ec) { m = pd_.reg_mr(buf.bytes.data(), 4096, access_local_write, ec); },
        [&](std::error_code ec) { EXPECT_EQ(ec, errc::no_resources) << "registration " << i; });
    held.push_back(std::move(m));
    EXPECT_EQ(dev.counters().memory_keys, base + held.size()) << "registration " << i << ": a key was leaked";
  }
  EXPECT_GT(failures, 40u);
}

TEST_F(control_memory, a_window_short_of_memory_leaves_no_key_behind) {
  const std::uint64_t base = dev.counters().memory_keys;
  std::vector<mw> held;
  for (int i = 0; i < 40; ++i) {
    mw w;
    fail_each_allocation([&](std::error_code& ec) { w = pd_.alloc_mw(mw_type::type2, ec); },
                         [&](std::error_code ec) { EXPECT_EQ(ec, errc::no_resources) << "window " << i; });
    held.push_back(std::move(w));
    EXPECT_EQ(dev.counters().memory_keys, base + held.size()) << "window " << i << ": a key was leaked";
  }
}

TEST_F(control_memory, a_reregistration_short_of_memory_keeps_the_old_keys) {
  // Re-registration takes new keys.  Each round registers a region and
  // re-registers it, each at a fresh index past the end of the region
  // table, which grows now and then: an allocation that used to fail after
  // the region had changed, in a noexcept path.
  auto buf = make_buffer(4096);
  std::vector<mr> held;
  for (int i = 0; i < 40; ++i) {
    held.push_back(pd_.reg_mr(buf.bytes.data(), 4096, access_local_write));
    mr& m = held.back();
    const std::uint32_t before = m.lkey();
    fail_each_allocation(
        [&](std::error_code& ec) {
          m.rereg(rereg_change_access, nullptr, nullptr, 0, access_local_write, ec);
        },
        [&](std::error_code ec) {
          EXPECT_EQ(ec, errc::no_resources) << "re-registration " << i;
          EXPECT_EQ(m.lkey(), before) << "re-registration " << i;
        });
    EXPECT_NE(m.lkey(), before);
  }
}

TEST_F(control_memory, a_qp_move_short_of_memory_changes_nothing) {
  // INIT -> RTR sizes the READ/atomic replay table; SQD -> SQD resizes it.
  qp_options o;
  cq c = dev.create_cq(16);
  qp q = make_qp(o, c, c);
  q.modify(init_attr(o), init_mask(o.type));
  std::size_t failures =
      fail_each_allocation([&](std::error_code& ec) { q.modify(rtr_attr(o, 0x12, 0), rtr_mask(o.type), ec); },
                           [&](std::error_code ec) {
                             EXPECT_EQ(ec, errc::no_resources);
                             EXPECT_EQ(query_state(q), qp_state::init);
                           });
  EXPECT_GT(failures, 0u);
  q.modify(rts_attr(o, 0), rts_mask(o.type));
  qp_attr sqd;
  sqd.state = qp_state::sqd;
  q.modify(sqd, qp_attr_state);
  ASSERT_EQ(query_state(q), qp_state::sqd);
  const std::uint8_t depth = q.query().max_dest_rd_atomic;
  qp_attr more;
  more.max_dest_rd_atomic = static_cast<std::uint8_t>(depth * 4);
  failures =
      fail_each_allocation([&](std::error_code& ec) { q.modify(more, qp_attr_max_dest_rd_atomic, ec); },
                           [&](std::error_code ec) {
                             EXPECT_EQ(ec, errc::no_resources);
                             EXPECT_EQ(q.query().max_dest_rd_atomic, depth);
                           });
  EXPECT_GT(failures, 0u);
  EXPECT_EQ(q.query().max_dest_rd_atomic, depth * 4);
}

// A requester with no packet buffer for its next packet (no memory) tries
// again at the next pass: a WQE that took its PSNs and sent nothing has no
// retransmit timer to rescue it, and a UC send queue has none at all.
TEST_F(control_memory, a_send_short_of_a_packet_buffer_leaves_once_memory_returns) {
  for (const qp_type t : {qp_type::rc, qp_type::uc}) {
    qp_options o;
    o.type = t;
    auto p = connected_pair(o);  // a device that has sent nothing: no packet buffer yet
    auto src = make_buffer(64), dst = make_buffer(64);
    ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 1));
    const sge g = src.whole();
    send_wr w;  // built before memory runs out
    w.wr_id = 2;
    w.opcode = wr_opcode::send;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    fail_allocations_on_this_thread(true);
    const std::error_code ec = p.a.post_send(w);
    fail_allocations_on_this_thread(false);
    ASSERT_FALSE(ec) << ec.message();
    const auto got = poll(p.cq_b, 1);
    ASSERT_EQ(got.size(), 1u) << (t == qp_type::rc ? "RC" : "UC") << ": the send never left";
    EXPECT_TRUE(wc_ok(got[0], 1, wc_opcode::recv));
  }
}

// A device's first packet buffer short of memory at any of its three
// allocations (the packet, its buffer, room in the stores that own them)
// leaves no free packet behind that the unwinding freed: the sends that
// follow, once memory is back, take buffers the device owns (it used to
// hand out the freed one, and packet_buffers stayed 0 while it sent).
TEST_F(control_memory, a_first_packet_buffer_short_of_memory_leaves_no_freed_one_behind) {
  std::size_t failed = 0;
  for (std::uint64_t k = 1; k <= 8; ++k) {
    if (k > 1) {  // a new device: one that has sent nothing has no packet buffer yet
      TearDown();
      SetUp();
    }
    qp_options o;
    auto p = connected_pair(o);
    auto src = make_buffer(64), dst = make_buffer(64);
    ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 1));
    ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 2));
    const sge g = src.whole();
    send_wr w;
    w.wr_id = 2;
    w.opcode = wr_opcode::send;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    fail_nth_allocation_on_this_thread(k);
    ASSERT_FALSE(p.a.post_send(w));
    if (fail_nth_allocation_on_this_thread(0)) ++failed;
    ASSERT_FALSE(p.a.post_send(w));
    const auto got = poll(p.cq_b, 2);
    ASSERT_EQ(got.size(), 2u) << "allocation " << k;
    EXPECT_GT(dev.counters().packet_buffers, 0u) << "allocation " << k;
  }
  EXPECT_GT(failed, 0u) << "no allocation failed: this test tested nothing";
}

// A device whose construction runs out of memory releases what it had
// opened (its epoll, timer and wake-up descriptors; the UDP socket of a
// bound device): the allocations after the links were outside the part
// that closed them.
TEST(device_memory, a_device_short_of_memory_closes_its_descriptors) {
  auto open_fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{});
  };
  for (const bool udp : {false, true}) {
    const auto before = open_fds();
    std::size_t failures = 0;
    for (std::uint64_t k = 1; k < 1000; ++k) {
      soft_device_options o{std::string("t_device_memory_") + (udp ? "udp" : "lo"), nullptr, {}};
      if (udp) o.address = "127.0.77.1";
      o.port = 48313;
      o.faults = "drop=0.5";  // a fault link, allocated late
      fail_nth_allocation_on_this_thread(k);
      try {
        soft_device d(o);
        const bool failed = fail_nth_allocation_on_this_thread(0);
        if (!failed) break;
      } catch (const std::bad_alloc&) {
        ++failures;
      } catch (const std::system_error& e) {
        fail_nth_allocation_on_this_thread(0);
        EXPECT_EQ(e.code(), errc::no_resources) << e.what();
        ++failures;
      }
      fail_nth_allocation_on_this_thread(0);
      EXPECT_EQ(open_fds(), before) << "after failing allocation " << k << (udp ? " (UDP device)" : "");
    }
    EXPECT_GT(failures, 3u);
    EXPECT_EQ(open_fds(), before);
  }
}

}  // namespace
}  // namespace averbs::test
