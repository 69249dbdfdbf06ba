// SPDX-License-Identifier: MIT
// Asynchronous events (IBTA 11.6.3; docs/verbs.md "Completion queues and
// events"): which conditions raise which event for which element, and how
// device::async_get_event delivers them (parked before, queued before,
// exactly one request per event, cancellation).
#include "verbs_fixture.hpp"

namespace averbs::test {
namespace {

using namespace std::chrono_literals;
using events_test = conformance_test;

qp_attr state_attr(qp_state s) {
  qp_attr a;
  a.state = s;
  return a;
}

// ---------------------------------------------------------------------------
// QP events

TEST_F(events_test, comm_est_on_the_first_packet_received_in_rtr) {
  qp_options o;
  cq ca = dev.create_cq(16), cb = dev.create_cq(16);
  qp a = make_qp(o, ca, ca), b = make_qp(o, cb, cb);
  bring_up(a, o, b.num(), 100, 200);
  bring_to_rtr(b, o, a.num(), 200);
  auto src = make_buffer(32), dst = make_buffer(32);
  ASSERT_FALSE(post_recv(b, {dst.whole()}, 1));
  ASSERT_FALSE(post_recv(b, {dst.whole()}, 2));
  EXPECT_EQ(count_events(event_type::comm_est), 0u);
  ASSERT_FALSE(post_send(a, wr_opcode::send, {src.whole()}, 3));
  EXPECT_EQ(count_events(event_type::comm_est, b.num()), 1u);
  EXPECT_TRUE(wc_ok(poll_one(ca), 3, wc_opcode::send)) << "an RTR responder acknowledges";
  EXPECT_TRUE(wc_ok(poll_one(cb), 1, wc_opcode::recv));
  ASSERT_FALSE(post_send(a, wr_opcode::send, {src.whole()}, 4));
  EXPECT_TRUE(wc_ok(poll_one(cb), 2, wc_opcode::recv));
  EXPECT_EQ(count_events(event_type::comm_est), 1u) << "raised once";
  EXPECT_EQ(query_state(b), qp_state::rtr);
}

TEST_F(events_test, no_comm_est_for_a_ud_qp_receiving_in_rtr) {
  qp_options o;
  o.type = qp_type::ud;
  cq ca = dev.create_cq(16), cb = dev.create_cq(16);
  qp a = make_qp(o, ca, ca), b = make_qp(o, cb, cb);
  bring_up(a, o, 0, 0, 100);
  bring_to_rtr(b, o, 0, 0);
  auto src = make_buffer(32), dst = make_buffer(40 + 32);
  ASSERT_FALSE(post_recv(b, {dst.whole()}, 1));
  ah h = make_ah();
  ASSERT_FALSE(post_ud(a, h, b.num(), ud_qkey, {src.whole()}, 2));
  EXPECT_TRUE(wc_ok(poll_one(cb), 1, wc_opcode::recv)) << "an RTR UD QP receives";
  EXPECT_EQ(count_events(event_type::comm_est), 0u);
}

TEST_F(events_test, no_comm_est_for_traffic_in_rts) {
  auto p = connected_pair();
  auto src = make_buffer(32), dst = make_buffer(32);
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 1));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 2));
  EXPECT_TRUE(wc_ok(poll_one(p.cq_b), 1, wc_opcode::recv));
  EXPECT_EQ(count_events(event_type::comm_est), 0u);
}

TEST_F(events_test, sq_drained_when_moved_to_sqd_with_en_sqd_async_notify) {
  auto p = connected_pair();
  qp_attr a = state_attr(qp_state::sqd);
  a.en_sqd_async_notify = true;
  p.a.modify(a, qp_attr_state | qp_attr_en_sqd_async_notify);
  EXPECT_EQ(query_state(p.a), qp_state::sqd);
  EXPECT_EQ(count_events(event_type::sq_drained, p.a.num()), 1u);
  EXPECT_EQ(count_events(event_type::sq_drained), 1u);
}

TEST_F(events_test, no_sq_drained_without_en_sqd_async_notify) {
  // docs/verbs.md: as the IBTA says (rxe raises it always).
  auto p = connected_pair();
  p.a.modify(state_attr(qp_state::sqd), qp_attr_state);
  EXPECT_EQ(query_state(p.a), qp_state::sqd);
  EXPECT_EQ(count_events(event_type::sq_drained), 0u);
}

