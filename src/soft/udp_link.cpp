// SPDX-License-Identifier: MIT
#include "soft/links.hpp"
#include "wire/cm.hpp"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/net_tstamp.h>
#include <linux/sock_diag.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

#ifndef UDP_NO_CHECK6_TX
#define UDP_NO_CHECK6_TX 101
#endif
#ifndef UDP_NO_CHECK6_RX
#define UDP_NO_CHECK6_RX 102
#endif
#ifndef IPV6_HDRINCL
#define IPV6_HDRINCL 36
#endif
#ifndef IPV6_FLOWINFO
#define IPV6_FLOWINFO 11  // linux/in6.h: receive the flow label (a control message)
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

namespace averbs::soft {

namespace {

void to_sockaddr(const gid& g, std::uint16_t port, sockaddr_storage& ss, socklen_t& len) {
  std::memset(&ss, 0, sizeof ss);
  if (g.is_ipv4_mapped()) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    std::memcpy(&a->sin_addr, g.raw.data() + 12, 4);
    len = sizeof(sockaddr_in);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    std::memcpy(&a->sin6_addr, g.raw.data(), 16);
    len = sizeof(sockaddr_in6);
  }
}

bool from_sockaddr(const sockaddr_storage& ss, gid& g, std::uint16_t& port) {
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    g = gid::from_ipv4(ntohl(a->sin_addr.s_addr));
    port = ntohs(a->sin_port);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    std::memcpy(g.raw.data(), &a->sin6_addr, 16);
    port = ntohs(a->sin6_port);
    return true;
  }
  return false;
}

int set_int(int fd, int level, int opt, int v) { return ::setsockopt(fd, level, opt, &v, sizeof v); }

// A receive buffer that holds a burst: past net.core.rmem_max when we may
// (CAP_NET_ADMIN), else as much as the host allows.  A datagram that finds
// the buffer full is lost in the kernel, where no counter of ours sees it.
void set_receive_buffer(int fd, int bytes) {
  if (set_int(fd, SOL_SOCKET, SO_RCVBUFFORCE, bytes) != 0) set_int(fd, SOL_SOCKET, SO_RCVBUF, bytes);
}

// A send buffer that holds a QP's window in flight: past net.core.wmem_max
// when we may, as for receiving.  On a NIC the kernel charges a packet to
// the socket until the NIC has sent it, and 212992 bytes (the stock
// wmem_max) is less than one QP's window of 4 KiB packets.
void set_send_buffer(int fd, int bytes) {
  if (set_int(fd, SOL_SOCKET, SO_SNDBUFFORCE, bytes) != 0) set_int(fd, SOL_SOCKET, SO_SNDBUF, bytes);
}

// The reuseport group's selector: it sees the UDP payload (the BTH) and
// answers the index of the socket that gets the datagram: 1 (the
// management socket) when the destination QP (BTH bytes 5-7) is QP1, else
// 0.  A datagram too short to hold a BTH makes the load fail, which
// answers 0.
constexpr sock_filter gsi_selector[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),            // A = BTH bytes 4..7
    BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x00FFFFFF),  // the destination QP
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, 1),
    BPF_STMT(BPF_RET | BPF_K, 0),
};

[[noreturn]] void fail(const char* what) { throw std::system_error(errno, std::system_category(), what); }

