// SPDX-License-Identifier: MIT
// One side of a two-process (or two-host) RDMA exchange over RoCEv2/UDP.
// The server waits on an out-of-band TCP port; the client connects, and the
// two run every operation in turn, each checking what arrived byte by byte:
// SEND, SEND with immediate, RDMA WRITE, WRITE with immediate, RDMA READ,
// compare-and-swap, fetch-and-add (exactly once), ATOMIC WRITE, a SEND
// that meets an empty receive queue (RNR, then delivered), a SEND with
// invalidate of a type-2 window's R_Key, and UD and UC
// traffic (whole where it arrives; all of it without faults).  Exit status 0 means every
// check passed; anything else prints why.
//
//   peer --addr A[:port] --oob-port T [--connect HOST] [--faults SPEC]
// (A may be IPv4 or IPv6: "[v6]:port" or a bare v6 address.)
#include "perf/oob.hpp"

#include <averbs/verbs.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace averbs;
using averbs::perf::oob;
using averbs::perf::peer_info;

namespace {

constexpr std::size_t msgs = 32;
constexpr std::size_t msg_size = 6000;  // 6 packets at MTU 1024
constexpr std::size_t area = msgs * msg_size;

std::uint8_t pattern(std::size_t phase, std::size_t m, std::size_t i) {
  return static_cast<std::uint8_t>(phase * 131 + m * 31 + i * 7 + 1);
}

struct side {
  device dev;
  pd p;
  cq c;
  qp q;
  std::vector<std::byte> buf;  // [0, area): receive/target area, [area, 2 area): source area
  mr m;
  oob link;
  peer_info peer;
  bool server = false;

  std::uint64_t addr(std::size_t off) const { return reinterpret_cast<std::uintptr_t>(buf.data()) + off; }

  // Waits for the peer's word while keeping this device's engine running
  // (one-sided operations need the responder to run).
  std::uint64_t wait_word() {
    while (!link.readable()) c.poll({});
    return link.recv_word();
  }

  std::vector<work_completion> poll(std::size_t n) {
    std::vector<work_completion> out;
    work_completion wc[16];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (out.size() < n) {
      if (std::chrono::steady_clock::now() > until) throw std::runtime_error("timed out waiting for completions");
      const std::size_t got = c.poll({wc, std::min<std::size_t>(16, n - out.size())});
      out.insert(out.end(), wc, wc + got);
    }
    return out;
  }

