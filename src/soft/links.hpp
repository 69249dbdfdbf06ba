// SPDX-License-Identifier: MIT
// The links a soft device sends through besides loopback: RoCEv2 over a UDP
// socket, and the fault injector that wraps any link.
#pragma once

#include "soft/engine.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace averbs::soft {

/// Injects drops, duplicates, reordering, delay and corruption, from a
/// seeded generator, in front of another link.  Packets it keeps beyond the
/// current run (held for reordering or delay) own their payload.
class fault_link final : public link {
 public:
  fault_link(device& d, link& inner, const fault_config& cfg);
  ~fault_link() override;
  void send(packet* p) noexcept override { pass(p, false); }
  void send_urgent(packet* p) noexcept override { pass(p, true); }
  void flush() noexcept override;
  std::size_t poll() noexcept override { return inner_.poll(); }
  std::size_t poll_priority() noexcept override { return inner_.poll_priority(); }
  bool wants_icrc() const noexcept override { return inner_.wants_icrc(); }
  std::uint16_t wire_src_port(const packet& p) const noexcept override { return inner_.wire_src_port(p); }
  std::uint16_t wire_dst_port() const noexcept override { return inner_.wire_dst_port(); }
  std::uint64_t receive_overflows() const noexcept override { return inner_.receive_overflows(); }
  void note_management() noexcept override { inner_.note_management(); }
  // A packet held back or duplicated is copied into its own buffer, which
  // holds one packet: never a run.
  std::uint16_t max_run() const noexcept override { return 1; }
  /// Drops what is held or delayed, then what the inner link holds (a
  /// port gone down: the cable cut).
  void drop_queued() noexcept override;
  /// The packet held for reordering leaves after the delay time from now
  /// unless another passes first.
  void start_held_wait() noexcept;
  /// At most this many packets wait delayed; past it one is lost, as from
  /// a full queue on a wire (delay=1 with a long delay_us would otherwise
  /// keep every packet and retransmission).
  static constexpr std::size_t max_delayed = 4096;
  std::size_t send_batch() const noexcept override { return inner_.send_batch(); }
  bool send_blocked() const noexcept override { return inner_.send_blocked(); }
  bool peers_ack_unasked() const noexcept override { return inner_.peers_ack_unasked(); }
  void want_ip_fields() noexcept override { inner_.want_ip_fields(); }
  bool management_active(std::chrono::steady_clock::time_point now) const noexcept override {
    return inner_.management_active(now);
  }

 private:
  // Applies the faults to `p`; what goes on leaves through the inner
  // link, ahead of its batch if `urgent` (a management datagram keeps its
  // priority under faults).
  void pass(packet* p, bool urgent) noexcept;
  double uniform() noexcept;
  packet* clone(const packet* p) noexcept;
  void release_delayed() noexcept;
  void hold(packet* p, clock::time_point due, bool urgent) noexcept;
  // Sends a packet held or delayed here, if the port still carries it (a
  // management datagram ahead of the batch, as it came).
  void release(packet* p, bool urgent) noexcept;

  device& dev_;
  link& inner_;
  fault_config cfg_;
  std::uint64_t state_;
  packet* held_ = nullptr;  // reordered: goes out behind the next packet
  bool held_urgent_ = false;
  bool held_waits_ = false;  // held past its pass (flush), until held_due_
  clock::time_point held_due_{};
  struct delayed {
    clock::time_point due;
    packet* p;
    bool urgent;
  };
  std::vector<delayed> delayed_;
  bool timer_pending_ = false;
  // The release timer names the device and this serial, not this object:
  // the heap cannot cancel an entry, and set_faults() may replace the link
  // before it fires.
  const std::uint64_t serial_;
  void schedule_release(clock::time_point due) noexcept;
};

