// SPDX-License-Identifier: MIT
// Rule 8: no steady-state allocation.  This program counts every heap
// allocation in the process, libaverbs included (counting_new.cpp replaces
// the global operator new), then runs a million request cycles per delivery path after a
// warm-up and asserts that none allocated.
#include "counting_new.hpp"

#include <averbs/async.hpp>

#include <gtest/gtest.h>

#include <array>

namespace {

using averbs::test::heap_allocations;
using namespace std::chrono_literals;
constexpr int cycles = 1'000'000;
constexpr int batch = 64;

template <class Body>
std::uint64_t allocations_during(Body&& body) {
  body(cycles / 10);  // warm-up: the slab, rings and queues reach their size
  const std::uint64_t before = heap_allocations();
  body(cycles);
  return heap_allocations() - before;
}

TEST(alloc, use_request_cycles_do_not_allocate) {
  averbs::context ctx;
  averbs::nop_params p;
  p.value = 1;
  std::uint64_t sum = 0;
  EXPECT_EQ(allocations_during([&](int n) {
              for (int i = 0; i < n; ++i) sum += averbs::async_nop(ctx, p, averbs::use_request).get();
            }),
            0u);
  EXPECT_GT(sum, 0u);
}

TEST(alloc, deferred_use_request_cycles_do_not_allocate) {
  averbs::context ctx;
  averbs::nop_params p;
  p.defer = true;
  p.value = 1;
  std::uint64_t sum = 0;
  EXPECT_EQ(allocations_during([&](int n) {
              for (int i = 0; i < n; ++i) sum += averbs::async_nop(ctx, p, averbs::use_request).get();
            }),
            0u);
  EXPECT_GT(sum, 0u);
}

TEST(alloc, port_cycles_in_batches_do_not_allocate) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  std::array<averbs::completion_entry, batch> e;
  std::uint64_t got = 0;
  EXPECT_EQ(allocations_during([&](int n) {
              for (int i = 0; i < n; i += batch) {
                for (int k = 0; k < batch; ++k) averbs::async_nop(ctx, {}, averbs::bind_port(port, k));
                got += port.get(e, 0ns);
              }
            }),
            0u);
  EXPECT_GT(got, 0u);
}

// A handler that starts its own successor, in two chains: the thread's
// handler queue is never empty while they run, so it must reuse its front
// rather than grow by one entry per completion.
struct chain {
  averbs::context* ctx;
  int* left;
  void operator()(std::error_code, std::uint64_t) const {
    if (--*left > 0) averbs::async_nop(*ctx, {}, *this);
  }
};

TEST(alloc, two_self_restarting_callback_chains_do_not_allocate) {
  averbs::context ctx;
  int a = 0, b = 0;
  EXPECT_EQ(allocations_during([&](int n) {
              a = b = n / 2;
              averbs::async_nop(ctx, {}, chain{&ctx, &a});
              averbs::async_nop(ctx, {}, chain{&ctx, &b});
              while (ctx.alertable_wait(0ns) != 0) {
              }
            }),
            0u);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

TEST(alloc, callback_cycles_in_batches_do_not_allocate) {
  averbs::context ctx;
  std::uint64_t ran = 0;
  EXPECT_EQ(allocations_during([&](int n) {
              for (int i = 0; i < n; i += batch) {
                for (int k = 0; k < batch; ++k)
                  averbs::async_nop(ctx, {}, [&ran](std::error_code, std::uint64_t) { ++ran; });
                ctx.alertable_wait(0ns);
              }
            }),
            0u);
  EXPECT_GT(ran, 0u);
}

TEST(alloc, timer_cycles_do_not_allocate) {
  averbs::manual_clock clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);
  averbs::completion_port port(ctx);
  averbs::nop_params p;
  p.delay = 1us;
  std::array<averbs::completion_entry, batch> e;
  EXPECT_EQ(allocations_during([&](int n) {
              for (int i = 0; i < n; i += batch) {
                for (int k = 0; k < batch; ++k) averbs::async_nop(ctx, p, averbs::bind_port(port, k));
                clk.advance(1us);
                ctx.poll();
                port.get(e, 0ns);
              }
            }),
            0u);
}

}  // namespace
