// SPDX-License-Identifier: MIT
#include "core/context_impl.hpp"

#include <averbs/error.hpp>

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

namespace averbs::detail {

namespace {

thread_local int tl_handler_depth = 0;

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void write_one(int fd) noexcept {
  const std::uint64_t one = 1;
  ssize_t r;
  do {
    r = ::write(fd, &one, sizeof one);
  } while (r < 0 && errno == EINTR);
}

void drain_fd(int fd) noexcept {
  std::uint64_t v;
  ssize_t r;
  do {
    r = ::read(fd, &v, sizeof v);
  } while (r < 0 && errno == EINTR);
}

int make_eventfd() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::system_category(), "eventfd");
  return fd;
}

void epoll_add(int ep, int fd, void* tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = tag;
  if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
    throw std::system_error(errno, std::system_category(), "epoll_ctl");
}

// Tags for the context's own descriptors in its epoll set.
char timer_tag;
char deferred_tag;

}  // namespace

handler_scope::handler_scope() noexcept { ++tl_handler_depth; }
handler_scope::~handler_scope() { --tl_handler_depth; }

bool in_handler() noexcept { return tl_handler_depth > 0; }

std::chrono::nanoseconds real_now() noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// ---------------------------------------------------------------------------
// Construction

context_impl::context_impl(const context_options& opts)
    : clock_(opts.clock != nullptr ? opts.clock : &steady_clock::instance()),
      spin_(opts.spin < std::chrono::nanoseconds::zero() ? std::chrono::nanoseconds::zero()
                                                         : opts.spin),
      chunks_(new std::atomic<slot*>[max_chunks]),
      free_head_(no_index) {
  for (std::uint32_t i = 0; i < max_chunks; ++i) chunks_[i].store(nullptr, std::memory_order_relaxed);
  clock_is_steady_ = dynamic_cast<const steady_clock*>(clock_) != nullptr;
  ep_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep_ < 0) throw std::system_error(errno, std::system_category(), "epoll_create1");
  try {
    if (clock_->is_real_time()) {
      timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
      if (timer_fd_ < 0) throw std::system_error(errno, std::system_category(), "timerfd_create");
    } else {
      timer_fd_ = make_eventfd();
    }
    epoll_add(ep_, timer_fd_, &timer_tag);
    deferred_fd_ = make_eventfd();
    epoll_add(ep_, deferred_fd_, &deferred_tag);
    clock_->subscribe(*this);
    if (opts.progress_thread) start_progress_thread();
  } catch (...) {
    clock_->unsubscribe(*this);
    if (deferred_fd_ >= 0) ::close(deferred_fd_);
    if (timer_fd_ >= 0) ::close(timer_fd_);
    ::close(ep_);
    throw;
  }
}

context_impl::~context_impl() {
  free_dropped();  // a completion that came after shutdown()
  for (std::uint32_t c = 0; c < max_chunks; ++c) {
    slot* chunk = chunks_[c].load(std::memory_order_relaxed);
    if (chunk == nullptr) break;
    for (std::uint32_t i = 0; i < chunk_size; ++i)
      if (chunk[i].event_fd >= 0) ::close(chunk[i].event_fd);
    delete[] chunk;
  }
  ::close(deferred_fd_);
  ::close(timer_fd_);
  ::close(ep_);
}

void context_impl::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void context_impl::shutdown() noexcept {
  stop_progress_thread();
  clock_->unsubscribe(*this);
  const std::uint32_t cap = capacity_.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < cap; ++i) {
    const std::uint64_t w = at(i).word.load(std::memory_order_acquire);
    if (state_of(w) == state_pending) complete({i, gen_of(w)}, make_error_code(errc::operation_aborted), nullptr, true);
  }
  free_dropped();
  drop_released();  // (empty unless a poll was cut short)
}

// ---------------------------------------------------------------------------
// Slab

slot* context_impl::lookup(std::uint32_t index) const noexcept {
  if (index >= capacity_.load(std::memory_order_acquire)) return nullptr;
  slot* chunk = chunks_[index >> chunk_shift].load(std::memory_order_acquire);
  return chunk + (index & (chunk_size - 1));
}

