// SPDX-License-Identifier: MIT
// The connection manager between two devices on their own loopback
// addresses, over real UDP: connections through a lossy, duplicating,
// reordering link; a peer that comes back with the same CA GUID (stale
// connection); garbage on QP1; a peer that disappears.
#include "udp_pair.hpp"
#include "wire/cm.hpp"
#include "wire/roce.hpp"

#include <averbs/cm.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>

using namespace std::chrono_literals;

namespace averbs::test {
namespace {

class cm_udp : public ::testing::Test {
 protected:
  struct side {
    std::unique_ptr<soft_device> sdev;
    device dev;
    pd p;
    cq c;
    gid ip;
    std::string name;
  };
  /// A device on test_address(which); `check_icrc` false for one whose
  /// peer is the test's own socket, which computes no ICRC.
  void make(side& s, int which, const std::string& faults = "", context* in = nullptr, bool check_icrc = true) {
    soft_device_options o;
    o.first_qpn = first_qpn;
    s.name = "cm" + std::to_string(which) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    o.name = s.name;
    o.address = test_address(which);
    o.port = test_port();
    o.faults = faults;
    o.check_icrc = check_icrc;
    if (manual_time) o.clock = &clock;
    s.sdev = std::make_unique<soft_device>(o);
    s.dev = open_device(in != nullptr ? *in : ctx, o.name);
    s.p = s.dev.alloc_pd();
    s.c = s.dev.create_cq(8192);
    gid::parse(o.address, s.ip);
  }
  /// Brings `s`'s device back after it vanished (its handles dropped
  /// here): same name, address and port, so the same CA GUID, and (with a
  /// fixed `first_qpn`) its first QP gets the number the old one's had.
  void restart(side& s, int which) {
    s.c = {};
    s.p = {};
    s.dev = {};
    s.sdev.reset();
    soft_device_options o;
    o.first_qpn = first_qpn;
    o.name = s.name;
    o.address = test_address(which);
    o.port = test_port();
    s.sdev = std::make_unique<soft_device>(o);
    s.dev = open_device(ctx, o.name);
    s.p = s.dev.alloc_pd();
    s.c = s.dev.create_cq(64);
  }
  /// Connects a QP of `a` to `qb` through `l` (the passive side kept in
  /// `passive`), then `a`'s device vanishes without a word (a crash:
  /// removed first, so dropping the handles after sends nothing).  Returns
  /// the QP number `a` had.
  std::uint32_t connect_then_crash(side& a, side& b, cm::listener& l, cm::connector& passive, qp& qb) {
    qp qa = make_qp(a);
    const std::uint32_t qpn = qa.num();
    cm::connector c(a.dev);
    auto got = l.async_get_request(use_request);
    auto conn = c.async_connect(qa, {b.ip, 7471}, {}, use_request);
    passive = got.get().conn;
    passive.accept(qb, {}, fast());
    conn.get();
    a.sdev.reset();
    return qpn;
  }
  /// Set before make(): the devices' timers follow `clock`, which moves
  /// only when a test advances it.
  bool manual_time = false;
  manual_clock clock;  // outlives the devices (declared before them in each test)
  /// The devices' first QP number; 0 draws one at random (the default).
  /// Fixed here so that a device brought back reuses its QP numbers, as a
  /// peer that numbers QPs from a fixed start would.
  std::uint32_t first_qpn = 16;
  qp make_qp(side& s, qp_type t = qp_type::rc) {
    qp_init_attr ia;
    ia.send_cq = ia.recv_cq = s.c;
    ia.cap = {4, 4, 1, 1, 0};
    ia.type = t;
    return s.p.create_qp(ia);
  }
  static cm::conn_params fast() {
    cm::conn_params p;
    // 17 ms.  A sanitizer build handles a MAD several times slower: 200
    // connections resending every 17 ms then outrun it and overflow its
    // QP1 socket (a retransmission storm, which is why real CM timeouts
    // are seconds); there 67 ms.
    p.cm_response_timeout = sanitized_build ? 14 : 12;
    p.max_cm_retries = 15;
    p.ack_timeout = 12;
    return p;
  }
  // Sends one message from `from` to `to` (a receive is posted first) and
  // waits for both completions.
  void exchange(side& sf, const qp& from, side& st, const qp& to) {
    std::vector<std::byte> b(16, std::byte{0x42}), r(16);
    mr mb = sf.p.reg_mr(b.data(), b.size(), access_local_write);
    mr mrr = st.p.reg_mr(r.data(), r.size(), access_local_write);
    const sge rs{reinterpret_cast<std::uintptr_t>(r.data()), 16, mrr.lkey()};
    const sge ss{reinterpret_cast<std::uintptr_t>(b.data()), 16, mb.lkey()};
    ASSERT_FALSE(to.post_recv(recv_wr{1, &rs, 1}));
    send_wr w;
    w.sg_list = &ss;
    w.num_sge = 1;
    w.flags = send_signaled;
    ASSERT_FALSE(from.post_send(w));
    int got = 0;
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (got < 2 && std::chrono::steady_clock::now() < until) {
      work_completion wc[4];
      for (side* s : {&sf, &st}) {
        const std::size_t n = s->c.poll(wc);
        for (std::size_t i = 0; i < n; ++i, ++got) EXPECT_EQ(wc[i].status, wc_status::success);
      }
    }
    EXPECT_EQ(got, 2);
    EXPECT_EQ(r, b);
  }

  /// An RC connection between new QPs of `a` and `b`, through a listener
  /// on `b` at CM port 7471.
  struct connection {
    cm::listener l;
    qp qa, qb;
    cm::connector active, passive;
    cm::address peer;  ///< the requester's address, as the listener saw it
  };
  connection connect_rc(side& a, side& b) {
    connection k;
    k.l = cm::listen(b.dev, {b.ip, 7471});
    k.qa = make_qp(a);
    k.qb = make_qp(b);
    k.active = cm::connector(a.dev);
    auto got = k.l.async_get_request(use_request);
    auto conn = k.active.async_connect(k.qa, {b.ip, 7471}, {}, use_request);
    cm::connection_request req = got.get();
    k.peer = req.peer;
    k.passive = req.conn;
    k.passive.accept(k.qb);
    conn.get();
    return k;
  }

  context ctx;
};

TEST_F(cm_udp, connect_exchange_disconnect) {
  side a, b;
  make(a, 0);
  make(b, 1);
  connection k = connect_rc(a, b);
  EXPECT_EQ(k.peer.ip, a.ip);
  exchange(a, k.qa, b, k.qb);
  exchange(b, k.qb, a, k.qa);
  auto notified = k.passive.async_notify_disconnect(use_request);
  k.active.disconnect();
  notified.get();
  EXPECT_EQ(k.qb.state(), qp_state::err);
}

// A message that arrived is acknowledged before its receiver's QP leaves
// RTS: the receiver below disconnects as soon as it has the message, and
// the sender's send completes successfully.  (A network device holds an
// ACK for one engine pass; the DREQ, which goes ahead of queued packets,
// used to overtake it, and the sender's QP, moved to ERR by the DREQ,
// flushed the send of a message that had arrived.)
TEST_F(cm_udp, a_message_received_just_before_a_disconnect_completes_at_its_sender) {
  side a, b;
  make(a, 0);
  make(b, 1);
  connection k = connect_rc(a, b);
  const qp &qa = k.qa, &qb = k.qb;
  std::vector<std::byte> out(16, std::byte{7}), in(16);
  mr mo = b.p.reg_mr(out.data(), out.size(), access_local_write);
  mr mi = a.p.reg_mr(in.data(), in.size(), access_local_write);
  const sge rs{reinterpret_cast<std::uintptr_t>(in.data()), 16, mi.lkey()};
  const sge ss{reinterpret_cast<std::uintptr_t>(out.data()), 16, mo.lkey()};
  ASSERT_FALSE(qa.post_recv(recv_wr{1, &rs, 1}));
  send_wr w;
  w.wr_id = 2;
  w.sg_list = &ss;
  w.num_sge = 1;
  w.flags = send_signaled;
  ASSERT_FALSE(qb.post_send(w));
  work_completion wc[4];
  std::size_t n = 0;
  for (const auto until = std::chrono::steady_clock::now() + 10s;
       n == 0 && std::chrono::steady_clock::now() < until;)
    n = a.c.poll(wc);
  ASSERT_EQ(n, 1u);
  ASSERT_EQ(wc[0].status, wc_status::success);
  auto notified = k.passive.async_notify_disconnect(use_request);
  k.active.disconnect();  // at once: the ACK for the message is still held
  notified.get();
  n = 0;
  for (const auto until = std::chrono::steady_clock::now() + 10s;
       n == 0 && std::chrono::steady_clock::now() < until;)
    n = b.c.poll(wc);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].status, wc_status::success) << "the message arrived";
}

