// SPDX-License-Identifier: MIT
// Soft device: object tables, keys and memory, CQ/SRQ, events, timers,
// packets, the loopback link and the run loop.
#include "core/context_impl.hpp"
#include "soft/engine.hpp"
#include "soft/links.hpp"
#include "soft/splitmix.hpp"
#include "wire/cm.hpp"

#include <averbs/error.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace averbs::soft {

namespace {

std::error_code err(errc e) { return make_error_code(e); }

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// getifaddrs()' list, freed however the caller leaves (a vector growing
// below may throw).
struct ifaddrs_deleter {
  void operator()(ifaddrs* p) const noexcept { ::freeifaddrs(p); }
};
using ifaddrs_list = std::unique_ptr<ifaddrs, ifaddrs_deleter>;

ifaddrs_list host_ifaddrs() {
  ifaddrs* ifa = nullptr;
  if (::getifaddrs(&ifa) != 0) return nullptr;
  return ifaddrs_list(ifa);
}

// The host's addresses as GIDs, IPv4 first (as IPv4-mapped), then IPv6.
std::vector<gid> host_gids() {
  std::vector<gid> v4, v6;
  if (const ifaddrs_list ifa = host_ifaddrs()) {
    for (ifaddrs* i = ifa.get(); i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr) continue;
      gid g;
      if (i->ifa_addr->sa_family == AF_INET) {
        g = gid::from_ipv4(ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr));
        if (std::find(v4.begin(), v4.end(), g) == v4.end()) v4.push_back(g);
      } else if (i->ifa_addr->sa_family == AF_INET6) {
        std::memcpy(g.raw.data(), &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, 16);
        if (std::find(v6.begin(), v6.end(), g) == v6.end()) v6.push_back(g);
      }
    }
  }
  if (v4.empty()) v4.push_back(gid::from_ipv4(0x7F000001));
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

// The MTU of the interface that holds `addr`, or 0 if none does.
unsigned interface_mtu(const gid& addr) {
  unsigned mtu = 0;
  const ifaddrs_list ifa = host_ifaddrs();
  for (ifaddrs* i = ifa.get(); i != nullptr && mtu == 0; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    gid g;
    if (i->ifa_addr->sa_family == AF_INET)
      g = gid::from_ipv4(ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr));
    else if (i->ifa_addr->sa_family == AF_INET6)
      std::memcpy(g.raw.data(), &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, 16);
    else
      continue;
    if (!(g == addr)) continue;
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    ifreq req{};
    std::strncpy(req.ifr_name, i->ifa_name, IFNAMSIZ - 1);
    if (::ioctl(fd, SIOCGIFMTU, &req) == 0 && req.ifr_mtu > 0) mtu = static_cast<unsigned>(req.ifr_mtu);
    ::close(fd);
  }
  return mtu;
}

// The hop limit the kernel's route resolution gives a unicast RoCE
// destination (ib_resolve_eth_dmac): the namespace's default for the
// family, which a fresh socket reports (a route's own hoplimit metric is
// not looked up).  64 if the socket cannot be had.
std::uint8_t default_hop_limit(bool v6) {
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int v = -1;
  socklen_t len = sizeof v;
  if (fd >= 0) {
    if (::getsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_UNICAST_HOPS : IP_TTL, &v, &len) != 0)
      v = -1;
    ::close(fd);
  }
  return v >= 1 && v <= 255 ? static_cast<std::uint8_t>(v) : 64;
}

// The largest IB MTU whose packets fit a link MTU, as rxe chooses it: the
// link must also carry the IP, UDP, BTH and extension headers and the ICRC.
mtu ib_mtu_for(unsigned link_mtu) {
  constexpr unsigned headers = 40 + 8 + 12 + 28 + 4;  // IPv6, UDP, BTH, RETH+AtomicETH-sized, ICRC
  const unsigned room = link_mtu > headers ? link_mtu - headers : 0;
  if (room >= 4096) return mtu::mtu_4096;
  if (room >= 2048) return mtu::mtu_2048;
  if (room >= 1024) return mtu::mtu_1024;
  if (room >= 512) return mtu::mtu_512;
  return mtu::mtu_256;
}

void write_one(int fd) noexcept {
  const std::uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

/// Timer heap entries a device makes room for when it is created.
constexpr std::size_t timer_room = 16;
}  // namespace

std::vector<gid> host_addresses() { return host_gids(); }

void complete_parked(const parked& p, const std::error_code& ec, void* result) noexcept {
  detail::complete_request(*p.ctx, p.id, ec, result);
  detail::context_release(*p.ctx);
}

// ---------------------------------------------------------------------------
// Packets

void packet::own_payload() noexcept {
  if (nsegs == 1 && segs[0].p == buf) return;
  std::uint32_t off = 0;
  for (std::uint8_t i = 0; i < nsegs; ++i) {
    std::memmove(buf + off, segs[i].p, segs[i].len);
    off += segs[i].len;
  }
  segs[0] = {buf, off};
  nsegs = off == 0 ? 0 : 1;
}

packet* device::alloc_packet() noexcept {
  if (free_packets_ == nullptr) {
    try {
      auto p = std::make_unique<packet>();
      auto b = std::make_unique<std::byte[]>(packet::buffer_size);
      // Room in both stores first: a push_back that failed after the
      // packet went on the free list left the list pointing at a packet
      // (or a buffer) the unwinding freed.
      auto room = [](auto& v) {
        if (v.size() == v.capacity()) v.reserve(std::max<std::size_t>(16, 2 * v.capacity()));
      };
      room(packet_store_);
      room(buffer_store_);
      p->buf = b.get();
      p->next = nullptr;
      packet_store_.push_back(std::move(p));  // (no allocation now)
      buffer_store_.push_back(std::move(b));
      free_packets_ = packet_store_.back().get();
    } catch (...) {
      return nullptr;
    }
  }
  packet* p = free_packets_;
  free_packets_ = p->next;
  p->next = nullptr;
  p->nsegs = 0;
  p->payload_len = 0;
  p->run = 1;
  p->decoded = false;
  p->management = false;
  p->overtaken = false;
  p->flow_label = 0;  // only a link that reads one sets it
  return p;
}

void device::free_packet(packet* p) noexcept {
  p->next = free_packets_;
  free_packets_ = p;
}

/// The in-process link: a packet addressed to one of this device's GIDs is
/// queued on its receive queue; anything else has no route and is dropped.
/// ICRCs are computed and checked only while corrupting faults are set
/// (nothing else can damage a packet in memory).
class loopback_link final : public link {
 public:
  explicit loopback_link(device& d) : dev_(d) {}
  void send(packet* p) noexcept override {
    std::uint32_t idx;
    if (!dev_.find_gid(p->dst, idx)) {
      ++dev_.counters_.dropped;
      dev_.free_packet(p);
      return;
    }
    if (p->has_icrc && !dev_.verify_icrc(p, p->sport, wire::roce_udp_port)) {
      ++dev_.counters_.icrc_errors;
      dev_.free_packet(p);
      return;
    }
    dev_.receive_locked(p);
  }
  bool wants_icrc() const noexcept override { return check_; }
  // A run is placed by the responder in one copy; 64 MTUs (256 KiB at
  // 4096) amortise the per-packet work of the engine to almost nothing
  // against the copy.  An ICRC covers one wire packet, so none while
  // checking.
  std::uint16_t max_run() const noexcept override { return check_ ? 1 : 64; }
  bool check_ = false;

 private:
  device& dev_;
};

void device::receive_locked(packet* p) {
  if (p->management) ++mads_queued_;
  p->next = nullptr;
  if (rx_tail_ != nullptr) rx_tail_->next = p;
  else rx_head_ = p;
  rx_tail_ = p;
}

void device::receive_front_locked(packet* p) {
  // Ahead of the data, behind the management datagrams still queued: they
  // keep their order (an RTU must not fall behind the DREQ that follows it).
  if (p->management) ++mads_queued_;
  packet*& at = rx_front_last_ != nullptr ? rx_front_last_->next : rx_head_;
  p->next = at;
  at = p;
  if (p->next == nullptr) rx_tail_ = p;
  rx_front_last_ = p;
}

// A port that is not ACTIVE (soft_device::set_port_state: a cable pulled)
// carries nothing either way: RC finds out by its retry timer, as on a
// link that went down.
bool device::port_carries(packet* p) noexcept {
  if (port_state_ == port_state::active) return true;
  ++counters_.dropped;
  free_packet(p);
  return false;
}

void device::transmit(packet* p) noexcept {
  if (!port_carries(p)) return;
  counters_.packets_sent += p->run;
  counters_.bytes_sent += p->payload_len;
  if (link_->wants_icrc()) compute_icrc(p);
  else p->has_icrc = false;
  link_->send(p);
}

namespace {
constexpr std::byte zero_pad[4] = {};
}  // namespace

// The ICRC of the packet as it goes on the wire with these UDP ports (IPv4
// ID 0).  TOS and TTL are masked out of the ICRC, so the packet's own play
// no part.  A packet that can have no IP headers (mixed address families:
// the UDP link drops it, the in-process link carries it) has an ICRC of
// its transport bytes alone.
std::uint32_t device::icrc_of(const packet* p, std::uint16_t sport, std::uint16_t dport) noexcept {
  static const std::uint32_t no_headers = wire::icrc_prefix({});
  const std::size_t transport = p->header_len + p->payload_len + wire::pad_for(p->payload_len) + wire::icrc_size;
  const auto prefix = icrc_prefixes_.get(std::as_bytes(std::span(p->src.raw)), std::as_bytes(std::span(p->dst.raw)), sport, dport, transport);
  auto b = wire::icrc_builder::after_prefix(prefix.value_or(no_headers));
  b.add(std::span(p->header.data(), p->header_len));
  for (std::uint8_t i = 0; i < p->nsegs; ++i) b.add(std::span(p->segs[i].p, p->segs[i].len));
  b.add(std::span(zero_pad, wire::pad_for(p->payload_len)));
  return b.value();
}