  void post_send(wr_opcode op, std::uint64_t id, std::size_t off, std::size_t len, std::uint64_t raddr = 0,
                 std::uint32_t imm = 0, std::uint64_t add = 0, std::uint64_t swap = 0) {
    sge g{addr(off), static_cast<std::uint32_t>(len), m.lkey()};
    send_wr w;
    w.wr_id = id;
    w.opcode = op;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.remote_addr = raddr;
    w.rkey = peer.rkey;
    w.imm_data = imm;
    w.compare_add = add;
    w.swap = swap;
    if (auto ec = q.post_send(w)) throw std::runtime_error("post_send: " + ec.message());
  }
  void post_recv(std::uint64_t id, std::size_t off, std::size_t len) {
    sge g{addr(off), static_cast<std::uint32_t>(len), m.lkey()};
    recv_wr r;
    r.wr_id = id;
    r.sg_list = &g;
    r.num_sge = 1;
    if (auto ec = q.post_recv(r)) throw std::runtime_error("post_recv: " + ec.message());
  }
};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void expect_once(const std::vector<work_completion>& wcs, std::size_t n, const char* what) {
  std::set<std::uint64_t> ids;
  for (const auto& wc : wcs) {
    check(wc.status == wc_status::success, std::string(what) + ": wr " + std::to_string(wc.wr_id) + " " +
                                               std::string(to_string(wc.status)));
    check(ids.insert(wc.wr_id).second, std::string(what) + ": wr " + std::to_string(wc.wr_id) + " twice");
  }
  check(ids.size() == n, std::string(what) + ": " + std::to_string(ids.size()) + " completions");
}

void fill(side& s, std::size_t base, std::size_t phase) {
  for (std::size_t m = 0; m < msgs; ++m)
    for (std::size_t i = 0; i < msg_size; ++i) s.buf[base + m * msg_size + i] = std::byte(pattern(phase, m, i));
}

bool region_ok(const side& s, std::size_t base, std::size_t phase, std::size_t m) {
  for (std::size_t i = 0; i < msg_size; ++i)
    if (s.buf[base + m * msg_size + i] != std::byte(pattern(phase, m, i))) return false;
  return true;
}

// Phase 1 and 2: SEND and SEND with immediate, client to server.
void sends(side& s, std::size_t phase, bool imm) {
  const char* what = imm ? "send_with_imm" : "send";
  if (s.server) {
    for (std::size_t m = 0; m < msgs; ++m) s.post_recv(m, m * msg_size, msg_size);
    s.link.send_word(1);
    auto wcs = s.poll(msgs);
    expect_once(wcs, msgs, what);
    for (const auto& wc : wcs) {
      check(wc.opcode == wc_opcode::recv && wc.byte_len == msg_size, std::string(what) + ": completion fields");
      check(!imm || ((wc.wc_flags & wc_with_imm) != 0 && wc.imm_data == 0xA0000000u + wc.wr_id),
            std::string(what) + ": immediate data");
      check(region_ok(s, 0, phase, wc.wr_id), std::string(what) + ": bytes of message " + std::to_string(wc.wr_id));
    }
    s.link.send_word(2);
  } else {
    fill(s, area, phase);
    (void)s.wait_word();
    for (std::size_t m = 0; m < msgs; ++m)
      s.post_send(imm ? wr_opcode::send_with_imm : wr_opcode::send, m, area + m * msg_size, msg_size, 0,
                  0xA0000000u + static_cast<std::uint32_t>(m));
    expect_once(s.poll(msgs), msgs, what);
    check(s.wait_word() == 2, std::string(what) + ": server check");
  }
}

// Phase 3: RDMA WRITE; the server checks the bytes.
void writes(side& s, std::size_t phase) {
  if (s.server) {
    check(s.wait_word() == 3, "write: sync");
    for (std::size_t m = 0; m < msgs; ++m) check(region_ok(s, 0, phase, m), "write: bytes of message " + std::to_string(m));
    s.link.send_word(4);
  } else {
    fill(s, area, phase);
    for (std::size_t m = 0; m < msgs; ++m)
      s.post_send(wr_opcode::rdma_write, m, area + m * msg_size, msg_size, s.peer.addr + m * msg_size);
    expect_once(s.poll(msgs), msgs, "write");
    s.link.send_word(3);
    check(s.wait_word() == 4, "write: server check");
  }
}

// Phase 4: WRITE with immediate: data at the address, a receive per message.
void writes_imm(side& s, std::size_t phase) {
  if (s.server) {
    for (std::size_t m = 0; m < msgs; ++m) s.post_recv(m, 0, 0);
    s.link.send_word(5);
    auto wcs = s.poll(msgs);
    std::set<std::uint32_t> imms;
    for (const auto& wc : wcs) {
      check(wc.status == wc_status::success && wc.opcode == wc_opcode::recv_rdma_with_imm && wc.byte_len == msg_size,
            "write_with_imm: completion");
      imms.insert(wc.imm_data);
    }
    check(imms.size() == msgs, "write_with_imm: immediates");
    for (std::size_t m = 0; m < msgs; ++m) check(region_ok(s, 0, phase, m), "write_with_imm: bytes");
    s.link.send_word(6);
  } else {
    fill(s, area, phase);
    (void)s.wait_word();
    for (std::size_t m = 0; m < msgs; ++m)
      s.post_send(wr_opcode::rdma_write_with_imm, m, area + m * msg_size, msg_size, s.peer.addr + m * msg_size,
                  static_cast<std::uint32_t>(m));
    expect_once(s.poll(msgs), msgs, "write_with_imm");
    check(s.wait_word() == 6, "write_with_imm: server check");
  }
}

// Phase 5: RDMA READ of the server's pattern; the client checks.
void reads(side& s, std::size_t phase) {
  if (s.server) {
    fill(s, area, phase);
    s.link.send_word(7);
    check(s.wait_word() == 8, "read: sync");
  } else {
    (void)s.wait_word();
    std::memset(s.buf.data(), 0, area);
    for (std::size_t m = 0; m < msgs; ++m)
      s.post_send(wr_opcode::rdma_read, m, m * msg_size, msg_size, s.peer.addr + area + m * msg_size);
    expect_once(s.poll(msgs), msgs, "read");
    for (std::size_t m = 0; m < msgs; ++m) check(region_ok(s, 0, phase, m), "read: bytes of message " + std::to_string(m));
    s.link.send_word(8);
  }
}

// Phase 6: atomics execute exactly once; a compare-and-swap returns the
// old value, and swaps only on a match; an ATOMIC WRITE stores its 8 bytes.
constexpr std::uint64_t atomic_written = 0x0123456789ABCDEFull;

void atomics(side& s) {
  constexpr std::size_t n = 100;
  if (s.server) {
    std::memset(s.buf.data(), 0, 24);
    s.link.send_word(9);
    check(s.wait_word() == 10, "atomic: sync");
    std::uint64_t counter, swapped, written;
    std::memcpy(&counter, s.buf.data(), 8);
    std::memcpy(&swapped, s.buf.data() + 8, 8);
    std::memcpy(&written, s.buf.data() + 16, 8);
    check(counter == n, "fetch_and_add applied " + std::to_string(counter) + " times, not " + std::to_string(n));
    check(swapped == 0xFEED, "compare_and_swap result");
    check(written == atomic_written, "atomic_write result");
    s.link.send_word(11);
  } else {
    (void)s.wait_word();
    for (std::size_t i = 0; i < n; ++i)
      s.post_send(wr_opcode::atomic_fetch_and_add, i, area + 8 * i, 8, s.peer.addr, 0, 1);
    expect_once(s.poll(n), n, "fetch_and_add");
    std::set<std::uint64_t> olds;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t v;
      std::memcpy(&v, s.buf.data() + area + 8 * i, 8);
      olds.insert(v);
    }
    check(olds.size() == n && *olds.rbegin() == n - 1, "fetch_and_add old values");
    auto old_value = [&] {
      std::uint64_t v;
      std::memcpy(&v, s.buf.data() + area, 8);
      return v;
    };
    s.post_send(wr_opcode::atomic_cmp_and_swp, 1000, area, 8, s.peer.addr + 8, 0, 0, 0xFEED);
    expect_once(s.poll(1), 1, "compare_and_swap");
    check(old_value() == 0, "compare_and_swap old value");
    s.post_send(wr_opcode::atomic_cmp_and_swp, 1001, area, 8, s.peer.addr + 8, 0, 0, 0xBAD);  // 0xFEED != 0
    expect_once(s.poll(1), 1, "compare_and_swap that does not match");
    check(old_value() == 0xFEED, "compare_and_swap that does not match: old value");
    std::memcpy(s.buf.data() + area + 8, &atomic_written, 8);
    s.post_send(wr_opcode::atomic_write, 1002, area + 8, 8, s.peer.addr + 16);
    expect_once(s.poll(1), 1, "atomic_write");
    s.link.send_word(10);
    check(s.wait_word() == 11, "atomic: server check");
  }
}

