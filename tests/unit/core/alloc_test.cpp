// SPDX-License-Identifier: MIT
// Rule 8: no steady-state allocation.  This program replaces the global
// operator new to count every heap allocation in the process, libaverbs
// included, then runs a million request cycles per delivery path after a
// warm-up and asserts that none allocated.
#include <averbs/async.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<std::uint64_t> g_allocations{0};
}

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace std::chrono_literals;
constexpr int cycles = 1'000'000;
constexpr int batch = 64;

template <class Body>
std::uint64_t allocations_during(Body&& body) {
  body(cycles / 10);  // warm-up: the slab, rings and queues reach their size
  const std::uint64_t before = g_allocations.load();
  body(cycles);
  return g_allocations.load() - before;
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
