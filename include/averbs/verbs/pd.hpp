// SPDX-License-Identifier: MIT
/// @file
/// `averbs::pd`: a protection domain and the objects created in it.
#pragma once

#include <averbs/verbs/ah.hpp>
#include <averbs/verbs/cq.hpp>
#include <averbs/verbs/detail.hpp>
#include <averbs/verbs/mr.hpp>
#include <averbs/verbs/mw.hpp>
#include <averbs/verbs/qp.hpp>
#include <averbs/verbs/srq.hpp>
#include <averbs/verbs/types.hpp>

#include <memory>

namespace averbs {

namespace detail {
void start_reg_mr(const std::shared_ptr<pd_obj>& p, void* addr, std::size_t length, std::uint32_t access,
                  completer<mr> c) noexcept;
void start_alloc_mw(const std::shared_ptr<pd_obj>& p, mw_type type, completer<mw> c) noexcept;
void start_create_ah(const std::shared_ptr<pd_obj>& p, const ah_attr& attr, completer<ah> c) noexcept;
void start_create_qp(const std::shared_ptr<pd_obj>& p, const qp_init_attr& attr, completer<qp> c) noexcept;
void start_create_srq(const std::shared_ptr<pd_obj>& p, const srq_attr& attr, completer<srq> c) noexcept;
void start_dealloc_pd(const std::shared_ptr<pd_obj>& p, completer<void> c) noexcept;
}  // namespace detail

/// A protection domain.  Copies share it; it is deallocated by `dealloc()`
/// or with the last copy and the last object created in it.
class pd {
 public:
  pd() noexcept = default;
  explicit operator bool() const noexcept { return obj_ != nullptr; }

  /// Registers [addr, addr + length) (`ibv_reg_mr`).  Errors:
  /// `invalid_argument` (remote write or atomic without local write, zero
  /// length, overflow, an unknown flag), `not_supported` (on-demand
  /// paging, the FLUSH targets), `bad_address` (the range is not all mapped, or not writable
  /// where the access needs it: the kernel's EFAULT), `no_resources`.  The
  /// huge-page hint and the optional flags (bits 20-29, relaxed ordering)
  /// are accepted, as the kernel does.  `access_zero_based` makes the
  /// region's remote addresses start at 0 (an extension: rxe refuses the
  /// flag, libibverbs uses it for windows).  Unmapping a registered range is the
  /// program's error: the device may fault on it, as it would on any freed
  /// memory.
  template <completion_token<mr> Token>
  auto async_reg_mr(void* addr, std::size_t length, std::uint32_t access, Token&& token) const {
    return detail::initiate<mr>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                [o = obj_, addr, length, access](detail::completer<mr> c) noexcept {
                                  detail::start_reg_mr(o, addr, length, access, c);
                                });
  }
  mr reg_mr(void* addr, std::size_t length, std::uint32_t access) const {
    return detail::sync_call<mr>([&](auto t) { return async_reg_mr(addr, length, access, t); }, "averbs::pd::reg_mr");
  }
  mr reg_mr(void* addr, std::size_t length, std::uint32_t access, std::error_code& ec) const noexcept {
    return detail::sync_call<mr>([&](auto t) { return async_reg_mr(addr, length, access, t); }, ec);
  }