// A hash of an address and up to 48 more bits (port, TOS, TTL): for the
// sender's flow table and the receiver's per-source IDs.
std::uint64_t hash_of(const gid& g, std::uint64_t extra) noexcept {
  std::uint64_t a, b;
  std::memcpy(&a, g.raw.data(), 8);
  std::memcpy(&b, g.raw.data() + 8, 8);
  const std::uint64_t h = (a ^ (b * 0x9E3779B97F4A7C15ull) ^ extra) * 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

// A datagram sent alone (a ping-pong's) goes in one piece when it is
// small: the kernel takes about 100 ns less for one iovec than for its
// header, payload and trailer apart.  `one` then points into `buf`.
void flatten_small(msghdr& m, std::array<std::byte, 256>& buf, iovec& one) noexcept {
  std::size_t len = 0;
  for (std::size_t i = 0; i < m.msg_iovlen; ++i) len += m.msg_iov[i].iov_len;
  if (len > buf.size() || m.msg_iovlen <= 1) return;
  one = {buf.data(), 0};
  for (std::size_t i = 0; i < m.msg_iovlen; ++i) {
    std::memcpy(buf.data() + one.iov_len, m.msg_iov[i].iov_base, m.msg_iov[i].iov_len);
    one.iov_len += m.msg_iov[i].iov_len;
  }
  m.msg_iov = &one;
  m.msg_iovlen = 1;
}

// sendmsg(), or for a message in one piece send()/sendto(), which take
// about 100 ns less of the kernel's (no message header or iovec array to
// copy in): a ping-pong's datagram goes this way.
ssize_t send_one(int fd, const msghdr& m) noexcept {
  if (m.msg_iovlen != 1 || m.msg_controllen != 0) return ::sendmsg(fd, &m, 0);
  return ::sendto(fd, m.msg_iov[0].iov_base, m.msg_iov[0].iov_len, 0, static_cast<const sockaddr*>(m.msg_name),
                  m.msg_namelen);
}

// The calling thread's network namespace (device and inode of its nsfs
// file); {0, 0} where /proc cannot say.
std::pair<std::uint64_t, std::uint64_t> thread_netns() noexcept {
  struct stat st;
  if (::stat("/proc/thread-self/ns/net", &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

}  // namespace

int udp_link::socket_here() const noexcept {
  // A socket belongs to the namespace of the thread that opens it, and the
  // thread driving the device may have joined another since (setns): one
  // opened there would send where none of our peers is.  The datagrams
  // take the path the device's own sockets offer instead.
  if (thread_netns() != netns_) return -1;
  return ::socket(v6_ ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

udp_link::udp_link(device& d, const device_config& cfg)
    : dev_(d), port_(cfg.port), local_(cfg.address), check_icrc_(cfg.check_icrc), gso_(cfg.gso) {
  netns_ = thread_netns();
  v6_ = !local_.is_ipv4_mapped();
  const int af = v6_ ? AF_INET6 : AF_INET;
  fd_ = ::socket(af, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) fail("socket");
  try {
    if (v6_) {
      // rxe sends UDP checksum 0 over IPv6 too; accept and send it (P2).
      set_int(fd_, IPPROTO_UDP, UDP_NO_CHECK6_RX, 1);
      set_int(fd_, IPPROTO_UDP, UDP_NO_CHECK6_TX, 1);
      set_int(fd_, IPPROTO_IPV6, IPV6_V6ONLY, 1);
      // rxe sends flow label 0; without this the kernel invents one.
      set_int(fd_, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0);
      // A datagram longer than the path is refused, as with DF over IPv4:
      // an IPv6 UDP socket would otherwise send it in fragments, which a
      // RoCE NIC does not take.
      if (set_int(fd_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO) != 0) fail("IPV6_MTU_DISCOVER");
    } else {
      set_int(fd_, SOL_SOCKET, SO_NO_CHECK, 1);  // UDP checksum 0, as rxe
      // DF on an unconnected socket: the kernel writes IPv4 ID 0, which the
      // ICRC covers (P1).
      if (set_int(fd_, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO) != 0) fail("IP_MTU_DISCOVER");
    }
    set_receive_buffer(fd_, 4 << 20);
    // A GSO run from a peer then arrives whole instead of being split by
    // the kernel (in the sender's context, on loopback): the dearest part
    // of a bulk transfer.
    if (gso_ && set_int(fd_, SOL_UDP, UDP_GRO, 1) == 0) {
      try {
        // Not zeroed: the kernel touches only the pages it writes.
        gro_buf_.reset(new std::byte[gro_slots * gro_slot_size]);
        for (std::size_t i = 0; i < gro_slots; ++i) {
          gro_iov_[i] = {gro_buf_.get() + i * gro_slot_size, gro_slot_size};
          msghdr& h = gro_msgs_[i].msg_hdr;
          h.msg_iov = &gro_iov_[i];
          h.msg_iovlen = 1;
          h.msg_name = &rx_from_[i];
          h.msg_control = gro_control_[i].data();
        }
        gro_ = true;
      } catch (...) {
        set_int(fd_, SOL_UDP, UDP_GRO, 0);
      }
    }
    set_send_buffer(fd_, 4 << 20);
    sockaddr_storage ss;
    socklen_t len;
    to_sockaddr(local_, port_, ss, len);
    // The address must be free: bound without SO_REUSEPORT, the socket
    // finds any holder (another device, rxe) and, once bound, keeps out
    // anyone binding after it, at once (a probe closed before the real
    // bind let two processes creating a device at the same moment both
    // pass, and share one group).  SO_REUSEPORT set after the bind lets
    // our management socket, and only sockets that set it too, join.
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&ss), len) != 0) fail("bind");
    // The management socket joins the group second (index 1).
    const bool steer = set_int(fd_, SOL_SOCKET, SO_REUSEPORT, 1) == 0;
    if (steer) {
      gsi_fd_ = ::socket(af, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      sock_fprog prog{static_cast<unsigned short>(std::size(gsi_selector)), const_cast<sock_filter*>(gsi_selector)};
      bool ok = gsi_fd_ >= 0 && set_int(gsi_fd_, SOL_SOCKET, SO_REUSEPORT, 1) == 0;
      if (ok && v6_) {
        set_int(gsi_fd_, IPPROTO_UDP, UDP_NO_CHECK6_RX, 1);
        set_int(gsi_fd_, IPPROTO_IPV6, IPV6_V6ONLY, 1);
      }
      // A burst of connection requests (or their retransmissions, which
      // come in bursts too) must not overflow it.
      if (ok) set_receive_buffer(gsi_fd_, 1 << 20);
      ok = ok && ::bind(gsi_fd_, reinterpret_cast<sockaddr*>(&ss), len) == 0;
      ok = ok && ::setsockopt(fd_, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) == 0;
      if (!ok && gsi_fd_ >= 0) {
        // Without the selector the group would spread data over both
        // sockets: keep one.
        ::close(gsi_fd_);
        gsi_fd_ = -1;
      }
    }
    if (cfg.raw_send) {
      raw_fd_ = ::socket(af, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_RAW);
      if (raw_fd_ >= 0 && v6_ && set_int(raw_fd_, IPPROTO_IPV6, IPV6_HDRINCL, 1) != 0) {
        ::close(raw_fd_);
        raw_fd_ = -1;
      }
      if (raw_fd_ >= 0) {
        set_send_buffer(raw_fd_, 4 << 20);
        // Route only through the device's own address.
        to_sockaddr(local_, 0, ss, len);
        if (::bind(raw_fd_, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
          ::close(raw_fd_);
          raw_fd_ = -1;
        }
      }
    }
    if (raw_fd_ >= 0 && !v6_) {
      // The probes that learn a flow's IPv4 IDs go here, to our own
      // address: never onto the wire.  Without it flows stay off.
      sink_fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      to_sockaddr(local_, 0, sink_, sink_len_);
      if (sink_fd_ >= 0 && (::bind(sink_fd_, reinterpret_cast<sockaddr*>(&sink_), sink_len_) != 0 ||
                            ::getsockname(sink_fd_, reinterpret_cast<sockaddr*>(&sink_), &sink_len_) != 0)) {
        ::close(sink_fd_);
        sink_fd_ = -1;
      }
    }
    dev_.watch_fd_unless_busy(fd_);
    if (gsi_fd_ >= 0) dev_.watch_fd_unless_busy(gsi_fd_);
  } catch (...) {
    if (sink_fd_ >= 0) ::close(sink_fd_);
    if (raw_fd_ >= 0) ::close(raw_fd_);
    if (gsi_fd_ >= 0) ::close(gsi_fd_);
    ::close(fd_);
    throw;
  }
}

udp_link::~udp_link() {
  for (std::size_t i = 0; i < tx_count_; ++i) dev_.free_packet(tx_[i].p);
  drop_queued();
  for (packet* p : rx_)
    if (p != nullptr) dev_.free_packet(p);
  for (auto& [sport, g] : gso_fds_)
    if (g.fd >= 0) ::close(g.fd);
  for (auto& [key, f] : flows_)
    if (f.fd >= 0) ::close(f.fd);
  if (sink_fd_ >= 0) ::close(sink_fd_);
  if (raw_fd_ >= 0) ::close(raw_fd_);
  if (gsi_fd_ >= 0) ::close(gsi_fd_);
  if (peer_fd_ >= 0) ::close(peer_fd_);
  ::close(fd_);
}

bool udp_link::prepare(tx_slot& s, packet* p) noexcept {
  s.p = p;
  s.sport = p->sport;
  s.transport_len = p->header_len + p->payload_len + wire::pad_for(p->payload_len);
  std::size_t n = 0;
  if (raw_fd_ >= 0) {
    if (p->src.is_ipv4_mapped() != p->dst.is_ipv4_mapped()) {
      ++dev_.counters_.dropped;  // mixed address families: no route
      dev_.free_packet(p);
      return false;
    }
    // The IP and UDP headers only if the raw socket sends it (most go
    // through a GSO run or a flow's socket, whose kernel writes them).
    s.iov[n++] = {s.ip_udp.data(), 0};
  }
  s.iov[n++] = {p->header.data(), p->header_len};
  for (std::uint8_t i = 0; i < p->nsegs; ++i)
    s.iov[n++] = {const_cast<std::byte*>(p->segs[i].p), p->segs[i].len};
  const std::uint8_t pad = wire::pad_for(p->payload_len);
  std::memset(s.trailer.data(), 0, pad);
  wire::store_icrc(p->icrc, std::span<std::byte, 4>(s.trailer.data() + pad, 4));
  s.iov[n++] = {s.trailer.data(), static_cast<std::size_t>(pad) + 4};
  socklen_t len;
  to_sockaddr(p->dst, raw_fd_ >= 0 ? 0 : port_, s.to, len);
  s.iov_count = n;
  return true;
}

void udp_link::write_ip_udp(tx_slot& s) noexcept {
  const packet* p = s.p;
  wire::ip_udp_params ip;
  std::memcpy(ip.src_gid.data(), p->src.raw.data(), 16);
  std::memcpy(ip.dst_gid.data(), p->dst.raw.data(), 16);
  ip.src_port = p->sport;
  ip.dst_port = port_;
  ip.traffic_class = p->tclass;
  ip.hop_limit = p->hop_limit;
  // prepare() let only one address family through, and a packet is far
  // shorter than a 16-bit length field: this cannot fail.
  s.iov[0].iov_len = wire::build_ip_udp(ip, s.transport_len + wire::icrc_size, s.ip_udp);
}

void udp_link::send(packet* p) noexcept {
  if (!prepare(tx_[tx_count_], p)) return;
  if (++tx_count_ >= tx_limit_) flush();
}

void udp_link::note_management() noexcept {
  last_management_ = std::chrono::steady_clock::now();
  tx_limit_ = batch;  // what is batched already leaves at the next send or flush
}

void udp_link::send_urgent(packet* p) noexcept {
  // Ahead of the data batched so far: its own sendmmsg, now.
  if (prepare(urgent_, p)) transmit(&urgent_, 1);
}

void udp_link::flush() noexcept {
  // (The clock is looked at every 1024th flush: a ping-pong's turnaround
  // flushes every pass.)
  if (++flushes_ >= 1024) {
    flushes_ = 0;
    if (const clock::time_point now = dev_.pass_now(); now >= next_prune_) prune_idle(now);
  }
  if (backlog_head_ != nullptr) send_backlog();
  if (tx_count_ == 0) return;
  transmit(tx_.data(), tx_count_);
  tx_count_ = 0;
  if (tx_limit_ == batch && gso_ && !management_active(std::chrono::steady_clock::now())) tx_limit_ = quiet_batch;
}

void udp_link::prune_idle(clock::time_point now) noexcept {
  next_prune_ = deadline_after(now, std::chrono::seconds(1));
  for (auto it = flows_.begin(); it != flows_.end();) {
    if (now - it->second.last_used < socket_idle) {
      ++it;
      continue;
    }
    if (it->second.fd >= 0) ::close(it->second.fd);
    if (&it->second == last_flow_) last_flow_ = nullptr;
    it = flows_.erase(it);
  }
  for (auto it = gso_fds_.begin(); it != gso_fds_.end();) {
    if (now - it->second.last_used < socket_idle) {
      ++it;
      continue;
    }
    if (it->second.fd >= 0) ::close(it->second.fd);
    it = gso_fds_.erase(it);
  }
}

int udp_link::gso_fd(std::uint16_t sport) noexcept {
  // Without a raw socket every packet has the RoCE port as source port,
  // on the receiving socket, which rxe's checksum rule keeps from GSO.
  if (raw_fd_ < 0 || !gso_) return -1;
  const clock::time_point now = dev_.pass_now();
  if (auto it = gso_fds_.find(sport); it != gso_fds_.end()) {
    if (it->second.fd >= 0) {
      it->second.last_used = now;
      return it->second.fd;
    }
    if (now - it->second.last_used < flow_idle) return -1;
    gso_fds_.erase(it);  // the port may be free by now
  }
  if (gso_fds_.size() >= max_gso_fds) {
    // A long-lived device meets many source ports (one per QP pair).  With
    // all of them busy, the scan is not repeated for every run until the
    // oldest may have fallen idle.
    if (now < gso_evict_after_) return -1;
    auto lru = gso_fds_.begin();
    for (auto i = gso_fds_.begin(); i != gso_fds_.end(); ++i)
      if (i->second.last_used < lru->second.last_used) lru = i;
    if (now - lru->second.last_used < flow_idle) {
      gso_evict_after_ = deadline_after(lru->second.last_used, flow_idle);
      return -1;
    }
    if (lru->second.fd >= 0) ::close(lru->second.fd);
    gso_fds_.erase(lru);
  }
  int fd = socket_here();
  if (fd >= 0) {
    bool ok = true;
    if (v6_) {
      set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
      set_int(fd, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0);  // flow label 0, as rxe
      ok = set_int(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO) == 0;  // never fragments
    } else {
      // DF on an unconnected socket: IDs 0, 1, 2 ... for the segments.
      ok = set_int(fd, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO) == 0;
    }
    set_send_buffer(fd, 4 << 20);
    set_int(fd, SOL_SOCKET, SO_RCVBUF, 4096);  // it sends; nobody sends to it
    set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1);  // the port's flows bind it too
    sockaddr_storage ss;
    socklen_t len;
    to_sockaddr(local_, sport, ss, len);
    // The source port may be some other program's (0xC000-0xFFFF is also
    // the ephemeral range): then this flow's packets go one by one.
    if (!ok || ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  try {
    gso_fds_.emplace(sport, gso_socket{fd, now});
  } catch (...) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool udp_link::transmit_gso(tx_slot* slots, std::size_t n, int fd) noexcept {
  // Over IPv4 segment k carries IP ID k, which its ICRC covers; the device
  // computed every ICRC with ID 0.
  auto trailer_icrc = [](tx_slot& t) {
    return std::span<std::byte, 4>(t.trailer.data() + wire::pad_for(t.p->payload_len), 4);
  };
  if (!v6_)
    for (std::size_t k = 1; k < n; ++k)
      wire::store_icrc(slots[k].p->icrc ^ id_icrc_.delta(slots[k].transport_len, static_cast<std::uint16_t>(k)),
                       trailer_icrc(slots[k]));
  std::array<iovec, quiet_batch * (packet::max_segs + 2)> iov;
  std::size_t niov = 0;
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t i = 1; i < slots[k].iov_count; ++i) iov[niov++] = slots[k].iov[i];  // not the raw IP/UDP header
  sockaddr_storage to = slots[0].to;
  if (to.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&to)->sin_port = htons(port_);
  else reinterpret_cast<sockaddr_in6*>(&to)->sin6_port = htons(port_);
  // The segment size, and the AV's traffic class and hop limit (the GSO
  // socket is shared by every flow of a source port; a single packet has
  // them in its raw IP header or its flow socket's options).
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(std::uint16_t)) + 2 * CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_name = &to;
  m.msg_namelen = to.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  m.msg_iov = iov.data();
  m.msg_iovlen = niov;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
  const auto seg = static_cast<std::uint16_t>(slots[0].transport_len + wire::icrc_size);
  std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
  const int tclass = slots[0].p->tclass, hops = slots[0].p->hop_limit;
  c = CMSG_NXTHDR(&m, c);
  c->cmsg_level = v6_ ? IPPROTO_IPV6 : IPPROTO_IP;
  c->cmsg_type = v6_ ? IPV6_TCLASS : IP_TOS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &tclass, sizeof tclass);
  c = CMSG_NXTHDR(&m, c);
  c->cmsg_level = v6_ ? IPPROTO_IPV6 : IPPROTO_IP;
  c->cmsg_type = v6_ ? IPV6_HOPLIMIT : IP_TTL;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &hops, sizeof hops);
  for (int spins = 0;; ++spins) {
    if (::sendmsg(fd, &m, 0) >= 0) {
      for (std::size_t k = 0; k < n; ++k) dev_.free_packet(slots[k].p);
      ++dev_.counters_.gso_runs;
      dev_.counters_.gso_packets += n;
      return true;
    }
    if (errno == EINTR || ((errno == EAGAIN || errno == ENOBUFS) && spins < full_buffer_spins)) continue;
    break;
  }
  // Refused (no GSO on this route, or a full buffer): back to ID-0 ICRCs,
  // one by one (or into the backlog).
  if (!v6_)
    for (std::size_t k = 1; k < n; ++k) wire::store_icrc(slots[k].p->icrc, trailer_icrc(slots[k]));
  return false;
}

void udp_link::transmit(tx_slot* slots, std::size_t count) noexcept {
  // Runs of two or more packets of one flow, all of one size but the last
  // (which may be shorter), leave as one GSO datagram; the rest one by one,
  // in order.  A run's packets also continue one another (same P_Key and
  // destination QP, consecutive PSNs): a run read while the receiver's
  // UDP_GRO goes off comes without its segment size and is split by that
  // rule alone (wire::run_segment_size), so one QP's READ responses beside
  // its WRITE packets, or a UD QP's sends to two QPs, are separate runs.
  std::size_t single = 0;  // first slot not sent yet
  std::size_t i = 0;
  while (i < count) {
    const tx_slot& a = slots[i];
    const std::uint32_t size = a.transport_len;
    // A GSO datagram carries at most 64 segments and 64 KiB.
    const std::size_t fit = std::min<std::size_t>(64, 65000 / (size + wire::icrc_size));
    std::size_t j = i + 1;
    while (j < count && j - i < fit) {
      const tx_slot& b = slots[j];
      if (b.sport != a.sport || b.transport_len > size || b.to.ss_family != a.to.ss_family ||
          std::memcmp(&b.to, &a.to, sizeof(sockaddr_in6)) != 0 || b.p->tclass != a.p->tclass ||
          b.p->hop_limit != a.p->hop_limit ||
          !wire::continues_run(a.p->header.data(), b.p->header.data(), static_cast<std::uint32_t>(j - i)))
        break;
      ++j;
      if (b.transport_len < size) break;  // a shorter one ends the run
    }
    // (The kernel refuses an IPv4 TTL of 0 as a control message: such an
    // AV's packets leave one by one, the raw header carrying it.)
    const int fd = j - i >= 2 && (v6_ || a.p->hop_limit != 0) ? gso_fd(a.sport) : -1;
    if (fd >= 0) {
      transmit_each(slots + single, i - single);
      // (Behind what a full buffer refused: into the backlog too.)
      if (backlog_head_ != nullptr || !transmit_gso(slots + i, j - i, fd)) transmit_each(slots + i, j - i);
      single = i = j;
      continue;
    }
    i = j;
  }
  transmit_each(slots + single, count - single);
}

void udp_link::transmit_each(tx_slot* slots, std::size_t count) noexcept {
  if (count == 0) return;
  if (backlog_head_ != nullptr) {
    defer(slots, count);  // behind the packets waiting for room
    return;
  }
  // A datagram alone (a ping-pong's) through its flow's connected socket.
  if (count == 1 && raw_fd_ >= 0) {
    if (flow* f = flow_for(slots[0]); f != nullptr && transmit_flow(slots[0], *f)) return;
  }
  std::array<mmsghdr, quiet_batch> msgs{};
  for (std::size_t i = 0; i < count; ++i) {
    tx_slot& s = slots[i];
    if (raw_fd_ >= 0) write_ip_udp(s);
    msghdr& m = msgs[i].msg_hdr;
    m.msg_name = &s.to;
    m.msg_namelen = s.to.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    m.msg_iov = s.iov.data();
    m.msg_iovlen = s.iov_count;
  }
  const int fd = raw_fd_ >= 0 ? raw_fd_ : fd_;
  std::size_t sent = 0;
  int spins = 0;
  // One message alone (a ping-pong's) goes through sendmsg, which saves
  // about 100 ns of the kernel's against sendmmsg, and a small one in one
  // piece through sendto, which saves as much again.
  std::array<std::byte, 256> flat;
  iovec flat_iov;
  if (count == 1) flatten_small(msgs[0].msg_hdr, flat, flat_iov);
  while (sent < count) {
    const int r = count - sent == 1 ? (send_one(fd, msgs[sent].msg_hdr) >= 0 ? 1 : -1)
                                    : ::sendmmsg(fd, msgs.data() + sent, static_cast<unsigned>(count - sent), 0);
    if (r > 0) {
      sent += static_cast<std::size_t>(r);
      if (r >= 2) ++dev_.counters_.send_batches;
      spins = 0;  // (the budget is per stall, not per batch)
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
      if (++spins < full_buffer_spins) continue;
      // The send buffer stays full: the rest waits for room.
      for (std::size_t i = 0; i < sent; ++i)
        if (slots[i].p != nullptr) dev_.free_packet(slots[i].p);  // (a dropped one is freed)
      defer(slots + sent, count - sent);
      return;
    }
    // Unroutable or refused: the packet is lost, as on a wire; RC retransmits.
    dev_.counters_.dropped += 1;
    dev_.free_packet(std::exchange(slots[sent].p, nullptr));
    ++sent;
  }
  for (std::size_t i = 0; i < count; ++i)
    if (slots[i].p != nullptr) dev_.free_packet(slots[i].p);
}

void udp_link::defer(tx_slot* slots, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    packet* p = slots[i].p;
    if (p == nullptr) continue;  // (dropped already)
    if (backlog_size_ >= max_backlog) {
      ++dev_.counters_.dropped;
      dev_.free_packet(p);
      continue;
    }
    p->own_payload();  // it outlives this pass: the memory may change or go
    p->next = nullptr;
    if (backlog_tail_ != nullptr)
      backlog_tail_->next = p;
    else
      backlog_head_ = p;
    backlog_tail_ = p;
    ++backlog_size_;
    if (!resending_) ++dev_.counters_.send_deferred;  // (each packet once)
  }
  if (backlog_head_ != nullptr) arm_backlog_timer();
}

void udp_link::send_backlog() noexcept {
  packet* p = std::exchange(backlog_head_, nullptr);
  backlog_tail_ = nullptr;
  backlog_size_ = 0;
  std::array<tx_slot, quiet_batch> slots;
  while (p != nullptr) {
    std::size_t n = 0;
    while (p != nullptr && n < slots.size()) {
      packet* next = std::exchange(p->next, nullptr);
      // (A port that went down dropped the backlog: drop_queued.)
      if (prepare(slots[n], p)) ++n;
      p = next;
    }
    resending_ = true;
    transmit(slots.data(), n);
    resending_ = false;
    if (backlog_head_ == nullptr) continue;
    // Refused again: the rest stays behind what was just put back.
    backlog_tail_->next = p;
    for (; p != nullptr; p = p->next) {
      backlog_tail_ = p;
      ++backlog_size_;
    }
    return;
  }
}

void udp_link::drop_queued() noexcept {
  while (backlog_head_ != nullptr) {
    ++dev_.counters_.dropped;
    dev_.free_packet(std::exchange(backlog_head_, backlog_head_->next));
  }
  backlog_tail_ = nullptr;
  backlog_size_ = 0;
}

void udp_link::arm_backlog_timer() noexcept {
  if (backlog_timer_) return;
  // The link lives as long as its device, and the device's timers with it.
  backlog_timer_ = dev_.schedule_timer(deadline_after(dev_.clock().now(), backlog_retry),
                                       [](void* arg, const detail::timer_payload&) noexcept {
                                         auto* self = static_cast<udp_link*>(arg);
                                         self->backlog_timer_ = false;
                                         // Sent now; the pass that follows lets the stopped requesters go on.
                                         if (self->backlog_head_ != nullptr) self->send_backlog();
                                       },
                                       this, {});
}

std::size_t udp_link::flow_key_hash::operator()(const flow_key& k) const noexcept {
  return static_cast<std::size_t>(
      hash_of(k.dst, std::uint64_t{k.sport} << 16 | std::uint64_t{k.tclass} << 8 | k.hop_limit));
}

udp_link::flow* udp_link::flow_for(const tx_slot& s) noexcept {
  // RC and UC only (opcode classes 0 and 1): a UD QP sends to many peers
  // from one port, and the connection manager's first MAD must not wait
  // for a receiver to learn our numbering.
  const packet* p = s.p;
  if ((std::to_integer<unsigned>(p->header[0]) >> 5) > 1 || (!v6_ && sink_fd_ < 0)) return nullptr;
  const flow_key key{p->dst, s.sport, p->tclass, p->hop_limit};
  const clock::time_point now = dev_.pass_now();
  if (last_flow_ != nullptr && last_flow_key_ == key && last_flow_->fd >= 0 && (v6_ || last_flow_->id_known)) {
    last_flow_->last_used = now;  // a ping-pong's: no hash lookup
    return last_flow_;
  }
  auto it = flows_.find(key);
  if (it == flows_.end()) {
    if (flows_.size() >= max_flows) {
      auto lru = flows_.begin();
      for (auto i = flows_.begin(); i != flows_.end(); ++i)
        if (i->second.last_used < lru->second.last_used) lru = i;
      if (now - lru->second.last_used < flow_idle) return nullptr;
      if (lru->second.fd >= 0) ::close(lru->second.fd);
      if (&lru->second == last_flow_) last_flow_ = nullptr;
      flows_.erase(lru);
    }
    try {
      it = flows_.emplace(key, flow{}).first;
    } catch (...) {
      return nullptr;
    }
  }
  flow& f = it->second;
  f.last_used = now;
  if (f.fd < 0) {
    // A flow without a socket tries again now and then: the port may be
    // free by now, a vanished peer back.
    if (now < f.retry_at) return nullptr;
    f.retry_at = deadline_after(now, flow_retry);
    // One numbering per (destination, source port): the receiver follows
    // one count per source (icrc_matches_id), so a second connected
    // socket there -- a QP of another traffic class or hop limit whose
    // port is the same (one flow label, or a hash collision) -- would
    // number from another start and have its datagrams refused as far
    // from the count.  Such a flow stays on the raw socket (IPv4 ID 0).
    for (const auto& [k, other] : flows_)
      if (&other != &f && other.fd >= 0 && k.sport == key.sport && k.dst == key.dst) return nullptr;
    f.fd = open_flow_socket(*p, s.sport);
    f.id_known = false;
    if (f.fd < 0) return nullptr;
  }
  if (!v6_ && !f.id_known && !learn_id(f)) {
    // Not a probe every datagram: the flow gives its socket up for a while
    // (an ICMP error from a vanished peer pending on it, say).
    ::close(f.fd);
    f.fd = -1;
    f.retry_at = deadline_after(now, flow_retry);  // from now: it may have been open long
    return nullptr;
  }
  last_flow_ = &f;
  last_flow_key_ = key;
  return &f;
}

int udp_link::open_flow_socket(const packet& p, std::uint16_t sport) noexcept {
  const int fd = socket_here();
  if (fd < 0) return -1;
  bool ok = set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1) == 0;
  if (v6_) {
    // As the raw socket sends: UDP checksum 0, flow label 0 (rxe).
    ok = ok && set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1) == 0;
    set_int(fd, IPPROTO_UDP, UDP_NO_CHECK6_TX, 1);
    set_int(fd, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0);
    ok = ok && set_int(fd, IPPROTO_IPV6, IPV6_TCLASS, p.tclass) == 0;
    ok = ok && set_int(fd, IPPROTO_IPV6, IPV6_UNICAST_HOPS, p.hop_limit) == 0;
    ok = ok && set_int(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO) == 0;  // never fragments
  } else {
    ok = ok && set_int(fd, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO) == 0;
    set_int(fd, SOL_SOCKET, SO_NO_CHECK, 1);
    ok = ok && set_int(fd, IPPROTO_IP, IP_TOS, p.tclass) == 0;
    ok = ok && set_int(fd, IPPROTO_IP, IP_TTL, p.hop_limit) == 0;
  }
  set_send_buffer(fd, 1 << 20);
  set_int(fd, SOL_SOCKET, SO_RCVBUF, 4096);  // it sends; nobody sends to it
  sockaddr_storage ss;
  socklen_t len;
  to_sockaddr(local_, sport, ss, len);
  // The port may be some other program's (0xC000-0xFFFF is also the
  // ephemeral range): then this flow's datagrams go through the raw
  // socket.
  ok = ok && ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  to_sockaddr(p.dst, port_, ss, len);
  ok = ok && ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  if (ok) return fd;
  ::close(fd);
  return -1;
}

