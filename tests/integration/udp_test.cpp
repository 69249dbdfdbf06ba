// SPDX-License-Identifier: MIT
// RoCEv2 over real UDP sockets between two devices of one process.
#include "environment.hpp"
#include "soft/engine.hpp"
#include "udp_pair.hpp"
#include "verbs/objects.hpp"
#include "verbs/registry.hpp"
#include "wire/roce.hpp"

#include <averbs/cm.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <sstream>
#include <thread>

#ifndef UDP_GRO
#define UDP_GRO 104  // linux/udp.h; glibc's netinet/udp.h may lack it
#endif

namespace averbs::test {
namespace {

using udp = udp_pair_test;

TEST_F(udp, rc_send_write_read_over_udp) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 1 << 20);
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 7);
  ASSERT_FALSE(post_recv(b, 1 << 20));
  ASSERT_FALSE(post_send(a, 100000));
  auto wa = poll(a.c, 1);
  auto wb = poll(b.c, 1);
  ASSERT_EQ(wa.size(), 1u);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wa[0].status, wc_status::success);
  EXPECT_EQ(wb[0].status, wc_status::success);
  EXPECT_EQ(wb[0].byte_len, 100000u);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), 100000), 0);
  EXPECT_GT(a.dev.counters().packets_sent, 90u);
  EXPECT_EQ(b.dev.counters().icrc_errors, 0u);
}

// A long READ does not hold up the device's other QPs: its responses go
// out a batch per turn, and a SEND on another QP that arrives behind the
// READ request is executed while the READ is still being answered, not
// after its 16,384 responses.  The data of both arrives whole.
// A device given an address and no port binds RoCEv2's 4791 (IANA),
// where rxe and every RoCE NIC listen.  (Its own loopback address keeps
// the test apart from others running at the same time.)
TEST_F(udp, a_device_without_a_port_binds_4791) {
  soft_device_options o;
  o.name = std::string("default_port_") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  o.address = test_address(0);
  soft_device sd(o);
  context c;
  device d = open_device(c, o.name);
  EXPECT_EQ(d.udp_port(), 4791);
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(4791);
  ::inet_pton(AF_INET, o.address.c_str(), &sa.sin_addr);
  const int r = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  const int e = errno;
  ::close(fd);
  EXPECT_EQ(r, -1) << "nothing is bound to " << o.address << ":4791";
  EXPECT_EQ(e, EADDRINUSE);
}

TEST_F(udp, a_long_read_does_not_hold_up_another_qps_send) {
  constexpr std::size_t len = 16u << 20;
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4096);  // the SEND's pair
  qp a_send = a.q, b_send = b.q;
  mr am_send = a.m, bm_send = b.m;
  std::vector<std::byte> abuf_send = std::move(a.buf), bbuf_send = std::move(b.buf);
  make_qps(qp_type::rc, len);  // the READ's pair: a.q <-> b.q
  for (std::size_t i = 0; i < len; ++i) b.buf[i] = std::byte(i * 29 + 3);
  for (std::size_t i = 0; i < abuf_send.size(); ++i) abuf_send[i] = std::byte(i + 5);
  sge rg{reinterpret_cast<std::uintptr_t>(bbuf_send.data()), 4096, bm_send.lkey()};
  recv_wr r;
  r.wr_id = 2;
  r.sg_list = &rg;
  r.num_sge = 1;
  ASSERT_FALSE(b_send.post_recv(r));

  ASSERT_FALSE(post_read(a, b, len, 1));
  ASSERT_FALSE(post_wr(a_send, wr_opcode::send, 2, abuf_send.data(), 4096, am_send));

  // Drive both devices; when the SEND's receive completes at b, count
  // the packets b has sent so far (READ responses, and the SEND's ACK).
  std::uint64_t sent_by_then = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  work_completion rwc{};
  while (sent_by_then == 0 && std::chrono::steady_clock::now() < until) {
    a.c.poll({});
    if (b.c.poll({&rwc, 1}) == 1) sent_by_then = b.dev.counters().packets_sent;
  }
  ASSERT_NE(sent_by_then, 0u) << "no receive completion at b";
  EXPECT_EQ(rwc.status, wc_status::success);
  EXPECT_LT(sent_by_then, len / 1024 / 2) << "the SEND waited for the READ's responses";
  const auto wcs = poll(a.c, 2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const auto& wc : wcs) EXPECT_EQ(wc.status, wc_status::success);
  EXPECT_EQ(a.buf, b.buf);
  EXPECT_EQ(abuf_send, bbuf_send);
}

// The responder resolves the R_Key of a READ again for every batch of
// responses: a region deregistered while a long READ is being answered
// ends it with a remote access NAK (the requester's READ completes with
// rem_access_err, both QPs go to error), and the SEND held behind the READ
// is dropped with the responder's QP, its receive flushed.
TEST_F(udp, a_region_deregistered_mid_read_ends_it_with_a_remote_access_error) {
  constexpr std::size_t len = 16u << 20;
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, len);
  ASSERT_FALSE(post_recv(b, 64));
  ASSERT_FALSE(post_read(a, b, len, 1));
  ASSERT_FALSE(post_send(a, 64));  // held behind the READ at b
  // Drive both devices until a part of the READ has arrived.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (a.dev.counters().packets_received < 1000 && std::chrono::steady_clock::now() < until) {
    a.c.poll({});
    b.c.poll({});
  }
  ASSERT_GE(a.dev.counters().packets_received, 1000u);
  ASSERT_LT(a.dev.counters().packets_received, len / 1024) << "the READ was answered already";
  b.m.dereg();
  const auto wa = poll(a.c, 2);
  ASSERT_EQ(wa.size(), 2u);
  EXPECT_EQ(wa[0].wr_id, 1u);
  EXPECT_EQ(wa[0].status, wc_status::rem_access_err);
  EXPECT_EQ(wa[1].status, wc_status::wr_flush_err);
  const auto wb = poll(b.c, 1);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wb[0].status, wc_status::wr_flush_err);
  EXPECT_EQ(b.q.query().state, qp_state::err);
}

/// A plain UDP socket that sends datagrams to device 0 of the test.
struct stranger {
  stranger() : fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    to.sin_family = AF_INET;
    to.sin_port = htons(test_port());
    ::inet_pton(AF_INET, test_address(0).c_str(), &to.sin_addr);
  }
  ~stranger() { ::close(fd); }
  ssize_t send(const void* data, std::size_t len) {
    return ::sendto(fd, data, len, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  }
  int fd;
  sockaddr_in to{};
};

// Every datagram that is not a RoCE packet is counted, down to an empty one
// (the GRO receive path cut it into no segments at all, and counted none).
// A QP reset in the middle of a transfer: its work is discarded, the
// other QP of the device finishes every byte, and the reset QP comes back
// and works.  (A network device's pass can end on its time budget with
// both QPs in the run queue; the reset must then keep the queue intact.
// Whether a run of this test meets that moment depends on timing.)
TEST_F(udp, a_qp_reset_mid_transfer_leaves_the_others_running_and_comes_back) {
  constexpr std::size_t n = 8, len = 256 * 1024;
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, n * len);
  qp a1 = a.q, b1 = b.q;
  mr am1 = a.m, bm1 = b.m;
  std::vector<std::byte> abuf1 = std::move(a.buf), bbuf1 = std::move(b.buf);
  make_qps(qp_type::rc, n * len);  // the second pair: a.q <-> b.q
  auto write = [](const qp& q, const mr& lm, std::vector<std::byte>& lb, const mr& rm, std::vector<std::byte>& rb,
                  std::uint64_t id, std::size_t off) {
    return post_wr(q, wr_opcode::rdma_write, id, lb.data() + off, len, lm, rb.data() + off, rm.rkey());
  };
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 13 + 1);
  for (std::uint64_t i = 0; i < n; ++i) {
    ASSERT_FALSE(write(a1, am1, abuf1, bm1, bbuf1, 100 + i, i * len));
    ASSERT_FALSE(write(a.q, a.m, a.buf, b.m, b.buf, i, i * len));
  }
  // Straight to RESET (any state may go there): its work is discarded
  // without completions (IBTA 10.3.1), while it may sit in the run queue.
  qp_attr at;
  at.state = qp_state::reset;
  a1.modify(at, qp_attr_state);
  // The other pair finishes, every byte.
  const auto wcs = poll(a.c, n);
  ASSERT_EQ(wcs.size(), n);
  for (const auto& wc : wcs) {
    EXPECT_LT(wc.wr_id, n);
    EXPECT_EQ(wc.status, wc_status::success);
  }
  EXPECT_EQ(b.buf, a.buf);
  // The reset QP comes back (with its peer) and works.
  b1.modify(at, qp_attr_state);
  bring_up_rc(a1, b.g, b1.num());
  bring_up_rc(b1, a.g, a1.num());
  ASSERT_FALSE(write(a1, am1, abuf1, bm1, bbuf1, 200, 0));
  const auto again = poll(a.c, 1);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].wr_id, 200u);
  EXPECT_EQ(again[0].status, wc_status::success);
}

TEST_F(udp, an_empty_datagram_is_counted_as_dropped) {
  make(a, 0);
  ASSERT_EQ(stranger().send("", 0), 0);
  for (int i = 0; i < 1000 && a.dev.counters().dropped == 0; ++i) (void)a.c.poll({});
  EXPECT_EQ(a.dev.counters().dropped, 1u);
}

// Flow sockets idle for 5 s are closed (GSO sockets too): a long-lived
// device that met many peers and ports keeps descriptors only for those in
// use (they used to stay until the 64 flow and 256 GSO places ran out),
// and a flow that comes back gets a socket again.
TEST_F(udp, idle_flow_sockets_are_closed) {
  if (!can_send_raw())
    AVERBS_SKIP_FOR_ENVIRONMENT("flow sockets go with the raw socket, which needs CAP_NET_RAW");
  manual_time = true;
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4096);
  const auto exchange = [&] {
    ASSERT_FALSE(post_recv(b, 64));
    ASSERT_FALSE(post_send(a, 8));
    ASSERT_EQ(poll(b.c, 1).size(), 1u);
    ASSERT_EQ(poll(a.c, 1).size(), 1u);
  };
  const auto open_fds = [] {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  for (int i = 0; i < 4; ++i) exchange();
  const std::uint64_t sent = a.dev.counters().flow_sends;
  ASSERT_GT(sent, 0u) << "no flow socket to close";
  const std::size_t before = open_fds();
  manual.advance(std::chrono::seconds(6));
  // Passes: the flush of one of every 1024 looks at the clock and prunes.
  for (int i = 0; i < 4096 && open_fds() >= before; ++i) (void)a.c.poll({});
  EXPECT_LT(open_fds(), before) << "the idle flow socket is still open";
  for (int i = 0; i < 4; ++i) exchange();
  EXPECT_GT(a.dev.counters().flow_sends, sent) << "the flow came back without a socket";
}

// A manual clock at its end (as traffic_test's) through the UDP link: the
// flow sockets' retry and the GSO table's eviction deadlines saturate
// instead of overflowing, a signed overflow UBSan reports (helper-127 #5).
TEST_F(udp, a_clock_at_its_end_sends_through_flow_and_gso_sockets) {
  if (!can_send_raw())
    AVERBS_SKIP_FOR_ENVIRONMENT("flow and GSO sockets go with the raw socket, which needs CAP_NET_RAW");
  manual_time = true;
  manual.advance(manual_clock::duration::max());
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 1 << 20);
  write_ping_pong(4);
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 5 + 1);
  ASSERT_NO_FATAL_FAILURE(write_and_wait(1 << 20));
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
  EXPECT_GT(a.dev.counters().flow_sends, 0u);
}

