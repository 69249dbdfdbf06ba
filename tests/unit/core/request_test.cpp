// SPDX-License-Identifier: MIT
// Rule 2 (slab, exactly once, stale and duplicate completions) and the
// use_request token.
#include "core/context_impl.hpp"

#include <averbs/async.hpp>

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>

namespace {

using namespace std::chrono_literals;
using averbs::errc;

// An operation whose completion the test drives by hand, to reach the
// completer directly.
struct manual_op {
  averbs::detail::completer<int> done;
};

template <class Token>
auto async_manual(averbs::context& ctx, manual_op& op, Token&& token) {
  return averbs::detail::initiate<int>(ctx, nullptr, std::forward<Token>(token),
                                       [&op](averbs::detail::completer<int> c) noexcept { op.done = c; });
}

TEST(request, completes_exactly_once_and_ignores_a_duplicate) {
  averbs::context ctx;
  manual_op op;
  auto r = async_manual(ctx, op, averbs::use_request);
  EXPECT_FALSE(r.ready());
  EXPECT_TRUE(op.done.complete({}, 7));
  EXPECT_FALSE(op.done.complete({}, 8)) << "second completion of a live request";
  EXPECT_EQ(ctx.stats().duplicate_ignored, 1u);
  ASSERT_TRUE(r.ready());
  EXPECT_EQ(r.get(), 7);
  EXPECT_FALSE(r.valid());
}

TEST(request, stale_completion_after_reuse_is_ignored_and_counted) {
  averbs::context ctx;
  manual_op first;
  auto r1 = async_manual(ctx, first, averbs::use_request);
  ASSERT_TRUE(first.done.complete({}, 1));
  EXPECT_EQ(r1.get(), 1);  // frees the slot

  // The next request reuses the slot with a new generation.
  manual_op second;
  auto r2 = async_manual(ctx, second, averbs::use_request);
  EXPECT_EQ(second.done.id().index, first.done.id().index);
  EXPECT_NE(second.done.id().generation, first.done.id().generation);

  EXPECT_FALSE(first.done.complete({}, 99)) << "old id must not complete the new occupant";
  EXPECT_EQ(ctx.stats().stale_ignored, 1u);
  EXPECT_FALSE(r2.ready());
  ASSERT_TRUE(second.done.complete({}, 2));
  EXPECT_EQ(r2.get(), 2);
}

TEST(request, completion_naming_an_index_beyond_the_slab_is_stale) {
  averbs::context ctx;
  averbs::detail::completer<int> bogus(ctx.detail_impl(), {1u << 30, 0});
  EXPECT_FALSE(bogus.complete({}, 1));
  EXPECT_EQ(ctx.stats().stale_ignored, 1u);
}

TEST(request, wait_drives_a_timer_on_the_calling_thread) {
  averbs::context ctx;
  averbs::nop_params p;
  p.delay = 2ms;
  p.value = 5;
  auto r = averbs::async_nop(ctx, p, averbs::use_request);
  EXPECT_FALSE(r.ready());
  r.wait();
  EXPECT_TRUE(r.ready());
  EXPECT_EQ(r.get(), 5u);
}

// A real-time clock of the caller's need not count from CLOCK_MONOTONIC's
// epoch: here it reads a million seconds ahead.  Its timers fire on time
// (the timerfd is armed for what is left, not for its absolute reading,
// which was a million seconds away: the request never completed).
TEST(request, a_real_time_clock_of_another_epoch_fires_timers_on_time) {
  struct ahead_clock final : averbs::clock {
    time_point now() const noexcept override {
      return averbs::steady_clock::instance().now() + std::chrono::seconds(1'000'000);
    }
    bool is_real_time() const noexcept override { return true; }
    void subscribe(averbs::clock_listener&) override {}
    void unsubscribe(averbs::clock_listener&) noexcept override {}
  } clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);
  averbs::nop_params p;
  p.delay = 5ms;
  auto r = averbs::async_nop(ctx, p, averbs::use_request);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(r.wait_for(5s)) << "the timer never fired";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 4ms);
}

