// SPDX-License-Identifier: MIT
// Puts every opcode averbs sends on the wire, for a packet capture: two
// devices in this process, each bound to its own address, exchange RC, UC
// and UD traffic over real UDP sockets (on `lo` the packets are as real as
// between two hosts).  Covers every RC/UC/UD opcode of the IBTA tables
// averbs implements (SEND/WRITE First/Middle/Last/Only with and without
// immediate, SEND with invalidate, READ request and responses, atomics,
// ACK and atomic ACK), each pad count, zero-length messages, and the
// responder's answers: RNR NAK, PSN sequence error NAK (dropped packets),
// remote access error NAK and invalid request NAK.  Every completion is
// checked; exit status 0 means the exchange went as planned.
//
//   capture_traffic --addr A --peer B --port P [--no-raw] [--gso]
//                   [--scenario every_opcode|read_then_write|cm]
//
// (`read_then_write`: only an RDMA READ followed by a WRITE to the memory
// it reads, twenty times; see the capture test.  `cm`: the connection
// manager's MADs on QP1, see exchange::cm_exchanges.)
//
// Prints one `qp <kind> <qpn at A> <qpn at B>` line per queue pair (the
// capture test derives the UDP source ports from them), `cm ...` lines
// saying what the CM exchanges were (below), then `done`.
#include <averbs/cm.hpp>
#include <averbs/verbs.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

using namespace averbs;

namespace {

constexpr std::size_t area_size = 1 << 20;
constexpr std::uint32_t multi = 2 * 1024 + 101;  // FIRST, MIDDLE, LAST (pad 3) at MTU 1024
constexpr std::uint32_t ud_qkey = 0x11111111;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

struct endpoint {
  std::unique_ptr<soft_device> sdev;
  device dev;
  pd p;
  cq c;
  std::vector<std::byte> buf;  // [0, half): targets and receives, [half, size): sources
  mr m;
  gid g;

  std::uint64_t addr(std::size_t off) const { return reinterpret_cast<std::uintptr_t>(buf.data()) + off; }
  std::uint64_t src(std::size_t off = 0) const { return addr(area_size / 2 + off); }
};

class exchange {
 public:
  exchange(const std::string& addr_a, const std::string& addr_b, std::uint16_t port, bool raw, bool gso)
      : gso_(gso) {
    make(a_, "capture_a", addr_a, port, raw);
    make(b_, "capture_b", addr_b, port, raw);
  }

  void run() {
    rc_ = connect(qp_type::rc, "rc");
    uc_ = connect(qp_type::uc, "uc");
    ud_ = ud_pair();
    access_ = connect(qp_type::rc, "rc_access_error");
    invalid_ = connect(qp_type::rc, "rc_invalid_request", access_local_write | access_remote_write);
    std::fflush(stdout);

    rc_sends();
    rc_send_with_invalidate();
    rc_writes();
    rc_reads_and_atomics();
    uc_traffic();
    ud_traffic();
    rnr_nak();
    sequence_nak();
    error_naks();
  }

  void print_counters() const {
    for (const endpoint* e : {&a_, &b_}) {
      const device_counters c = e->dev.counters();
      std::printf(
          "counters %s: sent %llu received %llu retransmits %llu rnr_naks_sent %llu seq_naks_sent %llu "
          "duplicates %llu dropped %llu icrc_errors %llu gso_runs %llu gso_packets %llu\n",
          e == &a_ ? "a" : "b", (unsigned long long)c.packets_sent, (unsigned long long)c.packets_received,
          (unsigned long long)c.retransmits, (unsigned long long)c.rnr_naks_sent,
          (unsigned long long)c.seq_naks_sent, (unsigned long long)c.duplicates_received,
          (unsigned long long)c.dropped, (unsigned long long)c.icrc_errors, (unsigned long long)c.gso_runs,
          (unsigned long long)c.gso_packets);
    }
  }

  // An RDMA READ and, right behind it on the same QP, an RDMA WRITE to the
  // memory it reads (no fence: either value is a correct READ result).
  // The responder answers both in one pass; every packet must still carry
  // the ICRC of the bytes it carries.
  void read_then_write() {
    rc_ = connect(qp_type::rc, "rc");
    std::fflush(stdout);
    for (unsigned round = 0; round < 20; ++round) {
      std::memset(b_.buf.data(), 0x11, 4096);
      std::memset(a_.buf.data() + area_size / 2, static_cast<int>(0x20 + round), 4096);
      post_send(rc_.a, a_, wr_opcode::rdma_read, 1, a_.addr(0), 4096, b_.addr(0), b_.m.rkey());
      post_send(rc_.a, a_, wr_opcode::rdma_write, 2, a_.src(), 4096, b_.addr(0), b_.m.rkey());
      auto wcs = poll(a_, 2, "read then write");
      for (const auto& wc : wcs) check(wc.status == wc_status::success, "read then write: status");
    }
    settle(std::chrono::milliseconds(5));
  }

