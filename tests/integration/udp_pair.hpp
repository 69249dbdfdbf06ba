// SPDX-License-Identifier: MIT
// Two soft devices in one process talking RoCEv2 over real UDP sockets on
// their own loopback addresses, with helpers to connect RC/UC/UD queue
// pairs across them.  Each test picks its own addresses and port.
#pragma once

#include <averbs/verbs.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace averbs::test {

/// A port no other test of this build uses: derived from the test name.
inline std::uint16_t test_port() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::uint32_t h = 2166136261u;
  for (const char* c = info->name(); *c != 0; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
  for (const char* c = info->test_suite_name(); *c != 0; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
  return static_cast<std::uint16_t>(20000 + h % 20000);
}

/// A loopback address no other test of this build uses (127.x.y.z).
inline std::string test_address(int which) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::uint32_t h = 2166136261u;
  for (const char* c = info->name(); *c != 0; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
  return "127." + std::to_string(1 + (h >> 16) % 250) + "." + std::to_string((h >> 8) % 256) + "." +
         std::to_string(2 + which);
}

/// Whether this process may open a raw IP socket (CAP_NET_RAW), which the
/// UDP link's per-QP source ports, flows and GSO runs need.  Root is not
/// enough: a container may run as root without it.
inline bool can_send_raw() {
  const int fd = ::socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

struct endpoint {
  std::unique_ptr<soft_device> sdev;
  device dev;
  pd p;
  cq c;
  qp q;
  std::vector<std::byte> buf;
  mr m;
  gid g;
};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized_build = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitized_build = true;
#else
inline constexpr bool sanitized_build = false;
#endif
#else
inline constexpr bool sanitized_build = false;
#endif

class udp_pair_test : public ::testing::Test {
 protected:
  // A failed transfer says what the link did.
  void TearDown() override {
    if (!HasFailure()) return;
    for (endpoint* e : {&a, &b}) {
      if (!e->dev) continue;
      const device_counters c = e->dev.counters();
      std::printf("%s: sent %llu received %llu retransmits %llu seq_naks %llu duplicates %llu dropped %llu "
                  "icrc_errors %llu overflows %llu\n",
                  e == &a ? "a" : "b", (unsigned long long)c.packets_sent, (unsigned long long)c.packets_received,
                  (unsigned long long)c.retransmits, (unsigned long long)c.seq_naks_sent,
                  (unsigned long long)c.duplicates_received, (unsigned long long)c.dropped,
                  (unsigned long long)c.icrc_errors, (unsigned long long)c.receive_overflows);
    }
  }
  void make(endpoint& e, int which, const std::string& faults = "", std::uint16_t port = 0,
            const std::string& address = {}) {
    soft_device_options o;
    o.name = "udp" + std::to_string(which) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    o.address = address.empty() ? test_address(which) : address;
    o.port = port != 0 ? port : test_port();
    o.faults = faults;
    o.raw_send = raw_send;
    o.gso = gso;
    if (manual_time) o.clock = &manual;
    e.sdev = std::make_unique<soft_device>(o);
    e.dev = open_device(ctx, o.name);
    e.p = e.dev.alloc_pd();
    e.c = e.dev.create_cq(4096);
    gid::parse(o.address, e.g);
  }
  void make_qps(qp_type t, std::size_t buf_size, std::uint8_t rd_atomic = 16) {
    for (endpoint* e : {&a, &b}) {
      qp_init_attr ia;
      ia.send_cq = e->c;
      ia.recv_cq = e->c;
      ia.cap = {512, 512, 4, 4, 64};
      ia.type = t;
      e->q = e->p.create_qp(ia);
      e->buf.assign(buf_size, std::byte{0});
      e->m = e->p.reg_mr(e->buf.data(), buf_size,
                         access_local_write | access_remote_write | access_remote_read | access_remote_atomic);
    }
    // 4 ms: faults recover quickly.  A sanitizer build runs the engine
    // several times slower: under 10 % faults the receiver's socket then
    // queues more than 4 ms of go-back-N resends, every resend times out
    // behind the last, and retries run out (congestion collapse, which a
    // timeout shorter than the path's queueing delay invites on any
    // network).  There the timeout is 67 ms, the usual rdma_cm value.
    const std::uint8_t timeout = sanitized_build ? 14 : 10;
    connect_qp(a.q, t, b.g, b.q.num(), rd_atomic, timeout, 7);
    connect_qp(b.q, t, a.g, a.q.num(), rd_atomic, timeout, 7);
  }

  /// Takes `q` (of type `t`) from RESET to RTS (RTR if `rtr_only`),
  /// connected to QP `dest_qpn` at `dgid` unless it is UD: PSNs 0, path
  /// MTU `path_mtu` (1024), every remote access, Q_Key 0x11111111 for
  /// UD, `rd_atomic` READs/atomics each way, ACK timeout `timeout`, `retry`
  /// retries and RNR retries; `flow_label` picks the UDP source port
  /// (rxe's rule).
  static void connect_qp(const qp& q, qp_type t, const gid& dgid, std::uint32_t dest_qpn,
                         std::uint8_t rd_atomic, std::uint8_t timeout, std::uint8_t retry,
                         bool rtr_only = false, std::uint32_t flow_label = 0, mtu path_mtu = mtu::mtu_1024) {
    qp_attr at;
    at.state = qp_state::init;
    at.port_num = 1;
    at.qkey = 0x11111111;
    at.qp_access_flags = access_local_write | access_remote_write | access_remote_read | access_remote_atomic;
    q.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port |
                     (t == qp_type::ud ? qp_attr_qkey : qp_attr_access_flags));
    at = {};
    at.state = qp_state::rtr;
    std::uint32_t mask = qp_attr_state;
    if (t != qp_type::ud) {
      at.path_mtu = path_mtu;
      at.dest_qp_num = dest_qpn;
      at.rq_psn = 0;
      at.max_dest_rd_atomic = rd_atomic;
      at.min_rnr_timer = 1;
      at.ah.is_global = true;
      at.ah.grh.dgid = dgid;
      at.ah.grh.flow_label = flow_label;
      mask |= qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn;
      if (t == qp_type::rc) mask |= qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer;
    }
    q.modify(at, mask);
    if (rtr_only) return;
    at = {};
    at.state = qp_state::rts;
    at.timeout = timeout;
    at.retry_cnt = retry;
    at.rnr_retry = retry;
    at.max_rd_atomic = rd_atomic;
    mask = qp_attr_state | qp_attr_sq_psn;
    if (t == qp_type::rc)
      mask |= qp_attr_timeout | qp_attr_retry_cnt | qp_attr_rnr_retry | qp_attr_max_qp_rd_atomic;
    q.modify(at, mask);
  }

  /// Brings RC QP `q` from RESET to RTS, connected to QP `dest_qpn` at
  /// `dgid`: PSNs 0, path MTU 1024, remote write access, timeout 14.
  static void bring_up_rc(const qp& q, const gid& dgid, std::uint32_t dest_qpn) {
    qp_attr at;
    at.state = qp_state::init;
    at.port_num = 1;
    at.qp_access_flags = access_local_write | access_remote_write;
    q.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_access_flags);
    at = {};
    at.state = qp_state::rtr;
    at.path_mtu = mtu::mtu_1024;
    at.dest_qp_num = dest_qpn;
    at.ah.is_global = true;
    at.ah.grh.dgid = dgid;
    q.modify(at, qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn |
                     qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer);
    at = {};
    at.state = qp_state::rts;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    q.modify(at, qp_attr_state | qp_attr_sq_psn | qp_attr_timeout | qp_attr_retry_cnt | qp_attr_rnr_retry |
                     qp_attr_max_qp_rd_atomic);
  }

  /// Posts one receive of the first `len` bytes of `e`'s buffer.
  static std::error_code post_recv(endpoint& e, std::uint32_t len) {
    sge g{reinterpret_cast<std::uintptr_t>(e.buf.data()), len, e.m.lkey()};
    recv_wr r;
    r.sg_list = &g;
    r.num_sge = 1;
    return e.q.post_recv(r);
  }
  /// Posts one signaled SEND of the first `len` bytes of `e`'s buffer.
  static std::error_code post_send(endpoint& e, std::uint32_t len) {
    return post_wr(e.q, wr_opcode::send, 0, e.buf.data(), len, e.m);
  }

  /// Posts one signaled UD SEND of `len` bytes at `offset` in `from`'s
  /// buffer, through `h`, to `to`'s QP (Q_Key 0x11111111).
  static std::error_code post_ud_send(endpoint& from, const endpoint& to, const ah& h, std::uint32_t len,
                                      std::size_t offset = 0) {
    sge g{reinterpret_cast<std::uintptr_t>(from.buf.data()) + offset, len, from.m.lkey()};
    send_wr w;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.ah = &h;
    w.remote_qpn = to.q.num();
    w.remote_qkey = 0x11111111;
    return from.q.post_send(w);
  }

  /// Posts one signaled work request of `len` bytes at `local` (RDMA ones
  /// at `remote`, under `rkey`; an atomic's operands last).
  static std::error_code post_wr(const qp& q, wr_opcode op, std::uint64_t wr_id, const void* local,
                                 std::uint32_t len, const mr& lm, const void* remote = nullptr,
                                 std::uint32_t rkey = 0, std::uint64_t compare_add = 0,
                                 std::uint64_t swap = 0) {
    sge g{reinterpret_cast<std::uintptr_t>(local), len, lm.lkey()};
    send_wr w;
    w.wr_id = wr_id;
    w.opcode = op;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.remote_addr = reinterpret_cast<std::uintptr_t>(remote);
    w.rkey = rkey;
    w.compare_add = compare_add;
    w.swap = swap;
    return q.post_send(w);
  }
  /// Posts one signaled RDMA READ of the first `len` bytes of `from`'s
  /// buffer into `e`'s.
  static std::error_code post_read(endpoint& e, const endpoint& from, std::uint32_t len, std::uint64_t wr_id) {
    return post_wr(e.q, wr_opcode::rdma_read, wr_id, e.buf.data(), len, e.m, from.buf.data(), from.m.rkey());
  }

  /// One signaled WRITE of the first `len` bytes of a's buffer into b's,
  /// waited for: it must succeed.
  void write_and_wait(std::uint32_t len, std::uint64_t wr_id = 1) {
    ASSERT_FALSE(
        post_wr(a.q, wr_opcode::rdma_write, wr_id, a.buf.data(), len, a.m, b.buf.data(), b.m.rkey()));
    const auto wc = poll(a.c, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, wc_status::success);
  }

  /// `n` 8-byte WRITEs from a.q into b's buffer, each waited for (a
  /// ping-pong of lone datagrams); each one's byte must have arrived.
  void write_ping_pong(int n) {
    for (int i = 0; i < n; ++i) {
      a.buf[0] = std::byte(i);
      ASSERT_FALSE(post_wr(a.q, wr_opcode::rdma_write, i, a.buf.data(), 8, a.m, b.buf.data(), b.m.rkey()));
      const auto wc = poll(a.c, 1);
      ASSERT_EQ(wc.size(), 1u) << "write " << i;
      ASSERT_EQ(wc[0].status, wc_status::success);
      ASSERT_EQ(b.buf[0], std::byte(i));
    }
  }

  /// Polls `q` (and keeps both devices progressing) until n completions.
  std::vector<work_completion> poll(const cq& q, std::size_t n,
                                    std::chrono::milliseconds patience = std::chrono::seconds(20)) {
    std::vector<work_completion> out;
    work_completion wc[32];
    const auto until = std::chrono::steady_clock::now() + patience;
    while (out.size() < n && std::chrono::steady_clock::now() < until) {
      const std::size_t got = q.poll({wc, std::min<std::size_t>(32, n - out.size())});
      out.insert(out.end(), wc, wc + got);
      a.c.poll({});  // drive the other device too: both live in this thread
      b.c.poll({});
    }
    return out;
  }

  /// Set before make(): the devices' timers follow `manual`, which moves
  /// only when a test advances it (declared before the devices: it
  /// outlives them).
  bool manual_time = false;
  manual_clock manual;
  context ctx;
  endpoint a, b;
  /// make()'s devices send through a raw socket when they may (the
  /// default); false: through the bound socket, as without CAP_NET_RAW.
  bool raw_send = true;
  /// make()'s devices send runs of packets as UDP GSO datagrams (the default).
  bool gso = true;
};

}  // namespace averbs::test
