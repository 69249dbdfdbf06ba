// SPDX-License-Identifier: MIT
// The connection manager on one in-process device with a manual clock:
// the connect / accept / reject / disconnect exchanges and the QP states
// they drive, every error the API promises, the timers (retransmission,
// MRA, timewait), and objects destroyed with requests pending.
#include "cm_fixture.hpp"
#include "counting_new.hpp"

#include <averbs/async.hpp>

#include <netinet/in.h>
#include <sys/socket.h>

#include <coroutine>
#include <future>
#include <set>

using namespace std::chrono_literals;

namespace averbs::test {
namespace {

cm::conn_params fast() {
  cm::conn_params p;
  p.cm_response_timeout = 10;  // 4.2 ms
  p.max_cm_retries = 3;
  return p;
}

TEST_F(cm_test, connect_accept_establishes_and_carries_private_data) {
  cm::listener l = cm::listen(dev, at(7471));
  qp a = make_qp(), b = make_qp();
  cm::connector active(dev);
  EXPECT_EQ(active.state(), cm::conn_state::idle);
  auto got = l.async_get_request(use_request);
  auto conn = active.async_connect(a, at(7471), bytes("hello"), use_request);
  EXPECT_EQ(active.state(), cm::conn_state::connecting);

  cm::connection_request req = got.get();
  EXPECT_EQ(req.local, at(7471));
  EXPECT_EQ(req.peer.ip, ip4);
  EXPECT_NE(req.peer.port, 0);
  EXPECT_EQ(req.type, qp_type::rc);
  ASSERT_EQ(req.private_data.size(), cm::max_connect_private_data);
  EXPECT_EQ(text(req.private_data, 5), "hello");
  EXPECT_EQ(req.private_data[5], std::byte{0});  // zero-padded, as on the wire
  EXPECT_EQ(req.responder_resources, 16);
  EXPECT_EQ(req.initiator_depth, 16);
  EXPECT_EQ(req.remote_qpn, a.num());
  EXPECT_EQ(req.conn.state(), cm::conn_state::requested);
  EXPECT_EQ(req.conn.peer_address(), req.peer);
  EXPECT_EQ(a.state(), qp_state::init);  // the active QP waits in INIT for the REP

  req.conn.accept(b, bytes("welcome"));
  cm::connect_result r = conn.get();
  ASSERT_EQ(r.private_data.size(), cm::max_accept_private_data);
  EXPECT_EQ(text(r.private_data, 7), "welcome");
  EXPECT_EQ(r.remote_qpn, b.num());
  EXPECT_EQ(r.responder_resources, 16);
  EXPECT_EQ(r.initiator_depth, 16);
  EXPECT_EQ(active.state(), cm::conn_state::established);
  EXPECT_EQ(req.conn.state(), cm::conn_state::established);
  EXPECT_EQ(a.state(), qp_state::rts);
  EXPECT_EQ(b.state(), qp_state::rts);
  EXPECT_EQ(active.peer_address(), at(7471));
  EXPECT_EQ(active.local_address(), req.peer);

  // The QPs were set up as the CM agreed: each other's numbers and PSNs.
  const qp_attr qa = a.query(), qb = b.query();
  EXPECT_EQ(qa.dest_qp_num, b.num());
  EXPECT_EQ(qb.dest_qp_num, a.num());
  EXPECT_EQ(qa.sq_psn, qb.rq_psn);
  EXPECT_EQ(qb.sq_psn, qa.rq_psn);
  EXPECT_EQ(qa.max_rd_atomic, 16);
  EXPECT_EQ(qb.max_dest_rd_atomic, 16);
  EXPECT_EQ(qa.timeout, 14);
  EXPECT_EQ(qb.timeout, 14);  // from the REQ's local ACK timeout
  EXPECT_TRUE(qa.qp_access_flags & access_remote_read);
  check_send(a, b);
  check_send(b, a);
}

TEST_F(cm_test, ipv6_connection) {
  cm::listener l = cm::listen(dev, at(7471, true));
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(7471, true), {}, use_request);
  cm::connection_request req = got.get();
  EXPECT_EQ(req.peer.ip, ip6);
  EXPECT_FALSE(req.peer.is_ipv4());
  req.conn.accept(b);
  conn.get();
  check_send(a, b);
}

TEST_F(cm_test, wildcard_listener_takes_both_addresses) {
  cm::address any;
  ASSERT_TRUE(cm::address::parse("[::]:9000", any));
  cm::listener l = cm::listen(dev, any);
  for (bool v6 : {false, true}) {
    qp a = make_qp(), b = make_qp();
    cm::connector c(dev);
    auto got = l.async_get_request(use_request);
    auto conn = c.async_connect(a, at(9000, v6), {}, use_request);
    cm::connection_request req = got.get();
    EXPECT_EQ(req.local, at(9000, v6));
    req.conn.accept(b);
    conn.get();
  }
}

TEST_F(cm_test, nothing_listening_is_refused_and_the_qp_stays_in_init) {
  qp a = make_qp();
  cm::connector c(dev);
  std::error_code ec;
  c.connect(a, at(1234), {}, {}, ec);
  EXPECT_EQ(ec, errc::connection_refused);
  EXPECT_EQ(c.reject_reason(), 8);  // invalid service ID
  EXPECT_EQ(c.state(), cm::conn_state::closed);
  EXPECT_EQ(a.state(), qp_state::init);
}

// accept() on the active side is invalid_state, also after its connect
// was refused (it used to return the REJ's connection_refused).
TEST_F(cm_test, accept_on_an_active_connector_is_invalid_state_after_a_refusal) {
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  std::error_code ec;
  c.connect(a, at(7999), {}, {}, ec);
  ASSERT_EQ(ec, errc::connection_refused);
  c.accept(b, {}, {}, ec);
  EXPECT_EQ(ec, errc::invalid_state) << ec.message();
}

// A REP taken short of memory (the connector keeps a copy of its private
// data) ends the connect without terminating the process: the copy used to
// throw out of a noexcept path.  Every allocation from the accept on fails
// in turn.
TEST_F(cm_test, a_rep_taken_short_of_memory_terminates_nothing) {
  cm::listener l = cm::listen(dev, at(7000));
  std::size_t connected = 0;
  for (std::uint64_t k = 1; k <= 40; ++k) {
    qp a = make_qp(), b = make_qp();
    cm::connector active(dev);
    auto got = l.async_get_request(use_request);
    auto conn = active.async_connect(a, at(7000), bytes("hello"), use_request);
    cm::connection_request req = got.get();
    const auto welcome = bytes("welcome");
    std::error_code accepted, ec;
    cm::connect_result r;
    fail_nth_allocation_on_this_thread(k);
    try {  // (the test's own allocations may be the ones that fail)
      auto accepting = req.conn.async_accept(b, welcome, {}, use_request);
      ctx->poll();
      (void)fail_nth_allocation_on_this_thread(0);
      for (int i = 0; i < 40 && !(conn.ready() && accepting.ready()); ++i)
        advance(std::chrono::milliseconds(500));  // resends, timeouts
      if (accepting.ready())
        accepting.get(accepted);
      else
        accepted = make_error_code(errc::timed_out);
      if (conn.ready())
        r = conn.get(ec);
      else
        ec = make_error_code(errc::timed_out);
    } catch (const std::bad_alloc&) {
      accepted = make_error_code(errc::no_resources);
    }
    (void)fail_nth_allocation_on_this_thread(0);
    if (!accepted && !ec) {
      ++connected;
      EXPECT_EQ(text(r.private_data, 7), "welcome") << k;
    }
    active.disconnect(ec);
    advance(std::chrono::seconds(1));
  }
  EXPECT_GT(connected, 0u);
}

// A REQ taken short of memory is dropped, as if lost (the requester
// resends), never handed to the application without its private data or
// connector (it used to come with neither).  Every allocation from the
// connect on fails in turn.
TEST_F(cm_test, a_req_taken_short_of_memory_arrives_whole_or_not_yet) {
  cm::listener l = cm::listen(dev, at(7000));
  std::size_t delivered = 0;
  for (std::uint64_t k = 1; k <= 40; ++k) {
    qp a = make_qp();
    cm::connector active(dev);
    auto got = l.async_get_request(use_request);
    const auto hello = bytes("hello");
    const cm::address to = at(7000);
    request<cm::connect_result> conn;
    fail_nth_allocation_on_this_thread(k);
    try {  // (the test's own allocations may be the ones that fail)
      conn = active.async_connect(a, to, hello, use_request);
      ctx->poll();
    } catch (const std::bad_alloc&) {
    }
    (void)fail_nth_allocation_on_this_thread(0);
    for (int i = 0; i < 20 && !got.ready(); ++i) advance(std::chrono::milliseconds(500));  // resends
    std::error_code ec;
    if (got.ready()) {
      cm::connection_request req = got.get(ec);
      if (!ec) {
        ++delivered;
        EXPECT_EQ(text(req.private_data, 5), "hello") << k;
        EXPECT_TRUE(static_cast<bool>(req.conn)) << k;
        req.conn.reject({}, ec);
      }
    } else {
      got.cancel();
    }
    std::error_code ignored;
    active.disconnect(ignored);
    advance(std::chrono::seconds(2));
  }
  EXPECT_GT(delivered, 0u);
}

TEST_F(cm_test, rejection_carries_the_applications_private_data) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp();
  cm::connector c(dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(7000), bytes("may I"), use_request);
  cm::connection_request req = got.get();
  req.conn.reject(bytes("no, busy"));
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::connection_rejected);
  EXPECT_EQ(c.reject_reason(), 28);  // consumer defined
  ASSERT_EQ(c.private_data().size(), cm::max_reject_private_data);
  EXPECT_EQ(text(c.private_data(), 8), "no, busy");
  EXPECT_EQ(req.conn.state(), cm::conn_state::closed);

  // The same connector and QP (left in INIT) try again.
  qp b = make_qp();
  auto again = l.async_get_request(use_request);
  auto conn2 = c.async_connect(a, at(7000), {}, use_request);
  cm::connector passive = again.get().conn;  // (dropping it would disconnect)
  passive.accept(b);
  conn2.get();
  check_send(a, b);
}

