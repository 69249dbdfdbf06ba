// SPDX-License-Identifier: MIT
/// @file
/// The built-in no-op operation: completes inline, at the next progress pass,
/// or after a delay on the context's clock, with a value or an injected
/// error.  It exercises every delivery path without a device.
#pragma once

#include <averbs/async/initiate.hpp>

#include <chrono>
#include <cstdint>
#include <system_error>

namespace averbs {

struct nop_params {
  /// Completes after this long on the context's clock.  Zero completes
  /// inline (synchronously, inside the initiating call) unless `defer`.
  std::chrono::nanoseconds delay{0};
  /// Completes at the next progress pass, through the context's doorbell
  /// descriptor, as a device completion would.
  bool defer = false;
  /// The status the request completes with (error injection).
  std::error_code error{};
  /// The result value on success.
  std::uint64_t value = 0;
  /// Group the request joins, if any.
  request_group* group = nullptr;
};

namespace detail {
void start_nop(context& ctx, const nop_params& p, completer<std::uint64_t> c) noexcept;
}

/// Starts a no-op.  Completion signature `void(std::error_code, std::uint64_t)`:
/// the result is `p.value`, or `p.error` with a value of 0.  Errors:
/// `p.error` as injected; `errc::operation_aborted` when cancelled.
template <completion_token<std::uint64_t> Token>
auto async_nop(context& ctx, const nop_params& p, Token&& token) {
  return detail::initiate<std::uint64_t>(
      ctx, p.group, std::forward<Token>(token),
      [c = &ctx, p](detail::completer<std::uint64_t> done) noexcept {
        detail::start_nop(*c, p, done);
      });
}

/// Runs a no-op synchronously, driving progress until it completes.
std::uint64_t nop(context& ctx, const nop_params& p);
std::uint64_t nop(context& ctx, const nop_params& p, std::error_code& ec) noexcept;

}  // namespace averbs
