// SPDX-License-Identifier: MIT
/// @file
/// `averbs::mw`: a memory window (type 1 or type 2).
#pragma once

#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/types.hpp>

#include <memory>

namespace averbs {

namespace detail {
void start_dealloc_mw(const std::shared_ptr<mw_obj>& m, completer<void> c) noexcept;
}

/// A memory window: a remote-access grant on part of a region, bound by a
/// work request (`qp::bind_mw` for type 1, `wr_opcode::bind_mw` for type 2)
/// and invalidated by `local_inv` or SEND with invalidate (type 2).
class mw {
 public:
  mw() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }
  /// The window's current R_Key (changes with every bind).
  std::uint32_t rkey() const noexcept;
  mw_type type() const noexcept;

  /// Deallocates (`ibv_dealloc_mw`); a bound window is unbound first.
  template <completion_token<void> Token>
  auto async_dealloc(Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_](detail::completer<void> c) noexcept { detail::start_dealloc_mw(o, c); });
  }
  void dealloc() const { detail::sync_call<void>([&](auto t) { return async_dealloc(t); }, "averbs::mw::dealloc"); }
  void dealloc(std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_dealloc(t); }, ec);
  }

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::mw_obj> obj_;
};

}  // namespace averbs