bool udp_link::learn_id(flow& f) noexcept {
  // A connected socket gives every datagram the next number of its own
  // counter, whatever the destination: so a probe to the sink has the
  // number before the flow's next datagram.  With SO_TIMESTAMPING (and
  // not OPT_TSONLY) the error queue hands back the probe with its
  // headers as the device sent it; loopback does so within sendto.
  int ts = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
  if (::setsockopt(f.fd, SOL_SOCKET, SO_TIMESTAMPING, &ts, sizeof ts) != 0) return false;
  std::array<std::uint8_t, 256> data;
  alignas(cmsghdr) char control[256];
  auto read_error = [&]() -> ssize_t {
    iovec iov{data.data(), data.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    return ::recvmsg(f.fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
  };
  while (read_error() >= 0) {
  }  // nothing stale
  const std::uint8_t probe = 0;
  std::optional<std::uint16_t> id;
  if (::sendto(f.fd, &probe, 1, 0, reinterpret_cast<const sockaddr*>(&sink_), sink_len_) == 1) {
    std::uint32_t sink_addr;
    std::memcpy(&sink_addr, &reinterpret_cast<const sockaddr_in*>(&sink_)->sin_addr, 4);
    for (int tries = 0; tries < 4 && !id; ++tries) {
      const ssize_t n = read_error();
      if (n < 0) continue;
      // The IPv4 header, after the loopback device's Ethernet header.
      for (std::size_t at : {std::size_t{0}, std::size_t{14}}) {
        if (static_cast<std::size_t>(n) < at + 20 || (data[at] >> 4) != 4 || data[at + 9] != IPPROTO_UDP ||
            std::memcmp(data.data() + at + 16, &sink_addr, 4) != 0)
          continue;
        id = static_cast<std::uint16_t>(data[at + 4] << 8 | data[at + 5]);
        break;
      }
    }
  }
  ts = 0;
  ::setsockopt(f.fd, SOL_SOCKET, SO_TIMESTAMPING, &ts, sizeof ts);
  while (read_error() >= 0) {
  }
  // Bounded: the sink's port is reachable from outside, and a flood there
  // would hold this loop (and the device lock) for as long as it lasts.
  std::uint8_t discard;
  for (int k = 0; k < 64 && ::recv(sink_fd_, &discard, 1, MSG_DONTWAIT) >= 0; ++k) {
  }
  if (!id) return false;
  f.next_id = static_cast<std::uint16_t>(*id + 1);
  f.id_known = true;
  ++dev_.counters_.flow_id_probes;
  return true;
}

bool udp_link::transmit_flow(tx_slot& s, flow& f) noexcept {
  // Connected: no address, and the kernel writes the IP and UDP headers.
  const std::span<std::byte, 4> trailer_icrc(s.trailer.data() + wire::pad_for(s.p->payload_len), 4);
  if (!v6_) wire::store_icrc(s.p->icrc ^ id_icrc_.delta(s.transport_len, f.next_id), trailer_icrc);
  msghdr m{};
  m.msg_iov = s.iov.data() + 1;  // not the raw IP/UDP header
  m.msg_iovlen = s.iov_count - 1;
  std::array<std::byte, 256> flat;
  iovec one;
  flatten_small(m, flat, one);
  for (int spins = 0;; ++spins) {
    if (send_one(f.fd, m) >= 0) {
      ++f.next_id;
      ++dev_.counters_.flow_sends;
      dev_.free_packet(s.p);
      return true;
    }
    if (errno == EINTR || ((errno == EAGAIN || errno == ENOBUFS) && spins < full_buffer_spins)) continue;
    break;
  }
  // Refused (an ICMP error from a vanished peer, say): the caller sends it
  // through the raw socket, with its ID-0 ICRC; the count is learned again
  // before the flow's next datagram.  An error that will come again (a
  // path MTU below the packet, a firewall's EPERM) gives the socket up for
  // a while instead, or every datagram would pay a probe and a refusal.
  const int e = errno;
  const bool once = e == ECONNREFUSED || e == EHOSTUNREACH || e == ENETUNREACH;  // one ICMP error each
  if (!once && e != EAGAIN && e != ENOBUFS && e != EINTR) {
    ::close(f.fd);
    f.fd = -1;
    f.retry_at = deadline_after(dev_.pass_now(), flow_retry);
    if (&f == last_flow_) last_flow_ = nullptr;
  }
  f.id_known = false;
  if (!v6_) wire::store_icrc(s.p->icrc, trailer_icrc);
  return false;
}

namespace {

std::uint64_t socket_drops(int fd) noexcept {
  std::uint32_t mem[SK_MEMINFO_VARS] = {};
  socklen_t len = sizeof mem;
  if (fd >= 0 && ::getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &len) == 0 && len > SK_MEMINFO_DROPS * sizeof mem[0])
    return mem[SK_MEMINFO_DROPS];
  return 0;
}

}  // namespace

std::uint64_t udp_link::receive_overflows() const noexcept {
  return socket_drops(fd_) + socket_drops(gsi_fd_) + socket_drops(peer_fd_) + closed_peer_drops_;
}

void udp_link::want_ip_fields() noexcept {
  if (ip_fields_) return;
  const bool ok =
      v6_ ? set_int(fd_, IPPROTO_IPV6, IPV6_RECVTCLASS, 1) == 0 &&
                set_int(fd_, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1) == 0 &&
                set_int(fd_, IPPROTO_IPV6, IPV6_FLOWINFO, 1) == 0
          : set_int(fd_, IPPROTO_IP, IP_RECVTOS, 1) == 0 && set_int(fd_, IPPROTO_IP, IP_RECVTTL, 1) == 0;
  ip_fields_ = ok;  // (else the defaults, as before)
}

ip_fields udp_link::control_of(const msghdr& h, std::size_t& seg) const noexcept {
  ip_fields out;
  for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
    int v = -1;
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      std::memcpy(&v, CMSG_DATA(c), sizeof v);
      if (v > 0) seg = static_cast<std::size_t>(v);
    } else if (!ip_fields_) {
      continue;  // (none comes)
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_FLOWINFO &&
               c->cmsg_len >= CMSG_LEN(sizeof(std::uint32_t))) {
      std::uint32_t info;  // the header's first word but the version: class and label, network order
      std::memcpy(&info, CMSG_DATA(c), sizeof info);
      out.flow_label = ntohl(info) & 0xFFFFF;
    } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS && c->cmsg_len >= CMSG_LEN(1)) {
      v = std::to_integer<int>(*reinterpret_cast<const std::byte*>(CMSG_DATA(c)));  // one byte
      out.tclass = static_cast<std::uint8_t>(v);
    } else if ((c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) ||
               (c->cmsg_level == IPPROTO_IPV6 &&
                (c->cmsg_type == IPV6_TCLASS || c->cmsg_type == IPV6_HOPLIMIT))) {
      if (c->cmsg_len < CMSG_LEN(sizeof(int))) continue;
      std::memcpy(&v, CMSG_DATA(c), sizeof v);
      if (v < 0 || v > 255) continue;
      if (c->cmsg_type == IPV6_TCLASS && c->cmsg_level == IPPROTO_IPV6)
        out.tclass = static_cast<std::uint8_t>(v);
      else
        out.hop_limit = static_cast<std::uint8_t>(v);
    }
  }
  return out;
}