// A port that goes down sends nothing more, the packets the fault
// injector delayed before it went down included: the receiver, whose port
// is up, gets nothing (they used to leave when their delay ran out).
TEST_F(udp, a_delayed_packet_does_not_leave_through_a_port_gone_down) {
  make(a, 0, "delay=1,delay_us=2000");
  make(b, 1);
  make_qps(qp_type::rc, 4096);
  ASSERT_FALSE(post_recv(b, 64));
  ASSERT_FALSE(post_send(a, 8));
  (void)a.c.poll({});  // the SEND is delayed
  a.sdev->set_port_state(port_state::down);
  EXPECT_TRUE(poll(b.c, 1, std::chrono::milliseconds(50)).empty()) << "the delayed SEND arrived";
  EXPECT_EQ(b.dev.counters().packets_received, 0u);
}

// What the fault injector delayed was on the cable: a port that goes down
// and comes back before the delay ran out does not send it afterwards (UD:
// nothing resends it).
TEST_F(udp, a_port_flap_loses_what_was_delayed) {
  make(a, 0, "delay=1,delay_us=2000");
  make(b, 1);
  make_qps(qp_type::ud, 4096);
  ASSERT_FALSE(post_recv(b, 4096));
  ah_attr to_b;
  to_b.grh.dgid = b.g;
  ah h = a.p.create_ah(to_b);
  ASSERT_FALSE(post_ud_send(a, b, h, 16));
  ASSERT_EQ(poll(a.c, 1).size(), 1u);  // handed to the link: delayed
  a.sdev->set_port_state(port_state::down);
  a.sdev->set_port_state(port_state::active);
  EXPECT_TRUE(poll(b.c, 1, std::chrono::milliseconds(50)).empty())
      << "the delayed datagram left after the flap";
}

// UD's GRH reports the traffic class and hop limit the datagram came with
// (rxe copies the IP header there), and a received packet that reuses a
// buffer the device sent from before does not report that old packet's.
TEST_F(udp, ud_grh_reports_the_datagrams_ttl_and_tos_not_a_recycled_packets) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::ud, 4096);
  const auto exchange = [&](endpoint& from, endpoint& to, const ah& h) {
    ASSERT_FALSE(post_recv(to, 4096));
    ASSERT_FALSE(post_ud_send(from, to, h, 16, 2048));
    ASSERT_EQ(poll(from.c, 1).size(), 1u);
    ASSERT_EQ(poll(to.c, 1).size(), 1u);
  };
  ah_attr odd;
  odd.grh.dgid = a.g;
  odd.grh.traffic_class = 0x68;
  odd.grh.hop_limit = 7;               // the route's replaces it (64)
  exchange(b, a, b.p.create_ah(odd));  // b's free list now holds a packet sent with this TOS
  // (The TOS leaves as the AH says through the raw socket; without one the
  // kernel's default may go instead.)
  if (can_send_raw()) {
    EXPECT_EQ(a.buf[20 + 1], std::byte{0x68}) << "TOS as sent";
    EXPECT_EQ(a.buf[20 + 8], std::byte{64}) << "TTL as sent";
  }
  ah_attr plain;
  plain.grh.dgid = b.g;
  exchange(a, b, a.p.create_ah(plain));
  // IPv4 in the 40-byte GRH: the header is in its last 20 bytes.
  EXPECT_EQ(b.buf[20 + 1], std::byte{0});   // TOS
  EXPECT_EQ(b.buf[20 + 8], std::byte{64});  // TTL
}

// An RC flow whose source port another program holds sends through the
// raw socket; once the port is free it gets its own connected socket (the
// flow tries again every 100 ms).  Root only: flows need the raw socket.
TEST_F(udp, a_flow_whose_port_was_taken_gets_its_socket_when_the_port_is_free) {
  if (!can_send_raw()) AVERBS_SKIP_FOR_ENVIRONMENT("flows go with the raw socket, which needs CAP_NET_RAW");
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4096);
  const std::uint16_t sport = wire::udp_source_port(0, a.q.num(), b.q.num());
  const int blocker = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(blocker, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(sport);
  ASSERT_EQ(::inet_pton(AF_INET, test_address(0).c_str(), &at.sin_addr), 1);
  ASSERT_EQ(::bind(blocker, reinterpret_cast<sockaddr*>(&at), sizeof at), 0) << "the QP's source port is in use";
  // One 8-byte SEND at a time, as a ping-pong's: each leaves alone.
  auto exchange = [&] {
    ASSERT_FALSE(post_recv(b, 64));
    ASSERT_FALSE(post_send(a, 8));
    ASSERT_EQ(poll(b.c, 1).size(), 1u);
    ASSERT_EQ(poll(a.c, 1).size(), 1u);
  };
  exchange();
  const std::uint64_t while_taken = a.dev.counters().flow_sends;
  exchange();
  EXPECT_EQ(a.dev.counters().flow_sends, while_taken) << "sent through a socket on a port another one holds";
  ::close(blocker);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  exchange();
  exchange();
  EXPECT_GT(a.dev.counters().flow_sends, while_taken) << "the flow never took the freed port";
  EXPECT_EQ(b.dev.counters().icrc_errors, 0u);
}

// Two RC QPs to one host whose source port is the same (one flow label)
// but whose traffic class differs are two flows; a connected socket for
// each would number its IPv4 IDs from its own start under one source, and
// the receiver, which follows one count per source, refused one of them
// as far from the count.  Only the first gets a socket; the other sends
// through the raw socket (ID 0).  Alternating ping-pongs on both complete,
// with no ICRC error.  Root only: flows need the raw socket.
TEST_F(udp, two_flows_on_one_source_port_do_not_number_from_two_starts) {
  if (!can_send_raw()) AVERBS_SKIP_FOR_ENVIRONMENT("flows go with the raw socket, which needs CAP_NET_RAW");
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4096);
  qp_init_attr ia;
  ia.send_cq = a.c;
  ia.recv_cq = a.c;
  ia.cap = {16, 16, 4, 4, 64};
  ia.type = qp_type::rc;
  qp qa[2], qb[2];
  for (int i = 0; i < 2; ++i) {
    ia.send_cq = ia.recv_cq = a.c;
    qa[i] = a.p.create_qp(ia);
    ia.send_cq = ia.recv_cq = b.c;
    qb[i] = b.p.create_qp(ia);
  }
  for (int i = 0; i < 2; ++i) {
    bring_up_rc(qa[i], b.g, qb[i].num());
    bring_up_rc(qb[i], a.g, qa[i].num());
    // In SQD, the same flow label (so the same source port) and another
    // traffic class for each of a's QPs.
    qp_attr at;
    at.state = qp_state::sqd;
    qa[i].modify(at, qp_attr_state);
    at = {};
    at.state = qp_state::sqd;
    at.ah.is_global = true;
    at.ah.grh.dgid = b.g;
    at.ah.grh.flow_label = 0x4321;
    at.ah.grh.traffic_class = static_cast<std::uint8_t>(32 * i);
    qa[i].modify(at, qp_attr_state | qp_attr_av);
    at = {};
    at.state = qp_state::rts;
    qa[i].modify(at, qp_attr_state);
  }
  // One 8-byte SEND at a time, alternating between the QPs: each leaves
  // alone, through its flow.
  for (int round = 0; round < 40; ++round) {
    const int i = round % 2;
    sge g{reinterpret_cast<std::uintptr_t>(b.buf.data()), 64, b.m.lkey()};
    recv_wr r;
    r.sg_list = &g;
    r.num_sge = 1;
    ASSERT_FALSE(qb[i].post_recv(r));
    ASSERT_FALSE(post_wr(qa[i], wr_opcode::send, round, a.buf.data(), 8, a.m));
    const auto rc = poll(b.c, 1, std::chrono::seconds(5));
    ASSERT_EQ(rc.size(), 1u) << "round " << round << ": the SEND of QP " << i << " never arrived";
    EXPECT_EQ(rc[0].status, wc_status::success);
    const auto sc = poll(a.c, 1, std::chrono::seconds(5));
    ASSERT_EQ(sc.size(), 1u) << "round " << round;
    EXPECT_EQ(sc[0].status, wc_status::success);
  }
  EXPECT_EQ(b.dev.counters().icrc_errors, 0u);
  EXPECT_EQ(a.dev.counters().retry_timeouts, 0u);
}

// UD has no path MTU: a message must fit the port's active MTU, which
// follows the interface's (1500 bytes: 1024).  A longer one completes at
// the sender without being sent (rxe, C10-93.1.1).  An RC path MTU above
// the port's is refused.  Two devices on one end
// of a veth pair in a private network namespace (so a forked child, as
// root): their traffic still crosses loopback, which would carry the
// datagram.
TEST(udp_mtu, the_port_mtu_bounds_ud_messages_and_the_rc_path_mtu) {
  if (::geteuid() != 0) AVERBS_SKIP_FOR_ENVIRONMENT("a network namespace needs root");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNET) != 0) ::_exit(77);
    if (std::system("ip link add v0 type veth peer name v1 && ip link set v0 mtu 1500 && "
                    "ip addr add 10.77.0.1/24 dev v0 && ip addr add 10.77.0.2/24 dev v0 && ip link set v0 up && "
                    "ip link set v1 up && ip link set lo up") != 0)
      ::_exit(77);
    int status = 0;
    try {
      context ctx;
      endpoint e[2];
      for (int i = 0; i < 2; ++i) {
        soft_device_options o;
        o.name = "mtu" + std::to_string(i);
        o.address = "10.77.0." + std::to_string(i + 1);
        e[i].sdev = std::make_unique<soft_device>(o);
        e[i].dev = open_device(ctx, o.name);
        e[i].p = e[i].dev.alloc_pd();
        e[i].c = e[i].dev.create_cq(16);
        gid::parse(o.address, e[i].g);
        qp_init_attr ia;
        ia.send_cq = ia.recv_cq = e[i].c;
        ia.cap = {4, 4, 1, 1, 0};
        ia.type = qp_type::ud;
        e[i].q = e[i].p.create_qp(ia);
        e[i].buf.assign(8192, std::byte{0});
        e[i].m = e[i].p.reg_mr(e[i].buf.data(), e[i].buf.size(), access_local_write);
        qp_attr at;
        at.state = qp_state::init;
        at.port_num = 1;
        at.qkey = 0x11111111;
        e[i].q.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_qkey);
        at = {};
        at.state = qp_state::rtr;
        e[i].q.modify(at, qp_attr_state);
        at = {};
        at.state = qp_state::rts;
        e[i].q.modify(at, qp_attr_state | qp_attr_sq_psn);
      }
      if (e[0].dev.query_port(1).active_mtu != mtu::mtu_1024) status |= 1;
      sge rg{reinterpret_cast<std::uintptr_t>(e[1].buf.data()), 8192, e[1].m.lkey()};
      recv_wr r;
      r.sg_list = &rg;
      r.num_sge = 1;
      e[1].q.post_recv(r);
      ah_attr aa;
      aa.grh.dgid = e[1].g;
      ah h = e[0].p.create_ah(aa);
      // 1025 bytes: too long; then 1024: fits, and arrives.
      for (std::uint32_t len : {1025u, 1024u}) {
        sge sg{reinterpret_cast<std::uintptr_t>(e[0].buf.data()), len, e[0].m.lkey()};
        send_wr w;
        w.wr_id = len;
        w.opcode = wr_opcode::send;
        w.sg_list = &sg;
        w.num_sge = 1;
        w.flags = send_signaled;
        w.ah = &h;
        w.remote_qpn = e[1].q.num();
        w.remote_qkey = 0x11111111;
        e[0].q.post_send(w);
        work_completion wc[2];
        std::size_t got = 0;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (got == 0 && std::chrono::steady_clock::now() < until) got = e[0].c.poll(wc);
        if (got != 1 || wc[0].status != wc_status::success || wc[0].wr_id != len) status |= 2;
        std::size_t arrived = 0;
        const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (std::chrono::steady_clock::now() < settle) arrived += e[1].c.poll(wc);
        if (arrived != (len == 1024 ? 1u : 0u)) status |= 4;
        if (len == 1024 && (arrived != 1 || wc[0].byte_len != 1024 + 40)) status |= 8;
      }
      if (e[0].dev.counters().dropped != 0) status |= 16;  // nothing refused by the kernel
      // An RC path MTU above the port's is refused at modify time (its
      // packets would leave with DF and be refused at every try).
      qp_init_attr ia;
      ia.send_cq = ia.recv_cq = e[0].c;
      ia.cap = {4, 4, 1, 1, 0};
      qp rc = e[0].p.create_qp(ia);
      qp_attr at;
      at.state = qp_state::init;
      at.port_num = 1;
      rc.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_access_flags);
      at = {};
      at.state = qp_state::rtr;
      at.ah.is_global = true;
      at.ah.port_num = 1;
      at.ah.grh.dgid = e[1].g;
      at.dest_qp_num = 1234;
      at.max_dest_rd_atomic = 1;
      at.min_rnr_timer = 1;
      const std::uint32_t rtr = qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn |
                                qp_attr_rq_psn | qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer;
      std::error_code ec;
      at.path_mtu = mtu::mtu_2048;
      rc.modify(at, rtr, ec);
      if (ec != errc::invalid_argument || rc.query().state != qp_state::init) status |= 64;
      at.path_mtu = mtu::mtu_1024;
      rc.modify(at, rtr, ec);
      if (ec || rc.query().state != qp_state::rtr) status |= 128;
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s\n", ex.what());
      status |= 32;
    }
    ::_exit(status);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) AVERBS_SKIP_FOR_ENVIRONMENT("no private network namespace or veth pair here");
  EXPECT_EQ(WEXITSTATUS(st), 0) << "bits: 1 active MTU not 1024, 2 sender completion, 4 arrivals, 8 the fitting "
                                   "one, 16 kernel drops, 32 exception";
}

