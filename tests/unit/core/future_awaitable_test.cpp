// SPDX-License-Identifier: MIT
// Rule 3: use_future and use_awaitable.
#include <averbs/async.hpp>

#include <gtest/gtest.h>

#include <coroutine>
#include <exception>
#include <future>
#include <optional>
#include <thread>

namespace {

using namespace std::chrono_literals;
using averbs::errc;

TEST(future, becomes_ready_when_a_wait_drives_progress) {
  averbs::context ctx;
  averbs::nop_params p;
  p.defer = true;
  p.value = 8;
  std::future<std::uint64_t> f = averbs::async_nop(ctx, p, averbs::use_future);
  EXPECT_EQ(f.wait_for(0s), std::future_status::timeout);
  ctx.poll();  // a single-threaded program drives progress itself
  ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
  EXPECT_EQ(f.get(), 8u);
}

TEST(future, carries_the_error_as_system_error) {
  averbs::context ctx;
  averbs::nop_params p;
  p.error = errc::busy;
  auto f = averbs::async_nop(ctx, p, averbs::use_future);
  try {
    f.get();
    FAIL() << "expected an exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::busy);
  }
}

TEST(future, is_satisfied_by_the_progress_thread) {
  averbs::context ctx;
  ctx.start_progress_thread();
  averbs::nop_params p;
  p.delay = 1ms;
  p.value = 3;
  auto f = averbs::async_nop(ctx, p, averbs::use_future);
  EXPECT_EQ(f.get(), 3u);
}

// A minimal eager coroutine type for the tests.
struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

task two_nops(averbs::context* ctx, std::uint64_t* sum, int* state) {
  averbs::nop_params p;
  p.value = 20;
  *state = 1;
  const std::uint64_t a = co_await averbs::async_nop(*ctx, p, averbs::use_awaitable);
  *state = 2;
  p.value = 22;
  p.defer = true;
  const std::uint64_t b = co_await averbs::async_nop(*ctx, p, averbs::use_awaitable);
  *sum = a + b;
  *state = 3;
}

TEST(awaitable, coroutine_resumes_only_inside_alertable_waits) {
  averbs::context ctx;
  std::uint64_t sum = 0;
  int state = 0;
  two_nops(&ctx, &sum, &state);
  EXPECT_EQ(state, 1) << "suspended on the first no-op, not resumed inline";
  EXPECT_EQ(ctx.alertable_wait(1s), 1u);
  EXPECT_EQ(state, 2) << "suspended on the deferred no-op";
  EXPECT_EQ(ctx.alertable_wait(1s), 1u);
  EXPECT_EQ(state, 3);
  EXPECT_EQ(sum, 42u);
}

task sync_after_resume(averbs::context* ctx, std::error_code* before, std::error_code* after) {
  averbs::nop_params p;
  averbs::nop(*ctx, p, *before);  // ordinary code until the first co_await
  co_await averbs::async_nop(*ctx, p, averbs::use_awaitable);
  averbs::nop(*ctx, p, *after);  // resumed inside the alertable wait: a handler
}

// docs/async.md rule 5: a coroutine resumed by its completion runs as a
// handler until it next suspends.
TEST(awaitable, a_resumed_coroutine_runs_as_a_handler) {
  averbs::context ctx;
  std::error_code before = averbs::errc::protocol_error, after;
  sync_after_resume(&ctx, &before, &after);
  EXPECT_FALSE(before) << before.message();
  ASSERT_EQ(ctx.alertable_wait(1s), 1u);
  EXPECT_EQ(after, averbs::errc::would_deadlock);
}

task catch_error(averbs::context* ctx, std::error_code* seen) {
  averbs::nop_params p;
  p.error = averbs::wc_status::retry_exc_err;
  try {
    co_await averbs::async_nop(*ctx, p, averbs::use_awaitable);
  } catch (const std::system_error& e) {
    *seen = e.code();
  }
}

TEST(awaitable, error_is_thrown_into_the_coroutine) {
  averbs::context ctx;
  std::error_code seen;
  catch_error(&ctx, &seen);
  ctx.alertable_wait(1s);
  EXPECT_EQ(seen, averbs::wc_status::retry_exc_err);
}

task wait_cancelled(averbs::context* ctx, averbs::request_group* g, std::error_code* seen) {
  averbs::nop_params p;
  p.delay = 1h;
  p.group = g;
  try {
    co_await averbs::async_nop(*ctx, p, averbs::use_awaitable);
  } catch (const std::system_error& e) {
    *seen = e.code();
  }
}

TEST(awaitable, cancellation_resumes_with_operation_aborted) {
  averbs::context ctx;
  averbs::request_group g(ctx);
  std::error_code seen;
  wait_cancelled(&ctx, &g, &seen);
  EXPECT_EQ(g.cancel(), 1u);
  ctx.alertable_wait(1s);
  EXPECT_EQ(seen, errc::operation_aborted);
}

// A lazy coroutine type: its frame is destroyed with the task object.
struct lazy_task {
  struct promise_type {
    lazy_task get_return_object() { return {std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_never initial_suspend() noexcept { return {}; }  // runs to its first co_await
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
  std::coroutine_handle<promise_type> h;
  lazy_task(std::coroutine_handle<promise_type> c) : h(c) {}
  lazy_task(lazy_task&& o) noexcept : h(std::exchange(o.h, nullptr)) {}
  ~lazy_task() {
    if (h) h.destroy();
  }
};

lazy_task wait_long(averbs::context* ctx, averbs::request_group* g, int* state) {
  averbs::nop_params p;
  p.delay = 1h;
  p.group = g;
  *state = 1;
  co_await averbs::async_nop(*ctx, p, averbs::use_awaitable);
  *state = 2;
}

// A frame destroyed while suspended cancels the operation and is not
// resumed by its completion (which wrote into the destroyed frame and
// resumed it).  ASan sees the old behaviour as a use after free.
TEST(awaitable, a_frame_destroyed_while_suspended_cancels_and_is_not_resumed) {
  averbs::context ctx;
  averbs::request_group g(ctx);
  int state = 0;
  {
    lazy_task t = wait_long(&ctx, &g, &state);
    EXPECT_EQ(state, 1);
  }
  EXPECT_EQ(g.cancel(), 0u) << "the destroyed frame's operation was left pending";
  ctx.alertable_wait(50ms);  // runs the cancelled operation's handler, which resumes nothing
  EXPECT_EQ(state, 1) << "the destroyed frame was resumed";

  // Completed but not yet resumed (queued for an alertable wait): the
  // frame goes first, and the queued completion resumes nothing.
  state = 0;
  {
    lazy_task t = [](averbs::context* c, int* st) -> lazy_task {
      averbs::nop_params q;
      q.value = 7;
      *st = 1;
      co_await averbs::async_nop(*c, q, averbs::use_awaitable);
      *st = 2;
    }(&ctx, &state);
    EXPECT_EQ(state, 1);
  }
  ctx.alertable_wait(50ms);
  EXPECT_EQ(state, 1) << "the destroyed frame was resumed";
}

lazy_task wait_long_alone(averbs::context* ctx, int* state) {
  averbs::nop_params p;
  p.delay = 1h;
  *state = 1;
  co_await averbs::async_nop(*ctx, p, averbs::use_awaitable);
  *state = 2;
}

// The context goes first (its shutdown aborts the operation and queues the
// completion for this thread), then the frame: destroying it touches
// nothing of the dead context, and the queued completion resumes nothing.
TEST(awaitable, a_frame_destroyed_after_its_context_touches_nothing_of_it) {
  int state = 0;
  std::optional<lazy_task> t;
  {
    averbs::context ctx;
    t.emplace(wait_long_alone(&ctx, &state));
    EXPECT_EQ(state, 1);
  }
  t.reset();
  averbs::context other;
  other.alertable_wait(10ms);  // runs what this thread has queued
  EXPECT_EQ(state, 1) << "the destroyed frame was resumed";
}

}  // namespace