void device::compute_icrc(packet* p) noexcept {
  p->icrc = icrc_of(p, link_->wire_src_port(*p), link_->wire_dst_port());
  p->has_icrc = true;
}

bool device::verify_icrc(const packet* p, std::uint16_t src_port, std::uint16_t dst_port) noexcept {
  return icrc_of(p, src_port, dst_port) == p->icrc;
}

void device::set_faults(const fault_config& f) {
  std::lock_guard lock(lock_);
  if (!f.any()) {
    link_ = base_link_.get();
    faults_.reset();
  } else {
    faults_ = std::make_unique<fault_link>(*this, *base_link_, f);
    link_ = faults_.get();
  }
  if (auto* lb = dynamic_cast<loopback_link*>(base_link_.get())) lb->check_ = f.corrupt > 0;
}

std::uint16_t device::udp_port() const noexcept {
  auto* u = dynamic_cast<udp_link*>(base_link_.get());
  return u != nullptr ? u->port() : 0;
}

void device::watch_fd_unless_busy(int fd) {
  std::lock_guard lock(sleep_mu_);
  sleep_fds_.push_back(fd);
  if (fds_watched_.load(std::memory_order_relaxed)) watch_fd(fd);
}

void device::forget_fd(int fd) noexcept {
  std::lock_guard lock(sleep_mu_);
  std::erase(sleep_fds_, fd);
  if (fds_watched_.load(std::memory_order_relaxed)) ::epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
}

void device::sleeping(bool armed) noexcept {
  std::lock_guard lock(sleep_mu_);
  if (!armed) {
    --sleepers_;
    return;  // stay watched a while: a thread that slept once may again soon
  }
  ++sleepers_;
  watch_locked();
}

void device::watch_locked() noexcept {
  busy_passes_.store(0, std::memory_order_relaxed);
  if (fds_watched_.load(std::memory_order_relaxed)) return;
  // Adding a socket that already holds data makes ep_ readable at once, so
  // nothing that arrived while it was out of the set is missed.
  for (int fd : sleep_fds_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
  }
  fds_watched_.store(true, std::memory_order_relaxed);
  if (timer_fd_stale_) {
    timer_fd_stale_ = false;
    if (timer_fd_wanted_ != clock::time_point::max()) set_timer_fd(timer_fd_wanted_);
  }
}

void device::unwatch_if_busy() noexcept {
  // Only a data path that keeps polling without anyone sleeping gets here
  // often; then the sockets leave the epoll set, and their per-datagram
  // wake-up callbacks with them.
  if (!fds_watched_.load(std::memory_order_relaxed)) return;
  if (busy_passes_.fetch_add(1, std::memory_order_relaxed) < 4096) return;
  {
    std::lock_guard lock(sleep_mu_);
    if (sleepers_ != 0) return;
    for (int fd : sleep_fds_) ::epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
    fds_watched_.store(false, std::memory_order_relaxed);
  }
  // A program with its own event loop may wait on native_handle() next,
  // without our wait path (so without sleeping()): the pending descriptor
  // keeps ep_ readable until progress() puts the sockets back.
  signal_pending();
}

void device::watch_fd(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) != 0)
    throw std::system_error(errno, std::system_category(), "epoll_ctl");
}

// ---------------------------------------------------------------------------
// Construction and queries

device::device(const device_config& cfg)
    : name_(cfg.name),
      clock_(cfg.clock != nullptr ? cfg.clock : &steady_clock::instance()),
      // A UDP device's GUID also names its address, so two processes that
      // each call their device "udp0" still differ (the CM keys
      // connections by CA GUID).
      node_guid_(cfg.node_guid != 0 ? cfg.node_guid
                                    : ((fnv1a(cfg.name + (cfg.address.is_zero() ? std::string()
                                                                               : "@" + cfg.address.to_string() + ":" +
                                                                                     std::to_string(cfg.port))) &
                                        0x00FFFFFFFFFFFFFFull) |
                                       0x0200000000000000ull)),
      gids_(!cfg.address.is_zero() ? std::vector<gid>{cfg.address}
            : cfg.gids.empty()    ? host_gids()
                                  : cfg.gids) {
  if (cfg.first_qpn != 0) {
    if (cfg.first_qpn < limits::qpn_base || cfg.first_qpn > limits::qpn_first_max)
      throw std::system_error(make_error_code(errc::invalid_argument), "soft device first QPN");
    first_qpn_ = cfg.first_qpn;
  } else {
    first_qpn_ = limits::qpn_base + std::random_device{}() % (limits::qpn_first_max - limits::qpn_base + 1);
  }
  {
    std::random_device rd;
    key_random_ = (std::uint64_t{rd()} << 32) ^ rd();  // memory keys' bytes (alloc_key)
  }
  hop_limit_v4_ = default_hop_limit(false);
  hop_limit_v6_ = default_hop_limit(true);
  ep_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep_ < 0) throw std::system_error(errno, std::system_category(), "epoll_create1");
  clock_is_steady_ = dynamic_cast<const steady_clock*>(clock_) != nullptr;
  if (clock_->is_real_time()) {
    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  } else {
    timer_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  if (timer_fd_ < 0) {
    ::close(ep_);
    throw std::system_error(errno, std::system_category(), "soft device timer");
  }
  pending_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (pending_fd_ < 0) {
    ::close(timer_fd_);
    ::close(ep_);
    throw std::system_error(errno, std::system_category(), "soft device eventfd");
  }
  try {
    watch_fd(timer_fd_);
    watch_fd(pending_fd_);
    if (!cfg.address.is_zero()) {
      if (const unsigned m = interface_mtu(cfg.address); m != 0) active_mtu_ = ib_mtu_for(m);
      base_link_ = std::make_unique<udp_link>(*this, cfg);
      busy_poll_ = true;  // waits spin on the socket before sleeping on it
      ack_defer_ = true;
      yield_ = true;
    } else {
      base_link_ = std::make_unique<loopback_link>(*this);
    }
    link_ = base_link_.get();
    if (cfg.faults.any()) set_faults(cfg.faults);
    gsi_ = make_cm_agent(*this);
    gsi_psn_ = static_cast<std::uint32_t>(node_guid_) & wire::psn_mask;
    // Room in the timer heap for the device's own timers (held and lazy
    // ACKs, delayed packets) and a few QPs' (retransmit, tail probe), so a
    // small device schedules them without allocating.  It grows beyond;
    // a schedule that finds no memory there is handled where it happens.
    // (What may throw comes before the clock holds a pointer to us.)
    timers_.reserve(timer_room);
    keys_.resize(1);  // key index 0 is never used: lkey 0 is invalid
    pds_.resize(1);
    ahs_.resize(1);
    cqs_.resize(1);
    srqs_.resize(1);
  } catch (...) {
    // Whatever failed, the descriptors go too (the links first: they
    // may still name them).
    gsi_.reset();
    link_ = nullptr;
    faults_.reset();
    base_link_.reset();
    ::close(pending_fd_);
    ::close(timer_fd_);
    ::close(ep_);
    throw;
  }
  clock_->subscribe(*this);
}

device::~device() {
  {
    std::lock_guard lock(lock_);
    flush_acks();  // held acknowledgements are owed to the peers
    for (qp_t* qp : lazy_acks_) flush_ack(qp);
    lazy_acks_.clear();
    link_->flush();
    gsi_.reset();
  }
  graveyard_.clear();
  clock_->unsubscribe(*this);
  faults_.reset();
  base_link_.reset();
  ::close(pending_fd_);
  ::close(timer_fd_);
  ::close(ep_);
}

device_attr device::query_device() const {
  device_attr a;
  a.fw_ver = "0.1.0";
  a.node_guid = node_guid_;
  a.sys_image_guid = node_guid_;
  a.max_mr_size = limits::max_mr_size;
  a.page_size_cap = limits::page_size_cap;
  a.vendor_id = limits::vendor_id;
  a.vendor_part_id = 0;
  a.hw_ver = 0;
  a.max_qp = limits::max_qp;
  a.max_qp_wr = limits::max_qp_wr;
  a.device_cap_flags = limits::device_cap_flags;
  a.device_cap_flags_ex = limits::device_cap_flags | device_cap_atomic_write;
  a.max_sge = limits::max_sge;
  a.max_sge_rd = limits::max_sge_rd;
  a.max_cq = limits::max_cq;
  a.max_cqe = limits::max_cqe;
  a.max_mr = limits::max_mr;
  a.max_pd = limits::max_pd;
  a.max_qp_rd_atom = limits::max_qp_rd_atom;
  a.max_res_rd_atom = limits::max_res_rd_atom;
  a.max_qp_init_rd_atom = limits::max_qp_rd_atom;
  a.atomic_cap = 1;  // IBV_ATOMIC_HCA
  a.max_mw = limits::max_mw;
  a.max_ah = limits::max_ah;
  a.max_srq = limits::max_srq;
  a.max_srq_wr = limits::max_srq_wr;
  a.max_srq_sge = limits::max_srq_sge;
  a.max_pkeys = limits::pkey_table_len;
  a.max_mcast_grp = 0;
  a.local_ca_ack_delay = limits::local_ca_ack_delay;
  a.phys_port_cnt = 1;
  a.max_inline_data = limits::max_inline_data;
  return a;
}

std::error_code device::query_port(std::uint8_t port, port_attr& out) const {
  if (port != 1) return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  out = port_attr{};
  out.state = port_state_;
  out.max_mtu = mtu::mtu_4096;
  out.active_mtu = active_mtu_;
  out.gid_tbl_len = limits::gid_table_len;
  out.port_cap_flags = 0x00010000 /* IBV_PORT_CM_SUP */ | 0x04000000 /* IP_BASED_GIDS */;
  out.max_msg_sz = limits::max_msg_size;
  out.pkey_tbl_len = limits::pkey_table_len;
  out.max_vl_num = 1;
  out.active_width = 1;   // 1X
  out.active_speed = 32;  // EDR-like, as rxe reports for fast links
  out.phys_state = port_state_ == port_state::active ? 5 /* LINK_UP */ : 3 /* DISABLED */;
  out.link_layer = averbs::link_layer::ethernet;
  out.bad_pkey_cntr = bad_pkey_cntr_;
  out.qkey_viol_cntr = qkey_viol_cntr_;
  return {};
}

