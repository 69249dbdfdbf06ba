// SPDX-License-Identifier: MIT
// Completion queues (rdma-core tests/test_cq.py, test_cq_events.py; IBTA
// 11.2.8, 11.4.2): sizes, resize, polling order, notification requests with
// every token kind, solicited-only notification, cancellation, destroy and
// overflow.
#include "verbs_fixture.hpp"

#include <coroutine>
#include <exception>
#include <future>
#include <thread>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;
class cq_test : public conformance_test {
 protected:
  // Puts `n` flush completions (wr_id 1..n) on `p.cq_a` by posting to an ERR QP.
  static void flush_completions(const pair& p, std::size_t n) {
    qp_attr e;
    e.state = qp_state::err;
    p.a.modify(e, qp_attr_state);
    for (std::size_t i = 1; i <= n; ++i) {
      send_wr w;
      w.wr_id = i;
      w.opcode = wr_opcode::send;
      w.flags = send_signaled;
      ASSERT_FALSE(p.a.post_send(w));
    }
  }

  // One zero-length SEND from a to b (b must have a receive posted).
  static std::error_code send_one(const pair& p, std::uint64_t wr_id, std::uint32_t flags) {
    send_wr w;
    w.wr_id = wr_id;
    w.opcode = wr_opcode::send;
    w.flags = flags;
    return p.a.post_send(w);
  }
};

std::error_code post_empty_recv(const qp& q, std::uint64_t wr_id) {
  recv_wr r;
  r.wr_id = wr_id;
  return q.post_recv(r);
}

// ---------------------------------------------------------------------------
// Create and resize

TEST_F(cq_test, create_with_1_half_and_max_cqe_entries) {
  const std::uint32_t max = dev.query().max_cqe;
  ASSERT_EQ(max, 32767u);
  for (std::uint32_t n : {1u, max / 2, max}) {
    std::error_code ec;
    cq c = dev.create_cq(n, ec);
    ASSERT_FALSE(ec) << n << ": " << ec.message();
    EXPECT_EQ(c.cqe(), n);
    c.destroy();
  }
}