// Datagrams the kernel drops on a full receive buffer never reach the
// engine; the device still counts them, so a lost exchange can be traced.
void flood_and_expect_overflows(endpoint& a) {
  EXPECT_EQ(a.dev.counters().receive_overflows, 0u);
  // Nobody drives the device meanwhile: 24 MB cannot fit the 4 MB buffer.
  stranger s;
  std::vector<char> junk(1400, 'x');
  for (int i = 0; i < 16384; ++i) ASSERT_EQ(s.send(junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  EXPECT_GT(a.dev.counters().receive_overflows, 0u);
}

// The engine's timers, once all have run, leave nothing readable behind:
// a timer scheduled while CQ busy polling had the sockets out of the
// epoll set, then run by a poll that saw its deadline pass, used to leave
// the timerfd to be armed for that past deadline when the sockets came
// back, and an event loop on native_handle() spun on it with nothing to
// do (helper-102 #2).
TEST_F(udp, timers_that_have_all_run_leave_native_handle_quiet) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4096);
  pollfd pfd{ctx.native_handle(), POLLIN, 0};
  const auto settle = [&] {
    for (int i = 0; i < 100 && ::poll(&pfd, 1, 0) == 1; ++i) ctx.poll();
    return ::poll(&pfd, 1, 0);
  };
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 5000; ++i) (void)a.c.poll({});  // busy: the sockets leave the epoll set
    ASSERT_FALSE(post_send(a, 8));
    ASSERT_FALSE(post_recv(b, 8));
    const auto wcs = poll(a.c, 1);
    ASSERT_EQ(wcs.size(), 1u);
    ASSERT_EQ(wcs[0].status, wc_status::success);
    (void)poll(b.c, 1);
    // Until every timer the exchange armed (retransmit, lazy ACK) has run.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((a.dev.counters().timers != 0 || b.dev.counters().timers != 0) &&
           std::chrono::steady_clock::now() < until) {
      (void)a.c.poll({});
      (void)b.c.poll({});
    }
    ASSERT_EQ(a.dev.counters().timers + b.dev.counters().timers, 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past any deadline left in a timerfd
    EXPECT_EQ(settle(), 0) << "round " << round << ": native_handle() stays readable with nothing to do";
  }
}

// A program with its own event loop waits on context::native_handle() and
// calls context::poll() when it is readable (docs/async.md).  It must see
// every datagram, on a fresh device and after a stretch of CQ busy polling
// (which takes the sockets out of the epoll set).
TEST_F(udp, native_handle_sees_datagrams_before_and_after_busy_polling) {
  make(a, 0);
  stranger s;
  const char junk[4] = {};  // too short for a BTH: dropped and counted
  pollfd pfd{ctx.native_handle(), POLLIN, 0};
  // As an event loop: poll() while readable, so that it may block next.
  const auto settle = [&] {
    for (int i = 0; i < 100 && ::poll(&pfd, 1, 0) == 1; ++i) ctx.poll();
    return ::poll(&pfd, 1, 0);
  };
  ASSERT_EQ(settle(), 0);

  ASSERT_EQ(s.send(junk, sizeof junk), 4);
  EXPECT_EQ(::poll(&pfd, 1, 2000), 1) << "a fresh device's socket is not watched";
  EXPECT_EQ(settle(), 0);
  EXPECT_EQ(a.dev.counters().dropped, 1u);

  for (int i = 0; i < 20000; ++i) (void)a.c.poll({});
  EXPECT_EQ(settle(), 0);
  ASSERT_EQ(s.send(junk, sizeof junk), 4);
  EXPECT_EQ(::poll(&pfd, 1, 2000), 1) << "busy polling left the socket unwatched";
  EXPECT_EQ(settle(), 0);
  EXPECT_EQ(a.dev.counters().dropped, 2u);

  // An event loop woken for every datagram: each wakeup is a pass, and
  // every 4097th pass takes the sockets out of the epoll set (as a busy
  // poller's would), leaving the pending descriptor readable until the
  // next pass puts them back.  No datagram may go unnoticed.
  for (int i = 0; i < 6000; ++i) {
    ASSERT_EQ(s.send(junk, sizeof junk), 4);
    ASSERT_EQ(::poll(&pfd, 1, 2000), 1) << "datagram " << i << " woke nobody";
    ASSERT_EQ(settle(), 0);
  }
  EXPECT_EQ(a.dev.counters().dropped, 6002u);
}

TEST_F(udp, datagrams_dropped_on_a_full_receive_buffer_are_counted) {
  make(a, 0);
  flood_and_expect_overflows(a);
}

TEST_F(udp, datagrams_dropped_on_a_full_receive_buffer_are_counted_under_fault_injection) {
  make(a, 0, "dup=0.01,seed=3");  // the fault injector wraps the link
  flood_and_expect_overflows(a);
}

// A long-lived device meets a new UDP source port with every QP pair; the
// sockets its GSO runs leave through are recycled once idle (the map used
// to fill at 256 ports for good: every later QP sent packet by packet).
TEST_F(udp, gso_sockets_of_idle_source_ports_are_recycled) {
  if (!can_send_raw())
    AVERBS_SKIP_FOR_ENVIRONMENT("GSO runs go through the raw-socket path, which needs CAP_NET_RAW");
  make(a, 0);
  make(b, 1);
  constexpr std::uint32_t ports = 257;  // one more than a device keeps
  std::vector<std::byte> src(8192, std::byte{0x3C}), dst(8192);
  mr ms = a.p.reg_mr(src.data(), src.size(), access_local_write);
  mr md = b.p.reg_mr(dst.data(), dst.size(), access_local_write | access_remote_write);
  auto write_through_port = [&](std::uint32_t k) -> std::uint64_t {
    qp_init_attr ia;
    ia.send_cq = ia.recv_cq = a.c;
    ia.cap = {4, 4, 1, 1, 0};
    qp qa = a.p.create_qp(ia);
    ia.send_cq = ia.recv_cq = b.c;
    qp qb = b.p.create_qp(ia);
    // Flow labels 1..266 give source ports 0xC001..0xC10A, one each.
    connect_qp(qa, qp_type::rc, b.g, qb.num(), 1, 14, 7, false, k);
    connect_qp(qb, qp_type::rc, a.g, qa.num(), 1, 14, 7, false, k);
    const std::uint64_t runs = a.dev.counters().gso_runs;
    sge s{reinterpret_cast<std::uintptr_t>(src.data()), 8192, ms.lkey()};
    send_wr w;
    w.opcode = wr_opcode::rdma_write;
    w.sg_list = &s;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.remote_addr = reinterpret_cast<std::uintptr_t>(dst.data());
    w.rkey = md.rkey();
    EXPECT_FALSE(qa.post_send(w));
    const auto wc = poll(a.c, 1);
    EXPECT_TRUE(wc.size() == 1 && wc[0].status == wc_status::success) << "port " << k;
    return a.dev.counters().gso_runs - runs;
  };
  // A port some other program holds (0xC000-0xFFFF is also the ephemeral
  // range) sends one by one: most, not all, must have had GSO.
  std::uint32_t with_gso = 0;
  for (std::uint32_t k = 1; k < ports; ++k) with_gso += write_through_port(k) > 0 ? 1 : 0;
  EXPECT_GE(with_gso, ports - 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the first ports fall idle
  std::uint32_t later = 0;
  for (std::uint32_t k = ports; k < ports + 10; ++k) later += write_through_port(k) > 0 ? 1 : 0;
  EXPECT_GE(later, 8u) << "source ports past the 256th sent without GSO";
}

// Work requests posted in one call leave in batches (sendmmsg of up to 8
// or 15, docs/wire.md) and a receiver that finds several datagrams queued
// reads them in batches too (recvmmsg).  UD SENDs of growing sizes make no
// GSO run (each ends the one before), so every one is a datagram of its
// own.  (A post of one request is sent at once, alone: a ping-pong's.)
TEST_F(udp, datagrams_posted_together_are_sent_and_read_in_batches) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::ud, 4096);
  constexpr std::uint32_t n = 32;
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_FALSE(post_recv(b, 4096));
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 7 + 1);
  ah_attr aa;
  aa.grh.dgid = b.g;
  const ah h = a.p.create_ah(aa);
  const device_counters sa = a.dev.counters(), sb = b.dev.counters();
  std::vector<sge> sges(n);
  std::vector<send_wr> wrs(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    sges[i] = {reinterpret_cast<std::uintptr_t>(a.buf.data()), 4 * (i + 1), a.m.lkey()};
    wrs[i].wr_id = i;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].flags = send_signaled;
    wrs[i].ah = &h;
    wrs[i].remote_qpn = b.q.num();
    wrs[i].remote_qkey = 0x11111111;
  }
  ASSERT_FALSE(a.q.post_send(std::span<const send_wr>(wrs)));
  ASSERT_EQ(poll(a.c, n).size(), n);
  const auto got = poll(b.c, n);
  ASSERT_EQ(got.size(), n);
  // Every datagram whole, in order (one source, one socket): the GRH, then
  // the first 4 (i + 1) bytes of a's buffer.
  for (std::uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].status, wc_status::success);
    EXPECT_EQ(got[i].byte_len, 40 + 4 * (i + 1)) << "datagram " << i;
  }
  EXPECT_EQ(std::memcmp(b.buf.data() + 40, a.buf.data(), 4 * n), 0);
  const device_counters ca = a.dev.counters(), cb = b.dev.counters();
  EXPECT_EQ(ca.packets_sent - sa.packets_sent, n);
  EXPECT_EQ(ca.gso_runs, sa.gso_runs) << "sizes that grow make no run";
  // 32 datagrams in batches of at most 15: at least three calls of two or
  // more, unless the batching is gone.
  EXPECT_GE(ca.send_batches - sa.send_batches, 3u);
  EXPECT_GT(cb.receive_batches, sb.receive_batches) << "32 queued datagrams read one by one";
}

