// SPDX-License-Identifier: MIT
// The raw-UDP baseline the wire benchmark (bench/wire_bench.sh) holds averbs
// against: what two processes reach over loopback UDP with nothing of ours
// in between.
//
//   pingpong    N-byte ping-pong, both sides busy-polling a non-blocking
//               socket (as the soft device's poll does); one-way latency =
//               round trip / 2, summarised like perftest (t_typical = median
//               after dropping the two largest samples).
//   throughput  one-way goodput of D-byte datagrams (default 4 KiB), each
//               way the kernel offers on loopback:
//                 send      one send() per datagram          -> recvmmsg
//                 sendmmsg  batches of --batch datagrams     -> recvmmsg
//                 gso       UDP_SEGMENT super-datagrams      -> recvmmsg
//                           (the receiver's kernel segments them)
//                 gso_gro   UDP_SEGMENT super-datagrams      -> UDP_GRO
//                           recvmmsg (segments stay coalesced)
//                 splice_gro the same super-datagrams, but the sender
//                           vmsplice()s its buffer into a pipe and
//                           splice()s the pipe into the socket: the
//                           skbs reference the sender's pages and
//                           nothing is copied until the receiver's
//                           recvmsg (zero-copy send; MSG_ZEROCOPY is
//                           copied on loopback)   -> UDP_GRO recvmmsg
//                 raw_mmsg  what averbs' udp_link does: sendmmsg on an
//                           IPPROTO_RAW socket, IP+UDP headers built here,
//                           unconnected                      -> recvmmsg
//               The best is labelled.  Not raw UDP, and never the best
//               (run only when asked for): part of what a RoCE sender and
//               receiver must do, with nothing of averbs' engine (no ACKs,
//               no work requests, no completions; the receiver places no
//               payload anywhere):
//                 splice_gro_crc  splice_gro whose receiver also runs a
//                           CRC-32 (averbs' ICRC fold) over every 4 KiB
//                           segment it reads, as any RoCE receiver must;
//                 roce_layout  averbs' packets: runs of 15 of a 20-byte
//                           header, 4096 bytes taken in turn from a 1 MiB
//                           region (a registered buffer) and a 4-byte CRC
//                           the sender computes, as UDP GSO sends of 45
//                           iovecs; the receiver (UDP_GRO) runs the CRC over
//                           every packet;
//                 roce_layout_splice  the same packets copied into a
//                           staging ring (the CRC taken on the copy) and
//                           spliced from there: one copy, by the sender,
//                           instead of the kernel's; a run of 15 is 16
//                           pages, within an skb's 17 fragments (splicing
//                           the region's own pages would need two per
//                           packet: runs of 8).  Figures count whole
//                           packets (0.6 % header and CRC).
//
// Diagnostic ping-pong modes split averbs' latency into "the syscalls and
// packets it makes" and "the engine around them":
//   mmsg        udp_link without CAP_NET_RAW: sendmmsg of one message with
//               an explicit address on the bound UDP socket, recvmmsg of up
//               to 32;
//   engine      udp_link as it runs as root: raw-socket (IPPROTO_RAW)
//               sendmmsg of one message, recvmmsg of up to 32;
//   engine_ack  the same, but each sendmmsg also carries a 20-byte datagram
//               behind the ping (an RC ACK's size: BTH + AETH + ICRC), as
//               averbs' responder sends its held ACK behind its reply; the
//               receiver reads and discards it;
//   send_recvmmsg, sendmmsg_recv  plain with one half swapped for udp_link's
//               (connected send + recvmmsg; addressed sendmmsg + recv), to
//               tell which half costs what (not run unless asked for).
//
// The program forks: the child is the server (echo / receiver, bound to
// --server-addr), the parent the client (ping / sender, --client-addr).  A
// pipe says when the child's socket is bound; a shared page carries the phase
// hand-shakes and the flow control: the receiver publishes the bytes it has
// received, the sender keeps at most --window bytes beyond that in flight, so
// the receive buffer never overflows and the figure is goodput.  If a
// datagram is lost anyway, a stall of 200 ms writes the missing bytes off
// (reported as lost_bytes) instead of hanging.  alarm(--timeout) bounds the
// whole run; the child dies with the parent (PR_SET_PDEATHSIG).
//
// Only 127.0.0.0/8 addresses are accepted.
//
// Output: one `key=value` line per figure (for scripts), e.g.
//   pingpong mode=plain size=8 iters=100000 t_min=3.81 t_typical=4.40 ...
//   throughput variant=gso_gro dgram=4096 MBps=2310.5 MiBps=2203.5 ...
//   throughput_best variant=gso_gro dgram=4096 MBps=2310.5 MiBps=2203.5
#include "bench_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "wire/crc32.hpp"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

using clk = std::chrono::steady_clock;