std::error_code device::query_gid(std::uint8_t port, std::uint32_t index, gid& out) const {
  if (port != 1 || index >= limits::gid_table_len) return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  out = index < gids_.size() ? gids_[index] : gid{};
  return {};
}

std::error_code device::query_pkey(std::uint8_t port, std::uint16_t index, std::uint16_t& out) const {
  if (port != 1 || index >= limits::pkey_table_len) return err(errc::invalid_argument);
  out = wire::default_pkey;
  return {};
}

std::vector<gid> device::gids() const {
  std::lock_guard lock(lock_);
  return gids_;
}

bool device::find_gid(const gid& g, std::uint32_t& index) const {
  const std::uint32_t n = static_cast<std::uint32_t>(gids_.size());
  for (std::uint32_t i = 0; i < n; ++i) {
    if (gids_[i] == g) {
      index = i;
      return true;
    }
  }
  return false;
}

bool device::send_blocked() const {
  std::lock_guard lock(lock_);
  return link_->send_blocked();
}

device_counters device::counters() const {
  std::lock_guard lock(lock_);
  device_counters c = counters_;
  c.packet_buffers = packet_store_.size();
  c.memory_keys = keys_.size() - 1 - free_count_;  // (index 0 is reserved: no key is 0)
  c.receive_overflows = link_->receive_overflows();
  c.timers = timers_.size();
  return c;
}

// ---------------------------------------------------------------------------
// Table helpers