/// RoCEv2 over UDP: sockets bound to the device's address and port
/// receive; sending uses a raw socket (so each QP's UDP source port is
/// rxe's entropy and the IPv4 ID is 0, as the ICRC assumes) when the
/// process may open one, else the bound socket.  Batched with sendmmsg and
/// recvmmsg.
///
/// Management datagrams keep their priority: two sockets share the address
/// in a SO_REUSEPORT group whose classic BPF program sends every packet for
/// QP1 to the second, so a MAD never queues behind a burst of data, and the
/// engine reads that socket first and between packets of a long run.
/// What a received datagram's IP header said (UD's GRH reports it).
struct ip_fields {
  std::uint8_t tclass = 0;
  std::uint8_t hop_limit = 64;
  std::uint32_t flow_label = 0;  ///< IPv6 only
};

class udp_link final : public link {
 public:
  udp_link(device& d, const device_config& cfg);
  ~udp_link() override;
  void send(packet* p) noexcept override;
  void send_urgent(packet* p) noexcept override;
  void flush() noexcept override;
  std::size_t poll() noexcept override;
  std::size_t poll_priority() noexcept override;
  bool wants_icrc() const noexcept override { return true; }
  bool peers_ack_unasked() const noexcept override { return false; }
  void want_ip_fields() noexcept override;
  std::uint16_t wire_src_port(const packet& p) const noexcept override { return raw_fd_ >= 0 ? p.sport : port_; }
  std::uint16_t wire_dst_port() const noexcept override { return port_; }
  std::uint64_t receive_overflows() const noexcept override;
  void note_management() noexcept override;
  std::size_t send_batch() const noexcept override { return tx_limit_; }
  bool send_blocked() const noexcept override { return backlog_head_ != nullptr; }
  bool management_active(std::chrono::steady_clock::time_point now) const noexcept override {
    return now - last_management_ <= quiet_for;
  }
  std::uint16_t port() const noexcept { return port_; }
  bool raw() const noexcept { return raw_fd_ >= 0; }
  /// Drops what waits for room in the send buffer (a port gone down: the
  /// cable cut), counted in `dropped`.
  void drop_queued() noexcept override;