TEST_F(cm_test, an_unanswered_request_times_out_after_its_retries) {
  cm::listener l = cm::listen(dev, at(7000));
  sdev->set_faults("drop=1");
  qp a = make_qp();
  cm::connector c(dev);
  const auto sent0 = dev.counters().packets_sent;
  auto conn = c.async_connect(a, at(7000), {}, fast(), use_request);
  for (int i = 0; i < 3; ++i) {
    advance(4300us);
    EXPECT_FALSE(conn.ready()) << "retry " << i;
  }
  advance(4300us);
  ASSERT_TRUE(conn.ready());
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::timed_out);
  // REQ, three retransmissions, and a REJ (timeout) for a peer that might
  // have heard us.
  EXPECT_EQ(dev.counters().packets_sent - sent0, 5u);
  EXPECT_EQ(a.state(), qp_state::init);
}

TEST_F(cm_test, mra_keeps_a_slow_accept_alive) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, fast(), use_request);
  // Nobody takes the request.  Half the requester's timeout later the
  // listener's side asks for more time (MRA) ...
  advance(2100us);
  // ... so the requester neither resends nor gives up where it otherwise
  // would have (4 x 4.2 ms).
  for (int i = 0; i < 10; ++i) advance(5ms);
  EXPECT_FALSE(conn.ready());
  cm::connection_request req = l.get_request();
  req.conn.accept(b);
  conn.get();
  EXPECT_EQ(c.state(), cm::conn_state::established);
}

// A peer's timeout fields are capped (about 69 s a step): a REQ that
// allows 2.4 hours for an answer still gets its MRA after half the cap,
// not after 1.2 hours.
TEST_F(cm_test, a_peers_huge_timeout_is_capped) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp();
  cm::connector c(dev);
  cm::conn_params p;
  p.cm_response_timeout = 31;
  auto conn = c.async_connect(a, at(7000), {}, p, use_request);
  ctx->poll();
  const auto sent0 = dev.counters().packets_sent;
  advance(30s);
  EXPECT_EQ(dev.counters().packets_sent, sent0);
  advance(5s);
  EXPECT_EQ(dev.counters().packets_sent - sent0, 1u) << "the MRA";
  EXPECT_FALSE(conn.ready());
}

TEST_F(cm_test, a_request_nobody_takes_is_forgotten_once_the_requester_gave_up) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp();
  {
    cm::connector c(dev);
    auto conn = c.async_connect(a, at(7000), {}, fast(), use_request);
    advance(2100us);  // MRA
    // The requester abandons (its connector goes): REJ tells the listener.
  }
  ctx->poll();
  auto got = l.async_get_request(use_request);
  ctx->poll();
  EXPECT_FALSE(got.ready());
  got.cancel();
}

