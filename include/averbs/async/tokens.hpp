// SPDX-License-Identifier: MIT
/// @file
/// Completion tokens: how the caller of an `async_*` operation learns of its
/// completion.  Every operation accepts every token:
///
/// | token                      | the initiating function returns | the completion            |
/// |----------------------------|---------------------------------|---------------------------|
/// | `use_request`              | `request<T>`                    | `wait()`, `get()`, fd     |
/// | `bind_port(port, key)`     | `port_submission<T>`            | an entry in the port      |
/// | a callable `h(ec, T)`      | `void`                          | `h` on the initiating thread, in an alertable wait |
/// | `use_future`               | `std::future<T>`                | the future becomes ready  |
/// | `use_awaitable`            | an awaitable (lazy)             | `co_await` resumes, in an alertable wait |
///
/// A handler runs exactly once and is never invoked from within the
/// initiating function, nor on a thread the library started.
#pragma once

#include <concepts>
#include <cstdint>
#include <system_error>
#include <type_traits>
#include <utility>

namespace averbs {

class completion_port;

/// Returns a `request<T>` handle: the OVERLAPPED + GetOverlappedResult model.
struct use_request_t {};
/// Returns a `std::future<T>`; an error completes it with `std::system_error`.
/// The future becomes ready when some thread drives progress (a wait on the
/// context, `context::poll()` or the progress thread).  Allocates the
/// future's shared state.
struct use_future_t {};
/// Returns an awaitable: `co_await` starts the operation and resumes the
/// coroutine inside an alertable wait of the same thread; an error throws
/// `std::system_error`.
struct use_awaitable_t {};

// Internal linkage on purpose: a token object never becomes a unique symbol
// of the module that uses it, so such a module can still be unloaded.
constexpr use_request_t use_request{};
constexpr use_future_t use_future{};
constexpr use_awaitable_t use_awaitable{};

/// Options of a port binding.
enum class port_flags : std::uint8_t {
  none = 0,
  /// When the operation completes inline with success, queue nothing and
  /// return the result from the initiating function (NetworkDirect's
  /// skip-completion-port-on-success).
  skip_on_inline_success = 1,
};

/// Queues the completion to a completion port with a caller's key.
struct port_binding {
  completion_port* port;
  std::uint64_t key;
  port_flags flags;
};

inline port_binding bind_port(completion_port& port, std::uint64_t key,
                              port_flags flags = port_flags::none) noexcept {
  return {&port, key, flags};
}

/// What a port-bound initiation returns.
template <class T>
class port_submission {
 public:
  /// True if the operation completed inline with success and was not queued
  /// (only with `port_flags::skip_on_inline_success`); `value()` holds the
  /// result.
  bool completed_inline() const noexcept { return inline_; }
  T& value() & noexcept { return value_; }
  T&& value() && noexcept { return std::move(value_); }

  bool inline_ = false;
  T value_{};
};

template <>
class port_submission<void> {
 public:
  bool completed_inline() const noexcept { return inline_; }
  bool inline_ = false;
};

/// A callable that can receive the completion of an operation with result T.
template <class H, class T>
concept completion_handler =
    std::move_constructible<std::decay_t<H>> &&
    ((std::is_void_v<T> && std::invocable<std::decay_t<H>&&, std::error_code>) ||
     (!std::is_void_v<T> && std::invocable<std::decay_t<H>&&, std::error_code, T>));

/// Anything accepted where an operation with result T takes a token.
template <class Token, class T>
concept completion_token =
    std::same_as<std::decay_t<Token>, use_request_t> ||
    std::same_as<std::decay_t<Token>, port_binding> ||
    std::same_as<std::decay_t<Token>, use_future_t> ||
    std::same_as<std::decay_t<Token>, use_awaitable_t> || completion_handler<Token, T>;

}  // namespace averbs