TEST_F(cq_test, create_with_0_entries_bad_flow) {
  std::error_code ec;
  cq c = dev.create_cq(0, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_FALSE(c);
}

TEST_F(cq_test, create_with_max_cqe_plus_1_bad_flow) {
  std::error_code ec;
  cq c = dev.create_cq(dev.query().max_cqe + 1, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_FALSE(c);
}

TEST_F(cq_test, resize_up_keeps_queued_completions_in_order) {
  auto p = connected_pair();
  flush_completions(p, 3);
  p.cq_a.resize(1000);
  EXPECT_EQ(p.cq_a.cqe(), 1000u);
  const auto v = drain(p.cq_a);
  ASSERT_EQ(v.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(wc_is(v[i], i + 1, wc_status::wr_flush_err));
}

TEST_F(cq_test, resize_below_the_queued_count_bad_flow) {
  auto p = connected_pair();
  flush_completions(p, 3);
  std::error_code ec;
  p.cq_a.resize(2, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_EQ(p.cq_a.cqe(), 256u);
  p.cq_a.resize(3, ec);  // exactly what is queued: allowed
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(drain(p.cq_a).size(), 3u);
}

TEST_F(cq_test, resize_to_0_or_above_max_cqe_bad_flow) {
  cq c = dev.create_cq(8);
  std::error_code ec;
  c.resize(0, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  c.resize(dev.query().max_cqe + 1, ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
  EXPECT_EQ(c.cqe(), 8u);
}

TEST_F(cq_test, resized_cq_holds_the_new_number_of_completions) {
  qp_options o;
  auto p = connect(o, o, 2, 256);
  p.cq_a.resize(4);
  auto src = make_buffer(8), remote = make_buffer(8);
  for (std::uint64_t id = 1; id <= 4; ++id)
    ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {src.whole()}, id, send_signaled, remote.addr(),
                           remote.m.rkey()));
  const auto v = drain(p.cq_a);
  ASSERT_EQ(v.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(wc_ok(v[i], i + 1, wc_opcode::rdma_write));
  EXPECT_EQ(count_events(event_type::cq_err), 0u);
  EXPECT_EQ(query_state(p.a), qp_state::rts);
}

// ---------------------------------------------------------------------------
// Polling

TEST_F(cq_test, poll_returns_the_oldest_completions_first_and_keeps_the_rest) {
  auto p = connected_pair();
  flush_completions(p, 5);
  work_completion wc[2];
  ASSERT_EQ(p.cq_a.poll(wc), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  const auto rest = drain(p.cq_a);
  ASSERT_EQ(rest.size(), 3u);
  EXPECT_EQ(rest[0].wr_id, 3u);
  EXPECT_EQ(rest[2].wr_id, 5u);
}

TEST_F(cq_test, two_qps_sharing_a_cq_are_told_apart_by_qp_num) {
  cq shared = dev.create_cq(16);
  cq other = dev.create_cq(16);
  qp_options o;
  qp a1 = make_qp(o, shared, shared), a2 = make_qp(o, shared, shared);
  qp b1 = make_qp(o, other, other), b2 = make_qp(o, other, other);
  bring_up(a1, o, b1.num());
  bring_up(b1, o, a1.num());
  bring_up(a2, o, b2.num());
  bring_up(b2, o, a2.num());
  auto src = make_buffer(8), remote = make_buffer(8);
  ASSERT_FALSE(post_send(a1, wr_opcode::rdma_write, {src.whole()}, 1, send_signaled, remote.addr(), remote.m.rkey()));
  ASSERT_FALSE(post_send(a2, wr_opcode::rdma_write, {src.whole()}, 2, send_signaled, remote.addr(), remote.m.rkey()));
  const auto v = drain(shared);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].wr_id, 1u);
  EXPECT_EQ(v[0].qp_num, a1.num());
  EXPECT_EQ(v[1].wr_id, 2u);
  EXPECT_EQ(v[1].qp_num, a2.num());
}

// ---------------------------------------------------------------------------
// Notification

TEST_F(cq_test, notify_completes_on_the_next_completion) {
  auto p = connected_pair();
  auto r = p.cq_b.async_notify(false, use_request);
  ctx->poll();
  EXPECT_FALSE(r.ready());
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(send_one(p, 2, send_signaled));
  EXPECT_TRUE(r.wait_for(0ns));
  std::error_code ec;
  r.get(ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(drain(p.cq_b).size(), 1u);  // the notification consumed nothing
}

// A notification's handler runs on the thread that asked for it; if that
// thread has exited the handler is dropped.  The notification completes
// under the device's lock, and a handler holding the last handle of a QP
// of that device must not be destroyed there (its destructor takes the
// lock: the post below deadlocked).  It is freed at the context's next
// poll, and the QP with it.
TEST_F(cq_test, a_dropped_notify_handler_holding_the_last_qp_handle_is_freed_outside_the_device_lock) {
  cq shared = dev.create_cq(16);
  qp_init_attr ia;
  ia.send_cq = shared;
  ia.recv_cq = shared;
  ia.cap = {4, 4, 1, 1, 0};
  ia.type = qp_type::rc;
  qp poster = pd_.create_qp(ia);
  const std::uint64_t before = dev.query().max_qp;  // the device answers at all
  {
    qp held = pd_.create_qp(ia);
    std::thread t([&, held]() mutable {
      shared.async_notify(false, [q = std::move(held)](std::error_code) {});
    });
    t.join();
  }  // the handler holds the only handle of `held` now
  poster.modify(init_attr({}), init_mask(qp_type::rc));
  qp_attr err_state;
  err_state.state = qp_state::err;
  poster.modify(err_state, qp_attr_state);
  ASSERT_FALSE(post_empty_recv(poster, 9));  // completes at once, flushed, and fires the notification
  ctx->poll();
  EXPECT_EQ(ctx->stats().handlers_dropped, 1u);
  EXPECT_EQ(ctx->stats().in_flight, 0u);
  EXPECT_EQ(dev.query().max_qp, before) << "the device still answers";
  EXPECT_EQ(drain(shared).size(), 1u);
}

TEST_F(cq_test, notify_ignores_completions_queued_before_it) {
  auto p = connected_pair();
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(post_empty_recv(p.b, 2));
  ASSERT_FALSE(send_one(p, 10, 0));
  EXPECT_TRUE(quiet(p.cq_a));
  auto r = p.cq_b.async_notify(false, use_request);  // one completion queued already
  ctx->poll();
  EXPECT_FALSE(r.wait_for(0ns));
  ASSERT_FALSE(send_one(p, 11, 0));
  EXPECT_TRUE(r.wait_for(0ns));
  EXPECT_EQ(drain(p.cq_b).size(), 2u);
}

TEST_F(cq_test, notify_is_one_shot) {
  auto p = connected_pair();
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(post_empty_recv(p.b, 2));
  auto r1 = p.cq_b.async_notify(false, use_request);
  ASSERT_FALSE(send_one(p, 10, 0));
  EXPECT_TRUE(r1.wait_for(0ns));
  r1.get();
  auto r2 = p.cq_b.async_notify(false, use_request);
  EXPECT_FALSE(r2.wait_for(0ns)) << "the first completion satisfied a later request";
  ASSERT_FALSE(send_one(p, 11, 0));
  EXPECT_TRUE(r2.wait_for(0ns));
}

TEST_F(cq_test, solicited_only_notify_completes_for_a_solicited_receive) {
  auto p = connected_pair();
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  auto r = p.cq_b.async_notify(true, use_request);
  ASSERT_FALSE(send_one(p, 10, send_signaled | send_solicited));
  EXPECT_TRUE(r.wait_for(0ns));
  std::error_code ec;
  r.get(ec);
  EXPECT_FALSE(ec);
}

TEST_F(cq_test, solicited_only_notify_ignores_unsolicited_and_send_completions) {
  auto p = connected_pair();
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(post_empty_recv(p.b, 2));
  auto rb = p.cq_b.async_notify(true, use_request);
  auto ra = p.cq_a.async_notify(true, use_request);  // the sender's CQ
  ASSERT_FALSE(send_one(p, 10, send_signaled));
  ctx->poll();
  EXPECT_EQ(drain(p.cq_b).size(), 1u);
  EXPECT_FALSE(rb.ready()) << "an unsolicited receive released a solicited-only request";
  EXPECT_FALSE(ra.ready()) << "a send completion counted as solicited";
  ASSERT_FALSE(send_one(p, 11, send_signaled | send_solicited));
  EXPECT_TRUE(rb.wait_for(0ns));
  EXPECT_FALSE(ra.ready()) << "send-side completions are never solicited";
  p.cq_a.cancel_notifies();
}

// ibv_req_notify_cq(3): a completion in error counts as solicited.  A
// receiver waiting for a solicited message hears of its QP failing.
TEST_F(cq_test, solicited_only_notify_completes_for_a_completion_in_error) {
  auto p = connected_pair();
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  auto r = p.cq_b.async_notify(true, use_request);
  ctx->poll();
  ASSERT_FALSE(r.ready());
  qp_attr at;
  at.state = qp_state::err;
  p.b.modify(at, qp_attr_state);
  EXPECT_TRUE(r.wait_for(0ns)) << "the flushed receive did not release a solicited-only request";
  const auto wcs = drain(p.cq_b);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, wc_status::wr_flush_err);
}

TEST_F(cq_test, solicited_write_with_imm_releases_a_solicited_only_request) {
  auto p = connected_pair();
  auto src = make_buffer(64), remote = make_buffer(64);
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  auto r = p.cq_b.async_notify(true, use_request);
  std::vector<sge> sg{src.whole()};
  send_wr w = make_wr(wr_opcode::rdma_write_with_imm, sg, 10, send_signaled | send_solicited, remote.addr(),
                      remote.m.rkey());
  w.imm_data = net32(1);
  ASSERT_FALSE(p.a.post_send(w));
  EXPECT_TRUE(r.wait_for(0ns));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_b), 1, wc_opcode::recv_rdma_with_imm));
}

TEST_F(cq_test, a_normal_notify_completes_on_a_solicited_receive_too) {
  auto p = connected_pair();
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  auto r = p.cq_b.async_notify(false, use_request);
  ASSERT_FALSE(send_one(p, 10, send_solicited));
  EXPECT_TRUE(r.wait_for(0ns));
}

TEST_F(cq_test, one_completion_releases_every_parked_notify_it_satisfies) {
  auto p = connected_pair();
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  auto r1 = p.cq_b.async_notify(false, use_request);
  auto r2 = p.cq_b.async_notify(false, use_request);
  auto r3 = p.cq_b.async_notify(false, use_request);
  auto rs = p.cq_b.async_notify(true, use_request);
  ASSERT_FALSE(send_one(p, 10, 0));
  EXPECT_TRUE(r1.wait_for(0ns));
  EXPECT_TRUE(r2.wait_for(0ns));
  EXPECT_TRUE(r3.wait_for(0ns));
  EXPECT_FALSE(rs.ready()) << "an unsolicited completion released a solicited-only request";
  EXPECT_EQ(p.cq_b.cancel_notifies(), 1u);
}

TEST_F(cq_test, cancel_notifies_completes_them_with_operation_aborted) {
  auto p = connected_pair();
  auto r1 = p.cq_b.async_notify(false, use_request);
  auto r2 = p.cq_b.async_notify(true, use_request);
  EXPECT_EQ(p.cq_b.cancel_notifies(), 2u);
  std::error_code ec;
  EXPECT_TRUE(r1.wait_for(0ns));
  r1.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::operation_aborted));
  EXPECT_TRUE(r2.wait_for(0ns));
  r2.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::operation_aborted));
  // Cancelled requests are gone: a later completion finds a fresh request only.
  auto r3 = p.cq_b.async_notify(false, use_request);
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(send_one(p, 10, 0));
  EXPECT_TRUE(r3.wait_for(0ns));
  r3.get(ec);
  EXPECT_FALSE(ec);
}