std::size_t udp_link::poll() noexcept { return gro_ ? receive_gro() : receive(fd_, 2, false); }

std::size_t udp_link::poll_priority() noexcept {
  if (gsi_fd_ < 0) return 0;
  holding_dreqs_ = true;
  std::size_t n = receive(gsi_fd_, 1, true);
  holding_dreqs_ = false;
  if (held_dreq_count_ == 0) return n;
  // What the DREQ's sender sent before it (the ACK of the last message it
  // took) is in the data sockets by now: read them out (a poll reads one
  // datagram at a time while quiet, and the shared socket only now and
  // then while a peer socket is open), then queue the DREQ behind (is_dreq).
  // Until held_dreq_reads packets are read, though (one poll may overshoot): the ACK was sent just before
  // the DREQ, and anyone can send a DREQ-shaped datagram -- reading a
  // whole backlog into packets before any is handled would grow the pool,
  // which never shrinks, by up to 16 reads' worth.
  std::size_t read = 0;
  for (int k = 0; k < 16 && read < held_dreq_reads; ++k) {
    const std::size_t got = poll();
    n += got;
    read += got;
    if (got == 0 && k >= 8) break;
  }
  for (std::size_t i = 0; i < held_dreq_count_; ++i) dev_.receive_locked(held_dreqs_[i]);
  held_dreq_count_ = 0;
  return n;
}

