// SPDX-License-Identifier: MIT
#include "core/thread_state.hpp"

#include "core/context_impl.hpp"

#include <averbs/error.hpp>

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <utility>

namespace averbs::detail {

namespace {

// The calling thread's state.  A plain pointer: it stays readable while the
// thread's C++ thread_local destructors run, whatever their order, so a
// destructor that waits on a request after the one below has run still
// finds the state (it is retired, not freed).
thread_local thread_state* tl_state = nullptr;
thread_local bool tl_keyed = false;         // the key's destructor frees tl_state
thread_local bool tl_retirer_gone = false;  // the destructor below has run

// Retires the state when the thread's thread_local objects are destroyed:
// handlers still queued are dropped, none is queued after.  The state itself
// stays until the thread's POSIX keys are destroyed, which happens after
// every thread_local destructor; the main thread's stays until the process
// ends (exit() destroys no keys), for static destructors that wait.
struct thread_state_retirer {
  bool armed = false;
  ~thread_state_retirer() {
    tl_retirer_gone = true;
    thread_state* const ts = tl_state;
    if (ts == nullptr) return;
    ts->retire();
    if (!tl_keyed) {  // no key could hold it: freed here, as before keys
      tl_state = nullptr;
      ts->release();
    }
  }
};
thread_local thread_state_retirer tl_retirer;

void release_state(void* p) noexcept {
  auto* ts = static_cast<thread_state*>(p);
  ts->retire();
  // A later key destructor (another library's) that waits makes a fresh
  // state; the key is set again, and this runs again for that one.
  tl_state = nullptr;
  tl_keyed = false;
  ts->release();
}

struct state_key {
  pthread_key_t key{};
  std::atomic<bool> ok{false};
  state_key() noexcept { ok.store(::pthread_key_create(&key, &release_state) == 0); }
  // Unloading the library (dlclose) must not leave a destructor pointing
  // into it; the states of threads still running then are leaked.
  ~state_key() {
    if (ok.exchange(false)) ::pthread_key_delete(key);
  }
};

state_key& the_key() noexcept {
  static state_key k;  // first use, not static-initialisation order
  return k;
}

}  // namespace

thread_state& thread_state::current() {
  if (tl_state != nullptr) return *tl_state;
  auto* ts = new thread_state();
  // Without a key (none left in the process, or after the library's
  // teardown) the retirer frees the state, which then cannot serve waits
  // made after it; a state made after the retirer ran is then leaked.
  state_key& key = the_key();
  tl_keyed = key.ok.load() && ::pthread_setspecific(key.key, ts) == 0;
  tl_state = ts;
  if (!tl_retirer_gone) tl_retirer.armed = true;  // first use: registers its destructor
  return *ts;
}

thread_state* thread_state::try_current(std::error_code& ec) noexcept {
  try {
    return &current();
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::no_resources);
  }
  return nullptr;
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

// The queue holds at most the reserved requests' handlers (each queues one,
// and keeps its reservation until its slot is freed, after it ran), so a
// capacity of at least `reserved_` means push() appends without growing,
// once the entries already run are moved off the front.  The check is
// lock-free: of the reservations held at any moment, the one counted last
// saw a count at least their number, and a room at least that.
void thread_state::reserve() {
  const std::size_t want = reserved_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (want <= room_.load(std::memory_order_acquire)) return;
  try {
    std::lock_guard lock(mu_);
    if (items_.capacity() < want) items_.reserve(std::max({want, 2 * items_.capacity(), std::size_t{16}}));
    room_.store(items_.capacity(), std::memory_order_release);
  } catch (...) {
    reserved_.fetch_sub(1, std::memory_order_relaxed);
    throw;
  }
}

bool thread_state::push(context_impl& ctx, std::uint32_t index) noexcept {
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
    items_.push_back({&ctx, index});  // within the reserved capacity: does not allocate
    ctx.add_ref();
    queued_.fetch_add(1, std::memory_order_release);
    signal_locked(need_write);
    if (need_write) write_wake_locked();
    update_handle_locked();
  }
  return true;
}

// Under the lock, with the flag it goes with: after the lock the owner
// may have run the handler, dropped its last reference and freed this
// state (the descriptor closed, its number reused), or disarmed and
// cleared the flag before the write landed (a count no one drains would
// wake every later sleep at once).  A non-blocking eventfd write.
void thread_state::write_wake_locked() noexcept {
  const std::uint64_t one = 1;
  while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
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
  std::lock_guard lock(mu_);
  bool need_write = false;
  signal_locked(need_write);
  if (need_write) write_wake_locked();
}

void thread_state::retire() noexcept {
  std::vector<item> left;  // taken whole: no allocation here
  std::size_t head = 0;
  {
    std::lock_guard lock(mu_);
    if (!alive_) return;
    alive_ = false;
    left.swap(items_);
    head = std::exchange(head_, 0);
    queued_.store(0, std::memory_order_relaxed);
    update_handle_locked();
  }
  for (std::size_t i = head; i < left.size(); ++i) {
    left[i].ctx->run_handler(left[i].index, false);
    left[i].ctx->release();
  }
}

}  // namespace averbs::detail