TEST_F(cm_test, disconnect_flushes_work_and_tells_the_peer) {
  cm::listener l = cm::listen(dev, at(7000));
  pair p = connect_pair(7000, l);
  auto notified = p.passive.async_notify_disconnect(use_request);
  std::vector<std::byte> buf(64);
  mr m = pd_.reg_mr(buf.data(), buf.size(), access_local_write);
  const sge s{reinterpret_cast<std::uintptr_t>(buf.data()), 64, m.lkey()};
  recv_wr r{42, &s, 1};
  ASSERT_FALSE(p.a.post_recv(r));
  ASSERT_FALSE(p.b.post_recv(r));

  p.active.disconnect();
  EXPECT_EQ(p.a.state(), qp_state::err);
  // The disconnect completed after the QP's work: its receive is flushed.
  work_completion wc[4];
  std::size_t n = cq_.poll(wc);
  ASSERT_GE(n, 1u);
  EXPECT_EQ(wc[0].wr_id, 42u);
  EXPECT_EQ(wc[0].status, wc_status::wr_flush_err);
  EXPECT_EQ(wc[0].qp_num, p.a.num());

  notified.get();  // the peer heard the DREQ
  EXPECT_EQ(p.b.state(), qp_state::err);
  if (n == 1) n += cq_.poll(std::span(wc + 1, 3));
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(wc[1].qp_num, p.b.num());
  EXPECT_EQ(wc[1].status, wc_status::wr_flush_err);

  EXPECT_EQ(p.active.state(), cm::conn_state::timewait);
  EXPECT_EQ(p.passive.state(), cm::conn_state::timewait);
  advance(100ms);
  EXPECT_EQ(p.active.state(), cm::conn_state::closed);
  EXPECT_EQ(p.passive.state(), cm::conn_state::closed);
  // Disconnecting again, and notifying after the fact, succeed at once.
  p.active.disconnect();
  p.active.notify_disconnect();
}

// A CM timer the device had no memory to queue is queued at the next pass,
// or, still short of memory then, fires at once: a connection whose
// timewait timer was lost used to stay in timewait for good.  Forty
// connections end at once on a thread whose allocations fail, more than
// the timer heap has room for.
class cm_memory_test : public cm_test {
 protected:
  static constexpr int n = 40;
  std::vector<pair> v;
  std::error_code ec[n];

  void TearDown() override {
    v.clear();  // before the context and device they refer to
    l_ = {};
    cm_test::TearDown();
  }

  /// Connects n pairs and disconnects them short of memory; returns how
  /// many disconnects started.
  int end_short_of_memory() {
    l_ = cm::listen(dev, at(7000));
    for (int i = 0; i < n; ++i) v.push_back(connect_pair(7000, l_));
    fail_allocations_on_this_thread(true);
    for (int i = 0; i < n; ++i) v[i].active.disconnect(ec[i]);
    fail_allocations_on_this_thread(false);
    int ended = 0;
    for (int i = 0; i < n; ++i) {
      if (ec[i]) continue;  // (no memory to start it: nothing changed)
      ++ended;
      EXPECT_NE(v[i].active.state(), cm::conn_state::established) << i;
    }
    return ended;
  }
  int closed() const {
    int c = 0;
    for (int i = 0; i < n; ++i)
      c += !ec[i] && v[i].active.state() == cm::conn_state::closed &&
           v[i].passive.state() == cm::conn_state::closed;
    return c;
  }

 private:
  cm::listener l_;
};

TEST_F(cm_memory_test, lost_timers_are_queued_at_the_next_pass) {
  const int ended = end_short_of_memory();
  ASSERT_GT(ended, 0) << "no disconnect could start: this test tested nothing";
  ASSERT_GT(dev.counters().timers_lost, 0u) << "no timer ran short of memory: this test tested nothing";
  for (int k = 0; k < 20; ++k) advance(300ms);  // timewait, or DREQ retries running out
  EXPECT_EQ(closed(), ended);
}

TEST_F(cm_memory_test, lost_timers_still_short_at_the_next_pass_fire_early) {
  const int ended = end_short_of_memory();
  ASSERT_GT(ended, 0) << "no disconnect could start: this test tested nothing";
  ASSERT_GT(dev.counters().timers_lost, 0u) << "no timer ran short of memory: this test tested nothing";
  fail_allocations_on_this_thread(true);
  ctx->poll();  // a pass that tries the lost timers again (the later disconnects ran some)
  fail_allocations_on_this_thread(false);
  // The clock has not moved (timewait lasts at least 1 ms): only timers
  // that fired early can have closed a connection.
  EXPECT_GT(closed(), 0) << "no lost timewait timer fired at the next pass";
  for (int k = 0; k < 20; ++k) advance(300ms);
  EXPECT_EQ(closed(), ended);
}

TEST_F(cm_test, disconnect_completes_when_the_peer_is_gone) {
  cm::listener l = cm::listen(dev, at(7000));
  pair p = connect_pair(7000, l);
  sdev->set_faults("drop=1");
  p.active.disconnect();  // does not wait for the DREP
  EXPECT_EQ(p.a.state(), qp_state::err);
  EXPECT_EQ(p.active.state(), cm::conn_state::disconnecting);
  for (int i = 0; i < 12; ++i) advance(300ms);  // DREQ retries run out
  EXPECT_NE(p.active.state(), cm::conn_state::disconnecting);
}

// A notification parked and then cancelled no longer holds the place: the
// next one parks (it used to fail with invalid_state for good).
TEST_F(cm_test, a_cancelled_disconnect_notification_does_not_block_the_next) {
  cm::listener l = cm::listen(dev, at(7000));
  pair p = connect_pair(7000, l);
  auto first = p.active.async_notify_disconnect(use_request);
  ctx->poll();
  ASSERT_FALSE(first.ready());
  first.cancel();
  auto second = p.active.async_notify_disconnect(use_request);
  ctx->poll();
  EXPECT_FALSE(second.ready());
  p.passive.disconnect();
  ASSERT_TRUE(second.wait_for(1s));
  std::error_code ec;
  second.get(ec);
  EXPECT_FALSE(ec) << ec.message();
}

// A connect cancelled before the reply: the REP that comes later is
// refused, the QP stays in INIT for another try, and the accepting side
// learns it was rejected.
TEST_F(cm_test, a_cancelled_connect_refuses_the_late_reply) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, fast(), use_request);
  ctx->poll();
  ASSERT_FALSE(conn.ready());
  conn.cancel();
  cm::connection_request req = l.get_request();
  auto accepted = req.conn.async_accept(b, {}, fast(), use_request);
  ASSERT_TRUE(accepted.wait_for(1s));
  std::error_code ec;
  accepted.get(ec);
  EXPECT_EQ(ec, errc::connection_rejected);
  EXPECT_EQ(a.state(), qp_state::init);
  EXPECT_NE(b.state(), qp_state::rts);
}