TEST_F(cq_test, request_cancel_aborts_one_notify) {
  auto p = connected_pair();
  auto r1 = p.cq_b.async_notify(false, use_request);
  auto r2 = p.cq_b.async_notify(false, use_request);
  EXPECT_TRUE(r1.cancel());
  std::error_code ec;
  r1.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::operation_aborted));
  EXPECT_FALSE(r2.ready());
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(send_one(p, 10, 0));
  EXPECT_TRUE(r2.wait_for(0ns));
  r2.get(ec);
  EXPECT_FALSE(ec);
}

// --- every token kind --------------------------------------------------------

TEST_F(cq_test, notify_with_a_callback_runs_it_in_an_alertable_wait) {
  auto p = connected_pair();
  int calls = 0;
  std::error_code got = make_error_code(errc::timed_out);
  p.cq_b.async_notify(false, [&](std::error_code ec) {
    ++calls;
    got = ec;
  });
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(send_one(p, 10, 0));
  ctx->poll();
  EXPECT_EQ(calls, 0) << "a handler ran outside an alertable wait";
  EXPECT_EQ(ctx->alertable_wait(0ns), 1u);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(got);
}

TEST_F(cq_test, notify_bound_to_a_port_queues_one_entry) {
  auto p = connected_pair();
  completion_port port(*ctx);
  p.cq_b.async_notify(false, bind_port(port, 42));
  std::array<completion_entry, 2> e;
  EXPECT_EQ(port.get(e, 0ns), 0u);
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(send_one(p, 10, 0));
  ASSERT_EQ(port.get(e, 0ns), 1u);
  EXPECT_EQ(e[0].key(), 42u);
  EXPECT_FALSE(e[0].error());
  EXPECT_EQ(port.get(e, 0ns), 0u);
}