// A queue in front of a slower wire fills a socket's send buffer: a NIC's
// ring, or here a token bucket (tc tbf, 200 Mbit/s) on the lo of a network
// namespace of the test's own.  Sixteen QPs WRITE at once, more than the
// raw socket's 8 MB buffer holds (GSO off: every run of packets goes
// through it).  The packets the socket refuses wait, in order, and leave
// as it drains: none is lost and every byte arrives (helper-106 #1: each
// refused packet was dropped as on a wire, and RC resent it).
class udp_queue : public udp_pair_test {
 protected:
  ~udp_queue() override {
    if (!ns_.empty()) sh("ip netns del " + ns_);
  }
  static bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }
  /// Runs `fn` on a thread in the namespace.  A device opens sockets as it
  /// goes (a flow's, a GSO run's) in the namespace of the thread driving
  /// it: the devices are made and driven there.
  void in_namespace(const std::function<void()>& fn) {
    std::thread t([&] {
      const int fd = ::open(("/run/netns/" + ns_).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0)
        fn();
      else
        ADD_FAILURE() << "setns into " << ns_ << ": " << std::strerror(errno);
      if (fd >= 0) ::close(fd);
    });
    t.join();
  }
  /// A network namespace of the test's own with lo up, kept in ns_ (the
  /// destructor deletes it); with `queue`, lo sends through a 200 Mbit/s
  /// token bucket.  Root only (a skip otherwise).
  void make_namespace(const std::string& prefix, bool queue) {
    if (::geteuid() != 0) AVERBS_SKIP_FOR_ENVIRONMENT("a network namespace needs root");
    if (!can_send_raw()) AVERBS_SKIP_FOR_ENVIRONMENT("the shared raw socket needs CAP_NET_RAW");
    const std::string ns = prefix + std::to_string(::getpid()) + "_" + std::to_string(test_port());
    if (!sh("ip netns add " + ns)) AVERBS_SKIP_FOR_ENVIRONMENT("ip netns add failed here");
    ns_ = ns;
    ASSERT_TRUE(sh("ip -n " + ns + " link set lo up"));
    if (queue &&
        !sh("ip netns exec " + ns + " tc qdisc add dev lo root tbf rate 200mbit burst 256kb limit 256mb"))
      AVERBS_SKIP_FOR_ENVIRONMENT("tc cannot put a token bucket (tbf) on a namespace's lo here");
  }
  /// Makes the devices and sixteen QP pairs (path MTU 4096) and posts a
  /// 1 MiB WRITE on each; then checks they all complete with nothing lost.
  /// Or, while packets wait for room, cuts the cable: a's port goes down
  /// and up, or a is removed, and that must drop them.
  enum class cut_by { nothing, port_down, removal };
  void write_through_a_queue(cut_by how = cut_by::nothing);
  std::string ns_;
};

void udp_queue::write_through_a_queue(cut_by how) {
  gso = false;
  make(a, 0);
  make(b, 1);
  ASSERT_EQ(a.dev.query_port(1).active_mtu, mtu::mtu_4096) << "lo's MTU is 65536";
  constexpr std::size_t qps = 16, size = 1 << 20;
  for (endpoint* e : {&a, &b}) {
    e->buf.assign(qps * size, std::byte{0});
    e->m = e->p.reg_mr(e->buf.data(), e->buf.size(), access_local_write | access_remote_write);
  }
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte((i * 7 + i / 4093) & 0xFF);
  std::vector<qp> qa, qb;
  for (std::size_t k = 0; k < qps; ++k) {
    qp_init_attr ia;
    ia.send_cq = ia.recv_cq = a.c;
    ia.cap = {4, 4, 1, 1, 0};
    qa.push_back(a.p.create_qp(ia));
    ia.send_cq = ia.recv_cq = b.c;
    qb.push_back(b.p.create_qp(ia));
  }
  // Timeout 18 (1 s): the queue holds hundreds of milliseconds of packets,
  // and the ACKs queue behind them (one lo).
  for (std::size_t k = 0; k < qps; ++k) {
    connect_qp(qa[k], qp_type::rc, b.g, qb[k].num(), 1, 18, 7, false, 0, mtu::mtu_4096);
    connect_qp(qb[k], qp_type::rc, a.g, qa[k].num(), 1, 18, 7, false, 0, mtu::mtu_4096);
  }
  const device_counters before = a.dev.counters();
  for (std::size_t k = 0; k < qps; ++k)
    ASSERT_FALSE(post_wr(qa[k], wr_opcode::rdma_write, k, a.buf.data() + k * size, size, a.m,
                         b.buf.data() + k * size, b.m.rkey()));
  if (how != cut_by::nothing) {
    // Drive until packets wait, then cut the cable: what waits is lost
    // at once, as fault injection's held packets are (it used to stay,
    // and leave when the port came back, or after the device was gone).
    bool cut = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!cut && std::chrono::steady_clock::now() < until) {
      a.c.poll({});
      b.c.poll({});
      if (a.dev.counters().send_deferred == before.send_deferred) continue;
      const std::uint64_t dropped = a.dev.counters().dropped;
      if (how == cut_by::removal) {
        // Only while packets wait now (a poll may have sent them all):
        // nothing drives the device between this look and the removal.
        if (!a.sdev->engine().send_blocked()) continue;
        a.sdev.reset();
        cut = a.dev.counters().dropped > dropped;
        break;
      }
      a.sdev->set_port_state(port_state::down);
      cut = a.dev.counters().dropped > dropped;
      a.sdev->set_port_state(port_state::active);
    }
    EXPECT_TRUE(cut) << "the packets waiting for room outlived the cut";
    return;
  }
  const auto wc = poll(a.c, qps);
  ASSERT_EQ(wc.size(), qps);
  for (const auto& c : wc) EXPECT_EQ(c.status, wc_status::success) << "WRITE " << c.wr_id;
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
  const device_counters after = a.dev.counters();
  ASSERT_GT(after.send_deferred, before.send_deferred)
      << "the send buffer never filled: the queue drained as fast as 16 QPs sent";
  EXPECT_EQ(after.dropped, before.dropped) << "packets lost to a full send buffer";
  // Nothing waited for a retransmission timeout.  (Sequence NAKs may come:
  // lo hands packets to the receiving CPU's queue, and the qdisc's
  // releases run on either core, so two of them can swap.)
  EXPECT_EQ(after.retry_timeouts, before.retry_timeouts);
}

TEST_F(udp_queue, a_full_send_buffer_holds_packets_back_and_loses_none) {
  make_namespace("avb_q", true);
  if (IsSkipped() || HasFatalFailure()) return;
  in_namespace([&] { write_through_a_queue(); });
}

// The packets waiting for room are lost when the port goes down (a cable
// cut), not sent when it comes back (helper-118 #6).
TEST_F(udp_queue, a_port_gone_down_loses_the_packets_waiting_for_room) {
  make_namespace("avb_f", true);
  if (IsSkipped() || HasFatalFailure()) return;
  in_namespace([&] { write_through_a_queue(cut_by::port_down); });
}

// ... and when the device is removed: its requests have completed flushed,
// and what they had queued must not reach the peer afterwards (helper-127 #1).
TEST_F(udp_queue, a_removed_device_loses_the_packets_waiting_for_room) {
  make_namespace("avb_r", true);
  if (IsSkipped() || HasFatalFailure()) return;
  in_namespace([&] { write_through_a_queue(cut_by::removal); });
}

// Over IPv6 as over IPv4 a datagram leaves whole or not at all: a packet
// longer than the link's MTU (here lo's, lowered after the QPs connected
// with path MTU 4096) is refused and counted as dropped, never cut into
// IPv6 fragments, which a RoCE NIC does not take.  The sockets had no
// IPV6_MTU_DISCOVER, and the kernel fragmented the SEND: it arrived
// (helper-127 #2).
TEST_F(udp_queue, an_ipv6_packet_longer_than_the_link_is_dropped_not_fragmented) {
  make_namespace("avb_6", false);
  if (IsSkipped() || HasFatalFailure()) return;
  ASSERT_TRUE(sh("ip -n " + ns_ + " addr add fd00::a/128 dev lo nodad"));
  ASSERT_TRUE(sh("ip -n " + ns_ + " addr add fd00::b/128 dev lo nodad"));
  for (const bool raw : {true, false}) {
    SCOPED_TRACE(raw ? "raw socket allowed" : "raw_send off");
    raw_send = raw;
    in_namespace([&] {
      make(a, 0, "", 0, "fd00::a");
      make(b, 1, "", 0, "fd00::b");
    });
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(a.dev.query_port(1).active_mtu, mtu::mtu_4096);
    for (endpoint* e : {&a, &b}) {
      qp_init_attr ia;
      ia.send_cq = ia.recv_cq = e->c;
      ia.cap = {4, 4, 1, 1, 0};
      e->q = e->p.create_qp(ia);
      e->buf.assign(8192, std::byte{0x6A});
      e->m = e->p.reg_mr(e->buf.data(), e->buf.size(), access_local_write);
    }
    // Timeout 10 (4 ms), one retry: the requester gives up soon.
    connect_qp(a.q, qp_type::rc, b.g, b.q.num(), 1, 10, 1, false, 0, mtu::mtu_4096);
    connect_qp(b.q, qp_type::rc, a.g, a.q.num(), 1, 10, 1, false, 0, mtu::mtu_4096);
    ASSERT_TRUE(sh("ip -n " + ns_ + " link set lo mtu 1500"));
    const std::uint64_t dropped = a.dev.counters().dropped;
    ASSERT_FALSE(post_recv(b, 8192));
    ASSERT_FALSE(post_send(a, 4000));
    const auto wa = poll(a.c, 1);
    ASSERT_EQ(wa.size(), 1u);
    EXPECT_EQ(wa[0].status, wc_status::retry_exc_err)
        << "the SEND was acknowledged: it went out in fragments";
    EXPECT_TRUE(poll(b.c, 1, std::chrono::milliseconds(20)).empty()) << "the SEND arrived in fragments";
    EXPECT_GT(a.dev.counters().dropped, dropped);
    ASSERT_TRUE(sh("ip -n " + ns_ + " link set lo mtu 65536"));
    a = {};
    b = {};
  }
}

// A device made on a thread in a network namespace and driven from a
// thread outside it: the sockets it opens as it goes (a flow's for a lone
// datagram, a GSO run's) would be the driving thread's namespace's, where
// no peer is, and what they sent was lost (a tail probe or a NAK later
// resent it).  It sends through its own sockets instead: no flow or GSO
// socket is opened.
TEST_F(udp_queue, a_device_driven_from_another_namespace_sends_only_where_it_was_made) {
  make_namespace("avb_d", false);
  if (IsSkipped() || HasFatalFailure()) return;
  in_namespace([&] {
    make(a, 0);
    make(b, 1);
  });
  ASSERT_FALSE(HasFatalFailure());
  make_qps(qp_type::rc, 1 << 20);  // (driven from here on, outside the namespace)
  write_ping_pong(20);
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 11 + 3);
  ASSERT_NO_FATAL_FAILURE(write_and_wait(1 << 20));
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
  // (What such a socket sent was lost: recovered by probes and NAKs, so
  // the data alone would not show it.)
  const device_counters ca = a.dev.counters();
  EXPECT_EQ(ca.flow_sends, 0u) << "a flow socket opened outside the device's namespace";
  EXPECT_EQ(ca.gso_runs, 0u) << "a GSO socket opened outside the device's namespace";
}