TEST_F(events_test, the_sq_drained_request_belongs_to_one_move_to_sqd) {
  // IBTA 11.2.5: the event is requested with the RTS -> SQD move; a later
  // drain that does not ask gets none.
  auto p = connected_pair();
  qp_attr a = state_attr(qp_state::sqd);
  a.en_sqd_async_notify = true;
  p.a.modify(a, qp_attr_state | qp_attr_en_sqd_async_notify);
  EXPECT_EQ(count_events(event_type::sq_drained, p.a.num()), 1u);
  p.a.modify(state_attr(qp_state::rts), qp_attr_state);
  p.a.modify(state_attr(qp_state::sqd), qp_attr_state);
  EXPECT_EQ(query_state(p.a), qp_state::sqd);
  EXPECT_EQ(count_events(event_type::sq_drained), 1u) << "the second drain did not ask";
  EXPECT_FALSE(p.a.query().en_sqd_async_notify);
}

TEST_F(events_test, sq_drained_waits_for_the_outstanding_send_to_complete) {
  // A SEND held back by RNR NAKs is still in flight when the QP moves to
  // SQD; the drain ends when it completes (IBTA 10.3.1: SQD finishes the
  // messages in progress, retransmissions included).
  auto p = connected_pair();
  auto src = make_buffer(32), dst = make_buffer(32);
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {src.whole()}, 1));
  EXPECT_TRUE(drain(p.cq_a).empty());
  qp_attr a = state_attr(qp_state::sqd);
  a.en_sqd_async_notify = true;
  p.a.modify(a, qp_attr_state | qp_attr_en_sqd_async_notify);
  EXPECT_EQ(count_events(event_type::sq_drained), 0u) << "drained while a SEND was outstanding";
  EXPECT_TRUE(p.a.query().sq_draining);
  ASSERT_FALSE(post_recv(p.b, {dst.whole()}, 2));
  const auto v = poll(p.cq_a, 1, 1ms);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_TRUE(wc_ok(v[0], 1, wc_opcode::send));
  EXPECT_EQ(count_events(event_type::sq_drained, p.a.num()), 1u);
  EXPECT_FALSE(p.a.query().sq_draining);
}

TEST_F(events_test, qp_access_err_on_the_responder_after_a_remote_access_error) {
  auto p = connected_pair();
  auto local = make_buffer(16), remote = make_buffer(16);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {local.whole()}, 1, send_signaled, remote.addr(),
                         inc_rkey(remote.m.rkey())));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 1, wc_status::rem_access_err));
  EXPECT_EQ(count_events(event_type::qp_access_err, p.b.num()), 1u);
  EXPECT_EQ(count_events(event_type::qp_access_err), 1u);
  EXPECT_EQ(count_events(event_type::qp_req_err), 0u);
}

TEST_F(events_test, qp_req_err_on_the_responder_after_an_invalid_request) {
  qp_options ob;
  ob.access = access_local_write;
  auto p = connect(qp_options{}, ob);
  auto local = make_buffer(16), remote = make_buffer(16);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_read, {local.whole()}, 1, send_signaled, remote.addr(),
                         remote.m.rkey()));
  EXPECT_TRUE(wc_is(poll_one(p.cq_a), 1, wc_status::rem_inv_req_err));
  EXPECT_EQ(count_events(event_type::qp_req_err, p.b.num()), 1u);
  EXPECT_EQ(count_events(event_type::qp_req_err), 1u);
  EXPECT_EQ(count_events(event_type::qp_access_err), 0u);
}

TEST_F(events_test, qp_last_wqe_reached_when_an_srq_qp_enters_err) {
  srq s = pd_.create_srq({8, 1, 0});
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  p.b.modify(state_attr(qp_state::err), qp_attr_state);
  EXPECT_EQ(count_events(event_type::qp_last_wqe_reached, p.b.num()), 1u);
  p.a.modify(state_attr(qp_state::err), qp_attr_state);  // no SRQ: no event
  EXPECT_EQ(count_events(event_type::qp_last_wqe_reached), 1u);
}

// An SRQ in the slot a destroyed one freed has a number of its own, as a
// CQ has: an srq_limit_reached event of the old one, read late, cannot
// name it (helper-116 #1).
TEST_F(events_test, an_srq_in_a_freed_slot_is_named_by_a_number_of_its_own) {
  srq first = pd_.create_srq({8, 1, 0});
  const std::uint32_t old = first.handle();
  first.destroy();
  srq next = pd_.create_srq({8, 1, 0});
  EXPECT_NE(next.handle(), old);
  EXPECT_NE(next.handle(), 0u);
}

