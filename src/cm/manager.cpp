// SPDX-License-Identifier: MIT
// The IB CM state machine of a soft device (see manager.hpp).
//
// Facts followed here, from IBTA vol. 1 ch. 12 and what the kernel's ib_cm
// and rdma_cm do (../shared/reference/roce.md section 3):
//  - REQ carries rdma_cm's IP header first in its private data; the
//    listener is found by the service ID's port space and port and by the
//    header's destination IP.
//  - QP attributes: the passive side takes dest QPN, rq_psn, path MTU,
//    retry count, RNR retry and ACK timeout from the REQ; the active side
//    takes dest QPN, rq_psn and RNR retry from the REP.  Each side's
//    max_rd_atomic is its initiator depth capped by the other's responder
//    resources (the two are swapped between peers).
//  - Retransmissions reuse the transaction ID and comm IDs; the receiver
//    answers duplicates: REQ in MRA-sent → MRA again, REQ in timewait →
//    REJ stale, REP when established → RTU again, DREQ in timewait → DREP
//    again, DREQ for nobody → DREP anyway.
//  - A REQ whose (CA GUID, QPN) is still connected or in timewait here is
//    stale: REJ "stale connection", and the old connection gets a DREQ.
#include "cm/manager.hpp"

#include "verbs/objects.hpp"

#include <averbs/error.hpp>

#include <algorithm>
#include <cstring>
#include <utility>

namespace averbs::cm::detail {

namespace wcm = averbs::wire::cm;
using averbs::detail::context_add_ref;
using averbs::detail::context_release;

namespace {

std::error_code err(errc e) { return make_error_code(e); }

wcm::gid_bytes to_wire(const gid& g) {
  wcm::gid_bytes b;
  std::memcpy(b.data(), g.raw.data(), 16);
  return b;
}
gid from_wire(const wcm::gid_bytes& b) {
  gid g;
  std::memcpy(g.raw.data(), b.data(), 16);
  return g;
}

template <std::size_t N>
std::vector<std::byte> bytes_of(const std::array<std::byte, N>& a, std::size_t from = 0) {
  return std::vector<std::byte>(a.begin() + static_cast<std::ptrdiff_t>(from), a.end());
}

/// What a REJ means to the application.
std::error_code rej_error(std::uint16_t reason) {
  switch (static_cast<wcm::rej_reason>(reason)) {
    case wcm::rej_reason::invalid_service_id: return err(errc::connection_refused);
    case wcm::rej_reason::timeout: return err(errc::timed_out);
    default: return err(errc::connection_rejected);
  }
}

bool params_valid(const conn_params& p) {
  return p.retry_count <= 7 && p.rnr_retry_count <= 7 && p.min_rnr_timer <= 31 && p.ack_timeout <= 31 &&
         p.cm_response_timeout <= 31 && p.max_cm_retries <= 15 && p.responder_resources <= 128 &&
         p.initiator_depth <= 128;
}

// Until the peer answers, a passive REQ waits this long for the
// application before we send MRA (half of what the peer allows us).
constexpr std::uint8_t mra_service_timeout = 20;  // 4.3 s per MRA
// The most a peer's timeout field may make us wait, per step: about 69 s.
// (The five-bit field allows 2.4 hours: a REQ that said so would hold a
// backlog place for days, an MRA would hold a connect for hours.)
constexpr std::uint8_t max_peer_timeout = 24;
// And the least, 1 ms (as ib_cm's cm_convert_to_ms() rounds up to): a REQ
// saying 0 would otherwise have its REP sent 16 times within 64 µs.
constexpr std::uint8_t min_peer_timeout = 8;
std::uint8_t peer_timeout(std::uint8_t t) { return std::clamp(t, min_peer_timeout, max_peer_timeout); }

}  // namespace

// ---------------------------------------------------------------------------
// Construction

manager::manager(soft::device& d) : dev_(d), rng_(std::random_device{}()) {
  tid_hi_ = static_cast<std::uint32_t>(rng_());
  next_id_ = static_cast<std::uint32_t>(rng_());
  next_port_ = static_cast<std::uint16_t>(32768 + rng_() % 28000);
}

manager::~manager() {
  for (auto& [id, c] : conns_) {
    if (c->op) complete(c->op, err(errc::operation_aborted));
    if (c->notify) complete(c->notify, err(errc::operation_aborted));
    if (c->qp != nullptr) c->qp->cm = nullptr;
  }
  for (auto& l : listeners_)
    for (auto& g : l->gets) complete(g.w, err(errc::operation_aborted));
}

manager& manager_of(soft::device& d) noexcept { return static_cast<manager&>(d.gsi()); }

}  // namespace averbs::cm::detail

namespace averbs::soft {
std::unique_ptr<gsi_agent> make_cm_agent(device& d) { return std::make_unique<cm::detail::manager>(d); }
}  // namespace averbs::soft