// A cancelled connect frees its QP and connector at once, not at its next
// resend: connecting again works, through the same connector or another,
// and the connector shows the connect ended.
TEST_F(cm_test, a_cancelled_connect_frees_its_qp_for_the_next_connect_at_once) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, fast(), use_request);
  ctx->poll();
  ASSERT_FALSE(conn.ready());
  conn.cancel();
  EXPECT_EQ(c.state(), cm::conn_state::closed);
  // The error a connect failed with at once, if it did.
  auto refused = [](request<cm::connect_result>& r) {
    std::error_code ec;
    if (r.ready()) (void)r.get(ec);
    return ec;
  };
  cm::connector c2(dev);
  auto again = c2.async_connect(a, at(7000), {}, fast(), use_request);  // no time has passed
  EXPECT_NE(refused(again), errc::invalid_state) << "the QP stayed with the cancelled connect";
  EXPECT_EQ(a.state(), qp_state::init);
  qp other = make_qp();
  auto third = c.async_connect(other, at(7000), {}, fast(), use_request);
  EXPECT_NE(refused(third), errc::invalid_state) << "the connector stayed busy";
}

// An accept cancelled while its REP is lost: the next resend does not go
// out; the requester hears a REJ instead.
TEST_F(cm_test, a_cancelled_accept_stops_resending_its_reply) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, fast(), use_request);
  cm::connection_request req = l.get_request();
  auto accepted = accept_losing_the_rep(req.conn, b, fast());
  ASSERT_FALSE(accepted.ready());
  accepted.cancel();
  sdev->set_faults("");
  for (int i = 0; i < 10 && !conn.ready(); ++i) advance(4300us);
  ASSERT_TRUE(conn.ready());
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::connection_rejected);
  EXPECT_NE(a.state(), qp_state::rts);
  EXPECT_EQ(b.state(), qp_state::err);
}

// A cancelled accept reads closed as soon as anyone looks, as a cancelled
// connect does, and its QP and the requester learn it then too: not only
// at the REP's next resend.
TEST_F(cm_test, a_cancelled_accept_ends_when_its_state_is_read) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, fast(), use_request);
  cm::connection_request req = l.get_request();
  auto accepted = accept_losing_the_rep(req.conn, b, fast());
  ASSERT_FALSE(accepted.ready());
  ASSERT_EQ(req.conn.state(), cm::conn_state::accepting);
  accepted.cancel();
  sdev->set_faults("");
  EXPECT_EQ(req.conn.state(), cm::conn_state::closed);
  EXPECT_EQ(b.state(), qp_state::err);
  for (int i = 0; i < 10 && !conn.ready(); ++i)
    ctx->poll();  // no time passes: the REJ went out with the look
  ASSERT_TRUE(conn.ready());
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::connection_rejected);
}

TEST_F(cm_test, notify_reports_a_reset_when_the_qp_fails) {
  cm::listener l = cm::listen(dev, at(7000));
  pair p = connect_pair(7000, l);
  auto notified = p.active.async_notify_disconnect(use_request);
  sdev->set_faults("drop=1");  // the peer vanishes
  std::vector<std::byte> buf(8);
  mr m = pd_.reg_mr(buf.data(), buf.size(), access_local_write);
  const sge s{reinterpret_cast<std::uintptr_t>(buf.data()), 8, m.lkey()};
  send_wr w;
  w.sg_list = &s;
  w.num_sge = 1;
  w.flags = send_signaled;
  ASSERT_FALSE(p.a.post_send(w));
  for (int i = 0; i < 20 && !notified.ready(); ++i) advance(100ms);
  ASSERT_TRUE(notified.ready());
  std::error_code ec;
  notified.get(ec);
  EXPECT_EQ(ec, errc::connection_reset);
  work_completion wc[2];
  ASSERT_EQ(cq_.poll(wc), 1u);
  EXPECT_EQ(wc[0].status, wc_status::retry_exc_err);
}

TEST_F(cm_test, closing_a_listener_aborts_parked_requests_and_refuses_waiting_ones) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, use_request);  // waits in the backlog
  auto got = l.async_get_request(use_request);                  // delivered at once
  cm::connection_request req = got.get();
  auto parked = l.async_get_request(use_request);
  cm::connector c2(dev);
  auto conn2 = c2.async_connect(make_qp(), at(7000), {}, use_request);
  (void)req;
  // conn2 was handed to `parked`; park one more and queue one more.
  cm::connection_request req2 = parked.get();
  auto parked2 = l.async_get_request(use_request);
  l.close();
  std::error_code ec;
  parked2.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
  // New connects find nobody.
  cm::connector late(dev);
  late.connect(make_qp(), at(7000), {}, {}, ec);
  EXPECT_EQ(ec, errc::connection_refused);
  // Requests handed out before the close can still be answered.
  req.conn.accept(make_qp());
  conn.get();
  req2.conn.reject();
  conn2.get(ec);
  EXPECT_EQ(ec, errc::connection_rejected);
}

TEST_F(cm_test, a_listener_closing_rejects_requests_still_in_its_backlog) {
  cm::listener l = cm::listen(dev, at(7000));
  cm::connector c(dev);
  auto conn = c.async_connect(make_qp(), at(7000), {}, use_request);
  ctx->poll();
  l = {};  // last copy: closes
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::connection_refused);
}

TEST_F(cm_test, destroying_the_qp_aborts_a_pending_connect) {
  cm::listener l = cm::listen(dev, at(7000));
  sdev->set_faults("drop=1");
  qp a = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, use_request);
  a.destroy();
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
  EXPECT_EQ(c.state(), cm::conn_state::closed);
}

