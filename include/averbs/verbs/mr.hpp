// SPDX-License-Identifier: MIT
/// @file
/// `averbs::mr`: a registered memory region.
#pragma once

#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/types.hpp>

#include <memory>

namespace averbs {

/// `ibv_rereg_mr` flags.
enum rereg_flags : int {
  rereg_change_translation = 1,
  rereg_change_pd = 2,
  rereg_change_access = 4,
};

namespace detail {
void start_dereg_mr(const std::shared_ptr<mr_obj>& m, completer<void> c) noexcept;
void start_rereg_mr(const std::shared_ptr<mr_obj>& m, int flags, const std::shared_ptr<pd_obj>& pd, void* addr,
                    std::size_t length, std::uint32_t access, completer<void> c) noexcept;
}  // namespace detail

/// A memory region: [addr, addr + length) of this process, accessible through
/// its keys with the access flags it was registered with.  The memory must
/// stay mapped until the region is deregistered.  Copies share the region;
/// it is deregistered by `dereg()` or with the last copy.
class mr {
 public:
  mr() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }
  std::uint32_t lkey() const noexcept;
  std::uint32_t rkey() const noexcept;
  void* addr() const noexcept;
  std::size_t length() const noexcept;
  std::uint32_t access() const noexcept;

  /// Changes the translation, PD or access of the region (`ibv_rereg_mr`);
  /// the keys change.  Errors: `invalid_argument` (no or unknown flags, remote
  /// write/atomic without local write, zero length), `invalid_state` while
  /// windows are bound.
  template <completion_token<void> Token>
  auto async_rereg(int flags, const class pd* new_pd, void* addr, std::size_t length, std::uint32_t access,
                   Token&& token) const;
  void rereg(int flags, const class pd* new_pd, void* addr, std::size_t length, std::uint32_t access) const;
  void rereg(int flags, const class pd* new_pd, void* addr, std::size_t length, std::uint32_t access,
             std::error_code& ec) const noexcept;

  /// Deregisters (`ibv_dereg_mr`).  Errors: `invalid_state` while windows
  /// are bound (IBA 10.6.7.2.6; EINVAL in rxe); `stale_handle` if already
  /// deregistered.
  template <completion_token<void> Token>
  auto async_dereg(Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_](detail::completer<void> c) noexcept { detail::start_dereg_mr(o, c); });
  }
  void dereg() const { detail::sync_call<void>([&](auto t) { return async_dereg(t); }, "averbs::mr::dereg"); }
  void dereg(std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_dereg(t); }, ec);
  }

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::mr_obj> obj_;
};

}  // namespace averbs