std::size_t udp_link::receive(int fd, int rounds, bool front) noexcept {
  std::size_t total = 0;
  // The management socket holds a few MADs at most.
  const unsigned want = front ? 8 : rx_batch;
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 0; i < want; ++i) {
      if (rx_[i] == nullptr) {
        rx_[i] = dev_.alloc_packet();
        if (rx_[i] == nullptr) return total;
        rx_iov_[i] = {rx_[i]->buf, packet::buffer_size};
        msghdr& h = rx_msgs_[i].msg_hdr;
        h.msg_iov = &rx_iov_[i];
        h.msg_iovlen = 1;
        h.msg_name = &rx_from_[i];
      }
      rx_msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);  // recvmmsg shrinks it
      // The management socket's reads need none (QP1's GRH is the CM's).
      rx_msgs_[i].msg_hdr.msg_control = ip_fields_ && !front ? rx_control_[i].data() : nullptr;
      rx_msgs_[i].msg_hdr.msg_controllen = ip_fields_ && !front ? rx_control_[i].size() : 0;
    }
    auto& msgs = rx_msgs_;
    const int r = ::recvmmsg(fd, msgs.data(), want, MSG_DONTWAIT, nullptr);
    if (r <= 0) return total;
    if (r >= 2) ++dev_.counters_.receive_batches;
    for (int i = 0; i < r; ++i) {
      gid from;
      std::uint16_t from_port = 0;
      if ((msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0 || !from_sockaddr(rx_from_[i], from, from_port)) {
        ++dev_.counters_.dropped;
        continue;  // the buffer is reused
      }
      std::size_t unused = 0;
      const ip_fields ip = ip_fields_ && !front ? control_of(msgs[i].msg_hdr, unused) : ip_fields{};
      if (!deliver(rx_[i], rx_[i]->buf, msgs[i].msg_len, from, from_port, front, ip)) continue;
      rx_[i] = nullptr;
      ++total;
    }
    if (static_cast<unsigned>(r) < want) return total;
  }
  return total;
}

