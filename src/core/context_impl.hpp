// SPDX-License-Identifier: MIT
// The private side of averbs::context: the request slab, the progress
// sources, the timers, the deferred-completion doorbell and the wait loop.
//
// Slot life cycle (word = generation << 32 | flags, state in the low bits):
//
//   free --begin_request--> pending --complete/cancel (CAS winner)-->
//   completing --publish--> completed --delivered and consumed--> free (gen+1)
//
// Exactly one party wins the pending -> completing CAS, so a request
// completes once; every other completion or cancel sees a different state
// (duplicate) or generation (stale) and is counted and ignored.  While the
// initiating flag is set, the initiator (not the completer) delivers, which is
// how an inline completion is held back until the initiating call returns.
#pragma once

#include "core/thread_state.hpp"
#include "core/timer_queue.hpp"

#include <averbs/async/completion_port.hpp>
#include <averbs/async/context.hpp>
#include <averbs/async/detail/core.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

namespace averbs::detail {

enum : std::uint32_t {
  state_free = 0,
  state_pending = 1,
  state_completing = 2,
  state_completed = 3,
  state_mask = 3,
  flag_initiating = 1u << 2,  // initiator has not returned yet; it delivers
  flag_waiter = 1u << 3,      // a thread sleeps on this request
  flag_fd_armed = 1u << 4,    // native_handle() was asked for
  flag_orphaned = 1u << 5,    // the request<T> handle was dropped
  flag_cancelled = 1u << 6,
  // Completed, and the completer is still signalling the request's
  // descriptor or waking its waiter: the slot must not be freed (or the
  // waiter's thread leave its wait) until it clears.
  flag_delivering = 1u << 7,
};

inline std::uint32_t gen_of(std::uint64_t w) noexcept { return static_cast<std::uint32_t>(w >> 32); }
inline std::uint32_t state_of(std::uint64_t w) noexcept {
  return static_cast<std::uint32_t>(w) & state_mask;
}

inline constexpr std::uint32_t no_index = 0xFFFFFFFFu;

/// Spins while a completer still signals the slot behind `word` (a few
/// microseconds at most: an eventfd write and a wake).
void wait_delivered(const std::atomic<std::uint64_t>& word) noexcept;

struct slot {
  std::atomic<std::uint64_t> word{0};
  std::atomic<std::uint32_t> next_free{no_index};
  delivery_kind kind = delivery_kind::request;
  bool skip_inline = false;
  bool has_result = false;
  bool fd_signaled = false;
  int event_fd = -1;  // created on first native_handle(), kept across reuse
  std::error_code ec;
  result_manage_fn manage = nullptr;
  const std::type_info* result_type = nullptr;
  handler_fn handler = nullptr;
  void* module = nullptr;  // dlopen reference held for the handler's module
  port_impl* port = nullptr;
  std::uint64_t key = 0;
  thread_state* thread = nullptr;                 // thread delivery target
  std::atomic<thread_state*> waiter{nullptr};     // thread sleeping in wait()
  group_impl* group = nullptr;
  std::uint32_t group_prev = no_index;  // Must hold the group's lock.
  std::uint32_t group_next = no_index;  // Must hold the group's lock.
  std::atomic<cancel_fn> cancel_hook{nullptr};
  std::atomic<void*> cancel_arg{nullptr};
  alignas(16) unsigned char result[inline_result_size];
  alignas(16) unsigned char handler_storage[inline_handler_size];
};

/// What a wait waits for.  `arm()` registers the sleeping thread with the
/// target and returns false if the target is already satisfied.
class wait_target {
 public:
  virtual bool ready() noexcept = 0;
  /// Not ready yet, but done in a few instructions (a completer finishing
  /// its delivery, whose wake-up may already have gone by): no reason to
  /// sleep.
  virtual bool settling() noexcept { return false; }
  virtual bool arm(thread_state& ts) noexcept = 0;
  virtual void disarm() noexcept = 0;
  virtual int fd() const noexcept { return -1; }