TEST_F(cq_test, notify_with_a_future_becomes_ready) {
  auto p = connected_pair();
  std::future<void> f = p.cq_b.async_notify(false, use_future);
  ctx->poll();
  EXPECT_EQ(f.wait_for(0s), std::future_status::timeout);
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(send_one(p, 10, 0));
  ctx->poll();
  ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
  EXPECT_NO_THROW(f.get());
}

struct detached_task {
  struct promise_type {
    detached_task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

detached_task await_notify(cq c, int* resumed) {
  co_await c.async_notify(false, use_awaitable);
  *resumed = 1;
}

TEST_F(cq_test, notify_awaited_resumes_the_coroutine_in_an_alertable_wait) {
  auto p = connected_pair();
  int resumed = 0;
  await_notify(p.cq_b, &resumed);
  EXPECT_EQ(resumed, 0);
  ASSERT_FALSE(post_empty_recv(p.b, 1));
  ASSERT_FALSE(send_one(p, 10, 0));
  ctx->poll();
  EXPECT_EQ(resumed, 0) << "resumed outside an alertable wait";
  ctx->alertable_wait(0ns);
  EXPECT_EQ(resumed, 1);
}

// ---------------------------------------------------------------------------
// Destroy

TEST_F(cq_test, destroy_while_a_qp_uses_it_bad_flow) {
  auto p = connected_pair();
  std::error_code ec;
  p.cq_a.destroy(ec);
  EXPECT_EQ(ec, make_error_code(errc::busy));
  p.a.destroy();
  p.cq_a.destroy(ec);
  EXPECT_FALSE(ec) << ec.message();
}

TEST_F(cq_test, destroy_aborts_parked_notifies) {
  cq c = dev.create_cq(4);
  auto r = c.async_notify(false, use_request);
  c.destroy();
  EXPECT_TRUE(r.wait_for(0ns));
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::operation_aborted));
}

// ---------------------------------------------------------------------------
// Overflow

