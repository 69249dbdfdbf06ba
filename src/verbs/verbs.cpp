// SPDX-License-Identifier: MIT
// The bodies of the verbs operations and the data-path calls: check the
// handle and the device, call the engine, complete the request.
#include "verbs/objects.hpp"
#include "verbs/registry.hpp"
#include "wire/roce.hpp"

#include <averbs/error.hpp>
#include <averbs/verbs.hpp>

#include <arpa/inet.h>

#include <atomic>
#include <cstring>

namespace averbs {
namespace detail {

namespace {

std::error_code err(errc e) { return make_error_code(e); }

// The first reason an operation on a handle cannot start, if any.
template <class O>
std::error_code unusable(const O* o, const void* e, const device_obj& d) {
  if (o == nullptr) return err(errc::invalid_argument);
  if (d.removed()) return err(errc::device_removed);
  if (e == nullptr) return err(errc::stale_handle);
  return {};
}

// Destroys the engine object in `slot` (a handle's) with `destroy`.  Copies
// of one handle share it: of two threads destroying them at once, one takes the object
// and the other finds none (stale_handle), instead of both freeing it.  A
// refused destroy puts it back.
// The whole destroy runs under the device's handle lock, held exclusively:
// control verbs still using the object (use_handles()) finish first, later
// ones find the slot empty -- and a destroy refused (busy) leaves the slot
// as it was, so nobody meanwhile sees the live object as destroyed.
// (Destroying takes the engine lock next, as control verbs do.)
template <class E, class F>
std::error_code destroy_once(E*& slot, const device_obj& d, F&& destroy) {
  if (d.removed()) return err(errc::device_removed);
  std::unique_lock lock(d.entry->handles);
  E* const e = std::atomic_ref<E*>(slot).load(std::memory_order_acquire);
  if (e == nullptr) return err(errc::stale_handle);
  if (auto ec = destroy(e)) return ec;
  std::atomic_ref<E*>(slot).store(nullptr, std::memory_order_release);
  return {};
}

}  // namespace

// --- contexts of handles ------------------------------------------------------

namespace {
[[noreturn]] void empty_handle() {
  throw std::system_error(make_error_code(errc::invalid_argument), "empty averbs handle");
}
}  // namespace

context& context_of(const device_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->ctx;
}
context& context_of(const pd_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->dev->ctx;
}
context& context_of(const cq_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->dev->ctx;
}
context& context_of(const qp_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->pd->dev->ctx;
}
context& context_of(const srq_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->pd->dev->ctx;
}
context& context_of(const mr_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->dev->ctx;
}
context& context_of(const mw_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->pd->dev->ctx;
}
context& context_of(const ah_obj* o) {
  if (o == nullptr) empty_handle();
  return *o->pd->dev->ctx;
}

request_group* group_of(const device_obj* d) noexcept { return d != nullptr ? d->events.get() : nullptr; }
request_group* group_of(const cq_obj* q) noexcept { return q != nullptr ? q->notifies.get() : nullptr; }

// --- destructors: a dropped handle releases its engine object ------------------

device_obj::~device_obj() {
  events.reset();  // cancels parked get_event requests
  if (channel != nullptr) eng->close_events(channel);
  if (entry == nullptr) return;  // open_device failed before it counted as a source of the context
  std::lock_guard lock(entry->mu);
  auto it = entry->sources.find(&ctx->detail_impl());
  if (it != entry->sources.end() && --it->second == 0) {
    ctx->remove_source(*eng);
    entry->sources.erase(it);
  }
}

pd_obj::~pd_obj() {
  if (e != nullptr) dev->eng->release_pd(e);
}
mr_obj::~mr_obj() {
  if (e != nullptr) dev->eng->release_mr(e);
}
mw_obj::~mw_obj() {
  if (e != nullptr) pd->dev->eng->dealloc_mw(e);
}
ah_obj::~ah_obj() {
  if (e != nullptr) pd->dev->eng->destroy_ah(e);
}
cq_obj::~cq_obj() {
  notifies.reset();
  if (e != nullptr) dev->eng->release_cq(e);
}
srq_obj::~srq_obj() {
  if (e != nullptr) pd->dev->eng->release_srq(e);
}
qp_obj::~qp_obj() {
  if (e != nullptr) pd->dev->eng->destroy_qp(e);
}

// --- device -------------------------------------------------------------------

void start_open_device(context& ctx, const std::string& name, completer<device> c) noexcept {
  try {
    std::shared_ptr<device_entry> entry = find_device(name);
    if (entry == nullptr) {
      c.fail(err(errc::not_found));
      return;
    }
    if (entry->removed.load()) {
      c.fail(err(errc::device_removed));
      return;
    }
    auto obj = std::make_shared<device_obj>();
    obj->ctx = &ctx;
    obj->eng = entry->engine.get();  // `entry` (local) keeps it alive until obj->entry does
    obj->events = std::make_unique<request_group>(ctx);
    obj->channel = obj->eng->open_events();
    if (obj->channel == nullptr) {  // removed since the check above
      c.fail(err(errc::device_removed));
      return;
    }
    {
      std::lock_guard lock(entry->mu);
      int& n = entry->sources[&ctx.detail_impl()];
      if (n == 0) {
        std::error_code ec;
        ctx.add_source(*obj->eng, ec);
        if (ec) {
          entry->sources.erase(&ctx.detail_impl());
          c.fail(ec);
          return;
        }
      }
      // Counted: from here the destructor uncounts it.  Set no earlier: a
      // throw above would otherwise uncount another handle's source.
      ++n;
      obj->entry = entry;
    }
    c.complete({}, handle_access::make<device>(std::move(obj)));
  } catch (const std::system_error& e) {
    // A configuration that names the device wrongly, an address in use.
    c.fail(e.code());
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_query_device(const std::shared_ptr<device_obj>& d, completer<device_attr> c) noexcept {
  if (auto ec = unusable(d.get(), d.get(), *d)) return void(c.fail(ec));
  try {
    c.complete({}, d->eng->query_device());
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_query_port(const std::shared_ptr<device_obj>& d, std::uint8_t port, completer<port_attr> c) noexcept {
  if (auto ec = unusable(d.get(), d.get(), *d)) return void(c.fail(ec));
  port_attr a;
  if (auto ec = d->eng->query_port(port, a)) return void(c.fail(ec));
  c.complete({}, a);
}

void start_query_gid(const std::shared_ptr<device_obj>& d, std::uint8_t port, std::uint32_t index,
                     completer<gid> c) noexcept {
  if (auto ec = unusable(d.get(), d.get(), *d)) return void(c.fail(ec));
  gid g;
  if (auto ec = d->eng->query_gid(port, index, g)) return void(c.fail(ec));
  c.complete({}, g);
}

void start_query_pkey(const std::shared_ptr<device_obj>& d, std::uint8_t port, std::uint16_t index,
                      completer<std::uint16_t> c) noexcept {
  if (auto ec = unusable(d.get(), d.get(), *d)) return void(c.fail(ec));
  std::uint16_t v = 0;
  if (auto ec = d->eng->query_pkey(port, index, v)) return void(c.fail(ec));
  c.complete({}, v);
}

void start_alloc_pd(const std::shared_ptr<device_obj>& d, completer<pd> c) noexcept {
  if (auto ec = unusable(d.get(), d.get(), *d)) return void(c.fail(ec));
  try {
    auto obj = std::make_shared<pd_obj>();
    obj->dev = d;
    if (auto ec = d->eng->alloc_pd(d->channel, obj->e)) return void(c.fail(ec));
    c.complete({}, handle_access::make<pd>(std::move(obj)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_create_cq(const std::shared_ptr<device_obj>& d, std::uint32_t cqe, completer<cq> c) noexcept {
  if (auto ec = unusable(d.get(), d.get(), *d)) return void(c.fail(ec));
  try {
    auto obj = std::make_shared<cq_obj>();
    obj->dev = d;
    obj->notifies = std::make_unique<request_group>(*d->ctx);
    if (auto ec = d->eng->create_cq(cqe, d->channel, obj->e)) return void(c.fail(ec));
    c.complete({}, handle_access::make<cq>(std::move(obj)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_get_event(const std::shared_ptr<device_obj>& d, completer<async_event> c) noexcept {
  // After removal the queued events (device_fatal first) are still handed
  // out, as rdma-core does; then the engine answers device_removed.
  if (d == nullptr) return void(c.fail(err(errc::invalid_argument)));
  try {
    d->eng->get_event(d->channel, c.context(), c.id());
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

// --- pd -----------------------------------------------------------------------

void start_reg_mr(const std::shared_ptr<pd_obj>& p, void* addr, std::size_t length, std::uint32_t access,
                  completer<mr> c) noexcept {
  if (p == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*p->dev);
  soft::pd_t* pe = live(p->e);
  if (auto ec = unusable(p.get(), pe, *p->dev)) return void(c.fail(ec));
  try {
    auto obj = std::make_shared<mr_obj>();
    obj->dev = p->dev;
    obj->pd = p;
    obj->addr = addr;
    obj->length = length;
    if (auto ec = p->dev->eng->reg_mr(pe, reinterpret_cast<std::uintptr_t>(addr), length, access, obj->e))
      return void(c.fail(ec));
    c.complete({}, handle_access::make<mr>(std::move(obj)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_alloc_mw(const std::shared_ptr<pd_obj>& p, mw_type type, completer<mw> c) noexcept {
  if (p == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*p->dev);
  soft::pd_t* pe = live(p->e);
  if (auto ec = unusable(p.get(), pe, *p->dev)) return void(c.fail(ec));
  try {
    auto obj = std::make_shared<mw_obj>();
    obj->pd = p;
    if (auto ec = p->dev->eng->alloc_mw(pe, type, obj->e)) return void(c.fail(ec));
    obj->ref = {p->dev->eng, obj->e->handle, obj->e->gen};
    c.complete({}, handle_access::make<mw>(std::move(obj)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_create_ah(const std::shared_ptr<pd_obj>& p, const ah_attr& attr, completer<ah> c) noexcept {
  if (p == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*p->dev);
  soft::pd_t* pe = live(p->e);
  if (auto ec = unusable(p.get(), pe, *p->dev)) return void(c.fail(ec));
  try {
    auto obj = std::make_shared<ah_obj>();
    obj->pd = p;
    if (auto ec = p->dev->eng->create_ah(pe, attr, obj->e)) return void(c.fail(ec));
    obj->ref = {p->dev->eng, obj->e->handle, obj->e->gen};
    obj->attr = obj->e->attr;  // as the device keeps it: the route's hop limit
    c.complete({}, handle_access::make<ah>(std::move(obj)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_create_srq(const std::shared_ptr<pd_obj>& p, const srq_attr& attr, completer<srq> c) noexcept {
  if (p == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*p->dev);
  soft::pd_t* pe = live(p->e);
  if (auto ec = unusable(p.get(), pe, *p->dev)) return void(c.fail(ec));
  try {
    auto obj = std::make_shared<srq_obj>();
    obj->pd = p;
    if (auto ec = p->dev->eng->create_srq(pe, attr, obj->e)) return void(c.fail(ec));
    c.complete({}, handle_access::make<srq>(std::move(obj)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_create_qp(const std::shared_ptr<pd_obj>& p, const qp_init_attr& attr, completer<qp> c) noexcept {
  if (p == nullptr) return void(c.fail(err(errc::invalid_argument)));
  // One lock covers the PD, the CQs and the SRQ: objects of other devices
  // are refused before any is used.
  const auto handles = use_handles(*p->dev);
  soft::pd_t* pe = live(p->e);
  if (auto ec = unusable(p.get(), pe, *p->dev)) return void(c.fail(ec));
  try {
    auto obj = std::make_shared<qp_obj>();
    obj->pd = p;
    obj->scq = handle_access::obj(attr.send_cq);
    obj->rcq = handle_access::obj(attr.recv_cq);
    obj->srq = handle_access::obj(attr.srq);
    // Both CQs, with an SRQ too (rxe_qp_chk_init), and of this device
    // handle: as in libibverbs, whose CQ handles belong to one context (a
    // CQ of another opened handle would deliver its events elsewhere).
    if (obj->scq == nullptr || obj->rcq == nullptr) return void(c.fail(err(errc::invalid_argument)));
    if (obj->scq->dev != p->dev || obj->rcq->dev != p->dev || (obj->srq && obj->srq->pd->dev != p->dev))
      return void(c.fail(err(errc::invalid_argument)));
    soft::device::qp_init init;
    init.send_cq = live(obj->scq->e);
    init.recv_cq = live(obj->rcq->e);
    init.srq = obj->srq ? live(obj->srq->e) : nullptr;
    if (init.send_cq == nullptr || init.recv_cq == nullptr || (obj->srq != nullptr && init.srq == nullptr))
      return void(c.fail(err(errc::stale_handle)));  // destroyed
    init.cap = attr.cap;
    init.type = attr.type;
    init.sq_sig_all = attr.sq_sig_all;
    if (auto ec = p->dev->eng->create_qp(pe, init, obj->e)) return void(c.fail(ec));
    obj->qpn = obj->e->qpn;
    obj->type = attr.type;
    c.complete({}, handle_access::make<qp>(std::move(obj)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_dealloc_pd(const std::shared_ptr<pd_obj>& p, completer<void> c) noexcept {
  if (p == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (auto ec = destroy_once(p->e, *p->dev, [&](soft::pd_t* e) { return p->dev->eng->dealloc_pd(e); }))
    return void(c.fail(ec));
  c.complete({});
}

// --- mr, mw, ah -----------------------------------------------------------------

void start_dereg_mr(const std::shared_ptr<mr_obj>& m, completer<void> c) noexcept {
  if (m == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (auto ec = destroy_once(m->e, *m->dev, [&](soft::mr_t* e) { return m->dev->eng->dereg_mr(e); }))
    return void(c.fail(ec));
  c.complete({});
}

void start_rereg_mr(const std::shared_ptr<mr_obj>& m, int flags, const std::shared_ptr<pd_obj>& pd, void* addr,
                    std::size_t length, std::uint32_t access, completer<void> c) noexcept {
  if (m == nullptr) return void(c.fail(err(errc::invalid_argument)));
  // Exclusively: it changes the handle itself (its PD, address, length),
  // which another rereg or a dereg must not see half done.
  std::unique_lock handles(m->dev->entry->handles);
  soft::mr_t* me = live(m->e);
  if (auto ec = unusable(m.get(), me, *m->dev)) return void(c.fail(ec));
  const bool new_pd = (flags & rereg_change_pd) != 0;
  if (new_pd && (pd == nullptr || pd->dev != m->dev))
    return void(c.fail(err(errc::invalid_argument)));  // none, or another device handle's
  soft::pd_t* target = live(new_pd ? pd->e : m->pd->e);
  if (target == nullptr) return void(c.fail(err(errc::stale_handle)));
  if (auto ec = m->dev->eng->rereg_mr(me, flags, target, reinterpret_cast<std::uintptr_t>(addr), length, access))
    return void(c.fail(ec));
  if ((flags & rereg_change_translation) != 0) {
    m->addr = addr;
    m->length = length;
  }
  if (new_pd) m->pd = pd;
  c.complete({});
}

void start_dealloc_mw(const std::shared_ptr<mw_obj>& m, completer<void> c) noexcept {
  if (m == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (auto ec =
          destroy_once(m->e, *m->pd->dev, [&](soft::mw_t* e) { return m->pd->dev->eng->dealloc_mw(e); }))
    return void(c.fail(ec));
  c.complete({});
}

void start_destroy_ah(const std::shared_ptr<ah_obj>& a, completer<void> c) noexcept {
  if (a == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (auto ec =
          destroy_once(a->e, *a->pd->dev, [&](soft::ah_t* e) { return a->pd->dev->eng->destroy_ah(e); }))
    return void(c.fail(ec));
  c.complete({});
}

// --- cq -------------------------------------------------------------------------

void start_cq_notify(const std::shared_ptr<cq_obj>& q, bool solicited_only, completer<void> c) noexcept {
  if (q == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*q->dev);
  soft::cq_t* e = live(q->e);
  if (auto ec = unusable(q.get(), e, *q->dev)) return void(c.fail(ec));
  try {
    q->dev->eng->arm_cq(e, solicited_only, c.context(), c.id());
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_resize_cq(const std::shared_ptr<cq_obj>& q, std::uint32_t cqe, completer<void> c) noexcept {
  if (q == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*q->dev);
  soft::cq_t* e = live(q->e);
  if (auto ec = unusable(q.get(), e, *q->dev)) return void(c.fail(ec));
  if (auto ec = q->dev->eng->resize_cq(e, cqe)) return void(c.fail(ec));
  c.complete({});
}

void start_destroy_cq(const std::shared_ptr<cq_obj>& q, completer<void> c) noexcept {
  if (q == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (auto ec = destroy_once(q->e, *q->dev, [&](soft::cq_t* e) { return q->dev->eng->destroy_cq(e); }))
    return void(c.fail(ec));
  c.complete({});
}

// --- srq ------------------------------------------------------------------------

void start_modify_srq(const std::shared_ptr<srq_obj>& s, srq_attr attr, std::uint32_t mask,
                      completer<void> c) noexcept {
  if (s == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*s->pd->dev);
  soft::srq_t* e = live(s->e);
  if (auto ec = unusable(s.get(), e, *s->pd->dev)) return void(c.fail(ec));
  if (auto ec = s->pd->dev->eng->modify_srq(e, attr, mask)) return void(c.fail(ec));
  c.complete({});
}

void start_query_srq(const std::shared_ptr<srq_obj>& s, completer<srq_attr> c) noexcept {
  if (s == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*s->pd->dev);
  soft::srq_t* e = live(s->e);
  if (auto ec = unusable(s.get(), e, *s->pd->dev)) return void(c.fail(ec));
  srq_attr a;
  if (auto ec = s->pd->dev->eng->query_srq(e, a)) return void(c.fail(ec));
  c.complete({}, a);
}

void start_destroy_srq(const std::shared_ptr<srq_obj>& s, completer<void> c) noexcept {
  if (s == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (auto ec =
          destroy_once(s->e, *s->pd->dev, [&](soft::srq_t* e) { return s->pd->dev->eng->destroy_srq(e); }))
    return void(c.fail(ec));
  c.complete({});
}

// --- qp -------------------------------------------------------------------------

void start_modify_qp(const std::shared_ptr<qp_obj>& q, const qp_attr& attr, std::uint32_t mask,
                     completer<void> c) noexcept {
  if (q == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*q->pd->dev);
  soft::qp_t* e = live(q->e);
  if (auto ec = unusable(q.get(), e, *q->pd->dev)) return void(c.fail(ec));
  if (auto ec = q->pd->dev->eng->modify_qp(e, attr, mask)) return void(c.fail(ec));
  c.complete({});
}

void start_query_qp(const std::shared_ptr<qp_obj>& q, completer<qp_attr> c) noexcept {
  if (q == nullptr) return void(c.fail(err(errc::invalid_argument)));
  const auto handles = use_handles(*q->pd->dev);
  soft::qp_t* e = live(q->e);
  if (auto ec = unusable(q.get(), e, *q->pd->dev)) return void(c.fail(ec));
  qp_attr a;
  qp_cap cap;
  if (auto ec = q->pd->dev->eng->query_qp(e, a, cap)) return void(c.fail(ec));
  c.complete({}, a);
}

void start_destroy_qp(const std::shared_ptr<qp_obj>& q, completer<void> c) noexcept {
  if (q == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (auto ec =
          destroy_once(q->e, *q->pd->dev, [&](soft::qp_t* e) { return q->pd->dev->eng->destroy_qp(e); }))
    return void(c.fail(ec));
  c.complete({});
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Handle accessors and the data path.

namespace {
std::error_code data_path_check(const void* obj, const void* e, const detail::device_obj* d) {
  if (obj == nullptr) return make_error_code(errc::invalid_argument);
  if (d->removed()) return make_error_code(errc::device_removed);
  if (e == nullptr) return make_error_code(errc::stale_handle);
  return {};
}

// A post refused as a whole still names its first work request as the one
// not posted, as every rdma-core provider sets *bad_wr on failure.
std::error_code not_posted(std::error_code ec, std::size_t* bad) noexcept {
  if (bad != nullptr) *bad = 0;
  return ec;
}
}  // namespace

const std::string& device::name() const {
  if (obj_ == nullptr) throw std::system_error(make_error_code(errc::invalid_argument), "empty device handle");
  return obj_->entry->name;
}

std::vector<gid> device::gids() const {
  if (obj_ == nullptr) return {};
  return obj_->eng->gids();
}

std::uint32_t device::find_gid(std::uint8_t port, const gid& g, std::error_code& ec) const noexcept {
  ec = {};
  if (obj_ == nullptr || port != 1) {
    ec = make_error_code(errc::invalid_argument);
    return 0;
  }
  const std::vector<gid>& table = obj_->eng->gid_table();  // (never changes)
  for (std::uint32_t i = 0; i < table.size(); ++i)
    if (table[i] == g) return i;
  ec = make_error_code(errc::not_found);
  return 0;
}

std::uint32_t device::find_gid(std::uint8_t port, const gid& g) const {
  std::error_code ec;
  const std::uint32_t i = find_gid(port, g, ec);
  if (ec) throw std::system_error(ec, "averbs::device::find_gid");
  return i;
}

ah_attr device::init_ah_from_wc(std::uint8_t port, const work_completion& wc,
                                std::span<const std::byte, 40> grh, std::error_code& ec) const noexcept {
  ec = {};
  wire::grh_fields f;
  if (obj_ == nullptr || port != 1 || (wc.wc_flags & wc_grh) == 0 || !wire::parse_grh_area(grh, f)) {
    ec = make_error_code(errc::invalid_argument);
    return {};
  }
  gid to;
  std::memcpy(to.raw.data(), f.dst.data(), 16);
  // Sent to a group: no source GID of ours answers from it (libibverbs:
  // EINVAL).
  if (to.is_group()) {
    ec = make_error_code(errc::invalid_argument);
    return {};
  }
  ah_attr a;
  a.is_global = true;
  a.port_num = port;
  a.sl = wc.sl;
  std::memcpy(a.grh.dgid.raw.data(), f.src.data(), 16);
  const std::uint32_t index = find_gid(port, to, ec);
  if (ec) return {};
  // An AV names its source GID in 8 bits (ibv_global_route): an entry
  // past 255 cannot be named, and wrapping would answer from another.
  if (index > 0xFF) {
    ec = make_error_code(errc::invalid_argument);
    return {};
  }
  a.grh.sgid_index = static_cast<std::uint8_t>(index);
  a.grh.traffic_class = f.traffic_class;
  a.grh.flow_label = f.flow_label;
  a.grh.hop_limit = 0xFF;
  return a;
}

ah_attr device::init_ah_from_wc(std::uint8_t port, const work_completion& wc,
                                std::span<const std::byte, 40> grh) const {
  std::error_code ec;
  ah_attr a = init_ah_from_wc(port, wc, grh, ec);
  if (ec) throw std::system_error(ec, "averbs::device::init_ah_from_wc");
  return a;
}

device_counters device::counters() const {
  if (obj_ == nullptr) return {};
  return obj_->eng->counters();
}

std::uint16_t device::udp_port() const {
  if (obj_ == nullptr) throw std::system_error(make_error_code(errc::invalid_argument), "empty device handle");
  return obj_->eng->udp_port();
}

std::size_t device::cancel_events() const noexcept {
  return obj_ != nullptr ? obj_->events->cancel() : 0;
}

device open_device(context& ctx, std::string_view name) {
  // A device named wrongly by the environment or the configuration file
  // throws here with the reason (which line, which value); the request
  // below carries only the error code.
  (void)detail::find_device(std::string(name));
  return detail::sync_call<device>([&](auto t) { return async_open_device(ctx, name, t); }, "averbs::open_device");
}

device open_device(context& ctx, std::string_view name, std::error_code& ec) noexcept {
  return detail::sync_call<device>([&](auto t) { return async_open_device(ctx, name, t); }, ec);
}

// The accessors read a handle's slot once: a destroy on another thread
// makes them the caller's race (as the data path), never a null dereference.
std::uint32_t mr::lkey() const noexcept {
  const soft::mr_t* e = obj_ ? detail::live(obj_->e) : nullptr;
  return e != nullptr ? e->lkey : 0;
}
std::uint32_t mr::rkey() const noexcept {
  const soft::mr_t* e = obj_ ? detail::live(obj_->e) : nullptr;
  return e != nullptr ? e->rkey : 0;
}
void* mr::addr() const noexcept { return obj_ ? obj_->addr : nullptr; }
std::size_t mr::length() const noexcept { return obj_ ? obj_->length : 0; }
std::uint32_t mr::access() const noexcept {
  const soft::mr_t* e = obj_ ? detail::live(obj_->e) : nullptr;
  return e != nullptr ? e->access : 0;
}

std::uint32_t mw::rkey() const noexcept {
  if (!obj_) return 0;
  const auto handles = detail::use_handles(*obj_->pd->dev);
  soft::mw_t* e = detail::live(obj_->e);
  return e != nullptr ? obj_->pd->dev->eng->mw_rkey(e) : 0;
}
mw_type mw::type() const noexcept {
  const soft::mw_t* e = obj_ ? detail::live(obj_->e) : nullptr;
  return e != nullptr ? e->type : mw_type::type1;
}

const ah_attr& ah::attr() const {
  if (!obj_) throw std::system_error(make_error_code(errc::invalid_argument), "empty ah");
  return obj_->attr;
}

std::size_t cq::poll(std::span<work_completion> out) const noexcept {
  soft::cq_t* e = obj_ ? detail::live(obj_->e) : nullptr;
  if (e == nullptr || obj_->dev->removed()) return 0;
  return obj_->dev->eng->poll_cq(e, out);
}

std::uint32_t cq::cqe() const noexcept {
  if (!obj_) return 0;
  const auto handles = detail::use_handles(*obj_->dev);  // resize_cq changes it
  soft::cq_t* e = detail::live(obj_->e);
  return e != nullptr ? obj_->dev->eng->cqe_of(e) : 0;
}
std::uint32_t cq::handle() const noexcept {
  const soft::cq_t* e = obj_ ? detail::live(obj_->e) : nullptr;
  return e != nullptr ? e->event_id() : 0;
}
std::uint32_t srq::handle() const noexcept {
  const soft::srq_t* e = obj_ ? detail::live(obj_->e) : nullptr;
  return e != nullptr ? e->event_id() : 0;
}

std::size_t cq::cancel_notifies() const noexcept { return obj_ ? obj_->notifies->cancel() : 0; }

std::error_code srq::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) const noexcept {
  auto* e = obj_ ? detail::live(obj_->e) : nullptr;
  if (auto ec = data_path_check(obj_.get(), e, obj_ ? obj_->pd->dev.get() : nullptr))
    return not_posted(ec, bad);
  return obj_->pd->dev->eng->post_srq_recv(e, wrs.data(), wrs.size(), bad);
}

std::uint32_t qp::num() const noexcept { return obj_ ? obj_->qpn : 0; }
qp_type qp::type() const noexcept { return obj_ ? obj_->type : qp_type::rc; }

qp_state qp::state() const noexcept {
  if (!obj_) return qp_state::err;
  const auto handles = detail::use_handles(*obj_->pd->dev);
  soft::qp_t* e = detail::live(obj_->e);
  return e != nullptr ? obj_->pd->dev->eng->state_of(e) : qp_state::err;
}

std::error_code qp::post_send(std::span<const send_wr> wrs, std::size_t* bad) const noexcept {
  auto* e = obj_ ? detail::live(obj_->e) : nullptr;
  if (auto ec = data_path_check(obj_.get(), e, obj_ ? obj_->pd->dev.get() : nullptr))
    return not_posted(ec, bad);
  return obj_->pd->dev->eng->post_send(e, wrs.data(), wrs.size(), bad);
}

std::error_code qp::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) const noexcept {
  auto* e = obj_ ? detail::live(obj_->e) : nullptr;
  if (auto ec = data_path_check(obj_.get(), e, obj_ ? obj_->pd->dev.get() : nullptr))
    return not_posted(ec, bad);
  return obj_->pd->dev->eng->post_recv(e, wrs.data(), wrs.size(), bad);
}

std::error_code qp::bind_mw(const mw& w, std::uint64_t wr_id, std::uint32_t flags, const mw_bind_info& info,
                            std::uint32_t* new_rkey) const noexcept {
  auto* e = obj_ ? detail::live(obj_->e) : nullptr;
  if (auto ec = data_path_check(obj_.get(), e, obj_ ? obj_->pd->dev.get() : nullptr)) return ec;
  // libibverbs: the window and the region must share a PD (EPERM).
  std::uint32_t key = 0;
  if (auto ec = obj_->pd->dev->eng->bind_mw1(e, soft::engine_ref(&w), wr_id, flags, info, key)) return ec;
  if (new_rkey != nullptr) *new_rkey = key;
  return {};
}

namespace soft {
object_ref engine_ref(const averbs::ah* h) noexcept {
  if (h == nullptr) return {};
  const auto& o = detail::handle_access::obj(*h);
  return o ? o->ref : object_ref{};
}
object_ref engine_ref(const averbs::mw* h) noexcept {
  if (h == nullptr) return {};
  const auto& o = detail::handle_access::obj(*h);
  return o ? o->ref : object_ref{};
}
}  // namespace soft

// ---------------------------------------------------------------------------
// Value types.

bool gid::is_zero() const noexcept {
  for (auto b : raw)
    if (b != 0) return false;
  return true;
}

bool gid::is_ipv4_mapped() const noexcept { return wire::is_ipv4_mapped(std::as_bytes(std::span(raw))); }

bool gid::is_unspecified() const noexcept {
  return is_zero() || (is_ipv4_mapped() && raw[12] == 0 && raw[13] == 0 && raw[14] == 0 && raw[15] == 0);
}

bool gid::is_group() const noexcept {
  if (!is_ipv4_mapped()) return raw[0] == 0xFF;
  return (raw[12] & 0xF0) == 0xE0 ||
         (raw[12] == 0xFF && raw[13] == 0xFF && raw[14] == 0xFF && raw[15] == 0xFF);
}

std::string gid::to_string() const {
  char buf[INET6_ADDRSTRLEN];
  if (::inet_ntop(AF_INET6, raw.data(), buf, sizeof buf) == nullptr) return {};
  return buf;
}

bool gid::parse(const std::string& text, gid& out) {
  in_addr a4;
  if (::inet_pton(AF_INET, text.c_str(), &a4) == 1) {
    out = from_ipv4(ntohl(a4.s_addr));
    return true;
  }
  return ::inet_pton(AF_INET6, text.c_str(), out.raw.data()) == 1;
}

gid gid::from_ipv4(std::uint32_t a) noexcept {
  gid g;
  g.raw[10] = g.raw[11] = 0xFF;
  g.raw[12] = static_cast<std::uint8_t>(a >> 24);
  g.raw[13] = static_cast<std::uint8_t>(a >> 16);
  g.raw[14] = static_cast<std::uint8_t>(a >> 8);
  g.raw[15] = static_cast<std::uint8_t>(a);
  return g;
}

const char* to_string(qp_state s) noexcept {
  switch (s) {
    case qp_state::reset: return "RESET";
    case qp_state::init: return "INIT";
    case qp_state::rtr: return "RTR";
    case qp_state::rts: return "RTS";
    case qp_state::sqd: return "SQD";
    case qp_state::sqe: return "SQE";
    case qp_state::err: return "ERR";
  }
  return "UNKNOWN";
}

const char* to_string(event_type t) noexcept {
  // Wording of rdma-core's ibv_event_type_str().
  switch (t) {
    case event_type::cq_err: return "CQ error";
    case event_type::qp_fatal: return "local work queue catastrophic error";
    case event_type::qp_req_err: return "invalid request local work queue error";
    case event_type::qp_access_err: return "local access violation work queue error";
    case event_type::comm_est: return "communication established";
    case event_type::sq_drained: return "send queue drained";
    case event_type::path_mig: return "path migrated";
    case event_type::path_mig_err: return "path migration request error";
    case event_type::device_fatal: return "local catastrophic error";
    case event_type::port_active: return "port active";
    case event_type::port_err: return "port error";
    case event_type::lid_change: return "LID change";
    case event_type::pkey_change: return "P_Key change";
    case event_type::sm_change: return "SM change";
    case event_type::srq_err: return "SRQ catastrophic error";
    case event_type::srq_limit_reached: return "SRQ limit reached";
    case event_type::qp_last_wqe_reached: return "last WQE reached";
    case event_type::client_reregister: return "client reregistration";
    case event_type::gid_change: return "GID table change";
  }
  return "unknown";
}

}  // namespace averbs
