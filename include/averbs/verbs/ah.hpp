// SPDX-License-Identifier: MIT
/// @file
/// `averbs::ah`: an address handle for UD sends.
#pragma once

#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/types.hpp>

#include <memory>

namespace averbs {

namespace detail {
void start_destroy_ah(const std::shared_ptr<ah_obj>& a, completer<void> c) noexcept;
}

/// An address handle (`ibv_ah`): where a UD send goes.
class ah {
 public:
  ah() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }
  const ah_attr& attr() const;

  template <completion_token<void> Token>
  auto async_destroy(Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_](detail::completer<void> c) noexcept { detail::start_destroy_ah(o, c); });
  }
  void destroy() const { detail::sync_call<void>([&](auto t) { return async_destroy(t); }, "averbs::ah::destroy"); }
  void destroy(std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_destroy(t); }, ec);
  }

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::ah_obj> obj_;
};

}  // namespace averbs