// Phase 7: a SEND meets no receive (RNR NAK), then one is posted.
void rnr(side& s, std::size_t phase) {
  if (s.server) {
    const std::uint64_t rnr_before = s.dev.counters().rnr_naks_sent;
    s.link.send_word(12);
    // Keep the engine running (it must answer with RNR NAKs) while the
    // receive queue stays empty, until the client's SEND has met it (a
    // fixed wait failed when the client was descheduled for longer).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (s.dev.counters().rnr_naks_sent == rnr_before && std::chrono::steady_clock::now() < until)
      s.c.poll({});
    s.post_recv(77, 0, msg_size);
    auto wcs = s.poll(1);
    check(wcs[0].status == wc_status::success && wcs[0].wr_id == 77, "rnr: receive");
    check(region_ok(s, 0, phase, 0), "rnr: bytes");
    check(s.dev.counters().rnr_naks_sent > rnr_before, "rnr: no RNR NAK was sent");
    s.link.send_word(13);
    // The last exchange: stay (and keep answering) until the client's SEND
    // has completed there too.  Exiting at once would leave a lost ACK
    // unanswerable, and the client's retries would end in retry_exc_err.
    check(s.wait_word() == 14, "rnr: client done");
  } else {
    fill(s, area, phase);
    (void)s.wait_word();
    s.post_send(wr_opcode::send, 1, area, msg_size);
    expect_once(s.poll(1), 1, "rnr send");
    check(s.wait_word() == 13, "rnr: server check");
    s.link.send_word(14);
  }
}