// Runs of MTU-sized packets leave as UDP GSO datagrams (with a raw socket,
// i.e. as root) and reach the receiver's UDP_GRO socket whole; it splits
// them, checks every segment's ICRC, computed for the IPv4 ID the kernel
// gives that segment, and gets every byte.
TEST_F(udp, gso_runs_arrive_whole_with_valid_icrcs) {
  if (!can_send_raw())
    AVERBS_SKIP_FOR_ENVIRONMENT("GSO runs go through the raw-socket path, which needs CAP_NET_RAW");
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4 << 20);
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 13 + 5);
  for (int round = 0; round < 4; ++round) {
    sge s{reinterpret_cast<std::uintptr_t>(a.buf.data()), 4 << 20, a.m.lkey()};
    send_wr w;
    w.opcode = wr_opcode::rdma_write;
    w.sg_list = &s;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.remote_addr = reinterpret_cast<std::uintptr_t>(b.buf.data());
    w.rkey = b.m.rkey();
    ASSERT_FALSE(a.q.post_send(w));
    auto wa = poll(a.c, 1);
    ASSERT_EQ(wa.size(), 1u);
    EXPECT_EQ(wa[0].status, wc_status::success);
  }
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
  const auto ca = a.dev.counters();
  EXPECT_GT(ca.gso_runs, 0u);
  // No management datagram came or went: runs grow past the 8 packets
  // they are held to while connections are being set up.
  EXPECT_GT(ca.gso_packets, 8 * ca.gso_runs) << ca.gso_packets << " packets in " << ca.gso_runs << " runs";
  EXPECT_GT(b.dev.counters().gro_runs, 0u);  // and arrive as runs, split by the receiver
  // No segment was refused (a busy machine may still delay an ACK into a
  // retransmission, which proves nothing about the segments).
  EXPECT_EQ(b.dev.counters().icrc_errors, 0u);
  EXPECT_EQ(b.dev.counters().dropped, 0u);
}

// Every GSO run a device sends splits by its packets' BTHs alone (same
// P_Key and destination QP, consecutive PSNs), as a receiver must split
// one read while its UDP_GRO goes off (wire::run_segment_size): a UD QP's
// sends to two QPs are not one run, though they share size, source port
// and address.  The receiver here is a UDP_GRO socket of the test's own,
// which reports each run's segment size.
TEST_F(udp, every_gso_run_splits_by_its_packets_headers) {
  if (!can_send_raw())
    AVERBS_SKIP_FOR_ENVIRONMENT("GSO runs go through the raw-socket path, which needs CAP_NET_RAW");
  make(a, 0);
  const int rx = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(rx, 0);
  const int on = 1;
  ASSERT_EQ(::setsockopt(rx, SOL_UDP, UDP_GRO, &on, sizeof on), 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(test_port());
  ::inet_pton(AF_INET, test_address(1).c_str(), &at.sin_addr);
  ASSERT_EQ(::bind(rx, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);

  qp_init_attr ia;
  ia.send_cq = ia.recv_cq = a.c;
  ia.cap = {64, 4, 1, 1, 0};
  ia.type = qp_type::ud;
  a.q = a.p.create_qp(ia);
  connect_qp(a.q, qp_type::ud, gid{}, 0, 0, 0, 0);
  a.buf.assign(1024, std::byte{7});
  a.m = a.p.reg_mr(a.buf.data(), a.buf.size(), access_local_write);
  gid to;
  ASSERT_TRUE(gid::parse(test_address(1), to));
  ah_attr aa;
  aa.is_global = true;
  aa.port_num = 1;
  aa.grh.dgid = to;
  ah h = a.p.create_ah(aa);
  // 16 sends to QP 0x11, then 16 to 0x11 and 0x12 in turn, posted at once.
  sge sg{reinterpret_cast<std::uintptr_t>(a.buf.data()), 1024, a.m.lkey()};
  std::vector<send_wr> wrs(32);
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    wrs[i].wr_id = i;
    wrs[i].opcode = wr_opcode::send;
    wrs[i].sg_list = &sg;
    wrs[i].num_sge = 1;
    wrs[i].flags = i + 1 == wrs.size() ? static_cast<std::uint32_t>(send_signaled) : 0u;
    wrs[i].ah = &h;
    wrs[i].remote_qpn = i < 16 || i % 2 == 0 ? 0x11 : 0x12;
    wrs[i].remote_qkey = 0x11111111;
  }
  ASSERT_FALSE(a.q.post_send(std::span<const send_wr>(wrs)));
  const auto sent = poll(a.c, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, wc_status::success);

  std::size_t packets = 0, runs = 0;
  std::vector<std::byte> d(65536);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (packets < 32 && std::chrono::steady_clock::now() < until) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec iov{d.data(), d.size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(rx, &mh, 0);
    if (n <= 0) continue;
    std::size_t seg = static_cast<std::size_t>(n);
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c))
      if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
        int v;
        std::memcpy(&v, CMSG_DATA(c), sizeof v);
        seg = static_cast<std::size_t>(v);
      }
    packets += (static_cast<std::size_t>(n) + seg - 1) / seg;
    if (seg < static_cast<std::size_t>(n)) {
      ++runs;
      EXPECT_EQ(wire::run_segment_size(std::span(d.data(), static_cast<std::size_t>(n))), seg)
          << "a run of " << n << " bytes in segments of " << seg << " does not split by its headers";
    }
  }
  ::close(rx);
  EXPECT_EQ(packets, 32u);
  EXPECT_GT(runs, 0u) << "no GSO run arrived: nothing was checked";
}

// A ping-pong switches the receiver's UDP_GRO off (one datagram per poll
// reads faster through recvfrom); the bulk transfer that follows switches
// it back on at its first burst, and every byte arrives, runs included.
TEST_F(udp, udp_gro_goes_off_for_a_ping_pong_and_back_on_for_bulk) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4 << 20);
  ASSERT_NO_FATAL_FAILURE(write_ping_pong(1500));
  const device_counters after_pingpong = b.dev.counters();
  EXPECT_EQ(after_pingpong.gro_switches, 1u) << "off after a window of lone datagrams, and not back on";

  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 7 + 3);
  for (int round = 0; round < 2; ++round) ASSERT_NO_FATAL_FAILURE(write_and_wait(4 << 20));
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
  const device_counters c = b.dev.counters();
  EXPECT_GE(c.gro_switches, 2u) << "a burst switches it back on";
  EXPECT_EQ(c.icrc_errors, 0u);
  // With a raw socket (CAP_NET_RAW) the bulk leaves as GSO runs, which arrive
  // whole again.
  if (can_send_raw()) {
    EXPECT_GT(c.gro_runs, after_pingpong.gro_runs);
  }
}

// A ping-pong from one peer gets a socket of its own at the receiver,
// connected to that peer (the kernel finds it by its 4-tuple).  A datagram from another source (a second QP of the same
// device: another UDP source port) ends it, and so does a burst; nothing is
// lost as it closes, and a ping-pong that goes on gets one again.
class udp_peer : public udp_pair_test {
 protected:
  void cycle();
  /// Two connected RC QPs inside b (b1 -> b2) and a region of `bytes` for
  /// b1's writes to itself.
  struct self_pair {
    qp b1, b2;
    std::vector<std::byte> buf;
    mr m;
  };
  self_pair make_self_pair(std::size_t bytes) {
    qp_init_attr ia;
    ia.send_cq = b.c;
    ia.recv_cq = b.c;
    ia.cap = {64, 64, 1, 1, 0};
    ia.type = qp_type::rc;
    self_pair p{b.p.create_qp(ia), b.p.create_qp(ia), std::vector<std::byte>(bytes), {}};
    p.m = b.p.reg_mr(p.buf.data(), p.buf.size(), access_local_write | access_remote_write);
    bring_up_rc(p.b1, b.g, p.b2.num());
    bring_up_rc(p.b2, b.g, p.b1.num());
    return p;
  }
};

TEST_F(udp_peer, a_ping_pong_peer_gets_its_own_socket_until_another_source_or_a_burst) { cycle(); }

// Without a raw socket every QP of a device sends from the device's port:
// the peer socket takes all of a's datagrams to b, the second QP's too.
TEST_F(udp_peer, without_raw_sockets_it_carries_the_whole_peer_device) {
  raw_send = false;
  cycle();
}

// The same with b on a thread of its own, as a peer in another process
// runs: a burst arrives while b reads, so the kernel may pick the peer
// socket for a datagram just before it is pointed away.  Closing reads it
// until it has been quiet, and the shared socket only after the
// stragglers, so none is lost or overtaken: no sequence NAK, unless a
// socket overflowed (which makes NAKs of its own).
TEST_F(udp_peer, it_closes_under_a_concurrent_burst_without_losing_a_datagram) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4 << 20);
  std::atomic<bool> stop{false};
  std::thread responder([&] {
    while (!stop.load(std::memory_order_relaxed)) b.c.poll({});
  });
  auto wait_a = [&]() -> std::vector<work_completion> {
    std::vector<work_completion> out;
    work_completion wc;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (out.empty() && std::chrono::steady_clock::now() < until)
      if (a.c.poll({&wc, 1}) == 1) out.push_back(wc);
    return out;
  };
  bool ok = true;
  for (int i = 0; i < 5000 && ok; ++i) {
    a.buf[0] = std::byte(i);
    ok = !post_wr(a.q, wr_opcode::rdma_write, i, a.buf.data(), 8, a.m, b.buf.data(), b.m.rkey());
    const auto wc = ok ? wait_a() : std::vector<work_completion>{};
    ok = wc.size() == 1 && wc[0].status == wc_status::success;
  }
  const device_counters before = b.dev.counters();
  std::vector<std::vector<work_completion>> bursts;
  for (int round = 0; round < 2 && ok; ++round) {
    for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 5 + round);
    ok = !post_wr(a.q, wr_opcode::rdma_write, 100 + round, a.buf.data(), 4 << 20, a.m, b.buf.data(), b.m.rkey());
    if (ok) bursts.push_back(wait_a());
    ok = ok && std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()) == 0;
  }
  stop = true;
  responder.join();
  ASSERT_TRUE(ok) << "the ping-pong or a burst failed";
  for (const auto& wc : bursts) {
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, wc_status::success);
  }
  const device_counters after = b.dev.counters();
  EXPECT_GE(before.peer_sockets, 1u) << "the ping-pong opened one";
  EXPECT_GT(after.gro_switches, before.gro_switches) << "the bursts went back to the shared socket";
  EXPECT_EQ(after.icrc_errors, 0u);
  if (after.receive_overflows == before.receive_overflows) {
    EXPECT_EQ(after.seq_naks_sent, before.seq_naks_sent) << "nothing lost as the peer socket closed";
  }
}