// The passive side's device is not driven while the active side connects
// and at once disconnects, so it reads the RTU and the DREQ behind it in
// one batch: it must handle them in the order sent (the accept completes,
// then the disconnect is heard), not the other way round.
TEST_F(cm_udp, an_rtu_and_the_dreq_right_behind_it_are_handled_in_order) {
  context passive_ctx;
  side a, b;
  make(a, 0);
  make(b, 1, "", &passive_ctx);
  cm::listener l = cm::listen(b.dev, {b.ip, 7471});
  qp qa = make_qp(a), qb = make_qp(b);
  cm::connector c(a.dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(qa, {b.ip, 7471}, {}, use_request);
  cm::connector passive = got.get().conn;
  auto accepted = passive.async_accept(qb, {}, use_request);
  auto notified = passive.async_notify_disconnect(use_request);
  conn.get();  // the RTU leaves
  auto disconnected = c.async_disconnect(use_request);  // the DREQ follows
  std::error_code ec;
  accepted.get(ec);
  EXPECT_FALSE(ec) << ec.message();
  notified.get(ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(qb.state(), qp_state::err);
  disconnected.get(ec);
  EXPECT_FALSE(ec) << ec.message();
}

TEST_F(cm_udp, connections_survive_a_lossy_duplicating_reordering_link) {
  side a, b;
  make(a, 0, "drop=0.05,dup=0.05,reorder=0.05,seed=11");
  make(b, 1, "drop=0.05,dup=0.05,reorder=0.05,seed=12");
  constexpr int n = 200;
  // Room for every request: what is tested here is the lossy link, not a
  // full backlog (whose drops a slow sanitizer build turns into timeouts).
  cm::listener l = cm::listen(b.dev, {b.ip, 7471}, n);
  completion_port port(ctx);
  std::vector<cm::connector> active(n), passive;
  std::vector<qp> qa(n), qb;
  for (int i = 0; i < n; ++i) {
    qa[i] = make_qp(a);
    active[i] = cm::connector(a.dev);
    active[i].async_connect(qa[i], {b.ip, 7471}, {}, fast(), bind_port(port, i));
  }
  for (int i = 0; i < 32; ++i) l.async_get_request(bind_port(port, 1000));
  int connected = 0, accepted = 0;
  completion_entry e[32];
  const auto until = std::chrono::steady_clock::now() + 60s;
  while ((connected < n || accepted < n) && std::chrono::steady_clock::now() < until) {
    const std::size_t k = port.get(e, 100ms);
    for (std::size_t j = 0; j < k; ++j) {
      ASSERT_FALSE(e[j].error()) << "key " << e[j].key() << ": " << e[j].error().message();
      if (e[j].key() == 1000) {
        l.async_get_request(bind_port(port, 1000));
        passive.push_back(e[j].result<cm::connection_request>()->conn);
        qb.push_back(make_qp(b));
        passive.back().async_accept(qb.back(), {}, fast(), bind_port(port, 2000));
      } else if (e[j].key() == 2000) {
        ++accepted;
      } else {
        ++connected;
      }
    }
  }
  ASSERT_EQ(connected, n);
  ASSERT_EQ(accepted, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(active[i].state(), cm::conn_state::established);
  // Every pair works: the first few carry a message each way.
  for (int i = 0; i < 8; ++i) {
    const cm::address peer = passive[i].peer_address();
    const auto it = std::find_if(active.begin(), active.end(),
                                 [&](const cm::connector& c) { return c.local_address() == peer; });
    ASSERT_NE(it, active.end());
    exchange(a, qa[it - active.begin()], b, qb[i]);
  }
  EXPECT_GT(a.dev.counters().dropped + b.dev.counters().dropped, 0u);
}

// A MAD held back for reordering leaves after the delay time even though
// nothing else passes on its device: a connect's REQ goes out outside any
// engine pass, and it used to wait for the next pass (a thread blocked on
// the connect drives none) to start its delay, in the worst case the CM's
// retry timeout.  Device a is never polled between the connect and the
// check: its release must already be due.
TEST_F(cm_udp, a_mad_held_for_reordering_leaves_after_the_delay_time) {
  manual_time = true;
  side a, b;
  make(a, 0, "reorder=1,delay_us=1000,seed=1");  // the first packet, the REQ, is held
  make(b, 1);
  cm::listener l = cm::listen(b.dev, {b.ip, 7471}, 4);
  auto got = l.async_get_request(use_request);
  qp qa = make_qp(a);
  cm::connector c(a.dev);
  auto conn = c.async_connect(qa, {b.ip, 7471}, {}, use_request);
  ASSERT_EQ(a.dev.counters().faults_reordered, 1u) << "the REQ was not held";
  clock.advance(std::chrono::milliseconds(2));  // past the delay, short of any CM timeout
  // The clock stays there: a delay started only by this first poll (the
  // old way) would end at 3 ms and never.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);  // (ends when it arrives)
  while (!got.ready() && std::chrono::steady_clock::now() < until) ctx.poll();
  EXPECT_TRUE(got.ready()) << "the held REQ did not leave at its delay time";
}

TEST_F(cm_udp, a_peer_that_comes_back_meets_a_stale_connection_rejection) {
  side a, b;
  make(a, 0);
  make(b, 1);
  cm::listener l = cm::listen(b.dev, {b.ip, 7471});
  cm::connector passive;
  qp qb = make_qp(b);
  // The peer's device then vanishes and comes back at the same address:
  // same CA GUID, and (first_qpn fixed) its first QP has the same number.
  const std::uint32_t old_qpn = connect_then_crash(a, b, l, passive, qb);
  restart(a, 0);
  qp qa = make_qp(a);
  ASSERT_EQ(qa.num(), old_qpn);
  auto notified = passive.async_notify_disconnect(use_request);
  cm::connector c(a.dev);
  std::error_code ec;
  c.connect(qa, {b.ip, 7471}, {}, fast(), ec);
  EXPECT_EQ(ec, errc::connection_rejected);
  EXPECT_EQ(c.reject_reason(), 10);  // stale connection
  // The old connection was torn down: the listener's side heard of it.
  notified.get(ec);
  EXPECT_EQ(ec, errc::connection_reset);
  EXPECT_EQ(qb.state(), qp_state::err);
  // Once its timewait is over, the same QP connects.
  const auto until = std::chrono::steady_clock::now() + 10s;
  auto got = l.async_get_request(use_request);
  for (;;) {
    cm::connector retry(a.dev);
    std::error_code e2;
    auto conn = retry.async_connect(qa, {b.ip, 7471}, {}, fast(), use_request);
    if (got.wait_for(200ms)) {
      cm::connector p2 = got.get().conn;
      qp qb2 = make_qp(b);
      p2.accept(qb2);
      conn.get();
      exchange(a, qa, b, qb2);
      break;
    }
    conn.get(e2);
    ASSERT_EQ(e2, errc::connection_rejected);
    ASSERT_LT(std::chrono::steady_clock::now(), until);
  }
}

// A device numbers its QPs from a random start by default, so a peer that
// crashed and came back at once (same CA GUID) connects again at once: its
// QP is not the one its old connection still holds.
TEST_F(cm_udp, a_peer_that_comes_back_with_random_qp_numbers_reconnects_at_once) {
  first_qpn = 0;
  side a, b;
  make(a, 0);
  make(b, 1);
  cm::listener l = cm::listen(b.dev, {b.ip, 7471});
  cm::connector passive;
  qp qb = make_qp(b);
  const std::uint32_t old_qpn = connect_then_crash(a, b, l, passive, qb);
  restart(a, 0);
  qp qa = make_qp(a);
  EXPECT_NE(qa.num(), old_qpn) << "(1 in 15 million: the random starts met)";
  cm::connector c(a.dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(qa, {b.ip, 7471}, {}, fast(), use_request);
  cm::connector p2 = got.get().conn;
  qp qb2 = make_qp(b);
  p2.accept(qb2);
  std::error_code ec;
  conn.get(ec);
  EXPECT_FALSE(ec) << ec.message();
  exchange(a, qa, b, qb2);
}

// The same from the other side: the passive peer comes back and its REP
// names a QP the requester is still connected to.  The connect fails
// "stale connection", and the old connection ends too: its QP stops, its
// notify_disconnect completes, and a DREQ goes to the peer (which, not
// knowing it, answers DREP: the old connection reaches timewait).
TEST_F(cm_udp, a_requester_that_meets_a_stale_rep_ends_the_old_connection_too) {
  side a, b;
  make(a, 0);
  make(b, 1);
  qp qa = make_qp(a);
  cm::connector old(a.dev);
  std::uint32_t old_qpn = 0;
  {
    cm::listener l = cm::listen(b.dev, {b.ip, 7471});
    qp qb = make_qp(b);
    old_qpn = qb.num();
    auto got = l.async_get_request(use_request);
    auto conn = old.async_connect(qa, {b.ip, 7471}, {}, fast(), use_request);
    cm::connector passive = got.get().conn;
    passive.accept(qb, {}, fast());
    conn.get();
    // The passive device vanishes without a word, then comes back at the
    // same address: same CA GUID, same first QP number.
    b.sdev.reset();
  }
  restart(b, 1);
  qp qb = make_qp(b);
  ASSERT_EQ(qb.num(), old_qpn);
  cm::listener l = cm::listen(b.dev, {b.ip, 7471});
  auto notified = old.async_notify_disconnect(use_request);
  qp qa2 = make_qp(a);
  cm::connector c(a.dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(qa2, {b.ip, 7471}, {}, fast(), use_request);
  cm::connector passive = got.get().conn;
  auto accepted = passive.async_accept(qb, {}, fast(), use_request);
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::connection_rejected);
  EXPECT_EQ(c.reject_reason(), 10);  // stale connection
  ASSERT_TRUE(notified.wait_for(5s)) << "the old connection lives on";
  notified.get(ec);
  EXPECT_EQ(ec, errc::connection_reset);
  EXPECT_EQ(qa.state(), qp_state::err);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (old.state() != cm::conn_state::timewait && old.state() != cm::conn_state::closed &&
         std::chrono::steady_clock::now() < until)
    ctx.poll();
  EXPECT_NE(old.state(), cm::conn_state::disconnecting) << "no DREP: the DREQ never went out";
  EXPECT_TRUE(accepted.wait_for(5s));
}

// Sends raw RoCEv2 datagrams to QP1 of a device: valid carrier headers,
// then a MAD that is anything at all.
class raw_sender {
 public:
  raw_sender(const std::string& from, const std::string& to, std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from.c_str(), &src.sin_addr);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof src);
    dst_.sin_family = AF_INET;
    dst_.sin_port = htons(port);
    ::inet_pton(AF_INET, to.c_str(), &dst_.sin_addr);
  }
  ~raw_sender() { ::close(fd_); }
  void send(std::span<const std::byte> mad, std::uint32_t src_qp = 1, std::uint32_t qkey = wire::gsi_qkey) {
    wire::transport_headers h;
    h.bth.opcode = static_cast<std::uint8_t>(wire::opcode::ud_send_only);
    h.bth.dest_qp = 1;
    h.bth.pkey = 0xFFFF;
    h.bth.pad = wire::pad_for(mad.size());
    h.deth = {qkey, src_qp};
    std::vector<std::byte> pkt(64 + mad.size() + 8);
    const std::size_t hl = wire::encode(h, pkt);
    std::memcpy(pkt.data() + hl, mad.data(), mad.size());
    const std::size_t len = hl + mad.size() + h.bth.pad + 4;  // ICRC not checked by the receiver here
    ::sendto(fd_, pkt.data(), len, 0, reinterpret_cast<sockaddr*>(&dst_), sizeof dst_);
  }
  /// The IPv4 TTL the datagrams leave with.
  void set_ttl(int ttl) { ::setsockopt(fd_, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl); }

 private:
  int fd_ = -1;
  sockaddr_in dst_{};
};

// A sustained flood of MADs (REQs for a port nobody listens on, each
// answered with a REJ, which costs more than its read) leaves a
// connection's messages flowing (helper-138 #1).  MADs were read to the
// front of the receive queue as fast as they came, so the receive queue
// never drained, and the sends (a requester's turn, the ACKs), which wait
// for that, and an ACK received behind them, never went: the RC QPs ran
// out of retries.
TEST_F(cm_udp, a_flood_of_mads_leaves_the_data_flowing) {
  side a, b;
  make(a, 0);
  make(b, 1, "", nullptr, false);  // (the flood's raw datagrams carry no ICRC)
  connection k = connect_rc(a, b);
  std::atomic<bool> stop{false};
  std::thread flooder([&] {
    raw_sender raw(test_address(2), test_address(1), test_port());
    wire::cm::req r;
    r.service_id = wire::cm::service_id(wire::cm::port_space::tcp, 7472);
    std::array<std::byte, wire::cm::mad_size> mad;
    for (std::uint32_t id = 1; !stop.load(std::memory_order_relaxed); ++id) {
      r.local_comm_id = id;
      wire::cm::encode(wire::cm::mad_header{}, r, std::span<std::byte, wire::cm::mad_size>(mad));
      raw.send(mad);
    }
  });
  const std::uint64_t deferred = b.dev.counters().management_deferred;
  int exchanges = 0;
  const auto until = std::chrono::steady_clock::now() + 300ms;
  while (std::chrono::steady_clock::now() < until && !HasFailure()) {
    exchange(a, k.qa, b, k.qb);
    exchange(b, k.qb, a, k.qa);
    ++exchanges;
  }
  stop = true;
  flooder.join();
  EXPECT_GT(b.dev.counters().management_deferred, deferred) << "the flood never filled the queue";
  EXPECT_GE(exchanges, 5) << "the messages stopped under the flood";
  EXPECT_EQ(k.qa.state(), qp_state::rts);
  EXPECT_EQ(k.qb.state(), qp_state::rts);
}

TEST_F(cm_udp, garbage_on_qp1_leaves_the_cm_working) {
  side b;
  make(b, 1, "", nullptr, false);  // the raw sender does not compute ICRCs
  cm::listener l = cm::listen(b.dev, {b.ip, 7471});
  auto parked = l.async_get_request(use_request);

  raw_sender raw(test_address(0), test_address(1), test_port());
  std::mt19937 rng(5);
  namespace wcm = wire::cm;
  std::array<std::byte, wcm::mad_size> mad;
  auto header = [&](wcm::attr a) {
    // A valid CM header for `a`, then random bytes.
    for (auto& x : mad) x = static_cast<std::byte>(rng());
    wcm::rtu dummy;
    wcm::mad_header h;
    h.attr_id = a;
    wcm::encode(h, dummy, std::span<std::byte, wcm::mad_size>(mad));
    mad[16] = static_cast<std::byte>(static_cast<std::uint16_t>(a) >> 8);
    mad[17] = static_cast<std::byte>(static_cast<std::uint16_t>(a));
    for (std::size_t i = 24; i < mad.size(); ++i) mad[i] = static_cast<std::byte>(rng());
  };
  const wcm::attr attrs[] = {wcm::attr::req, wcm::attr::rep, wcm::attr::rtu, wcm::attr::rej, wcm::attr::mra,
                             wcm::attr::dreq, wcm::attr::drep, wcm::attr::sidr_req, wcm::attr::sidr_rep,
                             wcm::attr::lap, wcm::attr::apr, wcm::attr::class_port_info};
  for (int round = 0; round < 200; ++round) {
    for (wcm::attr a : attrs) {
      header(a);
      raw.send(mad);
    }
    // Wholly random MADs, short ones, long ones, wrong Q_Key or source QP.
    for (auto& x : mad) x = static_cast<std::byte>(rng());
    raw.send(mad);
    raw.send(std::span(mad).first(rng() % 256));
    raw.send(mad, 5);
    raw.send(mad, 1, 0x1234);
    if (round % 20 == 0) ctx.poll();
  }
  // A REQ that parses but names an absurd path: REJ or nothing, no crash.
  {
    wcm::req r;
    r.local_comm_id = 77;
    r.service_id = wcm::service_id(wcm::port_space::tcp, 7471);
    r.local_qpn = 0xFFFFFF;
    r.path_mtu = 15;
    r.transport_type = 2;
    wcm::encode(wcm::mad_header{}, r, std::span<std::byte, wcm::mad_size>(mad));
    raw.send(mad);
  }
  for (int i = 0; i < 50; ++i) ctx.poll();
  EXPECT_FALSE(parked.ready()) << "garbage must not become a connection request";

  // A real peer still connects.
  side a;
  make(a, 0);
  qp qa = make_qp(a), qb = make_qp(b);
  cm::connector c(a.dev);
  auto conn = c.async_connect(qa, {b.ip, 7471}, {}, use_request);
  cm::connector passive = parked.get().conn;
  passive.accept(qb);
  conn.get();
}

TEST_F(cm_udp, a_vanished_peer_resets_the_connection) {
  side a, b;
  make(a, 0);
  make(b, 1);
  cm::listener l = cm::listen(b.dev, {b.ip, 7471});
  qp qa = make_qp(a), qb = make_qp(b);
  cm::connector c(a.dev);
  auto got = l.async_get_request(use_request);
  auto conn = c.async_connect(qa, {b.ip, 7471}, {}, fast(), use_request);
  cm::connector passive = got.get().conn;
  passive.accept(qb, {}, fast());
  conn.get();
  auto notified = passive.async_notify_disconnect(use_request);
  // a's device is removed (as its process dying would): no DREQ.
  a.sdev.reset();
  c = {};
  qa = {};
  a.c = {};
  a.p = {};
  a.dev = {};
  std::vector<std::byte> buf(8);
  mr m = b.p.reg_mr(buf.data(), buf.size(), access_local_write);
  const sge s{reinterpret_cast<std::uintptr_t>(buf.data()), 8, m.lkey()};
  send_wr w;
  w.sg_list = &s;
  w.num_sge = 1;
  w.flags = send_signaled;
  ASSERT_FALSE(qb.post_send(w));
  std::error_code ec;
  ASSERT_TRUE(notified.wait_for(30s));
  notified.get(ec);
  EXPECT_EQ(ec, errc::connection_reset);
  work_completion wc[2];
  ASSERT_EQ(b.c.poll(wc), 1u);
  EXPECT_EQ(wc[0].status, wc_status::retry_exc_err);
  // Disconnecting now still completes (the DREQ goes unanswered).
  passive.disconnect();
}

// A peer that answers every REQ, and keeps answering, with an MRA: the
// first stretches the wait once, as in Linux's ib_cm; the rest are
// ignored, so the connect still resends and times out.
TEST_F(cm_udp, repeated_mras_do_not_hold_a_connect_open) {
  side a;
  make(a, 1, "", nullptr, false);  // the fake peer does not compute ICRCs
  gid peer_ip;
  ASSERT_TRUE(gid::parse(test_address(0), peer_ip));

  // The fake peer: the RoCE port on its own address, as a device would be.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in self{};
  self.sin_family = AF_INET;
  self.sin_port = htons(test_port());
  ::inet_pton(AF_INET, test_address(0).c_str(), &self.sin_addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof self), 0);
  raw_sender raw(test_address(0), test_address(1), test_port());

  qp qa = make_qp(a);
  cm::connector c(a.dev);
  cm::conn_params p = fast();
  p.cm_response_timeout = 12;  // 17 ms
  p.max_cm_retries = 3;
  auto conn = c.async_connect(qa, {peer_ip, 7471}, {}, p, use_request);
  namespace wcm = wire::cm;
  int reqs = 0;
  std::uint32_t comm_id = 0;
  auto next_mra = std::chrono::steady_clock::now();
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!conn.ready() && std::chrono::steady_clock::now() < until) {
    ctx.poll();
    std::byte in[512];
    const ssize_t n = ::recv(fd, in, sizeof in, 0);
    wire::packet_view v;
    wcm::req r;
    if (n > 0 && wire::decode(std::span(in, static_cast<std::size_t>(n)), true, v) == wire::decode_error::ok &&
        wcm::decode(v.payload, r) == wcm::mad_error::ok) {
      ++reqs;
      comm_id = r.local_comm_id;
    }
    if (comm_id != 0 && std::chrono::steady_clock::now() >= next_mra) {
      wcm::mra m;
      m.local_comm_id = 99;
      m.remote_comm_id = comm_id;
      m.message_mraed = wcm::msg_ref::req;
      m.service_timeout = 12;
      std::array<std::byte, wcm::mad_size> mad;
      wcm::encode(wcm::mad_header{}, m, std::span<std::byte, wcm::mad_size>(mad));
      raw.send(mad);
      next_mra += 5ms;
    }
  }
  ::close(fd);
  ASSERT_TRUE(conn.ready()) << "the MRAs held the connect open; " << reqs << " REQs seen";
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::timed_out);
  EXPECT_EQ(reqs, 4) << "the REQ and its three resends";
}