 private:
  // A sendmmsg of loopback datagrams runs each through the receiver's
  // stack: 8 of 4 KiB take tens of microseconds, the granularity of an
  // engine pass, and a management datagram waits for the call to end.
  // (A GSO run is one call: with runs of 16 connection setup under a bulk
  // WRITE took 3.1x its idle time, with 8 1.55x.)  Receiving has no such
  // cost.
  // (Runs longer than 8 -- up to 15, 60 KiB of 4 KiB packets -- are
  // sent only while no management datagram has come or gone for
  // `quiet_for`: they are 10-20 % more WRITE bandwidth, but setup under
  // load went to 2x idle with them.)
  static constexpr std::size_t batch = 8;
  static constexpr std::size_t quiet_batch = 15;
  static constexpr std::chrono::milliseconds quiet_for{2};
  static constexpr std::size_t rx_batch = 32;
  // The most segments a GRO datagram is split into: the kernel's GSO
  // limit (UDP_MAX_SEGMENTS, 128 on Linux 6.18; GRO coalesces at most 64,
  // our GSO runs are 64 at most).  More is a crafted datagram (4,000
  // packets of 16 bytes fit in 64 KiB), each segment a pool packet of
  // buffer_size.
  static constexpr std::size_t max_gro_segments = 128;
  /// Reads up to `rounds` batches from `fd` into the device's receive
  /// queue (at its front for the management socket).
  std::size_t receive(int fd, int rounds, bool front) noexcept;
  /// The data socket with UDP_GRO: a GSO run arrives as one datagram and is
  /// split into its segments here.
  std::size_t receive_gro() noexcept;
  /// Checks one datagram (segment `segment` of a GSO run, 0 if alone) at
  /// `data` -- `p->buf`, or the GRO buffer, which the packet then points
  /// into -- and queues `p`; false if it was dropped (`p` stays the
  /// caller's).
  bool deliver(packet* p, const std::byte* data, std::size_t len, const gid& from, std::uint16_t from_port,
               bool front, const struct ip_fields& ip) noexcept;
  /// Whether datagram `dgram` (its ICRC `icrc`) from `from`:`from_port`
  /// passes the ICRC check, with an IPv4 ID we cannot see found from it
  /// (icrc_matches_id, which learns the source's count).
  bool icrc_ok(std::span<const std::byte> dgram, std::uint32_t icrc, const gid& from,
               std::uint16_t from_port) noexcept;
  /// Whether its ICRC matches as sent with IPv4 ID 0 (or over IPv6), or
  /// with the ID after its source's last: no ID solved for, no state
  /// changed.
  bool icrc_exact(std::span<const std::byte> dgram, const gid& from, std::uint16_t from_port) noexcept;
  /// The ICRC `dgram` would carry with IPv4 ID 0 (nullopt: no prefix).
  std::optional<std::uint32_t> icrc_with_id0(std::span<const std::byte> dgram, const gid& from,
                                             std::uint16_t from_port) noexcept;
  struct tx_slot {
    packet* p;
    std::array<std::byte, 48> ip_udp;  // raw sends only
    std::array<std::byte, 8> trailer;  // pad + ICRC
    std::array<iovec, packet::max_segs + 3> iov;
    std::size_t iov_count;
    sockaddr_storage to;
    std::uint32_t transport_len;       // BTH ... pad
    std::uint16_t sport;
  };
  bool prepare(tx_slot& s, packet* p) noexcept;
  /// Writes the IP and UDP headers of a slot the raw socket sends.
  void write_ip_udp(tx_slot& s) noexcept;
  void transmit(tx_slot* slots, std::size_t count) noexcept;
  void transmit_each(tx_slot* slots, std::size_t count) noexcept;
  // A full socket send buffer (a qdisc or a NIC queue holding packets, or
  // a buffer capped at net.core.wmem_max without CAP_NET_ADMIN) refuses
  // packets: they wait in the backlog, in order, their payloads copied,
  // and leave before anything newer, at the next flush or when the retry
  // timer fires (about when a queue of a few packets drains); the device
  // starts no new requests meanwhile (send_blocked()).  A packet past
  // max_backlog is lost, as from a full queue on a wire.
  static constexpr std::size_t max_backlog = 4096;
  static constexpr std::chrono::microseconds backlog_retry{50};
  /// Keeps the packets of `slots` in the backlog (their payloads copied).
  void defer(tx_slot* slots, std::size_t count) noexcept;
  /// Sends what the backlog holds, oldest first, until the socket refuses.
  void send_backlog() noexcept;
  void arm_backlog_timer() noexcept;
  packet* backlog_head_ = nullptr;  // linked through packet::next
  packet* backlog_tail_ = nullptr;
  std::size_t backlog_size_ = 0;
  bool backlog_timer_ = false;
  bool resending_ = false;  // send_backlog() is sending: what it puts back was counted
  // Tries before a full send buffer's packets go to the backlog (a syscall
  // each, under the device lock).
  static constexpr int full_buffer_spins = 4;
  /// Sends slots [0, n) as one UDP GSO datagram; false if the kernel
  /// refused (the caller sends them one by one).
  bool transmit_gso(tx_slot* slots, std::size_t n, int fd) noexcept;
  /// The UDP socket bound to (our address, `sport`) that GSO sends use, or
  /// -1 when there is none (no raw socket, port taken, too many).
  int gso_fd(std::uint16_t sport) noexcept;
  /// Whether an IPv4 datagram from (`from`, `from_port`) whose ICRC did
  /// not match with ID 0 matches with an ID that source can have sent:
  /// `d` is the received ICRC XOR the ID-0 one.
  bool icrc_matches_id(const gid& from, std::uint16_t from_port, std::size_t transport_len, std::uint32_t d) noexcept;

