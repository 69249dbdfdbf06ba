// SPDX-License-Identifier: MIT
#include "core/timer_queue.hpp"

#include <sys/timerfd.h>

#include <algorithm>
#include <array>
#include <ctime>

namespace averbs::detail {

void arm_timerfd(int fd, const clock& c, bool steady, clock::time_point deadline) noexcept {
  std::int64_t ns = deadline.time_since_epoch().count();
  if (!steady) {
    timespec mono{};
    ::clock_gettime(CLOCK_MONOTONIC, &mono);
    const std::int64_t now = std::int64_t{mono.tv_sec} * 1'000'000'000 + mono.tv_nsec;
    const clock::duration left = deadline - c.now();  // (a deadline of max() is never armed)
    ns = left.count() <= 0 ? now : left.count() > INT64_MAX - now ? INT64_MAX : now + left.count();
  }
  itimerspec its{};
  its.it_value.tv_sec = ns / 1'000'000'000;
  its.it_value.tv_nsec = ns % 1'000'000'000;
  if (its.it_value.tv_sec <= 0 && its.it_value.tv_nsec <= 0) {
    its.it_value.tv_sec = 0;
    its.it_value.tv_nsec = 1;
  }
  ::timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, nullptr);
}

bool timer_queue::schedule(clock::time_point deadline, timer_fn fn, void* arg,
                           const timer_payload& p, timer_alive_fn alive) {
  std::lock_guard lock(mu_);
  const std::uint64_t seq = seq_++;
  heap_.push_back({deadline, seq, fn, arg, p, alive});
  std::push_heap(heap_.begin(), heap_.end(), later{});
  return heap_.front().seq == seq;
}

std::size_t timer_queue::run_expired(clock::time_point now) {
  std::size_t total = 0;
  for (;;) {
    // Take a batch under the lock, run it outside so timer functions may
    // schedule (retry timers re-arm themselves).
    std::array<entry, 32> batch;
    std::size_t n = 0;
    {
      std::lock_guard lock(mu_);
      while (n < batch.size() && !heap_.empty() && heap_.front().deadline <= now) {
        std::pop_heap(heap_.begin(), heap_.end(), later{});
        batch[n++] = heap_.back();
        heap_.pop_back();
      }
    }
    if (n == 0) return total;
    for (std::size_t i = 0; i < n; ++i) batch[i].fn(batch[i].arg, batch[i].payload);
    total += n;
  }
}

void timer_queue::note_cancelled() noexcept {
  std::lock_guard lock(mu_);
  if (++cancelled_ < 64 || cancelled_ * 2 < heap_.size()) return;
  std::erase_if(heap_, [](const entry& e) { return e.alive != nullptr && !e.alive(e.arg, e.payload); });
  std::make_heap(heap_.begin(), heap_.end(), later{});
  cancelled_ = 0;
}

clock::time_point timer_queue::next_deadline() const {
  std::lock_guard lock(mu_);
  return heap_.empty() ? clock::time_point::max() : heap_.front().deadline;
}

std::size_t timer_queue::size() const {
  std::lock_guard lock(mu_);
  return heap_.size();
}

void timer_queue::reserve(std::size_t n) {
  std::lock_guard lock(mu_);
  heap_.reserve(n);
}

}  // namespace averbs::detail
