// SPDX-License-Identifier: MIT
// connect/accept racing a destroy of their QP on another thread: the QP is
// destroyed wholly before the connection manager reads it (stale_handle)
// or after it holds it (the manager aborts the request), never while it
// reads it (clean under TSan and ASan: scripts/test.sh builds this one for
// its TSan stage).
#include "cm_fixture.hpp"

#include <atomic>
#include <thread>

namespace averbs::test {
namespace {

using cm_stress = cm_test;

constexpr int rounds = 200;

TEST_F(cm_stress, connect_racing_destroy_qp) {
  int seen_stale = 0, seen_other = 0;
  for (int r = 0; r < rounds; ++r) {
    qp a = make_qp();
    const qp other = a;
    cm::connector c(dev);
    std::atomic<bool> go{false};
    std::error_code ec;
    std::thread t([&] {
      go.store(true);
      c.connect(other, at(1234), {}, {}, ec);  // nobody listens there
    });
    while (!go.load()) std::this_thread::yield();
    a.destroy();
    t.join();
    EXPECT_TRUE(ec == errc::connection_refused || ec == errc::stale_handle || ec == errc::operation_aborted)
        << ec.message();
    (ec == errc::stale_handle ? seen_stale : seen_other) += 1;
    qps.clear();
  }
  std::printf("stale_handle %d, refused or aborted %d\n", seen_stale, seen_other);
}

TEST_F(cm_stress, accept_racing_destroy_qp) {
  cm::listener l = cm::listen(dev, at(7471));
  for (int r = 0; r < rounds; ++r) {
    qp a = make_qp(), b = make_qp();
    const qp other = b;
    cm::connector active(dev);
    auto got = l.async_get_request(use_request);
    auto conn = active.async_connect(a, at(7471), {}, use_request);
    cm::connection_request req = got.get();
    std::error_code ec;
    std::atomic<bool> go{false};
    std::thread t([&] {
      go.store(true);
      req.conn.accept(other, {}, {}, ec);
    });
    while (!go.load()) std::this_thread::yield();
    b.destroy();
    t.join();
    EXPECT_TRUE(!ec || ec == errc::stale_handle || ec == errc::operation_aborted) << ec.message();
    if (ec == errc::stale_handle) req.conn.reject();  // the request is still the application's to answer
    std::error_code connect_ec;
    (void)conn.get(connect_ec);  // established (then disconnected) or rejected: it completes
    qps.clear();
  }
}

// A connect cancelled on another thread while its REP is being taken
// either completes (established) or is aborted and leaves no connection
// up: the QP is not in RTS and the connector not established.  (The
// window between the manager's last look at the request and its
// completion is short; rounds that hit it end in a DREQ.)
TEST_F(cm_stress, a_connect_cancelled_as_it_completes_leaves_no_connection_up) {
  cm::listener l = cm::listen(dev, at(7472));
  int done = 0, aborted = 0, torn_down = 0;
  for (int r = 0; r < 2 * rounds; ++r) {
    qp a = make_qp(), b = make_qp();
    cm::connector active(dev);
    auto got = l.async_get_request(use_request);
    auto conn = active.async_connect(a, at(7472), {}, use_request);
    cm::connection_request req = got.get();
    std::atomic<bool> ready{false}, go{false};
    std::thread canceller([&] {
      ready.store(true);
      while (!go.load()) {
      }
      // 0 to 20 us after the accept starts: the handshake on this
      // in-process device takes about that long.
      const auto at = std::chrono::steady_clock::now() + std::chrono::nanoseconds(r % 100 * 200);
      while (std::chrono::steady_clock::now() < at) {
      }
      conn.cancel();
    });
    while (!ready.load()) std::this_thread::yield();
    go.store(true);
    std::error_code accept_ec, ec;
    req.conn.accept(b, {}, {}, accept_ec);
    canceller.join();
    conn.get(ec);
    for (int i = 0; i < 10; ++i) ctx->poll();
    if (!ec) {
      ++done;
      EXPECT_EQ(active.state(), cm::conn_state::established);
      EXPECT_EQ(a.state(), qp_state::rts);
    } else {
      ASSERT_EQ(ec, errc::operation_aborted);
      ++aborted;
      EXPECT_NE(active.state(), cm::conn_state::established);
      EXPECT_NE(a.state(), qp_state::rts);
      if (a.state() == qp_state::err) ++torn_down;
    }
    qps.clear();
  }
  std::printf("completed %d, aborted %d (%d after the REP)\n", done, aborted, torn_down);
}

}  // namespace
}  // namespace averbs::test
