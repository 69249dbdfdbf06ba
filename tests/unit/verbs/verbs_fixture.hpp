// SPDX-License-Identifier: MIT
// Shared fixture for the verbs conformance tests: a private soft device per
// test (its own name and manual clock), a context, a PD, and helpers that
// create, connect and drive queue pairs the way rdma-core's tests/base.py
// does (RC: path MTU 1024, max_dest_rd_atomic 1, min_rnr_timer 12,
// timeout 14, retry 7, rnr_retry 7; UD Q_Key 0x11111111).
#pragma once

#include <averbs/verbs.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace averbs::test {

inline constexpr std::uint32_t ud_qkey = 0x11111111;

/// A buffer registered as an MR.
struct buffer {
  std::vector<std::byte> bytes;
  mr m;
  std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(bytes.data()); }
  sge whole() const { return {addr(), static_cast<std::uint32_t>(bytes.size()), m.lkey()}; }
  sge part(std::size_t off, std::size_t len) const {
    return {addr() + off, static_cast<std::uint32_t>(len), m.lkey()};
  }
  void fill(char c) { std::memset(bytes.data(), c, bytes.size()); }
  bool all(char c, std::size_t off = 0, std::size_t len = SIZE_MAX) const {
    len = std::min(len, bytes.size() - off);
    for (std::size_t i = 0; i < len; ++i)
      if (bytes[off + i] != std::byte(c)) return false;
    return true;
  }
};

struct qp_options {
  qp_type type = qp_type::rc;
  qp_cap cap{16, 16, 4, 4, 64};
  std::uint32_t access = access_local_write | access_remote_write | access_remote_read | access_remote_atomic;
  mtu path_mtu = mtu::mtu_1024;
  std::uint8_t max_rd_atomic = 1;
  std::uint8_t max_dest_rd_atomic = 1;
  std::uint8_t min_rnr_timer = 12;
  std::uint8_t timeout = 14;
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  bool sq_sig_all = false;
  bool use_srq = false;
};