  // The connection manager between A (active) and B (passive), every
  // exchange on QP1 once, each line printed after it completed:
  //  - RC connect/accept with private data both ways, the listener holding
  //    the request past half the requester's CM response timeout so that
  //    B sends MRA; a few SENDs; A disconnects (DREQ, DREP):
  //      cm connect <service port> <QPN at A> <QPN at B> <A's rdma_cm port>
  //                 <A's first PSN> <B's first PSN> <path MTU enum>
  //  - a connect to a port nobody listens on (REJ "invalid service ID"):
  //      cm refused <service port> <QPN at A> <A's rdma_cm port>
  //  - a connect B's application rejects with private data (REJ
  //    "consumer defined"):
  //      cm rejected <service port> <QPN at A> <A's rdma_cm port>
  //  - UD service resolution (SIDR_REQ, SIDR_REP) and a datagram:
  //      cm sidr <service port> <QPN at A> <QPN at B> <A's rdma_cm port> <Q_Key>
  // Private data: the text of the message's name ("averbs REQ" ...), the
  // capture test looks for it.
  void cm_exchanges() {
    cm::conn_params params;
    params.cm_response_timeout = 12;  // 16.8 ms: B sends MRA after 8.4 ms
    params.max_cm_retries = 15;
    const cm::address rc_service{b_.g, 7471}, nobody{b_.g, 7472}, rejecting{b_.g, 7473},
        ud_service{b_.g, 7474};
    cm::listener rc_listener = cm::listen(b_.dev, rc_service);
    cm::listener reject_listener = cm::listen(b_.dev, rejecting);
    cm::listener ud_listener = cm::listen(b_.dev, ud_service, 16, cm::port_space::udp);

    // Connect, MRA, accept.
    qp_pair rc{create(a_, qp_type::rc), create(b_, qp_type::rc)};
    cm::connector active(a_.dev);
    auto got = rc_listener.async_get_request(use_request);
    auto connecting = active.async_connect(rc.a, rc_service, text("averbs REQ"), params, use_request);
    cm::connection_request req = finish(got, "cm: connection request");
    check(text_of(req.private_data, 10) == "averbs REQ", "cm: REQ private data");
    check(req.remote_qpn == rc.a.num(), "cm: REQ QPN");
    // The application takes its time.  B's CM sends MRA once half the
    // requester's response timeout (8.4 ms) has passed since the REQ
    // arrived, and A then waits the MRA's service timeout (seconds)
    // instead of resending.  Driving progress for 30 ms after the request
    // was delivered makes the MRA certain, however this thread is
    // scheduled; a late one only costs a retransmitted REQ, which B takes
    // as a duplicate (the capture test allows for it).
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
    while (std::chrono::steady_clock::now() < until) ctx_.poll();
    check(!connecting.ready(), "cm: the connect completed before the accept");
    cm::connector passive = req.conn;
    auto accepting = passive.async_accept(rc.b, text("averbs REP"), params, use_request);
    const cm::connect_result result = finish(connecting, "cm: connect");
    finish(accepting, "cm: accept");
    check(text_of(result.private_data, 10) == "averbs REP", "cm: REP private data");
    check(result.remote_qpn == rc.b.num(), "cm: REP QPN");
    const qp_attr qa = rc.a.query(), qb = rc.b.query();
    check(qa.dest_qp_num == rc.b.num() && qb.dest_qp_num == rc.a.num(), "cm: QPs connected to each other");
    check(qa.sq_psn == qb.rq_psn && qb.sq_psn == qa.rq_psn, "cm: PSNs exchanged");
    std::printf("qp rc_cm %u %u\n", rc.a.num(), rc.b.num());
    std::printf("cm connect %u %u %u %u %u %u %u\n", unsigned{rc_service.port}, rc.a.num(), rc.b.num(),
                unsigned{active.local_address().port}, qa.sq_psn, qb.sq_psn,
                static_cast<unsigned>(qa.path_mtu));
    std::fflush(stdout);
    sends(rc, wr_opcode::send, {16, 300, 1000}, "cm: send over the connection");

    // Disconnect: A sends DREQ, B answers DREP; both end in timewait.
    auto notified = passive.async_notify_disconnect(use_request);
    auto disconnecting = active.async_disconnect(use_request);
    finish(disconnecting, "cm: disconnect");
    finish(notified, "cm: disconnect notification");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (active.state() == cm::conn_state::disconnecting ||
           passive.state() == cm::conn_state::disconnecting) {
      check(std::chrono::steady_clock::now() < deadline, "cm: no DREP");
      ctx_.poll();
    }

    // Nobody listens: REJ "invalid service ID".
    {
      qp q = create(a_, qp_type::rc);
      cm::connector c(a_.dev);
      auto r = c.async_connect(q, nobody, text("averbs REQ"), params, use_request);
      check(finish_with_error(r, "cm: connect to nobody") == errc::connection_refused,
            "cm: connect to nobody is refused");
      check(c.reject_reason() == 8, "cm: REJ reason " + std::to_string(c.reject_reason()) + ", expected 8");
      std::printf("cm refused %u %u %u\n", unsigned{nobody.port}, q.num(), unsigned{c.local_address().port});
    }

    // The application rejects: REJ "consumer defined" with its data.
    {
      qp q = create(a_, qp_type::rc);
      cm::connector c(a_.dev);
      auto g = reject_listener.async_get_request(use_request);
      auto r = c.async_connect(q, rejecting, text("averbs REQ"), params, use_request);
      cm::connection_request rq = finish(g, "cm: request to reject");
      auto rejected = rq.conn.async_reject(text("averbs REJ"), use_request);
      finish(rejected, "cm: reject");
      check(finish_with_error(r, "cm: rejected connect") == errc::connection_rejected,
            "cm: the rejected connect fails with connection_rejected");
      check(c.reject_reason() == 28, "cm: REJ reason " + std::to_string(c.reject_reason()) + ", expected 28");
      check(text_of(c.private_data(), 10) == "averbs REJ", "cm: REJ private data");
      std::printf("cm rejected %u %u %u\n", unsigned{rejecting.port}, q.num(),
                  unsigned{c.local_address().port});
    }

    // UD service resolution, then a datagram to the service.
    {
      qp_pair ud{create(a_, qp_type::ud), create(b_, qp_type::ud)};
      cm::connector c(a_.dev);
      auto g = ud_listener.async_get_request(use_request);
      auto r = c.async_connect(ud.a, ud_service, text("averbs SIDR_REQ"), params, use_request);
      cm::connection_request rq = finish(g, "cm: SIDR request");
      check(rq.type == qp_type::ud && text_of(rq.private_data, 15) == "averbs SIDR_REQ", "cm: SIDR_REQ data");
      auto accepted = rq.conn.async_accept(ud.b, text("averbs SIDR_REP"), params, use_request);
      finish(accepted, "cm: SIDR accept");
      const cm::connect_result res = finish(r, "cm: SIDR connect");
      check(res.remote_qpn == ud.b.num() && text_of(res.private_data, 15) == "averbs SIDR_REP",
            "cm: SIDR_REP fields");
      std::printf("qp ud_cm %u %u\n", ud.a.num(), ud.b.num());
      std::printf("cm sidr %u %u %u %u %u\n", unsigned{ud_service.port}, ud.a.num(), ud.b.num(),
                  unsigned{c.local_address().port}, res.remote_qkey);
      std::fflush(stdout);
      ah h = a_.p.create_ah(c.peer_ah());
      post_recv(ud.b, b_, 950, 0, 40 + 200);
      sge g2{a_.src(), 200, a_.m.lkey()};
      send_wr w;
      w.wr_id = 950;
      w.sg_list = &g2;
      w.num_sge = 1;
      w.flags = send_signaled;
      w.ah = &h;
      w.remote_qpn = res.remote_qpn;
      w.remote_qkey = res.remote_qkey;
      if (auto ec = ud.a.post_send(w)) throw std::runtime_error("cm: ud post_send: " + ec.message());
      expect(a_, 1, wc_opcode::send, "cm: datagram to the resolved service");
      auto wc = expect(b_, 1, wc_opcode::recv, "cm: datagram received")[0];
      check(wc.byte_len == 40 + 200 && wc.src_qp == ud.a.num(), "cm: datagram fields");
    }
    std::fflush(stdout);
  }