// Destroying a connected QP without disconnecting: the CM sends a DREQ,
// after the ACK the QP still held for the peer's SEND that arrived (the
// peer's unsignaled SEND then completes quietly, not wr_flush_err), and the
// peer hears of it at once, not at the DREQ's resend.
TEST_F(cm_test, destroying_a_connected_qp_acknowledges_what_arrived_and_tells_the_peer_at_once) {
  cm::listener l = cm::listen(dev, at(7000));
  pair p = connect_pair(7000, l);
  const auto bufs = make_send_buffers(std::byte{0x3C});
  ASSERT_NO_FATAL_FAILURE(post_send_of(*bufs, p.a, p.b, 0));  // unsignaled: it completes only if it fails
  work_completion wc[4];
  std::size_t got = 0;
  for (int i = 0; i < 1000 && got == 0; ++i) got = cq_.poll(wc);
  ASSERT_EQ(got, 1u);
  ASSERT_EQ(wc[0].wr_id, 7u);
  ASSERT_EQ(wc[0].status, wc_status::success);
  auto told = p.active.async_notify_disconnect(use_request);
  p.b.destroy();
  EXPECT_TRUE(told.ready()) << "the DREQ waited for a later pass";
  for (int i = 0; i < 100; ++i) {
    const std::size_t n = cq_.poll(wc);
    for (std::size_t k = 0; k < n; ++k)
      ADD_FAILURE() << "wr " << wc[k].wr_id << ": " << to_string(wc[k].status) << " (the SEND had arrived)";
  }
  EXPECT_EQ(p.a.query().state, qp_state::err);
}

// A connection request delivered to a future nobody holds any more: its
// connector's last reference goes with the future's state, and the
// connector's release takes the device lock, which the completion holds.
TEST_F(cm_test, a_request_delivered_to_a_dropped_future_is_released_without_a_deadlock) {
  cm::listener l = cm::listen(dev, at(7000));
  { auto dropped = l.async_get_request(use_future); }
  qp a = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, use_request);
  for (int i = 0; i < 20; ++i) ctx->poll();  // the REQ is delivered to the dropped future
  // Nobody accepts: the connector released with the future rejected it, or
  // the connect is still waiting; either way the device still works.
  EXPECT_TRUE(conn.ready() || c.state() == cm::conn_state::connecting) << static_cast<int>(c.state());
  cm::listener l2 = cm::listen(dev, at(7001));
  pair p = connect_pair(7001, l2);
  check_send(p.a, p.b);
}

TEST_F(cm_test, destroying_the_qp_aborts_a_pending_accept) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(7000), {}, use_request);
  cm::connection_request req = got.get();
  sdev->set_faults("drop=1");  // the REP never arrives, nor the RTU
  auto acc = req.conn.async_accept(b, {}, use_request);
  EXPECT_FALSE(acc.ready());
  b.destroy();
  std::error_code ec;
  acc.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
  c.disconnect();
}

TEST_F(cm_test, dropping_the_connector_aborts_its_requests) {
  cm::listener l = cm::listen(dev, at(7000));
  sdev->set_faults("drop=1");
  qp a = make_qp();
  request<cm::connect_result> conn;
  {
    cm::connector c(dev);
    conn = c.async_connect(a, at(7000), {}, use_request);
  }
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
  // The QP is free for another connector.
  sdev->set_faults("");
  cm::connector c2(dev);
  auto got = l.async_get_request(use_request);
  auto conn2 = c2.async_connect(a, at(7000), {}, use_request);
  got.get().conn.accept(make_qp());
  conn2.get();
}