  /// Allocates a memory window (`ibv_alloc_mw`).  Errors: `invalid_argument`
  /// for a type other than 1 or 2.
  template <completion_token<mw> Token>
  auto async_alloc_mw(mw_type type, Token&& token) const {
    return detail::initiate<mw>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                [o = obj_, type](detail::completer<mw> c) noexcept { detail::start_alloc_mw(o, type, c); });
  }
  mw alloc_mw(mw_type type) const {
    return detail::sync_call<mw>([&](auto t) { return async_alloc_mw(type, t); }, "averbs::pd::alloc_mw");
  }
  mw alloc_mw(mw_type type, std::error_code& ec) const noexcept {
    return detail::sync_call<mw>([&](auto t) { return async_alloc_mw(type, t); }, ec);
  }

  /// Creates an address handle (`ibv_create_ah`).  Errors: `invalid_argument`
  /// (no GRH on RoCE, bad port, bad source GID index, zero destination).
  template <completion_token<ah> Token>
  auto async_create_ah(const ah_attr& attr, Token&& token) const {
    return detail::initiate<ah>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                [o = obj_, attr](detail::completer<ah> c) noexcept { detail::start_create_ah(o, attr, c); });
  }
  ah create_ah(const ah_attr& attr) const {
    return detail::sync_call<ah>([&](auto t) { return async_create_ah(attr, t); }, "averbs::pd::create_ah");
  }
  ah create_ah(const ah_attr& attr, std::error_code& ec) const noexcept {
    return detail::sync_call<ah>([&](auto t) { return async_create_ah(attr, t); }, ec);
  }

  /// Creates a queue pair in RESET (`ibv_create_qp`).  Errors:
  /// `invalid_argument` (no CQ, caps above the device limits, SRQ of another
  /// PD), `not_supported` (QP type).
  template <completion_token<qp> Token>
  auto async_create_qp(const qp_init_attr& attr, Token&& token) const {
    return detail::initiate<qp>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                [o = obj_, attr](detail::completer<qp> c) noexcept { detail::start_create_qp(o, attr, c); });
  }
  qp create_qp(const qp_init_attr& attr) const {
    return detail::sync_call<qp>([&](auto t) { return async_create_qp(attr, t); }, "averbs::pd::create_qp");
  }
  qp create_qp(const qp_init_attr& attr, std::error_code& ec) const noexcept {
    return detail::sync_call<qp>([&](auto t) { return async_create_qp(attr, t); }, ec);
  }

  /// Creates a shared receive queue (`ibv_create_srq`); `attr.srq_limit`
  /// arms the limit at once, whatever its value (as rxe).  Errors:
  /// `invalid_argument` (max_wr 0 or above the limit, too many SGEs).
  template <completion_token<srq> Token>
  auto async_create_srq(const srq_attr& attr, Token&& token) const {
    return detail::initiate<srq>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                 [o = obj_, attr](detail::completer<srq> c) noexcept { detail::start_create_srq(o, attr, c); });
  }
  srq create_srq(const srq_attr& attr) const {
    return detail::sync_call<srq>([&](auto t) { return async_create_srq(attr, t); }, "averbs::pd::create_srq");
  }
  srq create_srq(const srq_attr& attr, std::error_code& ec) const noexcept {
    return detail::sync_call<srq>([&](auto t) { return async_create_srq(attr, t); }, ec);
  }

  /// Deallocates (`ibv_dealloc_pd`).  Errors: `busy` while objects created in
  /// it live.
  template <completion_token<void> Token>
  auto async_dealloc(Token&& token) const {
    return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                  [o = obj_](detail::completer<void> c) noexcept { detail::start_dealloc_pd(o, c); });
  }
  void dealloc() const { detail::sync_call<void>([&](auto t) { return async_dealloc(t); }, "averbs::pd::dealloc"); }
  void dealloc(std::error_code& ec) const noexcept {
    detail::sync_call<void>([&](auto t) { return async_dealloc(t); }, ec);
  }

 private:
  friend struct detail::handle_access;
  std::shared_ptr<detail::pd_obj> obj_;
};

template <completion_token<void> Token>
auto mr::async_rereg(int flags, const pd* new_pd, void* addr, std::size_t length, std::uint32_t access,
                     Token&& token) const {
  std::shared_ptr<detail::pd_obj> p = new_pd != nullptr ? detail::handle_access::obj(*new_pd) : nullptr;
  return detail::initiate<void>(detail::context_of(obj_.get()), nullptr, std::forward<Token>(token),
                                [o = obj_, flags, p, addr, length, access](detail::completer<void> c) noexcept {
                                  detail::start_rereg_mr(o, flags, p, addr, length, access, c);
                                });
}
inline void mr::rereg(int flags, const pd* new_pd, void* addr, std::size_t length, std::uint32_t access) const {
  detail::sync_call<void>([&](auto t) { return async_rereg(flags, new_pd, addr, length, access, t); },
                          "averbs::mr::rereg");
}
inline void mr::rereg(int flags, const pd* new_pd, void* addr, std::size_t length, std::uint32_t access,
                      std::error_code& ec) const noexcept {
  detail::sync_call<void>([&](auto t) { return async_rereg(flags, new_pd, addr, length, access, t); }, ec);
}

}  // namespace averbs