 private:
  struct qp_pair {
    qp a, b;
  };
  bool gso_ = false;

  void make(endpoint& e, const std::string& name, const std::string& address, std::uint16_t port, bool raw) {
    soft_device_options o;
    o.name = name;
    o.address = address;
    o.port = port;
    o.raw_send = raw;
    // A capture on lo sees a GSO run before the kernel splits it into its
    // packets: one frame per packet needs GSO off (docs/wire.md), unless
    // the device splits runs before the capture (--gso: the capture test
    // sets lo's gso_max_segs to 1 in a namespace).
    o.gso = gso_;
    e.sdev = std::make_unique<soft_device>(o);
    e.dev = open_device(ctx_, name);
    e.p = e.dev.alloc_pd();
    e.c = e.dev.create_cq(4096);
    e.buf.assign(area_size, std::byte{0});
    for (std::size_t i = 0; i < e.buf.size(); ++i) e.buf[i] = std::byte(i * 7 + 3);
    e.m = e.p.reg_mr(e.buf.data(), e.buf.size(),
                     access_local_write | access_remote_write | access_remote_read | access_remote_atomic |
                         access_mw_bind);
    check(gid::parse(address, e.g), "bad address " + address);
  }

  // RESET -> INIT -> RTR -> RTS for a connected pair; `b_access` is the
  // responder's access flags.
  qp_pair connect(qp_type t, const char* kind,
                  std::uint32_t b_access = access_local_write | access_remote_write | access_remote_read |
                                           access_remote_atomic) {
    qp_pair pr;
    pr.a = create(a_, t);
    pr.b = create(b_, t);
    for (int i = 0; i < 2; ++i) {
      const qp& me = i == 0 ? pr.a : pr.b;
      const qp& peer = i == 0 ? pr.b : pr.a;
      const endpoint& peer_ep = i == 0 ? b_ : a_;
      qp_attr at;
      at.state = qp_state::init;
      at.port_num = 1;
      at.qp_access_flags =
          i == 0 ? access_local_write | access_remote_write | access_remote_read | access_remote_atomic
                 : b_access;
      me.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_access_flags);
      at = {};
      at.state = qp_state::rtr;
      at.path_mtu = mtu::mtu_1024;
      at.dest_qp_num = peer.num();
      at.rq_psn = 0;
      at.max_dest_rd_atomic = 16;
      at.min_rnr_timer = 1;  // 10 us: the RNR step is quick
      at.ah.is_global = true;
      at.ah.grh.dgid = peer_ep.g;
      std::uint32_t mask = qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn;
      if (t == qp_type::rc) mask |= qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer;
      me.modify(at, mask);
      at = {};
      at.state = qp_state::rts;
      at.sq_psn = 0;
      at.timeout = 8;  // 1 ms: dropped packets come back quickly
      at.retry_cnt = 7;
      at.rnr_retry = 7;
      at.max_rd_atomic = 16;
      mask = qp_attr_state | qp_attr_sq_psn;
      if (t == qp_type::rc)
        mask |= qp_attr_timeout | qp_attr_retry_cnt | qp_attr_rnr_retry | qp_attr_max_qp_rd_atomic;
      me.modify(at, mask);
    }
    std::printf("qp %s %u %u\n", kind, pr.a.num(), pr.b.num());
    return pr;
  }

