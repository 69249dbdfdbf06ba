// SPDX-License-Identifier: MIT
// Rule 4: cancellation per request, per group, on destroy; exactly once
// also when cancel races completion.
#include <averbs/async.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using averbs::errc;

TEST(cancel, group_cancel_completes_every_pending_request_once) {
  averbs::context ctx;
  averbs::request_group g(ctx);
  int aborted = 0, other = 0;
  averbs::nop_params p;
  p.delay = 1h;
  p.group = &g;
  for (int i = 0; i < 50; ++i)
    averbs::async_nop(ctx, p, [&](std::error_code ec, std::uint64_t) {
      (ec == errc::operation_aborted ? aborted : other)++;
    });
  EXPECT_EQ(g.pending(), 50u);
  EXPECT_EQ(g.cancel(), 50u);
  EXPECT_EQ(g.pending(), 0u);
  EXPECT_EQ(g.cancel(), 0u) << "nothing left";
  while (ctx.alertable_wait(0ns) != 0) {
  }
  EXPECT_EQ(aborted, 50);
  EXPECT_EQ(other, 0);
}

TEST(cancel, completed_requests_leave_their_group) {
  averbs::context ctx;
  averbs::request_group g(ctx);
  averbs::nop_params p;
  p.group = &g;
  auto r = averbs::async_nop(ctx, p, averbs::use_request);  // inline completion
  EXPECT_EQ(g.pending(), 0u);
  EXPECT_EQ(g.cancel(), 0u);
  EXPECT_EQ(r.get(), 0u);
}

TEST(cancel, destroying_the_owner_aborts_its_pending_requests) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  {
    averbs::request_group owner(ctx);  // stands for a CQ or a QP
    averbs::nop_params p;
    p.delay = 1h;
    p.group = &owner;
    for (std::uint64_t k = 0; k < 3; ++k) averbs::async_nop(ctx, p, averbs::bind_port(port, k));
  }
  std::array<averbs::completion_entry, 8> e;
  ASSERT_EQ(port.get(e, 0ns), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(e[i].error(), errc::operation_aborted);
}

TEST(cancel, destroying_the_context_aborts_pending_requests) {
  std::error_code seen;
  std::future<std::uint64_t> f;
  {
    averbs::context ctx;
    averbs::nop_params p;
    p.delay = 1h;
    f = averbs::async_nop(ctx, p, averbs::use_future);
  }
  try {
    f.get();
  } catch (const std::system_error& e) {
    seen = e.code();
  }
  EXPECT_EQ(seen, errc::operation_aborted);
}

TEST(cancel, handler_still_runs_after_its_context_is_destroyed) {
  int aborted = 0;
  {
    averbs::context ctx;
    averbs::nop_params p;
    p.delay = 1h;
    averbs::async_nop(ctx, p, [&](std::error_code ec, std::uint64_t) { aborted += ec == errc::operation_aborted; });
  }
  // The aborted handler is queued for this thread; any context's alertable
  // wait runs it (the slab stays alive while it is queued).
  averbs::context other;
  EXPECT_EQ(other.alertable_wait(0ns), 1u);
  EXPECT_EQ(aborted, 1);
}

TEST(cancel, cancel_racing_completion_delivers_exactly_once) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  constexpr int rounds = 2000;
  std::vector<averbs::detail::completer<int>> cs(rounds);
  for (int i = 0; i < rounds; ++i) {
    cs[i] = averbs::detail::completer<int>();
    averbs::detail::initiate<int>(ctx, nullptr, averbs::bind_port(port, static_cast<std::uint64_t>(i)),
                                  [&cs, i](averbs::detail::completer<int> c) noexcept { cs[i] = c; });
  }
  std::atomic<bool> go{false};
  std::atomic<int> completed_wins{0}, cancel_wins{0};
  std::thread completer([&] {
    while (!go.load()) {
    }
    for (int i = 0; i < rounds; ++i) completed_wins += cs[i].complete({}, i);
  });
  std::thread canceller([&] {
    while (!go.load()) {
    }
    for (int i = 0; i < rounds; ++i) cancel_wins += averbs::detail::cancel_request(ctx.detail_impl(), cs[i].id());
  });
  go = true;
  completer.join();
  canceller.join();
  EXPECT_EQ(completed_wins + cancel_wins, rounds);
  std::vector<averbs::completion_entry> e(rounds + 1);
  ASSERT_EQ(port.get(e, 0ns), static_cast<std::size_t>(rounds)) << "one entry per request";
  int aborted = 0;
  for (int i = 0; i < rounds; ++i) {
    if (e[i].error() == errc::operation_aborted) ++aborted;
    else EXPECT_EQ(*e[i].result<int>(), static_cast<int>(e[i].key()));
  }
  EXPECT_EQ(aborted, cancel_wins.load());
  const auto st = ctx.stats();
  EXPECT_EQ(st.duplicate_ignored + st.stale_ignored, static_cast<std::uint64_t>(rounds))
      << "every losing attempt was detected";
}