// A peer that is only a UDP socket on test_address(0), the RoCE port as a
// device's: it reads the CM MADs the device under test (on
// test_address(1), checking no ICRC) sends and writes its own.
class fake_peer {
 public:
  fake_peer() : raw_(test_address(0), test_address(1), test_port()) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in self{};
    self.sin_family = AF_INET;
    self.sin_port = htons(test_port());
    ::inet_pton(AF_INET, test_address(0).c_str(), &self.sin_addr);
    bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&self), sizeof self) == 0;
    const int on = 1;
    ::setsockopt(fd_, IPPROTO_IP, IP_RECVTTL, &on, sizeof on);
  }
  ~fake_peer() { ::close(fd_); }
  /// The TTL the last MAD read came with; the TTL ours leave with.
  int last_ttl() const { return last_ttl_; }
  void set_ttl(int ttl) { raw_.set_ttl(ttl); }
  bool bound() const { return bound_; }

  /// The next CM MAD of type M the device sends within `patience`
  /// (polling `ctx`, which drives it); other MADs are counted and skipped.
  template <class M>
  std::optional<M> next(context& ctx, std::chrono::milliseconds patience = 5s) {
    const auto until = std::chrono::steady_clock::now() + patience;
    while (std::chrono::steady_clock::now() < until) {
      ctx.poll();
      std::byte in[512];
      iovec iov{in, sizeof in};
      alignas(cmsghdr) char control[64];
      msghdr mh{};
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = control;
      mh.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(fd_, &mh, 0);
      for (cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&mh) : nullptr; c != nullptr; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL)
          std::memcpy(&last_ttl_, CMSG_DATA(c), sizeof(int));
      wire::packet_view v;
      if (n <= 0 || wire::decode(std::span(in, static_cast<std::size_t>(n)), true, v) != wire::decode_error::ok)
        continue;
      ++mads_;
      M m;
      if (wire::cm::decode(v.payload, m) == wire::cm::mad_error::ok) return m;
    }
    return std::nullopt;
  }
  /// MADs read so far (of any type).
  int mads() const { return mads_; }

  template <class M>
  void send(const M& m) {
    std::array<std::byte, wire::cm::mad_size> mad;
    wire::cm::encode(wire::cm::mad_header{}, m, std::span<std::byte, wire::cm::mad_size>(mad));
    raw_.send(mad);
  }

  /// Answers `req` with a REP from comm ID `id`, QP 0x99, CA GUID 0x1234,
  /// private data starting 0xAB.
  void accept(const wire::cm::req& req, std::uint32_t id) {
    wire::cm::rep rep;
    rep.local_comm_id = id;
    rep.remote_comm_id = req.local_comm_id;
    rep.local_qpn = 0x99;
    rep.starting_psn = 5;
    rep.responder_resources = 1;
    rep.initiator_depth = 1;
    rep.rnr_retry_count = 7;
    rep.local_ca_guid = 0x1234;
    rep.private_data[0] = std::byte{0xAB};
    send(rep);
  }

 private:
  raw_sender raw_;
  int fd_ = -1;
  bool bound_ = false;
  int mads_ = 0;
  int last_ttl_ = -1;
};

// The device under test, `a` on test_address(1), and the fake peer.
class cm_udp_fake_peer : public cm_udp {
 protected:
  /// Makes `a`, its QP `qa` and connector `c`, and connects them to the
  /// fake peer, which answers as `id`; returns the REQ it read (nothing if
  /// the connection did not come up).
  std::optional<wire::cm::req> establish(std::uint32_t id) {
    std::optional<wire::cm::req> req;
    auto conn = start_connect(req);
    if (!req) return std::nullopt;
    peer.accept(*req, id);
    if (!peer.next<wire::cm::rtu>(ctx) || !poll_until([&] { return conn.ready(); })) return std::nullopt;
    std::error_code ec;
    conn.get(ec);
    EXPECT_FALSE(ec) << ec.message();
    return req;
  }
  /// Makes `a`, its QP `qa` and connector `c`, and starts an RC connect to
  /// the fake peer, which reads the REQ into `req`.
  averbs::request<cm::connect_result> start_connect(std::optional<wire::cm::req>& req) {
    make(a, 1, "", nullptr, false);
    qa = make_qp(a);
    c = cm::connector(a.dev);
    EXPECT_TRUE(gid::parse(test_address(0), peer_ip));
    auto conn = c.async_connect(qa, {peer_ip, 7471}, {}, fast(), use_request);
    req = peer.next<wire::cm::req>(ctx);
    return conn;
  }
  /// `m` from test_address(2), an address that is not the fake peer's.
  template <class M>
  static void send_from_elsewhere(const M& m) {
    std::array<std::byte, wire::cm::mad_size> mad;
    wire::cm::encode(wire::cm::mad_header{}, m, std::span<std::byte, wire::cm::mad_size>(mad));
    raw_sender intruder(test_address(2), test_address(1), test_port());
    intruder.send(mad);
  }
  /// Polls (the devices move only when polled) until `done()` or `patience`
  /// is over; returns `done()`.
  template <class Done>
  bool poll_until(Done done, std::chrono::milliseconds patience = 5s) {
    const auto until = std::chrono::steady_clock::now() + patience;
    while (!done() && std::chrono::steady_clock::now() < until) ctx.poll();
    return done();
  }
  /// Polls for `d`.
  void run_for(std::chrono::milliseconds d) { (void)poll_until([] { return false; }, d); }
  /// An rdma_cm REQ from the fake peer at `from` (comm ID `id`, QP 0x42,
  /// CA GUID 0xFEED) for port 7471 of `to`'s device.
  static wire::cm::req req_to(const side& to, const gid& from, std::uint32_t id) {
    namespace wcm = wire::cm;
    wcm::req r;
    r.local_comm_id = id;
    r.service_id = wcm::service_id(wcm::port_space::tcp, 7471);
    r.local_ca_guid = 0xFEED;
    r.local_qpn = 0x42;
    r.responder_resources = 1;
    r.initiator_depth = 1;
    r.remote_cm_response_timeout = 16;
    r.local_cm_response_timeout = 16;
    r.path_mtu = static_cast<std::uint8_t>(mtu::mtu_1024);
    r.retry_count = 7;
    r.rnr_retry_count = 7;
    r.max_cm_retries = 5;
    std::memcpy(r.primary.local_gid.data(), from.raw.data(), 16);
    std::memcpy(r.primary.remote_gid.data(), to.ip.raw.data(), 16);
    wcm::ip_header ip;
    ip.src_port = 40000;
    std::memcpy(ip.src_ip.data(), from.raw.data(), 16);
    std::memcpy(ip.dst_ip.data(), to.ip.raw.data(), 16);
    EXPECT_EQ(wcm::encode(ip, r.private_data), wcm::ip_header_size);
    return r;
  }

