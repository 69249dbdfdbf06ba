// SPDX-License-Identifier: MIT
#include "core/context_impl.hpp"

#include <averbs/async/request_group.hpp>
#include <averbs/error.hpp>

#include <thread>

namespace averbs {
namespace detail {

void group_impl::link(std::uint32_t index) noexcept {
  std::lock_guard lock(mu_);
  slot& s = ctx_.at(index);
  s.group_prev = no_index;
  s.group_next = head_;
  if (head_ != no_index) ctx_.at(head_).group_prev = index;
  head_ = index;
  ++count_;
}

void group_impl::unlink(std::uint32_t index) noexcept {
  std::lock_guard lock(mu_);
  slot& s = ctx_.at(index);
  if (s.group_prev != no_index) ctx_.at(s.group_prev).group_next = s.group_next;
  else head_ = s.group_next;
  if (s.group_next != no_index) ctx_.at(s.group_next).group_prev = s.group_prev;
  s.group_prev = s.group_next = no_index;
  s.group = nullptr;
  --count_;
}

std::size_t group_impl::cancel_all() noexcept {
  std::size_t cancelled = 0;
  for (;;) {
    request_id id;
    {
      std::lock_guard lock(mu_);
      if (head_ == no_index) return cancelled;
      id.index = head_;
      id.generation = gen_of(ctx_.at(head_).word.load(std::memory_order_acquire));
    }
    // Losing to a concurrent completion is fine: its winner unlinks the slot
    // and the next pass sees the following head.
    if (ctx_.complete(id, make_error_code(errc::operation_aborted), nullptr, true)) ++cancelled;
    else std::this_thread::yield();
  }
}

std::size_t group_impl::pending() const noexcept {
  std::lock_guard lock(mu_);
  return count_;
}

}  // namespace detail

request_group::request_group(context& ctx) : ctx_(&ctx), impl_(new detail::group_impl(ctx.detail_impl())) {}

request_group::~request_group() {
  impl_->cancel_all();
  delete impl_;
}

std::size_t request_group::cancel() noexcept { return impl_->cancel_all(); }

std::size_t request_group::pending() const noexcept { return impl_->pending(); }

}  // namespace averbs