TEST(cancel, cancel_hook_lets_the_operation_drop_its_reference) {
  averbs::context ctx;
  struct op_state {
    bool dropped = false;
    averbs::detail::completer<int> c;
  } st;
  auto r = averbs::detail::initiate<int>(ctx, nullptr, averbs::use_request,
                                         [&st](averbs::detail::completer<int> c) noexcept {
                                           st.c = c;
                                           c.on_cancel([](void* arg, averbs::detail::request_id) noexcept {
                                             static_cast<op_state*>(arg)->dropped = true;
                                           }, &st);
                                         });
  EXPECT_TRUE(r.cancel());
  EXPECT_TRUE(st.dropped);
  EXPECT_FALSE(st.c.complete({}, 1)) << "late completion is ignored";
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
}

// A completer that sets its cancel hook after its request completed (and
// the slot went to the next request) hangs nothing on the next request:
// cancelling that one calls no stranger's hook.
TEST(cancel, a_hook_set_after_completion_does_not_land_on_the_next_request) {
  averbs::context ctx;
  averbs::detail::completer<int> first;
  auto r1 = averbs::detail::initiate<int>(ctx, nullptr, averbs::use_request,
                                          [&](averbs::detail::completer<int> c) noexcept { first = c; });
  ASSERT_TRUE(first.complete({}, 1));
  EXPECT_EQ(r1.get(), 1);  // frees the slot
  averbs::detail::completer<int> second;
  auto r2 = averbs::detail::initiate<int>(ctx, nullptr, averbs::use_request,
                                          [&](averbs::detail::completer<int> c) noexcept { second = c; });
  ASSERT_EQ(second.id().index, first.id().index) << "the test needs the slot reused";
  bool called = false;
  first.on_cancel([](void* arg, averbs::detail::request_id) noexcept { *static_cast<bool*>(arg) = true; }, &called);
  EXPECT_TRUE(r2.cancel());
  EXPECT_FALSE(called);
}

// A handler whose move throws leaves the operation unstarted (the caller
// gets the exception) after its request joined the group; the group's
// cancel, running on another thread at the same time, may be completing
// that request.  Neither side frees it twice or loses the group's other
// requests.
TEST(cancel, a_handler_that_fails_to_move_races_its_groups_cancel_cleanly) {
  averbs::context ctx;
  averbs::request_group g(ctx);
  struct bad_handler {
    bad_handler() = default;
    bad_handler(bad_handler&&) { throw std::runtime_error("no room"); }
    void operator()(std::error_code, std::uint64_t) const {}
  };
  averbs::nop_params p;
  p.delay = 1h;
  p.group = &g;
  auto keep = averbs::async_nop(ctx, p, averbs::use_request);  // one that must survive every round
  std::atomic<bool> stop{false};
  std::thread canceller([&] {
    while (!stop.load()) g.cancel();
  });
  int threw = 0;
  for (int i = 0; i < 20000; ++i) {
    try {
      averbs::async_nop(ctx, p, bad_handler{});
    } catch (const std::runtime_error&) {
      ++threw;
    }
  }
  stop.store(true);
  canceller.join();
  EXPECT_EQ(threw, 20000);
  std::error_code ec;
  keep.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted) << "the group's cancel reached the other request";
  EXPECT_EQ(g.pending(), 0u);
  EXPECT_EQ(ctx.stats().in_flight, 0u);
  auto after = averbs::async_nop(ctx, p, averbs::use_request);
  EXPECT_EQ(g.pending(), 1u) << "the group still links requests";
  EXPECT_EQ(g.cancel(), 1u);
}

// A group links slots of its own context by index: another context's
// operation is refused as it starts, and cancelling the group touches
// nothing of the other context.
TEST(cancel, a_group_refuses_an_operation_of_another_context) {
  averbs::context a, b;
  averbs::request_group g(a);
  averbs::nop_params held;
  held.delay = 1h;
  auto bystander = averbs::async_nop(b, held, averbs::use_request);
  averbs::nop_params p;
  p.delay = 1h;
  p.group = &g;
  try {
    averbs::async_nop(b, p, averbs::use_request);
    ADD_FAILURE() << "another context's operation was linked";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
  }
  EXPECT_EQ(g.cancel(), 0u);
  EXPECT_FALSE(bystander.ready()) << "the group cancelled another context's request";
  auto mine = averbs::async_nop(a, p, averbs::use_request);
  EXPECT_EQ(g.cancel(), 1u);
  std::error_code ec;
  mine.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
  EXPECT_TRUE(bystander.cancel());
}

}  // namespace
