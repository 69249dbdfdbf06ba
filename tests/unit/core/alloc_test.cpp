// SPDX-License-Identifier: MIT
// Rule 8: no steady-state allocation.  This program counts every heap
// allocation in the process, libaverbs included (counting_new.cpp replaces
// the global operator new), then runs a million request cycles per delivery path after a
// warm-up and asserts that none allocated.
#include "counting_new.hpp"

#include <averbs/async.hpp>

#include <gtest/gtest.h>

#include <array>
#include <future>
#include <thread>
#include <utility>

namespace {

using averbs::errc;
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

// A completer cannot fail: the room a completion needs in its thread's
// handler queue or its port's ring is made when the request starts.  Here
// every allocation on the completing thread fails while 40 completions
// reach a queue and a ring that were empty (so they would have to grow):
// every one must arrive (before, the thread queue's growth ended the
// process and the port dropped what did not fit).
TEST(alloc, completions_need_no_allocation_on_the_completing_thread) {
  constexpr int n = 40;
  averbs::context ctx;
  averbs::nop_params p;
  p.defer = true;  // completed by whoever polls next
  p.value = 1;
  auto complete_all_without_memory = [&] {
    std::thread completer([&] {
      averbs::test::fail_allocations_on_this_thread(true);
      ctx.poll();
      averbs::test::fail_allocations_on_this_thread(false);
    });
    completer.join();
  };
  int ran = 0;
  std::thread initiator([&] {  // its handler queue starts empty
    for (int i = 0; i < n; ++i) averbs::async_nop(ctx, p, [&](std::error_code ec, std::uint64_t) { ran += !ec; });
    complete_all_without_memory();
    while (ran < n && ctx.alertable_wait(0ns) != 0) {
    }
  });
  initiator.join();
  EXPECT_EQ(ran, n) << "handlers lost when their queue could not grow";

  averbs::completion_port port(ctx);
  for (int i = 0; i < n; ++i) averbs::async_nop(ctx, p, averbs::bind_port(port, std::uint64_t(i)));
  complete_all_without_memory();
  std::array<averbs::completion_entry, n> e;
  EXPECT_EQ(port.get(e, 0ns), std::size_t{n}) << "port entries lost when the ring could not grow";
  EXPECT_EQ(ctx.stats().in_flight, 0u);
}

// A future's error is an exception the completing thread makes: without
// memory for it the future reports the bad_alloc, not a broken promise
// that loses the error (and with it the result of the operation).
TEST(alloc, a_futures_error_completed_without_memory_is_not_a_broken_promise) {
  averbs::context ctx;
  averbs::nop_params p;
  p.defer = true;
  p.error = averbs::make_error_code(errc::timed_out);
  auto f = averbs::async_nop(ctx, p, averbs::use_future);
  std::thread completer([&] {
    averbs::test::fail_allocations_on_this_thread(true);
    ctx.poll();
    averbs::test::fail_allocations_on_this_thread(false);
  });
  completer.join();
  ASSERT_EQ(f.wait_for(0ns), std::future_status::ready);
  try {
    f.get();
    ADD_FAILURE() << "no error";
  } catch (const std::bad_alloc&) {
    SUCCEED();
  } catch (const std::system_error& e) {
    // The exception could be made after all (an emergency pool): the error itself.
    EXPECT_EQ(e.code(), averbs::make_error_code(errc::timed_out)) << e.what();
  }
}

// When that room cannot be made, starting the request fails with
// bad_alloc and takes nothing, its reservation included: once the pending
// requests are gone, as many fit again in the room already made, with
// every allocation failing.
TEST(alloc, a_request_whose_room_cannot_be_made_does_not_start) {
  averbs::manual_clock clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);
  averbs::completion_port port(ctx);
  averbs::nop_params pending;
  pending.delay = 1h;
  constexpr int room = 16;  // what a fresh thread's queue and a port start with
  int ran = 0;
  auto start_both = [&](int n) {
    for (int i = 0; i < n; ++i) {
      averbs::async_nop(ctx, pending, [&](std::error_code, std::uint64_t) { ++ran; });
      averbs::async_nop(ctx, pending, averbs::bind_port(port, 0));
    }
  };
  auto finish_all = [&] {
    clk.advance(1h);
    ctx.poll();
    const std::size_t handlers = ctx.alertable_wait(0ns);
    std::array<averbs::completion_entry, room> e;
    return std::pair{handlers, port.get(e, 0ns)};
  };
  bool callback_threw = false, port_threw = false, refilled = false;
  std::pair<std::size_t, std::size_t> first{}, second{};
  std::thread t([&] {  // a fresh thread: an empty handler queue
    ctx.alertable_wait(0ns);  // makes the thread's state
    start_both(room);
    averbs::test::fail_allocations_on_this_thread(true);
    try {
      averbs::async_nop(ctx, pending, [](std::error_code, std::uint64_t) {});
    } catch (const std::bad_alloc&) {
      callback_threw = true;
    }
    try {
      averbs::async_nop(ctx, pending, averbs::bind_port(port, 0));
    } catch (const std::bad_alloc&) {
      port_threw = true;
    }
    averbs::test::fail_allocations_on_this_thread(false);
    EXPECT_EQ(ctx.stats().in_flight, 2u * room) << "a failed start kept a request";
    first = finish_all();
    averbs::test::fail_allocations_on_this_thread(true);
    try {
      start_both(room);  // a reservation the failed starts kept would not fit
      refilled = true;
    } catch (const std::bad_alloc&) {
    }
    averbs::test::fail_allocations_on_this_thread(false);
    second = finish_all();
  });
  t.join();
  EXPECT_TRUE(callback_threw);
  EXPECT_TRUE(port_threw);
  EXPECT_EQ(first, std::pair(std::size_t{room}, std::size_t{room}));
  EXPECT_TRUE(refilled) << "the room the failed starts reserved was not given back";
  EXPECT_EQ(second, std::pair(std::size_t{room}, std::size_t{room}));
  EXPECT_EQ(ran, 2 * room);
  EXPECT_EQ(ctx.stats().in_flight, 0u);
}

}  // namespace