void cpu_relax() noexcept {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

[[noreturn]] void die(const char* fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "udp_baseline: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::fflush(stdout);
  std::_Exit(1);
}

[[noreturn]] void die_errno(const char* what) { die("%s: %s", what, std::strerror(errno)); }

// ---------------------------------------------------------------------------
// Options

struct options {
  bool run_pingpong = true, run_throughput = true;
  std::size_t size = 8;
  std::size_t iters = 100000;
  std::size_t warmup = 2000;
  std::vector<std::string> pp_modes{"plain", "mmsg", "engine", "engine_ack"};
  std::size_t dgram = 4096;
  double seconds = 0.5;
  int trials = 3;
  std::size_t batch = 32;  // udp_link's batch
  std::size_t window = 1u << 20;
  std::vector<std::string> variants{"send", "sendmmsg", "gso", "gso_gro", "splice_gro", "raw_mmsg"};
  std::string server_addr = "127.0.0.2", client_addr = "127.0.0.3";
  std::uint16_t port = 18600;
  int server_cpu = 1, client_cpu = 0;
  unsigned timeout = 120;
};

int usage(int rc) {
  std::printf(
      "usage: udp_baseline [pingpong|throughput|all] [options]\n\n"
      "Raw UDP between two processes over loopback (this program forks; the\n"
      "child is the server).  Prints key=value lines.\n\n"
      "  -s, --size BYTES       ping-pong datagram size (default 8)\n"
      "  -n, --iters N          ping-pong iterations (default 100000, after 2000 warm-up)\n"
      "      --pp-modes LIST    plain (connected send/recv), mmsg (UDP sendmmsg with\n"
      "                         an address + recvmmsg), engine (udp_link's raw\n"
      "                         sendmmsg + recvmmsg), engine_ack (engine plus an\n"
      "                         ACK-sized datagram behind each ping); default those\n"
      "                         four; diagnostic: send_recvmmsg, sendmmsg_recv\n"
      "  -d, --dgram BYTES      throughput datagram size (default 4096)\n"
      "      --seconds S        measuring time per throughput trial (default 0.5)\n"
      "      --trials N         throughput trials per variant, median printed (default 3)\n"
      "      --batch N          sendmmsg/recvmmsg batch (default 32, as udp_link)\n"
      "      --window BYTES     flow-control window (default 1048576)\n"
      "      --variants LIST    send,sendmmsg,gso,gso_gro,splice_gro,raw_mmsg (default all);\n"
      "                         splice_gro_crc, roce_layout, roce_layout_splice (not raw\n"
      "                         UDP, never the best) only if asked\n"
      "      --server-addr A    server (echo, receiver) IPv4 address, 127/8 (127.0.0.2)\n"
      "      --client-addr A    client (ping, sender) IPv4 address, 127/8 (127.0.0.3)\n"
      "  -p, --port P           server UDP port; the client uses P+1 (default 18600)\n"
      "      --cpus S,C         pin server to CPU S, client to CPU C (default 1,0;\n"
      "                         'none' leaves scheduling to the kernel)\n"
      "      --timeout SEC      give up after SEC seconds (default 120)\n");
  return rc;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::size_t a = 0;
  while (a <= s.size()) {
    const std::size_t b = std::min(s.find(',', a), s.size());
    if (b > a) v.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return v;
}

in_addr loopback_addr(const std::string& s) {
  in_addr a{};
  if (::inet_pton(AF_INET, s.c_str(), &a) != 1) die("'%s' is not an IPv4 address", s.c_str());
  if ((ntohl(a.s_addr) >> 24) != 127)
    die("'%s' is outside 127.0.0.0/8; this benchmark stays on loopback", s.c_str());
  return a;
}

// ---------------------------------------------------------------------------
// Shared state between the two processes (one anonymous shared mapping).

struct alignas(64) shared_state {
  // Written by the receiver only: bytes received in this phase.
  alignas(64) std::atomic<std::uint64_t> received{0};
  // Written by the client: the phase to run and its parameters.
  alignas(64) std::atomic<std::uint32_t> phase{0};
  std::atomic<std::uint32_t> stop{0};  // == phase number: end that phase
  int kind = 0;                        // 0 quit, 1 ping-pong echo, 2 receive
  int mode = 0;                        // ping-pong mode / receive mode (server_receive)
  std::size_t size = 0;
  // Written by the server: the phase it finished (or failed).
  alignas(64) std::atomic<std::uint32_t> done{0};
  std::atomic<int> failed{0};
  std::uint32_t crc_sink = 0;  // splice_gro_crc's CRCs, folded
  char error[256] = {};
};

enum pp_mode {
  pp_plain = 0,
  pp_mmsg = 1,
  pp_engine = 2,
  pp_engine_ack = 3,
  pp_send_mmsgrx = 4,
  pp_addr_recv = 5
};

// How each mode sends (connected send(), sendmmsg with an address on the UDP
// socket, or the raw socket) and receives (recv() or recvmmsg of 32).
enum class tx_kind { connected, addressed, raw };
tx_kind tx_of(pp_mode m) {
  if (m == pp_plain || m == pp_send_mmsgrx) return tx_kind::connected;
  if (m == pp_mmsg || m == pp_addr_recv) return tx_kind::addressed;
  return tx_kind::raw;
}
bool mmsg_rx(pp_mode m) { return m != pp_plain && m != pp_addr_recv; }

const char* pp_name(pp_mode m) {
  switch (m) {
    case pp_plain:
      return "plain";
    case pp_mmsg:
      return "mmsg";
    case pp_engine:
      return "engine";
    case pp_engine_ack:
      return "engine_ack";
    case pp_send_mmsgrx:
      return "send_recvmmsg";
    case pp_addr_recv:
      return "sendmmsg_recv";
  }
  return "?";
}

bool parse_pp_mode(const std::string& n, pp_mode& out) {
  for (pp_mode m : {pp_plain, pp_mmsg, pp_engine, pp_engine_ack, pp_send_mmsgrx, pp_addr_recv}) {
    if (n == pp_name(m)) {
      out = m;
      return true;
    }
  }
  return false;
}

constexpr std::size_t ack_size = 20;  // BTH 12 + AETH 4 + ICRC 4
constexpr std::byte ack_mark{0xAC};   // first byte of an "ACK"; pings carry 0x5A

// ---------------------------------------------------------------------------
// Sockets

int set_int(int fd, int level, int opt, int v) { return ::setsockopt(fd, level, opt, &v, sizeof v); }

sockaddr_in sin_of(in_addr a, std::uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_addr = a;
  s.sin_port = htons(port);
  return s;
}

// A UDP socket bound to `self`, connected to `peer` (so plain send/recv and
// sendmmsg need no address), non-blocking, 4 MiB buffers like udp_link's.
int udp_socket(const sockaddr_in& self, const sockaddr_in& peer) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) die_errno("socket");
  // Past net.core.[rw]mem_max where allowed (root), as udp_link asks: a
  // receive buffer capped at the default 208 KiB would overflow under the
  // 1 MiB flow-control window and cost the baseline 200 ms stalls.
  if (set_int(fd, SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20) != 0) set_int(fd, SOL_SOCKET, SO_RCVBUF, 4 << 20);
  if (set_int(fd, SOL_SOCKET, SO_SNDBUFFORCE, 4 << 20) != 0) set_int(fd, SOL_SOCKET, SO_SNDBUF, 4 << 20);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&self), sizeof self) != 0) die_errno("bind");
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&peer), sizeof peer) != 0) die_errno("connect");
  return fd;
}

