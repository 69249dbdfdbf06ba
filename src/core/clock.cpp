// SPDX-License-Identifier: MIT
#include <averbs/async/clock.hpp>

#include <algorithm>
#include <ctime>

namespace averbs {

clock::time_point steady_clock::now() const noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

steady_clock& steady_clock::instance() noexcept {
  static steady_clock c;
  return c;
}

clock::time_point manual_clock::now() const noexcept {
  std::lock_guard lock(mu_);
  return now_;
}

void manual_clock::subscribe(clock_listener& l) {
  std::lock_guard lock(mu_);
  listeners_.push_back(&l);
}

void manual_clock::unsubscribe(clock_listener& l) noexcept {
  std::lock_guard lock(mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), &l), listeners_.end());
}

void manual_clock::advance(duration d) {
  if (d <= duration::zero()) return;
  {
    std::lock_guard lock(mu_);
    // Saturates: the clock never runs backwards.
    now_ = d > time_point::max() - now_ ? time_point::max() : now_ + d;
  }
  notify();
}

void manual_clock::set(time_point t) {
  {
    std::lock_guard lock(mu_);
    if (t <= now_) return;
    now_ = t;
  }
  notify();
}

void manual_clock::notify() {
  std::lock_guard lock(mu_);
  for (clock_listener* l : listeners_) l->on_clock_changed();
}

}  // namespace averbs