namespace {

template <class T>
std::uint32_t take_slot(std::vector<std::unique_ptr<T>>& table, std::vector<std::uint32_t>& free_list) {
  if (!free_list.empty()) {
    const std::uint32_t i = free_list.back();
    free_list.pop_back();
    return i;
  }
  table.emplace_back();
  return static_cast<std::uint32_t>(table.size() - 1);
}

// Grows `table` to hold `index`; false, unchanged, without the memory.
template <class T>
bool make_room(std::vector<std::unique_ptr<T>>& table, std::uint32_t index) noexcept {
  try {
    if (table.size() <= index) table.resize(index + 1);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// PD

std::error_code device::alloc_pd(event_channel* events, pd_t*& out) {
  std::lock_guard lock(lock_);
  if (live_pds_ >= limits::max_pd) return err(errc::no_resources);
  auto pd = std::make_unique<pd_t>();  // before the slot: a bad_alloc loses none
  pd->events = events;
  const std::uint32_t i = take_slot(pds_, free_pds_);
  pd->handle = i;
  out = pd.get();
  pds_[i] = std::move(pd);
  ++live_pds_;
  return {};
}

std::error_code device::dealloc_pd(pd_t* pd) {
  std::lock_guard lock(lock_);
  if (pd->children != 0) return err(errc::busy);
  const std::uint32_t i = pd->handle;
  pds_[i].reset();
  free_slot(free_pds_, i);
  --live_pds_;
  return {};
}

void device::release_pd(pd_t* pd) noexcept {
  std::lock_guard lock(lock_);
  if (pd->children != 0) {
    pd->released = true;  // freed with its last child
    return;
  }
  const std::uint32_t i = pd->handle;
  pds_[i].reset();
  free_slot(free_pds_, i);
  --live_pds_;
}

void device::drop_pd_child(pd_t* pd) noexcept {
  if (--pd->children == 0 && pd->released) {
    const std::uint32_t i = pd->handle;  // (read before the PD is freed)
    pds_[i].reset();
    free_slot(free_pds_, i);
    --live_pds_;
  }
}

// ---------------------------------------------------------------------------
// Keys: key = index << 8 | key byte.  A freed index waits in a FIFO until
// limits::key_reuse_distance others are free, then comes back with a new
// random byte (never 0, never the last one); a type-2 window bind sets the
// byte the consumer chose.  So an old key stops working at once, and a
// stale key meets a later region only by a 1-in-255 draw after more than
// a thousand other registrations (rxe: a random byte, indices in turn).

std::uint32_t device::alloc_key(key_entry::kind k, void* obj) noexcept {
  std::uint32_t index;
  const bool can_grow = keys_.size() < (1u << 24);
  if (free_count_ != 0 && (free_count_ > limits::key_reuse_distance || !can_grow)) {
    index = free_keys_[free_head_];
    free_head_ = (free_head_ + 1) % free_keys_.size();
    --free_count_;
  } else {
    if (!can_grow) return 0;
    try {
      // free_key() must not allocate: a ring with room for every index.
      if (free_keys_.size() <= keys_.size()) {
        std::vector<std::uint32_t> ring(std::max<std::size_t>(64, 2 * keys_.size()));
        for (std::size_t i = 0; i < free_count_; ++i)
          ring[i] = free_keys_[(free_head_ + i) % free_keys_.size()];
        free_keys_.swap(ring);
        free_head_ = 0;
      }
      keys_.emplace_back();
    } catch (const std::bad_alloc&) {
      return 0;  // no resources, as the callers say
    }
    index = static_cast<std::uint32_t>(keys_.size() - 1);
  }
  key_entry& e = keys_[index];
  e.type = k;
  e.obj = obj;
  std::uint8_t byte;
  do {
    byte = static_cast<std::uint8_t>(splitmix_next(key_random_));
  } while (byte == 0 || byte == e.key);
  e.key = byte;
  return (index << 8) | e.key;
}

void device::free_key(std::uint32_t key) noexcept {
  const std::uint32_t index = key >> 8;
  keys_[index].type = key_entry::kind::free;
  keys_[index].obj = nullptr;
  free_keys_[(free_head_ + free_count_) % free_keys_.size()] = index;
  ++free_count_;
}

mr_t* device::find_mr(std::uint32_t lkey) noexcept {
  const std::uint32_t index = lkey >> 8;
  if (index >= keys_.size()) return nullptr;
  const key_entry& e = keys_[index];
  if (e.type != key_entry::kind::mr || e.key != (lkey & 0xFF)) return nullptr;
  return static_cast<mr_t*>(e.obj);
}

mr_t* device::lookup_lkey(pd_t* pd, std::uint32_t lkey) noexcept {
  mr_t* mr = find_mr(lkey);
  return mr != nullptr && mr->pd == pd ? mr : nullptr;
}

bool device::resolve_rkey(qp_t* qp, std::uint32_t rkey, std::uint64_t va, std::uint64_t len,
                          std::uint32_t need, std::byte*& host, std::uint64_t& addr) noexcept {
  const std::uint32_t index = rkey >> 8;
  if (index >= keys_.size()) return false;
  const key_entry& e = keys_[index];
  if (e.key != (rkey & 0xFF)) return false;
  mr_t* mr;
  std::uint64_t base, length, offset;
  std::uint32_t access;
  if (e.type == key_entry::kind::mr) {
    mr = static_cast<mr_t*>(e.obj);
    if (mr->rkey != rkey || mr->pd != qp->pd) return false;
    base = mr->iova;
    length = mr->length;
    offset = 0;
    access = mr->access;
  } else if (e.type == key_entry::kind::mw) {
    auto* mw = static_cast<mw_t*>(e.obj);
    if (mw->state != mw_state::valid || mw->rkey != rkey || mw->pd != qp->pd) return false;
    // A type-2 window is usable only through the QP it was bound with.
    if (mw->type == mw_type::type2 && mw->qp != qp) return false;
    mr = mw->mr;
    base = mw->addr;
    length = mw->length;
    offset = mw->mr_offset;
    access = mw->access;
  } else {
    return false;
  }
  if ((access & need) != need) return false;
  if (va < base || len > length || va - base > length - len) return false;
  const std::uint64_t host_addr = mr->host_addr + offset + (va - base);
  addr = host_addr;
  host = mr->host != nullptr ? mr->host + offset + (va - base) : mem_->map(host_addr, len);
  return true;
}

// ---------------------------------------------------------------------------
// MR

namespace {

// The access flags of a region, at registration or re-registration, as the
// kernel's ib_check_mr_access() has them: bits it does not know are
// invalid_argument; the optional range (bits 20-29, relaxed ordering among
// them) and the huge-page hint are accepted and need nothing here; on-demand
// paging and the FLUSH targets (bits 8-9, IBTA 1.5's persistent memory)
// are real requests we cannot honour (EOPNOTSUPP, as the kernel answers a
// device without flush support).
std::error_code check_mr_access(std::uint32_t access) {
  // IBTA 10.6.3.1: remote write or atomic access needs local write.
  if ((access & (access_remote_write | access_remote_atomic)) != 0 && (access & access_local_write) == 0)
    return make_error_code(errc::invalid_argument);
  constexpr std::uint32_t optional_range = 0x3FF00000u;  // IBV_ACCESS_OPTIONAL_RANGE
  constexpr std::uint32_t flush = 3u << 8;  // IBV_ACCESS_FLUSH_GLOBAL, _PERSISTENT
  constexpr std::uint32_t known = ((access_hugetlb << 1) - 1) | flush | optional_range;
  if ((access & ~known) != 0) return make_error_code(errc::invalid_argument);
  if ((access & (access_on_demand | flush)) != 0) return make_error_code(errc::not_supported);
  return {};
}

// The pages must be writable for these (the kernel's ib_access_writable():
// a window bound in the region may grant remote write).
bool writable_access(std::uint32_t access) {
  return (access & (access_local_write | access_remote_write | access_remote_atomic | access_mw_bind)) != 0;
}

}  // namespace

std::error_code device::reg_mr(pd_t* pd, std::uint64_t addr, std::uint64_t length, std::uint32_t access,
                               mr_t*& out) {
  if (auto ec = check_mr_access(access)) return ec;
  if (length == 0) return err(errc::invalid_argument);  // ib_umem_get: no pages
  if (addr + length < addr) return err(errc::invalid_argument);
  if (auto ec = mem_->check(addr, length, writable_access(access))) return ec;
  std::lock_guard lock(lock_);
  if (live_mrs_ >= limits::max_mr) return err(errc::no_resources);
  auto mr = std::make_unique<mr_t>();
  mr->pd = pd;
  mr->host_addr = addr;
  mr->length = length;
  mr->iova = (access & access_zero_based) != 0 ? 0 : addr;
  mr->access = access;
  mr->host = mem_->map(addr, length);
  const std::uint32_t key = alloc_key(key_entry::kind::mr, mr.get());
  if (key == 0) return err(errc::no_resources);
  mr->lkey = key;
  mr->rkey = key;
  const std::uint32_t index = key >> 8;
  if (!make_room(mrs_, index)) {
    free_key(key);  // else it would name the region freed on return
    return err(errc::no_resources);
  }
  out = mr.get();
  mrs_[index] = std::move(mr);
  ++pd->children;
  ++live_mrs_;
  return {};
}

std::error_code device::rereg_mr(mr_t* mr, int flags, pd_t* pd, std::uint64_t addr, std::uint64_t length,
                                 std::uint32_t access) {
  constexpr int change_translation = 1, change_pd = 2, change_access = 4;
  if (flags == 0 || (flags & ~(change_translation | change_pd | change_access)) != 0)
    return err(errc::invalid_argument);
  // libibverbs' ibv_rereg_mr(): access flags without CHANGE_ACCESS, or a
  // new translation without an address, are EINVAL.
  if ((flags & change_access) == 0 && access != 0) return err(errc::invalid_argument);
  if ((flags & change_translation) != 0 && addr == 0) return err(errc::invalid_argument);
  const std::uint32_t new_access = (flags & change_access) != 0 ? access : mr->access;
  if (auto ec = check_mr_access(new_access)) return ec;
  if ((flags & change_translation) != 0 && (length == 0 || addr + length < addr))
    return err(errc::invalid_argument);
  if ((flags & (change_translation | change_access)) != 0) {
    // The pages must be there with the access the region will have.
    const std::uint64_t a = (flags & change_translation) != 0 ? addr : mr->host_addr;
    const std::uint64_t n = (flags & change_translation) != 0 ? length : mr->length;
    if (auto ec = mem_->check(a, n, writable_access(new_access))) return ec;
  }
  std::lock_guard lock(lock_);
  if (mr->bound_mws != 0) return err(errc::invalid_state);
  // The new keys first: a region that cannot have them stays as it was.
  const std::uint32_t key = alloc_key(key_entry::kind::mr, mr);
  if (key == 0) return err(errc::no_resources);
  const std::uint32_t old_index = mr->lkey >> 8, index = key >> 8;
  if (!make_room(mrs_, index)) {
    free_key(key);
    return err(errc::no_resources);
  }
  if ((flags & change_pd) != 0 && pd != mr->pd) {
    drop_pd_child(mr->pd);
    mr->pd = pd;
    ++pd->children;
  }
  if ((flags & change_translation) != 0) {
    mr->host_addr = addr;
    mr->length = length;
    mr->host = mem_->map(addr, length);
  }
  mr->access = new_access;
  mr->iova = (mr->access & access_zero_based) != 0 ? 0 : mr->host_addr;
  // A re-registered region gets new keys (the kernel's rereg may; mlx5
  // does; rxe keeps them, supporting PD and access changes only).
  free_key(mr->lkey);
  if (index != old_index) mrs_[index] = std::move(mrs_[old_index]);
  mr->lkey = mr->rkey = key;
  return {};
}

std::error_code device::dereg_mr(mr_t* mr) {
  std::lock_guard lock(lock_);
  return dereg_mr_locked(mr);
}

std::error_code device::dereg_mr_locked(mr_t* mr) noexcept {
  // IBA 10.6.7.2.6: a region with bound windows cannot be deregistered
  // (rxe answers EINVAL).
  if (mr->bound_mws != 0) return err(errc::invalid_state);
  pd_t* pd = mr->pd;
  const std::uint32_t index = mr->lkey >> 8;
  free_key(mr->lkey);
  mrs_[index].reset();
  --live_mrs_;
  drop_pd_child(pd);
  return {};
}

void device::release_mr(mr_t* mr) noexcept {
  // One locked section: a bind executed by another thread's poll between
  // the unbinding and the free would leave a window on freed memory.
  std::lock_guard lock(lock_);
  if (mr->bound_mws != 0) {
    for (auto& w : mws_) {
      if (w != nullptr && w->mr == mr) {
        w->state = mw_state::free;
        w->mr = nullptr;
      }
    }
    mr->bound_mws = 0;
  }
  (void)dereg_mr_locked(mr);  // cannot fail with no window bound
}

// ---------------------------------------------------------------------------
// MW

std::error_code device::alloc_mw(pd_t* pd, mw_type type, mw_t*& out) {
  if (type != mw_type::type1 && type != mw_type::type2) return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  if (live_mws_ >= limits::max_mw) return err(errc::no_resources);
  auto mw = std::make_unique<mw_t>();
  mw->pd = pd;
  mw->type = type;
  const std::uint32_t key = alloc_key(key_entry::kind::mw, mw.get());
  if (key == 0) return err(errc::no_resources);
  mw->rkey = key;
  mw->posted_rkey = key;
  mw->handle = key >> 8;
  mw->gen = ++mw_gen_;
  if (!make_room(mws_, mw->handle)) {
    free_key(key);
    return err(errc::no_resources);
  }
  out = mw.get();
  mws_[mw->handle] = std::move(mw);
  ++pd->children;
  ++live_mws_;
  return {};
}

std::uint32_t device::mw_rkey(mw_t* mw) const {
  std::lock_guard lock(lock_);
  // A type-1 window shows the key of its last posted bind at once, as
  // libibverbs' ibv_bind_mw() updates mw->rkey when it posts.
  return mw->type == mw_type::type1 ? mw->posted_rkey : mw->rkey;
}

std::error_code device::dealloc_mw(mw_t* mw) {
  std::lock_guard lock(lock_);
  if (mw->state == mw_state::valid && mw->mr != nullptr) --mw->mr->bound_mws;
  pd_t* pd = mw->pd;
  const std::uint32_t index = mw->handle;
  free_key(mw->rkey);
  mws_[index].reset();
  --live_mws_;
  drop_pd_child(pd);
  return {};
}

// IBTA 10.6.7.2.2 / rxe_mw.c: what binding a window requires.  Must hold lock_.
std::error_code device::bind_mw(qp_t* qp, send_wqe* w) noexcept {
  const std::uint32_t index = w->mw;
  if (index >= mws_.size() || mws_[index] == nullptr) return make_error_code(wc_status::mw_bind_err);
  mw_t* mw = mws_[index].get();
  // The window the bind was posted for: deallocated since, its slot may
  // hold another (rxe compares the WQE's full key for the same reason).
  if (mw->gen != w->mw_gen) return make_error_code(wc_status::mw_bind_err);
  const auto want = static_cast<mw_type>(w->mw_type);
  if (mw->type != want || mw->pd != qp->pd) return make_error_code(wc_status::mw_bind_err);
  if (want == mw_type::type1 && (w->bind_access & access_zero_based) != 0)
    return make_error_code(wc_status::mw_bind_err);  // o10-36.2.2 (bind_mw1 refuses it first)
  if (want == mw_type::type2) {
    // The new key keeps the index and changes the key byte; a valid type-2
    // window must be invalidated before it is bound again.
    if ((w->bind_rkey >> 8) != (mw->rkey >> 8) || w->bind_rkey == mw->rkey || mw->state == mw_state::valid)
      return make_error_code(wc_status::mw_bind_err);
    // Nor is it bound to nothing: a zero-length bind would pin the region
    // (bound_mws) with no range to grant (o10-37.2.40, as rxe).
    if (w->bind_length == 0) return make_error_code(wc_status::mw_bind_err);
  }
  const std::uint32_t remote = access_remote_write | access_remote_read | access_remote_atomic;
  mr_t* mr = nullptr;
  if (w->bind_length != 0 || want == mw_type::type2) {
    mr = lookup_lkey(qp->pd, w->bind_lkey);
    if (mr == nullptr) return make_error_code(wc_status::mw_bind_err);
    if ((mr->access & access_mw_bind) == 0) return make_error_code(wc_status::mw_bind_err);
    // A window may not grant remote write or atomic on a region without local write.
    if ((w->bind_access & (access_remote_write | access_remote_atomic)) != 0 &&
        (mr->access & access_local_write) == 0)
      return make_error_code(wc_status::mw_bind_err);
    if ((mr->access & access_zero_based) != 0) return make_error_code(wc_status::mw_bind_err);
    if (w->bind_addr < mr->iova || w->bind_length > mr->length ||
        w->bind_addr - mr->iova > mr->length - w->bind_length)
      return make_error_code(wc_status::mw_bind_err);
  }
  if (mw->state == mw_state::valid && mw->mr != nullptr) --mw->mr->bound_mws;
  if (w->bind_length == 0 && want == mw_type::type1) {
    // A zero-length type-1 bind unbinds the window (IBTA 10.6.7.2.4).
    mw->state = mw_state::free;
    mw->mr = nullptr;
    mw->length = 0;
    const auto byte = static_cast<std::uint8_t>(w->bind_rkey & 0xFF);  // the key bind_mw handed out
    mw->rkey = (mw->rkey & ~0xFFu) | byte;
    keys_[index].key = byte;
    return {};
  }
  mw->mr = mr;
  ++mr->bound_mws;
  mw->access = w->bind_access & (remote | access_zero_based);
  mw->length = w->bind_length;
  mw->mr_offset = w->bind_addr - mr->iova;
  mw->addr = (w->bind_access & access_zero_based) != 0 ? 0 : w->bind_addr;
  mw->state = mw_state::valid;
  mw->qp = want == mw_type::type2 ? qp : nullptr;
  const auto byte = static_cast<std::uint8_t>(w->bind_rkey & 0xFF);
  mw->rkey = (mw->rkey & ~0xFFu) | byte;
  keys_[index].key = byte;
  return {};
}

std::error_code device::invalidate_rkey(pd_t* pd, std::uint32_t rkey, qp_t* qp, bool remote) noexcept {
  const std::uint32_t index = rkey >> 8;
  if (index >= keys_.size()) return make_error_code(wc_status::mw_bind_err);
  key_entry& e = keys_[index];
  if (e.key != (rkey & 0xFF)) return make_error_code(wc_status::mw_bind_err);
  if (e.type == key_entry::kind::mw) {
    auto* mw = static_cast<mw_t*>(e.obj);
    // Only type-2 windows are invalidated by key (IBTA 10.6.7.3).
    if (mw->type != mw_type::type2 || mw->pd != pd || mw->state != mw_state::valid)
      return make_error_code(wc_status::mw_bind_err);
    // A SEND with Invalidate names a type-2 window of the QP it arrives on
    // (the type 2B association, which its access is checked against too):
    // a peer of another connection cannot revoke it.  (rxe checks only the
    // window's state and type.)
    if (remote && mw->qp != qp) return make_error_code(wc_status::mw_bind_err);
    mw->state = mw_state::free;
    if (mw->mr != nullptr) --mw->mr->bound_mws;
    mw->mr = nullptr;
    return {};
  }
  // Plain MRs (not fast-registration) cannot be invalidated.
  return make_error_code(wc_status::mw_bind_err);
}

// ---------------------------------------------------------------------------
// AH

std::error_code device::create_ah(pd_t* pd, const ah_attr& attr, ah_t*& out) {
  // No multicast here (max_mcast_grp 0): a send to a group would leave as
  // an IP multicast datagram through whatever route the host has for it.
  if (attr.is_global && attr.grh.dgid.is_group()) return err(errc::not_supported);
  if (!valid_av(attr)) return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  if (live_ahs_ >= limits::max_ah) return err(errc::no_resources);
  auto ah = std::make_unique<ah_t>();  // before the slot: a bad_alloc loses none
  ah->pd = pd;
  ah->attr = attr;
  ah->attr.grh.hop_limit = route_hop_limit(attr.grh.dgid);
  ah->sgid = gids_[attr.grh.sgid_index];
  const std::uint32_t i = take_slot(ahs_, free_ahs_);
  ah->handle = i;
  ah->gen = ++ah_gen_;
  out = ah.get();
  ahs_[i] = std::move(ah);
  ++pd->children;
  ++live_ahs_;
  return {};
}

std::error_code device::destroy_ah(ah_t* ah) {
  std::lock_guard lock(lock_);
  pd_t* pd = ah->pd;
  const std::uint32_t i = ah->handle;
  ahs_[i].reset();
  free_slot(free_ahs_, i);
  --live_ahs_;
  drop_pd_child(pd);
  return {};
}

// ---------------------------------------------------------------------------
// CQ

std::error_code device::create_cq(std::uint32_t cqe, event_channel* events, cq_t*& out) {
  if (cqe < 1 || cqe > limits::max_cqe) return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  if (live_cqs_ >= limits::max_cq) return err(errc::no_resources);
  auto cq = std::make_unique<cq_t>();
  if (!cq->q.init(cqe + 1, sizeof(work_completion))) return err(errc::no_resources);
  cq->cqe = cqe;
  cq->events = events;
  const std::uint32_t i = take_slot(cqs_, free_cqs_);
  cq->handle = i;
  cq->id = new_event_id();
  out = cq.get();
  cqs_[i] = std::move(cq);
  ++live_cqs_;
  return {};
}

std::error_code device::resize_cq(cq_t* cq, std::uint32_t cqe) {
  if (cqe < 1 || cqe > limits::max_cqe) return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  const std::uint32_t used = cq->q.count();
  if (cqe < used) return err(errc::invalid_argument);
  ring bigger;
  if (!bigger.init(cqe + 1, sizeof(work_completion))) return err(errc::no_resources);
  std::uint32_t n = 0;
  for (std::uint32_t i = cq->q.consumer(); i != cq->q.producer(); ++i, ++n)
    std::memcpy(bigger.at(n), cq->q.at(i), sizeof(work_completion));
  bigger.publish(n);
  swap(cq->q, bigger);
  cq->cqe = cqe;
  return {};
}

namespace {
void fail_all(std::vector<parked>& v, const std::error_code& ec) {
  for (const parked& p : v) complete_parked(p, ec, nullptr);
  v.clear();
}
void fail_all(std::vector<cq_notify>& v, const std::error_code& ec) {
  for (const cq_notify& n : v) complete_parked(n.p, ec, nullptr);
  v.clear();
}
}  // namespace

namespace {
// Forgets parked requests that were cancelled meanwhile (their group or
// handle cancelled them), so the lists do not grow with abandoned waits.
template <class V, class Get>
void prune(V& v, Get get) {
  for (auto it = v.begin(); it != v.end();) {
    const parked& p = get(*it);
    if (!detail::request_pending(*p.ctx, p.id)) {
      detail::context_release(*p.ctx);
      it = v.erase(it);
    } else {
      ++it;
    }
  }
}
}  // namespace

std::uint32_t device::cqe_of(cq_t* cq) const {
  std::lock_guard lock(lock_);
  return cq->cqe;
}

void device::purge_cq_events(const cq_t* cq) noexcept {
  if (cq->events == nullptr) return;
  const std::uint32_t id = cq->event_id();
  cq->events->purge([id](const async_event& e) { return e.type == event_type::cq_err && e.element == id; });
}

void device::purge_srq_events(const srq_t* srq) noexcept {
  if (srq->pd->events == nullptr) return;
  const std::uint32_t id = srq->event_id();
  srq->pd->events->purge([id](const async_event& e) {
    return (e.type == event_type::srq_limit_reached || e.type == event_type::srq_err) && e.element == id;
  });
}

void device::purge_qp_events(const qp_t* qp) noexcept {
  if (qp->pd->events == nullptr) return;
  const std::uint32_t qpn = qp->qpn;
  qp->pd->events->purge([qpn](const async_event& e) {
    switch (e.type) {
      case event_type::qp_fatal:
      case event_type::qp_req_err:
      case event_type::qp_access_err:
      case event_type::comm_est:
      case event_type::sq_drained:
      case event_type::path_mig:
      case event_type::path_mig_err:
      case event_type::qp_last_wqe_reached:
        return e.element == qpn;
      default:
        return false;
    }
  });
}

std::error_code device::destroy_cq(cq_t* cq) {
  std::lock_guard lock(lock_);
  if (cq->users != 0) return err(errc::busy);
  fail_all(cq->notifies, err(errc::operation_aborted));
  const std::uint32_t i = cq->handle;
  purge_cq_events(cq);
  cqs_[i].reset();
  free_slot(free_cqs_, i);
  --live_cqs_;
  return {};
}

void device::release_cq(cq_t* cq) noexcept {
  std::lock_guard lock(lock_);
  fail_all(cq->notifies, err(errc::operation_aborted));
  if (cq->users != 0) {
    cq->released = true;
    return;
  }
  const std::uint32_t i = cq->handle;
  purge_cq_events(cq);
  cqs_[i].reset();
  free_slot(free_cqs_, i);
  --live_cqs_;
}

bool device::post_cqe(cq_t* cq, const work_completion& wc, bool solicited) noexcept {
  if (cq->error) return false;
  if (cq->q.count() >= cq->cqe) {
    // Overflow: the CQ is in error (IBTA 11.4.2.1) and says so once.
    cq->error = true;
    ++counters_.cq_overflows;
    raise_event(cq->events, event_type::cq_err, cq->event_id());
    // No completion will come now: a notification parked before fails, as
    // one asked for after does (arm_cq).
    fail_all(cq->notifies, err(errc::invalid_state));
    cq->armed = false;
    return false;
  }
  const std::uint32_t p = cq->q.producer();
  std::memcpy(cq->q.at(p), &wc, sizeof wc);
  cq->q.publish(p + 1);
  ++counters_.completions;
  if (cq->armed) {
    // Complete every parked notification this completion satisfies.  A
    // solicited-only arm fires on a receive with the SE bit or on any
    // completion in error (ibv_req_notify_cq(3)).
    if (wc.status != wc_status::success) solicited = true;
    for (auto it = cq->notifies.begin(); it != cq->notifies.end();) {
      if (!it->solicited_only || solicited) {
        complete_parked(it->p, {}, nullptr);
        it = cq->notifies.erase(it);
      } else {
        ++it;
      }
    }
    cq->armed = !cq->notifies.empty();
  }
  return true;
}

std::size_t device::poll_cq(cq_t* cq, std::span<work_completion> out) {
  std::size_t n = 0;
  {
    std::lock_guard lock(lock_);
    // A program that only polls must still see its timers fire; reading the
    // clock on every poll would cost more than the poll, so look every 32nd.
    if ((++polls_ & 31) == 0 && armed_deadline_ != clock::time_point::max() && clock_->now() >= armed_deadline_)
      run_timers();
    poll_link();
    run();
    std::uint32_t c = cq->q.consumer();
    const std::uint32_t p = cq->q.producer();
    while (n < out.size() && c != p) {
      std::memcpy(&out[n], cq->q.at(c), sizeof(work_completion));
      ++c;
      ++n;
    }
    cq->q.release(c);
  }
  drain_released();
  return n;
}

void device::arm_cq(cq_t* cq, bool solicited_only, detail::context_impl& ctx, detail::request_id id) {
  std::lock_guard lock(lock_);
  // Removed after the caller's unlocked check: fatal() has already failed
  // the parked notifications, and would never see this one.
  if (fatal_) {
    detail::complete_request(ctx, id, err(errc::device_removed), nullptr);
    return;
  }
  // An overflowed CQ takes no completion again (it latches its error):
  // the notification could never come.
  if (cq->error) {
    detail::complete_request(ctx, id, err(errc::invalid_state), nullptr);
    return;
  }
  prune(cq->notifies, [](const cq_notify& n) -> const parked& { return n.p; });
  cq->notifies.push_back({{&ctx, id}, solicited_only});  // may throw: no reference taken yet
  detail::context_add_ref(ctx);
  cq->armed = true;
}

// ---------------------------------------------------------------------------
// SRQ

std::error_code device::create_srq(pd_t* pd, const srq_attr& attr, srq_t*& out) {
  if (attr.max_wr < 1 || attr.max_wr > limits::max_srq_wr) return err(errc::invalid_argument);
  if (attr.max_sge > limits::max_srq_sge) return err(errc::invalid_argument);
  // srq_limit is not checked here (ibv_create_srq(3): "irrelevant"; rxe
  // does not check it): it arms the limit as it is, as rxe's does.
  const std::uint32_t max_sge = std::max<std::uint32_t>(attr.max_sge, 1);  // rxe: 0 means 1
  std::lock_guard lock(lock_);
  if (live_srqs_ >= limits::max_srq) return err(errc::no_resources);
  auto srq = std::make_unique<srq_t>();
  if (!srq->q.init(attr.max_wr, sizeof(recv_wqe) + max_sge * sizeof(wqe_sge)))
    return err(errc::no_resources);
  srq->pd = pd;
  srq->max_wr = attr.max_wr;
  srq->max_sge = max_sge;
  srq->limit = attr.srq_limit;
  const std::uint32_t i = take_slot(srqs_, free_srqs_);
  srq->handle = i;
  srq->id = new_event_id();
  out = srq.get();
  srqs_[i] = std::move(srq);
  ++pd->children;
  ++live_srqs_;
  return {};
}

std::error_code device::modify_srq(srq_t* srq, const srq_attr& attr, std::uint32_t mask) {
  constexpr std::uint32_t max_wr_bit = 1, limit_bit = 2;
  // A mask of 0 changes nothing (ibv_modify_srq(3): "either 0 or ...").
  if ((mask & ~(max_wr_bit | limit_bit)) != 0) return err(errc::invalid_argument);
  std::lock_guard lock(lock_);
  const std::uint32_t new_max = (mask & max_wr_bit) != 0 ? attr.max_wr : srq->max_wr;
  if ((mask & max_wr_bit) != 0) {
    // Resize (IB_DEVICE_SRQ_RESIZE): never below the receives posted now or
    // below an armed limit (rxe_srq_chk_attr).
    if (new_max < 1 || new_max > limits::max_srq_wr || new_max < srq->q.count()) return err(errc::invalid_argument);
    const std::uint32_t limit = (mask & limit_bit) != 0 ? attr.srq_limit : srq->limit;
    if (limit > new_max) return err(errc::invalid_argument);
  }
  if ((mask & limit_bit) != 0 && attr.srq_limit > new_max) return err(errc::invalid_argument);
  if ((mask & max_wr_bit) != 0 && new_max != srq->max_wr) {
    ring bigger;
    if (!bigger.init(new_max, srq->q.entry_size())) return err(errc::no_resources);
    std::uint32_t n = 0;
    for (std::uint32_t i = srq->q.consumer(); i != srq->q.producer(); ++i, ++n)
      std::memcpy(bigger.at(n), srq->q.at(i), srq->q.entry_size());
    bigger.publish(n);
    swap(srq->q, bigger);
    srq->max_wr = new_max;
  }
  if ((mask & limit_bit) != 0) srq->limit = attr.srq_limit;
  return {};
}

std::error_code device::query_srq(srq_t* srq, srq_attr& out) {
  std::lock_guard lock(lock_);
  out.max_wr = srq->max_wr;
  out.max_sge = srq->max_sge;
  out.srq_limit = srq->limit;
  return {};
}

std::error_code device::destroy_srq(srq_t* srq) {
  std::lock_guard lock(lock_);
  if (srq->users != 0) return err(errc::busy);
  pd_t* pd = srq->pd;
  const std::uint32_t i = srq->handle;
  purge_srq_events(srq);
  srqs_[i].reset();
  free_slot(free_srqs_, i);
  --live_srqs_;
  drop_pd_child(pd);
  return {};
}

void device::release_srq(srq_t* srq) noexcept {
  std::lock_guard lock(lock_);
  if (srq->users != 0) {
    srq->released = true;
    return;
  }
  pd_t* pd = srq->pd;
  const std::uint32_t i = srq->handle;
  purge_srq_events(srq);
  srqs_[i].reset();
  free_slot(free_srqs_, i);
  --live_srqs_;
  drop_pd_child(pd);
}

void device::check_srq_limit(srq_t* srq) noexcept {
  // IBTA 10.2.9.2: the limit event fires once when the number of posted
  // receives drops below the limit, then the limit disarms.
  if (srq->limit != 0 && srq->q.count() < srq->limit) {
    srq->limit = 0;
    raise_event(srq->pd->events, event_type::srq_limit_reached, srq->event_id());
  }
}

std::error_code device::post_srq_recv(srq_t* srq, const recv_wr* wrs, std::size_t n, std::size_t* bad) {
  std::lock_guard lock(lock_);
  for (std::size_t k = 0; k < n; ++k) {
    const recv_wr& wr = wrs[k];
    std::error_code ec;
    if (wr.num_sge > srq->max_sge)
      ec = err(errc::invalid_argument);
    else if (recv_length(wr) > limits::max_msg_size)
      ec = err(errc::message_too_long);
    else if (srq->q.count() >= srq->max_wr) ec = err(errc::queue_full);
    if (ec) {
      if (bad != nullptr) *bad = k;
      return ec;
    }
    const std::uint32_t p = srq->q.producer();
    auto* w = srq->q.at<recv_wqe>(p);
    w->wr_id = wr.wr_id;
    w->num_sge = wr.num_sge;
    for (std::uint32_t i = 0; i < wr.num_sge; ++i)
      w->sges()[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    srq->q.publish(p + 1);
  }
  return {};
}

// ---------------------------------------------------------------------------
// Async events

event_channel* device::open_events() {
  std::lock_guard lock(lock_);
  if (fatal_) return nullptr;  // removed: device_fatal went out to the channels there were
  channels_.push_back(std::make_unique<event_channel>());
  return channels_.back().get();
}

void device::close_events(event_channel* ch) noexcept {
  std::lock_guard lock(lock_);
  for (const parked& p : ch->waiters) complete_parked(p, err(errc::operation_aborted), nullptr);
  // A released PD or CQ the engine keeps until its last child goes raises
  // nothing once its handle is closed.
  for (auto& pd : pds_)
    if (pd != nullptr && pd->events == ch) pd->events = nullptr;
  for (auto& cq : cqs_)
    if (cq != nullptr && cq->events == ch) cq->events = nullptr;
  std::erase_if(channels_, [ch](const std::unique_ptr<event_channel>& c) { return c.get() == ch; });
}

void device::raise_event(event_channel* ch, event_type t, std::uint32_t element) noexcept {
  if (ch == nullptr) return;
  async_event ev{t, element};
  // The first waiter still pending takes it; cancelled ones are skipped so
  // the event is not lost on them.
  while (!ch->waiters.empty()) {
    const parked p = ch->waiters.front();
    ch->waiters.erase(ch->waiters.begin());
    const bool taken = detail::complete_request(*p.ctx, p.id, {}, &ev);
    detail::context_release(*p.ctx);
    if (taken) return;
  }
  (void)ch->push(ev);
}

void device::broadcast_event(event_type t, std::uint32_t element) noexcept {
  for (auto& ch : channels_) raise_event(ch.get(), t, element);
}

void device::get_event(event_channel* ch, detail::context_impl& ctx, detail::request_id id) {
  std::lock_guard lock(lock_);
  prune(ch->waiters, [](const parked& p) -> const parked& { return p; });
  if (ch->count != 0) {
    // Taken off the queue only if the request takes it: a cancel (of its
    // group, or the device closing) may have completed it already, during
    // its own initiation; the event then waits for the next one.
    if (detail::complete_request(ctx, id, {}, &ch->ring[ch->head])) {
      async_event ev;
      (void)ch->pop(ev);
    }
    return;
  }
  if (fatal_) {
    detail::complete_request(ctx, id, err(errc::device_removed), nullptr);
    return;
  }
  ch->waiters.push_back({&ctx, id});  // may throw: no reference taken yet
  detail::context_add_ref(ctx);
}

void device::set_port_state(port_state s) {
  std::lock_guard lock(lock_);
  if (s == port_state_) return;
  port_state_ = s;
  // What the fault injector held or delayed was on the cable: gone with it,
  // not sent when the port comes back.
  if (s != port_state::active) link_->drop_queued();
  broadcast_event(s == port_state::active ? event_type::port_active : event_type::port_err, 1);
}

void device::fatal() {
  std::lock_guard lock(lock_);
  fatal_ = true;
  port_state_ = port_state::down;
  // As a port going down: what waits to leave (for room in the socket, or
  // held by fault injection) is gone with the device.  The requests behind
  // it complete flushed below; the peer must not see them afterwards.
  link_->drop_queued();
  gsi_->on_fatal();  // first: its requests end with device_removed, not a reset
  // The notifications before the QPs flush: those completions can never be
  // polled (the device is gone), and must not wake a waiter with success.
  for (auto& c : cqs_)
    if (c != nullptr) fail_all(c->notifies, err(errc::device_removed));
  // device_fatal first (device.hpp: the first event a handle then gets),
  // ahead of the QPs' own (LAST_WQE_REACHED of those on an SRQ).
  broadcast_event(event_type::device_fatal, 0);
  for (auto& q : qps_)
    if (q != nullptr && q->state != qp_state::reset && q->state != qp_state::err) qp_to_error(q.get());
  for (auto& ch : channels_) fail_all(ch->waiters, err(errc::device_removed));
}

// ---------------------------------------------------------------------------
// Timers

void device::rearm_timer_fd(bool force) noexcept {
  const clock::time_point next = timers_.next_deadline();
  if (next == armed_deadline_ && !(force && next == clock::time_point::max())) return;
  armed_deadline_ = next;
  if (next == clock::time_point::max()) {
    // Nothing left to wait for: a timerfd still armed (read early, before
    // it fired) would make ep_ readable later with nothing to do, and an
    // event loop on native_handle() would spin on it.
    if (!clock_->is_real_time()) return;
    std::lock_guard sleep(sleep_mu_);
    timer_fd_stale_ = false;
    if (std::exchange(timer_fd_set_, false)) {
      const itimerspec off{};
      ::timerfd_settime(timer_fd_, 0, &off, nullptr);
    }
    return;
  }
  if (!clock_->is_real_time()) {
    if (next <= clock_->now()) write_one(timer_fd_);
    return;
  }
  std::lock_guard sleep(sleep_mu_);
  if (!fds_watched_.load(std::memory_order_relaxed)) {
    timer_fd_wanted_ = next;  // for watch_locked()
    timer_fd_stale_ = true;
    return;
  }
  set_timer_fd(next);
}

void device::set_timer_fd(clock::time_point when) noexcept {
  timer_fd_set_ = true;
  detail::arm_timerfd(timer_fd_, *clock_, clock_is_steady_, when);
}

void device::run_timers() noexcept {
  // Drain the descriptor if it can have fired: a manual clock's eventfd
  // always, a timerfd only if armed since it was last drained (the busy
  // path, which leaves it unarmed, saves the read).
  auto drain = [this] {
    std::uint64_t v;
    ssize_t r;
    while ((r = ::read(timer_fd_, &v, sizeof v)) < 0 && errno == EINTR) {
    }
    return r > 0;
  };
  if (!clock_->is_real_time()) {
    drain();
  } else {
    std::lock_guard sleep(sleep_mu_);
    if (timer_fd_set_ && drain()) timer_fd_set_ = false;  // fired: a one-shot timerfd is now unarmed
  }
  armed_deadline_ = clock::time_point::max();
  timers_.run_expired(clock_->now());
  // Forced: with nothing left, `next` equals the max just set, and the
  // descriptor -- armed for a deadline that has not fired yet, or to be
  // armed for a past one when the sockets are watched again -- must be
  // disarmed all the same, or ep_ turns readable with nothing to do.
  rearm_timer_fd(true);
}

void device::progress() noexcept {
  {
    std::unique_lock lock(lock_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    // progress() comes from a context: its waits, its poll() or a program's
    // event loop on native_handle(), any of which may block on ep_ next.
    // Only a program that polls its CQs keeps the sockets unwatched.
    if (!fds_watched_.load(std::memory_order_relaxed)) {
      std::lock_guard sleep(sleep_mu_);
      watch_locked();
    }
    // A timerfd is readable only once its deadline passed, so the clock says
    // when to look; a manual clock's eventfd rings on every change and is
    // always drained.
    if (!clock_->is_real_time() ||
        (armed_deadline_ != clock::time_point::max() && clock_->now() >= armed_deadline_))
      run_timers();
    // The descriptor stays readable while the last pass left work queued
    // (a bulk transfer: most passes end on their budget), so a busy
    // thread pays no eventfd write and read per pass; it is drained once
    // the queues are empty, before this pass, which may signal it again
    // (poll_link when it unwatches the sockets, run() on its budget).
    if (pending_signaled_ && rx_head_ == nullptr && req_head_ == nullptr) {
      std::uint64_t v;
      while (::read(pending_fd_, &v, sizeof v) < 0 && errno == EINTR) {
      }
      pending_signaled_ = false;
    }
    poll_link();
    run();
  }
  drain_released();
}

void device::poll_link() noexcept {
  unwatch_if_busy();
  // Read before the socket, so a datagram's receive checks (udp_link's
  // ICRC rule) and the pass that handles it use this read too.
  const auto now = yield_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (yield_) seed_pass(now);
  // New data waits in the socket while older work is queued (a pass that
  // ended on its budget): the queue stays short, the kernel buffers the
  // rest.
  std::size_t got = 0;
  if (rx_head_ == nullptr) {
    ++link_polls_;  // the socket was read (run_due_probes)
    got = link_->poll();
  }
  // Then management datagrams, which go to the front of the receive queue,
  // but a syscall for them at most every few microseconds: a latency-bound
  // data path polls far more often.  A datagram that just came is handled
  // first (the turnaround of a ping-pong) unless they are overdue; a long
  // pass reads them as it goes (run()).
  if (!yield_) return;
  const auto interval = link_->management_active(now) ? busy_priority_interval : priority_interval;
  poll_priority_every(now, got == 0 ? interval : 2 * interval);
}

void device::poll_priority_every(std::chrono::steady_clock::time_point now,
                                 std::chrono::microseconds interval) noexcept {
  if (now - last_priority_poll_ <= interval) return;
  last_priority_poll_ = now;
  // Not while MADs read before still wait, nor ahead of a packet they went
  // ahead of once: each MAD costs more to handle (an answer to send) than
  // to read, and a flood read as fast as it came, to the front of the
  // queue, kept what waited behind (an ACK, say) from ever being reached.
  if (mads_queued_ != 0 || (rx_head_ != nullptr && rx_head_->overtaken)) {
    ++counters_.management_deferred;
    return;
  }
  if (rx_head_ != nullptr)
    rx_head_->overtaken = true;  // (no MAD is queued: the head is the first behind them)
  link_->poll_priority();
}

void device::signal_pending() noexcept {
  if (pending_signaled_) return;
  pending_signaled_ = true;
  write_one(pending_fd_);
}

bool device::schedule_timer(clock::time_point when, detail::timer_fn fn, void* arg,
                            const detail::timer_payload& p, detail::timer_alive_fn alive) noexcept {
  try {
    if (timers_.schedule(when, fn, arg, p, alive)) rearm_timer_fd();
    return true;
  } catch (...) {
    ++counters_.timers_lost;
    return false;
  }
}

void device::release_later(std::shared_ptr<void> obj) noexcept {
  if (obj == nullptr) return;
  try {
    graveyard_.push_back(std::move(obj));  // (strong guarantee: obj is intact if it throws)
    graveyard_full_.store(true, std::memory_order_release);
  } catch (...) {
    // Out of memory: keep the object for good (a leak) rather than destroy
    // it here, under the lock its destructor may take.  Without allocating
    // (this used to `new` a shared_ptr, which under the same shortage threw
    // out of this noexcept function): a union member is never destroyed.
    union keep {
      std::shared_ptr<void> p;
      explicit keep(std::shared_ptr<void>&& o) noexcept : p(std::move(o)) {}
      ~keep() {}
    };
    keep k(std::move(obj));
  }
}

void device::drain_released() noexcept {
  if (!graveyard_full_.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<void>> v;
  {
    std::lock_guard lock(lock_);
    v.swap(graveyard_);
    graveyard_full_.store(false, std::memory_order_relaxed);
  }
  // Called from progress(), this thread holds its context's sources lock:
  // an object here may hold a device's last handle there (a spare
  // connector, its listener and device dropped meanwhile on another
  // thread), whose release removes the source under that lock.  The
  // context releases them once it has let go.
  if (detail::context_impl* c = detail::context_impl::polling(); c != nullptr && !c->release_after_poll(v)) {
    // No memory to hand them over: back to the graveyard (whose room is
    // v's), for a drain outside a poll.
    std::lock_guard lock(lock_);
    if (graveyard_.empty()) {
      graveyard_.swap(v);
      graveyard_full_.store(true, std::memory_order_release);
      return;
    }
  }
  v.clear();  // destructors may take the lock again
  // The room goes back, so that the next release_later() does not have to
  // allocate (unless more were released meanwhile).
  std::lock_guard lock(lock_);
  if (graveyard_.empty() && graveyard_.capacity() < v.capacity()) graveyard_.swap(v);
}

mtu device::active_mtu() const noexcept { return active_mtu_; }

// ---------------------------------------------------------------------------
// QP1: management datagrams

void device::receive_gsi(packet* p) noexcept {
  // Only well-formed CM carriers reach the agent: UD SEND_ONLY with the GSI
  // Q_Key and a whole 256-byte MAD (IBTA 13.4.2; rxe drops the rest).
  // QP1 is no exception to the P_Key check (rxe's check_keys()).  Only
  // what passes counts as management traffic, which shortens send batches
  // for a while: junk addressed to QP1 must not.
  std::array<std::byte, wire::cm::mad_size> mad;
  const bool pkey_ok = (p->hdr.bth.pkey & 0x7FFF) == (wire::default_pkey & 0x7FFF);
  const bool qkey_ok = p->hdr.deth.qkey == wire::gsi_qkey;
  if (p->hdr.bth.opcode != static_cast<std::uint8_t>(wire::opcode::ud_send_only) || !pkey_ok || !qkey_ok ||
      p->payload_len != mad.size()) {
    if (!pkey_ok)
      count_violation(bad_pkey_cntr_);
    else if (!qkey_ok && (p->op->headers & wire::hdr_deth) != 0)
      count_violation(qkey_viol_cntr_);
    ++counters_.dropped;
    return;
  }
  counters_.packets_received += p->run;
  counters_.bytes_received += p->payload_len;
  link_->note_management();
  std::size_t off = 0;
  for (std::uint8_t i = 0; i < p->nsegs; ++i) {
    std::memcpy(mad.data() + off, p->segs[i].p, p->segs[i].len);
    off += p->segs[i].len;
  }
  gsi_->on_mad({p->src, p->dst, p->hdr.deth.src_qp, p->hop_limit, p->tclass, std::span(mad)});
}

void device::send_mad(const gid& src, const gid& dst, std::uint32_t dqpn, std::span<const std::byte> mad,
                      std::uint8_t hop_limit, std::uint8_t traffic_class) noexcept {
  packet* p = alloc_packet();
  if (p == nullptr || mad.size() > packet::buffer_size) {
    if (p != nullptr) free_packet(p);
    ++counters_.dropped;
    return;
  }
  p->hdr.bth = wire::bth{};
  p->hdr.bth.opcode = static_cast<std::uint8_t>(wire::opcode::ud_send_only);
  p->hdr.bth.dest_qp = dqpn;
  p->hdr.bth.psn = gsi_psn_;
  gsi_psn_ = (gsi_psn_ + 1) & wire::psn_mask;
  p->hdr.deth.qkey = wire::gsi_qkey;
  p->hdr.deth.src_qp = wire::cm::gsi_qpn;
  std::memcpy(p->buf, mad.data(), mad.size());
  p->segs[0] = {p->buf, static_cast<std::uint32_t>(mad.size())};
  p->nsegs = 1;
  p->payload_len = static_cast<std::uint32_t>(mad.size());
  p->src = src;
  p->dst = dst;
  p->sport = wire::ud_source_port(wire::cm::gsi_qpn);
  p->hop_limit = hop_limit;
  p->tclass = traffic_class;
  p->op = &wire::info(p->hdr.bth.opcode);
  p->hdr.bth.pad = wire::pad_for(p->payload_len);
  p->header_len = static_cast<std::uint8_t>(wire::encode(p->hdr, p->header));
  if (!port_carries(p)) return;
  ++counters_.packets_sent;
  counters_.bytes_sent += p->payload_len;
  if (link_->wants_icrc()) compute_icrc(p);
  else p->has_icrc = false;
  // Management traffic does not wait behind a burst of data.
  link_->note_management();
  link_->send_urgent(p);
}

void device::on_clock_changed() noexcept { write_one(timer_fd_); }

// ---------------------------------------------------------------------------
// The run loop: drain received packets and runnable requesters until idle.

void device::schedule_requester(qp_t* qp) noexcept {
  if (qp->req.scheduled) return;
  qp->req.scheduled = true;
  qp->req.next_ready = nullptr;
  if (req_tail_ != nullptr) req_tail_->req.next_ready = qp;
  else req_head_ = qp;
  req_tail_ = qp;
}

void device::on_ack_timer() noexcept {
  ack_timer_pending_ = false;
  if (!acks_held_) return;
  acks_held_ = false;
  flush_acks();
  link_->flush();
}

void device::run() noexcept {
  if (running_) return;
  running_ = true;
  // Packets waiting for room in a full send buffer go first; the QPs they
  // stopped (park()) go on behind them if there is room now.
  // (While it stays full they stay parked: no scan of every QP per pass.)
  bool blocked = false;
  if (starved_requesters_ != 0 && link_->send_blocked()) {
    link_->flush();
    blocked = link_->send_blocked();
  }
  if (lost_timers_ != 0 || (starved_requesters_ != 0 && !blocked)) recover_stalled_qps();
  if (std::exchange(agent_recovery_, false)) gsi_->recover();
  const bool held_before = acks_held_;
  const std::uint64_t sent_before = counters_.packets_sent;
  // The poll just before read the clock (pass_now_ too, if seeded);
  // otherwise read it here.  Only a yielding device uses `started`.
  if (!pass_started_valid_) {
    pass_now_valid_ = false;
    if (yield_) seed_pass(std::chrono::steady_clock::now());
  }
  const auto started = pass_started_;
  pass_started_valid_ = false;
  yield_now_ = false;
  std::uint32_t tick = 0;
  for (;;) {
    // Management datagrams do not wait for a long pass to end, and a
    // network device's pass ends after a few tens of microseconds, so the
    // thread driving it returns to what it waits for (a CM completion,
    // say) while a bulk transfer keeps the queues full.  The rest of the
    // work stays queued and the progress descriptor says so.
    ++tick;
    if ((tick & 63) == 0) pass_now_valid_ = false;  // a long pass reads the clock again now and then
    // The budget is checked only when there is more to do: a short pass
    // (one message in, its answer out) reads the clock once.
    if (yield_ && tick > 1 && (rx_head_ != nullptr || req_head_ != nullptr || !ack_ready_.empty() || yield_now_)) {
      const auto now = std::chrono::steady_clock::now();
      // Every microsecond while connections are being set up: a MAD then
      // waits little behind a long pass, for a little bulk throughput.  A
      // short pass (one message in, its answer out) leaves them to the next
      // poll: a syscall here would delay the answer.
      if (now - started > busy_priority_interval)
        poll_priority_every(now, link_->management_active(now) ? busy_priority_interval : priority_interval);
      if (now - started > pass_budget || yield_now_) {
        if (!ack_ready_.empty()) {
          flush_acks();
          acks_held_ = false;
        }
        link_->flush();
        if (rx_head_ != nullptr || req_head_ != nullptr) signal_pending();
        break;
      }
    }
    if (rx_head_ != nullptr && !std::exchange(sends_turn_, false)) {
      packet* p = rx_head_;
      rx_head_ = p->next;
      if (rx_head_ == nullptr) rx_tail_ = nullptr;
      if (p == rx_front_last_) rx_front_last_ = nullptr;
      if (p->management) --mads_queued_;
      if (!port_carries(p)) continue;
      // The receive side parses the encoded bytes: the same code a packet
      // from the wire meets (the UDP link already did, with the same checks).
      if (!p->decoded && wire::decode_headers(std::span(p->header.data(), p->header_len), p->payload_len, p->hdr,
                                              p->op) != wire::decode_error::ok) {
        ++counters_.dropped;
        free_packet(p);
        continue;
      }
      const std::uint32_t qpn = p->hdr.bth.dest_qp;
      if (qpn == wire::cm::gsi_qpn) {
        receive_gsi(p);
        free_packet(p);
        sends_turn_ = req_head_ != nullptr || !ack_ready_.empty();
        continue;
      }
      qp_t* qp = qp_by_number(qpn);
      const bool response = (p->op->ops & wire::op_response) != 0;
      const auto tp = p->op->tp;
      bool ok = qp != nullptr && !qp->released;
      if (ok) {
        ok = (tp == wire::transport::rc && qp->type == qp_type::rc) ||
             (tp == wire::transport::uc && qp->type == qp_type::uc) ||
             (tp == wire::transport::ud && qp->type == qp_type::ud);
      }
      if (ok) {
        const qp_state s = qp->state;
        ok = response ? (s == qp_state::rts || s == qp_state::sqd)
                      : (s == qp_state::rtr || s == qp_state::rts || s == qp_state::sqd || s == qp_state::sqe);
      }
      if (ok && qp->type != qp_type::ud) ok = p->src == qp->av.grh.dgid && p->dst == qp->sgid;
      // The key checks (rxe's check_keys(); IBTA 10.9.3): violations count
      // in the port's P_Key and Q_Key violation counters.
      if (ok && (p->hdr.bth.pkey & 0x7FFF) != (wire::default_pkey & 0x7FFF)) {
        ok = false;
        count_violation(bad_pkey_cntr_);
      }
      if (ok && qp->type == qp_type::ud && p->hdr.deth.qkey != qp->qkey) {
        ok = false;  // silently dropped (IBTA 10.2.5)
        count_violation(qkey_viol_cntr_);
      }
      if (!ok) {
        ++counters_.dropped;
        free_packet(p);
        continue;
      }
      // Counted once it is known to be for this QP, as rxe counts its
      // received packets after the header checks.
      counters_.packets_received += p->run;
      counters_.bytes_received += p->payload_len;
      if (response) {
        complete_rx(qp, p);
      } else if (answering_read(qp) && !rewinds_read(qp, p)) {
        hold_request(qp, p);  // behind the READ being answered
        continue;
      } else {
        respond(qp, p);  // (a rewind: answered ahead of the stream it stopped)
      }
      free_packet(p);
      continue;
    }
    if (!ack_ready_.empty() && !ack_defer_) {
      flush_acks();  // the receive queue drained: acknowledge the burst
      continue;
    }
    if (req_head_ != nullptr) {
      qp_t* qp = req_head_;
      req_head_ = qp->req.next_ready;
      if (req_head_ == nullptr) req_tail_ = nullptr;
      qp->req.scheduled = false;
      if (link_->send_blocked()) {
        park(qp);
        continue;
      }
      if (answering_read(qp)) responder_turn(qp);
      requester(qp);
      continue;
    }
    if (!ack_ready_.empty() && ack_defer_) {
      if (held_before || counters_.packets_sent != sent_before) {
        flush_acks();  // behind this pass's own packets, in one batch
        acks_held_ = false;
      } else if (!acks_held_) {
        acks_held_ = true;
        if (!ack_timer_pending_) {
          ack_timer_pending_ = true;
          try {
            if (timers_.schedule(deadline_after(clock_->now(), std::chrono::microseconds(50)),
                                 [](void* arg, const detail::timer_payload&) noexcept {
                                   static_cast<device*>(arg)->on_ack_timer();
                                 },
                                 this, {}))
              rearm_timer_fd();
          } catch (...) {
            flush_acks();
            acks_held_ = false;
          }
        }
      }
    }
    if (probes_due_ != 0 && rx_head_ == nullptr && req_head_ == nullptr) run_due_probes();
    link_->flush();  // may loop packets back (loopback with held faults)
    if (rx_head_ != nullptr || req_head_ != nullptr || (!ack_ready_.empty() && !acks_held_)) continue;
    break;
  }
  running_ = false;
  pass_now_valid_ = false;
  pass_started_valid_ = false;
}

}  // namespace averbs::soft