// Phase 8: SEND with invalidate.  The server binds a type-2 window over
// the first message's place in its receive area; the client WRITEs
// through it, then names its R_Key in a SEND with invalidate.  The
// server's receive reports that key, and the window is free again: it
// binds anew (a bound type-2 window cannot be).
void invalidate(side& s, std::size_t phase) {
  auto bind = [&](mw& w, std::uint32_t key) {
    send_wr b;
    b.wr_id = 90;
    b.opcode = wr_opcode::bind_mw;
    b.flags = send_signaled;
    b.bind_mw = &w;
    b.bind_rkey = key;
    b.bind_info = {s.m.lkey(), s.addr(0), msg_size, access_remote_write};
    if (auto ec = s.q.post_send(b)) throw std::runtime_error("bind: " + ec.message());
    const auto wcs = s.poll(1);
    return wcs[0].status == wc_status::success && wcs[0].opcode == wc_opcode::bind_mw;
  };
  auto next_key = [](std::uint32_t k) { return (k & ~0xFFu) | ((k + 1) & 0xFFu); };
  if (s.server) {
    mw w = s.p.alloc_mw(mw_type::type2);
    const std::uint32_t key = next_key(w.rkey());
    check(bind(w, key), "send_with_inv: bind");
    s.post_recv(91, msg_size, msg_size);
    s.link.send_word(key);
    const auto wcs = s.poll(1);
    check(wcs[0].status == wc_status::success && wcs[0].wr_id == 91 && wcs[0].byte_len == msg_size,
          "send_with_inv: receive " + std::string(to_string(wcs[0].status)));
    check((wcs[0].wc_flags & (wc_with_inv | wc_with_imm)) == wc_with_inv && wcs[0].imm_data == key,
          "send_with_inv: the receive does not report the invalidated key");
    check(region_ok(s, 0, phase, 0), "send_with_inv: bytes written through the window");
    check(region_ok(s, 0, phase, 1), "send_with_inv: bytes of the SEND");
    check(bind(w, next_key(key)), "send_with_inv: the window was not free after the invalidation");
    s.link.send_word(15);
    check(s.wait_word() == 16, "send_with_inv: client done");
  } else {
    fill(s, area, phase);
    const auto key = static_cast<std::uint32_t>(s.wait_word());
    sge g{s.addr(area), static_cast<std::uint32_t>(msg_size), s.m.lkey()};
    send_wr w;
    w.wr_id = 1;
    w.opcode = wr_opcode::rdma_write;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.remote_addr = s.peer.addr;
    w.rkey = key;
    if (auto ec = s.q.post_send(w)) throw std::runtime_error("post_send: " + ec.message());
    sge g2{s.addr(area + msg_size), static_cast<std::uint32_t>(msg_size), s.m.lkey()};
    send_wr inv;
    inv.wr_id = 2;
    inv.opcode = wr_opcode::send_with_inv;
    inv.sg_list = &g2;
    inv.num_sge = 1;
    inv.flags = send_signaled;
    inv.imm_data = key;  // the R_Key to invalidate
    if (auto ec = s.q.post_send(inv)) throw std::runtime_error("post_send: " + ec.message());
    expect_once(s.poll(2), 2, "send_with_inv");
    check(s.wait_word() == 15, "send_with_inv: server check");
    s.link.send_word(16);
  }
}