// Only a source whose datagrams pass the checks shapes how the link reads
// (UDP_GRO off after a window of lone datagrams, then a socket of its own
// after 1024 in a row): one that trickles junk gets neither, only counts.
TEST_F(udp_peer, a_source_of_junk_gets_no_socket_of_its_own) {
  make(a, 0);
  stranger s;
  std::array<std::byte, 32> junk{};
  junk[0] = std::byte{0x1F};  // an unassigned opcode: no RoCE packet
  constexpr int n = 5000;
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(s.send(junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    // One datagram per poll, and polls that find none between them, as a
    // ping-pong's arrive.
    for (int k = 0; k < 100000 && a.dev.counters().dropped != static_cast<std::uint64_t>(i) + 1; ++k) (void)a.c.poll({});
    for (int k = 0; k < 3; ++k) (void)a.c.poll({});
  }
  EXPECT_GT(a.dev.counters().gro_switches, 0u) << "UDP_GRO went off: the junk came as a ping-pong's datagrams";
  const device_counters c = a.dev.counters();
  EXPECT_EQ(c.dropped, static_cast<std::uint64_t>(n));
  EXPECT_EQ(c.packets_received, 0u);
  EXPECT_EQ(c.peer_sockets, 0u) << "junk opened a socket for its source";
}

// While b's peer socket closes it is connected to b's own address and
// port, and what b sends itself from there -- without a raw socket every
// QP of b sends from b's port, to itself too -- lands on it.  Those
// datagrams are b's, not the old peer's: read with their real source they
// pass the ICRC check (which covers the source address and port).
TEST_F(udp_peer, what_a_device_sends_itself_while_its_peer_socket_closes_keeps_its_source) {
  raw_send = false;
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4 << 20);
  // A second pair inside b: b1 -> b2.
  self_pair self = make_self_pair(4096);
  qp& b1 = self.b1;
  std::vector<std::byte>& self_buf = self.buf;
  mr& self_mr = self.m;
  ASSERT_NO_FATAL_FAILURE(write_ping_pong(5000));
  ASSERT_EQ(b.dev.counters().peer_sockets, 1u);

  // A burst from a closes it; b writes to itself all the while.
  const device_counters before = b.dev.counters();
  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 3);
  ASSERT_FALSE(post_wr(a.q, wr_opcode::rdma_write, 1, a.buf.data(), 4 << 20, a.m, b.buf.data(), b.m.rkey()));
  bool burst_done = false, self_pending = false;
  int self_writes = 0;
  std::vector<work_completion> errors;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto quiet_from = std::chrono::steady_clock::time_point::max();
  while (std::chrono::steady_clock::now() < until && std::chrono::steady_clock::now() < quiet_from) {
    if (!self_pending) {
      ASSERT_FALSE(post_wr(b1, wr_opcode::rdma_write, 7, self_buf.data() + 2048, 8, self_mr, self_buf.data(),
                           self_mr.rkey()));
      self_pending = true;
    }
    work_completion wc[8];
    for (std::size_t k = 0, n = a.c.poll(wc); k < n; ++k) {
      if (wc[k].status != wc_status::success) errors.push_back(wc[k]);
      burst_done = true;
      quiet_from = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);  // past the closing window
    }
    for (std::size_t k = 0, n = b.c.poll(wc); k < n; ++k) {
      if (wc[k].status != wc_status::success) errors.push_back(wc[k]);
      self_pending = false;
      ++self_writes;
    }
  }
  ASSERT_TRUE(burst_done);
  EXPECT_TRUE(errors.empty()) << errors.size() << " failed, first status " << int(errors[0].status);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
  EXPECT_GT(self_writes, 10);
  const device_counters after = b.dev.counters();
  EXPECT_GT(after.gro_switches, before.gro_switches) << "the burst closed the peer socket";
  EXPECT_EQ(after.icrc_errors, before.icrc_errors) << "b's own datagrams were taken for the old peer's";
}

// The same with b writing to itself in bulk: the closing socket, connected
// to b's own address and port, is never found empty while b's own packets
// keep coming, and the shared socket, where a's burst arrives, is read all
// the same once the stragglers' time is over.  (It used to be read only
// after a drain that emptied the closing socket: a's burst stalled for as
// long as b wrote to itself.)
TEST_F(udp_peer, a_device_writing_to_itself_in_bulk_does_not_starve_its_other_peers) {
  raw_send = false;
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4 << 20);
  self_pair self = make_self_pair(512 << 10);
  qp& b1 = self.b1;
  std::vector<std::byte>& self_buf = self.buf;
  mr& self_mr = self.m;
  ASSERT_NO_FATAL_FAILURE(write_ping_pong(5000));
  ASSERT_EQ(b.dev.counters().peer_sockets, 1u);

  for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 7);
  ASSERT_FALSE(post_wr(a.q, wr_opcode::rdma_write, 1, a.buf.data(), 4 << 20, a.m, b.buf.data(), b.m.rkey()));
  const auto self_until = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  bool burst_done = false, self_pending = false;
  int self_writes = 0;
  std::vector<work_completion> errors;
  while (!burst_done && std::chrono::steady_clock::now() < self_until) {
    if (!self_pending) {  // 256 KiB, b1 -> b2, again and again
      ASSERT_FALSE(post_wr(b1, wr_opcode::rdma_write, 7, self_buf.data() + (256 << 10), 256 << 10, self_mr,
                           self_buf.data(), self_mr.rkey()));
      self_pending = true;
    }
    work_completion wc[8];
    for (std::size_t k = 0, n = a.c.poll(wc); k < n; ++k) {
      if (wc[k].status != wc_status::success) errors.push_back(wc[k]);
      burst_done = true;
    }
    for (std::size_t k = 0, n = b.c.poll(wc); k < n; ++k) {
      if (wc[k].status != wc_status::success) errors.push_back(wc[k]);
      self_pending = false;
      ++self_writes;
    }
  }
  EXPECT_TRUE(burst_done) << "a's write waited while b wrote to itself (" << self_writes << " self-writes)";
  EXPECT_TRUE(errors.empty()) << errors.size() << " failed, first status " << int(errors[0].status);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
}

void udp_peer::cycle() {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 4096);  // a second pair, quiet until the other source is wanted
  const qp a_other = a.q, b_other = b.q;
  const mr am_other = a.m, bm_other = b.m;
  std::vector<std::byte> abuf_other = std::move(a.buf), bbuf_other = std::move(b.buf);
  make_qps(qp_type::rc, 4 << 20);
  // UDP_GRO goes off after a window of lone datagrams; the peer socket
  // comes 1024 datagrams from one source later.
  ASSERT_NO_FATAL_FAILURE(write_ping_pong(5000));
  EXPECT_EQ(b.dev.counters().peer_sockets, 1u) << "opened once and kept: nothing came to the shared socket";

  // With a raw socket each QP sends from its own source port; without one
  // every QP of a sends from the device's port, one source to b.
  const bool sources_differ = raw_send && can_send_raw();
  abuf_other[0] = std::byte{0x5A};
  ASSERT_FALSE(post_wr(a_other, wr_opcode::rdma_write, 9, abuf_other.data(), 8, am_other, bbuf_other.data(),
                       bm_other.rkey()));
  auto wc = poll(a.c, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, wc_status::success);
  EXPECT_EQ(bbuf_other[0], std::byte{0x5A}) << "the other QP's write arrived (through the shared socket, with a raw one)";
  ASSERT_NO_FATAL_FAILURE(write_ping_pong(3000));
  const std::uint64_t opened = b.dev.counters().peer_sockets;
  if (sources_differ) {
    EXPECT_EQ(opened, 2u) << "the other source closed it; the ping-pong opened it again";
  }

  // Bursts: the peer socket hands over to the shared one, which switches
  // UDP_GRO back on (at the second burst at the latest: the first may end
  // while the closing peer socket is still being read).
  const device_counters before = b.dev.counters();
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = std::byte(i * 11 + round);
    ASSERT_NO_FATAL_FAILURE(write_and_wait(4 << 20));
    EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()), 0);
  }
  const device_counters after = b.dev.counters();
  EXPECT_GT(after.gro_switches, before.gro_switches);
  EXPECT_EQ(after.icrc_errors, 0u);
  EXPECT_EQ(after.dropped, before.dropped);
  // A datagram lost as the socket closed would leave a gap the receiver
  // NAKs (unless the socket overflowed, which a slow build may make it do).
  if (after.receive_overflows == before.receive_overflows) {
    EXPECT_EQ(after.seq_naks_sent, before.seq_naks_sent) << "nothing lost as the peer socket closed";
  }
  ASSERT_NO_FATAL_FAILURE(write_ping_pong(5000));
  EXPECT_EQ(b.dev.counters().peer_sockets, opened + 1) << "closed by the burst, opened again by the ping-pong";
}

}  // namespace
}  // namespace averbs::test