TEST_F(events_test, srq_limit_reached_once) {
  srq s = pd_.create_srq({8, 1, 0});
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  recv_wr r;
  for (std::uint64_t i = 1; i <= 3; ++i) {
    r.wr_id = i;
    ASSERT_FALSE(s.post_recv(r));
  }
  s.modify({0, 0, 3}, static_cast<std::uint32_t>(srq_attr_mask::limit));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {}, 1));
  ASSERT_FALSE(post_send(p.a, wr_opcode::send, {}, 2));
  EXPECT_EQ(poll(p.cq_b, 2).size(), 2u);
  EXPECT_EQ(count_events(event_type::srq_limit_reached), 1u);
  EXPECT_NE(s.handle(), 0u);
  EXPECT_EQ(count_events(event_type::srq_limit_reached, s.handle()), 1u) << "the event names the SRQ";
}

TEST_F(events_test, cq_err_when_a_cq_overflows) {
  qp_options o;
  auto p = connect(o, o, 1, 256);
  auto src = make_buffer(8), remote = make_buffer(8);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {src.whole()}, 1, send_signaled, remote.addr(), remote.m.rkey()));
  EXPECT_EQ(count_events(event_type::cq_err), 0u);
  ASSERT_FALSE(post_send(p.a, wr_opcode::rdma_write, {src.whole()}, 2, send_signaled, remote.addr(), remote.m.rkey()));
  EXPECT_EQ(count_events(event_type::cq_err), 1u);
  EXPECT_NE(p.cq_a.handle(), p.cq_b.handle());
  EXPECT_NE(p.cq_a.handle(), 0u);
  EXPECT_EQ(count_events(event_type::cq_err, p.cq_a.handle()), 1u) << "the event names the CQ that overflowed";
  EXPECT_EQ(query_state(p.a), qp_state::err);
}

// An event still queued for a CQ when it is destroyed goes with it (the
// kernel drops a destroyed object's events): the next CQ, which takes the
// freed slot and so the same number, must not read it as its own.  A
// second handle, whose events nobody reads meanwhile, holds them.
TEST_F(events_test, a_destroyed_cqs_unread_event_does_not_name_the_next_cq_in_its_slot) {
  device d2 = open_device(*ctx, dev.name());
  pd p2 = d2.alloc_pd();
  cq small = d2.create_cq(1), rcq = d2.create_cq(16);
  qp_init_attr ia;
  ia.send_cq = small;
  ia.recv_cq = rcq;
  ia.cap = {16, 16, 1, 1, 0};
  qp a = p2.create_qp(ia);
  qp_options o;
  auto b_cq = dev.create_cq(16);
  qp b = make_qp(o, b_cq, b_cq);
  bring_up(a, o, b.num(), 100, 200);
  bring_up(b, o, a.num(), 200, 100);
  auto src = make_buffer(8), remote = make_buffer(8);
  for (std::uint64_t i = 1; i <= 2; ++i)
    ASSERT_FALSE(
        post_send(a, wr_opcode::rdma_write, {src.whole()}, i, send_signaled, remote.addr(), remote.m.rkey()));
  (void)poll(b_cq, 1);  // (drives the device)
  ASSERT_EQ(query_state(a), qp_state::err) << "the CQ did not overflow: nothing to check";
  const std::uint32_t old = small.handle();
  a.destroy();
  small.destroy();
  cq again = d2.create_cq(4);  // in the freed slot
  // Its number is its own: an event delivered before the destroy, read
  // after, cannot name it (helper-116 #1).
  EXPECT_NE(again.handle(), old);
  EXPECT_NE(again.handle(), 0u);
  auto r = d2.async_get_event(use_request);
  d2.cancel_events();
  std::error_code ec;
  const async_event ev = r.get(ec);
  EXPECT_FALSE(!ec && ev.type == event_type::cq_err && (ev.element == again.handle() || ev.element == old))
      << "the destroyed CQ's queued overflow was delivered";
}

// A handle whose events nobody reads fills its queue; the device's removal
// still reaches it: device_fatal has the queue's last place.
TEST_F(events_test, device_fatal_arrives_after_a_full_queue_of_unread_events) {
  device d2 = open_device(*ctx, dev.name());
  for (int i = 0; i < 5000; ++i)
    dev_holder->set_port_state(i % 2 == 0 ? port_state::down : port_state::active);
  dev_holder.reset();
  async_event last{};
  std::size_t got = 0;
  for (;;) {
    std::error_code ec;
    const async_event ev = d2.get_event(ec);
    if (ec) break;
    last = ev;
    ++got;
  }
  EXPECT_GT(got, 4000u);
  EXPECT_EQ(last.type, event_type::device_fatal) << "after " << got << " events";
}

