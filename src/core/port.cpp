// SPDX-License-Identifier: MIT
#include "core/context_impl.hpp"

#include <averbs/async/completion_port.hpp>
#include <averbs/error.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

namespace averbs {
namespace detail {

namespace {
void write_one(int fd) noexcept {
  const std::uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}
}  // namespace

port_impl::port_impl(context_impl& ctx) : ctx_(ctx), ring_(16) {
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw std::system_error(errno, std::system_category(), "eventfd");
  ctx_.add_ref();
}

port_impl::~port_impl() {
  ::close(fd_);
  ctx_.release();
}

void port_impl::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void port_impl::grow_locked(std::size_t need) {
  std::size_t size = std::max<std::size_t>(ring_.size(), 16);  // empty once closed
  while (size < need) size *= 2;
  if (size == ring_.size()) return;
  std::vector<item> bigger(size);
  for (std::size_t i = 0; i < count_; ++i) bigger[i] = ring_[(head_ + i) & (ring_.size() - 1)];
  ring_.swap(bigger);
  head_ = 0;
  room_.store(ring_.size(), std::memory_order_release);
}

thread_state* port_impl::push_locked(const item& it, bool& need_write) noexcept {
  ring_[(head_ + count_) & (ring_.size() - 1)] = it;
  ++count_;
  size_.store(count_, std::memory_order_release);
  if (armed_ && !signaled_) {  // an event loop watches native_handle()
    signaled_ = true;
    need_write = true;
  }
  return choose_sleeper_locked();
}

thread_state* port_impl::choose_sleeper_locked() noexcept {
  sleeper* s = sleepers_;
  if (s == nullptr) return nullptr;
  sleepers_ = s->next;
  if (sleepers_ != nullptr) sleepers_->prev = nullptr;
  s->next = s->prev = nullptr;
  s->ts->add_ref();  // the sleeper may leave (and its thread end) before the wake-up
  s->chosen.store(true, std::memory_order_release);
  return s->ts;
}

void port_impl::wake_chosen(thread_state* ts) noexcept {
  if (ts == nullptr) return;
  ts->wake();
  ts->release();
}

void port_impl::pass_on() noexcept {
  thread_state* ts = nullptr;
  {
    std::lock_guard lock(mu_);
    if (count_ != 0) ts = choose_sleeper_locked();
  }
  wake_chosen(ts);
}

void port_impl::clear_signal_locked() noexcept {
  if (signaled_ && count_ == 0) {
    std::uint64_t v;
    while (::read(fd_, &v, sizeof v) < 0 && errno == EINTR) {
    }
    signaled_ = false;
  }
}

// Lock-free while the ring is big enough.  Against a concurrent post(),
// which counts its packet and then reads reserved_ (sequentially
// consistent, as here): either this check sees the packet, or the post
// sees this reservation and grows the ring for both.  Among concurrent
// reservations, the one counted last saw a count at least their number.
void port_impl::reserve() {
  const std::size_t want = reserved_.fetch_add(1) + 1;
  if (want + posts_seen_.load() <= room_.load(std::memory_order_acquire)) return;
  try {
    std::lock_guard lock(mu_);
    grow_locked(reserved_.load() + posts_);
  } catch (...) {
    reserved_.fetch_sub(1, std::memory_order_relaxed);
    throw;
  }
}

// The eventfd is written under the lock, with the flag it goes with: after
// the lock a consumer may take the entry, free its slot (the port's last
// reference) and destroy the port, or clear the flag before the write
// lands (leaving the descriptor readable on an empty port).
bool port_impl::push_request(std::uint32_t index) noexcept {
  bool need_write = false;
  thread_state* wake = nullptr;
  {
    std::lock_guard lock(mu_);
    if (closed_) return false;
    wake = push_locked({0, 0, {}, index}, need_write);  // its reservation keeps the room
    if (need_write) write_one(fd_);
  }
  wake_chosen(wake);
  return true;
}

void port_impl::post(std::uint64_t key, std::uint64_t value, const std::error_code& ec) {
  bool need_write = false;
  thread_state* wake = nullptr;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    posts_seen_.store(posts_ + 1);  // before reading reserved_: see reserve()
    try {
      grow_locked(reserved_.load() + posts_ + 1);
    } catch (...) {
      posts_seen_.store(posts_);
      throw;
    }
    wake = push_locked({key, value, ec, no_index}, need_write);
    ++posts_;
    if (need_write) write_one(fd_);
  }
  wake_chosen(wake);
}

// Entries are taken under the lock and handed out after it, a chunk at a
// time: resetting an entry of `out` destroys what it held, possibly the
// last handle of an object whose teardown completes requests into this
// port (push_request takes mu_) or takes a device lock that a thread
// completing into this port holds.
std::size_t port_impl::try_get(std::span<completion_entry> out) noexcept {
  constexpr std::size_t chunk = 64;
  std::array<item, chunk> taken;
  std::size_t done = 0;
  while (done < out.size()) {
    std::size_t n = 0;
    {
      std::lock_guard lock(mu_);
      n = std::min({out.size() - done, count_, chunk});
      for (std::size_t i = 0; i < n; ++i) {
        taken[i] = ring_[head_];
        head_ = (head_ + 1) & (ring_.size() - 1);
        if (taken[i].index == no_index) posts_seen_.store(--posts_, std::memory_order_relaxed);
      }
      count_ -= n;
      size_.store(count_, std::memory_order_release);
      clear_signal_locked();
    }
    if (n == 0) break;
    for (std::size_t i = 0; i < n; ++i) deliver_taken(taken[i], out[done + i]);
    done += n;
  }
  return done;
}

void port_impl::deliver_taken(const item& it, completion_entry& e) noexcept {
  e.reset();
  if (it.index == no_index) {
    e.key_ = it.key;
    e.ec_ = it.ec;
    e.user_ = true;
    e.manage_ = &manage_result<std::uint64_t>;
    e.type_ = &typeid(std::uint64_t);
    ::new (e.storage_) std::uint64_t(it.value);
    return;
  }
  slot& s = ctx_.at(it.index);
  e.key_ = s.key;
  e.ec_ = s.ec;
  e.user_ = false;
  if (s.has_result) {
    e.manage_ = s.manage;
    e.type_ = s.result_type;
    s.manage(result_op::move_construct, e.storage_, s.result);
    e.module_ = std::exchange(s.module, nullptr);  // the entry runs manage_ now
  }
  ctx_.free_slot(it.index);
}

// Waits on the port.  While it sleeps the thread is on the port's list of
// sleepers, and an entry queued then wakes it alone (through the thread's
// wake descriptor), not every thread waiting on the port.
class port_waiter final : public wait_target {
 public:
  explicit port_waiter(port_impl& p) : p_(p) {}
  ~port_waiter() { disarm(); }
  bool ready() noexcept override { return p_.size() != 0 || p_.gone_.load(std::memory_order_acquire); }
  bool settling() noexcept override {
    // Chosen by an entry between arm() and now: its wake-up may have come
    // before the thread armed its sleep, and, off the list, no later entry
    // would wake it.  Go round: take the entry, or arm again.
    return node_.chosen.load(std::memory_order_acquire);
  }
  bool arm(thread_state& ts) noexcept override {
    std::lock_guard lock(p_.mu_);
    // Entries that arrived before we listed ourselves woke nobody: do not
    // sleep, take them.  Nor on a port that is gone: nothing would wake us.
    if (p_.count_ != 0 || p_.closed_) return false;
    node_.ts = &ts;
    node_.chosen.store(false, std::memory_order_relaxed);
    node_.prev = nullptr;
    node_.next = p_.sleepers_;
    if (p_.sleepers_ != nullptr) p_.sleepers_->prev = &node_;
    p_.sleepers_ = &node_;
    armed_ = true;
    return true;
  }
  void disarm() noexcept override {
    if (!armed_) return;
    armed_ = false;
    std::lock_guard lock(p_.mu_);
    if (node_.chosen.load(std::memory_order_relaxed)) return;  // already off the list
    if (node_.prev != nullptr) node_.prev->next = node_.next;
    else p_.sleepers_ = node_.next;
    if (node_.next != nullptr) node_.next->prev = node_.prev;
    node_.prev = node_.next = nullptr;
  }

