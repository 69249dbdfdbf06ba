// SPDX-License-Identifier: MIT
// Rule 3: the bind_port token and completion ports.
#include "thread_switches.hpp"

#include <averbs/async.hpp>

#include <gtest/gtest.h>
#include <poll.h>

#include <unistd.h>

#include <array>
#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using averbs::errc;

TEST(port, completion_is_queued_with_key_status_and_result) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  averbs::nop_params p;
  p.defer = true;
  p.value = 77;
  auto s = averbs::async_nop(ctx, p, averbs::bind_port(port, 0xABC));
  EXPECT_FALSE(s.completed_inline());
  std::array<averbs::completion_entry, 4> e;
  ASSERT_EQ(port.get(e, 1s), 1u);
  EXPECT_EQ(e[0].key(), 0xABCu);
  EXPECT_FALSE(e[0].error());
  EXPECT_FALSE(e[0].user_packet());
  ASSERT_NE(e[0].result<std::uint64_t>(), nullptr);
  EXPECT_EQ(*e[0].result<std::uint64_t>(), 77u);
  EXPECT_EQ(e[0].result<int>(), nullptr) << "wrong type is refused";
}

// A timeout longer than nanoseconds can count (seconds::max(), three
// centuries) waits for good: it saturates at infinite instead of
// overflowing into a negative value, which returned timed_out at once.
TEST(port, a_timeout_past_what_nanoseconds_hold_waits_for_the_completion) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  averbs::nop_params p;
  p.delay = 20ms;
  averbs::async_nop(ctx, p, averbs::bind_port(port, 1));
  std::array<averbs::completion_entry, 1> e;
  std::error_code ec;
  EXPECT_EQ(port.get(e, std::chrono::seconds::max(), averbs::wait_mode::normal, ec), 1u) << ec.message();
  auto r = averbs::async_nop(ctx, p, averbs::use_request);
  EXPECT_TRUE(r.wait_for(std::chrono::hours(24 * 365 * 300)));
  auto r2 = averbs::async_nop(ctx, p, averbs::use_request);
  EXPECT_TRUE(r2.wait_for(std::chrono::duration<double>(1e30)));
  static_assert(averbs::detail::timeout_ns(std::chrono::seconds::max()) == averbs::infinite);
  static_assert(averbs::detail::timeout_ns(std::chrono::seconds::min()) == std::chrono::nanoseconds::min());
  static_assert(averbs::detail::timeout_ns(1500ms) == 1'500'000'000ns);
}

TEST(port, get_dequeues_a_batch) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  for (std::uint64_t i = 0; i < 10; ++i) {
    averbs::nop_params p;
    p.value = i;
    averbs::async_nop(ctx, p, averbs::bind_port(port, i));
  }
  EXPECT_EQ(port.size(), 10u);
  std::array<averbs::completion_entry, 8> e;
  ASSERT_EQ(port.get(e, 0ns), 8u);
  for (std::uint64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(e[i].key(), i) << "FIFO order";
    EXPECT_EQ(*e[i].result<std::uint64_t>(), i);
  }
  ASSERT_EQ(port.get(e, 0ns), 2u);
  std::error_code ec;
  EXPECT_EQ(port.get(e, 0ns, averbs::wait_mode::normal, ec), 0u);
  EXPECT_EQ(ec, errc::timed_out);
}

TEST(port, inline_completion_is_still_queued_without_the_skip_flag) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  auto s = averbs::async_nop(ctx, {}, averbs::bind_port(port, 1));
  EXPECT_FALSE(s.completed_inline());
  EXPECT_EQ(port.size(), 1u);
}

TEST(port, skip_on_inline_success_returns_the_result_and_queues_nothing) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  averbs::nop_params p;
  p.value = 9;
  auto s = averbs::async_nop(ctx, p,
                             averbs::bind_port(port, 1, averbs::port_flags::skip_on_inline_success));
  ASSERT_TRUE(s.completed_inline());
  EXPECT_EQ(s.value(), 9u);
  EXPECT_EQ(port.size(), 0u);
  EXPECT_EQ(ctx.stats().in_flight, 0u);
}

TEST(port, skip_flag_still_queues_inline_failures_and_pending_completions) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  const auto skip = averbs::port_flags::skip_on_inline_success;
  averbs::nop_params failing;
  failing.error = errc::invalid_argument;
  EXPECT_FALSE(averbs::async_nop(ctx, failing, averbs::bind_port(port, 1, skip)).completed_inline());
  averbs::nop_params deferred;
  deferred.defer = true;
  EXPECT_FALSE(averbs::async_nop(ctx, deferred, averbs::bind_port(port, 2, skip)).completed_inline());
  std::array<averbs::completion_entry, 2> e;
  ASSERT_EQ(port.get(e, 1s), 1u);
  EXPECT_EQ(e[0].key(), 1u);
  EXPECT_EQ(e[0].error(), errc::invalid_argument);
  ASSERT_EQ(port.get(e, 1s), 1u);
  EXPECT_EQ(e[0].key(), 2u);
  EXPECT_FALSE(e[0].error());
}