class verbs_test : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    name_ = std::string("t_") + info->test_suite_name() + "." + info->name();
    dev_holder = std::make_unique<soft_device>(soft_device_options{name_, &clock, {gid::from_ipv4(0x7F000001)}});
    context_options o;
    o.clock = &clock;
    ctx = std::make_unique<context>(o);
    dev = open_device(*ctx, name_);
    pd_ = dev.alloc_pd();
  }
  void TearDown() override {
    qps.clear();
    pd_ = {};
    dev = {};
    ctx.reset();
    dev_holder.reset();
  }

  buffer make_buffer(std::size_t n, std::uint32_t access = access_local_write | access_remote_write |
                                                              access_remote_read | access_remote_atomic) {
    buffer b;
    b.bytes.resize(n);
    b.m = pd_.reg_mr(b.bytes.data(), n, access);
    return b;
  }

  qp make_qp(const qp_options& o, const cq& scq, const cq& rcq, const srq& s = {}) {
    qp_init_attr ia;
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.srq = s;
    ia.cap = o.cap;
    ia.type = o.type;
    ia.sq_sig_all = o.sq_sig_all;
    qp q = pd_.create_qp(ia);
    qps.push_back(q);
    return q;
  }

  static qp_attr init_attr(const qp_options& o) {
    qp_attr a;
    a.state = qp_state::init;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = o.access;
    a.qkey = ud_qkey;
    return a;
  }
  static std::uint32_t init_mask(qp_type t) {
    return qp_attr_state | qp_attr_pkey_index | qp_attr_port |
           (t == qp_type::ud ? qp_attr_qkey : qp_attr_access_flags);
  }
  qp_attr rtr_attr(const qp_options& o, std::uint32_t dest_qpn, std::uint32_t rq_psn) const {
    qp_attr a;
    a.state = qp_state::rtr;
    a.path_mtu = o.path_mtu;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = o.max_dest_rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    a.ah.is_global = true;
    a.ah.grh.dgid = gid::from_ipv4(0x7F000001);
    a.ah.grh.sgid_index = 0;
    a.ah.port_num = 1;
    return a;
  }
  static std::uint32_t rtr_mask(qp_type t) {
    if (t == qp_type::ud) return qp_attr_state;
    std::uint32_t m = qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn;
    if (t == qp_type::rc) m |= qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer;
    return m;
  }
  static qp_attr rts_attr(const qp_options& o, std::uint32_t sq_psn) {
    qp_attr a;
    a.state = qp_state::rts;
    a.sq_psn = sq_psn;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.max_rd_atomic;
    return a;
  }
  static std::uint32_t rts_mask(qp_type t) {
    if (t != qp_type::rc) return qp_attr_state | qp_attr_sq_psn;
    return qp_attr_state | qp_attr_sq_psn | qp_attr_timeout | qp_attr_retry_cnt | qp_attr_rnr_retry |
           qp_attr_max_qp_rd_atomic;
  }

  /// Moves a QP RESET -> INIT -> RTR -> RTS, pointing it at `dest_qpn`.
  void bring_up(const qp& q, const qp_options& o, std::uint32_t dest_qpn, std::uint32_t rq_psn = 0,
                std::uint32_t sq_psn = 0) {
    q.modify(init_attr(o), init_mask(o.type));
    q.modify(rtr_attr(o, dest_qpn, rq_psn), rtr_mask(o.type));
    q.modify(rts_attr(o, sq_psn), rts_mask(o.type));
  }

  /// Two connected QPs (RC/UC) or two ready UD QPs, each with its own CQ.
  struct pair {
    cq cq_a, cq_b;
    qp a, b;
  };
  pair connected_pair(const qp_options& o = {}) {
    pair p;
    p.cq_a = dev.create_cq(256);
    p.cq_b = dev.create_cq(256);
    p.a = make_qp(o, p.cq_a, p.cq_a);
    p.b = make_qp(o, p.cq_b, p.cq_b);
    bring_up(p.a, o, p.b.num(), 100, 200);
    bring_up(p.b, o, p.a.num(), 200, 100);
    return p;
  }

  /// Polls until `n` completions arrived (or the test's patience runs out,
  /// advancing the manual clock so retry timers can fire).
  std::vector<work_completion> poll(const cq& q, std::size_t n, std::chrono::milliseconds advance_per_try = {}) {
    std::vector<work_completion> out;
    work_completion wc[16];
    for (int tries = 0; tries < 10000 && out.size() < n; ++tries) {
      const std::size_t got = q.poll({wc, std::min<std::size_t>(16, n - out.size())});
      out.insert(out.end(), wc, wc + got);
      if (got == 0) {
        if (advance_per_try.count() != 0) clock.advance(advance_per_try);
        ctx->poll();
      }
    }
    return out;
  }
  work_completion poll_one(const cq& q) {
    auto v = poll(q, 1);
    EXPECT_EQ(v.size(), 1u) << "no completion";
    return v.empty() ? work_completion{} : v[0];
  }
  /// True if the CQ has nothing to report.
  bool quiet(const cq& q) {
    work_completion wc;
    return q.poll({&wc, 1}) == 0;
  }

  std::error_code post_send(const qp& q, wr_opcode op, const std::vector<sge>& sg, std::uint64_t wr_id = 1,
                            std::uint32_t flags = send_signaled, std::uint64_t raddr = 0, std::uint32_t rkey = 0) {
    send_wr wr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = sg.data();
    wr.num_sge = static_cast<std::uint32_t>(sg.size());
    wr.flags = flags;
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    return q.post_send(wr);
  }
  std::error_code post_recv(const qp& q, const std::vector<sge>& sg, std::uint64_t wr_id = 2) {
    recv_wr wr;
    wr.wr_id = wr_id;
    wr.sg_list = sg.data();
    wr.num_sge = static_cast<std::uint32_t>(sg.size());
    return q.post_recv(wr);
  }

  manual_clock clock;
  std::unique_ptr<soft_device> dev_holder;
  std::unique_ptr<context> ctx;
  device dev;
  pd pd_;
  std::vector<qp> qps;

 private:
  std::string name_;
};

}  // namespace averbs::test