namespace averbs::test {
namespace {

// Devices named in the configuration file ($AVERBS_CONFIG) open by name,
// bound to their address and port, with their options.
TEST(device_config, devices_come_from_the_configuration_file) {
  const std::string addr = test_address(0);
  const std::uint16_t port = test_port();
  const std::string path = "/tmp/averbs_config_test_" + std::to_string(::getpid()) + ".conf";
  {
    std::ofstream f(path);
    f << "# name  address[:port]  options\n"
      << "cfg_a   " << addr << ":" << port << "   icrc=0  faults=drop=0.5,seed=1   # a comment\n"
      << "\n"
      << "cfg_bad 127.0.0.1:" << port << " colour=red\n"
      << "cfg_noaddr\n";
  }
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  context ctx;
  device d = open_device(ctx, "cfg_a");
  EXPECT_EQ(d.udp_port(), port);
  gid g;
  gid::parse(addr, g);
  EXPECT_EQ(d.gids(), std::vector<gid>{g});
  EXPECT_EQ(d.query_gid(1, 0), g);
  const auto names = list_devices();
  EXPECT_NE(std::find(names.begin(), names.end(), "cfg_a"), names.end());
  std::error_code ec;
  open_device(ctx, "cfg_bad", ec);
  EXPECT_EQ(ec, errc::invalid_argument) << ec.message();
  // The throwing form names the line and the value.
  try {
    (void)open_device(ctx, "cfg_bad");
    ADD_FAILURE() << "cfg_bad opened";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(":4: unknown option 'colour=red'"), std::string::npos) << e.what();
  }
  open_device(ctx, "cfg_noaddr", ec);
  EXPECT_EQ(ec, errc::invalid_argument) << ec.message();
  open_device(ctx, "cfg_unknown", ec);
  EXPECT_EQ(ec, errc::not_found) << "another device's broken line is that device's business";
  ::setenv("AVERBS_CONFIG", "/nonexistent/averbs.conf", 1);
  open_device(ctx, "cfg_other", ec);
  EXPECT_EQ(ec, errc::invalid_argument) << "an AVERBS_CONFIG that cannot be read is an error";
  ::setenv("AVERBS_CONFIG", "/tmp", 1);  // a directory opens, and would read as an empty file
  open_device(ctx, "cfg_other", ec);
  EXPECT_EQ(ec, errc::invalid_argument) << "an AVERBS_CONFIG that is a directory is an error";
  ::unsetenv("AVERBS_CONFIG");
  std::remove(path.c_str());
}

// A device line without an address (or otherwise broken) stops only that
// device: the devices on the lines after it open.
TEST(device_config, a_broken_line_stops_only_its_own_device) {
  const std::string path = "/tmp/averbs_config_broken_" + std::to_string(::getpid()) + ".conf";
  {
    std::ofstream f(path);
    f << "cfg_first  " << test_address(0) << ":" << test_port() << "\n"
      << "cfg_stray\n"
      << "cfg_after  " << test_address(1) << ":" << test_port() << "\n";
  }
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  context ctx;
  std::error_code ec;
  device d = open_device(ctx, "cfg_after", ec);
  EXPECT_FALSE(ec) << ec.message();
  const auto names = list_devices();
  EXPECT_NE(std::find(names.begin(), names.end(), "cfg_after"), names.end());
  open_device(ctx, "cfg_stray", ec);
  EXPECT_EQ(ec, errc::invalid_argument) << "the broken line's own device says why";
  ::unsetenv("AVERBS_CONFIG");
  std::remove(path.c_str());
}

// Whether a plain UDP socket can bind addr:port (a device holding it binds
// with SO_REUSEPORT, which a socket without it cannot join).
bool udp_port_free(const std::string& addr, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

// One devices.conf shared by a server and a client: listing the devices
// or resolving the server's address in the client must not create the
// server's device (it would bind the server's address and port), whether
// the client has opened its own device yet or not.  Resolving prefers the
// devices this process opened and creates only the one it chooses; opening
// by a local address creates that address's device.  (Devices of earlier
// tests in this process, if any, may route too: the assertions name the
// server's device, never which other one routes.)
TEST(device_config, listing_and_resolving_leave_other_devices_addresses_alone) {
  const std::string srv = test_address(0), cli = test_address(1), lone = test_address(2);
  const std::uint16_t port = test_port();
  const std::string path = "/tmp/averbs_config_shared_" + std::to_string(::getpid()) + ".conf";
  {
    std::ofstream f(path);
    f << "cfg_srv  " << srv << ":" << port << "\n"
      << "cfg_cli  " << cli << ":" << port << "\n"
      << "cfg_bad  " << srv << ":" << port << " colour=red\n";
  }
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  ::setenv("AVERBS_DEVICES", ("env_lone@" + lone + ":" + std::to_string(port)).c_str(), 1);
  gid srv_gid, cli_gid, lone_gid;
  ASSERT_TRUE(gid::parse(srv, srv_gid) && gid::parse(cli, cli_gid) && gid::parse(lone, lone_gid));

  const auto names = list_devices();
  for (const char* n : {"cfg_srv", "cfg_cli", "cfg_bad", "env_lone"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n << " is listed";
  EXPECT_TRUE(udp_port_free(srv, port) && udp_port_free(cli, port) && udp_port_free(lone, port))
      << "listing bound a device's address";

  // A client that resolves before opening anything: routed by another
  // device, the server's left alone.
  context ctx;
  cm::route r = cm::resolve(ctx, srv_gid);
  EXPECT_NE(r.device, "cfg_srv");
  EXPECT_FALSE(r.local);
  EXPECT_EQ(r.dgid, srv_gid);
  EXPECT_TRUE(udp_port_free(srv, port)) << "resolving the server's address took it";

  device mine = open_device(ctx, "cfg_cli");
  EXPECT_FALSE(udp_port_free(cli, port)) << "an opened device holds its address";
  r = cm::resolve(ctx, srv_gid);
  EXPECT_NE(r.device, "cfg_srv");
  EXPECT_FALSE(r.local);
  EXPECT_TRUE(udp_port_free(srv, port)) << "resolving the server's address took it";

  // Opening by a local address creates the device that owns it.
  device other = cm::open_device(ctx, lone_gid);
  EXPECT_EQ(other.name(), "env_lone");
  EXPECT_FALSE(udp_port_free(lone, port));
  // Its address taken (by another process, here a plain socket): the
  // server's device cannot be created, and opening by address says so.
  const int squat = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, srv.c_str(), &sa.sin_addr);
  ASSERT_EQ(::bind(squat, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  std::error_code ec;
  cm::open_device(ctx, srv_gid, ec);
  EXPECT_EQ(ec, errc::address_unreachable);
  ::close(squat);
  device srv_dev = cm::open_device(ctx, srv_gid, ec);
  EXPECT_FALSE(ec) << "free again: " << ec.message();
  EXPECT_EQ(srv_dev.name(), "cfg_srv");
  // Now opened here, the server's device owns its address for this process.
  r = cm::resolve(ctx, srv_gid);
  EXPECT_EQ(r.device, "cfg_srv");
  EXPECT_TRUE(r.local);
  ::unsetenv("AVERBS_DEVICES");
  ::unsetenv("AVERBS_CONFIG");
  std::remove(path.c_str());
}

// A configured device at a host address (127.0.0.1 here) owns it ahead of
// the embedded device, whose table holds every host address but which
// speaks only in-process: opening or resolving that address gives the
// configured device.
TEST(device_config, a_configured_device_owns_a_host_address_ahead_of_the_embedded_one) {
  const std::uint16_t port = test_port();
  const std::string path = "/tmp/averbs_config_host_" + std::to_string(::getpid()) + ".conf";
  {
    std::ofstream f(path);
    f << "cfg_host  127.0.0.1:" << port << "\n";
  }
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  gid lo, nowhere;
  ASSERT_TRUE(gid::parse("127.0.0.1", lo) && gid::parse("10.98.0.1", nowhere));
  context ctx;
  // A search that finds nothing leaves no embedded device behind to take
  // the address later.
  std::error_code ec;
  cm::resolve(ctx, nowhere, ec);
  EXPECT_EQ(ec, errc::address_unreachable);
  cm::route r = cm::resolve(ctx, lo);
  EXPECT_NE(r.device, "embedded");  // (another test's device in this process may route it)
  device d = cm::open_device(ctx, lo);
  EXPECT_EQ(d.name(), "cfg_host");
  EXPECT_EQ(d.udp_port(), port);
  r = cm::resolve(ctx, lo);
  EXPECT_EQ(r.device, "cfg_host");
  EXPECT_TRUE(r.local);
  ::unsetenv("AVERBS_CONFIG");
  std::remove(path.c_str());
}

/// What opening device `name` fails with (as invalid_argument, a source's
/// error), or "(opened)".
std::string open_failure(context& ctx, const std::string& name) {
  try {
    (void)open_device(ctx, name);
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
    return e.what();
  }
  return "(opened)";
}

/// Unsets the device sources' variables and removes the file when a test
/// ends, however it ends (an assertion that returns early included).
struct device_sources_guard {
  std::string path;
  ~device_sources_guard() {
    for (const char* v : {"AVERBS_CONFIG", "AVERBS_DEVICES", "AVERBS_FAULTS"}) ::unsetenv(v);
    if (!path.empty()) std::remove(path.c_str());
  }
};

// Small mistakes in a source are errors that say where: an option given
// twice on a line (the last used to win in silence), an empty faults=, a
// control character in a name; AVERBS_FAULTS names itself.  An editor's
// byte-order mark is not part of the first name.
TEST(device_config, repeated_options_empty_faults_and_odd_names_are_errors_that_say_where) {
  const std::uint16_t port = test_port();
  const std::string at = test_address(0) + ":" + std::to_string(port);
  const std::string path = "/tmp/averbs_config_small_" + std::to_string(::getpid()) + ".conf";
  const device_sources_guard guard{path};
  {
    std::ofstream f(path, std::ios::binary);
    f << "\xEF\xBB\xBF"
      << "cfg_bom   " << at << "\n"
      << "cfg_twice " << test_address(1) << ":" << port << " icrc=0 icrc=1\n"
      << "cfg_empty " << test_address(2) << ":" << port << " faults=\n";
  }
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  context ctx;
  const auto message_of = [&](const std::string& name) { return open_failure(ctx, name); };
  std::error_code ec;
  device bom = open_device(ctx, "cfg_bom", ec);
  EXPECT_FALSE(ec) << "the byte-order mark became part of the name: " << ec.message();
  bom = {};
  EXPECT_NE(message_of("cfg_twice").find(path + ":2: option 'icrc' is given twice"), std::string::npos)
      << message_of("cfg_twice");
  EXPECT_NE(message_of("cfg_empty").find(path + ":3: 'faults=' needs a specification"), std::string::npos)
      << message_of("cfg_empty");
  // A control character on a line is the whole file's error: every name
  // of the file says it.  In a name; and a NUL in an address, which used
  // to cut it short there (the device opened at 127.0.0.x, port 4791).
  for (const std::string& bad :
       {std::string("cfg\x01ctl ") + test_address(3) + ":" + std::to_string(port),
        std::string("cfg_nul ") + test_address(3) + '\0' + "junk:" + std::to_string(port)}) {
    {
      std::ofstream f(path, std::ios::binary);
      f << "cfg_fine " << test_address(1) << ":" << port << "\r\n" << bad << "\n";
    }
    EXPECT_NE(message_of("cfg_fine").find(path + ":2: the line holds a control character"), std::string::npos)
        << message_of("cfg_fine");
  }
  ::unsetenv("AVERBS_CONFIG");
  std::remove(path.c_str());

  ::setenv("AVERBS_DEVICES", ("env_faults@" + at).c_str(), 1);
  ::setenv("AVERBS_FAULTS", "drop=2", 1);
  EXPECT_EQ(message_of("env_faults").rfind("AVERBS_FAULTS: ", 0), 0u) << message_of("env_faults");
  ::unsetenv("AVERBS_FAULTS");
  ::unsetenv("AVERBS_DEVICES");
}

// The embedded device, once open, has every host address in its table;
// an address a configured device claims is still that device's: opened
// or resolved, it is the configuration's error, not the embedded device
// (which reaches no other process).  As the embedded device's is, the
// address is one of the host's (127.0.0.1).
/// A UDP device already open in this process, if any.  Devices stay open
/// for the process once opened (as a NIC does), and an open UDP device
/// routes every loopback address: the tests of what resolve() finds for an
/// address only a configuration claims need a process without one (ctest
/// runs each test in its own; a whole-binary run has earlier tests' open).
std::string open_udp_device() {
  for (const detail::known_device& k : detail::known_devices())
    if (k.entry != nullptr && k.entry->engine->udp_port() != 0) return k.name;
  return {};
}

#define SKIP_IF_A_UDP_DEVICE_IS_OPEN()                                                                       \
  if (const std::string open = open_udp_device(); !open.empty())                                             \
  GTEST_SKIP() << "device '" << open << "', opened by an earlier test in this process, routes the address; " \
               << "run this test alone (as ctest does)"

TEST(device_config, an_open_embedded_device_does_not_take_a_configured_devices_address) {
  SKIP_IF_A_UDP_DEVICE_IS_OPEN();
  const std::uint16_t port = test_port();
  const std::string path = "/tmp/averbs_config_claimed_" + std::to_string(::getpid()) + ".conf";
  const device_sources_guard guard{path};
  {
    std::ofstream f(path);
    f << "cfg_claimed  127.0.0.1:" << port << " icrc=no\n";
  }
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  gid lo;
  ASSERT_TRUE(gid::parse("127.0.0.1", lo));
  context ctx;
  const device embedded = open_device(ctx, "embedded");
  std::error_code ec;
  (void)embedded.find_gid(1, lo, ec);
  ASSERT_FALSE(ec) << "the embedded device's table lacks 127.0.0.1";
  device d = cm::open_device(ctx, lo, ec);
  EXPECT_EQ(ec, errc::invalid_argument) << (d ? d.name() : std::string("(none)"));
  const cm::route r = cm::resolve(ctx, lo, ec);
  EXPECT_EQ(ec, errc::invalid_argument) << r.device;
}

// A configured device whose options are wrong still owns its address:
// opening a device by that address is the configuration's error, not the
// embedded device in its place (which reaches no other host, and hid the
// mistake).
TEST(device_config, opening_by_address_a_device_configured_wrongly_is_an_error_not_the_embedded_one) {
  SKIP_IF_A_UDP_DEVICE_IS_OPEN();
  const std::uint16_t port = test_port();
  const std::string addr = test_address(0);
  const std::string path = "/tmp/averbs_config_wrong_" + std::to_string(::getpid()) + ".conf";
  const device_sources_guard guard{path};
  {
    std::ofstream f(path);
    f << "cfg_wrong  " << addr << ":" << port << " icrc=no\n";
  }
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  gid ip;
  ASSERT_TRUE(gid::parse(addr, ip));
  context ctx;
  std::error_code ec;
  device d = cm::open_device(ctx, ip, ec);
  EXPECT_EQ(ec, errc::invalid_argument) << (d ? d.name() : std::string("(none)"));
  cm::resolve(ctx, ip, ec);  // a route only the wrong entry would give
  EXPECT_EQ(ec, errc::invalid_argument);
  // Opened by name, it says what and where.
  try {
    (void)open_device(ctx, "cfg_wrong");
    ADD_FAILURE() << "a device with icrc=no opened";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":1: unknown option 'icrc=no'"), std::string::npos)
        << e.what();
  }
  // Put right, it is the owner.
  {
    std::ofstream f(path);
    f << "cfg_wrong  " << addr << ":" << port << " icrc=0\n";
  }
  device fixed = cm::open_device(ctx, ip);
  EXPECT_EQ(fixed.name(), "cfg_wrong");
  ::unsetenv("AVERBS_CONFIG");
  std::remove(path.c_str());
}

// A device's management socket shares its address and port (the
// reuseport group the data socket forms once bound, which a QP1 selector
// steers): two sockets there, as /proc/net/udp lists them.  If it could not
// join, connection management would share the data socket, unnoticed.
TEST(device_config, the_management_socket_joins_the_devices_port) {
  soft_device_options o;
  o.name = "joined";
  o.address = test_address(0);
  o.port = test_port();
  soft_device d(o);
  in_addr ip{};
  ASSERT_EQ(::inet_pton(AF_INET, o.address.c_str(), &ip), 1);
  char want[32];
  std::snprintf(want, sizeof want, "%08X:%04X", ip.s_addr, o.port);  // (as the kernel prints it)
  std::ifstream f("/proc/net/udp");
  ASSERT_TRUE(f) << "no /proc/net/udp";
  std::string line;
  int sockets = 0;
  while (std::getline(f, line)) {
    std::istringstream words(line);
    std::string slot, local;
    if (words >> slot >> local && local == want) ++sockets;
  }
  EXPECT_EQ(sockets, 2) << "sockets bound to " << want;
}

// Processes creating a device on one address and port at the same moment
// (a devices.conf shared, two programs started together): one gets it,
// the others are refused.  A probe socket closed before the real bind let
// several pass and share one reuseport group, each silently getting part
// of the other's traffic.  Four children per round, released together.
TEST(device_config, of_processes_racing_for_one_address_one_gets_it) {
  const std::string addr = test_address(0);
  const std::uint16_t port = test_port();
  constexpr int kids_per_round = 4;
  // Attempts made this round, shared: a winner holds the device until
  // every child has tried (a late child must not find it free again).
  void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* attempted = new (shared) std::atomic<int>(0);
  int doubled = 0, none = 0;
  for (int round = 0; round < 40; ++round) {
    attempted->store(0);
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> kids;
    for (int k = 0; k < kids_per_round; ++k) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        char c;
        ::close(go[1]);
        if (::read(go[0], &c, 1) != 0) ::_exit(3);  // released when the parent closes it
        int got = 0;
        try {
          soft_device_options o;
          o.name = "race";
          o.address = addr;
          o.port = port;
          soft_device d(o);
          got = 1;
          attempted->fetch_add(1);
          for (int w = 0; w < 10000 && attempted->load() < kids_per_round; ++w) ::usleep(1000);
        } catch (const std::system_error&) {
          attempted->fetch_add(1);
        }
        ::_exit(got);
      }
      kids.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);  // release them all
    int winners = 0;
    for (pid_t pid : kids) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) <= 1) << status;
      winners += WEXITSTATUS(status);
    }
    doubled += winners > 1 ? 1 : 0;
    none += winners == 0 ? 1 : 0;
  }
  ::munmap(shared, 4096);
  EXPECT_EQ(doubled, 0) << "rounds in which two processes both created the device";
  EXPECT_EQ(none, 0) << "rounds in which no process created it";
}

