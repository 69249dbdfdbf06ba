// SPDX-License-Identifier: MIT
#include "counting_new.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<std::uint64_t> g_allocations{0};
thread_local bool tl_fail = false;
thread_local std::uint64_t tl_countdown = 0;  // fail when it reaches 0 from 1
thread_local bool tl_failed = false;
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (tl_fail) throw std::bad_alloc();
  if (tl_countdown != 0 && --tl_countdown == 0) {
    tl_failed = true;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace averbs::test {

std::uint64_t heap_allocations() noexcept { return g_allocations.load(); }

void fail_allocations_on_this_thread(bool fail) noexcept { tl_fail = fail; }

bool fail_nth_allocation_on_this_thread(std::uint64_t n) noexcept {
  const bool failed = tl_failed;
  tl_countdown = n;
  tl_failed = false;
  return failed;
}

}  // namespace averbs::test