  // Flows: a UDP socket bound to (our address, an RC or UC QP's source
  // port) and connected to its peer.  The kernel keeps a connected
  // socket's route, so a datagram sent alone costs about 0.4 us less
  // than through the raw socket (which routes every datagram): the
  // latency of a ping-pong.  Over IPv4 a connected socket numbers its
  // datagrams (the IPv4 ID, which the ICRC covers) from a random start;
  // the link learns the number once (learn_id) and counts from there.
  struct flow_key {
    gid dst;
    std::uint16_t sport = 0;
    std::uint8_t tclass = 0;
    std::uint8_t hop_limit = 0;
    bool operator==(const flow_key&) const = default;
  };
  struct flow_key_hash {
    std::size_t operator()(const flow_key& k) const noexcept;
  };
  struct flow {
    int fd = -1;                 // -1: this flow's datagrams go through the raw socket (for now)
    std::uint16_t next_id = 0;   // IPv4: the ID of its next datagram
    bool id_known = false;       // IPv4: false until learned (again, after a failed send)
    clock::time_point last_used{};
    clock::time_point retry_at{};  // without a socket: when to try again
  };
  // Past this many flows a new one goes through the raw socket, unless the
  // least recently used one has been idle for `flow_idle`: it is closed
  // and its successor numbers from a new start, which its receiver takes
  // after `rx_idle` (below) without question.
  static constexpr std::size_t max_flows = 64;
  static constexpr std::chrono::seconds flow_idle{1};
  static constexpr std::chrono::milliseconds flow_retry{100};
  // Flow and GSO sockets idle this long are closed (prune_idle(), from
  // every 1024th flush, at most once a second: a device polled rarely
  // prunes late): a long-lived device that has met many peers and ports
  // keeps descriptors only for those in use.
  static constexpr std::chrono::seconds socket_idle{5};
  void prune_idle(clock::time_point now) noexcept;
  clock::time_point next_prune_{};
  std::uint32_t flushes_ = 0;  // since the clock was last looked at for pruning
  /// The flow that sends the datagram in `s` (an RC or UC packet from a
  /// device with a raw socket), or null: it goes through the raw socket.
  flow* flow_for(const tx_slot& s) noexcept;
  /// A flow's socket for packets like `p` from `sport`, or -1.
  int open_flow_socket(const packet& p, std::uint16_t sport) noexcept;
  /// Sends `s` through `f`; false if the socket refused (the caller sends
  /// it another way).
  bool transmit_flow(tx_slot& s, flow& f) noexcept;
  /// IPv4: the ID the kernel gives the flow's next datagram, from a probe
  /// sent to `sink_fd_` whose headers the socket's error queue reports
  /// (SO_TIMESTAMPING with the packet).
  bool learn_id(flow& f) noexcept;
  std::unordered_map<flow_key, flow, flow_key_hash> flows_;
  flow* last_flow_ = nullptr;  // the flow flow_for() found last (nodes stay put), and its key
  flow_key last_flow_key_{};
  int sink_fd_ = -1;  // IPv4 with a raw socket: receives (and drops) the probes
  sockaddr_storage sink_{};
  socklen_t sink_len_ = 0;
  // What a receiver knows of each source's IDs: the last one it accepted.
  struct rx_flow {
    gid from;
    std::uint16_t port = 0;
    std::uint16_t last = 0;
    std::uint16_t candidate = 0;  // an ID far from `last`, waiting for one more that agrees
    bool used = false;
    bool has_candidate = false;
    clock::time_point seen{};     // when `last` came
  };
  std::array<rx_flow, 256> rx_flows_{};
  rx_flow& flow_of(const gid& from, std::uint16_t from_port) noexcept;  // its table entry (maybe another's)
  static bool known(const rx_flow& f, const gid& from, std::uint16_t from_port) noexcept;
  /// Whether ICRC difference `d` is the one of the ID after `f`'s last.
  bool next_id_matches(const rx_flow& f, std::size_t transport_len, std::uint32_t d) noexcept;
  // A source silent this long may come back as a new socket (a restarted
  // peer, an evicted flow): its next ID sets the count.
  static constexpr std::chrono::milliseconds rx_idle{100};

