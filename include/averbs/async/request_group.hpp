// SPDX-License-Identifier: MIT
/// @file
/// `averbs::request_group`: cancels a set of pending requests together, for
/// example every pending notification of one CQ, or everything an object
/// started when it is destroyed.
#pragma once

#include <averbs/async/context.hpp>

#include <cstddef>

namespace averbs {

/// A set of pending requests that can be cancelled as one.
///
/// Operations that accept a group join it at initiation and leave it when
/// they complete.  `cancel()` and the destructor complete every request still
/// in the group with `errc::operation_aborted`, exactly once each, also when
/// a cancel races the request's own completion.
///
/// Thread safety: all members may be called from any thread; starting an
/// operation in a group while the group is being destroyed is undefined.
class request_group {
 public:
  explicit request_group(context& ctx);
  /// Cancels every pending request of the group.
  ~request_group();
  request_group(const request_group&) = delete;
  request_group& operator=(const request_group&) = delete;

  /// Cancels every pending request; returns how many this call cancelled.
  std::size_t cancel() noexcept;

  /// Requests of the group not yet completed.
  std::size_t pending() const noexcept;

  context& get_context() const noexcept { return *ctx_; }
  detail::group_impl& detail_impl() const noexcept { return *impl_; }

 private:
  context* ctx_;
  detail::group_impl* impl_;
};

}  // namespace averbs