TEST(port, post_queues_a_user_packet) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  port.post(5, 123, errc::timed_out);
  std::array<averbs::completion_entry, 1> e;
  ASSERT_EQ(port.get(e, 0ns), 1u);
  EXPECT_TRUE(e[0].user_packet());
  EXPECT_EQ(e[0].key(), 5u);
  EXPECT_EQ(e[0].error(), errc::timed_out);
  EXPECT_EQ(*e[0].result<std::uint64_t>(), 123u);
}

TEST(port, native_handle_is_readable_while_entries_are_queued) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  pollfd pfd{port.native_handle(), POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 0);
  port.post(1);
  port.post(2);
  EXPECT_EQ(::poll(&pfd, 1, 0), 1);
  std::array<averbs::completion_entry, 1> e;
  ASSERT_EQ(port.get(e, 0ns), 1u);
  EXPECT_EQ(::poll(&pfd, 1, 0), 1) << "one entry left";
  ASSERT_EQ(port.get(e, 0ns), 1u);
  EXPECT_EQ(::poll(&pfd, 1, 0), 0) << "empty again";
}

TEST(port, several_threads_wait_on_one_port_and_each_entry_is_taken_once) {
  averbs::context_options o;
  o.spin = 0ns;
  averbs::context ctx(o);
  averbs::completion_port port(ctx);
  constexpr int threads = 4, per_thread = 2000, total = threads * per_thread;
  std::atomic<int> taken{0};
  std::vector<std::vector<std::uint64_t>> got(threads);
  std::vector<std::thread> ws;
  for (int t = 0; t < threads; ++t) {
    ws.emplace_back([&, t] {
      std::array<averbs::completion_entry, 16> e;
      while (taken.load() < total) {
        const std::size_t n = port.get(e, 20ms);
        for (std::size_t i = 0; i < n; ++i) got[t].push_back(*e[i].result<std::uint64_t>());
        taken.fetch_add(static_cast<int>(n));
      }
    });
  }
  for (int i = 0; i < total; ++i) {
    averbs::nop_params p;
    p.defer = (i % 2) == 0;
    p.value = static_cast<std::uint64_t>(i);
    averbs::async_nop(ctx, p, averbs::bind_port(port, 0));
    if (i % 256 == 0) std::this_thread::yield();
  }
  for (auto& w : ws) w.join();
  std::set<std::uint64_t> all;
  for (auto& g : got) all.insert(g.begin(), g.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(total)) << "no entry lost or duplicated";
  EXPECT_EQ(taken.load(), total);
}

using averbs::test::voluntary_switches;

// One entry wakes one of the threads asleep on the port (as a Windows
// completion port), not all of them to find one entry: the others do not
// even leave their sleep.
TEST(port, an_entry_wakes_one_sleeping_thread_not_all) {
  averbs::context_options o;
  o.spin = 0ns;  // straight to sleep
  averbs::context ctx(o);
  averbs::completion_port port(ctx);
  constexpr int threads = 4;
  std::array<std::atomic<pid_t>, threads> tids{};
  std::array<std::atomic<int>, threads> got{};
  std::vector<std::thread> ws;
  for (int t = 0; t < threads; ++t) {
    ws.emplace_back([&, t] {
      tids[t].store(::gettid());
      std::array<averbs::completion_entry, 1> e;
      for (;;) {
        if (port.get(e, 30s) == 0) continue;
        if (e[0].key() == 2) return;  // stop
        got[t].fetch_add(1);
      }
    });
  }
  for (auto& t : tids)
    while (t.load() == 0) std::this_thread::yield();
  std::array<pid_t, threads> ids{};
  for (int t = 0; t < threads; ++t) ids[t] = tids[t].load();
  EXPECT_TRUE(averbs::test::wait_until_asleep(ids)) << "the waiters never all slept";
  std::array<long, threads> before{};
  for (int t = 0; t < threads; ++t) before[t] = voluntary_switches(ids[t]);
  port.post(1, 0);
  int woken = 0, taken = 0;
  for (int i = 0; i < 2000 && taken == 0; ++i) {
    std::this_thread::sleep_for(1ms);
    taken = 0;
    for (auto& g : got) taken += g.load();
  }
  std::this_thread::sleep_for(50ms);  // any other wake-up would show by now
  for (int t = 0; t < threads; ++t) {
    if (got[t].load() != 0) continue;
    if (voluntary_switches(tids[t].load()) != before[t]) ++woken;
  }
  EXPECT_EQ(taken, 1);
  EXPECT_EQ(woken, 0) << "threads that got no entry were woken for it";
  for (int t = 0; t < threads; ++t) port.post(2, 0);
  for (auto& w : ws) w.join();
}