  device& dev_;
  // The network namespace the device was made in (nsfs device and inode):
  // sockets the link opens as it goes (flows, GSO runs, peers) only there.
  std::pair<std::uint64_t, std::uint64_t> netns_{};
  /// A UDP socket of our family, or -1 if the calling thread is in another
  /// network namespace than the device.
  int socket_here() const noexcept;
  bool v6_ = false;
  // The shared socket reports each datagram's traffic class and hop limit
  // (set once the first UD QP is created; a read then always takes control
  // messages, and no peer socket opens: its recv() reads none).
  bool ip_fields_ = false;
  // DREQs read from the management socket wait here while the data socket
  // is read once more, then queue behind what it held (poll_priority).
  std::array<packet*, 8> held_dreqs_{};
  std::size_t held_dreq_count_ = 0;
  bool holding_dreqs_ = false;
  // After how many data packets the reads ahead of held DREQs stop (the
  // read that reaches it may overshoot by one poll's worth).
  static constexpr std::size_t held_dreq_reads = 64;
  /// A datagram's control messages in one pass: UDP_GRO's segment size
  /// into `seg` (left as it is without one), the IP fields once wanted.
  ip_fields control_of(const msghdr& h, std::size_t& seg) const noexcept;
  int fd_ = -1;
  int gsi_fd_ = -1;  // QP1's datagrams (-1: they arrive on fd_)
  int raw_fd_ = -1;
  std::uint16_t port_;
  gid local_;
  bool check_icrc_;
  bool gso_;
  std::array<tx_slot, quiet_batch> tx_{};
  std::size_t tx_count_ = 0;
  std::size_t tx_limit_ = batch;  // batch, or quiet_batch while management is quiet
  // Long ago at first: a new device sends bulk at full run length.
  std::chrono::steady_clock::time_point last_management_ = std::chrono::steady_clock::now() - std::chrono::hours(1);
  tx_slot urgent_{};
  // UDP GSO: runs of equal-sized packets of one flow leave in one
  // sendmsg through a UDP socket bound to the flow's source port, so the
  // kernel routes and builds headers once per run, not per packet.
  // At most max_gso_fds; when full, the least recently used one that has
  // been idle for flow_idle is closed for a new port.  A port that could
  // not be bound (-1) is tried again after flow_idle.
  struct gso_socket {
    int fd = -1;
    clock::time_point last_used{};
  };
  std::unordered_map<std::uint16_t, gso_socket> gso_fds_;
  static constexpr std::size_t max_gso_fds = 256;
  clock::time_point gso_evict_after_{};  // full and nothing idle: no scan before this
  wire::ipv4_id_icrc id_icrc_;     // the ICRCs of numbered datagrams we send
  wire::ipv4_id_icrc rx_id_icrc_;  // and those we receive: what a peer sends cannot evict ours
  wire::icrc_prefix_cache rx_prefixes_;  // deliver()'s ICRC check
  // Receive slots, set up once; a slot's packet is replaced when taken.
  std::array<packet*, rx_batch> rx_{};
  // Room for UDP_GRO's segment size and, once a UD QP exists, the traffic
  // class and hop limit (IP_TOS/IP_TTL, IPV6_TCLASS/IPV6_HOPLIMIT) and the
  // IPv6 flow label (IPV6_FLOWINFO).
  struct alignas(cmsghdr) cmsg_space {
    char b[4 * CMSG_SPACE(sizeof(int))];
    char* data() noexcept { return b; }
    static constexpr std::size_t size() noexcept { return sizeof b; }
  };
  std::array<sockaddr_storage, rx_batch> rx_from_{};
  std::array<mmsghdr, rx_batch> rx_msgs_{};
  std::array<iovec, rx_batch> rx_iov_{};
  std::array<cmsg_space, rx_batch> rx_control_{};  // traffic class, hop limit, flow label, once wanted
  // UDP GRO receive (with `gso`): room for a whole run per slot.
  bool gro_ = false;
  std::uint32_t gro_streak_ = 0;  // polls in a row that found a datagram
  // UDP_GRO is switched off while the traffic is a ping-pong: without a
  // segment size to report, a datagram comes through recvfrom(), about
  // 110 ns less kernel per poll than recvmsg() with its control message.
  // Only with the ICRC check, which a run read as one datagram fails.
  enum class gro_state : std::uint8_t {
    on,        // recvmsg() with the UDP_GRO control message
    draining,  // switched off; runs queued before may still be read
    off,       // recvfrom(): the kernel splits runs on arrival
  };
  gro_state gro_state_ = gro_state::on;
  std::uint32_t gro_window_ = 0;       // polls that found data, this window
  std::uint32_t gro_window_busy_ = 0;  // of which not a ping-pong's
  clock::time_point gro_drained_at_{};
  static constexpr std::uint32_t gro_window = 512;
  static constexpr std::chrono::milliseconds gro_drain_time{10};
  static constexpr int gro_on_burst = 8;  // datagrams in one read that switch UDP_GRO back on
  void set_gro(bool on) noexcept;
  static constexpr std::size_t gro_slots = 16;
  static constexpr std::size_t gro_slot_size = 65536;
  std::unique_ptr<std::byte[]> gro_buf_;
  std::array<mmsghdr, gro_slots> gro_msgs_{};
  std::array<iovec, gro_slots> gro_iov_{};
  std::array<cmsg_space, gro_slots> gro_control_{};