std::uint32_t context_impl::pop_free() noexcept {
  std::uint64_t head = free_head_.load(std::memory_order_acquire);
  for (;;) {
    const auto index = static_cast<std::uint32_t>(head);
    if (index == no_index) return no_index;
    const std::uint32_t next = at(index).next_free.load(std::memory_order_relaxed);
    const std::uint64_t desired = (((head >> 32) + 1) << 32) | next;
    if (free_head_.compare_exchange_weak(head, desired, std::memory_order_acq_rel,
                                         std::memory_order_acquire))
      return index;
  }
}

void context_impl::push_free(std::uint32_t index) noexcept {
  std::uint64_t head = free_head_.load(std::memory_order_relaxed);
  for (;;) {
    at(index).next_free.store(static_cast<std::uint32_t>(head), std::memory_order_relaxed);
    const std::uint64_t desired = (((head >> 32) + 1) << 32) | index;
    if (free_head_.compare_exchange_weak(head, desired, std::memory_order_release,
                                         std::memory_order_relaxed))
      return;
  }
}

std::uint32_t context_impl::grow() {
  std::lock_guard lock(grow_mu_);
  // Another thread may have grown the slab meanwhile.
  if (const std::uint32_t index = pop_free(); index != no_index) return index;
  const std::uint32_t cap = capacity_.load(std::memory_order_relaxed);
  const std::uint32_t c = cap >> chunk_shift;
  if (c >= max_chunks) return no_index;
  chunks_[c].store(new slot[chunk_size], std::memory_order_release);
  capacity_.store(cap + chunk_size, std::memory_order_release);
  for (std::uint32_t i = chunk_size - 1; i > 0; --i) push_free(cap + i);
  return cap;
}

slot_ref context_impl::begin(const initiation& in) {
  // A port's entries and a group's links name slots of their own context's
  // slab by index: another context's operation would be read, freed or
  // cancelled as whatever occupies that index there.
  if ((in.port != nullptr && &in.port->context() != this) ||
      (in.group != nullptr && &in.group->context() != this))
    throw std::system_error(make_error_code(errc::invalid_argument),
                            in.port != nullptr && &in.port->context() != this
                                ? "completion port of another context"
                                : "request group of another context");
  // Whatever may throw first, before the slot is taken: the calling
  // thread's state (made on first use), the room its handler or the port's
  // entry will need when the request completes (completers cannot fail).
  thread_state* const ts = in.kind == delivery_kind::thread ? &thread_state::current() : nullptr;
  struct reservations {
    thread_state* ts = nullptr;
    port_impl* port = nullptr;
    ~reservations() {
      if (ts != nullptr) ts->unreserve();
      if (port != nullptr) port->unreserve();
    }
  } held;
  if (ts != nullptr) {
    ts->reserve();
    held.ts = ts;
  }
  if (in.port != nullptr) {
    in.port->reserve();
    held.port = in.port;
  }
  std::uint32_t index = pop_free();
  if (index == no_index) index = grow();
  if (index == no_index) throw std::system_error(make_error_code(errc::no_resources), "request slab full");
  held.ts = nullptr;  // the slot holds them now; free_slot() gives them back
  held.port = nullptr;
  slot& s = at(index);
  s.kind = in.kind;
  s.skip_inline = in.skip_port_on_inline_success;
  s.manage = in.result;
  s.result_type = in.result_type;
  s.handler = nullptr;  // set by the caller's construct; see below
  s.ec.clear();
  s.has_result = false;
  s.key = in.key;
  s.port = in.port;
  if (s.port != nullptr) s.port->add_ref();
  s.thread = ts;
  if (ts != nullptr) ts->add_ref();
  // The module whose code the completion runs: the handler's, or for a
  // request or port completion the result's manage function (a type only a
  // plugin instantiates), which a port entry carries past the slot.
  const void* code = in.handler != nullptr ? reinterpret_cast<const void*>(in.handler)
                                           : reinterpret_cast<const void*>(in.result);
  s.module = code != nullptr ? module_acquire(code) : nullptr;
  s.handler = in.handler;
  s.cancel_hook.store(nullptr, std::memory_order_relaxed);
  s.group = in.group;
  const std::uint32_t gen = gen_of(s.word.load(std::memory_order_relaxed));
  s.word.store((std::uint64_t{gen} << 32) | state_pending | flag_initiating, std::memory_order_release);
  if (s.group != nullptr) s.group->link(index);
  counters_.started.fetch_add(1, std::memory_order_relaxed);
  counters_.in_flight.fetch_add(1, std::memory_order_relaxed);
  return {{index, gen}, s.handler_storage};
}