// A raw IPv4 socket for header-included sends, bound like udp_link's; -1
// without CAP_NET_RAW.
int raw_socket(const sockaddr_in& self) {
  const int fd = ::socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_RAW);
  if (fd < 0) return -1;
  set_int(fd, SOL_SOCKET, SO_SNDBUF, 4 << 20);
  sockaddr_in s = self;
  s.sin_port = 0;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&s), sizeof s) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// IPv4 + UDP header for a raw send (udp_link builds the same: DF, ID 0, UDP
// checksum 0; the kernel fills the IP checksum and total length).
struct ip_udp_header {
  std::array<std::byte, 28> b{};
  void build(in_addr src, in_addr dst, std::uint16_t sport, std::uint16_t dport, std::size_t payload) {
    iphdr ip{};
    ip.version = 4;
    ip.ihl = 5;
    ip.tot_len = htons(static_cast<std::uint16_t>(28 + payload));
    ip.frag_off = htons(IP_DF);
    ip.ttl = 64;
    ip.protocol = IPPROTO_UDP;
    ip.saddr = src.s_addr;
    ip.daddr = dst.s_addr;
    udphdr u{};
    u.source = htons(sport);
    u.dest = htons(dport);
    u.len = htons(static_cast<std::uint16_t>(8 + payload));
    std::memcpy(b.data(), &ip, 20);
    std::memcpy(b.data() + 20, &u, 8);
  }
};

bool transient(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == EINTR; }

// ---------------------------------------------------------------------------
// One datagram each way, in one of the two ping-pong modes.

struct pp_endpoint {
  int fd = -1;      // bound + connected UDP socket (receives in both modes)
  int raw_fd = -1;  // engine modes send here
  pp_mode mode = pp_plain;
  sockaddr_in peer{};      // port 0, for the raw socket
  sockaddr_in peer_udp{};  // with the port, for mmsg mode
  ip_udp_header hdr, ack_hdr;
  std::array<std::byte, ack_size> ack{};
  // engine mode receive batch, as udp_link::poll
  static constexpr std::size_t rx_batch = 32;
  std::vector<std::byte> rx_store;
  std::array<mmsghdr, rx_batch> rx_msgs{};
  std::array<iovec, rx_batch> rx_iov{};
  std::array<sockaddr_in, rx_batch> rx_from{};

  void init_engine(std::size_t cap, const sockaddr_in& self, std::size_t size) {
    rx_store.assign(rx_batch * cap, std::byte{0});
    for (std::size_t i = 0; i < rx_batch; ++i) rx_iov[i] = {rx_store.data() + i * cap, cap};
    hdr.build(self.sin_addr, peer.sin_addr, ntohs(self.sin_port), port_, size);
    ack_hdr.build(self.sin_addr, peer.sin_addr, ntohs(self.sin_port), port_, ack_size);
    ack.fill(std::byte{0});
    ack[0] = ack_mark;
  }
  std::uint16_t port_ = 0;  // the peer's UDP port (peer.sin_port is 0 for raw sends)

  bool send_one(const std::byte* p, std::size_t len) {
    if (tx_of(mode) == tx_kind::connected) {
      for (;;) {
        if (::send(fd, p, len, 0) >= 0) return true;
        if (!transient(errno)) return false;
      }
    }
    if (tx_of(mode) == tx_kind::addressed) {
      iovec iov{const_cast<std::byte*>(p), len};
      mmsghdr m{};
      m.msg_hdr.msg_name = &peer_udp;
      m.msg_hdr.msg_namelen = sizeof peer_udp;
      m.msg_hdr.msg_iov = &iov;
      m.msg_hdr.msg_iovlen = 1;
      for (;;) {
        if (::sendmmsg(fd, &m, 1, 0) == 1) return true;
        if (!transient(errno)) return false;
      }
    }
    std::array<iovec, 4> iov{{{hdr.b.data(), hdr.b.size()},
                              {const_cast<std::byte*>(p), len},
                              {ack_hdr.b.data(), ack_hdr.b.size()},
                              {ack.data(), ack.size()}}};
    std::array<mmsghdr, 2> m{};
    for (std::size_t i = 0; i < 2; ++i) {
      m[i].msg_hdr.msg_name = &peer;
      m[i].msg_hdr.msg_namelen = sizeof peer;
      m[i].msg_hdr.msg_iov = &iov[2 * i];
      m[i].msg_hdr.msg_iovlen = 2;
    }
    const std::size_t n = mode == pp_engine_ack ? 2 : 1;
    std::size_t sent = 0;
    while (sent < n) {
      const int r = ::sendmmsg(raw_fd, m.data() + sent, static_cast<unsigned>(n - sent), 0);
      if (r > 0)
        sent += static_cast<std::size_t>(r);
      else if (!transient(errno))
        return false;
    }
    return true;
  }