std::size_t udp_link::receive_gro() noexcept {
  if (peer_fd_ < 0) return receive_shared();
  if (peer_closing_) {
    // Its stragglers first, and the shared socket only once those the
    // kernel picked it for before it was pointed away have landed (within
    // microseconds): they are older than what the shared socket holds.
    // Closed at the first empty read `peer_close_time` after the close began.
    // A drain that stopped at its limit leaves the shared socket for later:
    // what the closing socket still holds may be the old peer's, older than
    // what the shared socket holds (reading the shared socket anyway, past
    // peer_shared_at_, reordered a burst under ASan: sequence NAKs).  What
    // the device sends itself lands here too while it closes (connected to
    // our own address and port); one engine thread sends it, so it does not
    // pile up (udp_peer.a_device_writing_to_itself_in_bulk_...).
    bool emptied = false;
    const std::size_t n = drain_peer(rx_batch, &emptied);
    if (!emptied) return n;
    const auto now = std::chrono::steady_clock::now();
    if (n == 0 && now >= peer_close_at_) finish_closing_peer();
    if (now < peer_shared_at_) return n;
    return n + receive_shared();
  }
  // The IP fields wanted now (a UD QP): its recv() reads none, so it goes.
  if (ip_fields_) return close_peer();
  if (++peer_polls_ % peer_shared_every != 0) return receive_peer();
  other_source_ = false;
  const std::size_t n = receive_shared();
  if (other_source_ || gro_state_ != gro_state::off) return n + close_peer();
  return n + receive_peer();
}

namespace {

// QP1's datagrams keep their priority on a peer socket too (without a raw
// socket a peer sends them from its data port): to the front of the queue.
bool for_qp1(const std::byte* d, std::size_t len) noexcept {
  return len >= wire::bth_size && (std::to_integer<std::uint32_t>(d[5]) << 16 |
                                   std::to_integer<std::uint32_t>(d[6]) << 8 | std::to_integer<std::uint32_t>(d[7])) ==
                                      wire::cm::gsi_qpn;
}

// A DREQ ends a connection.  It waits behind the data read before it, not
// ahead as other management datagrams go: an ACK that left ahead of it
// (for the last message its sender took before disconnecting) must
// complete that message's send before the DREQ moves the QP to ERR, which
// would flush the send of a message that arrived.
bool is_dreq(const wire::packet_view& v) noexcept {
  constexpr std::size_t attr_at = 16;  // the MAD header's attribute ID
  return v.hdr.bth.dest_qp == wire::cm::gsi_qpn && v.payload.size() >= attr_at + 2 &&
         std::to_integer<std::uint8_t>(v.payload[1]) == wire::cm::mgmt_class_cm &&
         (std::to_integer<unsigned>(v.payload[attr_at]) << 8 |
          std::to_integer<unsigned>(v.payload[attr_at + 1])) == static_cast<unsigned>(wire::cm::attr::dreq);
}

}  // namespace

udp_link::peer_read udp_link::read_peer() noexcept {
  packet* p = dev_.alloc_packet();
  if (p == nullptr) return peer_read::empty;
  // Into the packet's own buffer: a datagram longer than any packet (a run
  // sent before the peer saw us switch UDP_GRO off) is cut and dropped.
  // While it closes it is connected to our own address, and what comes
  // from there (a device without a raw socket sends to itself from its
  // port) lands here too: then the read says the source.
  gid from = peer_from_;
  std::uint16_t from_port = peer_port_;
  sockaddr_storage ss;
  socklen_t ss_len = sizeof ss;
  const ssize_t len = peer_closing_ ? ::recvfrom(peer_fd_, p->buf, packet::buffer_size, MSG_DONTWAIT | MSG_TRUNC,
                                                 reinterpret_cast<sockaddr*>(&ss), &ss_len)
                                    : ::recv(peer_fd_, p->buf, packet::buffer_size, MSG_DONTWAIT | MSG_TRUNC);
  if (len < 0) {
    dev_.free_packet(p);
    // A pending ICMP error fails one read (and is cleared by it); only an
    // empty queue ends the reading.
    return errno == EAGAIN || errno == EWOULDBLOCK ? peer_read::empty : peer_read::error;
  }
  const auto n = static_cast<std::size_t>(len);
  if (n == 0 || n > packet::buffer_size || (peer_closing_ && !from_sockaddr(ss, from, from_port))) {
    ++dev_.counters_.dropped;
    dev_.free_packet(p);
    return peer_read::dropped;
  }
  if (deliver(p, p->buf, n, from, from_port, for_qp1(p->buf, n), ip_fields{})) return peer_read::queued;
  dev_.free_packet(p);
  return peer_read::dropped;
}

std::size_t udp_link::receive_peer() noexcept {
  const peer_read r = read_peer();
  if (r == peer_read::empty || r == peer_read::error) {
    peer_streak_ = 0;
    return 0;
  }
  std::size_t n = r == peer_read::queued ? 1 : 0;
  if (++peer_streak_ >= peer_streak_limit) n += close_peer();  // a burst: the shared socket batches it
  return n;
}

std::size_t udp_link::drain_peer(std::size_t limit, bool* emptied) noexcept {
  // At most `limit` datagrams per poll, as the shared socket's reads: a
  // full buffer of them is not queued all at once.
  std::size_t n = 0;
  bool empty = false;
  for (std::size_t reads = 0, errors = 0; reads < limit; ++reads) {
    const peer_read r = read_peer();
    if (r == peer_read::empty || (r == peer_read::error && ++errors > 4)) {
      empty = true;
      break;
    }
    if (r == peer_read::queued) ++n;
  }
  if (emptied != nullptr) *emptied = empty;
  return n;
}

void udp_link::note_source(const gid& from, std::uint16_t port, bool lone) noexcept {
  if (peer_closing_) return;
  // Reading a peer socket takes no control message: not while the IP
  // fields are wanted (one open before then closes at the next other
  // source or burst).
  if (ip_fields_ && peer_fd_ < 0) return;
  if (peer_fd_ >= 0) {
    if (port != peer_port_ || from != peer_from_) other_source_ = true;
    return;
  }
  if (!lone) return;
  if (port == peer_candidate_port_ && from == peer_candidate_) {
    if (++peer_count_ < peer_after) return;
    peer_count_ = 0;
    if (dev_.pass_now() >= peer_retry_at_) open_peer(from, port);
    return;
  }
  peer_candidate_ = from;
  peer_candidate_port_ = port;
  peer_count_ = 1;
}

void udp_link::open_peer(const gid& from, std::uint16_t port) noexcept {
  // Only in a group whose selector sends the unconnected traffic to the
  // shared and management sockets.
  if (gsi_fd_ < 0) return;
  const int fd = socket_here();
  bool ok = fd >= 0 && set_int(fd, SOL_SOCKET, SO_REUSEPORT, 1) == 0;
  if (ok && v6_) {
    set_int(fd, IPPROTO_UDP, UDP_NO_CHECK6_RX, 1);
    ok = set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1) == 0;
  }
  if (ok) set_receive_buffer(fd, 4 << 20);  // as the shared socket: a burst may start here
  sockaddr_storage ss;
  socklen_t len;
  to_sockaddr(local_, port_, ss, len);
  ok = ok && ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  to_sockaddr(from, port, ss, len);
  ok = ok && ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  if (ok) {
    try {
      dev_.watch_fd_unless_busy(fd);  // a thread that sleeps wakes for its datagrams too
    } catch (...) {
      dev_.forget_fd(fd);  // it may be listed, and its number is reused after the close
      ok = false;
    }
  }
  if (!ok) {
    if (fd >= 0) ::close(fd);
    peer_retry_at_ = deadline_after(dev_.pass_now(), std::chrono::seconds(1));
    return;
  }
  peer_fd_ = fd;
  peer_from_ = from;
  peer_port_ = port;
  peer_streak_ = 0;
  // The next poll reads the shared socket first: what the peer sent before
  // the connect is queued there, ahead of what comes here.
  peer_polls_ = peer_shared_every - 1;
  ++dev_.counters_.peer_sockets;
}

