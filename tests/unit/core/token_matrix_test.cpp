// SPDX-License-Identifier: MIT
// The compile matrix: one operation called with every token kind, for a
// value result and for a void result, including a move-only callback.  The
// static_asserts pin down what the initiating function returns.
#include <averbs/async.hpp>

#include <gtest/gtest.h>

#include <coroutine>
#include <exception>
#include <future>
#include <memory>
#include <type_traits>

namespace {

using namespace std::chrono_literals;

// A void operation written once, like every averbs operation.
template <averbs::completion_token<void> Token>
auto async_void_nop(averbs::context& ctx, Token&& token) {
  return averbs::detail::initiate<void>(ctx, nullptr, std::forward<Token>(token),
                                        [](averbs::detail::completer<void> c) noexcept { c.complete({}); });
}

struct move_only_handler {
  std::unique_ptr<int> p = std::make_unique<int>(1);
  int* hits;
  void operator()(std::error_code, std::uint64_t) && { *hits += *p; }
};

struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

task await_both(averbs::context* ctx, int* done) {
  const std::uint64_t v = co_await averbs::async_nop(*ctx, {}, averbs::use_awaitable);
  static_assert(std::is_same_v<decltype(v), const std::uint64_t>);
  co_await async_void_nop(*ctx, averbs::use_awaitable);
  *done = 1;
}

TEST(token_matrix, value_operation_with_every_token) {
  averbs::context ctx;
  averbs::completion_port port(ctx);

  auto r = averbs::async_nop(ctx, {}, averbs::use_request);
  static_assert(std::is_same_v<decltype(r), averbs::request<std::uint64_t>>);
  auto s = averbs::async_nop(ctx, {}, averbs::bind_port(port, 1));
  static_assert(std::is_same_v<decltype(s), averbs::port_submission<std::uint64_t>>);
  auto f = averbs::async_nop(ctx, {}, averbs::use_future);
  static_assert(std::is_same_v<decltype(f), std::future<std::uint64_t>>);
  int hits = 0;
  static_assert(std::is_void_v<decltype(averbs::async_nop(ctx, {}, [](std::error_code, std::uint64_t) {}))>);
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) { ++hits; });
  averbs::async_nop(ctx, {}, move_only_handler{std::make_unique<int>(1), &hits});
  int done = 0;
  await_both(&ctx, &done);

  EXPECT_EQ(r.get(), 0u);
  std::array<averbs::completion_entry, 1> e;
  EXPECT_EQ(port.get(e, 0ns), 1u);
  EXPECT_EQ(f.get(), 0u);
  while (ctx.alertable_wait(0ns) != 0) {
  }
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(done, 1);
}

TEST(token_matrix, void_operation_with_every_token) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  auto r = async_void_nop(ctx, averbs::use_request);
  static_assert(std::is_same_v<decltype(r), averbs::request<void>>);
  auto s = async_void_nop(ctx, averbs::bind_port(port, 2, averbs::port_flags::skip_on_inline_success));
  static_assert(std::is_same_v<decltype(s), averbs::port_submission<void>>);
  EXPECT_TRUE(s.completed_inline());
  auto f = async_void_nop(ctx, averbs::use_future);
  static_assert(std::is_same_v<decltype(f), std::future<void>>);
  int hits = 0;
  async_void_nop(ctx, [&](std::error_code ec) { hits += !ec; });
  r.get();
  f.get();
  EXPECT_EQ(ctx.alertable_wait(0ns), 1u);
  EXPECT_EQ(hits, 1);
}

// Misuse is rejected by the concept, not by a template-error wall.
static_assert(!averbs::completion_token<int, std::uint64_t>);
static_assert(!averbs::completion_token<void (*)(int), std::uint64_t>);
static_assert(averbs::completion_token<void (*)(std::error_code, std::uint64_t), std::uint64_t>);
static_assert(averbs::completion_token<move_only_handler, std::uint64_t>);
static_assert(!averbs::completion_token<move_only_handler, void>);

}  // namespace