 private:
  port_impl& p_;
  port_impl::sleeper node_;
  bool armed_ = false;
};

std::size_t port_impl::get(std::span<completion_entry> out, std::chrono::nanoseconds timeout,
                           bool alertable, std::error_code& ec) {
  ec.clear();
  if (out.empty()) return 0;
  // Another thread may destroy the port's handle while this call runs (it
  // then ends operation_aborted), and a handler run in an alertable wait
  // may destroy it too: with the handle goes a reference, and the entries
  // this call delivers drop theirs.  This call keeps the port alive to its
  // end -- from before the first take, which may drop the last.
  add_ref();
  const struct keep {
    port_impl* p;
    ~keep() { p->release(); }
  } kept{this};
  if (std::size_t n = try_get(out); n != 0) return n;
  if (timeout > std::chrono::nanoseconds::zero() && in_handler()) {
    ec = make_error_code(errc::would_deadlock);
    return 0;
  }
  const auto deadline = deadline_after(real_now(), timeout);
  for (;;) {
    port_waiter w(*this);
    const auto left = deadline == std::chrono::nanoseconds::max()
                          ? deadline
                          : std::max(deadline - real_now(), std::chrono::nanoseconds::zero());
    try {
      ec = ctx_.wait(w, left, alertable);
    } catch (...) {  // a handler threw in an alertable wait
      w.disarm();
      pass_on();
      throw;
    }
    w.disarm();
    if (gone_.load(std::memory_order_acquire)) {
      // The handle was destroyed meanwhile (by a handler, or by another
      // thread, which woke us): as a Windows port closed under a wait.
      ec = make_error_code(errc::operation_aborted);
      return 0;
    }
    if (ec) {
      // Leaving with entries queued (a chosen waiter looks for entries
      // before it can leave, so this is belt and braces): hand them to a
      // sleeper.
      pass_on();
      return 0;
    }
    if (std::size_t n = try_get(out); n != 0) return n;
    // Another waiter took the entries; wait again for the time left.
  }
}

int port_impl::native_handle() noexcept {
  std::lock_guard lock(mu_);
  armed_ = true;
  if (count_ != 0 && !signaled_) {
    signaled_ = true;
    write_one(fd_);
  }
  return fd_;
}

void port_impl::close() noexcept {
  std::vector<item> left;
  std::size_t head = 0, count = 0;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    gone_.store(true, std::memory_order_release);
    left.swap(ring_);
    head = std::exchange(head_, 0);
    count = std::exchange(count_, 0);
    posts_ = 0;
    posts_seen_.store(0, std::memory_order_relaxed);
    size_.store(0, std::memory_order_release);
  }
  // Threads asleep in get() leave it (operation_aborted), one by one.
  for (;;) {
    thread_state* ts = nullptr;
    {
      std::lock_guard lock(mu_);
      ts = choose_sleeper_locked();
    }
    if (ts == nullptr) break;
    wake_chosen(ts);
  }
  // Freed outside the lock: a result's destructor may release the last
  // handle of an object whose own teardown cancels a request bound to this
  // port (push_request takes mu_), or takes a device lock another thread
  // holds while it completes into this port.
  for (std::size_t i = 0; i < count; ++i) {
    const item it = left[(head + i) & (left.size() - 1)];
    if (it.index != no_index) ctx_.free_slot(it.index);
  }
}

}  // namespace detail

completion_port::completion_port(context& ctx)
    : ctx_(&ctx), impl_(new detail::port_impl(ctx.detail_impl())) {}

completion_port::~completion_port() {
  impl_->close();
  impl_->release();
}

std::size_t completion_port::get(std::span<completion_entry> out, std::chrono::nanoseconds timeout,
                                 wait_mode mode) {
  std::error_code ec;
  const std::size_t n = get(out, timeout, mode, ec);
  if (ec && ec != errc::timed_out && ec != errc::alerted) throw_error(ec, "averbs::completion_port::get");
  return n;
}

std::size_t completion_port::get(std::span<completion_entry> out, std::chrono::nanoseconds timeout,
                                 wait_mode mode, std::error_code& ec) {
  return impl_->get(out, timeout, mode == wait_mode::alertable, ec);
}

void completion_port::post(std::uint64_t key, std::uint64_t value, const std::error_code& ec) {
  impl_->post(key, value, ec);
}

int completion_port::native_handle() noexcept { return impl_->native_handle(); }

std::size_t completion_port::size() const noexcept { return impl_->size(); }

}  // namespace averbs
