// SPDX-License-Identifier: MIT
// The RC/UC/UD transport: requester (rxe_req.c), responder (rxe_resp.c) and
// completer (rxe_comp.c), one packet at a time.  IBTA vol. 1 chapter 9
// section numbers are given where a rule comes from the specification.
#include "soft/engine.hpp"

#include <averbs/error.hpp>

#include <algorithm>
#include <cstring>

namespace averbs::soft {

namespace {

using wire::opcode;

constexpr std::uint32_t psn_add(std::uint32_t psn, std::uint32_t n) { return (psn + n) & wire::psn_mask; }
constexpr bool psn_before(std::uint32_t a, std::uint32_t b) { return wire::psn_compare(a, b) < 0; }
// Whether an RC packet at `psn` fits the unacknowledged PSN window.
bool in_window(const qp_t* qp, std::uint32_t psn) {
  return psn_before(psn, psn_add(qp->comp.psn, limits::max_unacked_psns));
}

bool is_read(std::uint8_t op) { return op == static_cast<std::uint8_t>(wr_opcode::rdma_read); }
bool is_atomic(std::uint8_t op) {
  return op == static_cast<std::uint8_t>(wr_opcode::atomic_cmp_and_swp) ||
         op == static_cast<std::uint8_t>(wr_opcode::atomic_fetch_and_add);
}
bool is_atomic_write(std::uint8_t op) { return op == static_cast<std::uint8_t>(wr_opcode::atomic_write); }
// READs and atomics, ATOMIC WRITE included, take an initiator-depth credit
// (max_rd_atomic) and a responder resource, and are answered by a response
// of their own (rxe counts ATOMIC WRITE the same way).
bool takes_rd_credit(std::uint8_t op) { return is_read(op) || is_atomic(op) || is_atomic_write(op); }

std::uint32_t packets_for(std::uint32_t length, std::uint32_t mtu) {
  return length == 0 ? 1 : (length + mtu - 1) / mtu;
}

// The PSNs WQE `w` takes.  (A UD send is one packet, whatever its length:
// it has no path MTU.)
std::uint32_t packets_of(const qp_t* qp, const send_wqe* w) {
  return is_atomic(w->opcode) || is_atomic_write(w->opcode) || qp->type == qp_type::ud
             ? 1
             : packets_for(w->length, qp->mtu_bytes);
}

// Every PSN a WQE takes stays within half the PSN space of the oldest
// unacknowledged one (IBTA's valid region), or PSN comparisons turn
// around: a READ takes one per response, 2^23 for 2 GiB at PMTU 256.  A
// WQE of `n` PSNs that would not waits for the ACKs before it; alone it
// may take them all.
bool past_half_psn_space(const qp_t* qp, std::uint32_t n) {
  return qp->type == qp_type::rc && qp->comp.psn != qp->req.next_psn &&
         ((qp->req.next_psn - qp->comp.psn) & wire::psn_mask) + std::uint64_t{n} >= (1u << 23);
}

// The opcode of the next packet of a SEND or WRITE message (IBTA 9.4,
// rxe next_opcode_rc/uc).
std::uint8_t data_opcode(qp_type t, wr_opcode op, bool first, bool last) {
  const std::uint8_t base = t == qp_type::uc ? 0x20 : 0x00;
  const bool write = op == wr_opcode::rdma_write || op == wr_opcode::rdma_write_with_imm;
  const bool imm = op == wr_opcode::rdma_write_with_imm || op == wr_opcode::send_with_imm;
  const bool inv = op == wr_opcode::send_with_inv;
  std::uint8_t o;
  if (write) {
    if (first && last) o = imm ? 0x0B : 0x0A;
    else if (first) o = 0x06;
    else if (last) o = imm ? 0x09 : 0x08;
    else o = 0x07;
  } else {
    if (first && last) o = imm ? 0x05 : inv ? 0x17 : 0x04;
    else if (first) o = 0x00;
    else if (last) o = imm ? 0x03 : inv ? 0x16 : 0x02;
    else o = 0x01;
  }
  return static_cast<std::uint8_t>(base + o);
}

}  // namespace

// ---------------------------------------------------------------------------
// Packet helpers

packet* device::new_packet(qp_t* qp, wire::opcode op, std::uint32_t psn) noexcept {
  packet* p = alloc_packet();
  if (p == nullptr) return nullptr;
  // Only the BTH is reset: encode() reads just the extension headers the
  // opcode carries, and each sender sets those.
  p->hdr.bth = wire::bth{};
  p->hdr.bth.opcode = static_cast<std::uint8_t>(op);
  p->hdr.bth.dest_qp = qp->dest_qpn;
  p->hdr.bth.psn = psn & wire::psn_mask;
  p->src = qp->sgid;
  p->dst = qp->av.grh.dgid;
  p->sport = qp->sport;
  p->hop_limit = qp->av.grh.hop_limit;
  p->tclass = qp->av.grh.traffic_class;
  return p;
}

void device::finish_packet(qp_t* qp, packet* p) noexcept {
  p->op = &wire::info(p->hdr.bth.opcode);
  (void)qp;
  p->hdr.bth.pad = wire::pad_for(p->payload_len);
  p->header_len = static_cast<std::uint8_t>(wire::encode(p->hdr, p->header));
  transmit(p);
}

// A positive ACK waits until the receive queue drains, so one ACK covers a
// burst (IBTA 9.7.5.1.2: an ACK acknowledges every earlier PSN).  Anything
// else the responder sends goes after it.
void device::flush_ack(qp_t* qp) noexcept {
  if (!qp->resp.ack_pending && !qp->resp.ack_lazy) return;
  qp->resp.ack_pending = false;
  qp->resp.ack_lazy = false;
  packet* p = new_packet(qp, opcode::rc_ack, qp->resp.last_ack_psn);
  if (p == nullptr) return;
  p->hdr.aeth.syndrome = wire::aeth_ack_unlimited;
  p->hdr.aeth.msn = qp->resp.msn & 0xFFFFFF;
  finish_packet(qp, p);
}

void device::send_held_ack(qp_t* qp) noexcept {
  if (!qp->resp.ack_pending && !qp->resp.ack_lazy) return;
  flush_ack(qp);
  link_->flush();
}

void device::flush_acks() noexcept {
  for (qp_t* qp : ack_ready_) {
    qp->resp.ack_listed = false;
    flush_ack(qp);
  }
  ack_ready_.clear();
}

// Lists the QP for flush_acks(), once however often its ACK was sent
// meanwhile (a READ, an atomic or a NAK sends it first, flush_ack, and
// leaves the entry): the list then never outgrows the room create_qp
// reserved for every QP.
void device::list_ack(qp_t* qp) noexcept {
  qp->resp.ack_pending = true;
  if (qp->resp.ack_listed) return;
  qp->resp.ack_listed = true;
  ack_ready_.push_back(qp);
}

// Packets that did not ask for an ACK are acknowledged lazily, on every
// link: by the next ACK the QP sends anyway (one covers every earlier
// PSN), or after `lazy_ack_delay`, well inside any retransmission timeout.
// A ping-pong of unsignaled sends then costs one datagram per message, not
// two.
void device::queue_lazy_ack(qp_t* qp) noexcept {
  if (qp->resp.ack_pending || qp->resp.ack_lazy) return;
  // Listed once until the timer drains the list, however often an ACK the
  // QP sent anyway (flush_ack) settled its lazy one meanwhile.  create_qp
  // reserved the room.
  if (!qp->resp.lazy_listed) {
    try {
      lazy_acks_.push_back(qp);
    } catch (...) {
      list_ack(qp);  // no room to wait: acknowledge with the burst
      return;
    }
    qp->resp.lazy_listed = true;
  }
  qp->resp.ack_lazy = true;
  if (lazy_timer_pending_) return;
  lazy_timer_pending_ = true;
  if (!schedule_timer(deadline_after(clock_->now(), lazy_ack_delay),
                      [](void* arg, const detail::timer_payload&) noexcept {
                        static_cast<device*>(arg)->on_lazy_ack_timer();
                      },
                      this, {}))
    on_lazy_ack_timer();
}

void device::on_lazy_ack_timer() noexcept {
  lazy_timer_pending_ = false;
  for (qp_t* qp : lazy_acks_) {
    qp->resp.lazy_listed = false;
    if (qp->resp.ack_lazy) flush_ack(qp);
  }
  lazy_acks_.clear();
  link_->flush();
}

// IBTA 9.7.5.2.8: the request at `psn` found no receive.  It also stands
// for the one NAK of the gap that follows it while that gap holds the
// packets the requester pipelined behind the refused one: a rising run
// from `psn` + 1 that began before the RNR time had passed (the requester
// may not resend before, C9-125) and at least rnr_pipeline_time (a
// pipeline read late behind a short RNR time), however long it lasts.  A
// packet past the gap that repeats the run, or comes later without
// continuing it, follows a resend that was lost, and gets its NAK at once
// (rxe NAKs every gap; without this the requester found out only when it
// stopped and probed).
void device::send_rnr_nak(qp_t* qp, std::uint32_t psn) noexcept {
  send_ack(qp, wire::aeth_rnr_nak(qp->min_rnr_timer), psn);
  ++counters_.rnr_naks_sent;
  qp->resp.nak_sent = true;
  qp->resp.nak_count = 0;
  qp->resp.rnr_seen = false;
  qp->resp.rnr_nak = true;
  const auto wait = std::max<std::chrono::nanoseconds>(
      std::chrono::nanoseconds(wire::rnr_timer_ns(qp->min_rnr_timer)), rnr_pipeline_time);
  qp->resp.rnr_until = deadline_after(pass_now(), wait);
}

void device::send_ack(qp_t* qp, std::uint8_t syndrome, std::uint32_t psn) noexcept {
  flush_ack(qp);
  packet* p = new_packet(qp, opcode::rc_ack, psn);
  if (p == nullptr) return;
  p->hdr.aeth.syndrome = syndrome;
  p->hdr.aeth.msn = qp->resp.msn & 0xFFFFFF;
  finish_packet(qp, p);
}

// The answer to an ATOMIC WRITE: a READ Response Only without payload,
// as rxe sends it.
void device::send_empty_read_response(qp_t* qp, std::uint32_t psn) noexcept {
  flush_ack(qp);
  packet* p = new_packet(qp, opcode::rc_read_response_only, psn);
  if (p == nullptr) return;
  p->hdr.aeth.syndrome = wire::aeth_ack_unlimited;
  p->hdr.aeth.msn = qp->resp.msn & 0xFFFFFF;
  finish_packet(qp, p);
}

void device::send_atomic_ack(qp_t* qp, std::uint32_t psn, std::uint64_t orig) noexcept {
  flush_ack(qp);
  packet* p = new_packet(qp, opcode::rc_atomic_ack, psn);
  if (p == nullptr) return;
  p->hdr.aeth.syndrome = wire::aeth_ack_unlimited;
  p->hdr.aeth.msn = qp->resp.msn & 0xFFFFFF;
  p->hdr.atomic_ack = orig;
  finish_packet(qp, p);
}

// Gathers `len` bytes starting `offset` bytes into an SGE list (local
// memory, any access) into the packet: by reference when it takes at most
// packet::max_segs pieces of mapped memory, else copied into p->buf.
bool device::copy_from_sges(pd_t* pd, wqe_sge* sges, std::uint32_t nsge, std::uint32_t offset,
                            std::uint32_t len, packet* p) noexcept {
  p->nsegs = 0;
  p->payload_len = len;
  if (len == 0) return true;
  if (nsge == 1) {  // the common case, without the general walk
    const wqe_sge& g = sges[0];
    mr_t* mr = lookup_lkey(pd, g.lkey);
    if (mr == nullptr || g.addr < mr->iova || g.length > mr->length || g.addr - mr->iova > mr->length - g.length ||
        offset > g.length || len > g.length - offset)
      return false;
    if (mr->host != nullptr) {
      p->segs[0] = {mr->host + (g.addr - mr->iova) + offset, len};
      p->nsegs = 1;
      return true;
    }
  }
  std::uint32_t i = 0;
  while (i < nsge && offset >= sges[i].length) offset -= sges[i++].length;
  bool by_ref = true;
  std::uint32_t copied = 0;
  std::uint32_t left = len;
  while (left > 0) {
    if (i >= nsge) return false;
    const wqe_sge& g = sges[i];
    if (g.length == 0) {  // no memory named: its key is not looked at (rxe's copy_data)
      ++i;
      continue;
    }
    const std::uint32_t take = std::min(left, g.length - offset);
    mr_t* mr = lookup_lkey(pd, g.lkey);
    if (mr == nullptr || g.addr < mr->iova || g.length > mr->length || g.addr - mr->iova > mr->length - g.length)
      return false;
    const std::uint64_t host_addr = mr->host_addr + (g.addr - mr->iova) + offset;
    std::byte* host = mr->host != nullptr ? mr->host + (g.addr - mr->iova) + offset : nullptr;
    if (by_ref && host != nullptr && p->nsegs < packet::max_segs) {
      p->segs[p->nsegs++] = {host, take};
    } else {
      if (by_ref) {
        // Switch to copying: bring what was referenced into the buffer.
        for (std::uint8_t k = 0; k < p->nsegs; ++k) {
          std::memcpy(p->buf + copied, p->segs[k].p, p->segs[k].len);
          copied += p->segs[k].len;
        }
        by_ref = false;
      }
      if (host != nullptr) std::memcpy(p->buf + copied, host, take);
      else if (!mem_->read(host_addr, p->buf + copied, take)) return false;
      copied += take;
    }
    left -= take;
    offset = 0;
    ++i;
  }
  if (!by_ref) {
    p->segs[0] = {p->buf, copied};
    p->nsegs = 1;
  }
  return true;
}

namespace {

// Walks a packet's payload segments.
struct payload_reader {
  const packet* p;
  std::uint8_t seg = 0;
  std::uint32_t off = 0;
  void skip(std::uint32_t n) {
    while (n > 0 && seg < p->nsegs) {
      const std::uint32_t t = std::min(n, p->segs[seg].len - off);
      n -= t;
      off += t;
      if (off == p->segs[seg].len) {
        ++seg;
        off = 0;
      }
    }
  }
  // Copies n bytes to dst (host) or through write_fn.
  template <class Sink>
  void copy(std::uint32_t n, Sink&& sink) {
    std::uint32_t done = 0;
    while (n > 0 && seg < p->nsegs) {
      const std::uint32_t t = std::min(n, p->segs[seg].len - off);
      sink(done, p->segs[seg].p + off, t);
      done += t;
      n -= t;
      off += t;
      if (off == p->segs[seg].len) {
        ++seg;
        off = 0;
      }
    }
  }
};

}  // namespace

// (memmove, here and in copy_to_sges: in one process a packet's payload
// can be the very memory it is written to -- a buffer written to itself,
// a receive overlapping its SEND -- and IBTA's "undefined data" must not
// be C++'s undefined behaviour.  It costs what memcpy does.)
bool device::write_host(std::byte* host, std::uint64_t addr, const packet* p, std::uint32_t skip,
                        std::uint32_t len) noexcept {
  if (host != nullptr && p->nsegs == 1 && skip + len <= p->segs[0].len) {
    std::memmove(host, p->segs[0].p + skip, len);
    return true;
  }
  payload_reader r{p};
  r.skip(skip);
  bool ok = true;
  r.copy(len, [&](std::uint32_t at, const std::byte* src, std::uint32_t n) {
    if (host != nullptr)
      std::memmove(host + at, src, n);
    else
      ok = ok && mem_->write(addr + at, src, n);
  });
  return ok;
}

// Scatters payload bytes [skip, skip + len) into an SGE list at `offset`;
// every MR must allow local write.  False on a bad key, bounds, access, or
// when the list is too short.
bool device::copy_to_sges(pd_t* pd, wqe_sge* sges, std::uint32_t nsge, std::uint32_t offset, const packet* p,
                          std::uint32_t skip, std::uint32_t len) noexcept {
  std::uint32_t i = 0;
  while (i < nsge && offset >= sges[i].length) offset -= sges[i++].length;
  payload_reader r{p};
  r.skip(skip);
  while (len > 0) {
    if (i >= nsge) return false;
    const wqe_sge& g = sges[i];
    if (g.length == 0) {  // no memory named: its key is not looked at (rxe's copy_data)
      ++i;
      continue;
    }
    const std::uint32_t take = std::min(len, g.length - offset);
    mr_t* mr = lookup_lkey(pd, g.lkey);
    if (mr == nullptr || (mr->access & access_local_write) == 0 || g.addr < mr->iova || g.length > mr->length ||
        g.addr - mr->iova > mr->length - g.length)
      return false;
    std::byte* host = mr->host != nullptr ? mr->host + (g.addr - mr->iova) + offset : nullptr;
    const std::uint64_t host_addr = mr->host_addr + (g.addr - mr->iova) + offset;
    bool ok = true;
    r.copy(take, [&](std::uint32_t at, const std::byte* src, std::uint32_t n) {
      if (host != nullptr)
        std::memmove(host + at, src, n);
      else
        ok = ok && mem_->write(host_addr + at, src, n);
    });
    if (!ok) return false;
    len -= take;
    offset = 0;
    ++i;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Timers: one heap entry per QP at a time; ACK progress only moves the
// deadline field, so the common path costs a clock read, not a syscall.

namespace {
// A QP timer's payload: the QPN and the kind in `a`, the whole 64-bit
// generation in `b` (a QP's generations start at a per-device count << 32,
// so no bit of it is spare).
constexpr std::uint64_t rnr_timer_bit = std::uint64_t{1} << 32;
}  // namespace

void device::add_qp_timer(std::uint32_t qpn, std::uint64_t gen, clock::time_point when, bool rnr) {
  if (timers_.schedule(
          when,
          [](void* arg, const detail::timer_payload& pl) noexcept {
            static_cast<device*>(arg)->on_qp_timer(static_cast<std::uint32_t>(pl.a), pl.b,
                                                   (pl.a & rnr_timer_bit) != 0);
          },
          this, {qpn | (rnr ? rnr_timer_bit : 0), gen, {}}, &device::qp_timer_alive))
    rearm_timer_fd();
}

bool device::qp_timer_alive(void* arg, const detail::timer_payload& p) noexcept {
  const qp_t* qp = static_cast<device*>(arg)->qp_by_number(static_cast<std::uint32_t>(p.a));
  return qp != nullptr && qp->comp.timer_gen == p.b;
}

void device::schedule_qp_timer(qp_t* qp, clock::time_point when, bool rnr) noexcept {
  try {
    add_qp_timer(qp->qpn, qp->comp.timer_gen, when, rnr);
  } catch (...) {
    // No memory for the heap entry.  Dropped, it would leave the QP waiting
    // for a retransmission or RNR retry that never comes; the next pass of
    // run() schedules it again (recover_stalled_qps).  One per QP is
    // enough: a QP has one live timer at a time (RNR waiting disarms the
    // retransmit timer), and a later one replaces an earlier.
    if (!qp->comp.timer_lost) ++lost_timers_;
    ++counters_.timers_lost;
    qp->comp.timer_lost = true;
    qp->comp.lost_rnr = rnr;
    qp->comp.lost_gen = qp->comp.timer_gen;
    qp->comp.lost_when = when;
    signal_pending();
  }
}

// At the start of a pass, with no QP half-way through anything, the QPs a
// shortage of memory stopped get a second chance.  A starved requester
// (starve()) is scheduled again.  A lost timer gets a heap entry; if there
// is still no memory the QP cannot keep its retry promise and fails as a
// QP whose resources ran out does: IBV_EVENT_QP_FATAL, the oldest WQE
// completes with fatal_err, the rest are flushed.
void device::recover_stalled_qps() noexcept {
  lost_timers_ = 0;
  starved_requesters_ = 0;
  for (const auto& slot : qps_) {
    qp_t* qp = slot.get();
    if (qp == nullptr) continue;
    if (std::exchange(qp->req.starved, false)) schedule_requester(qp);
    if (!qp->comp.timer_lost) continue;
    qp->comp.timer_lost = false;
    // Disarmed since (reset, error, progress that ended the RNR wait): the
    // lost entry would have been stale.
    if (qp->comp.lost_gen != qp->comp.timer_gen) continue;
    if (qp->state != qp_state::rts && qp->state != qp_state::sqd) continue;
    try {
      add_qp_timer(qp->qpn, qp->comp.lost_gen, qp->comp.lost_when, qp->comp.lost_rnr);
    } catch (...) {
      raise_event(qp->pd->events, event_type::qp_fatal, qp->qpn);
      fail_oldest(qp, wc_status::fatal_err);
    }
  }
}

// No packet buffer for the requester's next packet (no memory): it stops,
// and the next pass of run() lets it try again.  Nothing else would: a
// WQE that has taken its PSNs but sent nothing has no retransmit timer,
// and a UC or UD send queue has none at all.
bool device::starve(qp_t* qp) noexcept {
  if (!qp->req.starved) ++starved_requesters_;
  qp->req.starved = true;
  signal_pending();
  return false;
}

// The link's send buffer is full (link::send_blocked()): the QP's turn
// waits for the next pass, as a starved one's, but with no wake-up: the
// link's retry timer or the next poll runs that pass.
void device::park(qp_t* qp) noexcept {
  if (!qp->req.starved) ++starved_requesters_;
  qp->req.starved = true;
}

void device::arm_retry_timer(qp_t* qp) noexcept {
  if (qp->type != qp_type::rc || qp->timeout == 0) return;  // timeout 0: no retransmission timer
  qp->comp.deadline = deadline_after(pass_now(), std::chrono::nanoseconds(wire::ack_timeout_ns(qp->timeout)));
  qp->comp.timer_armed = true;
  if (!qp->comp.timer_scheduled) {
    qp->comp.timer_scheduled = true;
    schedule_qp_timer(qp, qp->comp.deadline, false);
  }
}

// The retransmit deadline runs from the oldest unacknowledged request; but
// while a go-back-N burst is resent it moves with each packet, as rxe's
// per-packet mod_timer does, so a burst that takes longer than the timeout
// to leave (a slow machine, a sanitizer build, a short timeout) does not
// time itself out and start another.  A packet ending at or below
// `sent_psn` was part of such a burst.
void device::note_request_sent(qp_t* qp) noexcept {
  if (!psn_before(qp->req.sent_psn, qp->req.psn)) {
    arm_retry_timer(qp);
  } else {
    qp->req.sent_psn = qp->req.psn;
    if (!qp->comp.timer_armed) arm_retry_timer(qp);
  }
}

// Invalidates every timer of the QP (reset, error, RNR wait).  The heap
// entries stay until their deadlines unless swept: each one left behind is
// counted, so that an RNR loop (a new retransmit timer each round) or QPs
// churned with long timeouts cannot pile them up.
void device::disarm_timers(qp_t* qp) noexcept {
  // (One count per entry, after the generation moved: a sweep the count
  // starts must find these stale.  It starts once the cancelled are half
  // the heap.)
  const int left = int{qp->comp.timer_scheduled} + int{qp->comp.probe_scheduled} + int{qp->comp.rnr_waiting};
  qp->comp.timer_gen++;
  qp->comp.timer_armed = false;
  qp->comp.timer_scheduled = false;
  qp->comp.probe_armed = false;
  qp->comp.probe_scheduled = false;
  qp->comp.probe_due = false;
  for (int i = 0; i < left; ++i) timers_.note_cancelled();
}

// A tail probe (after TCP's tail loss probe; not in IBTA or rxe).  A
// requester that has stopped sending -- its PSN window is full, or its
// send queue empty -- waits for one ACK; if that one is lost, or the last
// packet itself, both ends are silent until the retransmit timeout
// (67 ms at perftest's default of 14).  So when such a last packet
// leaves, a probe is armed for 1/64 of the timeout, and stays armed while
// anything is unacknowledged, progress starting its wait again.  If it
// falls due with no progress, and still none once the link has been read
// (run_due_probes), the packet at the oldest unacknowledged PSN is sent
// again, alone and asking for an ACK, without counting a retry (none with
// retry_cnt 0) and without moving the transmit position (send_probe).  A
// responder that has it answers the duplicate with the newest PSN it took
// in sequence (respond_duplicate); one that had lost it takes it and
// acknowledges exactly it, having dropped what came after: then the
// requester goes back N from there (complete_rx).  An answer that
// acknowledges part of the tail starts the wait for the next probe, which
// finds the hole further on.  Unanswered, another follows after twice the
// wait, limits::max_tail_probes per progress; none moves the retransmit
// deadline, so a silent peer is still counted out by the timer.  A probe the timer heap has no memory
// for is not sent; the timeout remains.  (A late ACK of the tail's first
// packet, not the probe's answer, looks like a hole found: the go-back
// resends what the peer has, which costs bandwidth, not correctness.)
// A READ or atomic at the oldest PSN is probed with its request
// (send_probe), whose responses start at the probed PSN: no hole.
void device::arm_tail_probe(qp_t* qp) noexcept {
  const std::chrono::nanoseconds delay = tail_probe_delay(qp);
  if (delay.count() == 0 || qp->comp.probed) return;  // (one is out: it re-arms itself)
  qp->comp.probe_armed = true;
  qp->comp.probe_psn = qp->comp.psn;
  qp->comp.probe_at = deadline_after(pass_now(), delay);
  if (!qp->comp.probe_scheduled) schedule_tail_probe(qp);  // else it fires earlier and moves on
}

// 1/64 of the retransmit timeout, at least tail_probe_floor; zero (no
// probe) when that is over a quarter of the timeout, with no timer, or
// with no retries allowed.
std::chrono::nanoseconds device::tail_probe_delay(const qp_t* qp) noexcept {
  if (qp->timeout == 0 || qp->retry_cnt == 0) return {};
  const std::chrono::nanoseconds timeout(wire::ack_timeout_ns(qp->timeout));
  const std::chrono::nanoseconds delay = std::max<std::chrono::nanoseconds>(timeout / 64, tail_probe_floor);
  return delay > timeout / 4 ? std::chrono::nanoseconds{} : delay;
}

void device::schedule_tail_probe(qp_t* qp) noexcept {
  try {
    if (timers_.schedule(
            qp->comp.probe_at,
            [](void* arg, const detail::timer_payload& pl) noexcept {
              static_cast<device*>(arg)->on_tail_probe(static_cast<std::uint32_t>(pl.a), pl.b);
            },
            this, {qp->qpn, qp->comp.timer_gen, {}}, &device::qp_timer_alive))
      rearm_timer_fd();
    qp->comp.probe_scheduled = true;
  } catch (...) {
    qp->comp.probe_armed = false;
  }
}

void device::on_tail_probe(std::uint32_t qpn, std::uint64_t gen) noexcept {
  qp_t* qp = qp_by_number(qpn);
  if (qp == nullptr || qp->comp.timer_gen != gen) return;  // stale
  qp->comp.probe_scheduled = false;
  if (!qp->comp.probe_armed) return;
  if (qp->comp.psn == qp->req.next_psn) {  // everything acknowledged: nothing to wait for
    qp->comp.probe_armed = false;
    return;
  }
  const clock::time_point now = clock_->now();
  if (now < qp->comp.probe_at) {  // armed again since
    schedule_tail_probe(qp);
    return;
  }
  consider_tail_probe(qp, now, false);
}

void device::consider_tail_probe(qp_t* qp, clock::time_point now, bool link_read) noexcept {
  // timeout or retry_cnt may have changed since (SQD).
  const std::chrono::nanoseconds delay = tail_probe_delay(qp);
  if ((qp->state != qp_state::rts && qp->state != qp_state::sqd) || delay.count() == 0 ||
      qp->comp.psn == qp->req.next_psn || qp->comp.probes_sent >= limits::max_tail_probes) {
    qp->comp.probe_armed = false;  // nothing to probe, or all went out already: the timer has the rest
    return;
  }
  if (qp->comp.psn != qp->comp.probe_psn || resending(qp) || qp->comp.rnr_waiting) {
    // Progress since (the rest of the tail may still be lost), or a
    // resend under way: wait again from now.
    qp->comp.probe_psn = qp->comp.psn;
    qp->comp.probe_at = deadline_after(now, delay);
    if (!qp->comp.probe_scheduled) schedule_tail_probe(qp);
    return;
  }
  // No answer to the last probe: the next waits twice as long as it did.
  if (qp->comp.probes_sent != 0) {
    const clock::time_point next =
        deadline_after(qp->comp.probe_sent_at, delay * (1 << qp->comp.probes_sent));
    if (now < next) {
      qp->comp.probe_at = next;
      if (!qp->comp.probe_scheduled) schedule_tail_probe(qp);
      return;
    }
  }
  if (!link_read) {
    if (!qp->comp.probe_due) ++probes_due_;
    qp->comp.probe_due = true;
    qp->comp.probe_poll_mark = link_polls_;
    return;
  }
  if (now < qp->comp.probe_at) {  // armed again while it waited for the link
    if (!qp->comp.probe_scheduled) schedule_tail_probe(qp);
    return;
  }
  const std::uint8_t sent = qp->comp.probes_sent;
  send_probe(qp);
  // Not sent: a READ's or atomic's request not out yet, or no packet buffer.
  if (qp->comp.probes_sent == sent) {
    qp->comp.probe_armed = false;
    return;
  }
  // Armed on: an answer that acknowledges part of the tail (the probe was
  // a duplicate, the hole is further on) starts the wait for the next; no
  // answer, the next probe after twice the wait (above).
  qp->comp.probe_sent_at = now;
  qp->comp.probe_psn = qp->comp.psn;
  qp->comp.probe_at = deadline_after(now, delay);
  if (!qp->comp.probe_scheduled) schedule_tail_probe(qp);
}

// At the end of a pass with nothing queued: the probes that fell due
// before the link was last read, and still have no answer.
void device::run_due_probes() noexcept {
  std::uint32_t left = 0;
  for (const auto& slot : qps_) {
    qp_t* qp = slot.get();
    if (qp == nullptr || !qp->comp.probe_due) continue;
    if (qp->comp.probe_poll_mark == link_polls_) {
      ++left;
      continue;
    }
    qp->comp.probe_due = false;
    if (qp->comp.probe_armed) consider_tail_probe(qp, pass_now(), true);
  }
  probes_due_ = left;
}

// Sends the packet at comp.psn again, asking for an ACK, and leaves the
// transmit position as it was.  For a READ or atomic there (its request
// or its last responses were lost, and nothing behind it answered: a
// later response would have shown the gap) that packet is its request
// again: the READ asks for what has not arrived, an atomic's duplicate is
// answered from the responder's replay cache.  One request, not a
// go-back-N: a responder that was only slow (a process that did not poll)
// then replays one READ, not every one outstanding.
void device::send_probe(qp_t* qp) noexcept {
  std::uint32_t i = 0;
  send_state* oldest = oldest_unfinished(qp, i);
  if (oldest == nullptr) return;
  send_state& st = *oldest;
  const auto* w = qp->sq.at<send_wqe>(i);
  if (psn_before(qp->comp.psn, st.first_psn) || psn_before(st.last_psn, qp->comp.psn)) return;
  const bool rd = takes_rd_credit(w->opcode);
  if (rd && st.state != wqe_state::pending) return;  // its request is not out yet
  const send_state saved = st;
  const qp_t::requester saved_req = qp->req;
  // Nor does it move the retransmit deadline (note_request_sent would, as
  // for a resend): the timeout still counts from the last real progress.
  const clock::time_point saved_deadline = qp->comp.deadline;
  const bool timer_was_armed = qp->comp.timer_armed;
  st.sent =
      std::min<std::uint32_t>(((qp->comp.psn - st.first_psn) & wire::psn_mask) * qp->mtu_bytes, w->length);
  st.state = wqe_state::processing;
  qp->comp.probed = true;  // before sending: the packet may re-arm (arm_tail_probe)
  qp->req.probing = true;
  const std::uint64_t before = counters_.packets_sent;
  (void)send_packet_of(qp, i);
  qp->req.probing = false;
  if (qp->state == qp_state::err || st.state == wqe_state::done) return;  // it failed (its memory is gone)
  st = saved;
  qp->req.psn = saved_req.psn;
  qp->req.wqe_index = saved_req.wqe_index;
  qp->req.noack_pkts = saved_req.noack_pkts;
  qp->req.last_unasked = saved_req.last_unasked;
  qp->req.sent_psn = saved_req.sent_psn;
  if (timer_was_armed) qp->comp.deadline = saved_deadline;  // its heap entry is due no later
  if (counters_.packets_sent != before) {
    ++counters_.tail_probes;
    ++qp->comp.probes_sent;
    qp->comp.probe_read = rd;
  } else {
    qp->comp.probed = qp->comp.probes_sent != 0;  // no packet buffer: the timer remains
  }
}

void device::on_qp_timer(std::uint32_t qpn, std::uint64_t gen, bool rnr) noexcept {
  qp_t* qp = qp_by_number(qpn);
  if (qp == nullptr || qp->comp.timer_gen != gen) return;  // stale timer
  if (qp->state != qp_state::rts && qp->state != qp_state::sqd) return;
  if (rnr) {
    if (!qp->comp.rnr_waiting) return;
    qp->comp.rnr_waiting = false;
    retry(qp, false);
  } else {
    qp->comp.timer_scheduled = false;
    if (!qp->comp.timer_armed) return;
    if (clock_->now() < qp->comp.deadline) {  // progress moved the deadline
      qp->comp.timer_scheduled = true;
      schedule_qp_timer(qp, qp->comp.deadline, false);
      return;
    }
    qp->comp.timer_armed = false;
    if (qp->comp.psn == qp->req.next_psn) return;  // nothing outstanding
    ++counters_.retry_timeouts;
    // The newest packet did not ask for an ACK (an unsignaled message's
    // last, left to a lazy ACK): a responder that acknowledges only what
    // asks, as rxe's, may be alive and silent.  The first such timeout
    // since progress resends without counting it, every last packet now
    // asking (a duplicate is acknowledged again); a dead peer is still
    // counted out by the next.
    if (qp->req.last_unasked && !qp->comp.ask_all && !link_->peers_ack_unasked()) {
      qp->comp.ask_all = true;
      retry(qp, false);
    } else {
      retry(qp, true);
    }
  }
  run();
}

// Go back N from comp.psn (IBTA 9.7.6.2.2): move the transmit position of
// every started, unfinished WQE back so that transmission resumes at the
// first unacknowledged PSN.  PSN ranges do not change.
void device::retry(qp_t* qp, bool count) noexcept {
  if (count) {
    if (qp->comp.retry_left == 0) {
      fail_oldest(qp, wc_status::retry_exc_err);
      return;
    }
    --qp->comp.retry_left;
    qp->comp.retry_counted = true;
  }
  ++counters_.retransmits;
  // The transmit position goes back; the burst is under way until it
  // reaches `sent_psn` again (resending()).
  qp->req.psn = qp->comp.psn;
  const std::uint32_t mask = qp->sq.size() - 1;
  const std::uint32_t mtu = qp->mtu_bytes;
  std::uint32_t resume = qp->req.start_index;
  for (std::uint32_t i = qp->sq.consumer(); i != qp->req.start_index; ++i) {
    send_state& st = qp->sq_state[i & mask];
    if (st.state == wqe_state::done || st.state == wqe_state::posted) continue;
    auto* w = qp->sq.at<send_wqe>(i);
    const bool rd = takes_rd_credit(w->opcode);
    if (!rd && psn_before(st.last_psn, qp->comp.psn)) {
      st.state = wqe_state::done;  // acknowledged in full
      st.status = wc_status::success;
      continue;
    }
    if (!rd) {
      // Resume at comp.psn inside this WQE, or resend it whole.
      const std::uint32_t skip = psn_before(st.first_psn, qp->comp.psn) ? (qp->comp.psn - st.first_psn) & wire::psn_mask : 0;
      st.sent = std::min<std::uint32_t>(skip * mtu, w->length);
    }
    // READs re-request what has not arrived (read_done); atomics resend.
    st.state = wqe_state::processing;
    if (static_cast<std::int32_t>(i - resume) < 0 || resume == qp->req.start_index) resume = i;
  }
  qp->req.wqe_index = resume;
  qp->req.noack_pkts = 0;
  schedule_requester(qp);
}

// A response is missing (a later one arrived first): go back once.  Until
// comp.psn moves, further out-of-order responses of the old stream are
// ignored; if the rewound requests are lost too, the timer retries.
void device::gap_retry(qp_t* qp) noexcept {
  if (qp->comp.gap_retry) return;
  qp->comp.gap_retry = true;
  retry(qp, false);
}

send_state* device::oldest_unfinished(qp_t* qp, std::uint32_t& index) noexcept {
  const std::uint32_t mask = qp->sq.size() - 1;
  for (std::uint32_t i = qp->sq.consumer(); i != qp->req.start_index; ++i) {
    send_state& st = qp->sq_state[i & mask];
    if (st.state == wqe_state::done) continue;
    index = i;
    return &st;
  }
  return nullptr;
}

// The oldest unfinished WQE fails with `status`; the QP goes to error.
void device::fail_oldest(qp_t* qp, wc_status status) noexcept {
  const std::uint32_t mask = qp->sq.size() - 1;
  for (std::uint32_t i = qp->sq.consumer(); i != qp->sq.producer(); ++i) {
    send_state& st = qp->sq_state[i & mask];
    if (st.state == wqe_state::done) continue;
    st.state = wqe_state::done;
    st.status = status;
    break;
  }
  complete_wqes(qp);
  if (qp->state != qp_state::err) qp_to_error(qp);
}

// ---------------------------------------------------------------------------
// Requester

void device::requester(qp_t* qp) noexcept {
  if (qp->state != qp_state::rts && qp->state != qp_state::sqd) return;
  if (qp->comp.rnr_waiting) return;
  const std::uint32_t mask = qp->sq.size() - 1;
  // A network device sends a few packets per turn (a GSO run's worth),
  // so a pass can end on its time budget soon after (see run()).
  for (auto budget = yield_ ? link_->send_batch() : 64; budget > 0; --budget) {
    const std::uint32_t i = qp->req.wqe_index;
    if (i == qp->sq.producer()) return;
    send_state& st = qp->sq_state[i & mask];
    auto* w = qp->sq.at<send_wqe>(i);
    // Nothing after a WQE that failed here is started: the QP goes to ERR
    // when the failure is retired, in order (IBTA 10.8.3), and a resend
    // from an earlier PSN stops here too.
    if (st.state == wqe_state::done && st.status != wc_status::success) return;
    if (st.state == wqe_state::done || st.state == wqe_state::pending) {
      ++qp->req.wqe_index;
      continue;
    }
    const auto op = static_cast<wr_opcode>(w->opcode);
    if (st.state == wqe_state::posted) {
      if (qp->state == qp_state::sqd) return;  // draining: start nothing new (IBTA 10.3.1)
      if (op == wr_opcode::local_inv || op == wr_opcode::bind_mw) {
        // Local operations execute when everything before them is done.
        if (qp->sq.consumer() != i) return;
        std::error_code ec =
            op == wr_opcode::local_inv ? invalidate_rkey(qp->pd, w->imm, qp, false) : bind_mw(qp, w);
        st.state = wqe_state::done;
        st.status = ec ? static_cast<wc_status>(ec.value()) : wc_status::success;
        // A failed invalidation is a local QP operation error, as rxe
        // reports it; a failed bind is mw_bind_err.
        if (ec && (op == wr_opcode::local_inv || ec.category() != wc_category())) st.status = wc_status::loc_qp_op_err;
        ++qp->req.wqe_index;
        ++qp->req.start_index;
        complete_wqes(qp);
        if (qp->state != qp_state::rts && qp->state != qp_state::sqd) return;  // ERR, or SQE (UC)
        continue;
      }
      const bool rd = takes_rd_credit(w->opcode);
      if ((w->flags & send_fence) != 0 && qp->req.rd_atomic > 0) return;  // fence: wait for READ/atomics
      if (rd && qp->max_rd_atomic == 0) {
        // No initiator depth: a READ or atomic cannot be issued (IBTA 10.3.2).
        st.state = wqe_state::done;
        st.status = wc_status::loc_qp_op_err;
        ++qp->req.start_index;
        complete_wqes(qp);
        return;
      }
      if (rd && qp->req.rd_atomic >= qp->max_rd_atomic) return;
      if (qp->type == qp_type::rc && !in_window(qp, qp->req.next_psn)) return;  // window full
      const std::uint32_t n = packets_of(qp, w);
      if (past_half_psn_space(qp, n)) return;
      st.first_psn = qp->req.next_psn;
      st.last_psn = psn_add(st.first_psn, n - 1);
      qp->req.next_psn = psn_add(st.last_psn, 1);
      st.sent = 0;
      st.read_done = 0;
      st.state = wqe_state::processing;
      ++qp->req.start_index;
      if (rd) ++qp->req.rd_atomic;
    }
    if (!send_packet_of(qp, i)) return;
  }
  schedule_requester(qp);  // budget spent: let responses in first
}

// Sends the next packet of WQE `i`; false if the requester must stop.
bool device::send_packet_of(qp_t* qp, std::uint32_t i) noexcept {
  const std::uint32_t mask = qp->sq.size() - 1;
  send_state& st = qp->sq_state[i & mask];
  auto* w = qp->sq.at<send_wqe>(i);
  const auto op = static_cast<wr_opcode>(w->opcode);
  // UD has no path MTU: a message fits the port's (rxe: the netdev's).
  const std::uint32_t mtu = qp->type == qp_type::ud ? mtu_bytes(active_mtu_) : qp->mtu_bytes;

  auto fail = [&](wc_status s) {
    st.state = wqe_state::done;
    st.status = s;
    complete_wqes(qp);
    return false;
  };
  // A READ request, an atomic or an ATOMIC WRITE: one packet that asks for
  // its answer and takes `psns` PSNs; the WQE then waits for that answer.
  auto send_request = [&](packet* p, std::uint32_t psns) {
    p->hdr.bth.ack_req = true;
    qp->req.noack_pkts = 0;
    qp->req.last_unasked = false;
    finish_packet(qp, p);
    qp->req.psn = psn_add(qp->req.psn, psns);
    st.state = wqe_state::pending;
    ++qp->req.wqe_index;
    note_request_sent(qp);
    if (requester_stops(qp)) arm_tail_probe(qp);
    return true;
  };

  // The PSN of the next packet follows from the WQE's range and progress.
  std::uint32_t psn;
  if (op == wr_opcode::rdma_read) psn = psn_add(st.first_psn, st.read_done / qp->mtu_bytes);
  else if (is_atomic(w->opcode) || is_atomic_write(w->opcode))
    psn = st.first_psn;
  else psn = psn_add(st.first_psn, st.sent / mtu);
  if (qp->type == qp_type::rc && !in_window(qp, psn)) return false;  // window full: wait for acknowledgements
  if (qp->req.probing && psn != qp->comp.probe_psn) return false;  // a tail probe is one packet
  qp->req.psn = psn;

  if (op == wr_opcode::rdma_read) {
    // A READ asks for what has not arrived yet; its responses start at the
    // PSN that data would have had (IBTA 9.7.6.2.2).
    const std::uint32_t rem = w->length - st.read_done;
    const std::uint32_t n = packets_for(rem, qp->mtu_bytes);
    packet* p = new_packet(qp, opcode::rc_read_request, qp->req.psn);
    if (p == nullptr) return starve(qp);
    p->hdr.reth = {w->remote_addr + st.read_done, w->rkey, rem};
    return send_request(p, n);
  }
  if (is_atomic(w->opcode)) {
    const bool cas = op == wr_opcode::atomic_cmp_and_swp;
    packet* p = new_packet(qp, cas ? opcode::rc_compare_swap : opcode::rc_fetch_add, qp->req.psn);
    if (p == nullptr) return starve(qp);
    p->hdr.atomic = {w->remote_addr, w->rkey, cas ? w->swap : w->compare_add, cas ? w->compare_add : 0};
    return send_request(p, 1);
  }
  if (op == wr_opcode::atomic_write) {
    // One packet: a RETH naming the 8 bytes, and those bytes as its payload
    // (rxe's layout).  Resent alike; the responder's replay cache answers a
    // duplicate without storing again.
    packet* p = new_packet(qp, opcode::rc_atomic_write, qp->req.psn);
    if (p == nullptr) return starve(qp);
    if ((w->flags & send_inline) != 0) {
      p->segs[0] = {w->inline_data(), 8};
      p->nsegs = 1;
      p->payload_len = 8;
    } else if (!copy_from_sges(qp->pd, w->sges(), w->num_sge, 0, 8, p)) {
      free_packet(p);
      return fail(wc_status::loc_prot_err);
    }
    p->hdr.reth = {w->remote_addr, w->rkey, 8};
    return send_request(p, 1);
  }

  // SEND and WRITE families.
  const std::uint32_t remaining = w->length - st.sent;
  if (qp->type == qp_type::ud && w->length > mtu) {
    // rxe completes an oversized UD send without sending it (C10-93.1.1).
    st.state = wqe_state::done;
    st.status = wc_status::success;
    ++qp->req.wqe_index;
    complete_wqes(qp);
    return true;
  }
  const bool first = st.sent == 0;
  const bool last = remaining <= mtu;
  const std::uint32_t run = first || last || qp->type == qp_type::ud || qp->req.probing
                                ? 1
                                : run_length(qp, w, qp->req.psn, remaining);
  const std::uint32_t len = last ? remaining : mtu * run;
  std::uint8_t opc;
  if (qp->type == qp_type::ud) opc = static_cast<std::uint8_t>(op == wr_opcode::send_with_imm ? 0x65 : 0x64);
  else opc = data_opcode(qp->type, op, first, last);
  packet* p = new_packet(qp, static_cast<opcode>(opc), qp->req.psn);
  if (p == nullptr) return starve(qp);
  if (qp->type == qp_type::ud) {
    // The AH as posted: destroyed meanwhile, its slot may hold another
    // (rxe fails the send when its AH is gone, loc_qp_op_err).
    const ah_t* ah = w->ah < ahs_.size() ? ahs_[w->ah].get() : nullptr;
    if (ah == nullptr || ah->gen != w->ah_gen) {
      free_packet(p);
      return fail(wc_status::loc_qp_op_err);
    }
    p->hdr.bth.dest_qp = w->remote_qpn;
    // A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
    p->hdr.deth = {(w->remote_qkey & 0x80000000u) != 0 ? qp->qkey : w->remote_qkey, qp->qpn};
    p->src = ah->sgid;
    p->dst = ah->attr.grh.dgid;
    p->hop_limit = ah->attr.grh.hop_limit;
    p->tclass = ah->attr.grh.traffic_class;
    p->sport = qp->sport;  // rxe: per QP, not per destination
  }
  const auto& inf = wire::info(opc);
  if ((inf.headers & wire::hdr_reth) != 0) p->hdr.reth = {w->remote_addr, w->rkey, w->length};
  if ((inf.headers & wire::hdr_immdt) != 0) p->hdr.imm = w->imm;
  if ((inf.headers & wire::hdr_ieth) != 0) p->hdr.ieth_rkey = w->imm;
  // Solicited Event belongs to SENDs and WRITE with Immediate (IBTA 9.2.3).
  if (last && (w->flags & send_solicited) != 0 && op != wr_opcode::rdma_write) p->hdr.bth.se = true;
  bool fills_window = false;
  if (qp->type == qp_type::rc) {
    // AckReq (IBTA 9.7.5.1.2): on the last packet of a signaled message,
    // as rxe does on every last packet -- an unsignaled one leaves it to
    // the responder's lazy ACK unless the send queue or the PSN window is
    // half used, or a timeout found an unasked tail unacknowledged (a peer
    // such as rxe acknowledges only what asks: see on_qp_timer), or there
    // is no retransmit timer (timeout 0) to find one; every
    // max_pkts_per_ack packets regardless; and on the packet that fills
    // the PSN window.  The requester sends nothing more until an ACK
    // comes, and a MIDDLE packet gets no lazy ACK: without the ask, the
    // loss of the ACK before it (or of a sequence NAK) would leave both
    // ends silent until the retransmit timeout.
    fills_window = psn_add(psn, run) == psn_add(qp->comp.psn, limits::max_unacked_psns);
    bool want = (qp->req.noack_pkts += run) >= limits::max_pkts_per_ack || fills_window || qp->req.probing;
    if (last && !want) {
      want = qp->comp.ask_all || qp->timeout == 0 || (w->flags & send_signaled) != 0 || qp->sq_sig_all ||
             qp->sq.producer() - qp->sq.consumer() >= qp->sq.size() / 2 ||
             ((qp->req.next_psn - qp->comp.psn) & wire::psn_mask) >= limits::max_unacked_psns / 2;
    }
    if (want) {
      p->hdr.bth.ack_req = true;
      qp->req.noack_pkts = 0;
    }
    qp->req.last_unasked = last && !want;
  }
  if ((w->flags & send_inline) != 0) {
    p->segs[0] = {w->inline_data() + st.sent, len};
    p->nsegs = len != 0 ? 1 : 0;
    p->payload_len = len;
  } else if (!copy_from_sges(qp->pd, w->sges(), w->num_sge, st.sent, len, p)) {
    free_packet(p);
    return fail(wc_status::loc_prot_err);
  }
  p->run = static_cast<std::uint16_t>(run);
  if (run > 1) ++counters_.loopback_runs;
  finish_packet(qp, p);
  st.sent += len;
  qp->req.psn = psn_add(qp->req.psn, run);
  if (last) {
    ++qp->req.wqe_index;
    if (qp->type == qp_type::rc) {
      st.state = wqe_state::pending;
    } else {
      // UC and UD complete when sent: nothing will acknowledge them.
      st.state = wqe_state::done;
      st.status = wc_status::success;
      complete_wqes(qp);
    }
  }
  if (qp->type == qp_type::rc) {
    note_request_sent(qp);
    // The requester stops here (the window is full, nothing more is
    // posted, or the next WQE waits): only an answer moves it on.
    if (fills_window || (last && requester_stops(qp))) arm_tail_probe(qp);
  }
  return true;
}

// After the last packet of a request: whether the requester stops here,
// so that only an answer can move it on -- its PSN window is full, nothing
// more is posted, or the next WQE must wait (SQD; a local operation
// behind unfinished work; a fence behind a READ or atomic; a READ or
// atomic past the depth; a WQE that would take PSNs past half the PSN
// space).  Mirrors requester()'s reasons to return.
bool device::requester_stops(qp_t* qp) noexcept {
  if (!in_window(qp, qp->req.next_psn)) return true;
  const std::uint32_t i = qp->req.wqe_index;
  if (i == qp->sq.producer()) return true;
  const send_state& st = qp->sq_state[i & (qp->sq.size() - 1)];
  if (st.state == wqe_state::done && st.status != wc_status::success)
    return true;                                    // nothing starts past a failure
  if (st.state != wqe_state::posted) return false;  // a resend goes on
  if (qp->state == qp_state::sqd) return true;
  const auto* w = qp->sq.at<send_wqe>(i);
  const auto op = static_cast<wr_opcode>(w->opcode);
  if (op == wr_opcode::local_inv || op == wr_opcode::bind_mw) return qp->sq.consumer() != i;
  if ((w->flags & send_fence) != 0 && qp->req.rd_atomic > 0) return true;
  if (takes_rd_credit(w->opcode) && qp->req.rd_atomic >= qp->max_rd_atomic) return true;
  return past_half_psn_space(qp, packets_of(qp, w));
}

std::uint32_t device::run_length(qp_t* qp, send_wqe* w, std::uint32_t psn, std::uint32_t remaining) noexcept {
  const std::uint32_t max = link_->max_run();
  if (max <= 1 || (w->flags & send_inline) != 0 || w->num_sge != 1) return 1;
  // A run's payload is referenced, never copied: the packet's own buffer
  // holds one MTU.
  const mr_t* mr = lookup_lkey(qp->pd, w->sges()[0].lkey);
  if (mr == nullptr || mr->host == nullptr) return 1;
  std::uint32_t n = std::min((remaining - 1) / qp->mtu_bytes, max);  // the MIDDLE packets before the LAST
  if (qp->type == qp_type::rc)
    n = std::min(n, (qp->comp.psn + limits::max_unacked_psns - psn) & wire::psn_mask);  // the window
  return std::max(n, 1u);
}

// ---------------------------------------------------------------------------
// Responder

bool device::next_recv(qp_t* qp) noexcept {
  auto& r = qp->resp;
  if (r.have_wqe) return true;
  if (qp->srq != nullptr) {
    srq_t* srq = qp->srq;
    if (srq->q.empty()) return false;
    const std::uint32_t c = srq->q.consumer();
    r.srq_wqe.resize(srq->q.entry_size());
    std::memcpy(r.srq_wqe.data(), srq->q.at(c), srq->q.entry_size());
    srq->q.release(c + 1);
    r.wqe = reinterpret_cast<recv_wqe*>(r.srq_wqe.data());
    check_srq_limit(srq);
  } else {
    if (qp->rq.empty()) return false;
    r.wqe = qp->rq.at<recv_wqe>(qp->rq.consumer());
  }
  r.have_wqe = true;
  return true;
}

bool device::fail_recv_wqe(qp_t* qp, wc_status status, std::uint32_t src_qp) noexcept {
  work_completion wc;
  wc.wr_id = qp->resp.wqe->wr_id;
  wc.status = status;
  wc.opcode = wc_opcode::recv;
  wc.qp_num = qp->qpn;
  wc.src_qp = src_qp;
  consume_recv(qp);
  return post_cqe(qp->rcq, wc, false);
}

void device::consume_recv(qp_t* qp) noexcept {
  if (qp->srq == nullptr) qp->rq.release(qp->rq.consumer() + 1);
  qp->resp.have_wqe = false;
  qp->resp.wqe = nullptr;
}

namespace {

// Receive WQE capacity in bytes.
std::uint64_t recv_capacity(recv_wqe* w) {
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i < w->num_sge; ++i) n += w->sges()[i].length;
  return n;
}

}  // namespace

// The Q_Key was checked with the headers (device::run).
void device::respond_ud(qp_t* qp, packet* p) noexcept {
  if (!next_recv(qp)) {
    ++counters_.dropped;  // UD has no RNR: the datagram is lost
    return;
  }
  recv_wqe* w = qp->resp.wqe;
  if (recv_capacity(w) < 40ull + p->payload_len) {
    // It does not fit behind the 40-byte GRH area.  A receive of the QP's
    // own stays for the next datagram (IBTA class D: silently dropped);
    // one taken from an SRQ has left it and completes in error, as for UC
    // (class E).  (rxe instead fails the copy as a malformed WQE, class A:
    // the receive completes loc_qp_op_err and the QP goes to ERR.)
    ++counters_.dropped;
    // A CQ that cannot take the completion stops the QP (rxe: class G).
    if (qp->srq != nullptr && !fail_recv_wqe(qp, wc_status::loc_len_err, p->hdr.deth.src_qp)) qp_to_error(qp);
    return;
  }
  // The GRH area: the IPv6 header, or 20 zero bytes and the IPv4 header
  // (with a valid checksum, which ibv_init_ah_from_wc() checks).
  std::array<std::byte, 64> iphdr{};
  std::array<std::byte, 40> grh{};
  wire::ip_udp_params ip;
  std::memcpy(ip.src_gid.data(), p->src.raw.data(), 16);
  std::memcpy(ip.dst_gid.data(), p->dst.raw.data(), 16);
  ip.traffic_class = p->tclass;
  ip.hop_limit = p->hop_limit;
  ip.flow_label = p->flow_label;
  ip.src_port = p->sport;
  // The lengths of the datagram as it came: pad and ICRC included.
  const std::size_t hl = wire::build_ip_udp(
      ip, p->header_len + p->payload_len + wire::pad_for(p->payload_len) + wire::icrc_size, iphdr);
  if (hl == 28) std::memcpy(grh.data() + 20, iphdr.data(), 20);
  else if (hl == 48) std::memcpy(grh.data(), iphdr.data(), 40);
  packet g{};
  g.segs[0] = {grh.data(), 40};
  g.nsegs = 1;
  g.payload_len = 40;
  if (!copy_to_sges(qp->pd, w->sges(), w->num_sge, 0, &g, 0, 40) ||
      !copy_to_sges(qp->pd, w->sges(), w->num_sge, 40, p, 0, p->payload_len)) {
    work_completion wc;
    wc.wr_id = w->wr_id;
    wc.status = wc_status::loc_prot_err;
    wc.opcode = wc_opcode::recv;
    wc.qp_num = qp->qpn;
    consume_recv(qp);
    post_cqe(qp->rcq, wc, false);
    qp_to_error(qp);
    return;
  }
  work_completion wc;
  wc.wr_id = w->wr_id;
  wc.status = wc_status::success;
  wc.opcode = wc_opcode::recv;
  wc.byte_len = 40 + p->payload_len;
  wc.qp_num = qp->qpn;
  wc.src_qp = p->hdr.deth.src_qp;
  wc.wc_flags = wc_grh;
  if ((p->op->ops & wire::op_imm) != 0) {
    wc.wc_flags |= wc_with_imm;
    wc.imm_data = p->hdr.imm;
  }
  consume_recv(qp);
  if (!post_cqe(qp->rcq, wc, p->hdr.bth.se)) qp_to_error(qp);
}

namespace {
enum class resp_error { invalid_request, access, operational, length };
}

void device::respond(qp_t* qp, packet* p) noexcept {
  if (qp->state == qp_state::rtr && !qp->resp.comm_est && qp->type != qp_type::ud) {
    // IBTA 11.6.3.1: the first packet in RTR establishes communication,
    // a connected service's only (a UD QP has no connection to establish;
    // qib and hfi1 raise it from their RC and UC receive paths alone).
    qp->resp.comm_est = true;
    raise_event(qp->pd->events, event_type::comm_est, qp->qpn);
  }
  if (qp->type == qp_type::ud) {
    respond_ud(qp, p);
    return;
  }
  auto& r = qp->resp;
  const std::uint16_t ops = p->op->ops;
  const bool rc = qp->type == qp_type::rc;
  if (p->run > 1) {
    // A run (packet::run) is MIDDLE packets of whole MTUs, or nothing.
    if ((ops & wire::op_middle) == 0 || p->payload_len != p->run * qp->mtu_bytes) {
      ++counters_.dropped;
      return;
    }
    // A resent run that starts before r.psn is answered as a duplicate as
    // a whole, even if it reaches past r.psn: that ACK, and the sequence
    // NAK the packets behind the run meet, bring the requester back to
    // r.psn.  (The in-process link loses nothing: the requester goes back
    // only to where the responder stands, after an RNR NAK.)
  }
  const std::uint32_t psn = p->hdr.bth.psn;
  const bool first = (ops & (wire::op_first | wire::op_only)) != 0;
  const bool last = (ops & (wire::op_last | wire::op_only)) != 0;

  // Errors: NAK (RC) and move the QP to error; the receive in use, if any,
  // completes with `wc` status (IBTA 9.7.5.2.8, 11.6.2).
  auto fail_recv = [&](wc_status status) { return fail_recv_wqe(qp, status, qp->dest_qpn); };
  auto error = [&](resp_error e, wc_status recv_status) {
    if (!rc && (recv_status == wc_status::success || recv_status == wc_status::loc_len_err)) {
      // UC has no NAK: the message is dropped and the QP carries on
      // (IBTA 9.8.3.1, class D/E; rxe too, but for a SEND too long for
      // its receive, whose copy it fails as a malformed WQE: the receive
      // completes loc_qp_op_err and the QP goes to ERR).  A receive the message took from
      // an SRQ completes in error -- too long for it, loc_len_err; a bad
      // R_Key of a WRITE with immediate, loc_access_err (as RC's; rxe
      // says rem_access_err); its length
      // wrong, rem_inv_req_err (rxe's UC/SRQ classes) -- or it would stay
      // held by this QP, out of the other QPs' reach, for whatever
      // message came next.  A receive of the QP's own stays for the next
      // message (class D).
      // A CQ that cannot take that completion stops the QP (rxe: class G).
      if (r.have_wqe && qp->srq != nullptr) {
        const wc_status st = recv_status != wc_status::success ? recv_status
                             : e == resp_error::access         ? wc_status::loc_access_err
                                                               : wc_status::rem_inv_req_err;
        if (!fail_recv(st)) {
          qp_to_error(qp);
          return;
        }
      }
      r.drop_msg = true;
      r.last_opcode = 0xFF;
      return;
    }
    if (rc) {
      const wire::nak_code code = e == resp_error::access        ? wire::nak_code::remote_access_error
                                  : e == resp_error::operational ? wire::nak_code::remote_operational_error
                                                                 : wire::nak_code::invalid_request;
      send_ack(qp, wire::aeth_nak(code), psn);
    }
    // The receive the broken message took completes with the error (rxe's
    // do_class_ac_error()), not flushed as if never used.  For a WRITE
    // with immediate refused for its R_Key, the one ibv_poll_cq(3) names
    // (rxe: rem_access_err).
    if (r.have_wqe) {
      if (recv_status == wc_status::success)
        recv_status = e == resp_error::access        ? wc_status::loc_access_err
                      : e == resp_error::operational ? wc_status::rem_op_err
                                                     : wc_status::rem_inv_req_err;
      fail_recv(recv_status);
    }
    raise_event(qp->pd->events, e == resp_error::access ? event_type::qp_access_err : event_type::qp_req_err, qp->qpn);
    qp_to_error(qp);
  };

  // 1. PSN (IBTA 9.7.5.1.1).
  if (rc) {
    const std::int32_t d = wire::psn_compare(psn, r.psn);
    if (d > 0) {
      // One NAK per gap (IBTA 9.7.5.2.3), unless the gap persists: the
      // PSN right after it arrives again (the requester went back, and its
      // resend of `r.psn` was lost too), or so many packets came past it
      // that the NAK itself may have been lost.  Without these a lost NAK
      // or a lost resend costs a retransmission timeout.  (A packet merely
      // reordered behind a later one does not count; a repeat that finds
      // the requester still resending from `r.psn` is ignored there.)
      // After an RNR NAK the packets behind the gap are the ones the
      // requester had pipelined, which the RNR NAK answers (send_rnr_nak):
      // one rising run from `r.psn` + 1, begun while the requester could
      // not have resent yet.  A packet that repeats a PSN of it starts a
      // new round (the resend of `r.psn` was lost), and so does one that
      // does not continue it once that time is over: it gets the gap's NAK.
      if (r.rnr_nak) {
        const bool repeat = r.rnr_seen && !psn_before(r.rnr_highest, psn);
        const bool continues = r.rnr_seen && psn == psn_add(r.rnr_highest, 1);
        if (!repeat && (continues || pass_now() < r.rnr_until)) {
          if (!r.rnr_seen || psn_before(r.rnr_highest, psn)) r.rnr_highest = psn;
          r.rnr_seen = true;
          return;
        }
        r.rnr_nak = false;
        r.nak_sent = false;
      }
      bool again = false;
      if (r.nak_sent && psn == ((r.psn + 1) & wire::psn_mask)) {
        again = true;
      } else if (r.nak_sent) {
        again = ++r.nak_count >= 64;
      }
      if (!r.nak_sent || again) {
        send_ack(qp, wire::aeth_nak(wire::nak_code::psn_sequence_error), r.psn);
        r.nak_sent = true;
        r.nak_count = 0;
        r.rnr_nak = false;
        ++counters_.seq_naks_sent;
      }
      return;
    }
    if (d < 0) {
      respond_duplicate(qp, p);
      return;
    }
    r.nak_sent = false;
    r.rnr_seen = false;
    r.rnr_nak = false;
  } else {
    // UC: a gap drops the rest of the message; a FIRST or ONLY resyncs.
    if (psn != r.psn) {
      if (first) {
        // The message open before the gap is broken: a receive it took
        // from an SRQ completes in error, as at an opcode out of sequence
        // below (rxe's class E); one of the QP's own serves the new one.
        if (r.have_wqe && qp->srq != nullptr && !fail_recv(wc_status::rem_inv_req_err)) {
          qp_to_error(qp);
          return;
        }
        r.drop_msg = false;
        r.last_opcode = 0xFF;
        r.offset = 0;
      } else {
        r.drop_msg = true;
      }
    }
    r.psn = psn_add(psn, p->run);
    if (r.drop_msg && !first) return;
    r.drop_msg = false;
  }

  // 2. Opcode sequence (IBTA 9.8.3.1 C9-26..).
  const bool prev_open = r.last_opcode != 0xFF && (wire::info(r.last_opcode).ops & (wire::op_last | wire::op_only)) == 0;
  if (first == prev_open) {
    if (!rc) {
      // UC: abandon the broken message; a FIRST/ONLY starts a new one.
      // A receive the broken one took from an SRQ completes in error, as
      // in error() below (rxe's class E); one of the QP's own serves the
      // new message (class D1).
      if (!first) {
        error(resp_error::invalid_request, wc_status::success);
        return;
      }
      if (r.have_wqe && qp->srq != nullptr && !fail_recv(wc_status::rem_inv_req_err)) {
        qp_to_error(qp);
        return;
      }
      r.last_opcode = 0xFF;
    } else {
      error(resp_error::invalid_request, wc_status::rem_inv_req_err);
      return;
    }
  }
  if (!first) {
    const auto& prev = wire::info(r.last_opcode);
    const bool same = ((prev.ops & wire::op_send) != 0 && (ops & wire::op_send) != 0) ||
                      ((prev.ops & wire::op_write) != 0 && (ops & wire::op_write) != 0);
    if (!same) {
      error(resp_error::invalid_request, rc ? wc_status::rem_inv_req_err : wc_status::success);
      return;
    }
  }

  // 3. QP access rights (IBTA 9.7.5.1.2 / rxe check_op_valid).  An ATOMIC
  // WRITE needs remote write, as in rxe; a FLUSH needs a flush access no
  // QP here has (averbs offers none: the memory is always visible).
  if (((ops & (wire::op_write | wire::op_atomic_write)) != 0 &&
       (qp->access_flags & access_remote_write) == 0) ||
      ((ops & wire::op_read) != 0 && (qp->access_flags & access_remote_read) == 0) ||
      ((ops & wire::op_atomic) != 0 && (qp->access_flags & access_remote_atomic) == 0) ||
      (ops & wire::op_flush) != 0) {
    if (rc) error(resp_error::invalid_request, wc_status::success);
    else r.drop_msg = true;
    return;
  }

  // 4. Payload length against the path MTU (C9-41..C9-43).
  const std::uint32_t pl = p->payload_len;
  const std::uint32_t mtu = qp->mtu_bytes;
  const bool only = (ops & wire::op_only) != 0;
  if ((ops & wire::op_payload) != 0 &&
      (((ops & (wire::op_first | wire::op_middle)) != 0 && !only && pl != mtu * p->run) ||
       ((ops & wire::op_last) != 0 && !only && (pl == 0 || pl > mtu)) || (only && pl > mtu))) {
    if (rc) error(resp_error::invalid_request, wc_status::success);
    else r.drop_msg = true;
    return;
  }

  // 5. Resources, then execute.
  // The 64-bit word an atomic or ATOMIC WRITE names: the R_Key first, then
  // the alignment, as rxe orders them (an unaligned atomic with a bad key
  // is an access error).  An unaligned VA is an invalid request (IBTA
  // 9.4.5); so is an aligned one that names an unaligned address (a
  // zero-based MR or window over an unaligned buffer), where an atomic
  // would be a split lock, or a bus error on other CPUs.  rxe checks the
  // real address too.
  auto resolve_word = [&](std::uint64_t va, std::uint32_t rkey, std::uint32_t need, std::byte*& host,
                          std::uint64_t& addr) {
    if (!resolve_rkey(qp, rkey, va, 8, need, host, addr)) {
      error(resp_error::access, wc_status::success);
      return false;
    }
    if ((va & 7) != 0 || (host != nullptr ? reinterpret_cast<std::uintptr_t>(host) : addr) % 8 != 0) {
      error(resp_error::invalid_request, wc_status::success);
      return false;
    }
    return true;
  };
  if ((ops & (wire::op_read | wire::op_atomic | wire::op_atomic_write)) != 0) {
    if (qp->max_dest_rd_atomic == 0) {
      error(resp_error::invalid_request, wc_status::success);
      return;
    }
    rd_resource& res = r.resources[r.res_head++ & (r.resources.size() - 1)];
    if ((ops & wire::op_atomic_write) != 0) {
      // Exactly 8 bytes, announced and carried (rxe's check_length); the
      // R_Key for remote write; then an aligned target, as for the other
      // atomics.  Stored in one 64-bit store, never executed twice (a
      // duplicate is answered from `res`).
      const wire::reth& t = p->hdr.reth;
      if (t.length != 8 || p->payload_len != 8) {
        error(resp_error::invalid_request, wc_status::success);
        return;
      }
      std::byte* host = nullptr;
      std::uint64_t addr = 0;
      if (!resolve_word(t.va, t.rkey, access_remote_write, host, addr)) return;
      std::uint64_t v = 0;
      payload_reader in{p};
      in.copy(8, [&](std::uint32_t at, const std::byte* src, std::uint32_t n) {
        std::memcpy(reinterpret_cast<std::byte*>(&v) + at, src, n);
      });
      if (host != nullptr) {
        __atomic_store_n(reinterpret_cast<std::uint64_t*>(host), v, __ATOMIC_RELEASE);
      } else if (!mem_->write(addr, &v, 8)) {
        error(resp_error::operational, wc_status::success);
        return;
      }
      res = {rd_resource::kind::atomic_write, psn, psn, t.va, t.rkey, 8, 0};
      flush_ack(qp);  // the ACK held for the requests before it counts only those
      ++r.msn;
      send_empty_read_response(qp, psn);
      r.psn = psn_add(psn, 1);
      r.last_opcode = p->hdr.bth.opcode;
      r.last_ack_psn = psn;
      r.newest_psn = psn;  // nothing to lose: an ACK here completes it as well
      return;
    }
    if ((ops & wire::op_read) != 0) {
      const wire::reth& t = p->hdr.reth;
      if (t.length > (1u << 31)) {
        error(resp_error::invalid_request, wc_status::success);
        return;
      }
      std::byte* host = nullptr;
      std::uint64_t addr = 0;
      // A zero-length READ names no memory: its R_Key is not checked (C9-88).
      if (t.length != 0 && !resolve_rkey(qp, t.rkey, t.va, t.length, access_remote_read, host, addr)) {
        error(resp_error::access, wc_status::success);
        return;
      }
      const std::uint32_t n = packets_for(t.length, mtu);
      res = {rd_resource::kind::read, psn, psn_add(psn, n - 1), t.va, t.rkey, t.length, 0};
      flush_ack(qp);  // the ACK held for the requests before it counts only those
      ++r.msn;        // counted at execution (C9-148)
      r.psn = psn_add(psn, n);
      r.last_opcode = p->hdr.bth.opcode;
      start_read_reply(qp, psn, t, false);
      return;
    }
    const wire::atomic_eth& a = p->hdr.atomic;
    std::byte* host = nullptr;
    std::uint64_t addr = 0;
    if (!resolve_word(a.va, a.rkey, access_remote_atomic, host, addr)) return;
    std::uint64_t orig;
    if (host != nullptr) {
      auto* target = reinterpret_cast<std::uint64_t*>(host);
      if (p->hdr.bth.opcode == static_cast<std::uint8_t>(opcode::rc_compare_swap)) {
        orig = a.compare;
        __atomic_compare_exchange_n(target, &orig, a.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      } else {
        orig = __atomic_fetch_add(target, a.swap_add, __ATOMIC_SEQ_CST);
      }
    } else {
      if (!mem_->read(addr, &orig, 8)) {
        error(resp_error::operational, wc_status::success);
        return;
      }
      std::uint64_t v = p->hdr.bth.opcode == static_cast<std::uint8_t>(opcode::rc_compare_swap)
                            ? (orig == a.compare ? a.swap_add : orig)
                            : orig + a.swap_add;
      mem_->write(addr, &v, 8);
    }
    res = {rd_resource::kind::atomic, psn, psn, a.va, a.rkey, 8, orig};
    flush_ack(qp);  // the ACK held for the requests before it counts only those
    ++r.msn;
    send_atomic_ack(qp, psn, orig);
    r.psn = psn_add(psn, 1);
    r.last_opcode = p->hdr.bth.opcode;
    r.last_ack_psn = psn;
    // newest_psn stays: an ACK at the atomic's PSN (for a duplicate SEND
    // or WRITE) would complete it at an rxe requester without its result.
    return;
  }

  const bool imm = (ops & wire::op_imm) != 0;
  if ((ops & wire::op_send) != 0) {
    if (first) {
      if (!next_recv(qp)) {
        if (rc) {
          // The rest of the message arrives out of sequence now; this NAK
          // answers for it until `psn` comes back.
          send_rnr_nak(qp, psn);
        } else {
          r.drop_msg = true;
        }
        return;
      }
      r.offset = 0;
    }
    // A message ends at the receive's end, which post_recv keeps within
    // max_msg_size (2 GiB: the 32-bit offset cannot wrap); the bound is
    // checked here again all the same.
    recv_wqe* w = r.wqe;
    const std::uint64_t room = std::min<std::uint64_t>(recv_capacity(w), limits::max_msg_size);
    if (r.offset + static_cast<std::uint64_t>(pl) > room) {
      error(resp_error::invalid_request, wc_status::loc_len_err);
      return;
    }
    if (!copy_to_sges(qp->pd, w->sges(), w->num_sge, r.offset, p, 0, pl)) {
      error(resp_error::operational, wc_status::loc_prot_err);
      return;
    }
    r.offset += pl;
  } else {  // RDMA WRITE
    // WRITE with immediate needs a receive: checked first, as rxe checks
    // its resources before the length and the R_Key (an RNR NAK, not an
    // access error, for a bad key with no receive posted), and before
    // placing data, so that an RNR retry finds the memory unchanged.
    if (imm && last && !next_recv(qp)) {
      if (rc) {
        send_rnr_nak(qp, psn);
      } else {
        r.drop_msg = true;
      }
      return;
    }
    // The first packet checks the R_Key for the whole message; every later
    // one again for the range it writes, as rxe does: the MR or window may
    // have been deregistered or invalidated meanwhile (its memory freed).
    std::byte* host = nullptr;
    std::uint64_t addr = 0;
    if (first) {
      const wire::reth& t = p->hdr.reth;
      if (t.length > (1u << 31)) {
        error(resp_error::invalid_request, wc_status::success);
        return;
      }
      r.va = t.va;
      r.rkey = t.rkey;
      r.length = t.length;
      r.offset = 0;
      if (t.length != 0 && !resolve_rkey(qp, t.rkey, t.va, t.length, access_remote_write, host, addr)) {
        error(resp_error::access, wc_status::success);
        return;
      }
    }
    // The last packet brings exactly what the RETH announced, no less (a
    // length error, as rxe's check_rkey has it): a short message is
    // refused, not completed with a byte count that was never written.
    if (r.offset + static_cast<std::uint64_t>(pl) > r.length ||
        (last && r.offset + static_cast<std::uint64_t>(pl) != r.length)) {
      error(resp_error::invalid_request, wc_status::success);
      return;
    }
    if (!first && pl != 0 && !resolve_rkey(qp, r.rkey, r.va + r.offset, pl, access_remote_write, host, addr)) {
      error(resp_error::access, wc_status::success);
      return;
    }
    if (pl != 0 && !write_host(host, addr, p, 0, pl)) {
      error(resp_error::operational, wc_status::success);
      return;
    }
    r.offset += pl;
  }

  // 6. Message completion.
  if (last) {
    ++r.msn;
    if ((ops & wire::op_send) != 0 || imm) {
      recv_wqe* w = r.wqe;
      work_completion wc;
      wc.wr_id = w->wr_id;
      wc.status = wc_status::success;
      wc.opcode = (ops & wire::op_send) != 0 ? wc_opcode::recv : wc_opcode::recv_rdma_with_imm;
      wc.byte_len = (ops & wire::op_send) != 0 ? r.offset : r.length;
      wc.qp_num = qp->qpn;
      wc.src_qp = qp->dest_qpn;
      if (imm) {
        wc.wc_flags |= wc_with_imm;
        wc.imm_data = p->hdr.imm;
      }
      if ((ops & wire::op_inv) != 0 && invalidate_rkey(qp->pd, p->hdr.ieth_rkey, qp, true)) {
        // The message arrived; only the invalidation failed.  The requester
        // is acknowledged, the receive fails and this QP stops (rxe class J).
        // Acknowledged whether or not it asked: an unasked last packet waits
        // for the lazy ACK, which a QP in ERR never sends, and its resends
        // would find this QP dropping them until the requester ran out of
        // retries for a message that arrived.
        if (rc) send_ack(qp, wire::aeth_ack_unlimited, psn);
        wc.status = wc_status::rem_inv_req_err;
        consume_recv(qp);
        post_cqe(qp->rcq, wc, false);
        raise_event(qp->pd->events, event_type::qp_req_err, qp->qpn);
        qp_to_error(qp);
        return;
      }
      if ((ops & wire::op_inv) != 0) {
        wc.wc_flags |= wc_with_inv;
        wc.imm_data = p->hdr.ieth_rkey;
      }
      consume_recv(qp);
      if (!post_cqe(qp->rcq, wc, p->hdr.bth.se)) {
        qp_to_error(qp);  // CQ overflow
        return;
      }
    }
  }
  r.last_opcode = p->hdr.bth.opcode;
  r.psn = psn_add(psn, p->run);
  if (rc) {
    r.newest_psn = psn_add(psn, p->run - 1);
    if (p->hdr.bth.ack_req) {
      r.last_ack_psn = psn_add(psn, p->run - 1);
      list_ack(qp);
    } else if (last) {
      r.last_ack_psn = psn;
      queue_lazy_ack(qp);
    }
  }
}

void device::start_read_reply(qp_t* qp, std::uint32_t psn, const wire::reth& t, bool continues) noexcept {
  flush_ack(qp);  // the requests before it are acknowledged first
  auto& rd = qp->resp.reading;
  rd = {};
  rd.active = true;
  rd.continues = continues;
  rd.first_psn = psn;
  rd.packets = packets_for(t.length, qp->mtu_bytes);
  rd.va = t.va;
  rd.rkey = t.rkey;
  rd.length = t.length;
  // The first batch now: a READ of a few packets is answered at once.
  if (!pump_read_reply(qp)) schedule_requester(qp);
}

// Sends the next batch of the READ being answered; true once nothing is
// left to send (all sent, or given up).  The R_Key is resolved again for
// every batch: the region may have been deregistered or the window
// invalidated since the request (the responses sent so far stand).
bool device::pump_read_reply(qp_t* qp) noexcept {
  auto& rd = qp->resp.reading;
  const std::uint32_t mtu = qp->mtu_bytes;
  // A replay too (rxe rechecks the key of a duplicate READ): the region
  // is gone, and the requester's READ cannot complete.
  auto fail = [&](wire::nak_code code) {
    rd.active = false;
    send_ack(qp, wire::aeth_nak(code), psn_add(rd.first_psn, rd.sent));
    raise_event(qp->pd->events, code == wire::nak_code::remote_access_error ? event_type::qp_access_err : event_type::qp_req_err,
                qp->qpn);
    qp_to_error(qp);
  };
  const std::uint32_t batch = static_cast<std::uint32_t>(yield_ ? link_->send_batch() : 64);
  const std::uint32_t end = rd.packets - rd.sent > batch ? rd.sent + batch : rd.packets;
  const std::uint64_t from = std::uint64_t{rd.sent} * mtu;  // bytes of this batch: [from, to)
  const std::uint64_t to = std::min<std::uint64_t>(std::uint64_t{end} * mtu, rd.length);
  std::byte* host = nullptr;
  std::uint64_t addr = 0;
  if (to > from && !resolve_rkey(qp, rd.rkey, rd.va + from, to - from, access_remote_read, host, addr)) {
    fail(wire::nak_code::remote_access_error);
    return true;
  }
  for (; rd.sent < end; ++rd.sent) {
    const std::uint32_t k = rd.sent;
    const std::uint32_t n = rd.packets;
    // The rest of a READ answered in part goes on with MIDDLE and LAST, as
    // rxe's replay does: its requester, holding the first part, refuses a
    // FIRST or ONLY past the READ's first PSN.
    const bool starts = k == 0 && !rd.continues;
    const opcode op = starts && n == 1 ? opcode::rc_read_response_only
                      : starts         ? opcode::rc_read_response_first
                      : k == n - 1     ? opcode::rc_read_response_last
                                       : opcode::rc_read_response_middle;
    const std::uint64_t at = std::uint64_t{k} * mtu - from;  // into this batch
    const auto len = static_cast<std::uint32_t>(std::min<std::uint64_t>(mtu, to - from - at));
    packet* p = new_packet(qp, op, psn_add(rd.first_psn, k));
    if (p == nullptr) {  // out of memory: the requester asks again for the rest
      rd.active = false;
      return true;
    }
    p->hdr.aeth.syndrome = wire::aeth_ack_unlimited;
    p->hdr.aeth.msn = qp->resp.msn & 0xFFFFFF;
    p->payload_len = len;
    if (len != 0) {
      // A snapshot, not a reference: the responder's memory may change
      // (a WRITE of another QP, the application) before the batch leaves,
      // and the response must carry what the READ saw, under an ICRC
      // computed over the same bytes.
      if (host != nullptr) {
        std::memcpy(p->buf, host + at, len);
      } else if (!mem_->read(addr + at, p->buf, len)) {
        free_packet(p);
        fail(wire::nak_code::remote_operational_error);
        return true;
      }
      p->segs[0] = {p->buf, len};
      p->nsegs = 1;
    }
    finish_packet(qp, p);
  }
  if (rd.sent < rd.packets) return false;
  rd.active = false;
  return true;
}

// The QP's turn on the run queue for its responder: the READ being
// answered, then the requests held behind it, in order, until another READ
// starts or nothing is held.  A QP that leaves the responding states drops
// them (its packets are dropped on arrival, too).
void device::responder_turn(qp_t* qp) noexcept {
  const qp_state s = qp->state;
  if (s != qp_state::rtr && s != qp_state::rts && s != qp_state::sqd && s != qp_state::sqe) {
    drop_held_requests(qp);
    return;
  }
  auto& r = qp->resp;
  for (;;) {
    if (r.reading.active && !pump_read_reply(qp)) {
      schedule_requester(qp);
      return;
    }
    packet* p = r.held_head;
    if (p == nullptr || qp->state == qp_state::err) return;  // (qp_to_error dropped the rest)
    r.held_head = p->next;
    if (r.held_head == nullptr) r.held_tail = nullptr;
    --r.held;
    p->next = nullptr;
    respond(qp, p);
    free_packet(p);
    if (r.reading.active) return;  // it started a READ: its first batch was this turn's (it is scheduled)
  }
}

void device::hold_request(qp_t* qp, packet* p) noexcept {
  auto& r = qp->resp;
  if (r.held >= limits::max_held_requests) {
    ++counters_.dropped;
    free_packet(p);
    return;
  }
  // A copy of a request already waiting here (a requester that went back
  // N resends the READs behind the one it lost, and they are still held):
  // the one held answers it in its turn.  A second answer would reach the
  // requester as duplicates -- a whole READ's worth.
  for (packet* q = r.held_head; q != nullptr; q = q->next) {
    if (q->hdr.bth.psn == p->hdr.bth.psn && q->hdr.bth.opcode == p->hdr.bth.opcode) {
      q->hdr.bth.ack_req = q->hdr.bth.ack_req || p->hdr.bth.ack_req;  // a probe's copy asks for an ACK
      ++counters_.duplicates_received;
      free_packet(p);
      return;
    }
  }
  // It outlives this poll's receive buffer.  (A run, which references the
  // requester's memory and is too long for `buf`, comes only over the
  // in-process link, whose pass runs until the READ and what it holds are
  // done.)
  if (p->run == 1) p->own_payload();
  p->next = nullptr;
  if (r.held_tail != nullptr) r.held_tail->next = p;
  else r.held_head = p;
  r.held_tail = p;
  ++r.held;
}

void device::drop_held_requests(qp_t* qp) noexcept {
  auto& r = qp->resp;
  r.reading.active = false;
  while (packet* p = r.held_head) {
    r.held_head = p->next;
    free_packet(p);
  }
  r.held_tail = nullptr;
  r.held = 0;
}

namespace {

// The responder's READ/atomic resources from the newest back: PSNs wrap
// every 2^24, and an entry left from an earlier wrap may hold the same
// PSN as a newer one in a lower slot (fewer READs and atomics than the
// ring holds between the two); the newest is the one a duplicate means.
class newest_first {
 public:
  explicit newest_first(const qp_t::responder& r) : r_(r) {}
  class iterator {
   public:
    iterator(const qp_t::responder& r, std::size_t k) : r_(&r), k_(k) {}
    const rd_resource& operator*() const {
      return r_->resources[(r_->res_head - 1 - k_) & (r_->resources.size() - 1)];
    }
    iterator& operator++() {
      ++k_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return k_ != o.k_; }

   private:
    const qp_t::responder* r_;
    std::size_t k_;
  };
  iterator begin() const { return {r_, 0}; }
  iterator end() const { return {r_, r_.resources.size()}; }

 private:
  const qp_t::responder& r_;
};

// The READ resource a duplicate READ request asks again for: the one whose
// PSN range holds its PSN, if its RETH asks for the rest of the original
// from that PSN on -- its offset that PSN's, its end the original's
// (hfi1's rule), so the responses keep the original's PSNs and none lands
// on a later request's.  Null otherwise: nothing is answered.
const rd_resource* replayable_read(const qp_t* qp, const packet* p) noexcept {
  const std::uint32_t psn = p->hdr.bth.psn;
  for (const rd_resource& res : newest_first(qp->resp)) {
    if (res.type != rd_resource::kind::read) continue;
    if (psn_before(psn, res.first_psn) || psn_before(res.last_psn, psn)) continue;
    const wire::reth& t = p->hdr.reth;
    const std::uint64_t skip = std::uint64_t{(psn - res.first_psn) & wire::psn_mask} * qp->mtu_bytes;
    return t.rkey == res.rkey && t.va == res.va + skip && std::uint64_t{t.length} + skip == res.length
               ? &res
               : nullptr;
  }
  return nullptr;
}

}  // namespace

// A READ request that asks again for a READ, from a PSN the responses going
// out have already passed: the requester lost one of them (and, if it goes
// back N, discards everything after the hole), or its tail probe asks for
// what has not arrived, or the network duplicated the request.  Its answer
// goes at once, not after the rest of the stream and the requests held
// behind it (a lost response to a 1 MiB READ otherwise cost the rest of
// that READ and of the next, twice).  A requester whose oldest unfinished
// READ is this one has taken no response of any later READ (responses are
// taken in PSN order), so the stream stops: when it is this READ's, the
// answer covers it; when it is a later READ's, that READ and every READ
// and atomic between are answered again after this one (READs from their
// first PSN, atomics from the replay cache), ahead of the requests held
// (which stay, in PSN order: a requester may not send them again -- a
// tail probe does not go back N).  (A SEND or WRITE between needs no
// second ACK: the READ responses after it acknowledge it.)  The
// requester's own copies of those, if it went back N, meet them held and
// go (hold_request).  True if so; the caller then answers the request.
// False when nothing went out past it, or there is no room for the
// replays.
bool device::rewinds_read(qp_t* qp, const packet* p) noexcept {
  auto& r = qp->resp;
  auto& rd = r.reading;
  const std::uint32_t psn = p->hdr.bth.psn;
  if (p->hdr.bth.opcode != static_cast<std::uint8_t>(opcode::rc_read_request) || !psn_before(psn, r.psn) ||
      !rd.active || !psn_before(psn, psn_add(rd.first_psn, rd.sent)))
    return false;
  const rd_resource* asked = replayable_read(qp, p);  // what respond_duplicate() answers
  if (asked == nullptr) return false;
  // The later READs and atomics to answer again, oldest first at the
  // front of `head`: the resources newer than the one asked for (only
  // those: an older slot may hold an entry from before the PSNs wrapped).
  packet* head = nullptr;
  std::uint32_t n = 0;
  for (const rd_resource& res : newest_first(r)) {
    if (&res == asked) break;
    if (res.type == rd_resource::kind::none || !psn_before(asked->last_psn, res.first_psn) ||
        psn_before(rd.first_psn, res.first_psn))
      continue;
    packet* q = alloc_packet();
    if (q == nullptr) {
      while (head != nullptr) free_packet(std::exchange(head, head->next));
      return false;
    }
    std::byte* buf = q->buf;
    *q = *p;
    q->buf = buf;
    q->nsegs = 0;
    q->payload_len = 0;
    q->hdr.bth.psn = res.first_psn;
    if (res.type == rd_resource::kind::atomic) {  // respond_duplicate() sends its stored result
      q->hdr.bth.opcode = static_cast<std::uint8_t>(opcode::rc_fetch_add);
      q->op = &wire::info(q->hdr.bth.opcode);
    } else if (res.type == rd_resource::kind::atomic_write) {  // and answers this one again
      q->hdr.bth.opcode = static_cast<std::uint8_t>(opcode::rc_atomic_write);
      q->op = &wire::info(q->hdr.bth.opcode);
    } else {
      q->hdr.reth = {res.va, res.rkey, res.length};
    }
    q->next = head;
    head = q;
    ++n;
  }
  rd.active = false;
  if (head != nullptr) {
    packet* tail = head;
    while (tail->next != nullptr) tail = tail->next;
    tail->next = r.held_head;
    if (r.held_head == nullptr) r.held_tail = tail;
    r.held_head = head;
    r.held += n;
  }
  ++counters_.read_restarts;
  return true;
}

void device::respond_duplicate(qp_t* qp, packet* p) noexcept {
  auto& r = qp->resp;
  const std::uint16_t ops = p->op->ops;
  const std::uint32_t psn = p->hdr.bth.psn;
  ++counters_.duplicates_received;
  if ((ops & wire::op_read) != 0) {
    // Replay from the resource whose PSN range holds this one (IBTA
    // 9.7.5.1.1, rxe P5).  The key is resolved again as the responses go:
    // a region gone since is a remote access error (rxe_recheck_mr).
    // Not once the QP has lost remote reads (a modify since the READ): a
    // new READ would be refused, and a replay reads the memory as it is
    // now.  Dropped quietly, as a duplicate nothing matches.
    if ((qp->access_flags & access_remote_read) == 0) return;
    if (const rd_resource* res = replayable_read(qp, p))
      start_read_reply(qp, psn, p->hdr.reth, psn != res->first_psn);
    return;  // (unknown, or asking for something else: silently dropped)
  }
  if ((ops & wire::op_atomic) != 0) {
    // Replay the stored result; never execute twice.
    for (const rd_resource& res : newest_first(r)) {
      if (res.type == rd_resource::kind::atomic && res.first_psn == psn) {
        send_atomic_ack(qp, psn, res.orig);
        return;
      }
    }
    return;
  }
  if ((ops & wire::op_atomic_write) != 0) {
    // Answered again, not stored again: a newer value may be there since.
    // Unknown (its resource reused): silently dropped, as rxe does.
    for (const rd_resource& res : newest_first(r)) {
      if (res.type == rd_resource::kind::atomic_write && res.first_psn == psn) {
        send_empty_read_response(qp, psn);
        return;
      }
    }
    return;
  }
  // SEND/WRITE: acknowledge again, asked or not: a duplicate means the
  // requester missed our ACK.  With the newest PSN taken in sequence, as
  // rxe (its ack_psn), whether or not that packet asked: a requester's
  // tail probe learns where we are.  Never a READ's PSN (requests behind
  // a READ wait until its responses are out) nor an atomic's (only its
  // ATOMIC ACKNOWLEDGE carries its result).
  send_ack(qp, wire::aeth_ack_unlimited, r.newest_psn);
}

// ---------------------------------------------------------------------------
// Completer

void device::complete_rx(qp_t* qp, packet* p) noexcept {
  if (qp->type != qp_type::rc) return;
  const std::uint32_t psn = p->hdr.bth.psn;
  const std::uint16_t ops = p->op->ops;
  const std::uint32_t mask = qp->sq.size() - 1;
  const bool has_aeth = (p->op->headers & wire::hdr_aeth) != 0;
  const std::uint8_t syn = has_aeth ? p->hdr.aeth.syndrome : wire::aeth_ack_unlimited;
  const auto type = wire::aeth_type_of(syn);

  // Nothing at or beyond sent_psn was ever sent: a stray or forged packet
  // (an ACK for a message still being transmitted would complete it).
  if (!psn_before(psn, qp->req.sent_psn)) {
    ++counters_.dropped;
    return;
  }
  // A READ response or atomic ACK carries an ACK syndrome; an RNR NAK, a
  // NAK or a reserved type there, or a reserved type in an ACK, is a
  // response nothing asked for (rxe check_ack).
  const bool plain_ack = p->hdr.bth.opcode == static_cast<std::uint8_t>(opcode::rc_ack);
  const bool malformed = has_aeth && !psn_before(psn, qp->comp.psn) &&
                         (type == wire::aeth_type::reserved || (!plain_ack && type != wire::aeth_type::ack));
  const std::uint32_t before = qp->comp.psn;

  // Everything before `limit` reached the responder and executed (an ACK,
  // a NAK, or a later response says so): SEND and WRITE WQEs wholly below
  // it are done.  Stops at a READ or atomic whose response is missing (P6),
  // returning false.
  auto acked_below = [&](std::uint32_t limit) -> bool {
    for (std::uint32_t i = qp->sq.consumer(); i != qp->req.start_index; ++i) {
      send_state& st = qp->sq_state[i & mask];
      if (st.state == wqe_state::done) continue;
      if (!psn_before(st.first_psn, limit)) return true;
      auto* w = qp->sq.at<send_wqe>(i);
      if (is_read(w->opcode) || is_atomic(w->opcode)) {
        // Skipped over entirely: its response was lost.  Reached but not
        // passed: it is the one being answered.
        return !psn_before(st.last_psn, limit);
      }
      if (!psn_before(st.last_psn, limit)) {
        // Part of a multi-packet message.
        if (psn_before(qp->comp.psn, limit)) qp->comp.psn = limit;
        return true;
      }
      st.state = wqe_state::done;
      st.status = wc_status::success;
      qp->comp.psn = psn_add(st.last_psn, 1);
      // An ATOMIC WRITE has no result to wait for: a later acknowledgement
      // completes it as it would a WRITE (rxe too), and returns its credit.
      if (is_atomic_write(w->opcode)) --qp->req.rd_atomic;
    }
    return true;
  };

  if (malformed) {
    // What lies wholly before it was still acknowledged (rxe's check_psn()
    // completes it first); the response fails the WQE it answers, or a
    // READ or atomic before it whose response was skipped.
    acked_below(psn);
    fail_oldest(qp, wc_status::bad_resp_err);
    return;
  }

  // The oldest unfinished WQE, if started.
  // Something was acknowledged: the retry budgets refill and the retry
  // state of the old position ends (rxe's reset_retry_counters).
  // Returns whether the progress answers a tail probe by acknowledging
  // exactly the probed packet with more sent behind it: the responder had
  // lost it, and dropped what came after.
  auto note_progress = [&] {
    if (qp->comp.psn == before) return false;
    const bool hole = qp->comp.probed && !qp->comp.probe_read &&
                      qp->comp.psn == psn_add(qp->comp.probe_psn, 1) &&
                      psn_before(qp->comp.psn, qp->req.sent_psn);
    qp->comp.gap_retry = false;
    qp->comp.retry_counted = false;
    qp->comp.ask_all = false;
    qp->comp.nak_retries = 0;
    qp->comp.probed = false;
    qp->comp.probes_sent = 0;
    qp->comp.probe_read = false;
    qp->comp.retry_left = qp->retry_cnt;
    qp->comp.rnr_left = qp->rnr_retry;
    return hole;
  };

  auto after_progress = [&] {
    const bool hole = note_progress();
    if (qp->comp.psn != qp->req.next_psn) {
      if (qp->comp.psn != before || !qp->comp.timer_armed) arm_retry_timer(qp);
    } else {
      qp->comp.timer_armed = false;
    }
    complete_wqes(qp);
    if (hole && (qp->state == qp_state::rts || qp->state == qp_state::sqd) && !qp->comp.rnr_waiting)
      retry(qp, false);  // go back N from the hole the probe filled
  };

  // A response is missing: go back once, after the progress that came with
  // it, which ends the old position's retry state, gap_retry's included
  // (the other way round, the next response of the old stream went back
  // again).  A go-back for a hole the progress found is that one.
  auto after_progress_then_gap = [&] {
    const std::uint64_t resends = counters_.retransmits;
    after_progress();
    if (qp->state != qp_state::rts && qp->state != qp_state::sqd) return;
    if (counters_.retransmits == resends)
      gap_retry(qp);
    else
      qp->comp.gap_retry = true;
  };

  if (has_aeth && type == wire::aeth_type::rnr_nak) {
    // IBTA 9.7.5.2.8: the request at `psn` found no receive; everything
    // before it arrived.  Wait the RNR time, then resend from it.
    ++counters_.rnr_naks_received;
    if (psn_before(psn, qp->comp.psn)) return;  // stale
    // Another for the request whose RNR wait is under way (a tail probe's,
    // a duplicate on the wire): the same refusal, not a second retry.
    if (qp->comp.rnr_waiting && psn == qp->comp.psn) return;
    if (!acked_below(psn)) {
      after_progress_then_gap();
      return;
    }
    // It may acknowledge earlier requests: progress refills the RNR budget
    // before this NAK spends from it.
    note_progress();
    if (qp->rnr_retry != 7) {  // 7 retries forever
      if (qp->comp.rnr_left == 0) {
        fail_oldest(qp, wc_status::rnr_retry_exc_err);
        return;
      }
      --qp->comp.rnr_left;
    }
    // The responder answered: the timeouts counted so far were not a dead
    // peer.  (Without this, a long RNR phase on a lossy link adds up its
    // occasional lost SEND or NAK into retry_exc_err.)
    qp->comp.retry_left = qp->retry_cnt;
    qp->comp.retry_counted = false;
    // It answers a tail probe too: the resend after the wait may arm one.
    qp->comp.probed = false;
    qp->comp.probes_sent = 0;
    qp->comp.probe_read = false;
    disarm_timers(qp);
    qp->comp.rnr_waiting = true;
    schedule_qp_timer(
        qp, deadline_after(clock_->now(), std::chrono::nanoseconds(wire::rnr_timer_ns(syn & 0x1F))), true);
    complete_wqes(qp);
    return;
  }

  if (has_aeth && type == wire::aeth_type::nak) {
    if (psn_before(psn, qp->comp.psn)) return;  // stale
    const bool complete_before = acked_below(psn);
    const auto code = static_cast<wire::nak_code>(syn & 0x1F);
    if (code == wire::nak_code::psn_sequence_error) {
      // IBTA 9.7.5.2.3: the responder expects `psn`; go back to it (or to
      // an earlier READ/atomic whose response was lost).  A NAK that
      // acknowledged something is progress: the retry budget refills.
      // While an RNR wait is running, the resend it schedules covers this.
      (void)complete_before;
      if (qp->comp.rnr_waiting && qp->comp.psn == before) return;
      //
      //
      // Only the first NAK after progress counts against retry_cnt (as
      // rxe, whose completer starts no second retry sequence before a
      // response or a timeout).  The responder repeats its NAK while the
      // gap persists: a repeat that arrives while we are still resending
      // from that PSN is answered by the resend under way; one that
      // arrives after it means the resend was lost too, and going back
      // again at once saves a timeout.  The timer keeps running and still
      // counts a peer that never accepts anything.
      // Repeats are bounded (limits::max_nak_retries): each resend moves
      // the retransmit deadline, so a peer that NAKs the same PSN forever
      // would otherwise never let the timer count it out.
      // The count saturates: it must not wrap to zero under a flood.
      if (qp->comp.psn != before) {
        note_progress();
      } else if (qp->comp.retry_counted &&
                 (resending(qp) || qp->comp.nak_retries >= limits::max_nak_retries)) {
        return;
      } else if (qp->comp.retry_counted) {
        ++qp->comp.nak_retries;
      }
      complete_wqes(qp);
      if (qp->state == qp_state::rts || qp->state == qp_state::sqd) retry(qp, !qp->comp.retry_counted);
      return;
    }
    // An earlier READ or atomic whose response never came: the NAK cannot
    // answer for it (only its own response can), so it is asked again,
    // as rxe's check_psn() retries it; the NAK will come again if the
    // responder still means it.
    if (!complete_before) {
      after_progress_then_gap();
      return;
    }
    // The WQE holding `psn` fails; the QP goes to error.  A reserved NAK
    // code is a remote operational error, as rxe has it.
    const wc_status st = code == wire::nak_code::invalid_request       ? wc_status::rem_inv_req_err
                         : code == wire::nak_code::remote_access_error ? wc_status::rem_access_err
                                                                       : wc_status::rem_op_err;
    fail_oldest(qp, st);
    return;
  }

  // ACK, READ response, atomic ACK.
  if (psn_before(psn, qp->comp.psn)) {
    ++counters_.duplicates_received;  // stale or duplicate
    return;
  }
  if ((ops & wire::op_read) == 0 && p->hdr.bth.opcode != static_cast<std::uint8_t>(opcode::rc_atomic_ack)) {
    // A plain ACK covers every PSN up to and including `psn`.
    if (!acked_below(psn_add(psn, 1)))
      after_progress_then_gap();  // a READ/atomic response is missing
    else
      after_progress();
    return;
  }
  // A READ response or atomic ACK at `psn` also acknowledges every request
  // before it (IBTA 9.7.6.1.1: responses come in order).
  if (!acked_below(psn)) {
    after_progress_then_gap();
    return;
  }
  std::uint32_t i = 0;
  send_state* st = oldest_unfinished(qp, i);
  if (st == nullptr) {
    after_progress();
    return;
  }
  auto* w = qp->sq.at<send_wqe>(i);
  if (psn != qp->comp.psn || psn_before(psn, st->first_psn) || psn_before(st->last_psn, psn)) {
    if (psn_before(qp->comp.psn, psn))
      after_progress_then_gap();  // an earlier response was lost
    else
      after_progress();
    return;
  }
  if ((ops & wire::op_read) != 0 && is_atomic_write(w->opcode)) {
    // An ATOMIC WRITE is answered by an empty READ Response Only, as rxe
    // answers it, or by an ACK (above).
    if (p->hdr.bth.opcode != static_cast<std::uint8_t>(opcode::rc_read_response_only) ||
        p->payload_len != 0) {
      fail_oldest(qp, wc_status::bad_resp_err);
      return;
    }
    st->state = wqe_state::done;
    st->status = wc_status::success;
    --qp->req.rd_atomic;
    qp->comp.psn = psn_add(psn, 1);
  } else if ((ops & wire::op_read) != 0) {
    if (!is_read(w->opcode)) {
      fail_oldest(qp, wc_status::bad_resp_err);  // a READ response for something else
      return;
    }
    // The responses must add up to the READ: FIRST and MIDDLE one path
    // MTU each with more to come, LAST and ONLY exactly what is left, and
    // a MIDDLE or LAST only after data.  (A resent READ asks for what is
    // left, so its FIRST or ONLY may come where a MIDDLE would have.)
    // Otherwise -- a peer with another path MTU, or a forged stream --
    // the READ would never complete and, with nothing left outstanding,
    // no timer would end it.
    const std::uint32_t left = w->length - st->read_done;
    const bool starts = (ops & wire::op_first) != 0, ends = (ops & wire::op_last) != 0;  // ONLY: both
    // And they end at the READ's last PSN: a LAST or ONLY that brings the
    // whole rest in one packet longer than the path MTU (a peer of a
    // larger MTU) would leave comp.psn inside a retired WQE's range.
    const bool fits = ends ? p->payload_len == left && psn == st->last_psn
                           : p->payload_len == qp->mtu_bytes && left > qp->mtu_bytes && psn != st->last_psn;
    if (!fits || (!starts && st->read_done == 0)) {
      fail_oldest(qp, wc_status::bad_resp_err);
      return;
    }
    // Place the data where the READ asked for it, in PSN order.
    if (p->payload_len != 0 && !copy_to_sges(qp->pd, w->sges(), w->num_sge, st->read_done, p, 0, p->payload_len)) {
      fail_oldest(qp, wc_status::loc_prot_err);
      return;
    }
    st->read_done += p->payload_len;
    qp->comp.psn = psn_add(psn, 1);
    if ((ops & (wire::op_last | wire::op_only)) != 0) {
      st->state = wqe_state::done;
      st->status = wc_status::success;
      --qp->req.rd_atomic;
    }
  } else {
    if (!is_atomic(w->opcode)) {
      fail_oldest(qp, wc_status::bad_resp_err);
      return;
    }
    const std::uint64_t orig = p->hdr.atomic_ack;
    packet tmp{};
    tmp.segs[0] = {reinterpret_cast<const std::byte*>(&orig), 8};
    tmp.nsegs = 1;
    tmp.payload_len = 8;
    st->state = wqe_state::done;
    st->status = copy_to_sges(qp->pd, w->sges(), w->num_sge, 0, &tmp, 0, 8) ? wc_status::success
                                                                            : wc_status::loc_prot_err;
    --qp->req.rd_atomic;
    qp->comp.psn = psn_add(psn, 1);
  }
  after_progress();
}

}  // namespace averbs::soft