  qp_pair ud_pair() {
    qp_pair pr;
    pr.a = create(a_, qp_type::ud);
    pr.b = create(b_, qp_type::ud);
    for (const qp* q : {&pr.a, &pr.b}) {
      qp_attr at;
      at.state = qp_state::init;
      at.port_num = 1;
      at.qkey = ud_qkey;
      q->modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_qkey);
      at = {};
      at.state = qp_state::rtr;
      q->modify(at, qp_attr_state);
      at = {};
      at.state = qp_state::rts;
      q->modify(at, qp_attr_state | qp_attr_sq_psn);
    }
    std::printf("qp ud %u %u\n", pr.a.num(), pr.b.num());
    return pr;
  }

  static std::vector<std::byte> text(const char* s) {
    std::vector<std::byte> v(std::strlen(s));
    std::memcpy(v.data(), s, v.size());
    return v;
  }
  static std::string text_of(const std::vector<std::byte>& v, std::size_t n) {
    return std::string(reinterpret_cast<const char*>(v.data()), std::min(n, v.size()));
  }
  // Waits (driving both devices) up to 20 s for a request that must succeed.
  template <class T>
  static T finish(request<T>& r, const char* what) {
    check(r.wait_for(std::chrono::seconds(20)), std::string(what) + ": no completion in 20 s");
    std::error_code ec;
    if constexpr (std::is_void_v<T>) {
      r.get(ec);
      check(!ec, std::string(what) + ": " + ec.message());
    } else {
      T v = r.get(ec);
      check(!ec, std::string(what) + ": " + ec.message());
      return v;
    }
  }
  // The same for one that must fail: its error.
  template <class T>
  static std::error_code finish_with_error(request<T>& r, const char* what) {
    check(r.wait_for(std::chrono::seconds(20)), std::string(what) + ": no completion in 20 s");
    std::error_code ec;
    r.get(ec);
    check(static_cast<bool>(ec), std::string(what) + ": succeeded");
    return ec;
  }

  static qp create(const endpoint& e, qp_type t) {
    qp_init_attr ia;
    ia.send_cq = e.c;
    ia.recv_cq = e.c;
    ia.cap = {256, 256, 2, 2, 0};
    ia.type = t;
    return e.p.create_qp(ia);
  }

  // Polls `e`'s CQ, driving both devices (they share this thread), until
  // `n` completions; throws after 20 s.
  std::vector<work_completion> poll(const endpoint& e, std::size_t n, const char* what) {
    std::vector<work_completion> out;
    work_completion wc[32];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (out.size() < n) {
      check(std::chrono::steady_clock::now() < until, std::string(what) + ": " + std::to_string(out.size()) +
                                                          " of " + std::to_string(n) + " completions");
      const std::size_t got = e.c.poll({wc, std::min<std::size_t>(32, n - out.size())});
      out.insert(out.end(), wc, wc + got);
      (&e == &a_ ? b_ : a_).c.poll({});
    }
    return out;
  }
  // Every completion successful, with the given opcode.
  std::vector<work_completion> expect(const endpoint& e, std::size_t n, wc_opcode op, const char* what) {
    auto wcs = poll(e, n, what);
    for (const auto& wc : wcs) {
      check(wc.status == wc_status::success,
            std::string(what) + ": wr " + std::to_string(wc.wr_id) + " " + std::string(to_string(wc.status)));
      check(wc.opcode == op, std::string(what) + ": wr " + std::to_string(wc.wr_id) + " opcode");
    }
    return wcs;
  }
  // Keeps both devices running for `d` (answers, held ACKs).
  void settle(std::chrono::microseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
      a_.c.poll({});
      b_.c.poll({});
    }
  }

  static void post_send(const qp& q, const endpoint& e, wr_opcode op, std::uint64_t id, std::uint64_t laddr,
                        std::uint32_t len, std::uint64_t raddr = 0, std::uint32_t rkey = 0,
                        std::uint32_t imm = 0) {
    sge g{laddr, len, e.m.lkey()};
    send_wr w;
    w.wr_id = id;
    w.opcode = op;
    w.sg_list = &g;
    w.num_sge = len != 0 ? 1 : 0;
    w.flags = send_signaled;
    w.remote_addr = raddr;
    w.rkey = rkey;
    w.imm_data = imm;
    w.compare_add = op == wr_opcode::atomic_cmp_and_swp ? 0 : 1;  // compare 0 / add 1
    w.swap = 0xFEED;
    if (auto ec = q.post_send(w)) throw std::runtime_error("post_send: " + ec.message());
  }
  static void post_recv(const qp& q, const endpoint& e, std::uint64_t id, std::size_t off,
                        std::uint32_t len) {
    sge g{e.addr(off), len, e.m.lkey()};
    recv_wr r;
    r.wr_id = id;
    r.sg_list = &g;
    r.num_sge = 1;
    if (auto ec = q.post_recv(r)) throw std::runtime_error("post_recv: " + ec.message());
  }

  // Messages A -> B over a connected pair, each received into its own slot.
  void sends(const qp_pair& pr, wr_opcode op, const std::vector<std::uint32_t>& lengths, const char* what,
             std::uint32_t imm_or_key = 0) {
    for (std::size_t i = 0; i < lengths.size(); ++i) post_recv(pr.b, b_, i, i * 4096, 4096);
    for (std::size_t i = 0; i < lengths.size(); ++i)
      post_send(pr.a, a_, op, i, a_.src(i * 4096), lengths[i], 0, 0,
                imm_or_key + static_cast<std::uint32_t>(i));
    expect(a_, lengths.size(), wc_opcode::send, what);
    auto wcs = expect(b_, lengths.size(), wc_opcode::recv, what);
    for (const auto& wc : wcs) {
      check(wc.byte_len == lengths[wc.wr_id], std::string(what) + ": byte_len");
      check(std::memcmp(b_.buf.data() + wc.wr_id * 4096, a_.buf.data() + area_size / 2 + wc.wr_id * 4096,
                        wc.byte_len) == 0,
            std::string(what) + ": bytes");
      if (op == wr_opcode::send_with_imm)
        check((wc.wc_flags & wc_with_imm) != 0, std::string(what) + ": imm flag");
    }
  }

  void rc_sends() {
    // SEND Only with every pad count and zero length; First/Middle/Last.
    sends(rc_, wr_opcode::send, {0, 101, 102, 103, 1024, multi}, "rc send");
    sends(rc_, wr_opcode::send_with_imm, {50, multi}, "rc send_with_imm", 0xA0000000u);
  }

  void rc_send_with_invalidate() {
    // Two type-2 windows bound at B through its QP: SEND Only with
    // Invalidate and SEND Last with Invalidate each invalidate one.
    std::uint32_t keys[2];
    mw windows[2] = {b_.p.alloc_mw(mw_type::type2), b_.p.alloc_mw(mw_type::type2)};
    for (int i = 0; i < 2; ++i) {
      keys[i] = (windows[i].rkey() & ~0xFFu) | ((windows[i].rkey() + 1) & 0xFFu);
      send_wr bw;
      bw.wr_id = 500 + i;
      bw.opcode = wr_opcode::bind_mw;
      bw.flags = send_signaled;
      bw.bind_mw = &windows[i];
      bw.bind_rkey = keys[i];
      bw.bind_info = {b_.m.lkey(), b_.addr(64 * 1024), 4096, access_remote_write};
      if (auto ec = rc_.b.post_send(bw)) throw std::runtime_error("bind_mw: " + ec.message());
      expect(b_, 1, wc_opcode::bind_mw, "bind type-2 window");
    }
    const std::uint32_t lengths[2] = {60, multi};
    for (int i = 0; i < 2; ++i) {
      post_recv(rc_.b, b_, 600 + i, 0, 4096);
      post_send(rc_.a, a_, wr_opcode::send_with_inv, 600 + i, a_.src(), lengths[i], 0, 0, keys[i]);
      expect(a_, 1, wc_opcode::send, "send_with_inv");
      auto wc = expect(b_, 1, wc_opcode::recv, "send_with_inv receive")[0];
      check((wc.wc_flags & wc_with_inv) != 0 && wc.imm_data == keys[i] && wc.byte_len == lengths[i],
            "send_with_inv: invalidated key in the completion");
    }
  }

  void rc_writes() {
    // WRITE Only (zero length too, no R_Key check), First/Middle/Last.
    const std::uint32_t lengths[] = {0, 101, multi};
    for (std::size_t i = 0; i < 3; ++i)
      post_send(rc_.a, a_, wr_opcode::rdma_write, i, a_.src(i * 4096), lengths[i],
                b_.addr(128 * 1024 + i * 4096), b_.m.rkey());
    expect(a_, 3, wc_opcode::rdma_write, "rc write");
    for (std::size_t i = 0; i < 3; ++i)
      check(std::memcmp(b_.buf.data() + 128 * 1024 + i * 4096, a_.buf.data() + area_size / 2 + i * 4096,
                        lengths[i]) == 0,
            "rc write: bytes");
    // WRITE Only with Immediate, First/Middle/Last with Immediate.
    const std::uint32_t imm_lengths[] = {70, multi};
    for (std::size_t i = 0; i < 2; ++i) post_recv(rc_.b, b_, 700 + i, 0, 0);
    for (std::size_t i = 0; i < 2; ++i)
      post_send(rc_.a, a_, wr_opcode::rdma_write_with_imm, 700 + i, a_.src(i * 4096), imm_lengths[i],
                b_.addr(192 * 1024 + i * 4096), b_.m.rkey(), 0x12340000u + static_cast<std::uint32_t>(i));
    expect(a_, 2, wc_opcode::rdma_write, "rc write_with_imm");
    auto wcs = expect(b_, 2, wc_opcode::recv_rdma_with_imm, "rc write_with_imm receive");
    for (const auto& wc : wcs)
      check(wc.byte_len == imm_lengths[wc.wr_id - 700], "rc write_with_imm: byte_len");
  }

  void rc_reads_and_atomics() {
    // READ Response Only (zero length and 101 bytes), First/Middle/Last.
    const std::uint32_t lengths[] = {0, 101, multi};
    for (std::size_t i = 0; i < 3; ++i)
      post_send(rc_.a, a_, wr_opcode::rdma_read, i, a_.addr(256 * 1024 + i * 4096), lengths[i],
                b_.addr(area_size / 2 + i * 4096), b_.m.rkey());
    expect(a_, 3, wc_opcode::rdma_read, "rc read");
    for (std::size_t i = 0; i < 3; ++i)
      check(std::memcmp(a_.buf.data() + 256 * 1024 + i * 4096, b_.buf.data() + area_size / 2 + i * 4096,
                        lengths[i]) == 0,
            "rc read: bytes");
    // CMP_SWAP and FETCH_ADD, answered by ATOMIC ACKNOWLEDGE.
    std::memset(b_.buf.data() + 320 * 1024, 0, 16);
    post_send(rc_.a, a_, wr_opcode::atomic_fetch_and_add, 1, a_.addr(320 * 1024), 8, b_.addr(320 * 1024),
              b_.m.rkey());
    post_send(rc_.a, a_, wr_opcode::atomic_cmp_and_swp, 2, a_.addr(320 * 1024 + 8), 8,
              b_.addr(320 * 1024 + 8), b_.m.rkey());
    auto wcs = poll(a_, 2, "rc atomics");
    for (const auto& wc : wcs) check(wc.status == wc_status::success, "rc atomics: status");
    std::uint64_t counter, swapped;
    std::memcpy(&counter, b_.buf.data() + 320 * 1024, 8);
    std::memcpy(&swapped, b_.buf.data() + 320 * 1024 + 8, 8);
    check(counter == 1 && swapped == 0xFEED, "rc atomics: remote memory");
    // ATOMIC WRITE (IBTA 1.5), answered by an empty READ Response Only.
    const std::uint64_t word = 0x0123456789ABCDEFull;
    std::memcpy(a_.buf.data() + 320 * 1024 + 16, &word, 8);
    post_send(rc_.a, a_, wr_opcode::atomic_write, 3, a_.addr(320 * 1024 + 16), 8, b_.addr(320 * 1024 + 16),
              b_.m.rkey());
    expect(a_, 1, wc_opcode::atomic_write, "rc atomic write");
    check(std::memcmp(b_.buf.data() + 320 * 1024 + 16, &word, 8) == 0, "rc atomic write: remote memory");
  }

  void uc_traffic() {
    sends(uc_, wr_opcode::send, {101, multi}, "uc send");
    sends(uc_, wr_opcode::send_with_imm, {50, multi}, "uc send_with_imm", 0xB0000000u);
    const std::uint32_t lengths[] = {101, multi};
    for (std::size_t i = 0; i < 2; ++i)
      post_send(uc_.a, a_, wr_opcode::rdma_write, i, a_.src(i * 4096), lengths[i],
                b_.addr(384 * 1024 + i * 4096), b_.m.rkey());
    expect(a_, 2, wc_opcode::rdma_write, "uc write");
    for (std::size_t i = 0; i < 2; ++i) post_recv(uc_.b, b_, 800 + i, 0, 0);
    for (std::size_t i = 0; i < 2; ++i)
      post_send(uc_.a, a_, wr_opcode::rdma_write_with_imm, 800 + i, a_.src(i * 4096), lengths[i],
                b_.addr(448 * 1024 + i * 4096), b_.m.rkey(), 0x56780000u + static_cast<std::uint32_t>(i));
    expect(a_, 2, wc_opcode::rdma_write, "uc write_with_imm");
    expect(b_, 2, wc_opcode::recv_rdma_with_imm, "uc write_with_imm receive");
    // UC WRITE has no acknowledgement: the data is there once the
    // immediate (sent after it, in order) arrived.
    for (std::size_t i = 0; i < 2; ++i)
      check(std::memcmp(b_.buf.data() + 384 * 1024 + i * 4096, a_.buf.data() + area_size / 2 + i * 4096,
                        lengths[i]) == 0,
            "uc write: bytes");
  }

  void ud_traffic() {
    ah_attr at;
    at.is_global = true;
    at.grh.dgid = b_.g;
    at.port_num = 1;
    ah h = a_.p.create_ah(at);
    const std::uint32_t lengths[] = {101, 1024};
    for (std::size_t i = 0; i < 2; ++i) post_recv(ud_.b, b_, 900 + i, i * 4096, 40 + 1024);
    for (std::size_t i = 0; i < 2; ++i) {
      sge g{a_.src(i * 4096), lengths[i], a_.m.lkey()};
      send_wr w;
      w.wr_id = 900 + i;
      w.opcode = i == 0 ? wr_opcode::send : wr_opcode::send_with_imm;
      w.sg_list = &g;
      w.num_sge = 1;
      w.flags = send_signaled;
      w.imm_data = 0xC0000000u;
      w.ah = &h;
      w.remote_qpn = ud_.b.num();
      w.remote_qkey = ud_qkey;
      if (auto ec = ud_.a.post_send(w)) throw std::runtime_error("ud post_send: " + ec.message());
    }
    expect(a_, 2, wc_opcode::send, "ud send");
    auto wcs = expect(b_, 2, wc_opcode::recv, "ud receive");
    for (const auto& wc : wcs) {
      check(wc.byte_len == 40 + lengths[wc.wr_id - 900] && wc.src_qp == ud_.a.num(), "ud receive: fields");
      check(
          std::memcmp(b_.buf.data() + (wc.wr_id - 900) * 4096 + 40,
                      a_.buf.data() + area_size / 2 + (wc.wr_id - 900) * 4096, lengths[wc.wr_id - 900]) == 0,
          "ud receive: bytes");
    }
  }

  // A SEND meets an empty receive queue: RNR NAK, then delivered.
  void rnr_nak() {
    const std::uint64_t before = b_.dev.counters().rnr_naks_sent;
    post_send(rc_.a, a_, wr_opcode::send, 1000, a_.src(), 300);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (b_.dev.counters().rnr_naks_sent == before) {
      check(std::chrono::steady_clock::now() < until, "rnr: no RNR NAK was sent");
      a_.c.poll({});
      b_.c.poll({});
    }
    post_recv(rc_.b, b_, 1000, 0, 4096);
    expect(a_, 1, wc_opcode::send, "rnr send");
    expect(b_, 1, wc_opcode::recv, "rnr receive");
  }

  // Packets A sends are dropped: B answers a gap with a PSN sequence error
  // NAK, A goes back and every message still arrives once.
  void sequence_nak() {
    const std::uint64_t before = b_.dev.counters().seq_naks_sent;
    for (int round = 0; round < 20 && b_.dev.counters().seq_naks_sent == before; ++round) {
      a_.sdev->set_faults("drop=0.2,seed=" + std::to_string(11 + round));
      sends(rc_, wr_opcode::send, {4096, 4096, 4096, 4096, 4096, 4096}, "send over a lossy link");
      a_.sdev->set_faults("");
    }
    check(b_.dev.counters().seq_naks_sent != before, "no PSN sequence error NAK in 20 lossy rounds");
    settle(std::chrono::milliseconds(5));
  }

  // A bad R_Key (remote access error NAK) and a READ the responder QP does
  // not allow (invalid request NAK); both pairs end in error.
  void error_naks() {
    post_send(access_.a, a_, wr_opcode::rdma_write, 1, a_.src(), 64, b_.addr(0), b_.m.rkey() ^ 0x5A5A00);
    auto wc = poll(a_, 1, "write with a bad R_Key")[0];
    check(wc.status == wc_status::rem_access_err,
          std::string("bad R_Key: ") + std::string(to_string(wc.status)));
    post_send(invalid_.a, a_, wr_opcode::rdma_read, 2, a_.addr(0), 64, b_.addr(0), b_.m.rkey());
    wc = poll(a_, 1, "read without remote read access")[0];
    check(wc.status == wc_status::rem_inv_req_err,
          std::string("read without access: ") + std::string(to_string(wc.status)));
    settle(std::chrono::milliseconds(5));
  }

  context ctx_;
  endpoint a_, b_;
  qp_pair rc_, uc_, ud_, access_, invalid_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string addr_a, addr_b;
  std::uint16_t port = 4791;
  bool raw = true, gso = false;
  std::string scenario = "every_opcode";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "capture_traffic: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--addr")
      addr_a = value();
    else if (a == "--peer")
      addr_b = value();
    else if (a == "--port")
      port = static_cast<std::uint16_t>(std::atoi(value().c_str()));
    else if (a == "--no-raw")
      raw = false;
    else if (a == "--gso")
      gso = true;
    else if (a == "--scenario")
      scenario = value();
    else {
      std::fprintf(stderr, "capture_traffic: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (addr_a.empty() || addr_b.empty() ||
      (scenario != "every_opcode" && scenario != "read_then_write" && scenario != "cm")) {
    std::fprintf(stderr,
                 "usage: capture_traffic --addr A --peer B [--port P] [--no-raw] [--gso] "
                 "[--scenario every_opcode|read_then_write|cm]\n");
    return 2;
  }
  try {
    exchange x(addr_a, addr_b, port, raw, gso);
    try {
      if (scenario == "every_opcode")
        x.run();
      else if (scenario == "cm")
        x.cm_exchanges();
      else
        x.read_then_write();
    } catch (...) {
      x.print_counters();
      throw;
    }
    x.print_counters();
    std::printf("done\n");
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "capture_traffic: %s\n", e.what());
    return 1;
  }
}