TEST(request, wait_for_times_out_then_succeeds) {
  averbs::manual_clock clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);
  averbs::nop_params p;
  p.delay = 10ms;
  auto r = averbs::async_nop(ctx, p, averbs::use_request);
  std::error_code ec;
  EXPECT_FALSE(r.wait_for(1ms, averbs::wait_mode::normal, ec));
  EXPECT_EQ(ec, errc::timed_out);
  clk.advance(10ms);
  EXPECT_TRUE(r.wait_for(1s, averbs::wait_mode::normal, ec));
  EXPECT_FALSE(ec);
}

TEST(request, get_reports_the_operation_error_with_a_default_value) {
  averbs::context ctx;
  averbs::nop_params p;
  p.defer = true;
  p.error = averbs::wc_status::rem_access_err;
  p.value = 3;
  auto r = averbs::async_nop(ctx, p, averbs::use_request);
  std::error_code ec;
  EXPECT_EQ(r.get(ec), 0u);
  EXPECT_EQ(ec, averbs::wc_status::rem_access_err);
}

TEST(request, cancel_completes_with_operation_aborted_once) {
  averbs::context ctx;
  averbs::nop_params p;
  p.delay = 1h;
  auto r = averbs::async_nop(ctx, p, averbs::use_request);
  EXPECT_TRUE(r.cancel());
  EXPECT_FALSE(r.cancel()) << "already completed";
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
  EXPECT_EQ(ctx.stats().cancelled, 1u);
}

TEST(request, native_handle_becomes_readable_on_completion) {
  averbs::context ctx;
  averbs::nop_params p;
  p.defer = true;
  p.value = 11;
  auto r = averbs::async_nop(ctx, p, averbs::use_request);
  const int fd = r.native_handle();
  pollfd pfd{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 0) << "not complete yet";
  // The program's own loop: the context descriptor says progress is due.
  pollfd cfd{ctx.native_handle(), POLLIN, 0};
  ASSERT_EQ(::poll(&cfd, 1, 1000), 1);
  ctx.poll();
  EXPECT_EQ(::poll(&pfd, 1, 1000), 1);
  EXPECT_EQ(r.get(), 11u);
}

TEST(request, native_handle_of_a_completed_request_is_readable_at_once) {
  averbs::context ctx;
  auto r = averbs::async_nop(ctx, {}, averbs::use_request);  // completes inline
  ASSERT_TRUE(r.ready());
  pollfd pfd{r.native_handle(), POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 1);
}

TEST(request, slot_eventfd_is_quiet_for_the_next_occupant) {
  averbs::context ctx;
  {
    auto r = averbs::async_nop(ctx, {}, averbs::use_request);
    (void)r.native_handle();
    r.get();
  }
  averbs::nop_params p;
  p.delay = 1h;
  auto r2 = averbs::async_nop(ctx, p, averbs::use_request);
  pollfd pfd{r2.native_handle(), POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 0) << "a reused slot must not look complete";
  r2.cancel();
}

TEST(request, dropping_a_pending_handle_detaches_without_leaking) {
  averbs::manual_clock clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);
  {
    averbs::nop_params p;
    p.delay = 1ms;
    auto r = averbs::async_nop(ctx, p, averbs::use_request);
  }
  EXPECT_EQ(ctx.stats().in_flight, 1u) << "the operation still runs";
  clk.advance(1ms);
  ctx.poll();
  EXPECT_EQ(ctx.stats().in_flight, 0u) << "its completion freed the slot";
}

TEST(request, completion_from_another_thread_wakes_a_blocked_waiter) {
  averbs::context_options o;
  o.spin = 0ns;  // block in the kernel at once
  averbs::context ctx(o);
  manual_op op;
  auto r = async_manual(ctx, op, averbs::use_request);
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    op.done.complete({}, 3);
  });
  r.wait();
  EXPECT_EQ(r.get(), 3);
  t.join();
}