TEST(port, destroying_a_port_discards_queued_and_later_completions) {
  averbs::manual_clock clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);
  {
    averbs::completion_port port(ctx);
    averbs::async_nop(ctx, {}, averbs::bind_port(port, 1));  // queued
    averbs::nop_params p;
    p.delay = 1ms;
    averbs::async_nop(ctx, p, averbs::bind_port(port, 2));  // pending
    EXPECT_EQ(ctx.stats().in_flight, 2u);
  }
  EXPECT_EQ(ctx.stats().in_flight, 1u);
  clk.advance(1ms);
  ctx.poll();
  EXPECT_EQ(ctx.stats().in_flight, 0u);
}

// A handler run by an alertable wait on a port may destroy that port (a
// session torn down from its own completion): the wait ends with
// operation_aborted and touches nothing of the port after (it used to
// lock the freed port; ASan saw it).
TEST(port, a_handler_may_destroy_the_port_its_wait_runs_it_from) {
  averbs::context ctx;
  auto port = std::make_unique<averbs::completion_port>(ctx);
  averbs::completion_port* raw = port.get();
  bool ran = false;
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) {
    ran = true;
    port.reset();
  });
  std::array<averbs::completion_entry, 1> e;
  std::error_code ec;
  EXPECT_EQ(raw->get(e, 1s, averbs::wait_mode::alertable, ec), 0u);
  EXPECT_TRUE(ran);
  EXPECT_EQ(ec, averbs::make_error_code(errc::operation_aborted));
  EXPECT_EQ(port, nullptr);
}

// Another thread destroying the port wakes a thread asleep on it, which
// leaves with operation_aborted rather than sleeping out its timeout.
TEST(port, destroying_a_port_wakes_its_sleepers) {
  averbs::context_options o;
  o.spin = 0ns;  // straight to sleep
  averbs::context ctx(o);
  auto port = std::make_unique<averbs::completion_port>(ctx);
  averbs::completion_port* raw = port.get();
  std::atomic<bool> done{false};
  std::atomic<pid_t> tid{0};
  std::error_code ec;
  std::thread sleeper([&] {
    tid.store(::gettid());
    std::array<averbs::completion_entry, 1> e;
    raw->get(e, 30s, averbs::wait_mode::normal, ec);
    done = true;
  });
  while (tid.load() == 0) std::this_thread::yield();
  const std::array<pid_t, 1> ids{tid.load()};
  if (!averbs::test::wait_until_asleep(ids)) {
    raw->post(1);  // (let it go before the port does)
    sleeper.join();
    GTEST_SKIP() << "the waiter never slept (a loaded machine): nothing to wake";
  }
  const auto t0 = std::chrono::steady_clock::now();
  port.reset();
  sleeper.join();
  EXPECT_TRUE(done);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "the sleeper slept out its timeout";
  EXPECT_EQ(ec, averbs::make_error_code(errc::operation_aborted));
}

TEST(port, entry_moves_keep_the_result) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  averbs::nop_params p;
  p.value = 4;
  averbs::async_nop(ctx, p, averbs::bind_port(port, 3));
  std::array<averbs::completion_entry, 1> e;
  ASSERT_EQ(port.get(e, 0ns), 1u);
  averbs::completion_entry moved = std::move(e[0]);
  EXPECT_EQ(e[0].result<std::uint64_t>(), nullptr);
  EXPECT_EQ(*moved.result<std::uint64_t>(), 4u);
  EXPECT_EQ(moved.key(), 3u);
}

// A port's entries name slots of its own context: an operation of another
// context bound to it is refused as it starts, and the port and both
// contexts go on working.
TEST(port, an_operation_of_another_context_is_refused) {
  averbs::context a, b;
  averbs::completion_port port(a);
  averbs::nop_params held;
  held.delay = 1h;
  auto pending = averbs::async_nop(a, held, averbs::use_request);  // a slot of `a` a stray entry would hit
  averbs::nop_params p;
  p.value = 5;
  try {
    averbs::async_nop(b, p, averbs::bind_port(port, 1));
    ADD_FAILURE() << "another context's operation was accepted";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
  }
  EXPECT_EQ(b.stats().in_flight, 0u);
  EXPECT_EQ(port.size(), 0u);
  averbs::async_nop(a, p, averbs::bind_port(port, 2));
  std::array<averbs::completion_entry, 2> e;
  ASSERT_EQ(port.get(e, 1s), 1u);
  EXPECT_EQ(e[0].key(), 2u);
  EXPECT_FALSE(pending.ready());
  EXPECT_TRUE(pending.cancel());
}

}  // namespace