namespace averbs::cm::detail {

// ---------------------------------------------------------------------------
// Bookkeeping

conn* manager::find(std::uint32_t local_id) noexcept {
  auto it = conns_.find(local_id);
  return it != conns_.end() ? it->second.get() : nullptr;
}

std::uint32_t manager::new_local_id() noexcept {
  // Sequential from a random start (as ib_cm's xarray cyclic allocation),
  // never 0, never a live one.
  for (;;) {
    const std::uint32_t id = ++next_id_;
    if (id != 0 && conns_.find(id) == conns_.end()) return id;
  }
}

std::uint64_t manager::new_tid() noexcept { return (std::uint64_t{tid_hi_} << 32) | ++tid_seq_; }

conn* manager::queue_request(listen_t& l, const key& remote) noexcept {
  conn* cp = nullptr;
  bool owned = false;  // conns_ holds it (until then, an exception frees it)
  try {
    auto up = std::make_unique<conn>();
    cp = up.get();
    cp->local_id = new_local_id();
    conns_.emplace(cp->local_id, std::move(up));
    owned = true;
    by_remote_[remote] = cp;
    cp->remote_indexed = true;
    l.queue.push_back(cp);
    return cp;
  } catch (...) {
    // (An emplace that threw freed the connection: cp must not be read.)
    if (owned) {
      if (cp->remote_indexed) by_remote_.erase(remote);
      conns_.erase(cp->local_id);
    }
    return nullptr;
  }
}

std::uint16_t manager::ephemeral_port() noexcept {
  if (++next_port_ < 32768 || next_port_ > 60999) next_port_ = 32768;
  return next_port_;
}

conn* manager::create() noexcept {
  try {
    auto c = std::make_unique<conn>();
    c->local_id = new_local_id();
    c->has_handle = true;
    conn* p = c.get();
    conns_.emplace(p->local_id, std::move(c));
    return p;
  } catch (...) {
    return nullptr;
  }
}

bool manager::complete(waiter& w, const std::error_code& ec, void* result) noexcept {
  if (!w) return false;
  const bool taken = averbs::detail::complete_request(*w.ctx, w.id, ec, result);
  context_release(*w.ctx);
  w = {};
  dev_.yield_pass();  // the waiter may be the thread running this pass
  return taken;
}

void manager::index_qpn(conn& c) noexcept {
  if (c.qpn_indexed || c.type == qp_type::ud) return;
  try {
    by_qpn_[qpn_key(c)] = &c;
    c.qpn_indexed = true;
  } catch (...) {
  }
}

void manager::attach(conn& c, soft::qp_t* qp) noexcept {
  c.qp = qp;
  c.qpn = qp->qpn;
  c.type = qp->type;
  qp->cm = &c;
}

void manager::detach(conn& c) noexcept {
  if (c.qp != nullptr && c.qp->cm == &c) c.qp->cm = nullptr;
  c.qp = nullptr;
}

void manager::erase(conn& c) noexcept {
  disarm(c);
  detach(c);
  if (c.op) complete(c.op, err(errc::operation_aborted));
  if (c.notify) complete(c.notify, err(errc::operation_aborted));
  if (c.qpn_indexed) {
    auto it = by_qpn_.find(qpn_key(c));
    if (it != by_qpn_.end() && it->second == &c) by_qpn_.erase(it);
  }
  unindex_remote(c);
  if (c.listener != nullptr) std::erase(c.listener->queue, &c);
  conns_.erase(c.local_id);  // frees c
}

void manager::unindex_remote(conn& c) noexcept {
  if (!c.remote_indexed) return;
  auto it = by_remote_.find(remote_key(c));
  if (it != by_remote_.end() && it->second == &c) by_remote_.erase(it);
  c.remote_indexed = false;
}

void manager::close_conn(conn& c) noexcept {
  disarm(c);
  // A closed connection is no one's: a REQ the peer resends is a new
  // request (ib_cm's cm_reset_to_idle()), not a duplicate to swallow.
  unindex_remote(c);
  // (A passive UD connection stays the application's when we stop
  // answering duplicates of its SIDR_REQ: it ends with disconnect().)
  if (!c.ended && c.notify && !c.ud_bound)
    complete(c.notify, err(c.was_connected ? errc::connection_reset : errc::not_connected));
  c.st = state::closed;
  c.mad.reset();
  if (c.qpn_indexed) {
    auto it = by_qpn_.find(qpn_key(c));
    if (it != by_qpn_.end() && it->second == &c) by_qpn_.erase(it);
    c.qpn_indexed = false;
  }
  detach(c);
  if (!c.has_handle) erase(c);
}

void manager::fail_op(conn& c, const std::error_code& ec) noexcept { complete(c.op, ec); }

// The caller cancelled the connect or accept under way (the request
// completed with operation_aborted without us).  The handshake stops at
// its next step: a REP or RTU must not bring up a connection nobody waits
// for.
bool manager::op_cancelled(const conn& c) noexcept {
  return c.op && !averbs::detail::request_pending(*c.op.ctx, c.op.id);
}

void manager::end_connection(conn& c, const std::error_code& why) noexcept {
  if (c.ended) return;
  c.ended = true;
  c.end = why;
  complete(c.notify, why);
}

std::chrono::nanoseconds manager::timewait_time(const conn& c) const noexcept {
  // IBTA 12.9.8: long enough for packets of the old connection to die out:
  // the ACK timeout its QP ran with (on the passive side, the one the REQ
  // asked for, capped as every peer timeout), and never under a millisecond.
  const std::uint8_t t = c.passive ? peer_timeout(c.peer_ack_timeout) : c.params.ack_timeout;
  return std::max<std::chrono::nanoseconds>(wcm::cm_timeout(t), std::chrono::milliseconds(1));
}

void manager::enter_timewait(conn& c) noexcept {
  c.st = state::timewait;
  c.mad.reset();
  detach(c);
  arm(c, timewait_time(c));
}

void manager::end_stale(conn& old) noexcept {
  if (old.st != state::established) return;  // ending already, or in timewait
  qp_to_error(old);
  end_connection(old, err(errc::connection_reset));
  send_dreq(old);
  old.st = state::dreq_sent;
  old.retries_left = old.params.max_cm_retries;
  detach(old);  // the QP is the application's again, as after disconnect()
  arm(old, wcm::cm_timeout(old.params.cm_response_timeout));
}

// ---------------------------------------------------------------------------
// Timers

void manager::arm(conn& c, std::chrono::nanoseconds after) noexcept {
  disarm(c);
  const auto when = soft::deadline_after(dev_.clock().now(), after);
  if (dev_.schedule_timer(when, &manager::timer_thunk, this, {c.local_id, c.timer_gen, {}},
                          &manager::timer_alive))
    return;
  // No memory for the heap entry.  Dropped, it would leave the connection
  // in its state for good (a REQ never resent or given up, a timewait that
  // never ends): recover() tries again at the next pass.  One per
  // connection: a connection has one live timer, and a later one
  // replaces an earlier (disarm() makes the lost one stale).
  if (!c.timer_lost) ++lost_timers_;
  c.timer_lost = true;
  c.lost_gen = c.timer_gen;
  c.lost_when = when;
  dev_.recover_agent_later();
}

// The timers arm() had no memory for are queued now; one there is still no
// memory for fires at once, early (its step is a resend that counts against
// the retries, the end of a timewait, an MRA or the backlog's giving up),
// so that every connection still moves towards its end.
void manager::recover() noexcept {
  if (lost_timers_ == 0) return;
  lost_timers_ = 0;
  for (auto it = conns_.begin(); it != conns_.end();) {
    conn& c = *it->second;
    ++it;  // on_timer() may erase c (and nothing else)
    if (!std::exchange(c.timer_lost, false) || c.lost_gen != c.timer_gen) continue;
    if (!dev_.schedule_timer(c.lost_when, &manager::timer_thunk, this, {c.local_id, c.timer_gen, {}},
                             &manager::timer_alive))
      on_timer(c.local_id, c.timer_gen);
  }
}

void manager::disarm(conn& c) noexcept {
  ++c.timer_gen;
  dev_.timer_cancelled();  // (counted whether one was queued or not: a sweep only looks)
}

bool manager::timer_alive(void* arg, const averbs::detail::timer_payload& p) noexcept {
  const conn* c = static_cast<manager*>(arg)->find(static_cast<std::uint32_t>(p.a));
  return c != nullptr && c->timer_gen == p.b;
}

void manager::timer_thunk(void* arg, const averbs::detail::timer_payload& p) noexcept {
  static_cast<manager*>(arg)->on_timer(static_cast<std::uint32_t>(p.a), p.b);
}

// A connect or accept whose request was cancelled ends at its next step:
// its timer, or the next operation that meets it (a new connect with its
// QP or connector, a disconnect), whichever comes first.  Its QP stays as
// the handshake left it (INIT for a connect; ERR for an accept, whose REP
// the peer may have taken), and is free again.  True if it ended here.
bool manager::finish_if_cancelled(conn& c) noexcept {
  if ((c.st != state::req_sent && c.st != state::sidr_sent && c.st != state::rep_sent) || !op_cancelled(c))
    return false;
  if (c.st == state::rep_sent) qp_to_error(c);
  if (c.st != state::sidr_sent)  // SIDR has no REJ
    send_rej(c, c.st == state::req_sent ? wcm::msg_ref::req : wcm::msg_ref::rep,
             c.st == state::req_sent ? wcm::rej_reason::timeout : wcm::rej_reason::consumer_defined);
  fail_op(c, err(errc::operation_aborted));
  close_conn(c);
  return true;
}

void manager::on_timer(std::uint32_t id, std::uint64_t gen) noexcept {
  conn* cp = find(id);
  if (cp == nullptr || cp->timer_gen != gen || fatal_) return;
  conn& c = *cp;
  switch (c.st) {
    case state::req_sent:
    case state::sidr_sent:
    case state::rep_sent:
    case state::dreq_sent:
      if (finish_if_cancelled(c)) return;  // abandoned by its caller: no more resends
      if (c.retries_left > 0) {
        --c.retries_left;
        ++stats_.retransmits;
        resend(c);
        const std::uint8_t t = c.st == state::rep_sent ? c.peer_rep_timeout : c.params.cm_response_timeout;
        arm(c, wcm::cm_timeout(t));
        return;
      }
      // Out of retries.
      if (c.st == state::req_sent) {
        send_rej(c, wcm::msg_ref::req, wcm::rej_reason::timeout);
        fail_op(c, err(errc::timed_out));
        close_conn(c);
      } else if (c.st == state::sidr_sent) {
        fail_op(c, err(errc::timed_out));
        close_conn(c);
      } else if (c.st == state::rep_sent) {
        send_rej(c, wcm::msg_ref::rep, wcm::rej_reason::timeout);
        qp_to_error(c);
        fail_op(c, err(errc::timed_out));
        close_conn(c);
      } else {
        enter_timewait(c);  // the peer never answered our DREQ: it is gone
      }
      return;
    case state::req_rcvd:
      if (!c.mra_sent) {
        // The application has not answered in half the time the peer
        // allows: ask for more (rdma_cm does so for every slow accept).
        send_mra(c);
        // If nobody takes the request, forget it once the peer must have
        // given up.
        if (c.listener != nullptr)
          arm(c, (wcm::cm_timeout(mra_service_timeout) + wcm::cm_timeout(c.peer_cm_timeout)) *
                     (c.peer_max_retries + 1));
      } else if (c.listener != nullptr) {
        erase(c);
      }
      return;
    case state::sidr_rcvd:
      // Nobody took the SIDR request (on_sidr_req's timer): its requester
      // gave up long ago; it leaves the backlog, as an untaken REQ does.
      if (c.listener != nullptr) erase(c);
      return;
    case state::timewait:
      close_conn(c);
      return;
    default:
      return;
  }
}

// ---------------------------------------------------------------------------
// Sending

template <class Msg>
void manager::send_to(const gid& src, const gid& dst, std::uint8_t hop_limit, std::uint64_t tid,
                      const Msg& msg) noexcept {
  if (fatal_) return;
  std::array<std::byte, wcm::mad_size> mad;
  wcm::mad_header h;
  h.tid = tid;
  wcm::encode(h, msg, std::span<std::byte, wcm::mad_size>(mad));
  ++stats_.mads_sent;
  dev_.send_mad(src, dst, wcm::gsi_qpn, mad, hop_limit, 0);
}

template <class Msg>
void manager::send(conn& c, std::uint64_t tid, const Msg& msg, bool keep) noexcept {
  if (fatal_) return;
  std::array<std::byte, wcm::mad_size> mad;
  wcm::mad_header h;
  h.tid = tid;
  wcm::encode(h, msg, std::span<std::byte, wcm::mad_size>(mad));
  if (keep) {
    try {
      if (c.mad == nullptr) c.mad = std::make_unique<std::array<std::byte, wcm::mad_size>>();
      *c.mad = mad;
    } catch (...) {
      // Without room to keep it, the message is sent once (the peer's
      // retransmissions still recover a loss).
    }
  }
  ++stats_.mads_sent;
  dev_.send_mad(c.local.ip, c.peer_gid, wcm::gsi_qpn, mad, c.hop_limit, c.traffic_class);
}

void manager::resend(conn& c) noexcept {
  if (c.mad == nullptr || fatal_) return;
  ++stats_.mads_sent;
  dev_.send_mad(c.local.ip, c.peer_gid, wcm::gsi_qpn, *c.mad, c.hop_limit, c.traffic_class);
}

void manager::send_rej(conn& c, wcm::msg_ref what, wcm::rej_reason why, std::span<const std::byte> pdata) noexcept {
  wcm::rej r;
  r.local_comm_id = c.local_id;
  r.remote_comm_id = c.remote_id;
  r.message_rejected = what;
  r.reason = static_cast<std::uint16_t>(why);
  if (why == wcm::rej_reason::timeout) {
    // IBTA 12.6.7: a timeout REJ carries our CA GUID in the ARI, which is
    // how a peer that never learned our comm ID finds the request.
    const std::uint64_t g = dev_.node_guid();
    for (int i = 0; i < 8; ++i) r.ari[i] = static_cast<std::byte>(g >> (56 - 8 * i));
    r.reject_info_length = 8;
  }
  std::copy_n(pdata.begin(), std::min(pdata.size(), r.private_data.size()), r.private_data.begin());
  send(c, c.tid, r, false);
}

void manager::send_rtu(conn& c) noexcept {
  wcm::rtu r;
  r.local_comm_id = c.local_id;
  r.remote_comm_id = c.remote_id;
  send(c, c.tid, r, false);
}

void manager::send_mra(conn& c) noexcept {
  wcm::mra r;
  r.local_comm_id = c.local_id;
  r.remote_comm_id = c.remote_id;
  r.message_mraed = wcm::msg_ref::req;
  r.service_timeout = mra_service_timeout;
  c.mra_sent = true;
  send(c, c.tid, r, false);
}

void manager::send_dreq(conn& c) noexcept {
  wcm::dreq r;
  r.local_comm_id = c.local_id;
  r.remote_comm_id = c.remote_id;
  r.remote_qpn = c.remote_qpn;
  c.dreq_tid = new_tid();
  send(c, c.dreq_tid, r, true);
}

void manager::send_drep(conn& c) noexcept {
  wcm::drep r;
  r.local_comm_id = c.local_id;
  r.remote_comm_id = c.remote_id;
  send(c, c.dreq_tid, r, false);
}

void manager::send_sidr_rep(conn& c, wcm::sidr_status s, std::span<const std::byte> pdata) noexcept {
  wcm::sidr_rep r;
  r.request_id = c.remote_id;
  r.status = s;
  r.service_id = wcm::service_id(wcm::port_space::udp, c.local.port);
  if (s == wcm::sidr_status::ok && c.qp != nullptr) {
    r.qpn = c.qp->qpn;
    r.qkey = c.qp->qkey;
  }
  std::copy_n(pdata.begin(), std::min(pdata.size(), r.private_data.size()), r.private_data.begin());
  send(c, c.tid, r, true);  // kept: a duplicate SIDR_REQ gets it again
}

// ---------------------------------------------------------------------------
// QP transitions

std::error_code manager::qp_to_init(conn& c, soft::qp_t* qp, const conn_params& p) noexcept {
  if (qp->state == qp_state::init) return {};
  if (qp->type == qp_type::ud && (qp->state == qp_state::rtr || qp->state == qp_state::rts)) return {};
  if (qp->state != qp_state::reset) return err(errc::invalid_state);
  qp_attr a;
  a.state = qp_state::init;
  a.pkey_index = 0;
  a.port_num = 1;
  std::uint32_t mask = qp_attr_state | qp_attr_pkey_index | qp_attr_port;
  if (qp->type == qp_type::ud) {
    a.qkey = p.qkey;
    mask |= qp_attr_qkey;
  } else {
    a.qp_access_flags = access_local_write | access_remote_write;
    if (qp->type == qp_type::rc && p.responder_resources > 0)
      a.qp_access_flags |= access_remote_read | access_remote_atomic;
    mask |= qp_attr_access_flags;
  }
  changing_qp_ = true;
  const std::error_code ec = dev_.modify_qp_locked(qp, a, mask);
  changing_qp_ = false;
  (void)c;
  return ec;
}

// INIT → RTR → RTS with what both sides agreed.  The RTR half uses the
// conn's remote QPN and PSN, path and this side's responder resources.
std::error_code manager::qp_to_rts(conn& c, std::uint8_t rnr_retry, std::uint8_t max_rd_atomic,
                                   std::uint8_t timeout, std::uint8_t retry) noexcept {
  soft::qp_t* qp = c.qp;
  if (qp == nullptr) return err(errc::operation_aborted);
  changing_qp_ = true;
  std::error_code ec;
  if (qp->type == qp_type::ud) {
    if (qp->state == qp_state::init) {
      qp_attr a;
      a.state = qp_state::rtr;
      ec = dev_.modify_qp_locked(qp, a, qp_attr_state);
    }
    if (!ec && qp->state == qp_state::rtr) {
      qp_attr a;
      a.state = qp_state::rts;
      a.sq_psn = c.local_psn;
      ec = dev_.modify_qp_locked(qp, a, qp_attr_state | qp_attr_sq_psn);
    }
    changing_qp_ = false;
    return ec;
  }
  qp_attr a;
  a.state = qp_state::rtr;
  a.ah.is_global = true;
  a.ah.port_num = 1;
  a.ah.grh.dgid = c.peer_gid;
  a.ah.grh.sgid_index = static_cast<std::uint8_t>(c.gid_index);
  a.ah.grh.hop_limit = c.hop_limit;
  a.ah.grh.traffic_class = c.traffic_class;
  a.path_mtu = c.path_mtu;
  a.dest_qp_num = c.remote_qpn;
  a.rq_psn = c.remote_psn;
  std::uint32_t mask = qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn;
  if (qp->type == qp_type::rc) {
    a.max_dest_rd_atomic = c.params.responder_resources;
    a.min_rnr_timer = c.params.min_rnr_timer;
    mask |= qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer;
  }
  ec = dev_.modify_qp_locked(qp, a, mask);
  if (!ec) {
    qp_attr b;
    b.state = qp_state::rts;
    b.sq_psn = c.local_psn;
    mask = qp_attr_state | qp_attr_sq_psn;
    if (qp->type == qp_type::rc) {
      b.timeout = timeout;
      b.retry_cnt = retry;
      b.rnr_retry = rnr_retry;
      b.max_rd_atomic = max_rd_atomic;
      mask |= qp_attr_timeout | qp_attr_retry_cnt | qp_attr_rnr_retry | qp_attr_max_qp_rd_atomic;
    }
    ec = dev_.modify_qp_locked(qp, b, mask);
  }
  changing_qp_ = false;
  return ec;
}

void manager::qp_to_error(conn& c) noexcept {
  if (c.qp == nullptr || c.qp->state == qp_state::err || c.qp->state == qp_state::reset) return;
  qp_attr a;
  a.state = qp_state::err;
  changing_qp_ = true;
  dev_.modify_qp_locked(c.qp, a, qp_attr_state);
  changing_qp_ = false;
}

// ---------------------------------------------------------------------------
// Engine notifications

void manager::on_qp(soft::qp_t* qp, soft::qp_note n) noexcept {
  conn* cp = static_cast<conn*>(qp->cm);
  if (cp == nullptr) return;
  conn& c = *cp;
  if (n == soft::qp_note::error) {
    if (changing_qp_) return;
    // The QP failed under an open connection (retries exhausted: the peer
    // vanished), or the application moved it to error.
    if (c.st == state::established || c.st == state::rep_sent) end_connection(c, err(errc::connection_reset));
    return;
  }
  // Destroyed while the CM drives it.
  detach(c);
  switch (c.st) {
    case state::req_sent:
      send_rej(c, wcm::msg_ref::req, wcm::rej_reason::timeout);
      fail_op(c, err(errc::operation_aborted));
      close_conn(c);
      break;
    case state::sidr_sent:
      fail_op(c, err(errc::operation_aborted));
      close_conn(c);
      break;
    case state::rep_sent:
      send_rej(c, wcm::msg_ref::rep, wcm::rej_reason::consumer_defined);
      fail_op(c, err(errc::operation_aborted));
      end_connection(c, err(errc::operation_aborted));
      close_conn(c);
      break;
    case state::established:
      if (c.type == qp_type::ud) {
        close_conn(c);
        break;
      }
      end_connection(c, err(errc::operation_aborted));
      send_dreq(c);
      c.st = state::dreq_sent;
      c.retries_left = c.params.max_cm_retries;
      arm(c, wcm::cm_timeout(c.params.cm_response_timeout));
      break;
    default:
      break;
  }
}

void manager::on_fatal() noexcept {
  fatal_ = true;
  // Every connection ends with the device: its requests with
  // device_removed, and it reads closed (not connecting or established
  // for ever); those no connector holds are freed now (their timers never
  // run again).  close_conn() erases only the one at hand.
  for (auto it = conns_.begin(); it != conns_.end();) {
    conn& c = *(it++)->second;
    complete(c.op, err(errc::device_removed));
    complete(c.notify, err(errc::device_removed));
    c.ended = true;
    c.ud_bound = false;
    close_conn(c);
  }
  for (auto& l : listeners_) {
    for (auto& g : l->gets) {
      complete(g.w, err(errc::device_removed));
      dev_.release_later(std::move(g.spare));
    }
    l->gets.clear();
  }
}

// ---------------------------------------------------------------------------
// Receiving

template <class Msg>
bool manager::decoded(const soft::mad_in& m, Msg& out) noexcept {
  if (wcm::decode(m.mad, out) == wcm::mad_error::ok) return true;
  ++stats_.mads_dropped;
  return false;
}

void manager::on_mad(const soft::mad_in& m) noexcept {
  if (fatal_) return;
  ++stats_.mads_received;
  wcm::mad_header h;
  if (wcm::decode_header(m.mad, h) != wcm::mad_error::ok || m.src_qpn != wcm::gsi_qpn) {
    ++stats_.mads_dropped;
    return;
  }
  switch (h.attr_id) {
    case wcm::attr::req: on_req(m, h); break;
    case wcm::attr::rep: on_rep(m, h); break;
    case wcm::attr::rtu: on_rtu(m); break;
    case wcm::attr::rej: on_rej(m); break;
    case wcm::attr::mra: on_mra(m); break;
    case wcm::attr::dreq: on_dreq(m, h); break;
    case wcm::attr::drep: on_drep(m); break;
    case wcm::attr::sidr_req: on_sidr_req(m, h); break;
    case wcm::attr::sidr_rep: on_sidr_rep(m); break;
    default: ++stats_.mads_dropped; break;  // LAP/APR: no path migration on RoCE
  }
}

listen_t* manager::find_listener(port_space ps, const gid& ip, std::uint16_t port) noexcept {
  // A request's header names the address it is for: one of this device's,
  // as rdma_cm's validate_net_dev() requires.  A listener bound to another
  // address, or a wildcard, never takes a request not sent to the device.
  std::uint32_t index = 0;
  if (!dev_.find_gid(ip, index)) return nullptr;
  listen_t* wildcard = nullptr;
  for (auto& l : listeners_) {
    if (l->ps != ps || l->at.port != port) continue;
    if (l->at.ip == ip) return l.get();
    // The wildcard of a family takes that family's addresses.
    if (l->at.is_any() && l->at.is_ipv4() == ip.is_ipv4_mapped()) wildcard = l.get();
    if (l->at.is_any() && !l->at.is_ipv4() && wildcard == nullptr) wildcard = l.get();  // "::" takes both
  }
  return wildcard;
}

void manager::on_req(const soft::mad_in& m, const wcm::mad_header& h) noexcept {
  wcm::req r;
  if (!decoded(m, r)) return;
  // An answer for a REQ we will not take: REJ to whoever sent it.
  auto refuse = [&](wcm::rej_reason why, const gid* ari = nullptr) {
    wcm::rej j;
    j.remote_comm_id = r.local_comm_id;
    j.message_rejected = wcm::msg_ref::req;
    j.reason = static_cast<std::uint16_t>(why);
    if (ari != nullptr) {
      std::memcpy(j.ari.data(), ari->raw.data(), 16);
      j.reject_info_length = 16;
    }
    send_to(m.dst, m.src, dev_.route_hop_limit(m.src), h.tid, j);
  };

  // A retransmission of a REQ we hold.
  if (auto it = by_remote_.find({r.local_ca_guid, r.local_comm_id, 0, false, m.src});
      it != by_remote_.end()) {
    conn& c = *it->second;
    ++stats_.duplicates;
    if (c.st == state::req_rcvd && c.mra_sent) send_mra(c);
    else if (c.st == state::rep_sent) {
      if (!finish_if_cancelled(c)) resend(c);  // our REP was lost (a cancelled accept ends instead)
    } else if (c.st == state::timewait) {
      send_rej(c, wcm::msg_ref::req, wcm::rej_reason::stale_conn);
    }
    return;  // (`c` may be gone: finish_if_cancelled() closes it)
  }
  wcm::port_space wps;
  std::uint16_t port;
  wcm::ip_header ip;
  if (!wcm::parse_service_id(r.service_id, wps, port) || wps != wcm::port_space::tcp) {
    refuse(wcm::rej_reason::invalid_service_id);
    return;
  }
  if (!wcm::decode(std::span<const std::byte>(r.private_data), ip)) {
    refuse(wcm::rej_reason::consumer_defined);  // what rdma_cm answers a bad IP header
    return;
  }
  if (r.transport_type != 0 && r.transport_type != 1) {
    refuse(wcm::rej_reason::invalid_transport_type);
    return;
  }
  // The REQ must name our port's GID, the one it was sent to ...
  if (!(from_wire(r.primary.remote_gid) == m.dst)) {
    refuse(wcm::rej_reason::invalid_gid, &m.dst);
    return;
  }
  // ... and come from the address it names as the requester's, in its
  // path (0: not given) and in the rdma_cm header: our MRA, REP and their
  // resends go to the path's, and the application is told the header's.
  // A REQ naming another would send those, for anyone who can forge a
  // source, to an address of its choosing (ib_cm answers where a REQ came
  // from; rdma_cm refuses what its route check does not find, as
  // consumer-defined).
  if (const gid named = from_wire(r.primary.local_gid);
      (!named.is_zero() && !(named == m.src)) || !(from_wire(ip.src_ip) == m.src)) {
    refuse(wcm::rej_reason::consumer_defined);
    return;
  }
  // A partition the port is not in: every packet of the connection would
  // be dropped as a P_Key violation (ib_cm: REJ "invalid GID" when the
  // path's P_Key is not in the port's table).
  if ((r.pkey & 0x7FFF) != (wire::default_pkey & 0x7FFF)) {
    refuse(wcm::rej_reason::invalid_gid, &m.dst);
    return;
  }
  if (r.path_mtu < 1 || r.path_mtu > static_cast<std::uint8_t>(dev_.active_mtu())) {
    refuse(wcm::rej_reason::invalid_mtu);
    return;
  }
  // (After the checks above: a REQ refused for its own fields touches no
  // earlier request or connection.)
  // Stale: that QP of that CA, at this address, is still connected, in
  // timewait, or waiting for accept under another comm ID here.  (The
  // same identifiers from another address are another requester's: the
  // CA GUID and QP number are on the wire, and anyone could name them, so
  // they neither touch this connection nor are refused for it.)  A
  // request still waiting for accept is replaced (the requester gave up on
  // it, a cancel or its retries out, and its REJ was lost; ib_cm would
  // refuse the new one until the old one timed out, minutes); a connected
  // one ends.
  if (auto it = by_qpn_.find({r.local_ca_guid, r.local_qpn, 0, false, m.src}); it != by_qpn_.end()) {
    conn& old = *it->second;
    if (old.passive && old.st == state::req_rcvd) {
      ++stats_.duplicates;
      close_conn(old);  // an accept of it fails; out of the index and the listener's queue
    } else {
      ++stats_.stale_rejects;
      refuse(wcm::rej_reason::stale_conn);
      end_stale(old);
      return;
    }
  }
  const gid dst_ip = from_wire(ip.dst_ip);
  listen_t* l = find_listener(port_space::tcp, dst_ip, port);
  if (l == nullptr || l->closed) {
    refuse(wcm::rej_reason::invalid_service_id);
    return;
  }
  if (l->queue.size() >= l->backlog) {
    ++stats_.backlog_drops;  // the requester resends; by then there may be room
    return;
  }
  std::uint32_t gid_index = 0;
  if (!dev_.find_gid(m.dst, gid_index)) {
    ++stats_.mads_dropped;
    return;
  }
  // Out of memory for the private data or the connection: as if lost, the
  // requester resends (a request without its private data would reach the
  // application as if the peer had sent none).
  std::vector<std::byte> pdata;
  try {
    pdata = bytes_of(r.private_data, wcm::ip_header_size);
  } catch (...) {
    return;
  }
  conn* cp = queue_request(*l, {r.local_ca_guid, r.local_comm_id, 0, false, m.src});
  if (cp == nullptr) return;
  conn& c = *cp;
  c.passive = true;
  c.st = state::req_rcvd;
  c.listener = l;
  c.remote_id = r.local_comm_id;
  c.remote_guid = r.local_ca_guid;
  c.tid = h.tid;
  c.type = r.transport_type == 1 ? qp_type::uc : qp_type::rc;
  c.remote_qpn = r.local_qpn;
  c.remote_psn = r.starting_psn;
  c.local = {m.dst, port};
  c.peer = {from_wire(ip.src_ip), ip.src_port};
  c.peer_gid = m.src;  // (what the path names, checked above)
  c.peer_addr = m.src;
  c.gid_index = gid_index;
  c.hop_limit = r.primary.hop_limit != 0 ? r.primary.hop_limit : 64;
  c.traffic_class = r.primary.traffic_class;
  c.path_mtu = static_cast<mtu>(r.path_mtu);
  c.peer_rr = r.responder_resources;
  c.peer_id = r.initiator_depth;
  c.peer_retry = r.retry_count;
  c.peer_rnr = r.rnr_retry_count;
  c.peer_ack_timeout = r.primary.local_ack_timeout;
  c.peer_cm_timeout = peer_timeout(r.remote_cm_response_timeout);
  c.peer_rep_timeout = peer_timeout(r.local_cm_response_timeout);
  c.peer_max_retries = r.max_cm_retries;
  c.pdata = std::move(pdata);
  // The peer's QP is this request's from now on (ib_cm inserts the remote
  // QPN as the REQ arrives): a second REQ for it under another comm ID is
  // refused "stale connection" while this one is pending or connected.
  index_qpn(c);
  // Ask for more time if the application takes longer than half of what
  // the peer allows.
  arm(c, wcm::cm_timeout(c.peer_cm_timeout) / 2);
  deliver(*l);
}

void manager::on_rep(const soft::mad_in& m, const wcm::mad_header& h) noexcept {
  wcm::rep r;
  if (!decoded(m, r)) return;
  (void)h;
  conn* cp = find(r.remote_comm_id);
  // Only from the address the REQ went to: our comm IDs are sequential, and
  // a REP from elsewhere would point the QP, and peer_addr (which the stale
  // and REJ checks trust), at whoever guessed one.
  if (cp == nullptr || cp->passive || !(m.src == cp->peer_gid)) {
    ++stats_.mads_dropped;
    return;
  }
  conn& c = *cp;
  if (c.st == state::established && c.remote_id == r.local_comm_id) {
    ++stats_.duplicates;
    send_rtu(c);  // our RTU was lost
    return;
  }
  if (c.st != state::req_sent) {
    ++stats_.mads_dropped;
    return;
  }
  // Out of memory for the private data: as if lost (the REP is resent);
  // a connect without it would look as if the peer had sent none.
  std::vector<std::byte> pdata;
  try {
    pdata = bytes_of(r.private_data);
  } catch (...) {
    ++stats_.mads_dropped;
    return;
  }
  c.remote_id = r.local_comm_id;
  c.remote_guid = r.local_ca_guid;
  c.remote_qpn = r.local_qpn;
  c.remote_psn = r.starting_psn;
  c.peer_addr = m.src;
  c.pdata = std::move(pdata);
  if (op_cancelled(c)) {
    // The QP stays as it was (INIT), for another connect.
    send_rej(c, wcm::msg_ref::rep, wcm::rej_reason::consumer_defined);
    fail_op(c, err(errc::operation_aborted));
    close_conn(c);
    return;
  }
  if (auto it = by_qpn_.find(qpn_key(c)); it != by_qpn_.end() && it->second != &c) {
    // That peer QP is still connected to us under another connection.
    ++stats_.stale_rejects;
    send_rej(c, wcm::msg_ref::rep, wcm::rej_reason::stale_conn);
    c.rej_reason = static_cast<std::uint16_t>(wcm::rej_reason::stale_conn);
    fail_op(c, err(errc::connection_rejected));
    end_stale(*it->second);  // as for a REQ (the same peer: the key holds its address)
    close_conn(c);
    return;
  }
  const std::uint8_t max_rd = std::min(c.params.initiator_depth, r.responder_resources);
  if (auto ec = qp_to_rts(c, r.rnr_retry_count, max_rd, c.params.ack_timeout, c.params.retry_count)) {
    // As rdma_cm (cma_rep_recv): the QP goes to ERR and the peer hears
    // "consumer defined" (a kernel server reports REJECTED, not "no QP").
    qp_to_error(c);
    send_rej(c, wcm::msg_ref::rep, wcm::rej_reason::consumer_defined);
    fail_op(c, ec);
    close_conn(c);
    return;
  }
  send_rtu(c);
  c.st = state::established;
  c.was_connected = true;
  c.mad.reset();
  disarm(c);
  index_qpn(c);
  connect_result res;
  res.private_data = std::move(c.pdata);
  // The connector keeps a copy for private_data(); short of memory it has
  // none (the result has the data), where the copy used to throw out of
  // this noexcept path.
  try {
    c.pdata = res.private_data;
  } catch (...) {
  }
  res.responder_resources = r.responder_resources;
  res.initiator_depth = r.initiator_depth;
  res.remote_qpn = r.local_qpn;
  if (!complete(c.op, {}, &res)) {
    // Cancelled on another thread since op_cancelled() above: the peer
    // has our RTU, so it hears a DREQ, as a cancelled accept's peer does.
    (void)disconnect(&c);
  }
}

void manager::on_rtu(const soft::mad_in& m) noexcept {
  wcm::rtu r;
  if (!decoded(m, r)) return;
  conn* cp = find(r.remote_comm_id);
  if (cp == nullptr || cp->remote_id != r.local_comm_id || !from_peer(*cp, m)) {
    ++stats_.mads_dropped;
    return;
  }
  conn& c = *cp;
  if (c.st != state::rep_sent) {
    if (c.st == state::established) ++stats_.duplicates;
    return;
  }
  c.st = state::established;
  c.was_connected = true;
  c.mad.reset();
  disarm(c);
  if (op_cancelled(c)) {
    // The peer is connected now: it hears a DREQ, as after a disconnect
    // (a REJ, which disconnect() sends before the RTU, would reach an
    // established requester as a reset).
    fail_op(c, err(errc::operation_aborted));
    (void)disconnect(&c);
    return;
  }
  if (!complete(c.op, {})) (void)disconnect(&c);  // cancelled on another thread meanwhile
}

void manager::on_rej(const soft::mad_in& m) noexcept {
  wcm::rej r;
  if (!decoded(m, r)) return;
  conn* cp = find(r.remote_comm_id);
  if (r.remote_comm_id == 0 && r.reason == static_cast<std::uint16_t>(wcm::rej_reason::timeout) &&
      r.reject_info_length >= 8) {
    // A requester giving up before it learned our comm ID: found by its
    // CA GUID (in the ARI) and its comm ID.
    std::uint64_t g = 0;
    for (int i = 0; i < 8; ++i) g = g << 8 | std::to_integer<std::uint64_t>(r.ari[i]);
    auto it = by_remote_.find({g, r.local_comm_id, 0, false, m.src});
    cp = it != by_remote_.end() ? it->second : nullptr;
    // Only a connection the requester can still be waiting on: one it has
    // not learned our comm ID for (REQ received, REP sent) -- and only
    // from its address (the key holds it).  Its CA GUID and comm ID are in
    // every REQ it sends anywhere; without this anyone who saw one could
    // end the connection it made here (ib_cm's cm_acquire_rejected_id() is
    // as weak).
    if (cp != nullptr && cp->st != state::req_rcvd && cp->st != state::rep_sent) cp = nullptr;
  }
  // Only from the connection's peer, as every answer (docs/cm.md): our
  // comm IDs are sequential, and before the REP a REJ names nothing else.
  if (cp == nullptr || !from_peer(*cp, m)) {
    ++stats_.mads_dropped;
    return;
  }
  conn& c = *cp;
  // Before the REP a REJ cannot name the peer's comm ID; after it (and on
  // the passive side, which has the requester's from its REQ) it must, as
  // ib_cm's cm_acquire_rejected_id() requires: a guessed comm ID alone does
  // not end an accept.
  if (c.remote_id != 0 && r.local_comm_id != c.remote_id) {
    ++stats_.mads_dropped;
    return;
  }
  auto take = [&] {
    c.rej_reason = r.reason;
    try {
      c.pdata = bytes_of(r.private_data);
    } catch (...) {
    }
  };
  switch (c.st) {
    case state::req_sent:
      take();
      fail_op(c, rej_error(r.reason));
      close_conn(c);
      return;
    case state::rep_sent:
      take();
      qp_to_error(c);
      fail_op(c, rej_error(r.reason));
      end_connection(c, err(errc::connection_reset));
      close_conn(c);
      return;
    case state::req_rcvd:
      // The requester gave up before we answered.
      take();
      if (c.listener != nullptr) erase(c);
      else close_conn(c);
      return;
    case state::established:
      // The responder gave the connection up after our RTU was lost (its
      // REP retries ran out, or it was destroyed in REP_SENT): it ends
      // here too, as a DREQ would end it (ib_cm's cm_rej_handler enters
      // timewait from ESTABLISHED).
      if (c.type == qp_type::ud || r.local_comm_id != c.remote_id) break;
      take();
      qp_to_error(c);
      end_connection(c, err(errc::connection_reset));
      enter_timewait(c);
      return;
    case state::dreq_sent:
      // Ended already; the peer will not answer our DREQ.
      if (r.local_comm_id != c.remote_id) break;
      take();
      enter_timewait(c);
      return;
    default:
      break;
  }
  ++stats_.mads_dropped;
}

void manager::on_mra(const soft::mad_in& m) noexcept {
  wcm::mra r;
  if (!decoded(m, r)) return;
  conn* cp = find(r.remote_comm_id);
  if (cp == nullptr || !from_peer(*cp, m)) {
    ++stats_.mads_dropped;
    return;
  }
  conn& c = *cp;
  // An MRA for our REP also names the peer's comm ID (ib_cm's
  // cm_acquire_mraed_id): one who guessed ours alone cannot stall the REP.
  const bool for_req = c.st == state::req_sent && r.message_mraed == wcm::msg_ref::req;
  const bool for_rep =
      c.st == state::rep_sent && r.message_mraed == wcm::msg_ref::rep && r.local_comm_id == c.remote_id;
  if (!for_req && !for_rep) {
    ++stats_.mads_dropped;
    return;
  }
  if (c.mra_rcvd) {
    // One MRA stretches the wait once, as in Linux's ib_cm; a peer
    // repeating it would otherwise hold the connect open forever.
    ++stats_.duplicates;
    return;
  }
  // The peer is alive but slow: wait its service time before resending.
  c.mra_rcvd = true;
  const std::uint8_t t = for_rep ? c.peer_rep_timeout : c.params.cm_response_timeout;
  arm(c, wcm::cm_timeout(peer_timeout(r.service_timeout)) + wcm::cm_timeout(t));
}

void manager::on_dreq(const soft::mad_in& m, const wcm::mad_header& h) noexcept {
  wcm::dreq r;
  if (!decoded(m, r)) return;
  conn* cp = find(r.remote_comm_id);
  // For no connection we know: answer anyway, so the peer can finish
  // (ib_cm does the same).  A UD QP bound by SIDR has no connection to
  // end (its remote ID is 0, which a forged DREQ could name), and one
  // closed already -- its timewait over, its DREP lost -- has nothing
  // left to end either.
  if (cp == nullptr || cp->type == qp_type::ud || cp->st == state::closed ||
      cp->remote_id != r.local_comm_id || !from_peer(*cp, m)) {
    wcm::drep d;
    d.remote_comm_id = r.local_comm_id;
    d.local_comm_id = r.remote_comm_id;
    send_to(m.dst, m.src, dev_.route_hop_limit(m.src), h.tid, d);
    return;
  }
  if (cp->qpn != 0 && r.remote_qpn != cp->qpn) {
    // Our connection, but not our QP: neither ends it nor is answered (a
    // DREP would tell the sender it ended; ib_cm's cm_dreq_handler).
    ++stats_.mads_dropped;
    return;
  }
  conn& c = *cp;
  switch (c.st) {
    case state::established:
    case state::rep_sent:
    case state::dreq_sent:
      qp_to_error(c);
      c.dreq_tid = h.tid;
      send_drep(c);
      if (c.st == state::rep_sent) fail_op(c, err(errc::connection_reset));
      try {
        c.pdata = bytes_of(r.private_data);
      } catch (...) {
      }
      end_connection(c, {});
      enter_timewait(c);
      return;
    case state::timewait:
      ++stats_.duplicates;
      c.dreq_tid = h.tid;
      send_drep(c);
      return;
    default:
      ++stats_.mads_dropped;
      return;
  }
}

void manager::on_drep(const soft::mad_in& m) noexcept {
  wcm::drep r;
  if (!decoded(m, r)) return;
  conn* cp = find(r.remote_comm_id);
  if (cp == nullptr || cp->st != state::dreq_sent || cp->remote_id != r.local_comm_id || !from_peer(*cp, m)) {
    ++stats_.mads_dropped;
    return;
  }
  enter_timewait(*cp);
}

void manager::on_sidr_req(const soft::mad_in& m, const wcm::mad_header& h) noexcept {
  wcm::sidr_req r;
  if (!decoded(m, r)) return;
  // SIDR has no CA GUID: requests are told apart by sender address.
  std::uint64_t hi, lo;
  std::memcpy(&hi, m.src.raw.data(), 8);
  std::memcpy(&lo, m.src.raw.data() + 8, 8);
  const key sender{hi, r.request_id, lo, true};
  if (auto it = by_remote_.find(sender); it != by_remote_.end()) {
    ++stats_.duplicates;
    if (it->second->st == state::timewait) resend(*it->second);  // our SIDR_REP was lost
    return;
  }
  auto answer = [&](wcm::sidr_status s) {
    wcm::sidr_rep a;
    a.request_id = r.request_id;
    a.status = s;
    a.service_id = r.service_id;
    send_to(m.dst, m.src, dev_.route_hop_limit(m.src), h.tid, a);
  };
  wcm::port_space wps;
  std::uint16_t port;
  wcm::ip_header ip;
  if (!wcm::parse_service_id(r.service_id, wps, port) || wps != wcm::port_space::udp ||
      !wcm::decode(std::span<const std::byte>(r.private_data), ip)) {
    answer(wcm::sidr_status::no_service);
    return;
  }
  listen_t* l = find_listener(port_space::udp, from_wire(ip.dst_ip), port);
  if (l == nullptr || l->closed) {
    answer(wcm::sidr_status::no_service);
    return;
  }
  // As for a REQ: the requester's address in the header is the sender's
  // (the application is told it), and the partition is the port's.
  if (!(from_wire(ip.src_ip) == m.src) || (r.pkey & 0x7FFF) != (wire::default_pkey & 0x7FFF)) {
    answer(wcm::sidr_status::rejected);
    return;
  }
  if (l->queue.size() >= l->backlog) {
    ++stats_.backlog_drops;
    return;
  }
  std::uint32_t gid_index = 0;
  if (!dev_.find_gid(m.dst, gid_index)) {
    ++stats_.mads_dropped;
    return;
  }
  std::vector<std::byte> pdata;  // (out of memory: as if lost, as a REQ)
  try {
    pdata = bytes_of(r.private_data, wcm::ip_header_size);
  } catch (...) {
    return;
  }
  conn* cp = queue_request(*l, sender);
  if (cp == nullptr) return;
  conn& c = *cp;
  c.passive = true;
  c.st = state::sidr_rcvd;
  c.listener = l;
  c.remote_id = r.request_id;
  c.remote_guid = hi;
  c.remote_low = lo;
  c.remote_sidr = true;
  c.tid = h.tid;
  c.type = qp_type::ud;
  c.local = {m.dst, port};
  c.peer = {from_wire(ip.src_ip), ip.src_port};
  c.peer_gid = m.src;
  c.gid_index = gid_index;
  c.hop_limit = dev_.route_hop_limit(m.src);  // not what is left of the request's (ib_cm's response AH)
  c.pdata = std::move(pdata);
  // The requester resends on its own clock; a request nobody takes is
  // forgotten after a generous while.
  arm(c, wcm::cm_timeout(mra_service_timeout) * 4);
  deliver(*l);
}

void manager::on_sidr_rep(const soft::mad_in& m) noexcept {
  wcm::sidr_rep r;
  if (!decoded(m, r)) return;
  conn* cp = find(r.request_id);
  // Only from the address the SIDR_REQ went to, as a REP (on_rep).
  if (cp == nullptr || cp->st != state::sidr_sent || !(m.src == cp->peer_gid)) {
    ++stats_.mads_dropped;
    return;
  }
  conn& c = *cp;
  if (op_cancelled(c)) {
    // Nobody waits for it: the QP stays free for another connect.
    fail_op(c, err(errc::operation_aborted));
    close_conn(c);
    return;
  }
  try {
    c.pdata = bytes_of(r.private_data);
  } catch (...) {
    ++stats_.mads_dropped;  // as if lost: the SIDR_REQ is resent, and answered again
    return;
  }
  switch (r.status) {
    case wcm::sidr_status::ok: {
      c.remote_qpn = r.qpn;
      c.remote_qkey = r.qkey;
      c.st = state::established;
      c.was_connected = true;
      c.mad.reset();
      disarm(c);
      connect_result res;
      try {
        res.private_data = c.pdata;
      } catch (...) {
        res.private_data = std::move(c.pdata);  // (no copy for private_data() then)
      }
      res.remote_qpn = r.qpn;
      res.remote_qkey = r.qkey;
      if (!complete(c.op, {}, &res)) close_conn(c);  // cancelled on another thread meanwhile
      return;
    }
    case wcm::sidr_status::no_service:
      fail_op(c, err(errc::connection_refused));
      break;
    case wcm::sidr_status::rejected:
      c.rej_reason = static_cast<std::uint16_t>(wcm::rej_reason::consumer_defined);
      fail_op(c, err(errc::connection_rejected));
      break;
    default:
      fail_op(c, err(errc::connection_rejected));
      break;
  }
  close_conn(c);
}

// ---------------------------------------------------------------------------
// Handing requests to the application

void manager::deliver(listen_t& l) noexcept {
  while (!l.queue.empty() && !l.gets.empty()) {
    // Cancelled meanwhile, or its request handle dropped: a connection
    // handed to nobody would be rejected, and the next get_request would
    // wait for yet another (librdmacm leaves requests queued until read).
    if (!averbs::detail::request_wanted(*l.gets.front().w.ctx, l.gets.front().w.id)) {
      (void)averbs::detail::cancel_request(*l.gets.front().w.ctx, l.gets.front().w.id);  // (an orphan's slot)
      listen_t::get g = std::move(l.gets.front());
      l.gets.pop_front();
      context_release(*g.w.ctx);
      dev_.release_later(std::move(g.spare));
      continue;
    }
    conn* c = l.queue.front();
    connection_request req;
    try {
      req.conn = averbs::detail::handle_access::make<connector>(l.gets.front().spare);
      req.private_data = c->pdata;
    } catch (...) {
      // Out of memory: the request waits in the backlog and the get first
      // in line, for the next deliver() (the next request or get_request),
      // rather than be handed out without its connector or private data.
      // (Neither left its queue: putting one back could need memory.)
      return;
    }
    listen_t::get g = std::move(l.gets.front());
    l.gets.pop_front();
    c->listener = nullptr;
    c->has_handle = true;
    g.spare->c = c;
    req.local = c->local;
    req.peer = c->peer;
    req.type = c->type;
    req.responder_resources = c->peer_rr;
    req.initiator_depth = c->peer_id;
    req.remote_qpn = c->remote_qpn;
    const bool taken = averbs::detail::complete_request(*g.w.ctx, g.w.id, {}, &req);
    context_release(*g.w.ctx);
    dev_.yield_pass();
    if (taken) {
      l.queue.pop_front();
    } else {
      // Cancelled at this very moment: the request stays first in line.
      g.spare->c = nullptr;
      c->has_handle = false;
      c->listener = &l;
    }
    // Our references die outside the lock: the connector's destructor takes
    // it.  (Dropping req.conn here is safe while g.spare still holds one.)
    req.conn = {};
    dev_.release_later(std::move(g.spare));
  }
}

void manager::get_request(listen_t* l, waiter w, std::shared_ptr<connector_obj> spare) noexcept {
  if (fatal_) {
    averbs::detail::complete_request(*w.ctx, w.id, err(errc::device_removed), nullptr);
    dev_.release_later(std::move(spare));
    return;
  }
  // Gets cancelled while parked hold a context reference and a connector
  // each until a request comes; a server that parks and cancels in a loop
  // would pile them up.  Drop them here, as deliver() does.
  for (auto it = l->gets.begin(); it != l->gets.end();) {
    if (averbs::detail::request_wanted(*it->w.ctx, it->w.id)) {
      ++it;
      continue;
    }
    (void)averbs::detail::cancel_request(*it->w.ctx, it->w.id);  // an orphan's slot is freed so
    context_release(*it->w.ctx);
    dev_.release_later(std::move(it->spare));
    it = l->gets.erase(it);
  }
  listen_t::get g{w, std::move(spare)};
  try {
    l->gets.push_back(std::move(g));
  } catch (...) {
    // The connector must not die here, under the device lock.
    dev_.release_later(std::move(g.spare));
    averbs::detail::complete_request(*w.ctx, w.id, err(errc::no_resources), nullptr);
    return;
  }
  context_add_ref(*w.ctx);
  deliver(*l);
}

std::size_t manager::cancel_gets(listen_t* l) noexcept {
  std::size_t n = 0;
  for (auto& g : l->gets) {
    if (averbs::detail::request_pending(*g.w.ctx, g.w.id)) ++n;
    complete(g.w, err(errc::operation_aborted));
    dev_.release_later(std::move(g.spare));
  }
  l->gets.clear();
  return n;
}

std::error_code manager::listen(const address& at, port_space ps, int backlog, listen_t*& out) noexcept {
  if (fatal_) return err(errc::device_removed);
  if (backlog < 1) return err(errc::invalid_argument);
  std::uint32_t idx;
  if (!at.is_any() && !dev_.find_gid(at.ip, idx)) return err(errc::address_unreachable);
  address a = at;
  // The addresses a listener takes, as find_listener() hands them out: its
  // own, or for 0.0.0.0 every IPv4 address, for :: every address.  Two
  // listeners of one port clash when those overlap.
  auto covers = [](const address& w, const address& x) {
    if (!w.is_any()) return w.ip == x.ip;
    return !w.is_ipv4() || x.is_ipv4();
  };
  auto clash = [&](const address& x) {
    for (auto& l : listeners_)
      if (l->ps == ps && l->at.port == x.port && (covers(l->at, x) || covers(x, l->at))) return true;
    return false;
  };
  if (a.port == 0) {
    for (int tries = 0; tries < 65536; ++tries) {
      a.port = ephemeral_port();
      if (!clash(a)) break;
    }
  }
  if (clash(a)) return err(errc::address_in_use);
  try {
    auto l = std::make_unique<listen_t>();
    l->at = a;
    l->ps = ps;
    l->backlog = static_cast<std::size_t>(backlog);
    out = l.get();
    listeners_.push_back(std::move(l));
  } catch (...) {
    return err(errc::no_resources);
  }
  return {};
}

void manager::close(listen_t* l) noexcept {
  cancel_gets(l);
  // Requests nobody took: nothing listens here any more.
  while (!l->queue.empty()) {
    conn* c = l->queue.front();
    l->queue.pop_front();
    c->listener = nullptr;
    if (c->st == state::req_rcvd) send_rej(*c, wcm::msg_ref::req, wcm::rej_reason::invalid_service_id);
    else if (c->st == state::sidr_rcvd) send_sidr_rep(*c, wcm::sidr_status::no_service, {});
    erase(*c);
  }
  std::erase_if(listeners_, [l](const std::unique_ptr<listen_t>& p) { return p.get() == l; });
}

// ---------------------------------------------------------------------------
// The application's side of a connection

void manager::release(conn* cp) noexcept {
  conn& c = *cp;
  c.has_handle = false;
  complete(c.op, err(errc::operation_aborted));
  complete(c.notify, err(errc::operation_aborted));
  switch (c.st) {
    case state::req_sent:
      send_rej(c, wcm::msg_ref::req, wcm::rej_reason::timeout);
      break;
    case state::req_rcvd:
      send_rej(c, wcm::msg_ref::req, wcm::rej_reason::consumer_defined);
      break;
    case state::sidr_rcvd:
      send_sidr_rep(c, wcm::sidr_status::rejected, {});
      break;
    case state::rep_sent:
      send_rej(c, wcm::msg_ref::rep, wcm::rej_reason::consumer_defined);
      qp_to_error(c);
      break;
    case state::established:
      if (c.type == qp_type::ud) break;
      // As rdma_destroy_id: the peer is told, our QP stops.
      qp_to_error(c);
      send_dreq(c);
      c.st = state::dreq_sent;
      c.retries_left = c.params.max_cm_retries;
      detach(c);
      arm(c, wcm::cm_timeout(c.params.cm_response_timeout));
      return;  // freed after timewait
    case state::dreq_sent:
    case state::timewait:
      detach(c);
      return;  // freed when the protocol is done
    default:
      break;
  }
  erase(c);
}

void manager::connect(connector_obj& o, soft::qp_t* qp, const address& to, std::span<const std::byte> pdata,
                      const conn_params& p, waiter w) noexcept {
  auto fail = [&](errc e) { averbs::detail::complete_request(*w.ctx, w.id, err(e), nullptr); };
  if (fatal_) return fail(errc::device_removed);
  const bool ud = qp->type == qp_type::ud;
  if (!params_valid(p) || to.port == 0 || to.is_any() ||
      pdata.size() > (ud ? max_ud_connect_private_data : max_connect_private_data))
    return fail(errc::invalid_argument);
  if (qp->cm != nullptr) (void)finish_if_cancelled(*static_cast<conn*>(qp->cm));
  if (o.c != nullptr) (void)finish_if_cancelled(*o.c);
  if (qp->cm != nullptr) return fail(errc::invalid_state);  // the QP has a connection
  if (o.c != nullptr && o.c->st != state::idle && o.c->st != state::closed) return fail(errc::invalid_state);
  // A passive UD connection reads established until disconnect(), also
  // once its answer is no longer kept (its state is then closed).
  if (o.c != nullptr && o.c->ud_bound) return fail(errc::invalid_state);
  if (o.c != nullptr && (o.c->passive || o.c->st == state::closed)) {
    // A used connector starts afresh.
    release(o.c);
    o.c = nullptr;
  }
  if (o.c == nullptr) o.c = create();
  if (o.c == nullptr) return fail(errc::no_resources);
  conn& c = *o.c;
  const qp_state s = qp->state;
  if (!(s == qp_state::reset || s == qp_state::init || (ud && s == qp_state::rts))) return fail(errc::invalid_state);
  // The source address: the destination itself when it is ours (a loopback
  // connection), else the device's address of the same family.
  std::uint32_t gid_index = 0;
  gid src{};
  if (dev_.find_gid(to.ip, gid_index)) {
    src = to.ip;
  } else if (dev_.udp_port() != 0) {
    const auto& table = dev_.gid_table();
    for (std::uint32_t i = 0; i < table.size(); ++i) {
      if (table[i].is_ipv4_mapped() == to.ip.is_ipv4_mapped()) {
        src = table[i];
        gid_index = i;
        break;
      }
    }
    if (src.is_zero()) return fail(errc::address_unreachable);
  } else {
    return fail(errc::address_unreachable);  // the in-process link reaches only itself
  }
  c.params = p;
  c.type = qp->type;
  c.local = {src, ephemeral_port()};
  c.peer = to;
  c.peer_gid = to.ip;
  c.gid_index = gid_index;
  c.hop_limit = 64;
  c.path_mtu = dev_.active_mtu();
  c.local_psn = new_psn();
  c.remote_id = 0;
  c.rej_reason = 0;
  c.pdata.clear();
  c.ended = false;
  c.was_connected = false;
  if (auto ec = qp_to_init(c, qp, p)) {
    averbs::detail::complete_request(*w.ctx, w.id, ec, nullptr);
    return;
  }
  attach(c, qp);
  c.tid = new_tid();
  c.retries_left = p.max_cm_retries;
  context_add_ref(*w.ctx);
  c.op = w;
  wcm::ip_header ih;
  ih.ip_version = to.is_ipv4() ? 4 : 6;
  ih.src_port = c.local.port;
  ih.src_ip = to_wire(src);
  ih.dst_ip = to_wire(to.ip);
  if (ud) {
    if (auto ec = qp_to_rts(c, 0, 0, 0, 0)) {
      detach(c);
      complete(c.op, ec);
      return;
    }
    wcm::sidr_req r;
    r.request_id = c.local_id;
    r.service_id = wcm::service_id(wcm::port_space::udp, to.port);
    wcm::encode(ih, std::span<std::byte>(r.private_data));
    std::copy(pdata.begin(), pdata.end(), r.private_data.begin() + wcm::ip_header_size);
    c.st = state::sidr_sent;
    send(c, c.tid, r, true);
  } else {
    wcm::req r;
    r.local_comm_id = c.local_id;
    r.service_id = wcm::service_id(wcm::port_space::tcp, to.port);
    r.local_ca_guid = dev_.node_guid();
    r.local_qpn = qp->qpn;
    r.responder_resources = p.responder_resources;
    r.initiator_depth = p.initiator_depth;
    r.remote_cm_response_timeout = p.cm_response_timeout;
    r.transport_type = qp->type == qp_type::uc ? 1 : 0;
    r.starting_psn = c.local_psn;
    r.local_cm_response_timeout = p.cm_response_timeout;
    r.retry_count = p.retry_count;
    r.pkey = 0xFFFF;
    r.path_mtu = static_cast<std::uint8_t>(c.path_mtu);
    r.rnr_retry_count = p.rnr_retry_count;
    r.max_cm_retries = p.max_cm_retries;
    r.srq = qp->srq != nullptr;
    r.primary.local_gid = to_wire(src);
    r.primary.remote_gid = to_wire(to.ip);
    r.primary.hop_limit = c.hop_limit;
    r.primary.subnet_local = c.hop_limit <= 1;  // as ib_cm: routed (LIDs 0xFFFF) unless one hop
    r.primary.local_ack_timeout = p.ack_timeout;
    wcm::encode(ih, std::span<std::byte>(r.private_data));
    std::copy(pdata.begin(), pdata.end(), r.private_data.begin() + wcm::ip_header_size);
    c.st = state::req_sent;
    send(c, c.tid, r, true);
  }
  arm(c, wcm::cm_timeout(p.cm_response_timeout));
}

void manager::accept(conn* cp, soft::qp_t* qp, std::span<const std::byte> pdata, const conn_params& p,
                     waiter w) noexcept {
  auto fail = [&](const std::error_code& ec) { averbs::detail::complete_request(*w.ctx, w.id, ec, nullptr); };
  if (fatal_) return fail(err(errc::device_removed));
  conn& c = *cp;
  // (A passive connection the peer gave up on says why; an active one
  // cannot accept at all.)
  if (c.passive && c.st == state::closed && c.rej_reason != 0 && !c.was_connected)
    return fail(rej_error(c.rej_reason));
  if (c.st != state::req_rcvd && c.st != state::sidr_rcvd) return fail(err(errc::invalid_state));
  const bool ud = c.st == state::sidr_rcvd;
  if (!params_valid(p) || qp->type != c.type ||
      pdata.size() > (ud ? max_ud_accept_private_data : max_accept_private_data))
    return fail(err(errc::invalid_argument));
  if (qp->cm != nullptr) return fail(err(errc::invalid_state));
  const qp_state s = qp->state;
  if (!(s == qp_state::reset || s == qp_state::init || (ud && s == qp_state::rts)))
    return fail(err(errc::invalid_state));
  c.params = p;
  if (auto ec = qp_to_init(c, qp, p)) return fail(ec);
  attach(c, qp);
  c.local_psn = new_psn();
  if (ud) {
    if (auto ec = qp_to_rts(c, 0, 0, 0, 0)) {
      detach(c);
      return fail(ec);
    }
    send_sidr_rep(c, wcm::sidr_status::ok, pdata);
    // Established for the application (state(), disconnect(),
    // notify_disconnect()) until it disconnects; inside, it answers
    // duplicate SIDR_REQs for a while (timewait), then closes.
    c.st = state::timewait;
    c.was_connected = true;
    c.ud_bound = true;
    detach(c);
    // As long as an untaken SIDR_REQ is kept (on_sidr_req): the requester
    // resends at its own pace (rdma_cm: every 4.3 s), which SIDR_REQ does
    // not tell; our own retry budget is shorter than one such interval.
    arm(c, std::max(wcm::cm_timeout(c.params.cm_response_timeout) * (c.params.max_cm_retries + 1),
                    wcm::cm_timeout(mra_service_timeout) * 4));
    averbs::detail::complete_request(*w.ctx, w.id, {}, nullptr);
    return;
  }
  const std::uint8_t max_rd = std::min(p.initiator_depth, c.peer_rr);
  if (auto ec = qp_to_rts(c, c.peer_rnr, max_rd, c.peer_ack_timeout, c.peer_retry)) {
    detach(c);
    return fail(ec);
  }
  wcm::rep r;
  r.local_comm_id = c.local_id;
  r.remote_comm_id = c.remote_id;
  r.local_qpn = qp->qpn;
  r.starting_psn = c.local_psn;
  r.responder_resources = p.responder_resources;
  r.initiator_depth = max_rd;
  r.target_ack_delay = soft::limits::local_ca_ack_delay;
  r.rnr_retry_count = p.rnr_retry_count;
  r.srq = qp->srq != nullptr;
  r.local_ca_guid = dev_.node_guid();
  std::copy(pdata.begin(), pdata.end(), r.private_data.begin());
  c.st = state::rep_sent;
  c.retries_left = c.peer_max_retries;
  context_add_ref(*w.ctx);
  c.op = w;
  send(c, c.tid, r, true);
  arm(c, wcm::cm_timeout(c.peer_rep_timeout));
}

std::error_code manager::reject(conn* cp, std::span<const std::byte> pdata) noexcept {
  if (fatal_) return err(errc::device_removed);
  conn& c = *cp;
  // A request its requester gave up on says why, as accept() does (not a
  // connection that was up: one a REJ ended later is plainly closed).
  if (c.passive && c.st == state::closed && c.rej_reason != 0 && !c.was_connected)
    return rej_error(c.rej_reason);
  if (c.st == state::req_rcvd) {
    if (pdata.size() > max_reject_private_data) return err(errc::invalid_argument);
    send_rej(c, wcm::msg_ref::req, wcm::rej_reason::consumer_defined, pdata);
    // The request is forgotten (ib_cm resets the ID to idle): if the REJ
    // is lost, the requester's resent REQ reaches the listener again
    // instead of being swallowed as a duplicate of one rejected.
    unindex_remote(c);
  } else if (c.st == state::sidr_rcvd) {
    if (pdata.size() > max_ud_accept_private_data) return err(errc::invalid_argument);
    send_sidr_rep(c, wcm::sidr_status::rejected, pdata);
  } else {
    return err(errc::invalid_state);
  }
  close_conn(c);
  return {};
}

std::error_code manager::disconnect(conn* cp) noexcept {
  if (fatal_) return err(errc::device_removed);
  conn& c = *cp;
  if (finish_if_cancelled(c)) return {};  // a cancelled connect leaves its QP in INIT
  if (c.ud_bound) {
    // A passive UD connection: nothing to tell the peer (SIDR has no
    // disconnect); duplicates of its request are new requests from now.
    c.ud_bound = false;
    end_connection(c, {});
    if (c.st == state::timewait) close_conn(c);
    return {};
  }
  switch (c.st) {
    case state::req_sent:
      // Abandon the connect.
      send_rej(c, wcm::msg_ref::req, wcm::rej_reason::timeout);
      fail_op(c, err(errc::operation_aborted));
      qp_to_error(c);
      close_conn(c);
      return {};
    case state::sidr_sent:
      fail_op(c, err(errc::operation_aborted));
      close_conn(c);
      return {};
    case state::rep_sent:
      // Not connected yet: a DREQ would be ignored by a requester still
      // waiting for our REP (ib_cm takes a DREQ only once established).
      // REJ "consumer defined", as ib_cm sends when the ID is destroyed
      // here; a requester that came up on our REP ends on it too.
      qp_to_error(c);
      send_rej(c, wcm::msg_ref::rep, wcm::rej_reason::consumer_defined);
      fail_op(c, err(errc::operation_aborted));
      end_connection(c, {});
      close_conn(c);
      return {};
    case state::established:
      if (c.type == qp_type::ud) {
        end_connection(c, {});
        close_conn(c);
        return {};
      }
      // The QP stops first: its work completes flushed before we return.
      qp_to_error(c);
      end_connection(c, {});
      send_dreq(c);
      c.st = state::dreq_sent;
      c.retries_left = c.params.max_cm_retries;
      detach(c);
      arm(c, wcm::cm_timeout(c.params.cm_response_timeout));
      return {};
    case state::dreq_sent:
    case state::timewait:
      return {};
    case state::closed:
      if (c.was_connected) return {};
      return err(errc::not_connected);
    default:
      return err(errc::not_connected);
  }
}

void manager::notify_disconnect(conn* cp, waiter w) noexcept {
  if (fatal_) {
    averbs::detail::complete_request(*w.ctx, w.id, err(errc::device_removed), nullptr);
    return;
  }
  conn& c = *cp;
  if (c.ended) {
    averbs::detail::complete_request(*w.ctx, w.id, c.end, nullptr);
    return;
  }
  const bool live = c.st == state::established || c.st == state::rep_sent || c.st == state::req_sent ||
                    c.st == state::req_rcvd || c.ud_bound;
  if (c.notify && !averbs::detail::request_pending(*c.notify.ctx, c.notify.id)) {
    // The one parked before was cancelled: it no longer holds the place.
    context_release(*c.notify.ctx);
    c.notify = {};
  }
  if (!live || c.notify) {
    averbs::detail::complete_request(*w.ctx, w.id, err(c.notify ? errc::invalid_state : errc::not_connected),
                                     nullptr);
    return;
  }
  context_add_ref(*w.ctx);
  c.notify = w;
}

conn_state manager::state_of(conn* c) noexcept {
  if (c != nullptr && !fatal_) (void)finish_if_cancelled(*c);
  return public_state(c);
}

conn_state manager::public_state(const conn* c) noexcept {
  if (c == nullptr) return conn_state::idle;
  if (c->ud_bound) return conn_state::established;
  switch (c->st) {
    case state::idle: return conn_state::idle;
    case state::req_sent:
    case state::sidr_sent:
      return op_cancelled(*c) ? conn_state::closed : conn_state::connecting;
    case state::req_rcvd:
    case state::sidr_rcvd: return conn_state::requested;
    case state::rep_sent: return conn_state::accepting;
    case state::established: return conn_state::established;
    case state::dreq_sent: return conn_state::disconnecting;
    case state::timewait: return conn_state::timewait;
    case state::closed: return conn_state::closed;
  }
  return conn_state::closed;
}

}  // namespace averbs::cm::detail