std::size_t udp_link::close_peer() noexcept {
  if (peer_fd_ < 0 || peer_closing_) return 0;
  // Connected to our own address and port instead (where nothing comes
  // from), the kernel picks it no more for the peer's datagrams.  (A
  // disconnect, connect(AF_UNSPEC), does not do that: on Linux 6.18 the
  // disconnected socket still got every datagram of the peer, and the
  // shared socket none.)  One it picked just before may still be on its
  // way into the queue, so it is read on every poll, before the shared
  // socket, and closed (which would drop such a datagram) only at the first
  // empty read `peer_close_time` later.
  sockaddr_storage self;
  socklen_t self_len;
  to_sockaddr(local_, port_, self, self_len);
  if (::connect(peer_fd_, reinterpret_cast<sockaddr*>(&self), self_len) != 0) {
    // Cannot happen (our own address); if it did, close now: a datagram
    // may be lost, which RC recovers.
    const std::size_t n = drain_peer(SIZE_MAX);
    finish_closing_peer();
    return n;
  }
  const auto now = std::chrono::steady_clock::now();
  peer_closing_ = true;
  peer_close_at_ = now + peer_close_time;
  peer_shared_at_ = now + peer_straggle_time;
  peer_count_ = 0;
  return drain_peer();
}

void udp_link::finish_closing_peer() noexcept {
  dev_.forget_fd(peer_fd_);
  closed_peer_drops_ += socket_drops(peer_fd_);
  ::close(peer_fd_);
  peer_fd_ = -1;
  peer_closing_ = false;
}

std::size_t udp_link::receive_shared() noexcept {
  // The kernel hands a GSO run over whole (on loopback and veth it never
  // splits it for a UDP_GRO socket): one datagram of segments of the size
  // the UDP_GRO message says, each a RoCE packet of its own.
  //
  // A poll takes one datagram first.  If it was a run it stops there (15
  // packets at most): a long copy out of the kernel would hold up the
  // management datagrams, which are read between polls (two runs per poll
  // put connection setup under a bulk WRITE at 2.07-2.11x its idle
  // latency, one run at 1.74-1.97x).  Single datagrams (small messages)
  // are cheap to copy: while they keep coming (two polls in a row found
  // one) it goes on with larger reads, as the plain path's recvmmsg of 32
  // does; a ping-pong, whose polls mostly find nothing, pays no second
  // syscall per datagram.  (Those larger reads can hold runs as well, up
  // to one per slot: the kernel does not stop at one; docs/wire.md.)
  //
  // The first datagram's packets keep their payload where it landed (slot
  // 0; the responder copies it once, to its destination): the engine
  // frees every packet it takes off its receive queue or copies its
  // payload out (a request held behind a READ, own_payload()), and polls
  // only when that queue is empty, so nothing still points into slot 0
  // here.
  // Later rounds read into slots 1.. and copy, as they reuse them.
  const bool in_place = dev_.rx_head_ == nullptr;  // always, as the engine polls now
  std::size_t total = 0;
  std::size_t first = in_place ? 0 : 1;
  std::size_t want = 1;
  for (int round = 0; round < 3; ++round) {
    bool runs = false;
    std::size_t longest_run = 1;
    for (std::size_t i = first; i < first + want; ++i) {  // recvmmsg shrinks these
      gro_msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
      gro_msgs_[i].msg_hdr.msg_controllen = gro_control_[i].size();
    }
    int r;
    if (want == 1 && gro_state_ == gro_state::off &&
        !ip_fields_) {  // recvfrom: no header, no control message
      msghdr& h = gro_msgs_[first].msg_hdr;
      const ssize_t len = ::recvfrom(fd_, gro_iov_[first].iov_base, gro_slot_size, MSG_DONTWAIT,
                                     static_cast<sockaddr*>(h.msg_name), &h.msg_namelen);
      h.msg_controllen = 0;
      h.msg_flags = 0;  // the slot holds any UDP datagram whole
      gro_msgs_[first].msg_len = len >= 0 ? static_cast<unsigned>(len) : 0;
      r = len >= 0 ? 1 : -1;
    } else if (want == 1) {  // recvmsg: the cheaper syscall, by about 70 ns
      const ssize_t len = ::recvmsg(fd_, &gro_msgs_[first].msg_hdr, MSG_DONTWAIT);
      gro_msgs_[first].msg_len = len >= 0 ? static_cast<unsigned>(len) : 0;
      r = len >= 0 ? 1 : -1;
    } else {
      r = ::recvmmsg(fd_, gro_msgs_.data() + first, static_cast<unsigned>(want), MSG_DONTWAIT, nullptr);
      if (r >= 2) ++dev_.counters_.receive_batches;
    }
    if (r <= 0) {
      if (round == 0) {
        gro_streak_ = 0;
        // Every datagram queued while UDP_GRO was on has been read (and
        // any a softirq was queuing at the switch, after this long).
        if (gro_state_ == gro_state::draining && dev_.pass_now() >= gro_drained_at_) gro_state_ = gro_state::off;
      }
      return total;
    }
    // Only datagrams that pass the checks switch UDP_GRO back on (a burst,
    // or a run longer than any packet): junk must not shape how the socket
    // is read.  The switch waits for the end of the batch, which was read
    // under the old setting.
    int checked = 0;
    bool long_run = false;
    for (std::size_t i = first; i < first + static_cast<std::size_t>(r); ++i) {
      const msghdr& h = gro_msgs_[i].msg_hdr;
      const std::size_t len = gro_msgs_[i].msg_len;
      gid from;
      std::uint16_t from_port = 0;
      // An empty datagram has no segment to drop one by one below.
      if ((h.msg_flags & MSG_TRUNC) != 0 || len == 0 || !from_sockaddr(rx_from_[i], from, from_port)) {
        ++dev_.counters_.dropped;
        continue;
      }
      std::size_t seg = len;
      const ip_fields ip = control_of(h, seg);  // (one pass over the control messages)
      const std::byte* base = gro_buf_.get() + i * gro_slot_size;
      const bool keep = in_place && i == 0;
      if (seg == len && gro_state_ != gro_state::on) {
        // A run queued as UDP_GRO went off comes whole, and the kernel
        // reports a segment size only while the option is on: the PSNs of
        // its packets tell it (docs/wire.md).  While draining, any datagram
        // may be one; later only one longer than any packet (a ping-pong's
        // datagrams are not searched).
        // One packet whose payload happens to hold what looks like the
        // next packet's header (its P_Key, QP, PSN + 1) is no run: a
        // datagram whose ICRC matches whole, with IPv4 ID 0 (the IDs we
        // cannot see are not solved for here: a run would pass one in
        // 2^16), is taken whole.  (Without the ICRC check there is no
        // telling, docs/wire.md.)
        const std::span<const std::byte> whole(base, len);
        if ((gro_state_ == gro_state::draining || len > packet::buffer_size) &&
            !(len <= packet::buffer_size && check_icrc_ && icrc_exact(whole, from, from_port))) {
          seg = wire::run_segment_size(whole);
          if (seg < len) ++dev_.counters_.gro_runs_unsized;
        }
        if (len > packet::buffer_size && seg == len) {  // longer than any packet, and no run
          ++dev_.counters_.dropped;
          continue;
        }
      }
      if ((len + seg - 1) / seg > max_gro_segments) {
        ++dev_.counters_.dropped;
        continue;
      }
      if (seg < len) {
        ++dev_.counters_.gro_runs;
        runs = true;
        longest_run = std::max(longest_run, (len + seg - 1) / seg);
      }
      std::size_t delivered = 0;
      for (std::size_t off = 0; off < len; off += seg) {
        const std::size_t n = std::min(seg, len - off);
        packet* p = n <= packet::buffer_size ? dev_.alloc_packet() : nullptr;
        if (p == nullptr) {
          ++dev_.counters_.dropped;
          continue;
        }
        if (!keep) std::memcpy(p->buf, base + off, n);
        if (deliver(p, keep ? base + off : p->buf, n, from, from_port, false, ip))
          ++delivered;
        else dev_.free_packet(p);
      }
      total += delivered;
      // Only a source whose datagrams pass the checks shapes how the socket
      // is read (UDP_GRO off, a peer socket): not one that sends junk.
      if (delivered != 0) {
        note_source(from, from_port,
                    gro_state_ == gro_state::off && want == 1 && check_icrc_ && len <= packet::buffer_size);
        ++checked;
        if (len > packet::buffer_size) long_run = true;  // a sender of GSO runs is busy
      }
    }
    if ((long_run || checked >= gro_on_burst) && gro_state_ != gro_state::on)
      set_gro(true);  // bulk: runs pay again
    if (round == 0 && gro_state_ == gro_state::on && check_icrc_) {
      // A ping-pong (one datagram per poll, after a poll that found none;
      // at most a short run now and then, an ACK behind a message) reads
      // faster without UDP_GRO.  Judged over windows of polls that found
      // data: a window with few busy ones switches it off.  A run of two
      // counts (8 KiB messages at a 4 KiB MTU: a poll that reads a run
      // returns before gro_streak_ counts it, so bulk traffic of them
      // looked like a ping-pong and flapped UDP_GRO off and on, hundreds
      // of switches a second, 13 % of the bandwidth).
      if (longest_run >= 2 || gro_streak_ != 0) ++gro_window_busy_;
      if (++gro_window_ == gro_window) {
        if (gro_window_busy_ <= gro_window / 16) set_gro(false);
        gro_window_ = gro_window_busy_ = 0;
      }
    }
    if (static_cast<std::size_t>(r) < want || runs) return total;
    if (round == 0 && ++gro_streak_ < 2) return total;
    first = 1;
    want = gro_slots - 1;
  }
  return total;
}

