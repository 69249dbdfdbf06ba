// SPDX-License-Identifier: MIT
// Rule 6: the dispatch-level rule.
#include <averbs/async.hpp>

#include <gtest/gtest.h>

#include <array>
#include <functional>

namespace {

using namespace std::chrono_literals;
using averbs::errc;

TEST(dispatch, async_initiation_inside_a_handler_is_allowed) {
  averbs::context ctx;
  int chain = 0;
  std::function<void(std::error_code, std::uint64_t)> step;
  step = [&](std::error_code ec, std::uint64_t v) {
    ASSERT_FALSE(ec);
    chain = static_cast<int>(v);
    if (v < 5) {
      averbs::nop_params p;
      p.value = v + 1;
      averbs::async_nop(ctx, p, step);  // from inside a handler
    }
  };
  averbs::nop_params p;
  p.value = 1;
  averbs::async_nop(ctx, p, step);
  while (ctx.alertable_wait(0ns) != 0) {
  }
  EXPECT_EQ(chain, 5);
}

TEST(dispatch, synchronous_call_inside_a_handler_fails_at_once) {
  averbs::context ctx;
  std::error_code inner;
  std::uint64_t started_before = 0, started_after = 0;
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) {
    started_before = ctx.stats().started;
    averbs::nop_params p;
    p.value = 3;
    averbs::nop(ctx, p, inner);
    started_after = ctx.stats().started;
  });
  ctx.alertable_wait(0ns);
  EXPECT_EQ(inner, errc::would_deadlock);
  EXPECT_EQ(inner, std::errc::resource_deadlock_would_occur);
  EXPECT_EQ(started_after, started_before) << "the operation was not started";
}

TEST(dispatch, throwing_sync_call_inside_a_handler_throws_would_deadlock) {
  averbs::context ctx;
  bool threw = false;
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) {
    try {
      averbs::nop(ctx, {});
    } catch (const std::system_error& e) {
      threw = e.code() == errc::would_deadlock;
    }
  });
  ctx.alertable_wait(0ns);
  EXPECT_TRUE(threw);
}

TEST(dispatch, blocking_waits_inside_a_handler_fail_but_polling_is_allowed) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  std::error_code port_ec, request_ec, alert_ec;
  bool ready_polled = false;
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) {
    std::array<averbs::completion_entry, 1> e;
    port.get(e, 1s, averbs::wait_mode::normal, port_ec);
    averbs::nop_params p;
    p.delay = 1h;
    auto r = averbs::async_nop(ctx, p, averbs::use_request);
    r.wait_for(1s, averbs::wait_mode::normal, request_ec);
    ready_polled = !r.ready();
    r.cancel();
    ctx.alertable_wait(1s, alert_ec);
  });
  ctx.alertable_wait(0ns);
  EXPECT_EQ(port_ec, errc::would_deadlock);
  EXPECT_EQ(request_ec, errc::would_deadlock);
  EXPECT_EQ(alert_ec, errc::would_deadlock);
  EXPECT_TRUE(ready_polled);
}

// A negative timeout does not wait (as zero, outside a handler it polls
// once): inside a handler it is a poll too, not would_deadlock.
TEST(dispatch, a_negative_timeout_inside_a_handler_polls) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  std::error_code port_ec, request_ec;
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) {
    std::array<averbs::completion_entry, 1> e;
    port.get(e, -1ns, averbs::wait_mode::normal, port_ec);
    averbs::nop_params p;
    p.delay = 1h;
    auto r = averbs::async_nop(ctx, p, averbs::use_request);
    r.wait_for(-5ms, averbs::wait_mode::normal, request_ec);
    r.cancel();
  });
  ctx.alertable_wait(0ns);
  EXPECT_EQ(port_ec, errc::timed_out);
  EXPECT_EQ(request_ec, errc::timed_out);
}

// The rule holds even with handlers queued: a waiting alertable_wait inside
// a handler fails at once, and does not run the queued ones nested.
TEST(dispatch, alertable_wait_with_a_timeout_inside_a_handler_fails_even_with_handlers_queued) {
  averbs::context ctx;
  std::error_code ec;
  int inner = 0;
  std::size_t ran = 99;
  bool nested = false;
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) {
    averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) { ++inner; });
    ran = ctx.alertable_wait(1s, ec);
    nested = inner != 0;
  });
  ctx.alertable_wait(0ns);
  EXPECT_EQ(ec, errc::would_deadlock);
  EXPECT_EQ(ran, 0u);
  EXPECT_FALSE(nested) << "a queued handler ran inside another";
  while (ctx.alertable_wait(0ns) != 0) {
  }
  EXPECT_EQ(inner, 1);
}

}  // namespace
