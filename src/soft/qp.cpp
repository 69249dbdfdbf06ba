// SPDX-License-Identifier: MIT
// Queue pairs: creation, the IBTA state machine (modify/query), posting,
// retiring completed work, flushing, and destruction.
#include "soft/engine.hpp"

#include <averbs/error.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace averbs::soft {

namespace {

// Whether the calling thread has CAP_NET_RAW in its effective set (capget:
// libcap is not a dependency for one bit).
bool has_cap_net_raw() noexcept {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
  if (::syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[CAP_NET_RAW / 32].effective & (1u << (CAP_NET_RAW % 32))) != 0;
}

std::error_code err(errc e) { return make_error_code(e); }

// --- The modify_qp attribute table (IBTA 11.2.4.2, the kernel's
// qp_state_table): for each (current, next) state and QP type, the
// attributes that must be given and those that may be.

enum : std::uint32_t {
  m_state = qp_attr_state,
  m_cur = qp_attr_cur_state,
  m_sqd_notify = qp_attr_en_sqd_async_notify,
  m_access = qp_attr_access_flags,
  m_pkey = qp_attr_pkey_index,
  m_port = qp_attr_port,
  m_qkey = qp_attr_qkey,
  m_av = qp_attr_av,
  m_mtu = qp_attr_path_mtu,
  m_timeout = qp_attr_timeout,
  m_retry = qp_attr_retry_cnt,
  m_rnr_retry = qp_attr_rnr_retry,
  m_rq_psn = qp_attr_rq_psn,
  m_rd_atomic = qp_attr_max_qp_rd_atomic,
  m_alt = qp_attr_alt_path,
  m_min_rnr = qp_attr_min_rnr_timer,
  m_sq_psn = qp_attr_sq_psn,
  m_dest_rd_atomic = qp_attr_max_dest_rd_atomic,
  m_mig = qp_attr_path_mig_state,
  m_cap = qp_attr_cap,
  m_dest_qpn = qp_attr_dest_qpn,
};

struct rule {
  bool valid = false;
  std::array<std::uint32_t, 3> req{};  // rc, uc, ud
  std::array<std::uint32_t, 3> opt{};
};

constexpr int type_index(qp_type t) { return t == qp_type::rc ? 0 : t == qp_type::uc ? 1 : 2; }

struct state_table {
  rule r[7][7];
  constexpr state_table() {
    using enum qp_state;
    auto at = [this](qp_state a, qp_state b) -> rule& {
      return r[static_cast<int>(a)][static_cast<int>(b)];
    };
    for (int s = 0; s < 7; ++s) {
      r[s][static_cast<int>(reset)].valid = true;
      if (s != static_cast<int>(reset)) r[s][static_cast<int>(err)].valid = true;
    }
    at(reset, init) = {true, {m_pkey | m_port | m_access, m_pkey | m_port | m_access, m_pkey | m_port | m_qkey}, {}};
    at(init, init) = {true, {}, {m_pkey | m_port | m_access, m_pkey | m_port | m_access, m_pkey | m_port | m_qkey}};
    at(init, rtr) = {true,
                     {m_av | m_mtu | m_dest_qpn | m_rq_psn | m_dest_rd_atomic | m_min_rnr,
                      m_av | m_mtu | m_dest_qpn | m_rq_psn, 0},
                     {m_alt | m_access | m_pkey, m_alt | m_access | m_pkey, m_pkey | m_qkey}};
    at(rtr, rts) = {true,
                    {m_timeout | m_retry | m_rnr_retry | m_sq_psn | m_rd_atomic, m_sq_psn, m_sq_psn},
                    {m_cur | m_alt | m_access | m_min_rnr | m_mig, m_cur | m_alt | m_access | m_mig,
                     m_cur | m_qkey}};
    at(rts, rts) = {true,
                    {},
                    {m_cur | m_access | m_alt | m_mig | m_min_rnr, m_cur | m_access | m_alt | m_mig,
                     m_cur | m_qkey}};
    at(rts, sqd) = {true, {}, {m_sqd_notify, m_sqd_notify, m_sqd_notify}};
    at(sqd, rts) = {true,
                    {},
                    {m_cur | m_alt | m_access | m_min_rnr | m_mig, m_cur | m_alt | m_access | m_mig,
                     m_cur | m_qkey}};
    at(sqd, sqd) = {true,
                    {},
                    {m_port | m_av | m_timeout | m_retry | m_rnr_retry | m_rd_atomic | m_dest_rd_atomic |
                         m_alt | m_access | m_pkey | m_min_rnr | m_mig,
                     m_av | m_alt | m_access | m_pkey | m_mig, m_pkey | m_qkey}};
    at(sqe, rts) = {true, {}, {0, m_cur | m_access, m_cur | m_qkey}};
  }
};

constexpr state_table table;

std::uint32_t pow2_at_least(std::uint32_t v) {
  std::uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

wc_opcode wc_opcode_of(std::uint8_t op) {
  switch (static_cast<wr_opcode>(op)) {
    case wr_opcode::rdma_write:
    case wr_opcode::rdma_write_with_imm: return wc_opcode::rdma_write;
    case wr_opcode::send:
    case wr_opcode::send_with_imm:
    case wr_opcode::send_with_inv: return wc_opcode::send;
    case wr_opcode::rdma_read: return wc_opcode::rdma_read;
    case wr_opcode::atomic_cmp_and_swp: return wc_opcode::comp_swap;
    case wr_opcode::atomic_fetch_and_add: return wc_opcode::fetch_add;
    case wr_opcode::local_inv: return wc_opcode::local_inv;
    case wr_opcode::bind_mw: return wc_opcode::bind_mw;
    case wr_opcode::atomic_write:
      return wc_opcode::atomic_write;
  }
  return wc_opcode::send;
}

}  // namespace

// ---------------------------------------------------------------------------
// Create

std::error_code device::create_qp(pd_t* pd, const qp_init& init, qp_t*& out) {
  if (init.type != qp_type::rc && init.type != qp_type::uc && init.type != qp_type::ud)
    return err(errc::not_supported);
  if (init.send_cq == nullptr || (init.recv_cq == nullptr && init.srq == nullptr))
    return err(errc::invalid_argument);
  const qp_cap& c = init.cap;
  if (c.max_send_wr > limits::max_qp_wr || c.max_send_sge > limits::max_sge ||
      c.max_inline_data > limits::max_inline_data)
    return err(errc::invalid_argument);
  if (init.srq == nullptr && (c.max_recv_wr > limits::max_qp_wr || c.max_recv_sge > limits::max_sge))
    return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  if (live_qps_ >= limits::max_qp) return err(errc::no_resources);
  if (init.srq != nullptr && init.srq->pd != pd) return err(errc::invalid_argument);
  // The responder queues a QP's coalesced and lazy ACKs (at most one entry
  // each per live QP) where running out of memory could not be reported:
  // the room is made here, where it can.
  ack_ready_.reserve(live_qps_ + 1);
  lazy_acks_.reserve(live_qps_ + 1);
  auto qp = std::make_unique<qp_t>();
  qp->dev = this;
  // Timer entries carry the QPN and this generation; a QP that reuses a
  // destroyed one's number must not match the entries it left in the heap.
  qp->comp.timer_gen = ++qp_generation_ << 32;
  qp->type = init.type;
  qp->pd = pd;
  // Where a receive taken from the SRQ is copied (next_recv cannot report
  // running out of memory; the entry size never changes).
  if (init.srq != nullptr) qp->resp.srq_wqe.resize(init.srq->q.entry_size());
  qp->scq = init.send_cq;
  qp->rcq = init.recv_cq != nullptr ? init.recv_cq : init.send_cq;
  qp->srq = init.srq;
  qp->sq_sig_all = init.sq_sig_all;
  qp->cap = c;
  if (qp->srq != nullptr) qp->cap.max_recv_wr = qp->cap.max_recv_sge = 0;
  // (At least 8 bytes: an inline ATOMIC WRITE's operand, which
  // max_inline_data does not limit.)
  const std::size_t body =
      std::max<std::size_t>({std::size_t{c.max_send_sge} * sizeof(wqe_sge), c.max_inline_data, 8});
  qp->send_wqe_size = static_cast<std::uint32_t>(sizeof(send_wqe) + body);
  if (!qp->sq.init(std::max<std::uint32_t>(c.max_send_wr, 1), qp->send_wqe_size))
    return err(errc::no_resources);
  qp->sq_state.resize(qp->sq.size());
  if (qp->srq == nullptr &&
      !qp->rq.init(std::max<std::uint32_t>(c.max_recv_wr, 1),
                   sizeof(recv_wqe) + std::size_t{c.max_recv_sge} * sizeof(wqe_sge)))
    return err(errc::no_resources);
  // Grow the table before reusing numbers, then reuse the longest-freed one,
  // so a peer still holding an old QPN (CM timewait) does not meet it soon.
  std::uint32_t index;
  if (!free_qps_.empty() && (qps_.size() >= 65536 || qps_.size() >= limits::max_qp)) {
    index = free_qps_.front();
    free_qps_.pop_front();
  } else {
    qps_.emplace_back();
    index = static_cast<std::uint32_t>(qps_.size() - 1);
  }
  qp->index = index;
  qp->qpn = index + first_qpn_;
  ++pd->children;
  ++qp->scq->users;
  ++qp->rcq->users;
  if (qp->srq != nullptr) ++qp->srq->users;
  ++live_qps_;
  // UD's GRH reports each datagram's traffic class and hop limit.
  if (init.type == qp_type::ud) link_->want_ip_fields();
  out = qp.get();
  qps_[index] = std::move(qp);
  return {};
}

// ---------------------------------------------------------------------------
// Modify and query

std::error_code device::modify_qp(qp_t* qp, const qp_attr& a, std::uint32_t mask) {
  std::lock_guard lock(lock_);
  return modify_qp_locked(qp, a, mask);
}

std::error_code device::modify_qp_locked(qp_t* qp, const qp_attr& a, std::uint32_t mask) {
  // A bit past the standard attributes (IBV_QP_RATE_LIMIT, say) is one
  // this device does not implement: EOPNOTSUPP, as rxe's rxe_modify_qp
  // answers; a standard one the transition does not take stays EINVAL.
  constexpr std::uint32_t known = (qp_attr_dest_qpn << 1) - 1;
  if ((mask & ~known) != 0) return err(errc::not_supported);
  const qp_state cur = qp->state;
  if ((mask & m_cur) != 0 && a.cur_state != cur) return err(errc::invalid_argument);
  const qp_state next = (mask & m_state) != 0 ? a.state : cur;
  // While the send queue drains, only the moves that abandon it are
  // allowed: to error, and to reset (IBTA 10.3.1 allows Reset from any
  // state, as the kernel's ib_modify_qp_is_ok and hardware do; rxe refuses
  // it, which leaves a program no way to recycle such a QP but through ERR).
  // Attributes change in SQD only once it has drained (IBTA 10.3.1), with
  // or without the state in the mask.
  if (cur == qp_state::sqd && qp->sq_draining && next != qp_state::err && next != qp_state::reset)
    return err(errc::invalid_state);
  if (static_cast<unsigned>(next) > 6) return err(errc::invalid_argument);
  const rule& r = table.r[static_cast<int>(cur)][static_cast<int>(next)];
  if (!r.valid) return err(errc::invalid_state);
  const int t = type_index(qp->type);
  const std::uint32_t given = mask & ~m_state;
  if ((given & r.req[t]) != r.req[t]) return err(errc::invalid_argument);
  if ((given & ~(r.req[t] | r.opt[t])) != 0) return err(errc::invalid_argument);

  // Value checks (rxe_qp_chk_attr and the IBTA field widths).
  if ((mask & m_port) != 0 && a.port_num != 1) return err(errc::invalid_argument);
  if ((mask & m_pkey) != 0 && a.pkey_index >= limits::pkey_table_len) return err(errc::invalid_argument);
  // No larger than the port's link carries (rxe allows up to its max_mtu;
  // here a larger packet would leave with DF and be refused by the kernel
  // at every try, ending in retry_exc_err long after this mistake).
  if ((mask & m_mtu) != 0 &&
      (static_cast<unsigned>(a.path_mtu) < 1 || static_cast<unsigned>(a.path_mtu) > 5 ||
       static_cast<unsigned>(a.path_mtu) > static_cast<unsigned>(active_mtu_)))
    return err(errc::invalid_argument);
  if ((mask & m_timeout) != 0 && a.timeout > 31) return err(errc::invalid_argument);
  if ((mask & m_retry) != 0 && a.retry_cnt > 7) return err(errc::invalid_argument);
  if ((mask & m_rnr_retry) != 0 && a.rnr_retry > 7) return err(errc::invalid_argument);
  if ((mask & m_min_rnr) != 0 && a.min_rnr_timer > 31) return err(errc::invalid_argument);
  if ((mask & m_rd_atomic) != 0 && a.max_rd_atomic > limits::max_qp_rd_atom) return err(errc::invalid_argument);
  if ((mask & m_dest_rd_atomic) != 0 && a.max_dest_rd_atomic > limits::max_qp_rd_atom)
    return err(errc::invalid_argument);
  if ((mask & m_dest_qpn) != 0 && a.dest_qp_num > wire::qpn_mask) return err(errc::invalid_argument);
  if ((mask & m_access) != 0) {
    // As reg_mr answers them: the optional range is taken; on-demand
    // paging and the FLUSH targets (bits 8-9), which rxe takes, are
    // requests this device cannot honour.
    constexpr std::uint32_t flush = 3u << 8;  // IBV_ACCESS_FLUSH_GLOBAL, _PERSISTENT
    const std::uint32_t f = a.qp_access_flags;
    if ((f & ~(access_local_write | access_remote_write | access_remote_read | access_remote_atomic |
               access_mw_bind | access_on_demand | flush | 0x3FF00000u)) != 0)
      return err(errc::invalid_argument);
    if ((f & (access_on_demand | flush)) != 0) return err(errc::not_supported);
  }
  if ((mask & m_av) != 0 && !valid_av(a.ah)) return err(errc::invalid_argument);
  // No alternate path on RoCE: the kernel refuses one for a RoCE port
  // whatever the IBTA table allows (_ib_modify_qp: "Ban them in roce
  // mode"), and nothing here would ever migrate to it.
  if ((mask & m_alt) != 0) return err(errc::invalid_argument);
  if ((mask & m_mig) != 0 && static_cast<unsigned>(a.path_mig_state) > static_cast<unsigned>(mig_state::armed))
    return err(errc::invalid_argument);
  // A controlled Q_Key (high bit set, IBTA 10.2.4) needs CAP_NET_RAW, as
  // Linux 6.4's uverbs requires.
  if ((mask & m_qkey) != 0 && (a.qkey & 0x80000000u) != 0 && !has_cap_net_raw())
    return err(errc::permission_denied);

  // The memory the move needs, taken before anything changes: a move
  // refused for want of it changes nothing (no_resources).  The READ/atomic
  // replay table, sized at RTR and resized in SQD.
  auto& res = qp->resp.resources;
  const std::uint32_t dest_rd =
      (mask & m_dest_rd_atomic) != 0 ? a.max_dest_rd_atomic : qp->max_dest_rd_atomic;
  const std::size_t res_size = pow2_at_least(std::max<std::uint32_t>(dest_rd, 1));
  const bool to_rtr = (mask & m_state) != 0 && next == qp_state::rtr && cur != qp_state::rtr;
  const bool resize = (mask & m_dest_rd_atomic) != 0 && !res.empty() && res.size() != res_size;
  std::vector<rd_resource> new_res;
  if (to_rtr || resize) {
    try {
      new_res.resize(res_size);
    } catch (const std::bad_alloc&) {
      return err(errc::no_resources);
    }
  }

  // Apply.
  if ((mask & m_access) != 0) qp->access_flags = a.qp_access_flags;
  if ((mask & m_pkey) != 0) qp->pkey_index = a.pkey_index;
  if ((mask & m_port) != 0) qp->port = a.port_num;
  if ((mask & m_qkey) != 0) qp->qkey = a.qkey;
  if ((mask & m_av) != 0) {
    qp->av = a.ah;
    qp->av.grh.hop_limit = route_hop_limit(a.ah.grh.dgid);
    qp->sgid = gids_[a.ah.grh.sgid_index];
  }
  if ((mask & m_mig) != 0) qp->path_mig_state = a.path_mig_state;
  if ((mask & m_mtu) != 0) {
    qp->path_mtu = a.path_mtu;
    qp->mtu_bytes = mtu_bytes(a.path_mtu);
  }
  if ((mask & m_timeout) != 0) qp->timeout = a.timeout;
  // A QP already sending (SQD -> SQD) uses new retry counts from its next
  // request on, as rxe sets them at once; the working counts are otherwise
  // refilled only by progress.
  const bool sending = cur == qp_state::rts || cur == qp_state::sqd;
  if ((mask & m_retry) != 0) {
    qp->retry_cnt = a.retry_cnt;
    if (sending) qp->comp.retry_left = a.retry_cnt;
  }
  if ((mask & m_rnr_retry) != 0) {
    qp->rnr_retry = a.rnr_retry;
    if (sending) qp->comp.rnr_left = a.rnr_retry;
  }
  if ((mask & m_rq_psn) != 0) qp->rq_psn = a.rq_psn & wire::psn_mask;
  if ((mask & m_rd_atomic) != 0) qp->max_rd_atomic = a.max_rd_atomic;
  if ((mask & m_min_rnr) != 0) qp->min_rnr_timer = a.min_rnr_timer;
  if ((mask & m_sq_psn) != 0) qp->sq_psn = a.sq_psn & wire::psn_mask;
  if ((mask & m_dest_rd_atomic) != 0) {
    // Changed after RTR (SQD -> SQD): the READ/atomic replay table takes
    // the new size now, or a peer that uses it would overwrite entries
    // still needed for replay.  It keeps its newest entries (rxe's
    // rxe_qp_from_attr() reallocates it empty).
    if (resize) {
      const std::size_t keep = std::min(res_size, res.size());
      for (std::size_t k = 0; k < keep; ++k)
        new_res[k] = res[(qp->resp.res_head - keep + k) & (res.size() - 1)];
      res.swap(new_res);
      qp->resp.res_head = static_cast<std::uint32_t>(keep);
    }
    qp->max_dest_rd_atomic = a.max_dest_rd_atomic;
  }
  if ((mask & m_dest_qpn) != 0) qp->dest_qpn = a.dest_qp_num;
  // The event request belongs to one RTS -> SQD move (IBTA 11.2.5): a
  // later drain asks again or goes without.
  if ((mask & m_state) != 0 && next == qp_state::sqd && cur != qp_state::sqd)
    qp->sqd_notify = (mask & m_sqd_notify) != 0 && a.en_sqd_async_notify;
  if (qp->type == qp_type::ud && (mask & m_qkey) == 0 && cur == qp_state::reset) qp->qkey = 0;

  // The source port follows the path as rxe computes it, at every modify
  // that sets one: INIT -> RTR (a responder in RTR already answers) and a
  // path changed in SQD (SQD -> SQD, IBTA 10.3.1).
  if ((mask & m_av) != 0 && qp->type != qp_type::ud) set_source_port(qp);
  if ((mask & m_state) == 0 || next == cur) {
    if (next == qp_state::sqd && (mask & m_state) != 0) check_sq_drained(qp);
    return {};
  }
  switch (next) {
    case qp_state::reset: {
      // What the responder accepted is acknowledged first, as on a move to
      // ERR: the peer's message arrived (its receive completed here), and
      // a held or lazy ACK dropped with the state would have the peer
      // retry it into this QP until retry_exc_err.
      send_held_ack(qp);
      // Discard all queued work without completions (IBTA 10.3.1).  Not
      // the SRQ's: a receive taken from it for an unfinished message is
      // flushed, as a move to ERR does, rather than lost.
      disarm_timers(qp);
      clean_cqs(qp);
      flush_held_srq_recv(qp);
      drop_held_requests(qp);
      qp->sq.release(qp->sq.producer());
      if (qp->srq == nullptr) qp->rq.release(qp->rq.producer());
      // The engine's own bookkeeping survives: the QP may be linked in
      // the run queue (a pass that ended on its budget), and older timer
      // entries must stay stale.
      const bool scheduled = qp->req.scheduled;
      qp_t* const next_ready = qp->req.next_ready;
      const std::uint64_t timer_gen = qp->comp.timer_gen;
      const bool lazy_listed = qp->resp.lazy_listed;
      const bool ack_listed = qp->resp.ack_listed;
      qp->req = {};
      qp->req.scheduled = scheduled;
      qp->req.next_ready = next_ready;
      std::vector<std::byte> srq_wqe =
          std::move(qp->resp.srq_wqe);  // (reserved at create: no allocation later)
      qp->resp = {};
      qp->resp.srq_wqe = std::move(srq_wqe);
      qp->resp.lazy_listed = lazy_listed;  // still in lazy_acks_
      qp->resp.ack_listed = ack_listed;    // still in ack_ready_
      qp->comp = {};
      qp->comp.timer_gen = timer_gen;
      qp->state = qp_state::reset;
      qp->sq_draining = false;
      break;
    }
    case qp_state::init:
      qp->state = next;
      break;
    case qp_state::rtr:
      qp->resp.started = true;
      qp->resp.psn = qp->rq_psn;
      qp->resp.msn = 0;
      qp->resp.last_opcode = 0xFF;
      qp->resp.last_ack_psn = (qp->rq_psn - 1) & wire::psn_mask;
      qp->resp.newest_psn = qp->resp.last_ack_psn;
      res.swap(new_res);  // empty entries, sized above
      qp->resp.res_head = 0;
      qp->state = next;
      break;
    case qp_state::rts:
      if (cur == qp_state::rtr) {
        qp->req.started = true;
        qp->req.psn = qp->sq_psn;
        qp->req.next_psn = qp->sq_psn;
        qp->req.sent_psn = qp->sq_psn;
        qp->req.wqe_index = qp->sq.consumer();
        qp->req.start_index = qp->sq.consumer();
        qp->comp.psn = qp->sq_psn;
        qp->comp.retry_left = qp->retry_cnt;
        qp->comp.retry_counted = false;
        qp->comp.rnr_left = qp->rnr_retry;
        set_source_port(qp);
        if (qp->type == qp_type::ud) qp->sgid = gids_.empty() ? gid{} : gids_[0];
      }
      qp->sq_draining = false;
      qp->state = next;
      schedule_requester(qp);
      run();
      break;
    case qp_state::sqd:
      qp->state = next;
      qp->sq_draining = true;
      // The drain ends with the last ACK: an unasked tail is asked for now
      // (resent, every last packet asking), not after a retransmit timeout,
      // from a peer that acknowledges only what asks (see on_qp_timer).
      if (qp->type == qp_type::rc && qp->req.last_unasked && qp->comp.psn != qp->req.next_psn &&
          !link_->peers_ack_unasked()) {
        qp->comp.ask_all = true;
        retry(qp, false);
        run();
      }
      check_sq_drained(qp);
      break;
    case qp_state::sqe:
      return err(errc::invalid_state);  // entered only by the engine
    case qp_state::err:
      // What the responder accepted is acknowledged before the QP stops,
      // and leaves now: a held or lazy ACK waits for a later pass, by when
      // a QP in ERR sends nothing, or the DREQ of the disconnect that
      // moved it here, which goes ahead of queued packets, has told the
      // peer to flush a message that arrived.
      send_held_ack(qp);
      qp_to_error(qp);
      break;
  }
  return {};
}

void device::set_source_port(qp_t* qp) noexcept {
  const std::uint32_t remote = qp->type == qp_type::ud ? qp->qpn : qp->dest_qpn;
  qp->sport = qp->type == qp_type::ud ? wire::ud_source_port(qp->qpn)
                                      : wire::udp_source_port(qp->av.grh.flow_label, qp->qpn, remote);
}

std::error_code device::query_qp(qp_t* qp, qp_attr& o, qp_cap& init_cap) {
  std::lock_guard lock(lock_);
  o = qp_attr{};
  o.state = qp->state;
  o.cur_state = qp->state;
  o.path_mtu = qp->path_mtu;
  o.qkey = qp->qkey;
  // Live once running, in every state after (SQE, ERR too), as rxe.
  o.rq_psn = qp->resp.started ? qp->resp.psn : qp->rq_psn;
  o.sq_psn = qp->req.started ? qp->req.next_psn : qp->sq_psn;
  o.dest_qp_num = qp->dest_qpn;
  o.qp_access_flags = qp->access_flags;
  o.cap = qp->cap;
  o.ah = qp->av;
  o.pkey_index = qp->pkey_index;
  o.en_sqd_async_notify = qp->sqd_notify;
  o.sq_draining = qp->sq_draining && qp->sq.consumer() != qp->req.start_index;
  o.max_rd_atomic = qp->max_rd_atomic;
  o.max_dest_rd_atomic = qp->max_dest_rd_atomic;
  o.min_rnr_timer = qp->min_rnr_timer;
  o.port_num = qp->port;
  o.timeout = qp->timeout;
  o.retry_cnt = qp->retry_cnt;
  o.rnr_retry = qp->rnr_retry;
  o.alt_ah = qp->alt_av;
  o.alt_pkey_index = qp->alt_pkey_index;
  o.alt_port_num = qp->alt_port;
  o.alt_timeout = qp->alt_timeout;
  o.path_mig_state = qp->path_mig_state;
  init_cap = qp->cap;
  return {};
}

qp_state device::state_of(qp_t* qp) const {
  std::lock_guard lock(lock_);
  return qp->state;
}

// ---------------------------------------------------------------------------
// Error and flush

void device::qp_to_error(qp_t* qp) noexcept {
  if (qp->state == qp_state::err) {
    flush_qp(qp);
    return;
  }
  qp->state = qp_state::err;
  disarm_timers(qp);
  qp->comp.rnr_waiting = false;
  flush_qp(qp);
  // IBTA 11.6.3.3: a QP attached to an SRQ reports its last WQE.
  if (qp->srq != nullptr) raise_event(qp->pd->events, event_type::qp_last_wqe_reached, qp->qpn);
  if (qp->cm != nullptr) gsi_->on_qp(qp, qp_note::error);
}

// IBTA 10.3.1 (Send Queue Error): an error completion of a UC or UD send
// queue stops that queue only -- its other WQEs complete flushed, later
// posts too -- while the receive queue works on, until the program moves
// the QP back to RTS (or on to ERR).  rxe moves such a QP to ERR, which
// flushes its receives too: a UD server would lose them to one bad send.
// A CQ overrun while flushing still means ERR.
void device::qp_to_sqe(qp_t* qp) noexcept {
  qp->state = qp_state::sqe;
  qp->sq_draining = false;
  if (!flush_sq(qp)) qp_to_error(qp);
}

void device::flush_posted(qp_t* qp) noexcept {
  if (qp->state == qp_state::err)
    flush_qp(qp);
  else if (qp->state == qp_state::sqe && !flush_sq(qp))
    qp_to_error(qp);
}

void device::flush_qp(qp_t* qp) noexcept {
  flush_sq(qp);
  // Receive queue (not an SRQ's: its receives belong to other QPs too).
  if (qp->srq == nullptr) {
    std::uint32_t rc = qp->rq.consumer();
    const std::uint32_t rp = qp->rq.producer();
    for (; rc != rp; ++rc) {
      auto* w = qp->rq.at<recv_wqe>(rc);
      work_completion wc;
      wc.wr_id = w->wr_id;
      wc.status = wc_status::wr_flush_err;
      wc.opcode = wc_opcode::recv;
      wc.qp_num = qp->qpn;
      post_cqe(qp->rcq, wc, false);
    }
    qp->rq.release(rp);
  } else {
    flush_held_srq_recv(qp);
  }
  qp->resp.have_wqe = false;
  drop_held_requests(qp);  // and the READ being answered: an ERR QP sends nothing
}

bool device::flush_sq(qp_t* qp) noexcept {
  // Send queue: every WQE not yet retired completes, in order, once; the
  // oldest keeps its error status if it failed, the rest are flushed.
  bool room = true;
  const std::uint32_t mask = qp->sq.size() - 1;
  std::uint32_t c = qp->sq.consumer();
  const std::uint32_t p = qp->sq.producer();
  // Only the oldest WQE may report its own error (IBTA 10.8.3: one error
  // completion, then flushes): whatever it completes with, a flush
  // included, is the queue's error completion, and a later one that failed
  // locally while waiting to retire in order is flushed like the rest --
  // also when the error completion was just posted (complete_wqes).
  bool error_reported = std::exchange(qp->sq_error_completed, false);
  for (; c != p; ++c) {
    auto* w = qp->sq.at<send_wqe>(c);
    send_state& st = qp->sq_state[c & mask];
    work_completion wc;
    wc.wr_id = w->wr_id;
    const bool failed = st.state == wqe_state::done && st.status != wc_status::success;
    wc.status = failed && !error_reported ? st.status : wc_status::wr_flush_err;
    error_reported = true;
    wc.opcode = wc_opcode_of(w->opcode);
    wc.qp_num = qp->qpn;
    wc.byte_len = w->length;
    room = post_cqe(qp->scq, wc, false) && room;
    st = send_state{};
  }
  qp->sq.release(p);
  qp->req.wqe_index = p;
  qp->req.start_index = p;
  qp->req.rd_atomic = 0;
  return room;
}

void device::flush_held_srq_recv(qp_t* qp) noexcept {
  // A receive the responder took from the SRQ for a message it did not
  // finish has left the SRQ: it completes, flushed, as in rxe, or the
  // program would never see its buffer again.
  if (qp->srq == nullptr || !qp->resp.have_wqe) return;
  work_completion wc;
  wc.wr_id = qp->resp.wqe->wr_id;
  wc.status = wc_status::wr_flush_err;
  wc.opcode = wc_opcode::recv;
  wc.qp_num = qp->qpn;
  post_cqe(qp->rcq, wc, false);
  qp->resp.have_wqe = false;
}

// As mlx5's cq_clean, keeping the others' order -- except receives an SRQ
// gave the QP: those requests were the SRQ's, and without their
// completions the program would never see the buffers again (mlx5 puts
// them back into the SRQ; the CQE has lost their scatter list here).
void device::clean_cqs(const qp_t* qp) noexcept {
  auto clean = [qp](cq_t* cq) {
    const std::uint32_t c = cq->q.consumer(), p = cq->q.producer();
    std::uint32_t kept = c;
    for (std::uint32_t i = c; i != p; ++i) {
      const auto* wc = cq->q.at<work_completion>(i);
      const bool srq_recv = qp->srq != nullptr &&
                            (wc->opcode == wc_opcode::recv || wc->opcode == wc_opcode::recv_rdma_with_imm);
      if (wc->qp_num == qp->qpn && !srq_recv) continue;
      if (kept != i) std::memcpy(cq->q.at(kept), wc, sizeof(work_completion));
      ++kept;
    }
    cq->q.publish(kept);
  };
  clean(qp->scq);
  if (qp->rcq != qp->scq) clean(qp->rcq);
}

void device::check_sq_drained(qp_t* qp) noexcept {
  if (qp->state != qp_state::sqd || !qp->sq_draining) return;
  // Drained when nothing started is outstanding.
  if (qp->sq.consumer() != qp->req.start_index) return;
  qp->sq_draining = false;
  if (qp->sqd_notify) raise_event(qp->pd->events, event_type::sq_drained, qp->qpn);
}

void device::complete_wqes(qp_t* qp) noexcept {
  // Retire finished WQEs strictly in order (IBTA 10.8.2.4).  An unsignaled
  // success produces no completion; an error always does.
  const std::uint32_t mask = qp->sq.size() - 1;
  std::uint32_t c = qp->sq.consumer();
  while (c != qp->sq.producer()) {
    send_state& st = qp->sq_state[c & mask];
    if (st.state != wqe_state::done) break;
    auto* w = qp->sq.at<send_wqe>(c);
    const bool ok = st.status == wc_status::success;
    bool overflow = false;
    if (!ok || qp->sq_sig_all || (w->flags & send_signaled) != 0) {
      work_completion wc;
      wc.wr_id = w->wr_id;
      wc.status = st.status;
      wc.opcode = wc_opcode_of(w->opcode);
      wc.qp_num = qp->qpn;
      wc.byte_len = w->length;
      // The sender's completion flags its immediate too (rxe, mlx5).
      if (w->opcode == static_cast<std::uint8_t>(wr_opcode::send_with_imm) ||
          w->opcode == static_cast<std::uint8_t>(wr_opcode::rdma_write_with_imm))
        wc.wc_flags = wc_with_imm;
      overflow = !post_cqe(qp->scq, wc, false);
    }
    st = send_state{};
    ++c;
    qp->sq.release(c);
    if (static_cast<std::int32_t>(c - qp->req.wqe_index) > 0) qp->req.wqe_index = c;
    if (static_cast<std::int32_t>(c - qp->req.start_index) > 0) qp->req.start_index = c;
    if (!ok || overflow) {
      qp->sq_error_completed = !ok;  // that was the send queue's error completion
      if (!overflow && qp->type != qp_type::rc && (qp->state == qp_state::rts || qp->state == qp_state::sqd))
        qp_to_sqe(qp);
      else
        qp_to_error(qp);
      return;
    }
  }
  check_sq_drained(qp);
  if (qp->req.wqe_index != qp->sq.producer()) schedule_requester(qp);
}

// ---------------------------------------------------------------------------
// Destroy

std::error_code device::destroy_qp(qp_t* qp) {
  {
    std::lock_guard lock(lock_);
    destroy_qp_locked(qp);
    // The DREQ of a connection the QP had, on the in-process link queued
    // here, is handled now: a thread asleep on the peer's notify would
    // otherwise wait for the DREQ's resend.  (A network link sent it.)
    kick();
  }
  drain_released();
  return {};
}

void device::destroy_qp_locked(qp_t* qp) noexcept {
  // An acknowledgement still held for this QP goes out first, ahead of the
  // DREQ the CM sends for a connection the QP still had (as disconnect and
  // a move to ERR order them): the peer's work arrived, and a DREQ first
  // would have it flush a message that did.
  send_held_ack(qp);
  if (qp->cm != nullptr) gsi_->on_qp(qp, qp_note::destroyed);
  // Outstanding work is discarded without completions, and the QP's
  // completions still in its CQs are removed, as a move to RESET does
  // (mlx5 moves the QP to RESET and cleans its CQs; rxe flushes without
  // posting once the QP is invalid, but leaves what its CQs hold): a
  // program that frees its WR contexts after the destroy must not meet
  // them in a CQ later, and a QP torn down with a deep queue must not
  // overrun a CQ other QPs share.  A receive taken from an SRQ for an
  // unfinished message completes flushed, as on RESET.
  clean_cqs(qp);
  flush_held_srq_recv(qp);
  drop_held_requests(qp);
  qp->sq.release(qp->sq.producer());
  if (qp->srq == nullptr) qp->rq.release(qp->rq.producer());
  qp->state = qp_state::err;
  disarm_timers(qp);
  if (qp->req.scheduled) {
    qp_t** link = &req_head_;
    qp_t* prev = nullptr;
    while (*link != nullptr && *link != qp) {
      prev = *link;
      link = &(*link)->req.next_ready;
    }
    if (*link == qp) {
      *link = qp->req.next_ready;
      if (req_tail_ == qp) req_tail_ = prev;
    }
  }
  std::erase(ack_ready_, qp);
  std::erase(lazy_acks_, qp);
  // A type-2 window bound through this QP stays bound but no QP can use it
  // (rxe keeps the QP alive behind the window for as long): it must not
  // name a later QP that happens to get this one's memory.
  if (live_mws_ != 0)
    for (auto& w : mws_)
      if (w != nullptr && w->qp == qp) w->qp = nullptr;
  auto drop_cq = [this](cq_t* cq) {
    if (--cq->users == 0 && cq->released) {
      const std::uint32_t i = cq->handle;
      purge_cq_events(cq);
      cqs_[i].reset();
      free_slot(free_cqs_, i);
      --live_cqs_;
    }
  };
  cq_t* scq = qp->scq;
  cq_t* rcq = qp->rcq;
  drop_cq(scq);
  drop_cq(rcq);
  if (srq_t* srq = qp->srq; srq != nullptr && --srq->users == 0 && srq->released) {
    pd_t* spd = srq->pd;
    const std::uint32_t i = srq->handle;
    purge_srq_events(srq);
    srqs_[i].reset();
    free_slot(free_srqs_, i);
    --live_srqs_;
    drop_pd_child(spd);
  }
  pd_t* pd = qp->pd;
  const std::uint32_t index = qp->index;
  purge_qp_events(qp);
  qps_[index].reset();
  free_slot(free_qps_, index);
  --live_qps_;
  drop_pd_child(pd);
}

// ---------------------------------------------------------------------------
// Posting

std::error_code device::post_one_send(qp_t* qp, const send_wr& wr) noexcept {
  const qp_state s = qp->state;
  if (s == qp_state::reset || s == qp_state::init || s == qp_state::rtr) return err(errc::invalid_state);
  if (wr.num_sge > qp->cap.max_send_sge) return err(errc::invalid_argument);
  const auto op = wr.opcode;
  ah_t* ah = nullptr;
  mw_t* mw = nullptr;
  switch (qp->type) {
    case qp_type::ud:
      if (op != wr_opcode::send && op != wr_opcode::send_with_imm) return err(errc::invalid_argument);
      ah = find_ah(engine_ref(wr.ah));
      if (ah == nullptr || ah->pd != qp->pd) return err(errc::invalid_argument);
      break;
    case qp_type::uc:
      if (op != wr_opcode::send && op != wr_opcode::send_with_imm && op != wr_opcode::rdma_write &&
          op != wr_opcode::rdma_write_with_imm && op != wr_opcode::local_inv && op != wr_opcode::bind_mw)
        return err(errc::invalid_argument);
      break;
    case qp_type::rc:
      if (static_cast<unsigned>(op) > static_cast<unsigned>(wr_opcode::send_with_inv) &&
          op != wr_opcode::atomic_write)
        return err(errc::invalid_argument);
      break;
  }
  std::uint64_t length = 0;
  for (std::uint32_t i = 0; i < wr.num_sge; ++i) length += wr.sg_list[i].length;
  const bool atomic = op == wr_opcode::atomic_cmp_and_swp || op == wr_opcode::atomic_fetch_and_add;
  const bool local = op == wr_opcode::local_inv || op == wr_opcode::bind_mw;
  const bool inl = (wr.flags & send_inline) != 0 && !atomic && !local && op != wr_opcode::rdma_read;
  // An inline ATOMIC WRITE's 8 bytes are its operand, as ibv_wr_atomic_write
  // takes them from a pointer: not inline data that max_inline_data bounds.
  if (inl && op != wr_opcode::atomic_write && length > qp->cap.max_inline_data)
    return err(errc::invalid_argument);
  // An ATOMIC WRITE carries its 8 bytes as a payload (inline, or read from
  // the SGEs when sent); like the other atomics it names an aligned word.
  if ((atomic || op == wr_opcode::atomic_write) && (length != 8 || (wr.remote_addr & 7) != 0))
    return err(errc::invalid_argument);
  if ((wr.flags & send_inline) != 0 && (atomic || local || op == wr_opcode::rdma_read))
    return err(errc::invalid_argument);  // inline needs a payload the op carries
  if (op == wr_opcode::bind_mw && (wr.num_sge != 0 || wr.imm_data != 0)) return err(errc::invalid_argument);
  if (length > limits::max_msg_size) return err(errc::message_too_long);
  if (op == wr_opcode::bind_mw) {
    mw = find_mw(engine_ref(wr.bind_mw));
    if (mw == nullptr) return err(errc::invalid_argument);
  }
  if (qp->sq.count() >= std::max<std::uint32_t>(qp->cap.max_send_wr, 1) ||
      (qp->cap.max_send_wr == 0))
    return err(errc::queue_full);

  const std::uint32_t p = qp->sq.producer();
  auto* w = qp->sq.at<send_wqe>(p);
  w->wr_id = wr.wr_id;
  w->opcode = static_cast<std::uint8_t>(op);
  w->mw_type = 0;
  w->num_sge = 0;
  w->inline_len = 0;
  w->ah = 0;
  w->mw = 0;
  w->flags = wr.flags;
  w->imm = wr.imm_data;
  w->length = static_cast<std::uint32_t>(length);
  w->remote_addr = wr.remote_addr;
  w->rkey = wr.rkey;
  w->compare_add = wr.compare_add;
  w->swap = wr.swap;
  w->remote_qpn = wr.remote_qpn & wire::qpn_mask;
  w->remote_qkey = wr.remote_qkey;
  if (ah != nullptr) {
    w->ah = ah->handle;
    w->ah_gen = ah->gen;
  }
  if (mw != nullptr) {
    w->mw_type = 2;
    w->mw = mw->handle;
    w->mw_gen = mw->gen;
    w->bind_rkey = wr.bind_rkey;
    w->bind_lkey = wr.bind_info.mr_lkey;
    w->bind_addr = wr.bind_info.addr;
    w->bind_length = wr.bind_info.length;
    w->bind_access = wr.bind_info.access;
  }
  if (inl) {
    // Inline data is copied now: the caller may reuse its buffers at once.
    std::uint32_t off = 0;
    for (std::uint32_t i = 0; i < wr.num_sge; ++i) {
      const sge& g = wr.sg_list[i];
      if (g.length != 0 && !mem_->read(g.addr, w->inline_data() + off, g.length)) return err(errc::invalid_argument);
      off += g.length;
    }
    w->inline_len = off;
    w->flags |= send_inline;
  } else {
    w->flags &= ~static_cast<std::uint32_t>(send_inline);
    for (std::uint32_t i = 0; i < wr.num_sge; ++i)
      w->sges()[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    w->num_sge = static_cast<std::uint16_t>(wr.num_sge);
  }
  qp->sq_state[p & (qp->sq.size() - 1)] = send_state{};
  qp->sq.publish(p + 1);
  return {};
}

std::error_code device::post_send(qp_t* qp, const send_wr* wrs, std::size_t n, std::size_t* bad) {
  std::lock_guard lock(lock_);
  for (std::size_t k = 0; k < n; ++k) {
    if (std::error_code ec = post_one_send(qp, wrs[k])) {
      if (bad != nullptr) *bad = k;
      if (k != 0) {
        if (qp->state == qp_state::err || qp->state == qp_state::sqe)
          flush_posted(qp);
        else schedule_requester(qp);
        run();
      }
      return ec;
    }
  }
  // Posting to an error QP flushes (IBTA 10.8.3.3), and to the send queue
  // of a QP in SQE.
  if (qp->state == qp_state::err || qp->state == qp_state::sqe)
    flush_posted(qp);
  else schedule_requester(qp);
  run();
  return {};
}

std::error_code device::bind_mw1(qp_t* qp, const object_ref& ref, std::uint64_t wr_id, std::uint32_t flags,
                                 const mw_bind_info& info, std::uint32_t& new_rkey) {
  std::lock_guard lock(lock_);
  mw_t* const mw = find_mw(ref);
  if (mw == nullptr || mw->type != mw_type::type1) return err(errc::invalid_argument);
  // A type-1 window is never zero-based (IBTA o10-36.2.2; rxe's provider
  // refuses it at post time too).
  if ((info.access & access_zero_based) != 0) return err(errc::invalid_argument);
  // libibverbs' ibv_bind_mw(): the region must be in the window's PD (EPERM,
  // at the call); without a region there is nothing to bind a range to.
  if (info.mr_lkey == 0 && (info.addr != 0 || info.length != 0)) return err(errc::invalid_argument);
  if (const mr_t* mr = find_mr(info.mr_lkey); mr != nullptr && mr->pd != mw->pd)
    return err(errc::permission_denied);
  const qp_state s = qp->state;
  if (s == qp_state::reset || s == qp_state::init || s == qp_state::rtr) return err(errc::invalid_state);
  if (qp->type == qp_type::ud) return err(errc::invalid_argument);
  if (qp->sq.count() >= std::max<std::uint32_t>(qp->cap.max_send_wr, 1) || qp->cap.max_send_wr == 0)
    return err(errc::queue_full);  // as post_one_send: the ring has one slot at least
  // The new key is known at once (libibverbs returns it from ibv_bind_mw);
  // the window changes when the bind WQE executes, in order.
  // Each posted bind takes the next key after the last one posted, not
  // after the one in force: binds queued behind other work get distinct
  // keys.
  new_rkey = (mw->posted_rkey & ~0xFFu) | ((mw->posted_rkey + 1) & 0xFF);
  const std::uint32_t p = qp->sq.producer();
  auto* w = qp->sq.at<send_wqe>(p);
  std::memset(w, 0, sizeof *w);
  w->wr_id = wr_id;
  w->opcode = static_cast<std::uint8_t>(wr_opcode::bind_mw);
  w->mw_type = 1;
  w->flags = flags & (send_signaled | send_fence);
  w->mw = mw->handle;
  w->mw_gen = mw->gen;
  w->bind_rkey = new_rkey;
  w->bind_lkey = info.mr_lkey;
  w->bind_addr = info.addr;
  w->bind_length = info.length;
  w->bind_access = info.access;
  qp->sq_state[p & (qp->sq.size() - 1)] = send_state{};
  qp->sq.publish(p + 1);
  mw->posted_rkey = new_rkey;
  if (qp->state == qp_state::err || qp->state == qp_state::sqe)
    flush_posted(qp);
  else schedule_requester(qp);
  run();
  return {};
}

std::error_code device::post_recv(qp_t* qp, const recv_wr* wrs, std::size_t n, std::size_t* bad) {
  std::lock_guard lock(lock_);
  for (std::size_t k = 0; k < n; ++k) {
    const recv_wr& wr = wrs[k];
    std::error_code ec;
    if (qp->srq != nullptr) ec = err(errc::invalid_argument);
    else if (qp->state == qp_state::reset) ec = err(errc::invalid_state);
    else if (wr.num_sge > qp->cap.max_recv_sge) ec = err(errc::invalid_argument);
    else if (recv_length(wr) > limits::max_msg_size)
      ec = err(errc::message_too_long);
    else if (qp->rq.count() >= qp->cap.max_recv_wr) ec = err(errc::queue_full);
    if (ec) {
      if (bad != nullptr) *bad = k;
      if (qp->state == qp_state::err) flush_qp(qp);
      return ec;
    }
    const std::uint32_t p = qp->rq.producer();
    auto* w = qp->rq.at<recv_wqe>(p);
    w->wr_id = wr.wr_id;
    w->num_sge = wr.num_sge;
    for (std::uint32_t i = 0; i < wr.num_sge; ++i)
      w->sges()[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    qp->rq.publish(p + 1);
  }
  if (qp->state == qp_state::err) flush_qp(qp);
  return {};
}

}  // namespace averbs::soft