// AVERBS_DEVICES: a bad entry is an error naming it (when the device is
// opened), not a device made of what could be read.
TEST(device_config, bad_environment_entries_are_errors_that_say_why) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"env_port@127.0.0.2:70000", "bad port '70000'"},
      {"env_empty@", "needs an address"},
      {"env_empty_port@:4792", "has no address"},
      {"env_word@localhost", "is not an IPv4 or IPv6 address"},
      // A device sends from its address and puts it in every ICRC.
      {"env_any@0.0.0.0", "unspecified"},
      {"env_any6@[::]:4793", "unspecified"},
      {"env_mc@224.0.0.1", "multicast"},
      {"env_bc@255.255.255.255", "broadcast"},
      {"env_mc6@[ff02::1]:4793", "multicast"},
      // Ports are digits only, as --addr takes them.
      {"env_sign@127.0.0.2:+4793", "bad port '+4793'"},
      {"env_space@127.0.0.2: 4793", "bad port ' 4793'"},
      {"env_hex@127.0.0.2:0x12b9", "bad port '0x12b9'"},
      // A zone says which link; a device address must not need one.
      {"env_zone@[fe80::1%lo]:4793", "has an IPv6 zone"},
      // A control character (here SOH) is never part of a name or address.
      {"env\x01ctl@127.0.0.2", "holds a control character"},
  };
  context ctx;
  for (const auto& [entry, reason] : cases) {
    ::setenv("AVERBS_DEVICES", entry.c_str(), 1);
    const std::string name = entry.substr(0, entry.find('@'));
    try {
      (void)open_device(ctx, name);
      ADD_FAILURE() << entry << " opened";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument) << entry;
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << entry << ": " << e.what();
    }
  }
  // On/off switches take 0 or 1 only: "no" is not "on".
  ::setenv("AVERBS_DEVICES", ("env_icrc@" + test_address(0) + ":" + std::to_string(test_port())).c_str(), 1);
  ::setenv("AVERBS_ICRC", "no", 1);
  std::error_code ec;
  open_device(ctx, "env_icrc", ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  ::setenv("AVERBS_ICRC", "0", 1);
  device d = open_device(ctx, "env_icrc", ec);
  EXPECT_FALSE(ec) << ec.message();
  ::unsetenv("AVERBS_ICRC");
  ::unsetenv("AVERBS_DEVICES");
}

// What is wrong with a source as a whole is an error naming the source for
// every device it would name; what is wrong with one entry is an error for
// that entry's device.  Nothing is skipped or half-read in silence, and a
// configuration "file" that is a FIFO is refused, not read forever.
TEST(device_config, malformed_sources_are_errors_that_say_where) {
  const std::string addr = test_address(0);
  const std::uint16_t port = test_port();
  const std::string at = addr + ":" + std::to_string(port);
  context ctx;
  const auto message_of = [&](const std::string& name) { return open_failure(ctx, name); };
  const auto says = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };

  // Spaces around items are not part of names or addresses.
  ::setenv(
      "AVERBS_DEVICES",
      (" env_sp_a @ " + test_address(1) + ":" + std::to_string(port) + " ,  env_sp_b@" + at + " ").c_str(),
      1);
  std::error_code ec;
  device spaced = open_device(ctx, "env_sp_b", ec);
  EXPECT_FALSE(ec) << ec.message();
  const auto names = list_devices();
  EXPECT_NE(std::find(names.begin(), names.end(), "env_sp_a"), names.end()) << "listed without its spaces";
  spaced = {};

  // One trailing comma is no item.
  ::setenv("AVERBS_DEVICES", ("env_trailing@" + test_address(2) + ":" + std::to_string(port) + ",").c_str(),
           1);
  const auto trailing = list_devices();
  EXPECT_NE(std::find(trailing.begin(), trailing.end(), "env_trailing"), trailing.end());
  ::setenv("AVERBS_DEVICES", ("env_ok@" + at + ",env_eq=127.0.0.9").c_str(), 1);
  EXPECT_TRUE(says(message_of("env_ok"), "AVERBS_DEVICES: 'env_eq=127.0.0.9' is not name@address"))
      << "the whole variable is refused, not the broken item skipped";
  ::setenv("AVERBS_DEVICES", ("env_ok@" + at + ",,env_b@" + at).c_str(), 1);
  EXPECT_TRUE(says(message_of("env_ok"), "is not name@address"));
  ::setenv("AVERBS_DEVICES", ("embedded@" + at).c_str(), 1);
  EXPECT_TRUE(says(message_of("env_other"), "'embedded' is the name of the in-process device"));
  ::setenv("AVERBS_DEVICES", ("env_twice@" + at + ",env_twice@" + test_address(1)).c_str(), 1);
  EXPECT_TRUE(says(message_of("env_twice"), "'env_twice' is named twice"));
  ::unsetenv("AVERBS_DEVICES");

  const std::string path = "/tmp/averbs_config_malformed_" + std::to_string(::getpid()) + ".conf";
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  {
    std::ofstream f(path);
    f << "cfg_twice " << at << "\n"
      << "cfg_nofaults " << at << " faults\n"
      << "cfg_twice " << test_address(1) << ":" << port << "\n";
  }
  EXPECT_TRUE(says(message_of("cfg_twice"), ":1: 'cfg_twice' is named twice (also " + path + ":3)"));
  EXPECT_TRUE(says(message_of("cfg_nofaults"), ":2: unknown option 'faults'"));
  {
    std::ofstream f(path);
    f << "cfg_fine " << at << "\nembedded " << at << "\n";
  }
  EXPECT_TRUE(says(message_of("cfg_fine"), ":2: 'embedded' is the name of the in-process device"));
  {
    std::ofstream f(path);
    f << "cfg_faulty " << at << " faults=drop=2\n";
  }
  EXPECT_TRUE(says(message_of("cfg_faulty"), path + ":1: faults: drop is a probability"))
      << "the line is named";
  std::remove(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  EXPECT_TRUE(says(message_of("cfg_fifo"), "is not a regular file"));
  std::remove(path.c_str());
  ::setenv("AVERBS_CONFIG", "/dev/null", 1);  // the usual "no configuration"
  open_device(ctx, "cfg_none", ec);
  EXPECT_EQ(ec, errc::not_found) << ec.message();
  ::unsetenv("AVERBS_CONFIG");

  // In code: an address needs a port a peer can send to.
  soft_device_options o;
  o.name = "api_port0";
  o.address = addr;
  o.port = 0;
  try {
    soft_device sd(o);
    ADD_FAILURE() << "port 0 was accepted";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_TRUE(says(e.what(), "soft_device: port 0")) << e.what();
  }
}

// Fault specifications: probabilities 0..1 and finite, whole numbers for a
// seed and a delay, nothing silently read as something else.
TEST(device_config, fault_specifications_are_checked) {
  for (const char* bad : {"drop=nan",
                          "drop=inf",
                          "drop=1.5",
                          "drop=-0.1",
                          "delay_us=1e16",
                          "delay_us=inf",
                          "delay_us=60000001",
                          "delay_us=3.5",
                          "seed=1e20",
                          "seed=3.7",
                          "seed=-1",
                          "colour=1",
                          "drop",
                          "drop= 0.5",
                          "drop=+0.5",
                          "drop=0,5",
                          "drop=",
                          ",",
                          "drop=0.1,,",
                          "drop=0.1,,seed=1",
                          "drop=0.1,drop=0.5",
                          "dup=0.1,duplicate=0.2",
                          "delay_us=5,seed=1"}) {
    soft_device_options o;
    o.name = std::string("faults_") + bad;
    o.faults = bad;
    try {
      soft_device sd(o);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument) << bad;
    }
  }
  // The message names what is wrong: an unknown key as unknown, whatever
  // its value.
  soft_device_options u;
  u.name = "faults_unknown";
  u.faults = "colour=x";
  try {
    soft_device sd(u);
    ADD_FAILURE() << "colour=x was accepted";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown fault 'colour'"), std::string::npos) << e.what();
  }
  soft_device_options o;
  o.name = "faults_good";
  o.faults = "drop=0.01,dup=0,reorder=0.5,corrupt=1,delay=0.1,delay_us=60000000,seed=18446744073709551615";
  EXPECT_NO_THROW(soft_device sd(o));
  // One trailing comma is no item; a delay time beside a delay of 0 is
  // allowed (the delay switched off, its time kept).
  for (const char* fine : {"drop=0.1,", "delay=0,delay_us=5"}) {
    soft_device_options g;
    g.name = std::string("faults_fine_") + fine;
    g.faults = fine;
    EXPECT_NO_THROW(soft_device sd(g)) << fine;
  }
}

}  // namespace
}  // namespace averbs::test