  // The peer socket: while the traffic is a ping-pong with one source (UDP_GRO
  // off, `peer_after` datagrams in a row from one address and port), a
  // second socket bound to our address and port and connected to that
  // source takes its datagrams.  The kernel finds a connected socket by
  // its 4-tuple (the hash of connected sockets), without the group's scan
  // and selector, and the read needs no address: a ping-pong's latency is
  // about 8 % lower (docs/wire.md).  The shared socket is read every
  // `peer_shared_every` polls (first right after the open: what the peer
  // sent before it is queued there); a datagram there from another source,
  // a run of polls that all found data (not a ping-pong any more) or
  // UDP_GRO going back on ends it: pointed at our own address, then read on
  // every poll, and closed at the first empty read `peer_close_time` later.
  int peer_fd_ = -1;
  bool peer_closing_ = false;        // pointed away, read on every poll, closed when due and empty
  // The kernel's timing (stragglers of softirq delivery), so the host's
  // steady clock, not the device's: a manual clock that stands still must
  // not keep the shared socket unread.
  std::chrono::steady_clock::time_point peer_close_at_{};
  std::chrono::steady_clock::time_point peer_shared_at_{};  // closing: the shared socket is read from then on
  gid peer_from_{};
  std::uint16_t peer_port_ = 0;
  std::uint32_t peer_polls_ = 0;
  std::uint32_t peer_streak_ = 0;    // polls in a row the peer socket had data
  bool other_source_ = false;        // the shared socket had another source's datagram
  gid peer_candidate_{};             // the source of the last datagrams on the shared socket
  std::uint16_t peer_candidate_port_ = 0;
  std::uint32_t peer_count_ = 0;     // how many in a row came from it
  clock::time_point peer_retry_at_{};  // after a socket that could not be opened
  std::uint64_t closed_peer_drops_ = 0;  // overflows of peer sockets since closed
  static constexpr std::uint32_t peer_after = 1024;
  static constexpr std::uint32_t peer_shared_every = 8;
  static constexpr std::uint32_t peer_streak_limit = 8;
  static constexpr std::chrono::milliseconds peer_close_time{2};
  static constexpr std::chrono::microseconds peer_straggle_time{50};
  /// A datagram from the shared socket: with the peer socket open, notes
  /// one from another source; else counts one from (`from`, `port`) read
  /// alone in a ping-pong (`lone`) and opens the peer socket after
  /// `peer_after` in a row.
  void note_source(const gid& from, std::uint16_t port, bool lone) noexcept;
  void open_peer(const gid& from, std::uint16_t port) noexcept;
  /// Starts closing the peer socket (points it away, reads what it holds).
  std::size_t close_peer() noexcept;
  void finish_closing_peer() noexcept;
  enum class peer_read : std::uint8_t {
    empty,    // nothing queued (or no packet buffer to read into)
    error,    // a pending socket error, reported once
    dropped,  // a datagram read and dropped
    queued,   // a datagram read and queued
  };
  /// One read of the peer socket.
  peer_read read_peer() noexcept;
  /// One datagram from the peer socket.
  std::size_t receive_peer() noexcept;
  /// What the peer socket holds, up to `limit` datagrams; `emptied` says
  /// whether the reading stopped at an empty socket (not at the limit).
  std::size_t drain_peer(std::size_t limit = rx_batch, bool* emptied = nullptr) noexcept;
  /// The shared data socket's read (the body of receive_gro()).
  std::size_t receive_shared() noexcept;
};

}  // namespace averbs::soft