  /// An rdma_cm SIDR_REQ from the fake peer at `from` (request ID `id`)
  /// for UDP port 7471 of `to`'s device.
  static wire::cm::sidr_req sidr_req_to(const side& to, const gid& from, std::uint32_t id) {
    namespace wcm = wire::cm;
    wcm::sidr_req s;
    s.request_id = id;
    s.service_id = wcm::service_id(wcm::port_space::udp, 7471);
    wcm::ip_header ip;
    ip.src_port = 40000;
    std::memcpy(ip.src_ip.data(), from.raw.data(), 16);
    std::memcpy(ip.dst_ip.data(), to.ip.raw.data(), 16);
    EXPECT_EQ(wcm::encode(ip, s.private_data), wcm::ip_header_size);
    return s;
  }

  /// The fake peer connects to `b` listening (a REQ whose LocalAckTimeout
  /// is `ack_timeout`), is accepted on `qb` and disconnects with `d`: the
  /// passive connector, answered with a DREP, is in timewait.
  void disconnect_into_timewait(std::uint8_t ack_timeout, std::optional<cm::connector>& passive, qp& qb,
                                wire::cm::dreq& d) {
    listen_on_b();
    namespace wcm = wire::cm;
    wcm::req r = req_to(b, peer_ip, 64);
    r.primary.local_ack_timeout = ack_timeout;
    wcm::rep rep;
    accept_on_b(r, passive, qb, rep);
    if (::testing::Test::HasFatalFailure()) return;
    d.local_comm_id = 64;
    d.remote_comm_id = rep.local_comm_id;
    d.remote_qpn = qb.num();
    peer.send(d);
    ASSERT_TRUE(peer.next<wcm::drep>(ctx).has_value());
    ASSERT_EQ(passive->state(), cm::conn_state::timewait);
  }

  /// Makes `a`, a UD QP `qa` and connector `c`, and starts a SIDR connect
  /// to the fake peer, which reads the SIDR_REQ into `sreq`.
  averbs::request<cm::connect_result> start_sidr(std::optional<wire::cm::sidr_req>& sreq) {
    make(a, 1, "", nullptr, false);
    EXPECT_TRUE(gid::parse(test_address(0), peer_ip));
    qa = make_qp(a, qp_type::ud);
    c = cm::connector(a.dev);
    auto conn = c.async_connect(qa, {peer_ip, 7471}, {}, fast(), use_request);
    sreq = peer.next<wire::cm::sidr_req>(ctx);
    return conn;
  }
  /// The fake peer's SIDR_REP accepting `r`: QP 0x99, Q_Key 0x1234.
  static wire::cm::sidr_rep sidr_ok(const wire::cm::sidr_req& r) {
    wire::cm::sidr_rep rep;
    rep.request_id = r.request_id;
    rep.status = wire::cm::sidr_status::ok;
    rep.qpn = 0x99;
    rep.qkey = 0x1234;
    rep.service_id = r.service_id;
    return rep;
  }

  /// For tests where the fake peer is the requester: the device under test
  /// `b`, listening on port 7471, and the peer's address.
  /// The peer's REQ `r` (comm ID 64) to `b` listening is accepted on a new
  /// QP `qb`, and the peer answers the REP (`rep`) with an RTU: `passive`
  /// is established.
  void accept_on_b(const wire::cm::req& r, std::optional<cm::connector>& passive, qp& qb,
                   wire::cm::rep& rep) {
    passive = request(r);
    ASSERT_TRUE(passive.has_value());
    qb = make_qp(b);
    auto acc = passive->async_accept(qb, {}, fast(), use_request);
    const auto got = peer.next<wire::cm::rep>(ctx);
    ASSERT_TRUE(got.has_value());
    rep = *got;
    wire::cm::rtu u;
    u.local_comm_id = 64;
    u.remote_comm_id = rep.local_comm_id;
    peer.send(u);
    ASSERT_TRUE(poll_until([&] { return acc.ready(); }));
    acc.get();
  }
  /// reject() and accept() of the request `req` came with both fail with `e`.
  void expect_late_answers_fail(const cm::connector& req, errc e) {
    std::error_code ec;
    req.reject({}, ec);
    EXPECT_EQ(ec, e) << "reject: " << ec.message();
    qp q = make_qp(b);
    req.accept(q, {}, {}, ec);
    EXPECT_EQ(ec, e) << "accept: " << ec.message();
  }
  void listen_on_b() {
    make(b, 1, "", nullptr, false);
    l = cm::listen(b.dev, {b.ip, 7471});
    EXPECT_TRUE(gid::parse(test_address(0), peer_ip));
  }
  /// The peer sends `r`; the connection request the listener got for it
  /// (none within 2 s: nothing).
  std::optional<cm::connector> request(const wire::cm::req& r) {
    auto got = l.async_get_request(use_request);
    peer.send(r);
    if (!poll_until([&] { return got.ready(); }, 2s)) return std::nullopt;
    return got.get().conn;
  }

  side a;
  qp qa;
  cm::connector c;
  fake_peer peer;
  side b;
  cm::listener l;
  gid peer_ip;
};

// A REJ "timeout" that cannot name our comm ID (RemoteCommID 0) is found
// by the requester's CA GUID (its ARI) and comm ID, which are in every REQ
// that requester sends anywhere: it ends only a request not yet confirmed
// (not yet answered, or REP sent), and only from the requester's address
// -- never an established connection, whose requester knows our comm ID.
TEST_F(cm_udp_fake_peer, a_timeout_rej_found_by_the_requesters_ids_ends_only_an_unconfirmed_request) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  auto timeout_rej = [](std::uint32_t id) {
    wcm::rej j;
    j.local_comm_id = id;
    j.remote_comm_id = 0;
    j.message_rejected = wcm::msg_ref::req;
    j.reason = static_cast<std::uint16_t>(wcm::rej_reason::timeout);
    const std::uint64_t guid = 0xFEED;  // req_to()'s CA GUID
    for (int i = 0; i < 8; ++i) j.ari[i] = std::byte(static_cast<std::uint8_t>(guid >> (56 - 8 * i)));
    j.reject_info_length = 8;
    return j;
  };
  std::optional<cm::connector> passive;
  qp qb;
  wcm::rep rep;
  accept_on_b(req_to(b, peer_ip, 64), passive, qb, rep);
  ASSERT_FALSE(HasFatalFailure());
  peer.send(timeout_rej(64));
  run_for(50ms);
  EXPECT_EQ(passive->state(), cm::conn_state::established) << "a REJ without our comm ID ended a connection";
  EXPECT_EQ(qb.query().state, qp_state::rts);

  wcm::req r = req_to(b, peer_ip, 65);
  r.local_qpn = 0x43;
  auto waiting = request(r);
  ASSERT_TRUE(waiting.has_value());
  raw_sender elsewhere(test_address(2), test_address(1), test_port());
  std::array<std::byte, wcm::mad_size> mad;
  wcm::encode(wcm::mad_header{}, timeout_rej(65), std::span<std::byte, wcm::mad_size>(mad));
  elsewhere.send(mad);
  run_for(50ms);
  EXPECT_EQ(waiting->state(), cm::conn_state::requested) << "a REJ from another address ended the request";
  peer.send(timeout_rej(65));
  EXPECT_TRUE(poll_until([&] { return waiting->state() == cm::conn_state::closed; }, 2s))
      << "the requester's own REJ did not end its request: " << static_cast<int>(waiting->state());
  // Answering it now says why it is gone, whichever the answer.
  expect_late_answers_fail(*waiting, errc::timed_out);
}

// A passive connection that was up and that a REJ ended is closed to a
// late accept() or reject() (invalid_state, docs/cm.md), not one whose
// requester gave up (which says why: the test above).
TEST_F(cm_udp_fake_peer, a_connection_a_rej_ended_refuses_a_late_accept_or_reject) {
  manual_time = true;
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  std::optional<cm::connector> passive;
  qp qb;
  wire::cm::rep rep;
  accept_on_b(req_to(b, peer_ip, 64), passive, qb, rep);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(passive->state(), cm::conn_state::established);
  wire::cm::rej j;
  j.local_comm_id = 64;
  j.remote_comm_id = rep.local_comm_id;
  j.message_rejected = wire::cm::msg_ref::rep;
  j.reason = static_cast<std::uint16_t>(wire::cm::rej_reason::consumer_defined);
  peer.send(j);
  ASSERT_TRUE(poll_until([&] { return passive->state() == cm::conn_state::timewait; }))
      << static_cast<int>(passive->state());
  clock.advance(std::chrono::minutes(5));  // past timewait
  ASSERT_TRUE(poll_until([&] { return passive->state() == cm::conn_state::closed; }))
      << static_cast<int>(passive->state());
  expect_late_answers_fail(*passive, errc::invalid_state);
}

// A peer that keeps replacing its request (the same CA GUID and QP, a new
// comm ID each time) leaves each replaced request's timer cancelled; the
// device sweeps those out instead of keeping each until its deadline (34 s
// here: the REQ says its sender waits 69 s for an answer).
TEST_F(cm_udp_fake_peer, replaced_requests_leave_no_timers_behind) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  constexpr std::uint32_t first = 100, n = 400;
  for (std::uint32_t id = first; id < first + n; ++id) {
    wcm::req r = req_to(b, peer_ip, id);
    r.remote_cm_response_timeout = 24;
    peer.send(r);
    if (id % 8 == 0) run_for(1ms);
  }
  run_for(50ms);
  // Every one arrived and replaced the one before: one request is left.
  auto got = l.async_get_request(use_request);
  ASSERT_TRUE(poll_until([&] { return got.ready(); }, 2s));
  (void)got.get();
  auto more = l.async_get_request(use_request);
  run_for(20ms);
  EXPECT_FALSE(more.ready()) << "a replaced request was still waiting";
  const device_counters k = b.dev.counters();
  EXPECT_EQ(k.receive_overflows, 0u) << "REQs were lost in the socket: fewer timers were made";
  EXPECT_LT(k.timers, n / 4) << "cancelled CM timers kept until their deadlines";
}