// On removal device_fatal is a handle's first event (device.hpp), ahead of
// the LAST_WQE_REACHED its QPs on an SRQ raise as they go to ERR.
TEST_F(events_test, removal_raises_device_fatal_before_the_qps_events) {
  srq s = pd_.create_srq({8, 1, 0});
  qp_options o;
  auto p = connect(o, o, 256, 256, s);
  auto first = dev.async_get_event(use_request);
  dev_holder.reset();
  std::error_code ec;
  const async_event ev = first.get(ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(ev.type, event_type::device_fatal);
}

// ---------------------------------------------------------------------------
// Port events

TEST_F(events_test, port_err_and_port_active_follow_the_port_state) {
  dev_holder->set_port_state(port_state::down);
  EXPECT_EQ(dev.query_port(1).state, port_state::down);
  EXPECT_EQ(count_events(event_type::port_err, 1), 1u);
  dev_holder->set_port_state(port_state::active);
  EXPECT_EQ(dev.query_port(1).state, port_state::active);
  EXPECT_EQ(count_events(event_type::port_active, 1), 1u);
  const auto& v = events();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].type, event_type::port_err);
  EXPECT_EQ(v[1].type, event_type::port_active);
}

TEST_F(events_test, setting_the_same_port_state_raises_nothing) {
  dev_holder->set_port_state(port_state::active);
  EXPECT_TRUE(events().empty());
}

// ---------------------------------------------------------------------------
// Delivery

TEST_F(events_test, a_request_parked_before_the_event_completes_with_it) {
  auto r = dev.async_get_event(use_request);
  ctx->poll();
  EXPECT_FALSE(r.ready());
  dev_holder->set_port_state(port_state::down);
  ASSERT_TRUE(r.wait_for(0ns));
  const async_event ev = r.get();
  EXPECT_EQ(ev.type, event_type::port_err);
  EXPECT_EQ(ev.element, 1u);
}

TEST_F(events_test, events_queued_before_parking_are_delivered_in_order) {
  dev_holder->set_port_state(port_state::down);
  dev_holder->set_port_state(port_state::active);
  dev_holder->set_port_state(port_state::down);
  auto r1 = dev.async_get_event(use_request);
  auto r2 = dev.async_get_event(use_request);
  auto r3 = dev.async_get_event(use_request);
  auto r4 = dev.async_get_event(use_request);
  ASSERT_TRUE(r1.wait_for(0ns));
  ASSERT_TRUE(r2.wait_for(0ns));
  ASSERT_TRUE(r3.wait_for(0ns));
  EXPECT_FALSE(r4.wait_for(0ns)) << "an event was delivered twice";
  EXPECT_EQ(r1.get().type, event_type::port_err);
  EXPECT_EQ(r2.get().type, event_type::port_active);
  EXPECT_EQ(r3.get().type, event_type::port_err);
  EXPECT_EQ(dev.cancel_events(), 1u);
}

TEST_F(events_test, each_event_completes_exactly_one_parked_request) {
  auto r1 = dev.async_get_event(use_request);
  auto r2 = dev.async_get_event(use_request);
  dev_holder->set_port_state(port_state::down);
  ctx->poll();
  EXPECT_EQ(int(r1.ready()) + int(r2.ready()), 1);
  dev_holder->set_port_state(port_state::active);
  EXPECT_TRUE(r1.wait_for(0ns));
  EXPECT_TRUE(r2.wait_for(0ns));
  EXPECT_EQ(r1.get().type, event_type::port_err) << "parked requests complete in the order they were parked";
  EXPECT_EQ(r2.get().type, event_type::port_active);
}

TEST_F(events_test, cancel_events_completes_parked_requests_with_operation_aborted) {
  auto r1 = dev.async_get_event(use_request);
  auto r2 = dev.async_get_event(use_request);
  EXPECT_EQ(dev.cancel_events(), 2u);
  std::error_code ec;
  ASSERT_TRUE(r1.wait_for(0ns));
  r1.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::operation_aborted));
  ASSERT_TRUE(r2.wait_for(0ns));
  r2.get(ec);
  EXPECT_EQ(ec, make_error_code(errc::operation_aborted));
}