TEST(request, slab_grows_and_every_slot_is_returned) {
  averbs::context ctx;
  std::vector<averbs::request<std::uint64_t>> rs;
  averbs::nop_params p;
  p.delay = 1h;
  for (int i = 0; i < 1000; ++i) rs.push_back(averbs::async_nop(ctx, p, averbs::use_request));
  EXPECT_GE(ctx.stats().slots, 1000u);
  EXPECT_EQ(ctx.stats().in_flight, 1000u);
  for (auto& r : rs) r.cancel();
  rs.clear();
  EXPECT_EQ(ctx.stats().in_flight, 0u);
}

// A delay too long for the clock means "never": the deadline saturates
// instead of wrapping into the past (where it fired at once, or left the
// timerfd unarmable for every later timer), and later timers still fire.
TEST(request, a_delay_of_nanoseconds_max_never_fires_and_later_timers_still_do) {
  averbs::context ctx;
  averbs::nop_params forever;
  forever.delay = std::chrono::nanoseconds::max();
  auto never = averbs::async_nop(ctx, forever, averbs::use_request);
  averbs::nop_params soon;
  soon.delay = 2ms;
  auto r = averbs::async_nop(ctx, soon, averbs::use_request);
  ASSERT_TRUE(r.wait_for(5s)) << "a later timer did not fire";
  EXPECT_FALSE(never.ready());
  // A wait with a timeout just short of max() waits, rather than timing
  // out at once on an overflowed deadline.
  auto w = std::async(std::launch::async, [&] { return never.wait_for(std::chrono::nanoseconds::max() - 1ns); });
  EXPECT_EQ(w.wait_for(50ms), std::future_status::timeout);
  never.cancel();
  EXPECT_TRUE(w.get()) << "the cancel completed it, which ends the wait";
}

// A wait must not leave while a completer that saw it waiting may still
// wake its thread (the thread could end, and its state with it), also when
// it leaves by an exception: a handler run by the alertable wait threw.
// The test plays the completer by hand: "completed, still delivering" once
// the waiter is armed; then a throwing handler wakes the waiter.
TEST(request, a_wait_left_by_a_throwing_handler_waits_for_the_completer_to_finish) {
  namespace d = averbs::detail;
  averbs::context ctx;
  manual_op op, apc;
  auto r = async_manual(ctx, op, averbs::use_request);
  d::slot& s = ctx.detail_impl().at(op.done.id().index);
  std::atomic<bool> started{false}, left{false};
  std::thread waiter([&] {
    async_manual(ctx, apc, [](std::error_code, int) { throw std::runtime_error("handler"); });
    started.store(true);
    try {
      r.wait_for(std::chrono::hours(1), averbs::wait_mode::alertable);
    } catch (const std::runtime_error&) {
    }
    left.store(true);
  });
  while (!started.load() || (s.word.load() & d::flag_waiter) == 0) std::this_thread::yield();
  std::uint64_t w = s.word.load();
  while (!s.word.compare_exchange_weak(w, (w & ~std::uint64_t{d::state_mask}) | d::state_completed |
                                              d::flag_delivering)) {
  }
  apc.done.complete({}, 0);  // queues the throwing handler, wakes the waiter
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(left.load()) << "the wait left while its completer was still delivering";
  s.word.fetch_and(~std::uint64_t{d::flag_delivering});
  waiter.join();
  EXPECT_TRUE(left.load());
  EXPECT_EQ(r.get(), 0);
}

// A delay used as a timeout and cancelled when the work finishes first
// must not leave its timer queued until the deadline: a program doing so
// at a high rate would hold every cancelled timer of the last hour.
TEST(request, cancelled_delays_do_not_pile_up_in_the_timer_queue) {
  averbs::manual_clock clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);
  averbs::nop_params p;
  p.delay = 1h;
  averbs::nop_params live = p;
  live.value = 3;
  auto kept = averbs::async_nop(ctx, live, averbs::use_request);  // not cancelled: must stay
  for (int i = 0; i < 10000; ++i) {
    auto r = averbs::async_nop(ctx, p, averbs::use_request);
    ASSERT_TRUE(r.cancel());
    std::error_code ec;
    r.get(ec);
    ASSERT_EQ(ec, errc::operation_aborted);
  }
  EXPECT_LT(ctx.stats().timers, 200u) << "cancelled timers stay queued";
  EXPECT_FALSE(kept.ready());
  clk.advance(1h);
  ctx.poll();
  ASSERT_TRUE(kept.ready()) << "the live timer was swept with the cancelled ones";
  EXPECT_EQ(kept.get(), 3u);
}