  // Non-blocking: bytes of one datagram, 0 if none waits, -1 on error.
  long try_recv(std::byte* p, std::size_t cap) {
    if (!mmsg_rx(mode)) {
      const ssize_t r = ::recv(fd, p, cap, MSG_DONTWAIT);
      if (r >= 0) return r;
      return transient(errno) ? 0 : -1;
    }
    for (std::size_t i = 0; i < rx_batch; ++i) {
      rx_msgs[i].msg_hdr.msg_iov = &rx_iov[i];
      rx_msgs[i].msg_hdr.msg_iovlen = 1;
      rx_msgs[i].msg_hdr.msg_name = &rx_from[i];
      rx_msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
    }
    const int r = ::recvmmsg(fd, rx_msgs.data(), rx_batch, MSG_DONTWAIT, nullptr);
    if (r < 0) return transient(errno) ? 0 : -1;
    // One ping is in flight at a time; "ACKs" are read and dropped.
    long got = 0;
    for (int i = 0; i < r; ++i) {
      const auto* d = static_cast<const std::byte*>(rx_iov[i].iov_base);
      if (rx_msgs[i].msg_len == ack_size && d[0] == ack_mark) continue;
      const std::size_t n = std::min<std::size_t>(rx_msgs[i].msg_len, cap);
      std::memcpy(p, d, n);
      got = static_cast<long>(n);
    }
    return got;
  }
};

// ---------------------------------------------------------------------------
// Phases on the server (child) side.

void server_fail(shared_state& sh, std::uint32_t phase, const char* what) {
  std::snprintf(sh.error, sizeof sh.error, "server: %s: %s", what, std::strerror(errno));
  sh.failed.store(1, std::memory_order_release);
  sh.done.store(phase, std::memory_order_release);
}

void server_echo(shared_state& sh, std::uint32_t phase, pp_endpoint& ep, std::size_t size) {
  std::vector<std::byte> buf(std::max<std::size_t>(size, 64) + 64);
  for (;;) {
    const long r = ep.try_recv(buf.data(), buf.size());
    if (r > 0) {
      if (!ep.send_one(buf.data(), static_cast<std::size_t>(r))) return server_fail(sh, phase, "echo send");
      continue;
    }
    if (r < 0) return server_fail(sh, phase, "echo recv");
    if (sh.stop.load(std::memory_order_acquire) == phase) break;
  }
  sh.done.store(phase, std::memory_order_release);
}