void udp_link::set_gro(bool on) noexcept {
  gro_window_ = gro_window_busy_ = 0;
  if (set_int(fd_, SOL_UDP, UDP_GRO, on ? 1 : 0) != 0) return;
  ++dev_.counters_.gro_switches;
  if (on) {
    gro_state_ = gro_state::on;
    return;
  }
  gro_state_ = gro_state::draining;
  gro_drained_at_ = deadline_after(dev_.pass_now(), gro_drain_time);
}

std::optional<std::uint32_t> udp_link::icrc_with_id0(std::span<const std::byte> dgram, const gid& from,
                                                     std::uint16_t from_port) noexcept {
  const std::size_t len = dgram.size();
  const std::optional<std::uint32_t> prefix = rx_prefixes_.get(std::as_bytes(std::span(from.raw)), std::as_bytes(std::span(local_.raw)), from_port, port_, len);
  if (!prefix) return std::nullopt;
  auto b = wire::icrc_builder::after_prefix(*prefix);
  b.add(dgram.first(len - wire::icrc_size));
  return b.value();
}

bool udp_link::icrc_ok(std::span<const std::byte> dgram, std::uint32_t icrc, const gid& from,
                       std::uint16_t from_port) noexcept {
  const std::optional<std::uint32_t> with_id0 = icrc_with_id0(dgram, from, from_port);
  if (!with_id0) return false;
  return *with_id0 == icrc ||
         (!v6_ && icrc_matches_id(from, from_port, dgram.size() - wire::icrc_size, *with_id0 ^ icrc));
}

bool udp_link::icrc_exact(std::span<const std::byte> dgram, const gid& from, std::uint16_t from_port) noexcept {
  if (dgram.size() < wire::bth_size + wire::icrc_size) return false;
  const std::optional<std::uint32_t> with_id0 = icrc_with_id0(dgram, from, from_port);
  if (!with_id0) return false;
  const std::uint32_t icrc = wire::load_icrc(dgram.last<wire::icrc_size>());
  if (*with_id0 == icrc) return true;
  // Or with the ID after the last one its source used (a connected
  // socket's count, as our flow sockets number theirs): looked up, not
  // solved for, and nothing learnt.
  if (v6_) return false;
  const rx_flow& f = flow_of(from, from_port);
  return known(f, from, from_port) && next_id_matches(f, dgram.size() - wire::icrc_size, *with_id0 ^ icrc);
}

udp_link::rx_flow& udp_link::flow_of(const gid& from, std::uint16_t from_port) noexcept {
  return rx_flows_[(hash_of(from, from_port) >> 32) % rx_flows_.size()];
}

bool udp_link::known(const rx_flow& f, const gid& from, std::uint16_t from_port) noexcept {
  return f.used && f.port == from_port && f.from == from;
}

// (Only for a length whose tables are cached: solve() caches one only for
// a datagram it can explain, so junk of other lengths from a known source
// evicts nothing.)
bool udp_link::next_id_matches(const rx_flow& f, std::size_t transport_len, std::uint32_t d) noexcept {
  return rx_id_icrc_.cached(transport_len) &&
         rx_id_icrc_.delta(transport_len, static_cast<std::uint16_t>(f.last + 1)) == d;
}

bool udp_link::deliver(packet* p, const std::byte* data, std::size_t len, const gid& from,
                       std::uint16_t from_port, bool front, const ip_fields& ip) noexcept {
  const std::span<const std::byte> dgram(data, len);
  wire::packet_view v;
  if (wire::decode(dgram, true, v) != wire::decode_error::ok) {
    ++dev_.counters_.dropped;
    return false;
  }
  if (check_icrc_ && !icrc_ok(dgram, v.icrc, from, from_port)) {
    ++dev_.counters_.icrc_errors;
    return false;
  }
  const std::uint8_t hlen = v.op->length;
  std::memcpy(p->header.data(), data, hlen);
  p->header_len = hlen;
  p->hdr = v.hdr;
  p->op = v.op;
  p->decoded = true;
  p->payload_len = static_cast<std::uint32_t>(v.payload.size());
  p->segs[0] = {data + hlen, p->payload_len};
  p->nsegs = p->payload_len != 0 ? 1 : 0;
  p->src = from;
  p->dst = local_;
  p->sport = from_port;
  // As the socket reported them once a UD QP exists (UD's GRH shows them),
  // else defaults: a recycled packet must not report the ones it was last
  // sent with.
  p->hop_limit = ip.hop_limit;
  p->tclass = ip.tclass;
  p->flow_label = ip.flow_label;
  p->has_icrc = false;
  p->management = front;
  if (front && is_dreq(v)) {
    // Behind the data: read from the management socket, behind what the
    // data socket holds too (poll_priority); on a peer socket, in order.
    if (holding_dreqs_ && held_dreq_count_ < held_dreqs_.size())
      held_dreqs_[held_dreq_count_++] = p;
    else
      dev_.receive_locked(p);
  } else if (front) {
    dev_.receive_front_locked(p);
  } else {
    dev_.receive_locked(p);
  }
  return true;
}

bool udp_link::icrc_matches_id(const gid& from, std::uint16_t from_port, std::size_t transport_len,
                               std::uint32_t d) noexcept {
  // Senders number IPv4 datagrams three ways: ID 0 (an unconnected socket
  // with DF, or a raw one, as ours), 0..n-1 (the segments of a GSO run
  // from such a socket), or a connected socket's counter, random at
  // first and then one up per datagram.  A receiver that cannot see the
  // ID finds it from the ICRC (solve), and takes it only if it is one of
  // these: an ID near the last one the source used (or its first, or the
  // first after `rx_idle` of silence), so a corrupted datagram passes with
  // odds of about 2^-23 instead of 2^-16.
  constexpr int window = 256;
  const clock::time_point now = dev_.pass_now();
  rx_flow& f = flow_of(from, from_port);
  const bool known = udp_link::known(f, from, from_port);
  // The usual case: the ID after the last one.
  if (known && next_id_matches(f, transport_len, d)) {
    ++f.last;
    f.has_candidate = false;
    f.seen = now;
    return true;
  }
  const std::optional<std::uint16_t> id = rx_id_icrc_.solve(transport_len, d);
  if (!id) return false;
  if (*id < 64) return true;  // a GSO segment
  if (!known || now - f.seen >= rx_idle) {
    // The first numbered datagram from this source (or one whose entry
    // another source took over), or the first after a silence.
    f = rx_flow{from, from_port, *id, 0, true, false, now};
    return true;
  }
  const auto ahead = static_cast<std::int16_t>(*id - f.last);
  if (ahead >= -window && ahead <= window) {
    if (ahead > 0) f.last = *id;
    f.has_candidate = false;
    f.seen = now;
    return true;
  }
  // Far from the source's count: a new socket there (a restarted peer) or
  // a corrupted datagram.  Two in a row that agree are the former.
  const auto after_candidate = static_cast<std::int16_t>(*id - f.candidate);
  if (f.has_candidate && after_candidate > 0 && after_candidate <= window) {
    f.last = *id;
    f.has_candidate = false;
    f.seen = now;
    return true;
  }
  f.candidate = *id;
  f.has_candidate = true;
  return false;
}

}  // namespace averbs::soft
