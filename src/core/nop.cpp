// SPDX-License-Identifier: MIT
#include "core/context_impl.hpp"

#include <averbs/async/nop.hpp>

namespace averbs {
namespace detail {

namespace {

// If the request was cancelled before the timer fired, this completion is
// stale (or a duplicate) and the core ignores it.
void nop_timer_fired(void* arg, const timer_payload& p) noexcept {
  auto* ctx = static_cast<context_impl*>(arg);
  std::uint64_t value = p.b;
  ctx->complete(request_id::unpack(p.a), p.ec, p.ec ? nullptr : &value, false);
}

// Until it fires or its request is cancelled.
bool nop_timer_alive(void* arg, const timer_payload& p) noexcept {
  return static_cast<const context_impl*>(arg)->pending(request_id::unpack(p.a));
}

// A cancelled delay leaves its timer behind: tell the queue, which sweeps
// such timers out in bulk instead of keeping them until their deadline.
void nop_cancelled(void* arg, request_id) noexcept { static_cast<context_impl*>(arg)->timer_cancelled(); }

}  // namespace

void start_nop(context& ctx, const nop_params& p, completer<std::uint64_t> c) noexcept {
  context_impl& impl = ctx.detail_impl();
  if (p.delay > std::chrono::nanoseconds::zero()) {
    try {
      impl.schedule(p.delay, &nop_timer_fired, &impl, {c.id().packed(), p.value, p.error}, &nop_timer_alive);
      c.on_cancel(&nop_cancelled, &impl);
    } catch (...) {
      c.fail(make_error_code(errc::no_resources));
    }
    return;
  }
  if (p.defer) {
    try {
      impl.defer_completion(c.id(), p.error, p.value);
    } catch (...) {
      c.fail(make_error_code(errc::no_resources));
    }
    return;
  }
  if (p.error) c.fail(p.error);
  else c.complete({}, p.value);
}

}  // namespace detail

std::uint64_t nop(context& ctx, const nop_params& p) {
  return detail::sync_call<std::uint64_t>([&](auto token) { return async_nop(ctx, p, token); },
                                          "averbs::nop");
}

std::uint64_t nop(context& ctx, const nop_params& p, std::error_code& ec) noexcept {
  return detail::sync_call<std::uint64_t>([&](auto token) { return async_nop(ctx, p, token); }, ec);
}

}  // namespace averbs