// Phase 9: UD and UC between the processes, which nothing resends: under
// injected faults some datagrams and messages are lost, and what arrives
// must be whole; without faults everything arrives.  UD datagrams go
// client to server, carry the GRH area and the sender's QP, and the server
// answers through init_ah_from_wc(); UC SENDs go client to server.
void unreliable(side& s, bool lossy) {
  constexpr std::size_t phase = 9;
  constexpr std::size_t n = 16, ud_len = 1000, uc_len = 3000;  // a UC message: 3 packets
  // What earlier phases left in the receive area must not pass for a
  // message that never came.
  std::fill(s.buf.begin(), s.buf.begin() + area, std::byte{0});
  constexpr std::size_t ud_slot = ud_len + 40, uc_base = n * ud_slot, replies = 8;
  constexpr std::uint32_t qkey = 0x11111111;
  qp_init_attr ia;
  ia.send_cq = s.c;
  ia.recv_cq = s.c;
  ia.cap = {64, 64, 1, 1, 0};
  ia.type = qp_type::ud;
  qp ud = s.p.create_qp(ia);
  ia.type = qp_type::uc;
  qp uc = s.p.create_qp(ia);
  qp_attr at;
  at.state = qp_state::init;
  at.port_num = 1;
  at.qkey = qkey;
  ud.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_qkey);
  at = {};
  at.state = qp_state::rtr;
  ud.modify(at, qp_attr_state);
  at.state = qp_state::rts;
  ud.modify(at, qp_attr_state | qp_attr_sq_psn);
  at = {};
  at.state = qp_state::init;
  at.port_num = 1;
  at.qp_access_flags = access_local_write | access_remote_write;
  uc.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_access_flags);
  s.link.send_word(ud.num());
  s.link.send_word(uc.num());
  const auto peer_ud = static_cast<std::uint32_t>(s.wait_word());
  const auto peer_uc = static_cast<std::uint32_t>(s.wait_word());
  at = {};
  at.state = qp_state::rtr;
  at.path_mtu = mtu::mtu_1024;
  at.dest_qp_num = peer_uc;
  at.ah.is_global = true;
  at.ah.grh.dgid = s.peer.g;
  uc.modify(at, qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn);
  at = {};
  at.state = qp_state::rts;
  uc.modify(at, qp_attr_state | qp_attr_sq_psn);
  auto post_recv_on = [&](const qp& q, std::uint64_t id, std::size_t off, std::size_t len) {
    sge g{s.addr(off), static_cast<std::uint32_t>(len), s.m.lkey()};
    recv_wr r;
    r.wr_id = id;
    r.sg_list = &g;
    r.num_sge = 1;
    if (auto ec = q.post_recv(r)) throw std::runtime_error("post_recv: " + ec.message());
  };
  auto ud_send = [&](const ah& h, std::uint32_t to, std::uint64_t id, std::size_t off, std::size_t len) {
    sge g{s.addr(off), static_cast<std::uint32_t>(len), s.m.lkey()};
    send_wr w;
    w.wr_id = id;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.ah = &h;
    w.remote_qpn = to;
    w.remote_qkey = qkey;
    if (auto ec = ud.post_send(w)) throw std::runtime_error("post_send (UD): " + ec.message());
  };
  // What arrives within a while after the sender is done.
  auto drain = [&](std::chrono::milliseconds d) {
    std::vector<work_completion> out;
    work_completion wc[16];
    for (const auto until = std::chrono::steady_clock::now() + d; std::chrono::steady_clock::now() < until;)
      out.insert(out.end(), wc, wc + s.c.poll(wc));
    return out;
  };
  // Receive k holds a message m after the one before it (under faults any
  // m: duplicated and reordered packets are UD's and UC's to deliver): the
  // one whose first byte it starts with (pattern(phase, m, 0) differs for
  // every m < 256), whole.
  auto whole = [&](std::size_t off, std::size_t len, std::size_t& next) {
    std::size_t m = lossy ? 0 : next;
    while (m < n && s.buf[off] != std::byte(pattern(phase, m, 0))) ++m;
    if (m == n) return false;
    for (std::size_t i = 0; i < len; ++i)
      if (s.buf[off + i] != std::byte(pattern(phase, m, i))) return false;
    next = m + 1;
    return true;
  };
  if (s.server) {
    for (std::size_t k = 0; k < n; ++k) post_recv_on(ud, k, k * ud_slot, ud_slot);
    for (std::size_t k = 0; k < n; ++k) post_recv_on(uc, 100 + k, uc_base + k * uc_len, uc_len);
    s.link.send_word(20);
    check(s.wait_word() == 21, "unreliable: sync");
    const auto wcs = drain(std::chrono::milliseconds(300));
    std::size_t got_ud = 0, got_uc = 0, next_ud = 0, next_uc = 0;
    const work_completion* first_ud = nullptr;
    for (const auto& wc : wcs) {
      check(wc.status == wc_status::success, "unreliable: receive " + std::string(to_string(wc.status)));
      if (wc.qp_num == ud.num()) {
        check(wc.wr_id == got_ud, "UD: receives complete in order");
        check((wc.wc_flags & wc_grh) != 0 && wc.src_qp == peer_ud && wc.byte_len == ud_slot,
              "UD: completion fields");
        check(whole(wc.wr_id * ud_slot + 40, ud_len, next_ud), "UD: datagram bytes");
        if (first_ud == nullptr) first_ud = &wc;
        ++got_ud;
      } else {
        check(wc.qp_num == uc.num() && wc.wr_id == 100 + got_uc && wc.byte_len == uc_len,
              "UC: completion fields");
        check(whole(uc_base + got_uc * uc_len, uc_len, next_uc), "UC: message bytes");
        ++got_uc;
      }
    }
    check(lossy ? got_ud > 0 && got_uc > 0 : got_ud == n && got_uc == n,
          "unreliable: " + std::to_string(got_ud) + " UD datagrams and " + std::to_string(got_uc) +
              " UC messages of " + std::to_string(n) + " arrived");
    // Answer the sender from what its datagram said.
    std::span<const std::byte, 40> grh(s.buf.data() + first_ud->wr_id * ud_slot, 40);
    const ah back = s.p.create_ah(s.dev.init_ah_from_wc(1, *first_ud, grh));
    for (std::size_t k = 0; k < replies; ++k) ud_send(back, first_ud->src_qp, 200 + k, 0, 64);
    const auto sent = drain(std::chrono::milliseconds(50));
    check(sent.size() == replies, "UD replies: " + std::to_string(sent.size()) + " send completions");
    s.link.send_word(22);
    check(s.wait_word() == 23, "unreliable: client done");
  } else {
    for (std::size_t m = 0; m < n; ++m)
      for (std::size_t i = 0; i < uc_len; ++i) s.buf[area + m * uc_len + i] = std::byte(pattern(phase, m, i));
    for (std::size_t k = 0; k < replies; ++k) post_recv_on(ud, 300 + k, k * 128, 40 + 64);
    check(s.wait_word() == 20, "unreliable: sync");
    ah_attr a;
    a.is_global = true;
    a.port_num = 1;
    a.grh.dgid = s.peer.g;
    const ah to_server = s.p.create_ah(a);
    for (std::size_t m = 0; m < n; ++m) ud_send(to_server, peer_ud, m, area + m * uc_len, ud_len);
    for (std::size_t m = 0; m < n; ++m) {
      sge g{s.addr(area + m * uc_len), static_cast<std::uint32_t>(uc_len), s.m.lkey()};
      send_wr w;
      w.wr_id = 100 + m;
      w.sg_list = &g;
      w.num_sge = 1;
      w.flags = send_signaled;
      if (auto ec = uc.post_send(w)) throw std::runtime_error("post_send (UC): " + ec.message());
    }
    expect_once(s.poll(2 * n), 2 * n, "UD and UC sends");
    s.link.send_word(21);
    check(s.wait_word() == 22, "unreliable: replies sent");
    const auto wcs = drain(std::chrono::milliseconds(200));
    std::size_t replies_got = 0;
    for (const auto& wc : wcs)
      if (wc.status == wc_status::success && wc.qp_num == ud.num() && (wc.wc_flags & wc_grh) != 0 &&
          wc.byte_len == 40 + 64)
        ++replies_got;
    check(lossy ? replies_got > 0 : replies_got == replies,
          "UD replies: " + std::to_string(replies_got) + " of " + std::to_string(replies) + " arrived");
    s.link.send_word(23);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr, host, faults;
  std::uint16_t oob_port = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "peer: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--addr") addr = value();
    else if (a == "--oob-port") oob_port = static_cast<std::uint16_t>(std::atoi(value().c_str()));
    else if (a == "--connect") host = value();
    else if (a == "--faults") faults = value();
    else {
      std::fprintf(stderr, "peer: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    soft_device_options o;
    o.name = "peer";
    const auto colon = addr.rfind(':');
    if (!addr.empty() && addr.front() == '[') {  // [v6]:port
      const auto close = addr.find(']');
      o.address = addr.substr(1, close - 1);
      if (close + 2 < addr.size()) o.port = static_cast<std::uint16_t>(std::atoi(addr.c_str() + close + 2));
    } else if (colon != std::string::npos && addr.find(':') == colon) {
      o.address = addr.substr(0, colon);
      o.port = static_cast<std::uint16_t>(std::atoi(addr.c_str() + colon + 1));
    } else {
      o.address = addr;
    }
    o.faults = faults;
    soft_device sdev(o);
    context ctx;
    side s;
    s.server = host.empty();
    s.dev = open_device(ctx, "peer");
    s.p = s.dev.alloc_pd();
    s.c = s.dev.create_cq(1024);
    qp_init_attr ia;
    ia.send_cq = s.c;
    ia.recv_cq = s.c;
    ia.cap = {256, 256, 1, 1, 0};
    s.q = s.p.create_qp(ia);
    s.buf.assign(2 * area, std::byte{0});
    s.m = s.p.reg_mr(s.buf.data(), s.buf.size(),
                     access_local_write | access_remote_write | access_remote_read | access_remote_atomic |
                         access_mw_bind);
    qp_attr at;
    at.state = qp_state::init;
    at.port_num = 1;
    at.qp_access_flags = access_local_write | access_remote_write | access_remote_read | access_remote_atomic;
    s.q.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_access_flags);
    const peer_info me{s.q.num(), 0x123456, s.dev.query_gid(1, 0), s.m.rkey(), s.addr(0), s.buf.size()};
    if (s.server) {
      oob l = oob::listen(o.address, oob_port);
      std::printf("listening\n");
      std::fflush(stdout);
      s.link = l.accept(std::chrono::seconds(60));
      s.peer = s.link.recv_info();
      s.link.send_info(me);
    } else {
      s.link = oob::connect(host, oob_port, std::chrono::seconds(30));
      s.link.send_info(me);
      s.peer = s.link.recv_info();
    }
    at = {};
    at.state = qp_state::rtr;
    at.path_mtu = mtu::mtu_1024;
    at.dest_qp_num = s.peer.qpn;
    at.rq_psn = s.peer.psn;
    at.max_dest_rd_atomic = 16;
    at.min_rnr_timer = 4;  // 40 us
    at.ah.is_global = true;
    at.ah.grh.dgid = s.peer.g;
    s.q.modify(at, qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn |
                       qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer);
    at = {};
    at.state = qp_state::rts;
    at.sq_psn = me.psn;
    at.timeout = 12;  // 17 ms: a loaded 2-core CI box may stall a process that long
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 16;
    s.q.modify(at, qp_attr_state | qp_attr_sq_psn | qp_attr_timeout | qp_attr_retry_cnt | qp_attr_rnr_retry |
                       qp_attr_max_qp_rd_atomic);
    s.link.send_word(0);
    (void)s.link.recv_word();

    try {
      sends(s, 1, false);
      sends(s, 2, true);
      writes(s, 3);
      writes_imm(s, 4);
      reads(s, 5);
      atomics(s);
      rnr(s, 7);
      invalidate(s, 8);
      unreliable(s, !faults.empty());
      const device_counters c = s.dev.counters();
      const std::uint64_t injected =
          c.faults_dropped + c.faults_duplicated + c.faults_corrupted + c.faults_delayed + c.faults_reordered;
      std::printf(
          "%s: all checks passed (%llu packets sent, %llu retransmits, %llu icrc errors, %llu dropped, "
          "faults injected %llu)\n",
          s.server ? "server" : "client", static_cast<unsigned long long>(c.packets_sent),
          static_cast<unsigned long long>(c.retransmits), static_cast<unsigned long long>(c.icrc_errors),
          static_cast<unsigned long long>(c.dropped), static_cast<unsigned long long>(injected));
    } catch (const std::exception& e) {
      // Here, while the device lives: what the link did.
      const device_counters c = s.dev.counters();
      std::fprintf(stderr, "peer (%s): %s\n", s.server ? "server" : "client", e.what());
      std::fprintf(stderr,
                   "  counters: sent %llu received %llu retransmits %llu rnr_naks sent %llu received %llu "
                   "seq_naks %llu dups %llu dropped %llu icrc %llu\n",
                   (unsigned long long)c.packets_sent, (unsigned long long)c.packets_received,
                   (unsigned long long)c.retransmits, (unsigned long long)c.rnr_naks_sent,
                   (unsigned long long)c.rnr_naks_received, (unsigned long long)c.seq_naks_sent,
                   (unsigned long long)c.duplicates_received, (unsigned long long)c.dropped,
                   (unsigned long long)c.icrc_errors);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer (%s): %s\n", host.empty() ? "server" : "client", e.what());
    return 1;
  }
}