TEST_F(cm_test, bad_arguments_fail_with_specific_errors) {
  cm::listener l = cm::listen(dev, at(7000));
  std::error_code ec;
  qp a = make_qp();
  cm::connector c(dev);
  const std::vector<std::byte> too_long(cm::max_connect_private_data + 1);
  c.connect(a, at(7000), too_long, {}, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  c.connect(a, cm::address{}, {}, {}, ec);  // the wildcard
  EXPECT_EQ(ec, errc::invalid_argument);
  c.connect(a, at(0), {}, {}, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  cm::conn_params bad;
  bad.retry_count = 8;
  c.connect(a, at(7000), {}, bad, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  c.connect(qp{}, at(7000), {}, {}, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  // A QP of another device.
  soft_device other(soft_device_options{other_name(), &clock, {ip4}});
  device d2 = open_device(*ctx, other_name());
  pd p2 = d2.alloc_pd();
  cq c2 = d2.create_cq(16);
  qp_init_attr ia;
  ia.send_cq = ia.recv_cq = c2;
  ia.cap = {4, 4, 1, 1, 0};
  c.connect(p2.create_qp(ia), at(7000), {}, {}, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  // Not connected yet.
  c.disconnect(ec);
  EXPECT_EQ(ec, errc::not_connected);
  c.notify_disconnect(ec);
  EXPECT_EQ(ec, errc::not_connected);
  c.accept(a, {}, {}, ec);  // an active connector has nothing to accept
  EXPECT_EQ(ec, errc::invalid_state);
  c.reject({}, ec);
  EXPECT_EQ(ec, errc::invalid_state);
  // Nothing above disturbed the connector or the QP.
  EXPECT_EQ(a.state(), qp_state::reset);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(7000), {}, use_request);
  cm::connection_request req = got.get();
  req.conn.accept(make_qp(qp_type::uc), {}, {}, ec);  // wrong transport
  EXPECT_EQ(ec, errc::invalid_argument);
  const std::vector<std::byte> rep_too_long(cm::max_accept_private_data + 1);
  req.conn.accept(make_qp(), rep_too_long, {}, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  req.conn.accept(a, {}, {}, ec);  // the QP already has a connection
  EXPECT_EQ(ec, errc::invalid_state);
  qp b = make_qp();
  req.conn.accept(b);
  conn.get();
  req.conn.accept(make_qp(), {}, {}, ec);  // twice
  EXPECT_EQ(ec, errc::invalid_state);
  req.conn.reject({}, ec);
  EXPECT_EQ(ec, errc::invalid_state);
  c.connect(a, at(7000), {}, {}, ec);  // connected already
  EXPECT_EQ(ec, errc::invalid_state);
  check_send(a, b);
}

TEST_F(cm_test, listen_errors) {
  std::error_code ec;
  cm::listener l = cm::listen(dev, at(7000));
  cm::listen(dev, at(7000), 16, cm::port_space::tcp, ec);
  EXPECT_EQ(ec, errc::address_in_use);
  cm::address any;
  cm::address::parse("0.0.0.0:7000", any);
  cm::listen(dev, any, 16, cm::port_space::tcp, ec);
  EXPECT_EQ(ec, errc::address_in_use);
  cm::listen(dev, at(7000), 16, cm::port_space::udp, ec);  // another port space
  EXPECT_FALSE(ec);
  // 0.0.0.0 takes IPv4 addresses only: an IPv6 address of the same port is
  // free beside it, and :: (which takes both) is not.
  cm::address any4;
  cm::address::parse("0.0.0.0:7002", any4);
  cm::listener l4 = cm::listen(dev, any4);
  cm::listener l6 = cm::listen(dev, at(7002, true), 16, cm::port_space::tcp, ec);
  EXPECT_FALSE(ec) << ec.message();
  cm::address any6;
  cm::address::parse("[::]:7002", any6);
  cm::listen(dev, any6, 16, cm::port_space::tcp, ec);
  EXPECT_EQ(ec, errc::address_in_use);
  cm::address foreign;
  cm::address::parse("10.98.0.1:7000", foreign);
  cm::listen(dev, foreign, 16, cm::port_space::tcp, ec);
  EXPECT_EQ(ec, errc::address_unreachable);
  cm::listen(dev, at(7001), 0, cm::port_space::tcp, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  cm::listener any_port = cm::listen(dev, at(0));
  EXPECT_NE(any_port.local_address().port, 0);
  l.close();
  cm::listen(dev, at(7000));  // free again
}

TEST_F(cm_test, a_device_cannot_reach_an_address_outside_it) {
  cm::connector c(dev);
  cm::address foreign;
  cm::address::parse("10.98.0.1:7000", foreign);
  std::error_code ec;
  c.connect(make_qp(), foreign, {}, {}, ec);
  EXPECT_EQ(ec, errc::address_unreachable);
}

TEST_F(cm_test, a_full_backlog_drops_requests_that_are_then_resent) {
  cm::listener l = cm::listen(dev, at(7000), 1);
  cm::connector c1(dev), c2(dev);
  qp a1 = make_qp(), a2 = make_qp();
  auto conn1 = c1.async_connect(a1, at(7000), {}, fast(), use_request);
  auto conn2 = c2.async_connect(a2, at(7000), {}, fast(), use_request);  // dropped: backlog full
  cm::connector p1 = l.get_request().conn;
  p1.accept(make_qp());
  conn1.get();
  EXPECT_FALSE(conn2.ready());
  advance(4300us);  // c2 resends; now there is room
  cm::connector p2 = l.get_request().conn;
  p2.accept(make_qp());
  conn2.get();
  EXPECT_EQ(c2.state(), cm::conn_state::established);
}

TEST_F(cm_test, every_completion_token) {
  cm::listener l = cm::listen(dev, at(7000));
  // Completion port.
  {
    completion_port port(*ctx);
    cm::connector c(dev);
    l.async_get_request(bind_port(port, 1));
    c.async_connect(make_qp(), at(7000), {}, bind_port(port, 2));
    completion_entry e[4];
    ASSERT_EQ(port.get(std::span(e, 1), 1s), 1u);
    ASSERT_EQ(e[0].key(), 1u);
    ASSERT_FALSE(e[0].error());
    ASSERT_NE(e[0].result<cm::connection_request>(), nullptr);
    cm::connector passive = e[0].result<cm::connection_request>()->conn;  // outlives the entry
    passive.async_accept(make_qp(), {}, bind_port(port, 3));
    std::set<std::uint64_t> keys;
    while (keys.size() < 2) {
      const std::size_t n = port.get(e, 1s);
      ASSERT_GT(n, 0u);
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_FALSE(e[i].error());
        keys.insert(e[i].key());
      }
    }
    EXPECT_EQ(keys, (std::set<std::uint64_t>{2, 3}));
    EXPECT_EQ(c.state(), cm::conn_state::established);
  }
  // Callback on this thread.
  {
    cm::connector c(dev), passive;
    qp b = make_qp();  // (no synchronous calls inside handlers)
    bool got = false, connected = false;
    l.async_get_request([&](std::error_code ec, cm::connection_request r) {
      EXPECT_FALSE(ec);
      got = true;
      passive = r.conn;
      r.conn.async_accept(b, {}, [](std::error_code e) { EXPECT_FALSE(e); });
    });
    c.async_connect(make_qp(), at(7000), {}, [&](std::error_code ec, cm::connect_result) {
      EXPECT_FALSE(ec);
      connected = true;
    });
    for (int i = 0; i < 100 && !(got && connected); ++i) ctx->alertable_wait(1ms);
    EXPECT_TRUE(got);
    EXPECT_TRUE(connected);
  }
  // Futures.
  {
    cm::connector c(dev);
    std::future<cm::connection_request> got = l.async_get_request(use_future);
    std::future<cm::connect_result> conn = c.async_connect(make_qp(), at(7000), bytes("f"), use_future);
    cm::connection_request req = got.get();
    std::future<void> acc = req.conn.async_accept(make_qp(), {}, use_future);
    while (conn.wait_for(0s) != std::future_status::ready) ctx->poll();
    conn.get();
    acc.get();
  }
}

/// A coroutine that starts at once and frees itself when it ends.
struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

TEST_F(cm_test, coroutine_server_and_client) {
  cm::listener l = cm::listen(dev, at(7000));
  bool served = false, connected = false;
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev), passive;
  auto server = [&]() -> task {
    cm::connection_request r = co_await l.async_get_request(use_awaitable);
    passive = r.conn;
    co_await r.conn.async_accept(b, bytes("co"), use_awaitable);
    served = true;
  };
  auto client = [&]() -> task {
    cm::connect_result r = co_await c.async_connect(a, at(7000), {}, use_awaitable);
    EXPECT_EQ(text(r.private_data, 2), "co");
    connected = true;
  };
  server();
  client();
  for (int i = 0; i < 100 && !(served && connected); ++i) ctx->alertable_wait(1ms);
  EXPECT_TRUE(served);
  EXPECT_TRUE(connected);
}

// A coroutine waiting on a listener does not keep it alive: dropping the
// program's last copy aborts the wait (operation_aborted) and frees the
// port, as with every other token.  (The awaitable used to keep the
// operation's body, which holds a copy of the handle, until it resumed.)
TEST_F(cm_test, a_coroutine_waiting_on_a_listener_does_not_keep_it_alive) {
  cm::listener l = cm::listen(dev, at(7000));
  std::error_code got;
  bool resumed = false;
  auto waiter = [&](cm::listener* pl) -> task {
    try {
      (void)co_await pl->async_get_request(use_awaitable);
    } catch (const std::system_error& e) {
      got = e.code();
    }
    resumed = true;
  };
  waiter(&l);
  ctx->alertable_wait(1ms);
  ASSERT_FALSE(resumed);
  l = {};  // the last copy
  for (int i = 0; i < 100 && !resumed; ++i) ctx->alertable_wait(1ms);
  EXPECT_TRUE(resumed) << "the wait outlived the listener";
  EXPECT_EQ(got, errc::operation_aborted);
  std::error_code ec;
  cm::listener again = cm::listen(dev, at(7000), 128, cm::port_space::tcp, ec);
  EXPECT_FALSE(ec) << "the port is still taken: " << ec.message();
}

// A request wait whose handle was dropped (a wait_for that timed out, say)
// takes no connection: the next requester reaches the next wait, as
// librdmacm leaves requests queued until read.  (The dropped wait used to
// take it, and the connection, handed to nobody, was rejected.)
TEST_F(cm_test, a_dropped_request_wait_takes_no_connection) {
  cm::listener l = cm::listen(dev, at(7000));
  {
    auto dropped = l.async_get_request(use_request);
    ctx->poll();
    ASSERT_FALSE(dropped.ready());
  }
  qp a = make_qp(), b = make_qp();
  cm::connector c(dev);
  auto conn = c.async_connect(a, at(7000), {}, use_request);
  for (int i = 0; i < 20 && !conn.ready(); ++i) ctx->poll();
  ASSERT_FALSE(conn.ready()) << "the connect ended before anyone took it";
  auto got = l.async_get_request(use_request);
  for (int i = 0; i < 20 && !got.ready(); ++i) ctx->poll();
  ASSERT_TRUE(got.ready()) << "the request went to the dropped wait";
  cm::connection_request req = got.get();
  req.conn.accept(b);
  conn.get();
}

// A server that parks a request wait and cancels it, over and over, leaves
// nothing behind: closing the listener then finds at most the last one
// (each used to stay parked, holding a context reference and a connector).
TEST_F(cm_test, cancelled_request_waits_do_not_pile_up) {
  cm::listener l = cm::listen(dev, at(7000));
  for (int i = 0; i < 100; ++i) {
    auto got = l.async_get_request(use_request);
    ctx->poll();
    ASSERT_FALSE(got.ready());
    got.cancel();
  }
  const std::uint64_t before = ctx->stats().stale_ignored;
  l.close();
  ctx->poll();
  EXPECT_LE(ctx->stats().stale_ignored - before, 1u);
}

// A SIDR request nobody takes is forgotten once its requester gave up, as
// an untaken REQ is: it leaves the backlog to the next requester.
TEST_F(cm_test, a_sidr_request_nobody_takes_is_forgotten) {
  cm::listener l = cm::listen(dev, at(5000), 1, cm::port_space::udp);
  qp a = make_qp(qp_type::ud), b = make_qp(qp_type::ud);
  cm::connector ca(dev), cb(dev);
  auto first = ca.async_connect(a, at(5000), bytes("A"), fast(), use_request);
  for (int i = 0; i < 100 && !first.ready(); ++i) advance(100ms);
  ASSERT_TRUE(first.ready());
  std::error_code ec;
  first.get(ec);
  EXPECT_EQ(ec, errc::timed_out);
  for (int i = 0; i < 40; ++i) advance(500ms);  // past the backlog's patience (4 x 4.3 s)
  auto second = cb.async_connect(b, at(5000), bytes("B"), fast(), use_request);
  auto got = l.async_get_request(use_request);
  ctx->poll();
  ASSERT_TRUE(got.ready());
  cm::connection_request req = got.get();
  EXPECT_EQ(text(req.private_data, 1), "B");
  second.cancel();
}

// A passive UD connector reads `established` until disconnect(), also once
// its answer is no longer kept for the requester's resends (about 17 s):
// connect() on it is invalid_state then too, as before, and ends nothing
// (it used to start afresh, aborting a parked notify_disconnect).
TEST_F(cm_test, connect_on_an_accepted_ud_connector_is_invalid_state_however_late) {
  cm::listener l = cm::listen(dev, at(5000), 16, cm::port_space::udp);
  qp a = make_qp(qp_type::ud), b = make_qp(qp_type::ud), b2 = make_qp(qp_type::ud);
  cm::connector c(dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(5000), {}, use_request);
  cm::connection_request req = got.get();
  req.conn.accept(b);
  conn.get();
  auto notified = req.conn.async_notify_disconnect(use_request);
  for (int i = 0; i < 50; ++i) advance(1s);
  EXPECT_EQ(req.conn.state(), cm::conn_state::established);
  auto again = req.conn.async_connect(b2, at(5000), {}, use_request);
  ctx->poll();
  ASSERT_TRUE(again.ready()) << "a connect started on the accepted connector";
  std::error_code ec;
  again.get(ec);
  EXPECT_EQ(ec, errc::invalid_state);
  EXPECT_FALSE(notified.ready()) << "the connection ended";
  req.conn.disconnect();
  notified.get();
}

TEST_F(cm_test, ud_service_resolution) {
  cm::listener l = cm::listen(dev, at(5000), 16, cm::port_space::udp);
  qp a = make_qp(qp_type::ud), b = make_qp(qp_type::ud);
  cm::connector c(dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(5000), bytes("ud?"), use_request);
  cm::connection_request req = got.get();
  EXPECT_EQ(req.type, qp_type::ud);
  ASSERT_EQ(req.private_data.size(), cm::max_ud_connect_private_data);
  EXPECT_EQ(text(req.private_data, 3), "ud?");
  req.conn.accept(b, bytes("ud!"));
  cm::connect_result r = conn.get();
  EXPECT_EQ(r.remote_qpn, b.num());
  EXPECT_EQ(r.remote_qkey, 0x01234567u);
  EXPECT_EQ(text(r.private_data, 3), "ud!");
  EXPECT_EQ(a.state(), qp_state::rts);
  EXPECT_EQ(b.state(), qp_state::rts);

  // A datagram reaches the service through the peer's address vector.
  ah h = pd_.create_ah(c.peer_ah());
  std::vector<std::byte> src(32, std::byte{0x33}), dst(32 + 40);
  mr ms = pd_.reg_mr(src.data(), src.size(), access_local_write);
  mr md = pd_.reg_mr(dst.data(), dst.size(), access_local_write);
  const sge rs{reinterpret_cast<std::uintptr_t>(dst.data()), 72, md.lkey()};
  const sge ss{reinterpret_cast<std::uintptr_t>(src.data()), 32, ms.lkey()};
  ASSERT_FALSE(b.post_recv(recv_wr{1, &rs, 1}));
  send_wr w;
  w.sg_list = &ss;
  w.num_sge = 1;
  w.flags = send_signaled;
  w.ah = &h;
  w.remote_qpn = r.remote_qpn;
  w.remote_qkey = r.remote_qkey;
  ASSERT_FALSE(a.post_send(w));
  int n = 0;
  for (int i = 0; i < 100 && n < 2; ++i) {
    work_completion wc[2];
    for (std::size_t k = 0, m = cq_.poll(wc); k < m; ++k, ++n) EXPECT_EQ(wc[k].status, wc_status::success);
  }
  EXPECT_EQ(n, 2);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + 40));

  // Rejected, and nobody there.
  cm::connector c2(dev);
  auto got2 = l.async_get_request(use_request);
  auto conn2 = c2.async_connect(make_qp(qp_type::ud), at(5000), {}, use_request);
  got2.get().conn.reject(bytes("nope"));
  std::error_code ec;
  conn2.get(ec);
  EXPECT_EQ(ec, errc::connection_rejected);
  EXPECT_EQ(text(c2.private_data(), 4), "nope");
  cm::connector c3(dev);
  c3.connect(make_qp(qp_type::ud), at(5001), {}, {}, ec);
  EXPECT_EQ(ec, errc::connection_refused);
}

// The passive side of a UD service resolution is established for the
// application until it disconnects, as the active side is: not in
// timewait while it answers duplicate SIDR_REQs, and not closed (its
// disconnect notification fired) when it stops answering them.
TEST_F(cm_test, a_passive_ud_connection_is_established_until_it_disconnects) {
  cm::listener l = cm::listen(dev, at(5000), 16, cm::port_space::udp);
  qp a = make_qp(qp_type::ud), b = make_qp(qp_type::ud);
  cm::connector c(dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(5000), {}, use_request);
  cm::connection_request req = got.get();
  req.conn.accept(b);
  conn.get();
  EXPECT_EQ(req.conn.state(), cm::conn_state::established);
  auto down = req.conn.async_notify_disconnect(use_request);
  advance(20s);  // past the time it answers duplicates
  EXPECT_EQ(req.conn.state(), cm::conn_state::established);
  EXPECT_FALSE(down.ready());
  std::error_code ec;
  req.conn.disconnect(ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(req.conn.state(), cm::conn_state::closed);
  down.get(ec);
  EXPECT_FALSE(ec) << ec.message();  // ended by our own disconnect
  req.conn.disconnect(ec);           // again: already disconnected
  EXPECT_FALSE(ec) << ec.message();
}

// Removing the device ends every connection: requests complete with
// device_removed, and state() reads closed instead of connecting or
// established for ever.
TEST_F(cm_test, device_removal_closes_every_connection) {
  cm::listener l = cm::listen(dev, at(7471));
  pair p = connect_pair(7471, l);
  cm::connector pending(dev);
  auto conn = pending.async_connect(make_qp(), at(7471), {}, use_request);  // nobody takes it
  ctx->poll();
  EXPECT_EQ(pending.state(), cm::conn_state::connecting);
  auto down = p.active.async_notify_disconnect(use_request);
  sdev.reset();
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::device_removed);
  down.get(ec);
  EXPECT_EQ(ec, errc::device_removed);
  EXPECT_EQ(pending.state(), cm::conn_state::closed);
  EXPECT_EQ(p.active.state(), cm::conn_state::closed);
  EXPECT_EQ(p.passive.state(), cm::conn_state::closed);
}

TEST_F(cm_test, uc_connection) {
  cm::listener l = cm::listen(dev, at(7000));
  qp a = make_qp(qp_type::uc), b = make_qp(qp_type::uc);
  cm::connector c(dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(a, at(7000), {}, use_request);
  cm::connection_request req = got.get();
  EXPECT_EQ(req.type, qp_type::uc);
  req.conn.accept(b);
  conn.get();
  check_send(a, b);
}

TEST_F(cm_test, resolve_and_open_by_address) {
  cm::route r = cm::resolve(*ctx, ip6);
  EXPECT_TRUE(r.local);
  EXPECT_EQ(r.sgid, ip6);
  EXPECT_EQ(r.dgid, ip6);
  EXPECT_EQ(r.gid_index, 1u);
  EXPECT_EQ(r.port_num, 1);
  EXPECT_EQ(r.path_mtu, dev.query_port(1).active_mtu);
  device d = cm::open_device(*ctx, ip6);
  EXPECT_EQ(d.name(), r.device);
  EXPECT_EQ(d.query().node_guid, dev.query().node_guid);

  std::error_code ec;
  cm::resolve(*ctx, gid{}, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  gid mcast;
  gid::parse("239.1.1.1", mcast);
  cm::resolve(*ctx, mcast, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  gid foreign;
  gid::parse("10.98.0.1", foreign);  // no device owns or reaches it (none is on UDP)
  cm::resolve(*ctx, foreign, ec);
  EXPECT_EQ(ec, errc::address_unreachable);
  cm::open_device(*ctx, foreign, ec);
  EXPECT_EQ(ec, errc::address_unreachable);
}

TEST_F(cm_test, address_text) {
  cm::address a;
  ASSERT_TRUE(cm::address::parse("127.0.0.2:7471", a));
  EXPECT_TRUE(a.is_ipv4());
  EXPECT_EQ(a.port, 7471);
  EXPECT_EQ(a.to_string(), "127.0.0.2:7471");
  ASSERT_TRUE(cm::address::parse("[fd00::1]:80", a));
  EXPECT_FALSE(a.is_ipv4());
  EXPECT_EQ(a.to_string(), "[fd00::1]:80");
  ASSERT_TRUE(cm::address::parse("fd00::1", a));
  EXPECT_EQ(a.port, 0);
  ASSERT_TRUE(cm::address::parse("0.0.0.0:1", a));
  EXPECT_TRUE(a.is_any());
  for (const char* bad : {"", "1.2.3", "1.2.3.4:", "1.2.3.4:65536", "[::1", "[::1]x", "host:80", "1.2.3.4:8a"})
    EXPECT_FALSE(cm::address::parse(bad, a)) << bad;
  sockaddr_storage ss;
  ASSERT_TRUE(cm::address::parse("10.1.2.3:99", a));
  a.to_sockaddr(ss);
  cm::address back;
  ASSERT_TRUE(cm::address::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), back));
  EXPECT_EQ(back, a);
  // A scoped (link-local) IPv6 address is refused, not taken without its
  // scope, which would name another host.
  ASSERT_TRUE(cm::address::parse("[fe80::1]:99", a));
  a.to_sockaddr(ss);
  reinterpret_cast<sockaddr_in6*>(&ss)->sin6_scope_id = 2;
  EXPECT_FALSE(cm::address::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), back));
}

}  // namespace
}  // namespace averbs::test