// A REQ whose CM response timeout is 0 (4 µs) does not get its REP sent
// 16 times within 64 µs: a peer's timeouts count as at least 1 ms, as
// ib_cm's cm_convert_to_ms() makes them.
TEST_F(cm_udp_fake_peer, a_peer_timeout_of_zero_spaces_the_rep_resends_a_millisecond_apart) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  wcm::req r = req_to(b, peer_ip, 80);
  r.local_cm_response_timeout = 0;
  r.max_cm_retries = 15;
  auto passive = request(r);
  ASSERT_TRUE(passive.has_value());
  qp qb = make_qp(b);
  auto acc = passive->async_accept(qb, {}, fast(), use_request);
  ASSERT_TRUE(peer.next<wcm::rep>(ctx).has_value());
  const auto t0 = std::chrono::steady_clock::now();
  int reps = 1;
  while (std::chrono::steady_clock::now() - t0 < 8ms)
    if (peer.next<wcm::rep>(ctx, 1ms)) ++reps;
  // Timers never fire early: in 8 ms at most the first and 8 resends.
  EXPECT_LE(reps, 9) << "REP resends closer than a millisecond";
  EXPECT_FALSE(acc.ready());
}

// An accept cancelled before the RTU sends no more REPs: a resent REQ
// meets it ended (REJ "consumer defined"), not answered with the REP
// again (which would bring the requester up only to be disconnected).
TEST_F(cm_udp_fake_peer, a_req_resent_to_a_cancelled_accept_is_rejected_not_answered) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  wcm::req r = req_to(b, peer_ip, 70);
  r.local_cm_response_timeout = 20;  // the REP resends after 4.3 s: only the resent REQ meets the cancel
  auto passive = request(r);
  ASSERT_TRUE(passive.has_value());
  qp qb = make_qp(b);
  auto acc = passive->async_accept(qb, {}, fast(), use_request);
  ASSERT_TRUE(peer.next<wcm::rep>(ctx).has_value());
  acc.cancel();
  peer.send(r);  // its REP was lost
  const auto rej = peer.next<wcm::rej>(ctx, 200ms);
  ASSERT_TRUE(rej.has_value()) << "no REJ for the cancelled accept";
  EXPECT_EQ(rej->reason, static_cast<std::uint16_t>(wcm::rej_reason::consumer_defined));
  EXPECT_EQ(rej->remote_comm_id, 70u);
  EXPECT_EQ(peer.mads(), 2) << "the REP was sent again";
}

// A REJ for an established connection ends it (ib_cm's cm_rej_handler: the
// responder gave up after our RTU was lost, or was destroyed in REP_SENT,
// and its QP is gone): the QP leaves RTS and a waiting notify_disconnect
// completes, as after a DREQ.  One that does not name the peer's comm ID
// changes nothing.
TEST_F(cm_udp_fake_peer, a_rej_for_an_established_connection_ends_it) {
  ASSERT_TRUE(peer.bound());
  const auto req = establish(77);
  ASSERT_TRUE(req.has_value()) << "not established";
  ASSERT_EQ(c.state(), cm::conn_state::established);
  auto notified = c.async_notify_disconnect(use_request);
  wire::cm::rej j;
  j.local_comm_id = 78;  // not the peer's
  j.remote_comm_id = req->local_comm_id;
  j.message_rejected = wire::cm::msg_ref::rep;
  j.reason = static_cast<std::uint16_t>(wire::cm::rej_reason::consumer_defined);
  j.private_data[0] = std::byte{0xCD};
  peer.send(j);
  run_for(50ms);
  EXPECT_EQ(c.state(), cm::conn_state::established);
  EXPECT_FALSE(notified.ready());
  ASSERT_FALSE(c.private_data().empty());
  EXPECT_EQ(c.private_data()[0], std::byte{0xAB}) << "a REJ that was dropped changed the private data";

  j.local_comm_id = 77;
  peer.send(j);
  ASSERT_TRUE(poll_until([&] { return notified.ready(); })) << "the REJ did not end the connection";
  std::error_code ec;
  notified.get(ec);
  EXPECT_EQ(ec, errc::connection_reset);
  EXPECT_EQ(c.state(), cm::conn_state::timewait);
  EXPECT_EQ(c.reject_reason(), static_cast<std::uint16_t>(wire::cm::rej_reason::consumer_defined));
  EXPECT_EQ(qa.query().state, qp_state::err);
  c.disconnect();  // ended already: completes at once, sends nothing
  run_for(50ms);
  EXPECT_FALSE(peer.next<wire::cm::dreq>(ctx, 10ms).has_value()) << "a DREQ for a connection the REJ ended";
}

// A REQ naming a connected (CA GUID, QP number) from another address: the
// GUID and the QP number are on the wire for anyone to copy.  The
// connection it names lives on (only its own peer's address may end it
// that way: a_peer_that_comes_back_...); the REQ is another requester's
// (here refused for the port, where nobody listens).
TEST_F(cm_udp_fake_peer, a_forged_stale_req_from_another_address_ends_nothing) {
  ASSERT_TRUE(peer.bound());
  ASSERT_TRUE(establish(77).has_value()) << "not established";
  auto notified = c.async_notify_disconnect(use_request);
  gid intruder_ip;
  ASSERT_TRUE(gid::parse(test_address(2), intruder_ip));
  wire::cm::req r = req_to(a, intruder_ip, 5);
  r.local_ca_guid = 0x1234;  // the fake peer's, as its REP said
  r.local_qpn = 0x99;
  std::array<std::byte, wire::cm::mad_size> mad;
  wire::cm::encode(wire::cm::mad_header{}, r, std::span<std::byte, wire::cm::mad_size>(mad));
  raw_sender intruder(test_address(2), test_address(1), test_port());
  intruder.send(mad);
  run_for(200ms);
  EXPECT_EQ(c.state(), cm::conn_state::established);
  EXPECT_FALSE(notified.ready()) << "a forged REQ reset the connection";
  EXPECT_EQ(qa.query().state, qp_state::rts);
  EXPECT_FALSE(peer.next<wire::cm::dreq>(ctx, 100ms).has_value()) << "the real peer was sent a DREQ";
}

// An answer to a MAD for nothing known (here a REJ "invalid service ID"
// for a port nobody listens on) leaves with the route's hop limit, as
// ib_cm's response AH gets it, not with what was left of the request's: a
// peer many routers away, or one sending with a small TTL, would never
// hear it.
TEST_F(cm_udp_fake_peer, a_refusal_leaves_with_the_routes_hop_limit_not_the_requests) {
  ASSERT_TRUE(peer.bound());
  make(a, 1, "", nullptr, false);
  ASSERT_TRUE(gid::parse(test_address(0), peer_ip));
  peer.set_ttl(3);
  peer.send(req_to(a, peer_ip, 5));  // nobody listens on 7471
  const auto j = peer.next<wire::cm::rej>(ctx);
  ASSERT_TRUE(j.has_value()) << "no REJ";
  EXPECT_EQ(j->reason, static_cast<std::uint16_t>(wire::cm::rej_reason::invalid_service_id));
  int route_ttl = 0;  // the host's default, as a fresh socket has it
  socklen_t len = sizeof route_ttl;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::getsockopt(fd, IPPROTO_IP, IP_TTL, &route_ttl, &len), 0);
  ::close(fd);
  EXPECT_EQ(peer.last_ttl(), route_ttl);
}

// The rdma_cm header's destination must be an address of the device the
// REQ reached (rdma_cm's validate_net_dev): a wildcard listener does not
// take a request "for" 10.9.8.7, and neither does a SIDR listener.
TEST_F(cm_udp_fake_peer, a_request_whose_header_names_another_address_is_refused) {
  ASSERT_TRUE(peer.bound());
  make(b, 1, "", nullptr, false);
  ASSERT_TRUE(gid::parse(test_address(0), peer_ip));
  cm::listener any = cm::listen(b.dev, {gid{}, 7471});
  cm::listener any_ud = cm::listen(b.dev, {gid{}, 7471}, 128, cm::port_space::udp);
  auto got = any.async_get_request(use_request);
  auto got_ud = any_ud.async_get_request(use_request);
  gid elsewhere;
  ASSERT_TRUE(gid::parse("10.9.8.7", elsewhere));
  wire::cm::ip_header ip;
  ip.src_port = 40000;
  std::memcpy(ip.src_ip.data(), peer_ip.raw.data(), 16);
  std::memcpy(ip.dst_ip.data(), elsewhere.raw.data(), 16);
  wire::cm::req r = req_to(b, peer_ip, 5);
  ASSERT_EQ(wire::cm::encode(ip, r.private_data), wire::cm::ip_header_size);
  peer.send(r);
  const auto j = peer.next<wire::cm::rej>(ctx);
  ASSERT_TRUE(j.has_value()) << "no REJ";
  EXPECT_EQ(j->reason, static_cast<std::uint16_t>(wire::cm::rej_reason::invalid_service_id));
  wire::cm::sidr_req s = sidr_req_to(b, peer_ip, 6);
  ASSERT_EQ(wire::cm::encode(ip, s.private_data), wire::cm::ip_header_size);
  peer.send(s);
  const auto answer = peer.next<wire::cm::sidr_rep>(ctx);
  ASSERT_TRUE(answer.has_value()) << "no SIDR_REP";
  EXPECT_EQ(answer->status, wire::cm::sidr_status::no_service);
  EXPECT_FALSE(got.ready());
  EXPECT_FALSE(got_ud.ready());
}

// A flood of MADs (here REQs for a port nobody listens on, each answered
// with a REJ, a send that costs more than the read) waits in the
// management socket's buffer, which drops what it cannot hold: the device
// reads no more while 32 are queued.  It used to read them all into its
// receive queue, growing the packet pool (which never shrinks) by the
// socket buffer's worth and leaving the data socket unread meanwhile.
TEST_F(cm_udp_fake_peer, a_flood_of_mads_waits_in_the_socket_not_in_the_device) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  run_for(20ms);
  const std::uint64_t pool_before = b.dev.counters().packet_buffers;
  wire::cm::req r = req_to(b, peer_ip, 1000);
  r.service_id = wire::cm::service_id(wire::cm::port_space::tcp, 7472);  // nobody listens
  for (std::uint32_t i = 0; i < 4000; ++i) {
    r.local_comm_id = 1000 + i;
    peer.send(r);
  }
  run_for(300ms);
  const device_counters after = b.dev.counters();
  EXPECT_GT(after.management_deferred, 0u);
  EXPECT_LT(after.packet_buffers, pool_before + 200)
      << "the pool grew by the flood: " << pool_before << " -> " << after.packet_buffers;
  // The CM still answers.
  auto got = l.async_get_request(use_request);
  peer.send(req_to(b, peer_ip, 9999));
  ASSERT_TRUE(poll_until([&] { return got.ready(); })) << "no request after the flood";
}

// A REP from another address than the one the REQ went to is dropped: our
// comm IDs are sequential, and whoever guessed one would otherwise point
// the QP at itself.  The real REP, after it, connects.
TEST_F(cm_udp_fake_peer, a_rep_from_another_address_is_dropped) {
  ASSERT_TRUE(peer.bound());
  std::optional<wire::cm::req> req;
  auto conn = start_connect(req);
  ASSERT_TRUE(req.has_value());
  wire::cm::rep forged;
  forged.local_comm_id = 66;
  forged.remote_comm_id = req->local_comm_id;
  forged.local_qpn = 0x77;
  forged.starting_psn = 5;
  forged.responder_resources = 1;
  forged.initiator_depth = 1;
  forged.rnr_retry_count = 7;
  forged.local_ca_guid = 0x6666;
  send_from_elsewhere(forged);
  run_for(100ms);
  EXPECT_FALSE(conn.ready()) << "a REP from another address was taken";
  EXPECT_NE(qa.query().state, qp_state::rts);
  peer.accept(*req, 77);
  ASSERT_TRUE(peer.next<wire::cm::rtu>(ctx).has_value()) << "no RTU for the real REP";
  ASSERT_TRUE(poll_until([&] { return conn.ready(); }));
  conn.get();
  EXPECT_EQ(qa.query().dest_qp_num, 0x99u);
}

