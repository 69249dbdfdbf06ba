// SPDX-License-Identifier: MIT
// Per-thread state: the queue of completion handlers (APCs) waiting for this
// thread's next alertable wait, and the eventfd that wakes the thread when a
// handler is queued or a request it sleeps on completes.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <vector>

namespace averbs::detail {

class context_impl;

class thread_state {
 public:
  /// The calling thread's state, created on first use.
  static thread_state& current();
  /// The same, for callers that report errors: null, with the reason in
  /// `ec` (EMFILE when no descriptor is left for its wake eventfd).
  static thread_state* try_current(std::error_code& ec) noexcept;

  int wake_fd() const noexcept { return wake_fd_; }

  /// A descriptor readable while handlers are queued, for a program's own
  /// event loop (context::thread_handle()).  Created on first use.
  int handle_fd();

  /// Makes room for one handler a request may queue here later, so that
  /// push() never allocates (it runs in completers, which cannot fail).
  /// Called when the request starts; throws bad_alloc.
  void reserve();
  /// Gives the room back (the request's slot is freed).
  void unreserve() noexcept { reserved_.fetch_sub(1, std::memory_order_relaxed); }

  /// Queues a handler; false if the thread has exited (the caller drops it).
  /// Takes a context reference for the queued item.  Needs a reservation.
  bool push(context_impl& ctx, std::uint32_t index) noexcept;

  /// Runs queued handlers (only on the owning thread).  Stops after the
  /// first handler that throws, rethrowing its exception.
  std::size_t run();

  bool has_work() const noexcept { return queued_.load(std::memory_order_acquire) != 0; }

  /// Prepares to sleep in a wait.  Returns false if `alertable` and handlers
  /// are already queued (the wait must not sleep).
  bool arm(bool alertable) noexcept;
  /// Ends the sleep; drains the wake descriptor.
  void disarm() noexcept;

  /// Wakes the thread if it sleeps in a wait (a request it waits on completed).
  void wake() noexcept;

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;

  /// The thread is ending: drops queued handlers unrun and refuses new
  /// ones.  Waits still work.  Idempotent.
  void retire() noexcept;

  /// Links in the list of a context's threads asleep without its progress
  /// descriptor (context_impl::wait).  Must hold that context's lead_mu_.
  /// A thread sleeps in one wait at a time: one pair is enough.
  thread_state* follower_prev = nullptr;
  thread_state* follower_next = nullptr;

 private:
  thread_state();
  ~thread_state();

  struct item {
    context_impl* ctx;
    std::uint32_t index;
  };

  void signal_locked(bool& need_write) noexcept;
  void write_wake_locked() noexcept;

  void update_handle_locked() noexcept;

  int wake_fd_ = -1;
  int handle_fd_ = -1;          // Must hold mu_ to create.
  bool handle_signaled_ = false;  // Must hold mu_.
  std::mutex mu_;
  std::vector<item> items_;  // Must hold mu_.
  std::size_t head_ = 0;     // Must hold mu_.
  bool sleeping_ = false;    // Must hold mu_.
  bool signaled_ = false;    // Must hold mu_: the eventfd holds a count.
  bool alive_ = true;        // Must hold mu_.
  std::atomic<std::size_t> queued_{0};
  // Requests that may still queue a handler here, and the queue's capacity:
  // reserved_ <= room_ keeps push() from allocating (see reserve()).
  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> room_{0};  // written under mu_
  std::atomic<int> refs_{1};  // the thread itself, plus one per slot targeting it
};

}  // namespace averbs::detail