bool context_impl::pending(request_id id) const noexcept {
  const slot* s = lookup(id.index);
  if (s == nullptr) return false;
  const std::uint64_t w = s->word.load(std::memory_order_acquire);
  return gen_of(w) == id.generation && state_of(w) == state_pending;
}

void context_impl::abandon(request_id id) noexcept {
  slot& s = at(id.index);
  s.handler = nullptr;  // never constructed
  // The request is in its group already, whose cancel may be completing
  // it on another thread: take it as a completer would (that cancel then
  // loses), or let the cancel finish (it unlinks the slot) before freeing.
  std::uint64_t w = s.word.load(std::memory_order_acquire);
  while (state_of(w) == state_pending &&
         !s.word.compare_exchange_weak(w, (w & ~std::uint64_t{state_mask}) | state_completed,
                                       std::memory_order_acq_rel, std::memory_order_acquire)) {
  }
  while (state_of(s.word.load(std::memory_order_acquire)) == state_completing) cpu_relax();
  if (s.group != nullptr) s.group->unlink(id.index);
  free_slot(id.index);
}

void wait_delivered(const std::atomic<std::uint64_t>& word) noexcept {
  while ((word.load(std::memory_order_acquire) & flag_delivering) != 0) cpu_relax();
}

void context_impl::free_slot(std::uint32_t index) noexcept {
  slot& s = at(index);
  wait_delivered(s.word);  // the completer still writes fd_signaled and the descriptor
  if (s.has_result) {
    s.manage(result_op::destroy, s.result, nullptr);
    s.has_result = false;
  }
  if (s.handler != nullptr) {
    s.handler(handler_op::destroy, s.handler_storage, nullptr, nullptr);
    s.handler = nullptr;
  }
  if (s.module != nullptr) {
    module_release(s.module);
    s.module = nullptr;
  }
  if (s.port != nullptr) {
    port_impl* const p = std::exchange(s.port, nullptr);
    p->unreserve();
    p->release();
  }
  if (s.thread != nullptr) {
    thread_state* const t = std::exchange(s.thread, nullptr);
    t->unreserve();
    t->release();
  }
  if (s.fd_signaled) {
    drain_fd(s.event_fd);
    s.fd_signaled = false;
  }
  s.waiter.store(nullptr, std::memory_order_relaxed);
  s.group = nullptr;
  const std::uint32_t gen = gen_of(s.word.load(std::memory_order_relaxed)) + 1;
  s.word.store(std::uint64_t{gen} << 32, std::memory_order_release);
  counters_.in_flight.fetch_sub(1, std::memory_order_relaxed);
  push_free(index);
}