TEST_F(cq_test, receive_cq_overflow_raises_cq_err_and_moves_the_qp_to_err) {
  qp_options o;
  auto p = connect(o, o, 256, 2);
  for (std::uint64_t id = 1; id <= 3; ++id) ASSERT_FALSE(post_empty_recv(p.b, id));
  for (std::uint64_t id = 1; id <= 3; ++id) ASSERT_FALSE(send_one(p, 10 + id, 0));
  EXPECT_EQ(count_events(event_type::cq_err), 1u);
  EXPECT_EQ(query_state(p.b), qp_state::err);
  const auto v = drain(p.cq_b);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_ok(v[0], 1, wc_opcode::recv));
  EXPECT_TRUE(wc_ok(v[1], 2, wc_opcode::recv));
  EXPECT_EQ(dev.counters().cq_overflows, 1u);
}

TEST_F(cq_test, send_cq_overflow_raises_cq_err_and_moves_the_qp_to_err) {
  qp_options o;
  auto p = connect(o, o, 2, 256);
  auto src = make_buffer(8), remote = make_buffer(8);
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {src.whole()}, id, send_signaled, remote.addr(),
                           remote.m.rkey()));
  EXPECT_EQ(count_events(event_type::cq_err), 1u);
  EXPECT_EQ(query_state(p.a), qp_state::err);
  const auto v = drain(p.cq_a);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(wc_ok(v[0], 1, wc_opcode::rdma_write));
  EXPECT_TRUE(wc_ok(v[1], 2, wc_opcode::rdma_write));
}

TEST_F(cq_test, an_overflowed_cq_accepts_no_more_completions) {
  qp_options o;
  auto p = connect(o, o, 2, 256);
  auto src = make_buffer(8), remote = make_buffer(8);
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {src.whole()}, id, send_signaled, remote.addr(),
                           remote.m.rkey()));
  EXPECT_EQ(drain(p.cq_a).size(), 2u);
  ASSERT_FALSE(send_one(p, 4, send_signaled));  // the QP is in ERR: a flush completion
  EXPECT_TRUE(drain(p.cq_a).empty()) << "docs/verbs.md: an overflowed CQ stops accepting completions";
  EXPECT_EQ(count_events(event_type::cq_err), 1u) << "cq_err is raised once";
  // Nor does it notify: arming it fails at once instead of waiting forever.
  auto r = p.cq_a.async_notify(false, use_request);
  ASSERT_TRUE(r.ready()) << "the notification of an overflowed CQ was parked";
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_state));
}

// A notification parked before the CQ overflows, for solicited events
// only (so the successful completions that fill the CQ do not complete
// it), fails with invalid_state at the overflow: it could never come, and
// it used to wait forever (helper-116 #2).
TEST_F(cq_test, a_notification_parked_before_an_overflow_fails_with_it) {
  qp_options o;
  auto p = connect(o, o, 2, 256);
  auto parked = p.cq_a.async_notify(true, use_request);
  auto src = make_buffer(8), remote = make_buffer(8);
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {src.whole()}, id, send_signaled, remote.addr(),
                           remote.m.rkey()));
  EXPECT_EQ(drain(p.cq_a).size(), 2u);
  EXPECT_EQ(count_events(event_type::cq_err), 1u);
  ASSERT_TRUE(parked.ready()) << "the notification still waits on an overflowed CQ";
  std::error_code ec;
  parked.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::invalid_state));
}

// A port entry can hold the last handle of a CQ; dequeuing the next batch
// into the same array destroys it, and the CQ's teardown completes its
// parked notification into this port.  That must not happen under the
// port's lock (it deadlocked: push_request took the lock again).  Run in a
// thread with a watchdog: a deadlock fails the test, not the whole run.
TEST_F(cq_test, reusing_a_port_entry_that_holds_the_last_cq_handle_does_not_deadlock) {
  completion_port port(*ctx);
  std::promise<std::size_t> done;
  auto result = done.get_future();
  std::thread t([&] {
    completion_entry e[4];
    dev.async_create_cq(16, bind_port(port, 1));
    if (port.get(e, 1s) != 1 || e[0].result<cq>() == nullptr) {
      done.set_value(0);
      return;
    }
    e[0].result<cq>()->async_notify(false, bind_port(port, 2));  // parked: nothing completes
    port.post(9);
    std::size_t got = port.get(e, 1s);  // resets e[0]: the CQ goes, its notification aborts into the port
    if (got < 2) got += port.get(std::span(e + 1, 3), 1s);
    done.set_value(got);
  });
  if (result.wait_for(20s) != std::future_status::ready) {
    ADD_FAILURE() << "completion_port::get deadlocked";
    std::fflush(nullptr);
    std::_Exit(1);
  }
  t.join();
  EXPECT_EQ(result.get(), 2u) << "the posted packet and the aborted notification";
}

}  // namespace
}  // namespace averbs::test