// A completer on another thread publishes "completed" and then signals the
// request's descriptor.  A waiter that sees "completed" first takes the
// result and frees the slot at once; the next request in that slot must
// not inherit the signal (its descriptor readable while it is pending).
TEST(request, a_completer_signalling_late_does_not_touch_the_next_occupant) {
  averbs::context ctx;
  std::atomic<manual_op*> go{nullptr};
  std::atomic<bool> stop{false};
  std::thread completer([&] {
    while (!stop.load()) {
      if (manual_op* op = go.exchange(nullptr)) op->done.complete({}, 5);
    }
  });
  int spurious = 0;
  for (int i = 0; i < 3000; ++i) {
    manual_op op;
    auto r = async_manual(ctx, op, averbs::use_request);
    (void)r.native_handle();  // the completer must signal it
    go.store(&op);
    while (!r.ready()) {
    }
    ASSERT_EQ(r.get(), 5);
    manual_op next;
    auto r2 = async_manual(ctx, next, averbs::use_request);
    pollfd pfd{r2.native_handle(), POLLIN, 0};
    if (::poll(&pfd, 1, 0) != 0) ++spurious;
    ASSERT_FALSE(r2.ready());
    next.done.complete({}, 0);
    r2.get();
  }
  stop.store(true);
  completer.join();
  EXPECT_EQ(spurious, 0) << "a pending request's descriptor was readable";
}

// A completer publishes "completed" with its delivery still under way,
// wakes the waiter, then clears the delivery flag.  If the wake-up comes
// after the waiter registered on the request but before it armed its sleep,
// it is lost, and nothing wakes the waiter again: it must not sleep on a
// request in that state.  The test's target plays the completer by hand in
// exactly that window (inside arm()), and clears the flag 50 ms later.
TEST(request, a_waiter_does_not_sleep_through_a_completion_whose_wake_up_went_by) {
  namespace d = averbs::detail;
  averbs::context ctx;
  manual_op op;
  auto r = async_manual(ctx, op, averbs::use_request);
  d::slot& s = ctx.detail_impl().at(op.done.id().index);
  struct racing_target final : d::wait_target {
    d::request_waiter inner;
    d::slot& s;
    std::thread clearer;
    racing_target(d::slot& sl, d::request_id id) : inner(sl, id), s(sl) {}
    bool ready() noexcept override { return inner.ready(); }
    bool settling() noexcept override { return inner.settling(); }
    bool arm(d::thread_state& ts) noexcept override {
      if (!inner.arm(ts)) return false;
      if (!clearer.joinable()) {
        std::uint64_t w = s.word.load();
        while (!s.word.compare_exchange_weak(w, (w & ~std::uint64_t{d::state_mask}) | d::state_completed |
                                                    d::flag_delivering)) {
        }
        ts.wake();  // before the thread armed its sleep: lost
        clearer = std::thread([this] {
          std::this_thread::sleep_for(50ms);
          s.word.fetch_and(~std::uint64_t{d::flag_delivering});  // no wake-up follows
        });
      }
      return true;
    }
    void disarm() noexcept override { inner.disarm(); }
  } target(s, op.done.id());
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    ctx.detail_impl().wait(target, std::chrono::nanoseconds::max(), false);
    returned.store(true);
  });
  for (int i = 0; i < 5000 && !returned.load(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(returned.load()) << "the waiter slept through the completion";
  if (!returned.load()) {
    if (d::thread_state* t = s.waiter.load()) t->wake();  // let the thread end
  }
  waiter.join();
  target.clearer.join();
  EXPECT_EQ(r.get(), 0);
}

}  // namespace
