// SPDX-License-Identifier: MIT
#include "core/thread_state.hpp"

#include "core/context_impl.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace averbs::detail {

namespace {

// Owns the thread's state; its destructor runs at thread exit.
struct thread_state_owner {
  thread_state* state = nullptr;
  ~thread_state_owner() {
    if (state != nullptr) state->exit();
  }
};

thread_local thread_state_owner tl_owner;

}  // namespace

thread_state& thread_state::current() {
  if (tl_owner.state == nullptr) tl_owner.state = new thread_state();
  return *tl_owner.state;
}

thread_state::thread_state() {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::system_error(errno, std::system_category(), "eventfd");
}

thread_state::~thread_state() {
  ::close(wake_fd_);
  if (handle_fd_ >= 0) ::close(handle_fd_);
}

int thread_state::handle_fd() {
  std::lock_guard lock(mu_);
  if (handle_fd_ < 0) {
    handle_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (handle_fd_ < 0) throw std::system_error(errno, std::system_category(), "eventfd");
    update_handle_locked();
  }
  return handle_fd_;
}

// Keeps the handle descriptor readable exactly while handlers are queued.
void thread_state::update_handle_locked() noexcept {
  if (handle_fd_ < 0) return;
  const bool want = head_ != items_.size();
  if (want == handle_signaled_) return;
  std::uint64_t v = 1;
  if (want) {
    while (::write(handle_fd_, &v, sizeof v) < 0 && errno == EINTR) {
    }
  } else {
    while (::read(handle_fd_, &v, sizeof v) < 0 && errno == EINTR) {
    }
  }
  handle_signaled_ = want;
}

void thread_state::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void thread_state::signal_locked(bool& need_write) noexcept {
  if (sleeping_ && !signaled_) {
    signaled_ = true;
    need_write = true;
  }
}

bool thread_state::push(context_impl& ctx, std::uint32_t index) {
  bool need_write = false;
  {
    std::lock_guard lock(mu_);
    if (!alive_) return false;
    if (head_ == items_.size()) {  // empty: rewind so the vector does not grow
      items_.clear();
      head_ = 0;
    } else if (head_ != 0 && items_.size() == items_.capacity()) {
      // Never empty (handlers that queue their successors): move what
      // waits to the front instead of growing by one per completion.
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
    items_.push_back({&ctx, index});
    ctx.add_ref();
    queued_.fetch_add(1, std::memory_order_release);
    signal_locked(need_write);
    update_handle_locked();
  }
  if (need_write) {
    const std::uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
  return true;
}

std::size_t thread_state::run() {
  std::size_t n = 0;
  for (;;) {
    item it;
    {
      std::lock_guard lock(mu_);
      if (head_ == items_.size()) return n;
      it = items_[head_++];
      queued_.fetch_sub(1, std::memory_order_relaxed);
      update_handle_locked();
    }
    struct ctx_ref {
      context_impl* ctx;
      ~ctx_ref() { ctx->release(); }
    } ref{it.ctx};
    ++n;
    it.ctx->run_handler(it.index, true);
  }
}

bool thread_state::arm(bool alertable) noexcept {
  std::lock_guard lock(mu_);
  if (alertable && head_ != items_.size()) return false;
  sleeping_ = true;
  return true;
}

void thread_state::disarm() noexcept {
  std::lock_guard lock(mu_);
  sleeping_ = false;
  if (signaled_) {
    std::uint64_t v;
    while (::read(wake_fd_, &v, sizeof v) < 0 && errno == EINTR) {
    }
    signaled_ = false;
  }
}

void thread_state::wake() noexcept {
  bool need_write = false;
  {
    std::lock_guard lock(mu_);
    signal_locked(need_write);
  }
  if (need_write) {
    const std::uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
}

void thread_state::exit() noexcept {
  std::vector<item> left;
  {
    std::lock_guard lock(mu_);
    alive_ = false;
    left.assign(items_.begin() + static_cast<std::ptrdiff_t>(head_), items_.end());
    items_.clear();
    head_ = 0;
    queued_.store(0, std::memory_order_relaxed);
  }
  for (const item& it : left) {
    it.ctx->run_handler(it.index, false);
    it.ctx->release();
  }
  release();
}

}  // namespace averbs::detail