bool context_impl::complete(request_id id, const std::error_code& ec, void* result,
                            bool cancel) noexcept {
  slot* sp = lookup(id.index);
  if (sp == nullptr) {
    counters_.stale.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  slot& s = *sp;
  std::uint64_t w = s.word.load(std::memory_order_acquire);
  for (;;) {
    if (gen_of(w) != id.generation) {
      counters_.stale.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (state_of(w) != state_pending) {
      counters_.duplicate.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    const std::uint64_t desired =
        (w & ~std::uint64_t{state_mask}) | state_completing | (cancel ? std::uint64_t{flag_cancelled} : std::uint64_t{0});
    if (s.word.compare_exchange_weak(w, desired, std::memory_order_acq_rel, std::memory_order_acquire))
      break;
  }
  // This thread owns the completion now.  Out of its group first: a cancel
  // hook that cancels that group (or destroys its owner) must not find this
  // slot there, completing, and wait on it for good.  So a group's cancel
  // or destructor may return while a hook started elsewhere still runs: a
  // hook's argument must not be something the group's owner holds (the
  // no-op's is the context's timer entry).
  if (s.group != nullptr) s.group->unlink(id.index);
  if (cancel) {
    if (cancel_fn hook = s.cancel_hook.load(std::memory_order_acquire); hook != nullptr)
      hook(s.cancel_arg.load(std::memory_order_relaxed), id);
    counters_.cancelled.fetch_add(1, std::memory_order_relaxed);
  }
  s.ec = ec;
  if (s.manage != nullptr) {
    if (result != nullptr) s.manage(result_op::move_construct, s.result, result);
    else s.manage(result_op::default_construct, s.result, nullptr);
    s.has_result = true;
  }
  counters_.completed.fetch_add(1, std::memory_order_relaxed);
  publish(s, id.index);
  return true;
}

void context_impl::publish(slot& s, std::uint32_t index) noexcept {
  // The kind is read while this thread still owns the slot: once the state
  // says "completed", a request's owner may take the result and free the
  // slot, and the next operation started rewrites it.
  const delivery_kind kind = s.kind;
  std::uint64_t w = s.word.load(std::memory_order_relaxed);
  for (;;) {
    // A waiting thread or an armed descriptor is signalled after the state
    // says "completed" (a waiter that wakes must find it so): until then
    // the slot stays, for the waiter may see "completed" first, take the
    // result and free it.
    const bool signals = kind == delivery_kind::request && (w & (flag_initiating | flag_orphaned)) == 0 &&
                         (w & (flag_waiter | flag_fd_armed)) != 0;
    const std::uint64_t desired = (w & ~std::uint64_t{state_mask}) | state_completed |
                                  (signals ? std::uint64_t{flag_delivering} : std::uint64_t{0});
    if (s.word.compare_exchange_weak(w, desired, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      w = desired;
      break;
    }
  }
  if ((w & flag_initiating) != 0) return;  // the initiator delivers on return
  deliver(s, index, kind, w);
}

// For a request, `w` (the word as this thread published it) decides
// whether the slot may be touched at all: with no waiter, no armed
// descriptor and no orphan flag it may already belong to the next
// operation.
void context_impl::deliver(slot& s, std::uint32_t index, delivery_kind kind, std::uint64_t w) noexcept {
  switch (kind) {
    case delivery_kind::request:
      if ((w & flag_orphaned) != 0) {
        free_later(index);
        return;
      }
      if ((w & flag_fd_armed) != 0) {
        s.fd_signaled = true;
        write_one(s.event_fd);
      }
      if ((w & flag_waiter) != 0) {
        if (thread_state* t = s.waiter.load(std::memory_order_acquire); t != nullptr) t->wake();
      }
      if ((w & flag_delivering) != 0) s.word.fetch_and(~std::uint64_t{flag_delivering}, std::memory_order_release);
      return;
    case delivery_kind::port:
      if (!s.port->push_request(index)) free_later(index);
      return;
    case delivery_kind::thread:
      if (!s.thread->push(*this, index)) {
        counters_.handlers_dropped.fetch_add(1, std::memory_order_relaxed);
        free_later(index);
      }
      return;
    case delivery_kind::immediate: {
      // Internal sinks (a promise) only; they never call application code.
      handler_fn h = std::exchange(s.handler, nullptr);
      try {
        h(handler_op::invoke, s.handler_storage, &s.ec, s.has_result ? s.result : nullptr);
      } catch (...) {
        // A promise whose future is gone; nothing to deliver to.
      }
      free_slot(index);
      return;
    }
  }
}

bool context_impl::finish(request_id id, void* result_out, std::error_code* ec_out) noexcept {
  slot& s = at(id.index);
  std::uint64_t w = s.word.load(std::memory_order_acquire);
  for (;;) {
    const std::uint32_t st = state_of(w);
    if (st == state_pending) {
      if (s.word.compare_exchange_weak(w, w & ~std::uint64_t{flag_initiating}, std::memory_order_acq_rel,
                                       std::memory_order_acquire))
        return false;  // the completer will deliver
      continue;
    }
    if (st == state_completing) {  // a completer is storing the result
      cpu_relax();
      w = s.word.load(std::memory_order_acquire);
      continue;
    }
    break;  // completed while initiating: deliver now
  }
  w = s.word.fetch_and(~std::uint64_t{flag_initiating}, std::memory_order_acq_rel);
  if (s.kind == delivery_kind::port && s.skip_inline && !s.ec) {
    if (ec_out != nullptr) *ec_out = s.ec;
    if (s.has_result && result_out != nullptr) {
      s.manage(result_op::move_construct, result_out, s.result);
    }
    free_slot(id.index);
    return true;
  }
  deliver(s, id.index, s.kind, w & ~std::uint64_t{flag_initiating});  // (the initiator owns the slot)
  return false;
}

void context_impl::run_handler(std::uint32_t index, bool run) {
  slot& s = at(index);
  handler_fn h = std::exchange(s.handler, nullptr);
  if (!run) {
    h(handler_op::destroy, s.handler_storage, nullptr, nullptr);
    counters_.handlers_dropped.fetch_add(1, std::memory_order_relaxed);
    free_slot(index);
    return;
  }
  struct free_guard {
    context_impl* self;
    std::uint32_t index;
    ~free_guard() { self->free_slot(index); }
  } guard{this, index};
  counters_.handlers_run.fetch_add(1, std::memory_order_relaxed);
  handler_scope scope;
  h(handler_op::invoke, s.handler_storage, &s.ec, s.has_result ? s.result : nullptr);
}

// ---------------------------------------------------------------------------
// Progress

void context_impl::add_source(progress_source& src, std::error_code& ec) noexcept {
  std::unique_lock lock(sources_mu_);
  for (progress_source* p : sources_) {
    if (p == &src) {
      ec = make_error_code(errc::already_exists);
      return;
    }
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &src;
  if (::epoll_ctl(ep_, EPOLL_CTL_ADD, src.native_handle(), &ev) != 0) {
    ec.assign(errno, std::system_category());
    return;
  }
  try {
    sources_.push_back(&src);
    if (src.busy_poll()) busy_sources_.push_back(&src);
  } catch (...) {
    ::epoll_ctl(ep_, EPOLL_CTL_DEL, src.native_handle(), nullptr);
    ec = make_error_code(errc::no_resources);
    return;
  }
  ec.clear();
}

void context_impl::remove_source(progress_source& src) noexcept {
  std::unique_lock lock(sources_mu_);
  for (auto* v : {&sources_, &busy_sources_}) {
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (*it == &src) {
        v->erase(it);
        break;
      }
    }
  }
  ::epoll_ctl(ep_, EPOLL_CTL_DEL, src.native_handle(), nullptr);
}

std::size_t context_impl::poll() noexcept {
  const std::size_t worked = poll_sources();
  free_dropped();  // outside sources_mu_: a handler may hold a device's last handle
  return worked;
}

namespace {
thread_local context_impl* t_polling = nullptr;  // context_impl::polling()
}  // namespace

context_impl* context_impl::polling() noexcept { return t_polling; }

bool context_impl::release_after_poll(std::vector<std::shared_ptr<void>>& objs) noexcept {
  try {
    std::lock_guard lock(released_mu_);
    released_.reserve(released_.size() + objs.size());
    for (auto& o : objs) released_.push_back(std::move(o));
    has_released_.store(true, std::memory_order_release);
  } catch (...) {
    return false;
  }
  objs.clear();
  return true;
}

void context_impl::drop_released() noexcept {
  std::vector<std::shared_ptr<void>> v;
  {
    std::lock_guard lock(released_mu_);
    v.swap(released_);
    has_released_.store(false, std::memory_order_relaxed);
  }
  v.clear();  // destructors may remove sources: sources_mu_ is not held here
}

std::size_t context_impl::poll_sources() noexcept {
  const std::size_t worked = poll_sources_locked();
  if (has_released_.load(std::memory_order_acquire)) drop_released();
  return worked;
}

std::size_t context_impl::poll_sources_locked() noexcept {
  std::shared_lock lock(sources_mu_);
  struct polling_scope {
    context_impl* outer;
    explicit polling_scope(context_impl* c) : outer(std::exchange(t_polling, c)) {}
    ~polling_scope() { t_polling = outer; }
  } scope(this);
  epoll_event evs[16];
  const int n = ::epoll_wait(ep_, evs, 16, 0);
  std::size_t worked = 0;
  progress_source* done[16];
  int ndone = 0;
  for (int i = 0; i < n; ++i) {
    void* tag = evs[i].data.ptr;
    if (tag == &timer_tag) {
      run_timers();
    } else if (tag == &deferred_tag) {
      drain_deferred();
    } else {
      auto* src = static_cast<progress_source*>(tag);
      src->progress();
      done[ndone++] = src;
    }
    ++worked;
  }
  // Busy-polled sources run once per poll, whether or not their
  // descriptor was ready (one pass each: the waiter checks its target in
  // between).
  for (progress_source* s : busy_sources_)
    if (std::find(done, done + ndone, s) == done + ndone) s->progress();
  return worked;
}

std::error_code context_impl::wait(wait_target& t, std::chrono::nanoseconds timeout,
                                   bool alertable, std::size_t* ran) {
  std::error_code ec;
  thread_state* const state = thread_state::try_current(ec);
  if (state == nullptr) return ec;  // no descriptor for its wake-up: the wait's error
  thread_state& ts = *state;
  // Once this wait has slept it may hold the lead, or owe a hand-off: it
  // settles that on every way out (before running handlers, which may take
  // long).  A wait that never slept takes no lock for it.
  struct sleeper_exit {
    context_impl& ctx;
    thread_state& ts;
    bool slept = false;
    void leave() noexcept {
      if (slept) ctx.leave_sleepers(ts);
      slept = false;
    }
    ~sleeper_exit() { leave(); }
  } sleeper{*this, ts};
  const auto start = real_now();
  const auto deadline = deadline_after(start, timeout);
  const auto spin_until = deadline_after(start, spin_);  // saturates: a huge spin means spin always
  for (;;) {
    if (t.ready()) return {};
    if (alertable && ts.has_work()) {
      sleeper.leave();
      const std::size_t n = ts.run();
      if (ran != nullptr) *ran = n;
      return make_error_code(errc::alerted);
    }
    poll();
    if (t.ready()) return {};
    if (alertable && ts.has_work()) continue;
    const auto now = real_now();
    if (now >= deadline) return make_error_code(errc::timed_out);
    if (now < spin_until) {
      cpu_relax();
      continue;
    }
    // Block: arm the target and the thread, then, as the poller, let
    // busy-polled sources arm their descriptors, re-check, and sleep in the
    // kernel on the progress set, this thread's wake fd and the target's
    // fd; as a follower, on the last two only.
    if (t.arm(ts)) {
      if (ts.arm(alertable)) {
        sleeper.slept = true;
        const bool lead = lead_or_follow(ts);
        if (lead) sleep_sources(true);
        // The sources only: free_dropped() (the loop's next poll() runs it)
        // destroys what programs left in requests, whose destructors may
        // wait themselves, on this thread, while it is armed and listed.
        poll_sources();
        if (!t.ready() && !t.settling()) {
          pollfd fds[3];
          nfds_t nfds = 0;
          if (lead) fds[nfds++] = {ep_, POLLIN, 0};
          fds[nfds++] = {ts.wake_fd(), POLLIN, 0};
          if (t.fd() >= 0) fds[nfds++] = {t.fd(), POLLIN, 0};
          if (deadline == std::chrono::nanoseconds::max()) {
            ::ppoll(fds, nfds, nullptr, nullptr);
          } else {
            const auto left = deadline - now;
            timespec tsp{static_cast<time_t>(left.count() / 1'000'000'000),
                         static_cast<long>(left.count() % 1'000'000'000)};
            ::ppoll(fds, nfds, &tsp, nullptr);
          }
        }
        if (lead)
          sleep_sources(false);
        else
          stop_following(ts);
        ts.disarm();
      }
      t.disarm();
    }
  }
}

bool context_impl::lead_or_follow(thread_state& ts) noexcept {
  std::lock_guard lock(lead_mu_);
  if (!progress_leads_ && (poller_ == nullptr || poller_ == &ts)) {
    poller_ = &ts;
    return true;
  }
  ts.follower_prev = nullptr;
  ts.follower_next = followers_;
  if (followers_ != nullptr) followers_->follower_prev = &ts;
  followers_ = &ts;
  return false;
}

void context_impl::stop_following(thread_state& ts) noexcept {
  std::lock_guard lock(lead_mu_);
  if (ts.follower_prev != nullptr)
    ts.follower_prev->follower_next = ts.follower_next;
  else if (followers_ == &ts)
    followers_ = ts.follower_next;
  if (ts.follower_next != nullptr) ts.follower_next->follower_prev = ts.follower_prev;
  ts.follower_prev = ts.follower_next = nullptr;
}

void context_impl::leave_sleepers(thread_state& ts) noexcept {
  std::lock_guard lock(lead_mu_);
  if (poller_ == &ts) poller_ = nullptr;
  // Followers sleep on their wake descriptors only: without a poller,
  // nothing would drive the sources they wait on.  The one woken takes
  // the lead on its next sleep, or, if its wait is over, passes it on
  // here.  Woken under the lock: it is still in its wait, armed.
  if (poller_ == nullptr && !progress_leads_ && followers_ != nullptr) followers_->wake();
}

void context_impl::sleep_sources(bool armed) noexcept {
  std::shared_lock lock(sources_mu_);
  for (progress_source* s : busy_sources_) s->sleeping(armed);
}

// ---------------------------------------------------------------------------
// Timers and deferred completions

void context_impl::schedule(clock::duration delay, timer_fn fn, void* arg, const timer_payload& p,
                            timer_alive_fn alive) {
  // A delay too long for the clock saturates: the timer never fires (it is
  // not even queued, where it would stay for good), rather than wrapping
  // to a deadline in the past.
  const clock::time_point now = clock_->now();
  if (delay >= clock::time_point::max() - now) return;  // never due: nothing to keep in the heap
  const clock::time_point deadline = now + delay;
  if (timers_.schedule(deadline, fn, arg, p, alive)) rearm_timer(deadline);
}

void context_impl::rearm_timer(clock::time_point deadline) noexcept {
  if (!clock_->is_real_time()) {
    // A manual clock may already be past the deadline.
    if (deadline <= clock_->now()) write_one(timer_fd_);
    return;
  }
  std::lock_guard lock(timer_arm_mu_);
  if (deadline >= armed_deadline_) return;
  armed_deadline_ = deadline;
  arm_timerfd(timer_fd_, *clock_, clock_is_steady_, deadline);
}

void context_impl::run_timers() noexcept {
  std::unique_lock run(timer_run_mu_, std::try_to_lock);
  if (!run.owns_lock()) return;
  drain_fd(timer_fd_);
  if (clock_->is_real_time()) {
    std::lock_guard lock(timer_arm_mu_);
    armed_deadline_ = clock::time_point::max();
  }
  timers_.run_expired(clock_->now());
  const clock::time_point next = timers_.next_deadline();
  if (next != clock::time_point::max()) rearm_timer(next);
}

void context_impl::on_clock_changed() noexcept { write_one(timer_fd_); }

// The doorbell is written under deferred_mu_, with its flag: written
// after, it could land after drain_deferred() cleared the flag, leaving a
// count nobody drains (the context's descriptor readable for good, every
// sleep returning at once).
void context_impl::defer_completion(request_id id, const std::error_code& ec, std::uint64_t value) {
  std::lock_guard lock(deferred_mu_);
  deferred_.push_back({id, ec, value});
  ring_deferred_locked();
}

void context_impl::ring_deferred_locked() noexcept {
  if (deferred_signaled_) return;
  deferred_signaled_ = true;
  write_one(deferred_fd_);
}

void context_impl::free_later(std::uint32_t index) noexcept {
  std::uint32_t head = dropped_head_.load(std::memory_order_relaxed);
  do {
    at(index).next_free.store(head, std::memory_order_relaxed);
  } while (!dropped_head_.compare_exchange_weak(head, index, std::memory_order_release, std::memory_order_relaxed));
  // The next poll frees it: ring the doorbell a sleeping waiter watches.
  std::lock_guard lock(deferred_mu_);
  ring_deferred_locked();
}

void context_impl::free_dropped() noexcept {
  if (dropped_head_.load(std::memory_order_relaxed) == no_index) return;
  std::uint32_t index = dropped_head_.exchange(no_index, std::memory_order_acquire);
  while (index != no_index) {
    const std::uint32_t next = at(index).next_free.load(std::memory_order_relaxed);
    free_slot(index);
    index = next;
  }
}

void context_impl::drain_deferred() noexcept {
  std::unique_lock run(deferred_run_mu_, std::try_to_lock);
  if (!run.owns_lock()) return;
  {
    std::lock_guard lock(deferred_mu_);
    deferred_spare_.swap(deferred_);
    if (deferred_signaled_) {
      drain_fd(deferred_fd_);
      deferred_signaled_ = false;
    }
  }
  for (deferred& d : deferred_spare_) {
    if (d.ec) complete(d.id, d.ec, nullptr, false);
    else complete(d.id, d.ec, &d.value, false);
  }
  deferred_spare_.clear();
}

// ---------------------------------------------------------------------------
// Progress thread

void context_impl::start_progress_thread() {
  std::lock_guard lock(progress_mu_);
  if (progress_thread_.joinable()) return;
  progress_stop_.store(false, std::memory_order_relaxed);
  progress_stop_fd_ = make_eventfd();
  progress_thread_ = std::thread([this] { progress_thread_main(); });
  std::lock_guard lead(lead_mu_);
  progress_leads_ = true;  // waits from now on follow: this thread polls the sources
}

void context_impl::stop_progress_thread() noexcept {
  std::lock_guard lock(progress_mu_);
  if (!progress_thread_.joinable()) return;
  progress_stop_.store(true, std::memory_order_release);
  write_one(progress_stop_fd_);
  progress_thread_.join();
  ::close(progress_stop_fd_);
  progress_stop_fd_ = -1;
  std::lock_guard lead(lead_mu_);
  progress_leads_ = false;
  if (poller_ == nullptr && followers_ != nullptr) followers_->wake();  // one of them takes the lead
}

void context_impl::progress_thread_main() noexcept {
  while (!progress_stop_.load(std::memory_order_acquire)) {
    sleep_sources(true);
    if (poll() == 0) {
      pollfd fds[2] = {{ep_, POLLIN, 0}, {progress_stop_fd_, POLLIN, 0}};
      ::poll(fds, 2, -1);
    }
    sleep_sources(false);
    poll();
  }
}

context_stats context_impl::stats() const noexcept {
  context_stats s;
  s.started = counters_.started.load(std::memory_order_relaxed);
  s.completed = counters_.completed.load(std::memory_order_relaxed);
  s.cancelled = counters_.cancelled.load(std::memory_order_relaxed);
  s.stale_ignored = counters_.stale.load(std::memory_order_relaxed);
  s.duplicate_ignored = counters_.duplicate.load(std::memory_order_relaxed);
  s.handlers_run = counters_.handlers_run.load(std::memory_order_relaxed);
  s.handlers_dropped = counters_.handlers_dropped.load(std::memory_order_relaxed);
  s.slots = capacity_.load(std::memory_order_relaxed);
  s.in_flight = counters_.in_flight.load(std::memory_order_relaxed);
  s.timers = timers_.size();
  return s;
}

}  // namespace averbs::detail