// A REQ that names another address as its requester's -- in its primary
// path or in the rdma_cm header -- is refused to its sender: our MRA, REP
// and their resends went to the path's address, which anyone who can
// forge a source could point at a third host (helper-132 #1).
TEST_F(cm_udp_fake_peer, a_req_naming_another_requester_address_is_refused_to_its_sender) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  gid elsewhere;
  ASSERT_TRUE(gid::parse(test_address(2), elsewhere));
  namespace wcm = wire::cm;
  // (A third: a partition the port is not in, in which every packet of
  // the connection would be dropped: REJ "invalid GID", as ib_cm.)
  for (int field = 0; field < 3; ++field) {
    wcm::req r = req_to(b, peer_ip, 90 + field);
    if (field == 0) {
      std::memcpy(r.primary.local_gid.data(), elsewhere.raw.data(), 16);
    } else if (field == 2) {
      r.pkey = 0x8001;
    } else {
      wcm::ip_header ip;
      ASSERT_TRUE(wcm::decode(std::span<const std::byte>(r.private_data), ip));
      std::memcpy(ip.src_ip.data(), elsewhere.raw.data(), 16);
      wcm::encode(ip, r.private_data);
    }
    auto got = l.async_get_request(use_request);
    peer.send(r);
    const auto j = peer.next<wcm::rej>(ctx);
    ASSERT_TRUE(j.has_value()) << "no REJ for field " << field;
    EXPECT_EQ(j->remote_comm_id, r.local_comm_id);
    EXPECT_EQ(j->reason, static_cast<std::uint16_t>(field == 2 ? wcm::rej_reason::invalid_gid
                                                               : wcm::rej_reason::consumer_defined));
    run_for(20ms);
    EXPECT_FALSE(got.ready()) << "the listener took a REQ naming another requester (field " << field << ")";
    got.cancel();
  }
  // The same REQ naming its sender is taken.
  EXPECT_TRUE(request(req_to(b, peer_ip, 95)).has_value());
}

// The same for a SIDR_REQ: the rdma_cm header's source (the application is
// told it) must be the sender, and the partition the port's; else SIDR_REP
// "rejected".
TEST_F(cm_udp_fake_peer, a_sidr_req_naming_another_source_or_partition_is_rejected) {
  ASSERT_TRUE(peer.bound());
  make(b, 1, "", nullptr, false);
  ASSERT_TRUE(gid::parse(test_address(0), peer_ip));
  l = cm::listen(b.dev, {b.ip, 7471}, 16, cm::port_space::udp);
  gid elsewhere;
  ASSERT_TRUE(gid::parse(test_address(2), elsewhere));
  namespace wcm = wire::cm;
  for (int field = 0; field < 2; ++field) {
    wcm::sidr_req s = field == 0 ? sidr_req_to(b, elsewhere, 80) : sidr_req_to(b, peer_ip, 81);
    if (field == 1) s.pkey = 0x8001;
    auto got = l.async_get_request(use_request);
    peer.send(s);
    const auto answer = peer.next<wcm::sidr_rep>(ctx);
    ASSERT_TRUE(answer.has_value()) << "no SIDR_REP for field " << field;
    EXPECT_EQ(answer->status, wcm::sidr_status::rejected);
    run_for(20ms);
    EXPECT_FALSE(got.ready()) << "field " << field;
    got.cancel();
  }
}

// Every answer for a connection comes from its peer: an RTU, REJ, MRA or
// DREQ from another address naming our (sequential) comm ID is dropped, as
// a REP is (helper-132 #3).
TEST_F(cm_udp_fake_peer, answers_from_another_address_are_dropped_on_the_active_side) {
  ASSERT_TRUE(peer.bound());
  namespace wcm = wire::cm;
  // Active side: a REJ while the REQ waits, then a DREQ once connected.
  std::optional<wcm::req> req;
  auto conn = start_connect(req);
  ASSERT_TRUE(req.has_value());
  wcm::rej j;
  j.remote_comm_id = req->local_comm_id;
  j.message_rejected = wcm::msg_ref::req;
  j.reason = static_cast<std::uint16_t>(wcm::rej_reason::consumer_defined);
  send_from_elsewhere(j);
  wcm::mra stall;
  stall.remote_comm_id = req->local_comm_id;
  stall.message_mraed = wcm::msg_ref::req;
  stall.service_timeout = 31;
  send_from_elsewhere(stall);
  run_for(50ms);
  EXPECT_FALSE(conn.ready()) << "a REJ from another address ended the connect";
  // The REQ is resent on its own timer (17 ms; 67 under sanitizers), not
  // held back for the minutes the forged MRA asked for: twice, so that one
  // resend that left before the MRA was read does not pass for it.
  for (int k = 0; k < 2; ++k)
    EXPECT_TRUE(peer.next<wcm::req>(ctx, 1s).has_value()) << "an MRA from another address stretched the wait";
  peer.accept(*req, 77);
  ASSERT_TRUE(peer.next<wcm::rtu>(ctx).has_value());
  ASSERT_TRUE(poll_until([&] { return conn.ready(); }));
  conn.get();
  wcm::dreq d;
  d.local_comm_id = 77;
  d.remote_comm_id = req->local_comm_id;
  d.remote_qpn = qa.num();
  send_from_elsewhere(d);
  run_for(50ms);
  EXPECT_EQ(c.state(), cm::conn_state::established) << "a DREQ from another address ended the connection";
  EXPECT_EQ(qa.query().state, qp_state::rts);
  // Disconnecting: a DREP from elsewhere does not end the DREQ's wait.
  c.disconnect();
  const auto dq = peer.next<wcm::dreq>(ctx);
  ASSERT_TRUE(dq.has_value());
  wcm::drep dp;
  dp.local_comm_id = 77;
  dp.remote_comm_id = req->local_comm_id;
  send_from_elsewhere(dp);
  run_for(50ms);
  EXPECT_EQ(c.state(), cm::conn_state::disconnecting) << "a DREP from another address was taken";
  peer.send(dp);
  EXPECT_TRUE(poll_until([&] { return c.state() == cm::conn_state::timewait; }))
      << static_cast<int>(c.state());
}

TEST_F(cm_udp_fake_peer, an_rtu_from_another_address_completes_no_accept) {
  ASSERT_TRUE(peer.bound());
  namespace wcm = wire::cm;
  listen_on_b();
  std::optional<cm::connector> passive = request(req_to(b, peer_ip, 64));
  ASSERT_TRUE(passive.has_value());
  qp qb = make_qp(b);
  auto acc = passive->async_accept(qb, {}, fast(), use_request);
  const auto rep = peer.next<wcm::rep>(ctx);
  ASSERT_TRUE(rep.has_value());
  wcm::rtu u;
  u.local_comm_id = 64;
  u.remote_comm_id = rep->local_comm_id;
  send_from_elsewhere(u);
  run_for(50ms);
  EXPECT_FALSE(acc.ready()) << "an RTU from another address completed the accept";
  peer.send(u);
  ASSERT_TRUE(poll_until([&] { return acc.ready(); }));
  acc.get();
}

// The same for a SIDR_REP: only from the address the SIDR_REQ went to.
TEST_F(cm_udp_fake_peer, a_sidr_rep_from_another_address_is_dropped) {
  ASSERT_TRUE(peer.bound());
  std::optional<wire::cm::sidr_req> sreq;
  auto conn = start_sidr(sreq);
  ASSERT_TRUE(sreq.has_value());
  wire::cm::sidr_rep forged = sidr_ok(*sreq);
  forged.qpn = 0x77;
  send_from_elsewhere(forged);
  run_for(100ms);
  EXPECT_FALSE(conn.ready()) << "a SIDR_REP from another address was taken";
  peer.send(sidr_ok(*sreq));
  ASSERT_TRUE(poll_until([&] { return conn.ready(); }));
  EXPECT_EQ(conn.get().remote_qpn, 0x99u);
}

// A REQ from the connected peer's own address naming the connection's
// (CA GUID, QP) ends it as stale: the QP stops and a DREQ goes out.  The
// QP is the application's again at once, as after disconnect(): reset, it
// connects anew while that DREQ is still unanswered (it used to stay
// bound, invalid_state, until the DREQ's retries ran out).
TEST_F(cm_udp_fake_peer, a_qp_whose_connection_ended_stale_connects_again_at_once) {
  ASSERT_TRUE(peer.bound());
  ASSERT_TRUE(establish(77).has_value()) << "not established";
  auto notified = c.async_notify_disconnect(use_request);
  wire::cm::req r = req_to(a, peer_ip, 5);
  r.local_ca_guid = 0x1234;  // the fake peer's, as its REP said
  r.local_qpn = 0x99;
  peer.send(r);
  ASSERT_TRUE(poll_until([&] { return notified.ready(); })) << "the stale REQ did not end the connection";
  ASSERT_TRUE(peer.next<wire::cm::dreq>(ctx).has_value()) << "no DREQ";  // left unanswered
  EXPECT_EQ(qa.query().state, qp_state::err);
  qp_attr reset;
  reset.state = qp_state::reset;
  qa.modify(reset, qp_attr_state);
  cm::connector again(a.dev);
  auto conn = again.async_connect(qa, {peer_ip, 7471}, {}, fast(), use_request);
  const auto req = peer.next<wire::cm::req>(ctx, 2s);
  ASSERT_TRUE(req.has_value()) << "the QP was still the old connection's";
  EXPECT_EQ(req->local_qpn, qa.num());
  again.disconnect();
}

// A REP the requester's QP cannot take (here: the QP went to ERR during the
// handshake) is refused "consumer defined" and the QP is left in ERR, as
// rdma_cm's cma_rep_recv does (a kernel server then reports REJECTED, not
// "no QP").
TEST_F(cm_udp_fake_peer, a_rep_the_qp_cannot_take_is_refused_consumer_defined) {
  ASSERT_TRUE(peer.bound());
  std::optional<wire::cm::req> req;
  auto conn = start_connect(req);
  ASSERT_TRUE(req.has_value());
  qp_attr e;
  e.state = qp_state::err;
  qa.modify(e, qp_attr_state);
  peer.accept(*req, 77);
  const auto j = peer.next<wire::cm::rej>(ctx);
  ASSERT_TRUE(j.has_value()) << "no REJ";
  EXPECT_EQ(j->reason, static_cast<std::uint16_t>(wire::cm::rej_reason::consumer_defined));
  EXPECT_EQ(j->message_rejected, wire::cm::msg_ref::rep);
  EXPECT_EQ(j->remote_comm_id, 77u);
  ASSERT_TRUE(poll_until([&] { return conn.ready(); }));
  std::error_code ec;
  conn.get(ec);
  EXPECT_TRUE(ec) << "the connect succeeded";
  EXPECT_EQ(qa.query().state, qp_state::err);
}