// mode: 0 plain, 1 UDP_GRO, 2 UDP_GRO and a CRC-32 over every segment.
void server_receive(shared_state& sh, std::uint32_t phase, int fd, std::size_t dgram, std::size_t batch,
                    int mode) {
  const bool gro = mode != 0;
  std::uint32_t crc_sink = 0;
  if (set_int(fd, IPPROTO_UDP, UDP_GRO, gro ? 1 : 0) != 0 && gro) return server_fail(sh, phase, "UDP_GRO");
  // GRO hands over up to 64 KiB per message; without it one datagram each.
  const std::size_t cap = gro ? 65536 : dgram + 64;
  const std::size_t n = gro ? std::max<std::size_t>(batch / 4, 8) : batch;
  std::vector<std::byte> store(n * cap);
  std::vector<iovec> iov(n);
  std::vector<mmsghdr> msgs(n);
  for (std::size_t i = 0; i < n; ++i) iov[i] = {store.data() + i * cap, cap};
  std::uint64_t total = 0;
  for (;;) {
    for (std::size_t i = 0; i < n; ++i) {
      msgs[i].msg_hdr = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    const int r = ::recvmmsg(fd, msgs.data(), static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
    if (r > 0) {
      for (int i = 0; i < r; ++i) {
        total += msgs[i].msg_len;
        if (mode == 2)
          for (std::size_t off = 0; off < msgs[i].msg_len; off += dgram)
            crc_sink ^= averbs::wire::crc32(0, store.data() + i * cap + off,
                                            std::min<std::size_t>(dgram, msgs[i].msg_len - off));
      }
      sh.received.store(total, std::memory_order_release);
      continue;
    }
    if (r < 0 && !transient(errno)) return server_fail(sh, phase, "recvmmsg");
    if (sh.stop.load(std::memory_order_acquire) == phase) break;
  }
  set_int(fd, IPPROTO_UDP, UDP_GRO, 0);
  sh.crc_sink = crc_sink;  // (kept, so the CRCs are not optimised away)
  sh.done.store(phase, std::memory_order_release);
}

// Waits (spinning, then sleeping a little) for the next phase; the server
// spins on its own core, but must not starve an unpinned client.
std::uint32_t server_wait_phase(shared_state& sh, std::uint32_t last) {
  for (unsigned spins = 0;; ++spins) {
    const std::uint32_t p = sh.phase.load(std::memory_order_acquire);
    if (p != last) return p;
    if (spins < 100000) {
      cpu_relax();
    } else {
      ::usleep(50);
    }
  }
}

void run_server(shared_state& sh, const options& o, int fd, int raw_fd, const sockaddr_in& self,
                const sockaddr_in& peer) {
  pp_endpoint ep;
  ep.fd = fd;
  ep.raw_fd = raw_fd;
  ep.peer = peer;
  ep.peer.sin_port = 0;  // raw sockets take no port
  ep.peer_udp = peer;
  ep.port_ = ntohs(peer.sin_port);
  std::uint32_t last = 0;
  for (;;) {
    const std::uint32_t p = server_wait_phase(sh, last);
    last = p;
    if (sh.kind == 0) return;
    if (sh.kind == 1) {
      ep.mode = static_cast<pp_mode>(sh.mode);
      if (ep.mode != pp_plain) ep.init_engine(std::max<std::size_t>(sh.size, 64) + 64, self, sh.size);
      server_echo(sh, p, ep, sh.size);
    } else {
      server_receive(sh, p, fd, sh.size, o.batch, sh.mode);
    }
  }
}

// ---------------------------------------------------------------------------
// The client (parent) side.

// One GSO send's worth of RoCE-shaped packets (roce_layout and
// roce_layout_splice): header, payload and CRC trailer each, the payloads
// taken in turn from a 1 MiB region, as a 1 MiB RDMA WRITE sends them.
struct roce_run {
  static constexpr std::size_t header = 20, payload = 4096, trailer = 4;
  static constexpr std::size_t packet = header + payload + trailer, run = 15;
  static constexpr std::size_t slot = 65536, slots = 32;  // staging: 2 MiB, twice the window

  explicit roce_run(bool stage) : staged(stage), region(1 << 20, std::byte{0x33}) {
    if (!staged) return;
    void* m = ::mmap(nullptr, slot * slots, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die_errno("mmap");
    ring = static_cast<std::byte*>(m);
    std::memset(ring, 0, slot * slots);
  }
  ~roce_run() {
    if (ring != nullptr) ::munmap(ring, slot * slots);
  }
  roce_run(const roce_run&) = delete;
  roce_run& operator=(const roce_run&) = delete;

  const std::byte* next_payload() {
    const std::byte* p = region.data() + at;
    at = (at + payload) % region.size();
    return p;
  }
  // The payloads stay where they are: 45 iovecs, the kernel copies.
  msghdr gather() {
    for (std::size_t k = 0; k < run; ++k) {
      const std::byte* pl = next_payload();
      const std::uint32_t c =
          averbs::wire::crc32(averbs::wire::crc32(0, headers[k].data(), header), pl, payload);
      std::memcpy(trailers[k].data(), &c, trailer);
      iov[3 * k] = {headers[k].data(), header};
      iov[3 * k + 1] = {const_cast<std::byte*>(pl), payload};
      iov[3 * k + 2] = {trailers[k].data(), trailer};
    }
    msghdr m{};
    m.msg_iov = iov.data();
    m.msg_iovlen = iov.size();
    return m;
  }
  // The run copied into the next staging slot, its CRCs taken on the copy;
  // the slot is spliced, and used again only 31 runs later (2 MiB on,
  // beyond the 1 MiB window: the receiver has read it).
  std::byte* stage() {
    std::byte* st = ring + next * slot;
    next = (next + 1) % slots;
    for (std::size_t k = 0; k < run; ++k) {
      std::byte* pk = st + k * packet;
      std::memcpy(pk, headers[k].data(), header);
      std::memcpy(pk + header, next_payload(), payload);
      const std::uint32_t c = averbs::wire::crc32(0, pk, header + payload);
      std::memcpy(pk + header + payload, &c, trailer);
    }
    return st;
  }

  const bool staged;
  std::vector<std::byte> region;
  std::size_t at = 0;
  std::array<std::array<std::byte, header>, run> headers{};
  std::array<std::array<std::byte, trailer>, run> trailers{};
  std::array<iovec, 3 * run> iov{};
  std::byte* ring = nullptr;
  std::size_t next = 0;
};

struct client {
  shared_state& sh;
  const options& o;
  int fd, raw_fd;
  sockaddr_in self, peer;
  std::uint32_t phase = 0;

  // Starts a phase on the server.
  std::uint32_t start(int kind, int mode, std::size_t size) {
    sh.kind = kind;
    sh.mode = mode;
    sh.size = size;
    sh.received.store(0, std::memory_order_relaxed);
    sh.phase.store(++phase, std::memory_order_release);
    return phase;
  }

  // Ends it and waits for the server to say so.
  void finish(std::uint32_t p) {
    sh.stop.store(p, std::memory_order_release);
    const auto until = clk::now() + std::chrono::seconds(10);
    while (sh.done.load(std::memory_order_acquire) != p) {
      if (clk::now() > until) die("server did not finish phase %u", p);
      cpu_relax();
    }
    if (sh.failed.load(std::memory_order_acquire) != 0) die("%s", sh.error);
  }

  void pingpong(pp_mode mode) {
    pp_endpoint ep;
    ep.fd = fd;
    ep.raw_fd = raw_fd;
    ep.mode = mode;
    ep.peer = peer;
    ep.peer.sin_port = 0;
    ep.peer_udp = peer;
    ep.port_ = ntohs(peer.sin_port);
    const std::size_t size = o.size;
    if (mode != pp_plain) ep.init_engine(std::max<std::size_t>(size, 64) + 64, self, size);
    const std::uint32_t p = start(1, mode, size);
    std::vector<std::byte> out(size, std::byte{0x5a}), in(std::max<std::size_t>(size, 64) + 64);
    std::vector<double> samples;
    samples.reserve(o.iters);
    for (std::size_t i = 0; i < o.warmup + o.iters; ++i) {
      const auto t0 = clk::now();
      if (!ep.send_one(out.data(), size)) die_errno("ping send");
      long r;
      unsigned spins = 0;
      while ((r = ep.try_recv(in.data(), in.size())) == 0) {
        // The first ping may beat the server to its loop; that is fine: the
        // datagram waits in its socket.  A second of silence is a loss.
        if ((++spins & 0xFFF) == 0 && clk::now() - t0 > std::chrono::seconds(1))
          die("no reply to ping %zu within 1 s (mode %s)", i, pp_name(mode));
      }
      if (r < 0) die_errno("ping recv");
      const auto t1 = clk::now();
      if (i >= o.warmup) samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
    }
    finish(p);
    std::sort(samples.begin(), samples.end());
    // perftest drops the two largest samples (LAT_MEASURE_TAIL).
    const std::size_t n = samples.size() > 3 ? samples.size() - 2 : samples.size();
    const double typical = n % 2 == 0 ? (samples[n / 2] + samples[n / 2 - 1]) / 2 : samples[n / 2];
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += samples[i];
    // As perftest (and averbs perf): t_max and the percentile are the
    // samples at index n and ceil(0.99 n) of the sorted whole, n the count
    // kept: the largest kept is the second largest of all.
    auto at = [&](std::size_t i) { return samples[std::min(i, samples.size() - 1)]; };
    const double p99 = at(static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.99)));
    std::printf(
        "pingpong mode=%s size=%zu iters=%zu t_min=%.2f t_typical=%.2f t_avg=%.2f t_p99=%.2f t_max=%.2f "
        "(one-way us = RTT/2)\n",
        pp_name(mode), size, o.iters, samples[0], typical, sum / static_cast<double>(n), p99, at(n));
    std::fflush(stdout);
  }

  // One throughput trial; returns goodput in bytes/s (and lost bytes).
  double throughput_trial(const std::string& variant, std::uint64_t& lost_out) {
    const bool roce = variant == "roce_layout" || variant == "roce_layout_splice";
    const std::size_t d = roce ? roce_run::packet : o.dgram;
    const bool spliced = variant == "splice_gro" || variant == "splice_gro_crc";
    const bool gso = variant == "gso" || variant == "gso_gro" || spliced || roce;
    const bool raw = variant == "raw_mmsg";
    const std::size_t segs = roce  ? roce_run::run
                             : gso ? std::max<std::size_t>(1, std::min<std::size_t>(65507 / d, 64))
                                   : 1;
    const std::size_t per_call = variant == "send" ? d : gso ? segs * d : o.batch * d;
    if (per_call > o.window) die("window %zu is smaller than one send call (%zu bytes)", o.window, per_call);
    if (gso && set_int(fd, IPPROTO_UDP, UDP_SEGMENT, static_cast<int>(d)) != 0) die_errno("UDP_SEGMENT");

    std::vector<std::byte> payload(std::max(per_call, d), std::byte{0x42});
    ip_udp_header hdr;
    sockaddr_in to = peer;
    to.sin_port = 0;
    hdr.build(self.sin_addr, peer.sin_addr, ntohs(self.sin_port), ntohs(peer.sin_port), d);
    std::vector<iovec> iov(o.batch * 2);
    std::vector<mmsghdr> msgs(o.batch);
    for (std::size_t i = 0; i < o.batch; ++i) {
      msgs[i].msg_hdr = {};
      if (raw) {
        iov[2 * i] = {hdr.b.data(), hdr.b.size()};
        iov[2 * i + 1] = {payload.data() + i * d, d};
        msgs[i].msg_hdr.msg_iov = &iov[2 * i];
        msgs[i].msg_hdr.msg_iovlen = 2;
        msgs[i].msg_hdr.msg_name = &to;
        msgs[i].msg_hdr.msg_namelen = sizeof to;
      } else {
        iov[i] = {payload.data() + i * d, d};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
    }

    int pipe_fd[2] = {-1, -1};
    // splice_gro sends from whole pages: 15 pipe buffers, 15 fragments of
    // one skb (the kernel's limit is 17; beyond it, a corked datagram is
    // cut short).
    std::byte* pages = nullptr;
    if (spliced) {
      void* m = ::mmap(nullptr, per_call, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) die_errno("mmap");
      pages = static_cast<std::byte*>(m);
      std::memset(pages, 0x42, per_call);
      // A call's 15 pages fit the default 16-page pipe; more room if we may.
      if (::pipe2(pipe_fd, O_CLOEXEC) != 0) die_errno("pipe2");
      (void)::fcntl(pipe_fd[1], F_SETPIPE_SZ, 1 << 20);
    }
    std::unique_ptr<roce_run> rr;
    if (roce) {
      rr = std::make_unique<roce_run>(variant == "roce_layout_splice");
      if (rr->staged && ::pipe2(pipe_fd, O_CLOEXEC) != 0) die_errno("pipe2");
      if (rr->staged) (void)::fcntl(pipe_fd[1], F_SETPIPE_SZ, 1 << 20);
    }
    const std::uint32_t p = start(2,
                                  roce || variant == "splice_gro_crc" ? 2
                                  : variant == "gso_gro" || spliced   ? 1
                                                                      : 0,
                                  d);
    std::uint64_t sent = 0, lost = 0;
    // Sends one call's worth (per_call bytes) once the window allows it.
    auto send_some = [&]() {
      auto last_change = clk::now();
      std::uint64_t last_seen = sh.received.load(std::memory_order_acquire);
      unsigned spins = 0;
      while (sent - lost - last_seen + per_call > o.window) {
        cpu_relax();
        const std::uint64_t now_seen = sh.received.load(std::memory_order_acquire);
        if (now_seen != last_seen) {
          last_seen = now_seen;
          last_change = clk::now();
        } else if ((++spins & 0x3FF) == 0 && clk::now() - last_change > std::chrono::milliseconds(200)) {
          lost += sent - lost - now_seen;  // nothing moved for 200 ms: the rest is gone
        }
      }
      if (roce && !rr->staged) {
        msghdr mh = rr->gather();
        while (::sendmsg(fd, &mh, 0) < 0)
          if (!transient(errno)) die_errno("sendmsg (roce_layout)");
      } else if (variant == "send") {
        while (::send(fd, payload.data(), d, 0) < 0)
          if (!transient(errno)) die_errno("send");
      } else if (spliced || roce) {
        iovec v{roce ? rr->stage() : pages, per_call};
        while (v.iov_len > 0) {
          const ssize_t r = ::vmsplice(pipe_fd[1], &v, 1, 0);
          if (r < 0) die_errno("vmsplice");
          v.iov_base = static_cast<std::byte*>(v.iov_base) + r;
          v.iov_len -= static_cast<std::size_t>(r);
        }
        for (std::size_t left = per_call; left > 0;) {
          const ssize_t r = ::splice(pipe_fd[0], nullptr, fd, nullptr, left, 0);
          if (r < 0 && !transient(errno)) die_errno("splice");
          if (r > 0) left -= static_cast<std::size_t>(r);
        }
      } else if (gso) {
        while (::send(fd, payload.data(), per_call, 0) < 0)
          if (!transient(errno)) die_errno("send (UDP_SEGMENT)");
      } else {
        std::size_t done = 0;
        const int sfd = raw ? raw_fd : fd;
        while (done < o.batch) {
          const int r = ::sendmmsg(sfd, msgs.data() + done, static_cast<unsigned>(o.batch - done), 0);
          if (r > 0)
            done += static_cast<std::size_t>(r);
          else if (!transient(errno))
            die_errno("sendmmsg");
        }
      }
      sent += per_call;
    };
    // Warm up (a tenth of the trial), then measure for o.seconds, then wait
    // until everything sent arrived.
    const auto warm_until = clk::now() + std::chrono::duration<double>(o.seconds / 10);
    while (clk::now() < warm_until) send_some();
    const auto t0 = clk::now();
    const std::uint64_t r0 = sh.received.load(std::memory_order_acquire);
    const std::uint64_t lost0 = lost;
    const auto until = t0 + std::chrono::duration<double>(o.seconds);
    while (clk::now() < until)
      for (int k = 0; k < 16; ++k) send_some();
    auto last_change = clk::now();
    std::uint64_t seen = sh.received.load(std::memory_order_acquire);
    auto t1 = clk::now();
    while (seen < sent - lost) {
      cpu_relax();
      const std::uint64_t s = sh.received.load(std::memory_order_acquire);
      const auto now = clk::now();
      if (s != seen) {
        seen = s;
        last_change = t1 = now;
      } else if (now - last_change > std::chrono::milliseconds(200)) {
        lost += sent - lost - seen;
      }
    }
    if (seen == r0) t1 = clk::now();
    finish(p);
    if (gso) set_int(fd, IPPROTO_UDP, UDP_SEGMENT, 0);
    if (pipe_fd[0] >= 0) {
      ::close(pipe_fd[0]);
      ::close(pipe_fd[1]);
    }
    if (pages != nullptr) ::munmap(pages, per_call);
    lost_out = lost - lost0;
    return static_cast<double>(seen - r0) / std::chrono::duration<double>(t1 - t0).count();
  }

  struct tp_result {
    std::string variant;
    double bps;
  };

  void throughput() {
    std::vector<tp_result> results;
    for (const std::string& v : o.variants) {
      if (v == "raw_mmsg" && raw_fd < 0) {
        std::printf("throughput variant=%s skipped=\"no raw socket (needs CAP_NET_RAW)\"\n", v.c_str());
        continue;
      }
      std::vector<double> bps;
      std::uint64_t lost_total = 0;
      for (int t = 0; t < o.trials; ++t) {
        std::uint64_t lost = 0;
        bps.push_back(throughput_trial(v, lost));
        lost_total += lost;
      }
      const auto f = averbs::bench::summarize(bps);
      // (The RoCE variants' datagrams are whole packets: their figures
      // count the 24 bytes of header and CRC of each 4120, 0.6 %.)
      const bool roce = v == "roce_layout" || v == "roce_layout_splice";
      const std::size_t dgram = roce ? roce_run::packet : o.dgram;
      std::printf(
          "throughput variant=%s dgram=%zu MBps=%.1f MiBps=%.1f Gbps=%.2f dgram_per_s=%.0f min_MBps=%.1f "
          "max_MBps=%.1f trials=%d lost_bytes=%llu\n",
          v.c_str(), dgram, f.median / 1e6, f.median / (1 << 20), f.median * 8 / 1e9,
          f.median / static_cast<double>(dgram), f.min / 1e6, f.max / 1e6, o.trials,
          static_cast<unsigned long long>(lost_total));
      std::fflush(stdout);
      if (v != "splice_gro_crc" && v != "roce_layout" && v != "roce_layout_splice")
        results.push_back({v, f.median});  // (not raw UDP)
    }
    if (results.empty()) return;
    const auto best =
        std::max_element(results.begin(), results.end(), [](auto& a, auto& b) { return a.bps < b.bps; });
    std::printf("throughput_best variant=%s dgram=%zu MBps=%.1f MiBps=%.1f Gbps=%.2f\n",
                best->variant.c_str(), o.dgram, best->bps / 1e6, best->bps / (1 << 20), best->bps * 8 / 1e9);
  }
};

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (::sched_setaffinity(0, sizeof s, &s) != 0) die_errno("sched_setaffinity");
}

long to_long(const char* opt, const std::string& v) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n < 0) die("%s: '%s' is not a number", opt, v.c_str());
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("%s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "-h" || a == "--help") return usage(0);
    if (a == "pingpong") {
      o.run_throughput = false;
    } else if (a == "throughput") {
      o.run_pingpong = false;
    } else if (a == "all") {
    } else if (a == "-s" || a == "--size") {
      o.size = static_cast<std::size_t>(to_long("--size", value()));
      if (o.size < 1 || o.size > 8192) die("--size must be 1..8192");
    } else if (a == "-n" || a == "--iters") {
      o.iters = static_cast<std::size_t>(to_long("--iters", value()));
      if (o.iters < 10) die("--iters: at least 10");
    } else if (a == "--pp-modes") {
      o.pp_modes = split(value());
    } else if (a == "-d" || a == "--dgram") {
      o.dgram = static_cast<std::size_t>(to_long("--dgram", value()));
      if (o.dgram < 64 || o.dgram > 65000) die("--dgram must be 64..65000");
    } else if (a == "--seconds") {
      o.seconds = std::atof(value().c_str());
      if (!(o.seconds > 0.01 && o.seconds < 60)) die("--seconds must be in (0.01, 60)");
    } else if (a == "--trials") {
      o.trials = static_cast<int>(to_long("--trials", value()));
      if (o.trials < 1) die("--trials: at least 1");
    } else if (a == "--batch") {
      o.batch = static_cast<std::size_t>(to_long("--batch", value()));
      if (o.batch < 1 || o.batch > 1024) die("--batch must be 1..1024");
    } else if (a == "--window") {
      o.window = static_cast<std::size_t>(to_long("--window", value()));
    } else if (a == "--variants") {
      o.variants = split(value());
    } else if (a == "--server-addr") {
      o.server_addr = value();
    } else if (a == "--client-addr") {
      o.client_addr = value();
    } else if (a == "-p" || a == "--port") {
      const long p = to_long("--port", value());
      if (p < 1 || p > 65534) die("--port must be 1..65534");
      o.port = static_cast<std::uint16_t>(p);
    } else if (a == "--cpus") {
      const std::string v = value();
      if (v == "none") {
        o.server_cpu = o.client_cpu = -1;
      } else {
        const auto c = split(v);
        if (c.size() != 2) die("--cpus wants S,C or none");
        o.server_cpu = static_cast<int>(to_long("--cpus", c[0]));
        o.client_cpu = static_cast<int>(to_long("--cpus", c[1]));
      }
    } else if (a == "--timeout") {
      o.timeout = static_cast<unsigned>(to_long("--timeout", value()));
    } else {
      std::fprintf(stderr, "udp_baseline: unknown argument '%s'\n", a.c_str());
      return usage(2);
    }
  }
  for (const auto& m : o.pp_modes) {
    pp_mode unused;
    if (!parse_pp_mode(m, unused)) die("unknown ping-pong mode '%s'", m.c_str());
  }
  for (const auto& v : o.variants)
    if (v != "send" && v != "sendmmsg" && v != "gso" && v != "gso_gro" && v != "raw_mmsg" &&
        v != "splice_gro" && v != "splice_gro_crc" && v != "roce_layout" && v != "roce_layout_splice")
      die("unknown throughput variant '%s'", v.c_str());
  if (o.server_cpu >= 0 && ::sysconf(_SC_NPROCESSORS_ONLN) < 2) o.server_cpu = o.client_cpu = -1;

  const sockaddr_in srv = sin_of(loopback_addr(o.server_addr), o.port);
  const sockaddr_in cli = sin_of(loopback_addr(o.client_addr), static_cast<std::uint16_t>(o.port + 1));

  void* mem =
      ::mmap(nullptr, sizeof(shared_state), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die_errno("mmap");
  auto& sh = *new (mem) shared_state;

  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) die_errno("pipe");
  ::alarm(o.timeout);  // SIGALRM's default action ends the run; the child follows
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) die_errno("fork");
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) std::_Exit(1);
    ::alarm(o.timeout + 5);
    ::close(ready[0]);
    pin(o.server_cpu);
    const int fd = udp_socket(srv, cli);
    const int raw_fd = raw_socket(srv);
    const char one = 1;
    if (::write(ready[1], &one, 1) != 1) std::_Exit(1);
    ::close(ready[1]);
    run_server(sh, o, fd, raw_fd, srv, cli);
    std::_Exit(0);
  }
  ::close(ready[1]);
  pin(o.client_cpu);
  const int fd = udp_socket(cli, srv);
  const int raw_fd = raw_socket(cli);
  pollfd pf{ready[0], POLLIN, 0};
  char byte = 0;
  if (::poll(&pf, 1, 10000) != 1 || ::read(ready[0], &byte, 1) != 1) {
    ::kill(child, SIGKILL);
    die("server did not start (is %s:%u free?)", o.server_addr.c_str(), o.port);
  }
  ::close(ready[0]);

  std::printf("# udp_baseline: server %s:%u (cpu %d), client %s:%u (cpu %d); raw socket %s\n",
              o.server_addr.c_str(), o.port, o.server_cpu, o.client_addr.c_str(), o.port + 1, o.client_cpu,
              raw_fd >= 0 ? "yes" : "no (CAP_NET_RAW missing)");
  std::fflush(stdout);
  client c{sh, o, fd, raw_fd, cli, srv};
  if (o.run_pingpong) {
    for (const auto& m : o.pp_modes) {
      pp_mode mode = pp_plain;
      parse_pp_mode(m, mode);
      if (tx_of(mode) == tx_kind::raw && raw_fd < 0) {
        std::printf("pingpong mode=%s skipped=\"no raw socket (needs CAP_NET_RAW)\"\n", m.c_str());
        continue;
      }
      c.pingpong(mode);
    }
  }
  if (o.run_throughput) c.throughput();

  c.start(0, 0, 0);  // tell the server to quit
  int status = 0;
  for (int i = 0; i < 1000; ++i) {
    if (::waitpid(child, &status, WNOHANG) == child) return 0;
    ::usleep(1000);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  return 0;
}