// ---------------------------------------------------------------------------
// Additions for the conformance programs (traffic, mr, mw, cq, srq, atomic,
// events): builders for work requests, per-side QP options, UD address
// handles, byte patterns, and an event collector that never cancels (so a
// test never leaves a stale parked request behind).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>

namespace averbs::test {

/// `v` in network byte order: immediate data travels and is reported so.
inline std::uint32_t net32(std::uint32_t v) { return htonl(v); }

/// The next key of an R_Key: same index, key byte + 1 (`ibv_inc_rkey`).
/// The IPv4 hop limit the host's route gives (a fresh socket's default
/// TTL): what a RoCE AV's hop limit becomes.
inline int route_hop_limit() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int v = -1;
  socklen_t len = sizeof v;
  if (fd >= 0 && ::getsockopt(fd, IPPROTO_IP, IP_TTL, &v, &len) != 0) v = -1;
  if (fd >= 0) ::close(fd);
  return v;
}

inline std::uint32_t inc_rkey(std::uint32_t k) { return (k & ~0xFFu) | ((k + 1) & 0xFFu); }

/// Byte `i` of the deterministic pattern `seed` (never the same for two
/// nearby offsets, so a misplaced or missing byte shows).
inline std::byte pattern_byte(std::size_t i, unsigned seed) {
  return std::byte(static_cast<unsigned char>((i * 131u) ^ (i >> 8) ^ (seed * 29u + 7u)));
}
/// Fills [off, off + len) of `b` with pattern `seed`, counted from `off`.
inline void fill_pattern(buffer& b, unsigned seed, std::size_t off = 0, std::size_t len = SIZE_MAX) {
  len = std::min(len, b.bytes.size() - off);
  for (std::size_t i = 0; i < len; ++i) b.bytes[off + i] = pattern_byte(i, seed);
}
/// True if [off, off + len) of `b` holds pattern `seed` starting at pattern
/// position `from`.
inline bool has_pattern(const buffer& b, unsigned seed, std::size_t off, std::size_t len, std::size_t from = 0) {
  if (off + len > b.bytes.size()) return false;
  for (std::size_t i = 0; i < len; ++i)
    if (b.bytes[off + i] != pattern_byte(from + i, seed)) return false;
  return true;
}

/// A send work request over `sg` (which must outlive the post).
inline send_wr make_wr(wr_opcode op, const std::vector<sge>& sg, std::uint64_t wr_id = 1,
                       std::uint32_t flags = send_signaled, std::uint64_t raddr = 0, std::uint32_t rkey = 0) {
  send_wr w;
  w.wr_id = wr_id;
  w.opcode = op;
  w.sg_list = sg.empty() ? nullptr : sg.data();
  w.num_sge = static_cast<std::uint32_t>(sg.size());
  w.flags = flags;
  w.remote_addr = raddr;
  w.rkey = rkey;
  return w;
}

class conformance_test : public verbs_test {
 protected:
  void TearDown() override {
    event_req_ = {};
    verbs_test::TearDown();
  }

  /// Two connected QPs with per-side options (RC/UC) or two ready UD QPs;
  /// `a` gets a CQ of `cqe_a` entries, `b` one of `cqe_b`, and `b` uses
  /// `srq_b` if given.
  pair connect(const qp_options& oa, const qp_options& ob, std::uint32_t cqe_a = 256, std::uint32_t cqe_b = 256,
               const srq& srq_b = {}) {
    pair p;
    p.cq_a = dev.create_cq(cqe_a);
    p.cq_b = dev.create_cq(cqe_b);
    p.a = make_qp(oa, p.cq_a, p.cq_a);
    p.b = make_qp(ob, p.cq_b, p.cq_b, srq_b);
    bring_up(p.a, oa, p.b.num(), 100, 200);
    bring_up(p.b, ob, p.a.num(), 200, 100);
    return p;
  }

  /// Moves a QP RESET -> INIT -> RTR only (it accepts requests, sends nothing).
  void bring_to_rtr(const qp& q, const qp_options& o, std::uint32_t dest_qpn, std::uint32_t rq_psn) {
    q.modify(init_attr(o), init_mask(o.type));
    q.modify(rtr_attr(o, dest_qpn, rq_psn), rtr_mask(o.type));
  }