// An MRA for our REP must name the requester's comm ID as well as ours
// (ib_cm's cm_acquire_mraed_id): one who guessed our sequential comm ID
// alone cannot stall the REP for a minute while the RTU is lost.
TEST_F(cm_udp_fake_peer, an_mra_for_a_rep_without_the_requesters_comm_id_stalls_nothing) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  wcm::req r = req_to(b, peer_ip, 64);
  r.remote_cm_response_timeout = 14;  // the REP is resent every 67 ms
  auto passive = request(r);
  ASSERT_TRUE(passive.has_value());
  qp qb = make_qp(b);
  auto acc = passive->async_accept(qb, {}, fast(), use_request);
  const auto rep = peer.next<wcm::rep>(ctx);
  ASSERT_TRUE(rep.has_value());
  wcm::mra m;  // the RTU is "lost"; an MRA that is not the requester's
  m.local_comm_id = 12345;
  m.remote_comm_id = rep->local_comm_id;
  m.message_mraed = wcm::msg_ref::rep;
  m.service_timeout = 31;
  peer.send(m);
  EXPECT_TRUE(peer.next<wcm::rep>(ctx, 2s).has_value()) << "the REP was not resent";
  m.local_comm_id = 64;  // the requester's own MRA stretches the wait
  peer.send(m);
  (void)peer.next<wcm::rep>(ctx, 100ms);  // (a resend already under way as the MRA came)
  EXPECT_FALSE(peer.next<wcm::rep>(ctx, 500ms).has_value()) << "the requester's MRA was ignored";
  acc.cancel();
}

// A second REQ for a peer QP whose first REQ still waits for accept here,
// under another comm ID.  From the peer it replaces the first: the
// requester gave up on that one (a cancel, its retries out) and its REJ was
// lost; ib_cm would refuse the new REQ until the old request timed out.
// Before, both were delivered, and both could be accepted.  The same CA
// GUID and QP number from another address are another requester's (they
// are on the wire for anyone to copy): that REQ is a request of its own and
// leaves the first alone (it used to be refused "stale connection"; a
// squatter could so lock the real requester out).
TEST_F(cm_udp_fake_peer, a_second_req_for_a_pending_peer_qp_replaces_it_only_from_the_peer) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  auto first = request(req_to(b, peer_ip, 1));
  ASSERT_TRUE(first.has_value());
  gid intruder_ip;
  ASSERT_TRUE(gid::parse(test_address(2), intruder_ip));
  auto intruders = l.async_get_request(use_request);
  std::array<std::byte, wire::cm::mad_size> mad;
  wire::cm::encode(wire::cm::mad_header{}, req_to(b, intruder_ip, 2),
                   std::span<std::byte, wire::cm::mad_size>(mad));
  raw_sender intruder(test_address(2), test_address(1), test_port());
  intruder.send(mad);
  ASSERT_TRUE(poll_until([&] { return intruders.ready(); }))
      << "the other address's REQ was not its own request";
  cm::connector theirs = intruders.get().conn;
  EXPECT_EQ(theirs.peer_address().ip, intruder_ip);
  EXPECT_EQ(first->state(), cm::conn_state::requested) << "a REQ from another address touched the first";

  auto second = l.async_get_request(use_request);
  peer.send(req_to(b, peer_ip, 3));
  ASSERT_TRUE(poll_until([&] { return second.ready(); })) << "the peer's new REQ was not delivered";
  EXPECT_EQ(first->state(), cm::conn_state::closed) << "the replaced request lives on";
  EXPECT_EQ(theirs.state(), cm::conn_state::requested) << "the peer's REQ replaced another address's";
  cm::connector replacement = second.get().conn;
  EXPECT_EQ(replacement.state(), cm::conn_state::requested);
  qp q1 = make_qp(b);
  std::error_code ec;
  auto old_accept = first->async_accept(q1, {}, fast(), use_request);
  ASSERT_TRUE(poll_until([&] { return old_accept.ready(); }));
  old_accept.get(ec);
  EXPECT_TRUE(ec) << "the replaced request was accepted";
  qp q3 = make_qp(b);
  auto acc = replacement.async_accept(q3, {}, fast(), use_request);
  const auto rep = peer.next<wire::cm::rep>(ctx);
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->remote_comm_id, 3u);
  acc.cancel();
}

// A REQ refused for its own fields (here a partition the port is not in)
// touches nothing of the requester's earlier request for the same QP: it
// used to replace (close) it first, and then be refused itself.
TEST_F(cm_udp_fake_peer, a_refused_req_leaves_the_requesters_pending_one) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  auto first = request(req_to(b, peer_ip, 1));
  ASSERT_TRUE(first.has_value());
  for (const bool partition : {true, false}) {
    wire::cm::req r = req_to(b, peer_ip, partition ? 2 : 3);  // the same CA GUID and QP
    if (partition)
      r.pkey = 0x8001;
    else
      r.path_mtu = 6;  // above any
    peer.send(r);
    const auto j = peer.next<wire::cm::rej>(ctx);
    ASSERT_TRUE(j.has_value());
    EXPECT_EQ(j->reason, static_cast<std::uint16_t>(partition ? wire::cm::rej_reason::invalid_gid
                                                              : wire::cm::rej_reason::invalid_mtu));
    EXPECT_EQ(first->state(), cm::conn_state::requested) << "the refused REQ replaced the pending one";
  }
}

// A REQ sent first from another address with a requester's identifiers --
// its CA GUID with its next comm ID, or with its QP number -- does not take
// them from it: the requester's own REQs, from its address, are delivered
// (they used to be swallowed as duplicates, or refused "stale connection",
// for as long as the squatter's request lived: up to about 20 minutes).
TEST_F(cm_udp_fake_peer, a_req_from_elsewhere_squats_no_requesters_identifiers) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  gid intruder_ip;
  ASSERT_TRUE(gid::parse(test_address(2), intruder_ip));
  raw_sender intruder(test_address(2), test_address(1), test_port());
  for (const bool same_comm_id : {true, false}) {
    SCOPED_TRACE(same_comm_id ? "the same comm ID" : "the same QP, another comm ID");
    const std::uint32_t id = same_comm_id ? 7 : 8;
    auto squat = l.async_get_request(use_request);
    std::array<std::byte, wire::cm::mad_size> mad;
    wire::cm::encode(wire::cm::mad_header{}, req_to(b, intruder_ip, id),
                     std::span<std::byte, wire::cm::mad_size>(mad));
    intruder.send(mad);
    ASSERT_TRUE(poll_until([&] { return squat.ready(); }));
    cm::connector squatter = squat.get().conn;
    // The requester's own, from its own address (same CA GUID and QP).
    auto real = request(req_to(b, peer_ip, same_comm_id ? id : id + 10));
    ASSERT_TRUE(real.has_value()) << "the requester's REQ was swallowed or refused";
    EXPECT_EQ(real->peer_address().ip, peer_ip);
    EXPECT_EQ(squatter.state(), cm::conn_state::requested);
    squatter.reject();
    real->reject();
  }
}

// A DREQ with our comm IDs but another QP number (ib_cm's cm_dreq_handler):
// neither ends the connection nor is answered -- a DREP would tell its
// sender that the connection ended.
TEST_F(cm_udp_fake_peer, a_dreq_for_another_qp_is_neither_obeyed_nor_answered) {
  ASSERT_TRUE(peer.bound());
  const auto req = establish(77);
  ASSERT_TRUE(req.has_value()) << "not established";
  auto notified = c.async_notify_disconnect(use_request);
  wire::cm::dreq d;
  d.local_comm_id = 77;
  d.remote_comm_id = req->local_comm_id;
  d.remote_qpn = qa.num() + 1;
  peer.send(d);
  EXPECT_FALSE(peer.next<wire::cm::drep>(ctx, 100ms).has_value()) << "answered";
  EXPECT_EQ(c.state(), cm::conn_state::established);
  EXPECT_FALSE(notified.ready());
  EXPECT_EQ(qa.query().state, qp_state::rts);

  d.remote_qpn = qa.num();
  peer.send(d);
  EXPECT_TRUE(peer.next<wire::cm::drep>(ctx).has_value());
  ASSERT_TRUE(notified.ready());
  std::error_code ec;
  notified.get(ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(qa.query().state, qp_state::err);
}

// An application rejects a request and the REJ is lost: the requester's
// resent REQ reaches the listener again (ib_cm resets a rejected ID to
// idle), even while the application still holds the rejected connector,
// and is not swallowed as a duplicate -- the requester would end
// `timed_out` instead of hearing the rejection.
TEST_F(cm_udp_fake_peer, a_req_resent_after_a_lost_rej_reaches_the_listener_again) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  const wcm::req r = req_to(b, peer_ip, 55);

  const auto first = request(r);
  ASSERT_TRUE(first.has_value());
  first->reject();
  const auto lost = peer.next<wcm::rej>(ctx);  // the REJ the network loses
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->remote_comm_id, 55u);

  const auto again = request(r);  // the requester's resend
  ASSERT_TRUE(again.has_value()) << "the resent REQ was swallowed";
  again->reject();
  const auto rej = peer.next<wcm::rej>(ctx);
  ASSERT_TRUE(rej.has_value());
  EXPECT_EQ(rej->remote_comm_id, 55u);
  EXPECT_EQ(rej->reason, static_cast<std::uint16_t>(wcm::rej_reason::consumer_defined));
}

// A passive side destroyed after its REP went out (the connector, or the
// QP it accepted on), or disconnected then, rejects with "consumer
// defined", as ib_cm's cm_destroy_id() does in REP_SENT: the requester
// hears a rejection, not a timeout (nor a DREQ it would ignore before it
// is connected).
TEST_F(cm_udp_fake_peer, a_passive_side_destroyed_after_its_rep_rejects_consumer_defined) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  enum { connector_destroyed, qp_destroyed, disconnected };
  for (const int how : {connector_destroyed, qp_destroyed, disconnected}) {
    SCOPED_TRACE(how == qp_destroyed  ? "the QP destroyed"
                 : how == disconnected ? "disconnected"
                                       : "the connector destroyed");
    const std::uint32_t id = 60 + static_cast<std::uint32_t>(how);
    std::optional<cm::connector> passive = request(req_to(b, peer_ip, id));
    ASSERT_TRUE(passive.has_value());
    std::optional<qp> qb = make_qp(b);
    auto acc = passive->async_accept(*qb, {}, fast(), use_request);
    const auto rep = peer.next<wcm::rep>(ctx);  // no RTU follows
    ASSERT_TRUE(rep.has_value());
    if (how == qp_destroyed) qb.reset();
    else if (how == disconnected) passive->disconnect();
    else passive.reset();
    const auto rej = peer.next<wcm::rej>(ctx);
    ASSERT_TRUE(rej.has_value());
    EXPECT_EQ(rej->remote_comm_id, id);
    EXPECT_EQ(rej->message_rejected, wcm::msg_ref::rep);
    EXPECT_EQ(rej->reason, static_cast<std::uint16_t>(wcm::rej_reason::consumer_defined));
    std::error_code ec;
    acc.get(ec);
    EXPECT_EQ(ec, errc::operation_aborted);
    if (how == disconnected) {
      EXPECT_EQ(qb->query().state, qp_state::err);
    }
  }
  EXPECT_FALSE(peer.next<wcm::dreq>(ctx, 10ms).has_value()) << "a DREQ before the connection was up";
}

// On the passive side a REJ must name the requester's comm ID (ib_cm's
// cm_acquire_rejected_id()): one with 0 there, which anyone who guessed
// our sequential comm ID could send, does not end the accept.
TEST_F(cm_udp_fake_peer, a_rej_without_the_requesters_comm_id_does_not_end_an_accept) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  std::optional<cm::connector> passive = request(req_to(b, peer_ip, 62));
  ASSERT_TRUE(passive.has_value());
  qp qb = make_qp(b);
  auto acc = passive->async_accept(qb, {}, fast(), use_request);
  const auto rep = peer.next<wcm::rep>(ctx);
  ASSERT_TRUE(rep.has_value());
  wcm::rej j;
  j.local_comm_id = 0;
  j.remote_comm_id = rep->local_comm_id;
  j.message_rejected = wcm::msg_ref::rep;
  j.reason = static_cast<std::uint16_t>(wcm::rej_reason::consumer_defined);
  peer.send(j);
  run_for(50ms);
  EXPECT_FALSE(acc.ready()) << "a REJ without the requester's comm ID ended the accept";
  wcm::rtu u;
  u.local_comm_id = 62;
  u.remote_comm_id = rep->local_comm_id;
  peer.send(u);
  ASSERT_TRUE(poll_until([&] { return acc.ready(); }));
  std::error_code ec;
  acc.get(ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(qb.query().state, qp_state::rts);
}