 protected:
  ~wait_target() = default;
};

// Waits for one request; the completer wakes the thread recorded here.
class request_waiter final : public wait_target {
 public:
  request_waiter(slot& s, request_id id) : s_(s), id_(id) {}
  bool ready() noexcept override {
    // Not while the completer may still wake this thread: it might be
    // gone by then.
    const std::uint64_t w = s_.word.load(std::memory_order_acquire);
    return state_of(w) == state_completed && (w & flag_delivering) == 0;
  }
  bool settling() noexcept override {
    // Completed, its completer still delivering: the wake-up may have come
    // before this thread armed its sleep, and will not come again.
    return state_of(s_.word.load(std::memory_order_acquire)) == state_completed;
  }
  bool arm(thread_state& ts) noexcept override {
    s_.waiter.store(&ts, std::memory_order_release);
    std::uint64_t w = s_.word.load(std::memory_order_acquire);
    for (;;) {
      if (state_of(w) == state_completed) return false;
      if (s_.word.compare_exchange_weak(w, w | flag_waiter, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
        return true;
    }
  }
  void disarm() noexcept override {
    std::uint64_t w = s_.word.load(std::memory_order_acquire);
    while (state_of(w) != state_completed &&
           !s_.word.compare_exchange_weak(w, w & ~std::uint64_t{flag_waiter}, std::memory_order_acq_rel,
                                          std::memory_order_acquire)) {
    }
  }

 private:
  slot& s_;
  request_id id_;
};

class context_impl final : public clock_listener {
 public:
  explicit context_impl(const context_options& opts);
  ~context_impl();

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;

  // Slab.
  slot* lookup(std::uint32_t index) const noexcept;
  slot& at(std::uint32_t index) const noexcept { return *lookup(index); }
  slot_ref begin(const initiation& in);
  bool finish(request_id id, void* result_out, std::error_code* ec_out) noexcept;
  bool complete(request_id id, const std::error_code& ec, void* result, bool cancel) noexcept;
  void abandon(request_id id) noexcept;
  /// Returns a slot to the free list; destroys what it still holds.
  void free_slot(std::uint32_t index) noexcept;
  /// Runs (or drops, if `run` is false) a thread-delivered handler.
  void run_handler(std::uint32_t index, bool run);

  // Progress.
  void add_source(progress_source& s, std::error_code& ec) noexcept;
  void remove_source(progress_source& s) noexcept;
  /// The context whose sources this thread is calling progress() on (in
  /// poll_sources(), holding sources_mu_ shared), or null.
  static context_impl* polling() noexcept;
  /// Takes `objs` (left empty) to release once the poll under way lets go
  /// of sources_mu_: a source's progress() may drop objects whose
  /// destructors remove sources (a device's last handle), which under the
  /// lock this thread holds shared would deadlock.  False, `objs`
  /// untouched, if there is no memory.
  bool release_after_poll(std::vector<std::shared_ptr<void>>& objs) noexcept;
  std::size_t poll() noexcept;
  /// Tells busy-polled sources a thread is about to sleep (true) or woke (false).
  void sleep_sources(bool armed) noexcept;
  /// A thread about to sleep in wait() becomes the poller (true), the one
  /// thread asleep on ep_, unless another is; then it joins the followers.
  bool lead_or_follow(thread_state& ts) noexcept;
  /// A follower woke: off the list.
  void stop_following(thread_state& ts) noexcept;
  /// A thread that slept leaves wait(): the poller gives up the lead, and
  /// if no one leads, a follower is woken to take it.
  void leave_sleepers(thread_state& ts) noexcept;
  /// Waits (driving progress) until `t` is ready, the timeout passes, or, if
  /// `alertable`, handlers queued for this thread ran (their count goes to
  /// `ran`).  Exceptions thrown by those handlers propagate.
  std::error_code wait(wait_target& t, std::chrono::nanoseconds timeout, bool alertable,
                       std::size_t* ran = nullptr);

  // Timers and deferred completions, for operations.
  void schedule(clock::duration delay, timer_fn fn, void* arg, const timer_payload& p,
                timer_alive_fn alive = nullptr);
  /// A timer scheduled with a liveness check lost its purpose (see
  /// timer_queue::note_cancelled()).
  void timer_cancelled() noexcept { timers_.note_cancelled(); }
  /// True while the request `id` names is pending.
  bool pending(request_id id) const noexcept;
  void defer_completion(request_id id, const std::error_code& ec, std::uint64_t value);

  averbs::clock& clock() const noexcept { return *clock_; }
  int epoll_fd() const noexcept { return ep_; }
  void on_clock_changed() noexcept override;

  void start_progress_thread();
  void stop_progress_thread() noexcept;
  /// Cancels every pending request (context destruction).
  void shutdown() noexcept;

  context_stats stats() const noexcept;

  struct counters {
    std::atomic<std::uint64_t> started{0}, completed{0}, cancelled{0}, stale{0}, duplicate{0},
        handlers_run{0}, handlers_dropped{0}, in_flight{0};
  };
  counters counters_;

 private:
  static constexpr std::uint32_t chunk_shift = 8;
  static constexpr std::uint32_t chunk_size = 1u << chunk_shift;
  static constexpr std::uint32_t max_chunks = 1u << 14;  // 4 Mi requests

  std::uint32_t pop_free() noexcept;
  void push_free(std::uint32_t index) noexcept;
  std::uint32_t grow();
  void publish(slot& s, std::uint32_t index) noexcept;
  void deliver(slot& s, std::uint32_t index, delivery_kind kind, std::uint64_t old_word) noexcept;
  void run_timers() noexcept;
  void drain_deferred() noexcept;
  std::size_t poll_sources() noexcept;
  std::size_t poll_sources_locked() noexcept;  // poll_sources() holding sources_mu_
  /// Frees the slot of a completion nobody will take (its thread exited,
  /// its port closed, its handle dropped) later, outside the completer's
  /// locks: destroying the handler or the result may release the last
  /// reference on an object whose destructor takes the lock the completer
  /// holds (a verbs handle, under the device lock).
  void free_later(std::uint32_t index) noexcept;
  /// Rings the deferred-work doorbell (once until drained); deferred_mu_ held.
  void ring_deferred_locked() noexcept;
  /// Frees the slots free_later() queued.  Holds no lock of ours.
  void free_dropped() noexcept;
  void rearm_timer(clock::time_point deadline) noexcept;
  void progress_thread_main() noexcept;

  std::atomic<int> refs_{1};
  averbs::clock* clock_;
  bool clock_is_steady_ = false;  // clock_ reads CLOCK_MONOTONIC (arm_timerfd)
  std::chrono::nanoseconds spin_;

  std::unique_ptr<std::atomic<slot*>[]> chunks_;
  std::atomic<std::uint32_t> capacity_{0};
  std::atomic<std::uint64_t> free_head_;  // aba tag << 32 | index
  std::atomic<std::uint32_t> dropped_head_{no_index};  // free_later()'s, linked by next_free
  std::mutex grow_mu_;

  int ep_ = -1;
  // Threads asleep in wait(): one of them, the poller, sleeps on ep_ and
  // keeps the lead until its wait returns; the others sleep on their own
  // wake descriptors and are woken by what they wait for (or to take the
  // lead).  All of them on ep_ woke each other for every event.
  std::mutex lead_mu_;
  thread_state* poller_ = nullptr;     // Must hold lead_mu_.
  thread_state* followers_ = nullptr;  // Must hold lead_mu_: linked through follower_next/prev.
  bool progress_leads_ = false;        // Must hold lead_mu_: the progress thread polls; every wait follows.
  /// Releases what release_after_poll() took.  Holds no lock of ours.
  void drop_released() noexcept;
  std::mutex released_mu_;
  std::vector<std::shared_ptr<void>> released_;  // Must hold released_mu_.
  std::atomic<bool> has_released_{false};
  std::shared_mutex sources_mu_;  // shared: calling progress(); exclusive: (un)registering
  std::vector<progress_source*> busy_sources_;  // Must hold sources_mu_.
  std::vector<progress_source*> sources_;       // Must hold sources_mu_.

  // Timers: a timerfd (real clock) or an eventfd the clock rings (manual).
  timer_queue timers_;
  int timer_fd_ = -1;
  std::mutex timer_arm_mu_;
  clock::time_point armed_deadline_ = clock::time_point::max();  // Must hold timer_arm_mu_.
  std::mutex timer_run_mu_;

  // Deferred completions, drained by progress.
  struct deferred {
    request_id id;
    std::error_code ec;
    std::uint64_t value;
  };
  int deferred_fd_ = -1;
  std::mutex deferred_mu_;
  std::vector<deferred> deferred_;        // Must hold deferred_mu_.
  std::vector<deferred> deferred_spare_;  // Must hold deferred_mu_.
  bool deferred_signaled_ = false;        // Must hold deferred_mu_.
  std::mutex deferred_run_mu_;

  std::mutex progress_mu_;  // start/stop may race (any member may be called from any thread)
  std::thread progress_thread_;
  int progress_stop_fd_ = -1;
  std::atomic<bool> progress_stop_{false};
};

/// The port behind averbs::completion_port.
class port_impl {
 public:
  explicit port_impl(context_impl& ctx);
  const context_impl& context() const noexcept { return ctx_; }

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;

  /// Makes room for the entry a request will queue here when it completes,
  /// so push_request() never allocates.  Called when the request starts;
  /// throws bad_alloc.
  void reserve();
  /// Gives the room back (the request's slot is freed).
  void unreserve() noexcept { reserved_.fetch_sub(1, std::memory_order_relaxed); }
  /// Queues a completed request (it holds a reservation); false (the
  /// caller frees the slot) if closed.
  bool push_request(std::uint32_t index) noexcept;
  /// Queues a user packet.  Throws bad_alloc when the ring cannot grow.
  void post(std::uint64_t key, std::uint64_t value, const std::error_code& ec);
  std::size_t try_get(std::span<completion_entry> out) noexcept;
  std::size_t get(std::span<completion_entry> out, std::chrono::nanoseconds timeout, bool alertable,
                  std::error_code& ec);
  int native_handle() noexcept;
  std::size_t size() const noexcept { return size_.load(std::memory_order_acquire); }
  /// The handle was destroyed: discard queued entries and later deliveries.
  void close() noexcept;

 private:
  friend class port_waiter;
  ~port_impl();
  struct item {
    std::uint64_t key;
    std::uint64_t value;
    std::error_code ec;
    std::uint32_t index;  // no_index for a user packet
  };
  /// Fills `e` from an item taken off the ring (outside the lock).
  void deliver_taken(const item& it, completion_entry& e) noexcept;
  /// A thread asleep in get(), in the port's LIFO list of sleepers.  A
  /// queued entry wakes one of them (the last to sleep: its cache is the
  /// warmest), not all, as a Windows completion port does.
  struct sleeper {
    thread_state* ts = nullptr;
    sleeper* prev = nullptr;
    sleeper* next = nullptr;
    std::atomic<bool> chosen{false};  // taken off the list by an entry: wake-up sent
  };
  /// Grows the ring to hold `need` entries (a power of two), unrolled.
  void grow_locked(std::size_t need);
  /// Queues `it`.  Returns the sleeper to wake (with a reference the caller
  /// drops after waking it), or null.
  thread_state* push_locked(const item& it, bool& need_write) noexcept;
  /// Takes the most recent sleeper off the list; its thread, referenced.
  thread_state* choose_sleeper_locked() noexcept;
  /// Wakes `ts` (from push_locked or choose_sleeper_locked) and drops its reference.
  static void wake_chosen(thread_state* ts) noexcept;
  /// A waiter leaves get() without taking entries: the wake-up it may have
  /// been sent goes to another sleeper, if entries wait.
  void pass_on() noexcept;
  void clear_signal_locked() noexcept;

  context_impl& ctx_;
  std::atomic<int> refs_{1};
  mutable std::mutex mu_;
  std::vector<item> ring_;  // Must hold mu_; power-of-two capacity.
  std::size_t head_ = 0;    // Must hold mu_.
  std::size_t count_ = 0;   // Must hold mu_.
  std::size_t posts_ = 0;   // Must hold mu_: user packets among the count_.
  // Requests that may still queue an entry.  The ring holds at least
  // reserved_ + posts_ entries, so a completion always finds room; see
  // reserve() for the lock-free check.
  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> posts_seen_{0};  // posts_, written under mu_
  std::atomic<std::size_t> room_{16};       // ring_.size(), written under mu_
  std::atomic<std::size_t> size_{0};
  int fd_ = -1;
  sleeper* sleepers_ = nullptr;  // Must hold mu_: most recent first.
  bool armed_ = false;     // Must hold mu_: native_handle() was asked for.
  bool signaled_ = false;  // Must hold mu_: the eventfd holds a count.
  bool closed_ = false;    // Must hold mu_.
  std::atomic<bool> gone_{false};  // closed_, for waiters to read without mu_
};

/// The group behind averbs::request_group: an intrusive list of slots.
class group_impl {
 public:
  explicit group_impl(context_impl& ctx) : ctx_(ctx) {}
  const context_impl& context() const noexcept { return ctx_; }
  void link(std::uint32_t index) noexcept;
  void unlink(std::uint32_t index) noexcept;
  std::size_t cancel_all() noexcept;
  std::size_t pending() const noexcept;

 private:
  context_impl& ctx_;
  mutable std::mutex mu_;
  std::uint32_t head_ = no_index;  // Must hold mu_.
  std::size_t count_ = 0;          // Must hold mu_.
};

/// Depth of completion-handler calls on this thread (the "dispatch level").
struct handler_scope {
  handler_scope() noexcept;
  ~handler_scope();
};

/// Monotonic real time, for wait timeouts (never the injectable clock).
std::chrono::nanoseconds real_now() noexcept;
/// `now + timeout`, saturating at nanoseconds::max() (which means "never").
inline std::chrono::nanoseconds deadline_after(std::chrono::nanoseconds now, std::chrono::nanoseconds timeout) noexcept {
  return timeout >= std::chrono::nanoseconds::max() - now ? std::chrono::nanoseconds::max() : now + timeout;
}

void* module_acquire(const void* code) noexcept;
void module_release(void* handle) noexcept;

}  // namespace averbs::detail