TEST_F(events_test, an_event_raised_after_cancel_events_is_not_lost) {
  auto r1 = dev.async_get_event(use_request);
  EXPECT_EQ(dev.cancel_events(), 1u);
  dev_holder->set_port_state(port_state::down);  // nobody is waiting now
  auto r2 = dev.async_get_event(use_request);
  ASSERT_TRUE(r2.wait_for(0ns)) << "the event went to the cancelled request";
  EXPECT_EQ(r2.get().type, event_type::port_err);
}

TEST_F(events_test, an_event_raised_after_request_cancel_goes_to_the_next_request) {
  auto r1 = dev.async_get_event(use_request);
  auto r2 = dev.async_get_event(use_request);
  EXPECT_TRUE(r1.cancel());
  dev_holder->set_port_state(port_state::down);
  ASSERT_TRUE(r2.wait_for(0ns)) << "the event went to the cancelled request";
  EXPECT_EQ(r2.get().type, event_type::port_err);
}

// Each opened handle has its own events, as each ibv_context has: a port
// event reaches every handle, a QP's or CQ's only the handle that created
// it; closing one handle leaves the other's requests parked.
TEST_F(events_test, each_opened_handle_gets_port_events_and_its_own_objects_events) {
  auto parked = dev.async_get_event(use_request);
  {
    device other = open_device(*ctx, dev.name());
    auto theirs = other.async_get_event(use_request);
    dev_holder->set_port_state(port_state::down);
    ASSERT_TRUE(parked.wait_for(0ns));
    ASSERT_TRUE(theirs.wait_for(0ns)) << "a port event reaches every handle";
    EXPECT_EQ(parked.get().type, event_type::port_err);
    EXPECT_EQ(theirs.get().type, event_type::port_err);
    // Up again (a port that is down carries nothing): both handles hear it.
    dev_holder->set_port_state(port_state::active);
    EXPECT_EQ(dev.get_event().type, event_type::port_active);
    EXPECT_EQ(other.get_event().type, event_type::port_active);

    // The other handle's CQ overflows: the event is the other handle's.
    cq full = other.create_cq(1);
    pd other_pd = other.alloc_pd();
    qp_init_attr ia;
    ia.send_cq = full;
    ia.recv_cq = full;
    ia.cap = {16, 16, 1, 1, 0};
    ia.type = qp_type::rc;
    qp_options o;
    cq cb = dev.create_cq(16);
    qp a = other_pd.create_qp(ia), b = make_qp(o, cb, cb);
    bring_up(a, o, b.num(), 100, 200);
    bring_up(b, o, a.num(), 200, 100);
    std::vector<std::byte> mem(16);
    mr m = other_pd.reg_mr(mem.data(), mem.size(), access_local_write);
    auto remote = make_buffer(16);
    auto overflow = other.async_get_event(use_request);
    for (std::uint64_t id = 1; id <= 2; ++id) {
      const sge g{reinterpret_cast<std::uintptr_t>(mem.data()), 8, m.lkey()};
      ASSERT_FALSE(post_send(a, wr_opcode::rdma_write, {g}, id, send_signaled, remote.addr(), remote.m.rkey()));
    }
    for (int i = 0; i < 10000 && !overflow.ready(); ++i) ctx->poll();
    ASSERT_TRUE(overflow.ready());
    const async_event ev = overflow.get();
    EXPECT_EQ(ev.type, event_type::cq_err);
    EXPECT_EQ(ev.element, full.handle());
    EXPECT_EQ(count_events(event_type::cq_err), 0u) << "another handle's CQ";
    parked = dev.async_get_event(use_request);
    ctx->poll();
    ASSERT_FALSE(parked.ready());
  }  // the other handle and everything it made close
  ctx->poll();
  EXPECT_FALSE(parked.ready()) << "closing another handle completed this one's request";
  EXPECT_EQ(dev.cancel_events(), 2u) << "this one's and the fixture's are still parked";
}

TEST_F(events_test, get_event_with_a_callback_runs_it_in_an_alertable_wait) {
  int calls = 0;
  async_event got{};
  dev.async_get_event([&](std::error_code ec, async_event ev) {
    ++calls;
    if (!ec) got = ev;
  });
  dev_holder->set_port_state(port_state::down);
  ctx->poll();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(ctx->alertable_wait(0ns), 1u);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(got.type, event_type::port_err);
}

TEST_F(events_test, synchronous_get_event_returns_a_queued_event) {
  dev_holder->set_port_state(port_state::down);
  const async_event ev = dev.get_event();
  EXPECT_EQ(ev.type, event_type::port_err);
  EXPECT_EQ(ev.element, 1u);
}

}  // namespace
}  // namespace averbs::test