  /// An address handle for this device's own GID (UD loopback).
  ah make_ah() {
    ah_attr a;
    a.is_global = true;
    a.grh.dgid = gid::from_ipv4(0x7F000001);
    a.grh.sgid_index = 0;
    a.port_num = 1;
    return pd_.create_ah(a);
  }

  /// Posts one UD send.
  std::error_code post_ud(const qp& q, const ah& h, std::uint32_t remote_qpn, std::uint32_t remote_qkey,
                          const std::vector<sge>& sg, std::uint64_t wr_id = 1,
                          wr_opcode op = wr_opcode::send, std::uint32_t imm = 0,
                          std::uint32_t flags = send_signaled) {
    send_wr w = make_wr(op, sg, wr_id, flags);
    w.ah = &h;
    w.remote_qpn = remote_qpn;
    w.remote_qkey = remote_qkey;
    w.imm_data = imm;
    return q.post_send(w);
  }

  /// The state `query()` reports.
  static qp_state query_state(const qp& q) { return q.query().state; }

  /// Drives the device a little and returns whatever the CQ holds then.
  std::vector<work_completion> drain(const cq& q) {
    std::vector<work_completion> out;
    work_completion wc[16];
    for (int idle = 0; idle < 8;) {
      const std::size_t got = q.poll(wc);
      out.insert(out.end(), wc, wc + got);
      if (got == 0) {
        ctx->poll();
        ++idle;
      }
    }
    return out;
  }

  /// Advances the manual clock by `total` in steps of `step`, driving the
  /// device's timers after each step.
  void advance(std::chrono::nanoseconds total, std::chrono::nanoseconds step = std::chrono::milliseconds(1)) {
    for (std::chrono::nanoseconds done{0}; done < total; done += step) {
      clock.advance(step);
      ctx->poll();
    }
  }

  /// Every async event raised so far (kept across calls).  One request is
  /// always parked; it is never cancelled.
  const std::vector<async_event>& events() {
    ctx->poll();
    if (!event_req_.valid()) event_req_ = dev.async_get_event(use_request);
    while (event_req_.ready()) {
      std::error_code ec;
      const async_event ev = event_req_.get(ec);
      if (!ec) events_seen_.push_back(ev);
      event_req_ = dev.async_get_event(use_request);
    }
    return events_seen_;
  }
  /// How many events of type `t` (and element `element`, unless ~0u) were raised.
  std::size_t count_events(event_type t, std::uint32_t element = ~0u) {
    const auto& v = events();
    return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [&](const async_event& e) {
      return e.type == t && (element == ~0u || e.element == element);
    }));
  }

  request<async_event> event_req_;
  std::vector<async_event> events_seen_;
};

}  // namespace averbs::test

namespace averbs::test {

/// A successful completion of `wr_id` with opcode `op`.
inline ::testing::AssertionResult wc_ok(const work_completion& wc, std::uint64_t wr_id, wc_opcode op) {
  if (wc.status != wc_status::success || wc.wr_id != wr_id || wc.opcode != op)
    return ::testing::AssertionFailure() << "completion wr_id " << wc.wr_id << " status "
                                         << to_string(wc.status) << " opcode " << static_cast<int>(wc.opcode)
                                         << "; expected wr_id " << wr_id << " success opcode "
                                         << static_cast<int>(op);
  return ::testing::AssertionSuccess();
}
/// A completion of `wr_id` with status `st` (the opcode of an error
/// completion is undefined, IBTA 11.4.2.1).
inline ::testing::AssertionResult wc_is(const work_completion& wc, std::uint64_t wr_id, wc_status st) {
  if (wc.status != st || wc.wr_id != wr_id)
    return ::testing::AssertionFailure() << "completion wr_id " << wc.wr_id << " status "
                                         << to_string(wc.status) << "; expected wr_id " << wr_id << " status "
                                         << to_string(st);
  return ::testing::AssertionSuccess();
}

}  // namespace averbs::test
