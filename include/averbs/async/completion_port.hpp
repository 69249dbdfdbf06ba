// SPDX-License-Identifier: MIT
/// @file
/// `averbs::completion_port`: completions queued for whoever dequeues them,
/// the I/O completion port model.
#pragma once

#include <averbs/async/context.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>
#include <typeinfo>
#include <utility>

namespace averbs {

namespace detail {
class port_impl;
}

/// One dequeued completion: the key given at initiation, the operation's
/// error code and its result.
class completion_entry {
 public:
  completion_entry() noexcept = default;
  ~completion_entry() { reset(); }
  completion_entry(completion_entry&& o) noexcept { take_from(o); }
  completion_entry& operator=(completion_entry&& o) noexcept {
    if (this != &o) {
      reset();
      take_from(o);
    }
    return *this;
  }

  /// The key given to `bind_port()`, or to `completion_port::post()`.
  std::uint64_t key() const noexcept { return key_; }
  /// The operation's status; success is an empty code.
  const std::error_code& error() const noexcept { return ec_; }
  /// True for a packet queued by `completion_port::post()`.
  bool user_packet() const noexcept { return user_; }

  /// The result if it has type `T`, else null.  User packets carry a
  /// `std::uint64_t`; void operations carry none.
  template <class T>
  T* result() noexcept {
    if (type_ == nullptr || *type_ != typeid(T)) return nullptr;
    return reinterpret_cast<T*>(storage_);
  }

  /// Destroys the result held, if any.
  void reset() noexcept {
    if (manage_ != nullptr) manage_(detail::result_op::destroy, storage_, nullptr);
    manage_ = nullptr;
    type_ = nullptr;
    if (module_ != nullptr) detail::module_release(std::exchange(module_, nullptr));
  }

 private:
  friend class detail::port_impl;
  void take_from(completion_entry& o) noexcept {
    key_ = o.key_;
    ec_ = o.ec_;
    user_ = o.user_;
    type_ = o.type_;
    manage_ = o.manage_;
    module_ = std::exchange(o.module_, nullptr);
    if (manage_ != nullptr) {
      manage_(detail::result_op::move_construct, storage_, o.storage_);
      o.reset();
    }
  }

  std::uint64_t key_ = 0;
  std::error_code ec_;
  bool user_ = false;
  const std::type_info* type_ = nullptr;
  detail::result_manage_fn manage_ = nullptr;
  // The dlopen()ed module whose code manage_ and type_ are, kept loaded
  // while this entry holds its result (null: libaverbs or the program).
  void* module_ = nullptr;
  alignas(16) unsigned char storage_[detail::inline_result_size];
};

/// How a wait treats completion handlers queued for the waiting thread.
enum class wait_mode : std::uint8_t {
  normal,     ///< handlers stay queued
  alertable,  ///< runs them and returns (`errc::alerted`), the APC model
};

/// A queue of completions.  Several threads may wait on one port; each
/// completion is dequeued by exactly one of them.
///
/// Thread safety: all members may be called from any thread.  Destroying a
/// port discards its queued entries; operations still pending on it complete
/// normally and their entries are discarded.
class completion_port {
 public:
  explicit completion_port(context& ctx);
  ~completion_port();
  completion_port(const completion_port&) = delete;
  completion_port& operator=(const completion_port&) = delete;

  /// Dequeues up to `out.size()` entries, waiting (and driving progress) up
  /// to `timeout` for the first.  Returns the number dequeued, 0 on timeout
  /// or when an alertable wait ran handlers.
  ///
  /// Errors (`ec` overload): `errc::timed_out`, `errc::alerted`,
  /// `errc::would_deadlock` (blocking inside a handler),
  /// `errc::operation_aborted` (the port was destroyed during the wait: by
  /// a handler this wait ran, or by another thread; the call touches
  /// nothing of it after), or the system error
  /// that kept the thread from waiting (EMFILE: no descriptor left for its
  /// wake-up).  The throwing overload throws for all but `timed_out` and
  /// `alerted`.  In alertable mode an
  /// exception thrown by a handler propagates out of either overload.
  std::size_t get(std::span<completion_entry> out, std::chrono::nanoseconds timeout,
                  wait_mode mode = wait_mode::normal);
  std::size_t get(std::span<completion_entry> out, std::chrono::nanoseconds timeout,
                  wait_mode mode, std::error_code& ec);
  /// Any duration, saturating at `infinite` (detail::timeout_ns).
  template <class Rep, class Period>
  std::size_t get(std::span<completion_entry> out, std::chrono::duration<Rep, Period> timeout,
                  wait_mode mode = wait_mode::normal) {
    return get(out, detail::timeout_ns(timeout), mode);
  }
  template <class Rep, class Period>
  std::size_t get(std::span<completion_entry> out, std::chrono::duration<Rep, Period> timeout, wait_mode mode,
                  std::error_code& ec) {
    return get(out, detail::timeout_ns(timeout), mode, ec);
  }

  /// Queues a user packet carrying `value` (a `std::uint64_t` result).
  /// Allocates only when the queue grows past its largest size so far.
  void post(std::uint64_t key, std::uint64_t value = 0, const std::error_code& ec = {});

  /// Readable while entries are queued.
  int native_handle() noexcept;

  /// Entries queued now.
  std::size_t size() const noexcept;

  context& get_context() const noexcept { return *ctx_; }
  detail::port_impl& detail_impl() const noexcept { return *impl_; }

 private:
  context* ctx_;
  detail::port_impl* impl_;
};

}  // namespace averbs
