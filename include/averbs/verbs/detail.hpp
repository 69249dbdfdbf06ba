// SPDX-License-Identifier: MIT
/// @file
/// Internal: the user-side objects behind the verbs handles and the
/// non-template bodies of the verbs operations.  Not part of the API.
#pragma once

#include <averbs/async/initiate.hpp>

#include <memory>

namespace averbs {
class device;
class pd;
class cq;
class qp;
class srq;
class mr;
class mw;
class ah;
}  // namespace averbs

namespace averbs::detail {

struct device_obj;
struct pd_obj;
struct cq_obj;
struct qp_obj;
struct srq_obj;
struct mr_obj;
struct mw_obj;
struct ah_obj;

/// The context a handle's operations complete on.  Throws
/// `errc::invalid_argument` for an empty handle (the operation could not
/// start).
context& context_of(const device_obj* o);
context& context_of(const pd_obj* o);
context& context_of(const cq_obj* o);
context& context_of(const qp_obj* o);
context& context_of(const srq_obj* o);
context& context_of(const mr_obj* o);
context& context_of(const mw_obj* o);
context& context_of(const ah_obj* o);

/// Implemented by the verbs layer to build handles from objects.
struct handle_access {
  template <class Handle, class Obj>
  static Handle make(std::shared_ptr<Obj> o) noexcept {
    Handle h;
    h.obj_ = std::move(o);
    return h;
  }
  template <class Handle>
  static const auto& obj(const Handle& h) noexcept {
    return h.obj_;
  }
};

}  // namespace averbs::detail