// An accept whose REP retries ran out is closed; the requester's resent
// REQ is then a new request for the listener (ib_cm resets the ID to
// idle), also while the application still holds the failed connector.
TEST_F(cm_udp_fake_peer, a_req_resent_after_an_accept_timed_out_reaches_the_listener_again) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  namespace wcm = wire::cm;
  wcm::req r = req_to(b, peer_ip, 63);
  r.local_cm_response_timeout = 8;  // the REP's: about 1 ms
  r.max_cm_retries = 1;
  std::optional<cm::connector> passive = request(r);  // held throughout
  ASSERT_TRUE(passive.has_value());
  qp qb = make_qp(b);
  auto acc = passive->async_accept(qb, {}, fast(), use_request);
  ASSERT_TRUE(poll_until([&] { return acc.ready(); })) << "the REP retries did not run out";
  std::error_code ec;
  acc.get(ec);
  EXPECT_EQ(ec, errc::timed_out);
  auto again = request(r);  // the requester, which heard nothing, resends
  ASSERT_TRUE(again.has_value()) << "the resent REQ was swallowed";
  again->reject();
}

// Timewait lasts the ACK timeout the connection's QP ran with; on the
// passive side that is the one the REQ asked for, not the listener's own
// default (ib_cm times the wait from the path's timeout).
TEST_F(cm_udp_fake_peer, passive_timewait_lasts_the_ack_timeout_the_req_asked_for) {
  ASSERT_TRUE(peer.bound());
  std::optional<cm::connector> passive;
  qp qb;
  wire::cm::dreq d;
  ASSERT_NO_FATAL_FAILURE(
      disconnect_into_timewait(19, passive, qb, d));  // 2.1 s; the passive side's own: 67 ms
  run_for(500ms);
  EXPECT_EQ(passive->state(), cm::conn_state::timewait) << "timewait ended before the QP's ACK timeout";
}

// The passive side's timewait lasts the ACK timeout the REQ asked for,
// capped as every peer timeout (about 69 s), not the 2.4 hours a
// LocalAckTimeout of 31 would give; a DREQ resent after it ended (our DREP
// was lost) is still answered.
TEST_F(cm_udp_fake_peer, passive_timewait_is_capped_and_a_dreq_after_it_is_answered) {
  ASSERT_TRUE(peer.bound());
  manual_time = true;
  std::optional<cm::connector> passive;
  qp qb;
  wire::cm::dreq d;
  ASSERT_NO_FATAL_FAILURE(disconnect_into_timewait(31, passive, qb, d));
  clock.advance(60s);
  run_for(20ms);
  EXPECT_EQ(passive->state(), cm::conn_state::timewait);
  clock.advance(10s);
  EXPECT_TRUE(poll_until([&] { return passive->state() == cm::conn_state::closed; }, 2s))
      << "timewait outlasted the cap";
  peer.send(d);
  EXPECT_TRUE(peer.next<wire::cm::drep>(ctx, 2s).has_value()) << "a DREQ after timewait went unanswered";
}

// A UD QP bound by SIDR has no connection to end: a DREQ naming it -- the
// request ID as the comm ID, remote ID 0, its QP number, all of which the
// SIDR responder knows -- leaves the QP and the connector as they were,
// and is answered as one for no connection.
TEST_F(cm_udp_fake_peer, a_dreq_naming_a_sidr_bound_ud_qp_ends_nothing) {
  ASSERT_TRUE(peer.bound());
  std::optional<wire::cm::sidr_req> sreq;
  auto conn = start_sidr(sreq);
  ASSERT_TRUE(sreq.has_value());
  const qp& u = qa;
  peer.send(sidr_ok(*sreq));
  ASSERT_TRUE(poll_until([&] { return conn.ready(); }));
  conn.get();
  ASSERT_EQ(u.state(), qp_state::rts);
  wire::cm::dreq d;
  d.remote_comm_id = sreq->request_id;
  d.remote_qpn = u.num();
  peer.send(d);
  EXPECT_TRUE(peer.next<wire::cm::drep>(ctx, 2s).has_value());
  EXPECT_EQ(u.state(), qp_state::rts);
  EXPECT_EQ(c.state(), cm::conn_state::established);
}

// A SIDR connect cancelled before its answer stops resending, and a late
// SIDR_REP does not bind the QP: another connect may use it.
TEST_F(cm_udp_fake_peer, a_cancelled_sidr_connect_stops_and_leaves_its_qp_free) {
  ASSERT_TRUE(peer.bound());
  std::optional<wire::cm::sidr_req> sreq;
  auto conn = start_sidr(sreq);
  ASSERT_TRUE(sreq.has_value());
  const qp& u = qa;
  conn.cancel();
  peer.send(sidr_ok(*sreq));
  run_for(300ms);  // 17 resend periods
  std::error_code ec;
  conn.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
  EXPECT_NE(c.state(), cm::conn_state::established);
  int resent = 0;
  while (auto again = peer.next<wire::cm::sidr_req>(ctx, 100ms))
    resent += again->request_id == sreq->request_id;
  EXPECT_LE(resent, 1) << "the cancelled connect kept resending";

  cm::connector c2(a.dev);
  auto next = c2.async_connect(u, {peer_ip, 7471}, {}, fast(), use_request);
  const auto sreq2 = peer.next<wire::cm::sidr_req>(ctx, 2s);
  EXPECT_TRUE(sreq2.has_value()) << "the QP stayed bound to the cancelled connect";
  next.cancel();
}

// A SIDR responder keeps its answer while the requester may resend
// (rdma_cm: every 4.3 s), not only for its own, shorter retry budget.
TEST_F(cm_udp_fake_peer, a_sidr_answer_is_kept_for_the_requesters_resend) {
  ASSERT_TRUE(peer.bound());
  manual_time = true;
  make(b, 1, "", nullptr, false);
  ASSERT_TRUE(gid::parse(test_address(0), peer_ip));
  l = cm::listen(b.dev, {b.ip, 7471}, 16, cm::port_space::udp);
  namespace wcm = wire::cm;
  const wcm::sidr_req s = sidr_req_to(b, peer_ip, 77);
  auto got = l.async_get_request(use_request);
  peer.send(s);
  ASSERT_TRUE(poll_until([&] { return got.ready(); }));
  qp u = make_qp(b, qp_type::ud);
  got.get().conn.accept(u, {}, fast());
  ASSERT_TRUE(peer.next<wcm::sidr_rep>(ctx).has_value());
  clock.advance(5s);
  run_for(20ms);
  auto again = l.async_get_request(use_request);
  peer.send(s);  // our SIDR_REP was lost
  const auto rep = peer.next<wcm::sidr_rep>(ctx, 2s);
  ASSERT_TRUE(rep.has_value()) << "the answer was forgotten before the requester resent";
  EXPECT_EQ(rep->qpn, u.num());
  EXPECT_FALSE(again.ready()) << "the resend became a new request";
  again.cancel();
}

// SIDR requests, which carry no CA GUID, are told apart by their sender's
// address, in a key space of their own: a SIDR_REQ can never stand for a
// REQ.  They used to share one index, keyed by a hash of the address that
// anyone could invert, so a SIDR_REQ whose key equalled a requester's CA
// GUID and comm ID made that requester's real REQ look like a duplicate:
// swallowed.  Here the same sender, with the CA GUID that hash gave.
TEST_F(cm_udp_fake_peer, a_sidr_request_never_makes_a_req_look_like_a_duplicate) {
  ASSERT_TRUE(peer.bound());
  listen_on_b();
  cm::listener ud = cm::listen(b.dev, {b.ip, 7471}, 16, cm::port_space::udp);
  namespace wcm = wire::cm;
  std::uint64_t hi, lo;
  std::memcpy(&hi, peer_ip.raw.data(), 8);
  std::memcpy(&lo, peer_ip.raw.data() + 8, 8);
  const std::uint64_t old_key = hi ^ lo * 0x9E3779B97F4A7C15ull;  // the former SIDR key
  const wcm::sidr_req s = sidr_req_to(b, peer_ip, 91);
  auto sidr = ud.async_get_request(use_request);
  peer.send(s);
  ASSERT_TRUE(poll_until([&] { return sidr.ready(); })) << "the SIDR_REQ was not taken";
  wcm::req r = req_to(b, peer_ip, 91);
  r.local_ca_guid = old_key;
  const auto passive = request(r);
  EXPECT_TRUE(passive.has_value()) << "the REQ was swallowed as a duplicate of the SIDR_REQ";
  sidr.get();
}

// Bad arguments are invalid_argument on a network device too, not an
// unreachable address: the wildcard, port 0 (the route to it is checked
// only for well-formed destinations).
TEST_F(cm_udp, a_connect_to_the_wildcard_or_port_0_is_a_bad_argument) {
  side a;
  make(a, 0);
  qp q = make_qp(a);
  cm::connector c(a.dev);
  for (const char* to : {"0.0.0.0:7471", "10.98.0.1:0", "[::]:7471"}) {
    cm::address x;
    ASSERT_TRUE(cm::address::parse(to, x)) << to;
    std::error_code ec;
    c.connect(q, x, {}, {}, ec);
    EXPECT_EQ(ec, errc::invalid_argument) << to << ": " << ec.message();
  }
}

// An accept cancelled after its REP went out: when the RTU comes the
// passive side does not come up; it tells the requester, which did come up,
// with a DREQ, as a disconnect would.
TEST_F(cm_udp, a_cancelled_accept_does_not_bring_the_connection_up) {
  context ctx_a;  // the requester's device moves only when this is polled
  side a, b;
  make(a, 0, "", &ctx_a);
  make(b, 1);
  cm::listener l = cm::listen(b.dev, {b.ip, 7471});
  qp qa = make_qp(a), qb = make_qp(b);
  cm::connector c(a.dev);
  auto got = l.async_get_request(use_request);
  // The REP waits 4 s before a resend: the RTU, not the resend timer, meets
  // the cancelled accept.
  cm::conn_params slow_rep = fast();
  slow_rep.cm_response_timeout = 20;
  auto conn = c.async_connect(qa, {b.ip, 7471}, {}, slow_rep, use_request);
  cm::connector passive = got.get().conn;
  auto accepted = passive.async_accept(qb, {}, fast(), use_request);
  ctx.poll();
  ASSERT_FALSE(accepted.ready());  // no RTU yet: the requester's device is idle
  accepted.cancel();
  conn.get();  // the REP arrives: the requester is connected
  auto notified = c.async_notify_disconnect(use_request);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!notified.ready() && std::chrono::steady_clock::now() < until) {
    ctx.poll();
    ctx_a.poll();
  }
  ASSERT_TRUE(notified.ready()) << "the passive side came up for an accept nobody waits for";
  // The requester was disconnected (DREQ), not reset (REJ).
  std::error_code ec;
  notified.get(ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_NE(qb.state(), qp_state::rts);
  EXPECT_NE(passive.state(), cm::conn_state::established);
  std::error_code aec;
  accepted.get(aec);
  EXPECT_EQ(aec, errc::operation_aborted);
}

}  // namespace
}  // namespace averbs::test
