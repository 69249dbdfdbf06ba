// SPDX-License-Identifier: MIT
/// @file
/// Verbs value types: enumerations numbered like rdma-core's (`IBV_*`), so
/// converting is a cast, and the plain structures the verbs take and return.
///
/// `work_completion` is laid out exactly like `struct ibv_wc` (48 bytes) so a
/// completion can be copied to an rdma-core caller as is.  Warning: that
/// layout is frozen by the libibverbs ABI.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <averbs/error.hpp>

namespace averbs {

/// A 128-bit global identifier: an IPv6 address, or an IPv4 address mapped
/// as ::ffff:a.b.c.d (RoCEv2).
struct gid {
  std::array<std::uint8_t, 16> raw{};

  friend bool operator==(const gid& a, const gid& b) noexcept {
    // Two 8-byte compares: this sits on the per-packet path.
    std::uint64_t a0, a1, b0, b1;
    std::memcpy(&a0, a.raw.data(), 8);
    std::memcpy(&a1, a.raw.data() + 8, 8);
    std::memcpy(&b0, b.raw.data(), 8);
    std::memcpy(&b1, b.raw.data() + 8, 8);
    return ((a0 ^ b0) | (a1 ^ b1)) == 0;
  }
  bool is_zero() const noexcept;
  bool is_ipv4_mapped() const noexcept;
  /// The unspecified address: `::` or `0.0.0.0` (IPv4-mapped).
  bool is_unspecified() const noexcept;
  /// A group address: multicast (224.0.0.0/4, ff00::/8) or IPv4's limited
  /// broadcast (255.255.255.255).  No datagram comes from one.
  bool is_group() const noexcept;
  /// "::ffff:127.0.0.1" / "fe80::1" style text.
  std::string to_string() const;
  /// Parses an IPv4 or IPv6 address (IPv4 becomes IPv4-mapped).  Returns
  /// false for anything else.
  static bool parse(const std::string& text, gid& out);
  static gid from_ipv4(std::uint32_t host_order_addr) noexcept;
};

enum class mtu : std::uint8_t { mtu_256 = 1, mtu_512 = 2, mtu_1024 = 3, mtu_2048 = 4, mtu_4096 = 5 };
/// Bytes for an MTU enum value; 0 if out of range.
constexpr std::uint32_t mtu_bytes(mtu m) noexcept {
  const auto v = static_cast<unsigned>(m);
  return v >= 1 && v <= 5 ? 256u << (v - 1) : 0u;
}

enum class port_state : std::uint8_t { nop = 0, down = 1, init = 2, armed = 3, active = 4, active_defer = 5 };
enum class link_layer : std::uint8_t { unspecified = 0, infiniband = 1, ethernet = 2 };

/// Memory access flags (`IBV_ACCESS_*`).
enum access : std::uint32_t {
  access_local_write = 1,
  access_remote_write = 1 << 1,
  access_remote_read = 1 << 2,
  access_remote_atomic = 1 << 3,
  access_mw_bind = 1 << 4,
  access_zero_based = 1 << 5,
  access_on_demand = 1 << 6,
  access_hugetlb = 1 << 7,
  access_relaxed_ordering = 1 << 20,
};

enum class qp_type : std::uint8_t { rc = 2, uc = 3, ud = 4 };

enum class qp_state : std::uint8_t { reset = 0, init = 1, rtr = 2, rts = 3, sqd = 4, sqe = 5, err = 6 };
const char* to_string(qp_state s) noexcept;

enum class mig_state : std::uint8_t { migrated = 0, rearm = 1, armed = 2 };

/// `ibv_modify_qp` / `ibv_query_qp` attribute mask bits (`IBV_QP_*`).
enum qp_attr_mask : std::uint32_t {
  qp_attr_state = 1,
  qp_attr_cur_state = 1 << 1,
  qp_attr_en_sqd_async_notify = 1 << 2,
  qp_attr_access_flags = 1 << 3,
  qp_attr_pkey_index = 1 << 4,
  qp_attr_port = 1 << 5,
  qp_attr_qkey = 1 << 6,
  qp_attr_av = 1 << 7,
  qp_attr_path_mtu = 1 << 8,
  qp_attr_timeout = 1 << 9,
  qp_attr_retry_cnt = 1 << 10,
  qp_attr_rnr_retry = 1 << 11,
  qp_attr_rq_psn = 1 << 12,
  qp_attr_max_qp_rd_atomic = 1 << 13,
  qp_attr_alt_path = 1 << 14,
  qp_attr_min_rnr_timer = 1 << 15,
  qp_attr_sq_psn = 1 << 16,
  qp_attr_max_dest_rd_atomic = 1 << 17,
  qp_attr_path_mig_state = 1 << 18,
  qp_attr_cap = 1 << 19,
  qp_attr_dest_qpn = 1 << 20,
};

/// Work request opcodes (`IBV_WR_*`).
enum class wr_opcode : std::uint8_t {
  rdma_write = 0,
  rdma_write_with_imm = 1,
  send = 2,
  send_with_imm = 3,
  rdma_read = 4,
  atomic_cmp_and_swp = 5,
  atomic_fetch_and_add = 6,
  local_inv = 7,
  bind_mw = 8,
  send_with_inv = 9,
  /// RC: 8 bytes (the SGE list's, or inline) stored at `remote_addr` in
  /// one 64-bit store (IBTA 1.5 ATOMIC WRITE; `IBV_WR_ATOMIC_WRITE`).  Needs
  /// remote write access at the peer; counts against `max_rd_atomic`.
  atomic_write = 15,
};

/// Send flags (`IBV_SEND_*`).
enum send_flags : std::uint32_t {
  send_fence = 1,
  send_signaled = 1 << 1,
  send_solicited = 1 << 2,
  send_inline = 1 << 3,
  send_ip_csum = 1 << 4,
};

/// Completion opcodes (`IBV_WC_*` of `enum ibv_wc_opcode`).
enum class wc_opcode : std::int32_t {
  send = 0,
  rdma_write = 1,
  rdma_read = 2,
  comp_swap = 3,
  fetch_add = 4,
  bind_mw = 5,
  local_inv = 6,
  atomic_write = 9,
  recv = 128,
  recv_rdma_with_imm = 129,
};

/// Completion flags (`IBV_WC_*` of `enum ibv_wc_flags`).
enum wc_flags : std::uint32_t {
  wc_grh = 1,
  wc_with_imm = 1 << 1,
  wc_ip_csum_ok = 1 << 2,
  wc_with_inv = 1 << 3,
};

/// One completion, laid out like `struct ibv_wc`.
struct work_completion {
  std::uint64_t wr_id = 0;
  wc_status status = wc_status::success;
  wc_opcode opcode = wc_opcode::send;
  std::uint32_t vendor_err = 0;
  std::uint32_t byte_len = 0;
  /// Immediate data in network byte order (`wc_with_imm`), or the R_Key a
  /// SEND with invalidate invalidated (`wc_with_inv`).
  std::uint32_t imm_data = 0;
  std::uint32_t qp_num = 0;
  std::uint32_t src_qp = 0;
  std::uint32_t wc_flags = 0;
  std::uint16_t pkey_index = 0;
  std::uint16_t slid = 0;
  std::uint8_t sl = 0;
  std::uint8_t dlid_path_bits = 0;
};
static_assert(sizeof(work_completion) == 48, "frozen by the ibv_wc ABI");

/// A scatter/gather element.
struct sge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

enum class mw_type : std::uint8_t { type1 = 1, type2 = 2 };

/// What a memory-window bind grants.
struct mw_bind_info {
  std::uint32_t mr_lkey = 0;  ///< the MR the window lies in (its lkey)
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  std::uint32_t access = 0;  ///< remote access flags (and access_zero_based)
};

class ah;
class mw;

/// One send work request.  `sg_list` stays borrowed only during the post.
struct send_wr {
  std::uint64_t wr_id = 0;
  const sge* sg_list = nullptr;
  std::uint32_t num_sge = 0;
  wr_opcode opcode = wr_opcode::send;
  std::uint32_t flags = 0;  ///< send_flags
  /// Immediate data (network order) for *_with_imm, or the R_Key to
  /// invalidate for send_with_inv and local_inv.
  std::uint32_t imm_data = 0;
  std::uint64_t remote_addr = 0;  ///< RDMA and atomics
  std::uint32_t rkey = 0;         ///< RDMA and atomics
  std::uint64_t compare_add = 0;  ///< atomics: compare (CAS) or add (FAA)
  std::uint64_t swap = 0;         ///< CAS
  /// UD destination.
  const averbs::ah* ah = nullptr;
  std::uint32_t remote_qpn = 0;
  std::uint32_t remote_qkey = 0;
  /// bind_mw (type 2 windows): the window, the new R_Key and what it grants.
  averbs::mw* bind_mw = nullptr;
  std::uint32_t bind_rkey = 0;
  mw_bind_info bind_info{};
};

/// One receive work request.
struct recv_wr {
  std::uint64_t wr_id = 0;
  const sge* sg_list = nullptr;
  std::uint32_t num_sge = 0;
};

struct global_route {
  gid dgid{};
  std::uint32_t flow_label = 0;
  std::uint8_t sgid_index = 0;
  std::uint8_t hop_limit = 64;
  std::uint8_t traffic_class = 0;
};

/// An address vector (`struct ibv_ah_attr`).  On RoCE `is_global` must be
/// set and `grh.dgid` names the peer.
struct ah_attr {
  global_route grh{};
  std::uint16_t dlid = 0;
  std::uint8_t sl = 0;
  std::uint8_t src_path_bits = 0;
  std::uint8_t static_rate = 0;
  bool is_global = true;
  std::uint8_t port_num = 1;
};

struct qp_cap {
  std::uint32_t max_send_wr = 0;
  std::uint32_t max_recv_wr = 0;
  std::uint32_t max_send_sge = 0;
  std::uint32_t max_recv_sge = 0;
  std::uint32_t max_inline_data = 0;
};

/// `struct ibv_qp_attr`.
struct qp_attr {
  qp_state state = qp_state::reset;
  /// With qp_attr_cur_state: must be the QP's state, else invalid_argument
  /// (rxe instead moves from the state named; docs/verbs.md).
  qp_state cur_state = qp_state::reset;
  mtu path_mtu = mtu::mtu_1024;
  mig_state path_mig_state = mig_state::migrated;
  std::uint32_t qkey = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t sq_psn = 0;
  std::uint32_t dest_qp_num = 0;
  std::uint32_t qp_access_flags = 0;
  qp_cap cap{};
  ah_attr ah{};
  ah_attr alt_ah{};
  std::uint16_t pkey_index = 0;
  std::uint16_t alt_pkey_index = 0;
  bool en_sqd_async_notify = false;
  bool sq_draining = false;
  std::uint8_t max_rd_atomic = 0;
  std::uint8_t max_dest_rd_atomic = 0;
  std::uint8_t min_rnr_timer = 0;
  std::uint8_t port_num = 0;
  std::uint8_t timeout = 0;
  std::uint8_t retry_cnt = 0;
  std::uint8_t rnr_retry = 0;
  std::uint8_t alt_port_num = 0;
  std::uint8_t alt_timeout = 0;
};

enum class srq_attr_mask : std::uint32_t { max_wr = 1, limit = 2 };

struct srq_attr {
  std::uint32_t max_wr = 0;
  std::uint32_t max_sge = 0;
  std::uint32_t srq_limit = 0;
};

/// Asynchronous event types (`enum ibv_event_type`).
enum class event_type : std::uint8_t {
  cq_err = 0,
  qp_fatal = 1,
  qp_req_err = 2,
  qp_access_err = 3,
  comm_est = 4,
  sq_drained = 5,
  path_mig = 6,
  path_mig_err = 7,
  device_fatal = 8,
  port_active = 9,
  port_err = 10,
  lid_change = 11,
  pkey_change = 12,
  sm_change = 13,
  srq_err = 14,
  srq_limit_reached = 15,
  qp_last_wqe_reached = 16,
  client_reregister = 17,
  gid_change = 18,
};
const char* to_string(event_type t) noexcept;

/// An asynchronous event.  The element it concerns is named by number: the
/// QP number (`qp::num()`), the CQ's or SRQ's `handle()`, or the port
/// number.
struct async_event {
  event_type type = event_type::device_fatal;
  std::uint32_t element = 0;
};

/// `device_attr::device_cap_flags_ex`: RC ATOMIC WRITE is supported (the
/// kernel's `IB_UVERBS_DEVICE_ATOMIC_WRITE`, bit 40).
inline constexpr std::uint64_t device_cap_atomic_write = std::uint64_t{1} << 40;

/// `struct ibv_device_attr`, plus the limits rdma-core reports elsewhere.
struct device_attr {
  std::string fw_ver;
  std::uint64_t node_guid = 0;
  std::uint64_t sys_image_guid = 0;
  std::uint64_t max_mr_size = 0;
  std::uint64_t page_size_cap = 0;
  std::uint32_t vendor_id = 0;
  std::uint32_t vendor_part_id = 0;
  std::uint32_t hw_ver = 0;
  std::uint32_t max_qp = 0;
  std::uint32_t max_qp_wr = 0;
  std::uint32_t device_cap_flags = 0;
  /// `ibv_device_attr_ex::device_cap_flags_ex`: `device_cap_flags` and the
  /// kernel's 64-bit ones (device_cap_atomic_write).
  std::uint64_t device_cap_flags_ex = 0;
  std::uint32_t max_sge = 0;
  std::uint32_t max_sge_rd = 0;
  std::uint32_t max_cq = 0;
  std::uint32_t max_cqe = 0;
  std::uint32_t max_mr = 0;
  std::uint32_t max_pd = 0;
  std::uint32_t max_qp_rd_atom = 0;
  std::uint32_t max_ee_rd_atom = 0;
  std::uint32_t max_res_rd_atom = 0;
  std::uint32_t max_qp_init_rd_atom = 0;
  std::uint32_t max_ee_init_rd_atom = 0;
  std::uint32_t atomic_cap = 0;  ///< 0 none, 1 HCA, 2 global (IBV_ATOMIC_*)
  std::uint32_t max_ee = 0;
  std::uint32_t max_rdd = 0;
  std::uint32_t max_mw = 0;
  std::uint32_t max_raw_ipv6_qp = 0;
  std::uint32_t max_raw_ethy_qp = 0;
  std::uint32_t max_mcast_grp = 0;
  std::uint32_t max_mcast_qp_attach = 0;
  std::uint32_t max_total_mcast_qp_attach = 0;
  std::uint32_t max_ah = 0;
  std::uint32_t max_srq = 0;
  std::uint32_t max_srq_wr = 0;
  std::uint32_t max_srq_sge = 0;
  std::uint16_t max_pkeys = 0;
  std::uint8_t local_ca_ack_delay = 0;
  std::uint8_t phys_port_cnt = 0;
  std::uint32_t max_inline_data = 0;
};

/// `struct ibv_port_attr`.
struct port_attr {
  port_state state = port_state::down;
  mtu max_mtu = mtu::mtu_4096;
  mtu active_mtu = mtu::mtu_1024;
  std::uint32_t gid_tbl_len = 0;
  std::uint32_t port_cap_flags = 0;
  std::uint32_t max_msg_sz = 0;
  std::uint32_t bad_pkey_cntr = 0;
  std::uint32_t qkey_viol_cntr = 0;
  std::uint16_t pkey_tbl_len = 0;
  std::uint16_t lid = 0;
  std::uint16_t sm_lid = 0;
  std::uint8_t lmc = 0;
  std::uint8_t max_vl_num = 0;
  std::uint8_t sm_sl = 0;
  std::uint8_t subnet_timeout = 0;
  std::uint8_t init_type_reply = 0;
  std::uint8_t active_width = 0;
  std::uint8_t active_speed = 0;
  std::uint8_t phys_state = 0;
  averbs::link_layer link_layer = averbs::link_layer::ethernet;
};

/// Device counters: what the engine saw and dropped.
struct device_counters {
  std::uint64_t packets_sent = 0;
  std::uint64_t packets_received = 0;  ///< packets that passed the header checks for a QP here
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  /// Go-back-N resends started: after a sequence NAK, a timeout, an RNR
  /// wait, a missing READ/atomic response, or a tail probe that found a
  /// hole.
  std::uint64_t retransmits = 0;
  /// Expiries of the retransmit timer (IBTA's local ACK timeout) with
  /// something unacknowledged: each stalled its QP for the whole timeout.
  /// The last, which ends in retry_exc_err, resends nothing.
  std::uint64_t retry_timeouts = 0;
  /// Tail probes (docs/wire.md): a requester that had stopped sending
  /// heard nothing for 1/64 of its timeout (at least 250 us) and sent its
  /// oldest unacknowledged packet again, alone.  Not counted in
  /// `retransmits`.
  std::uint64_t tail_probes = 0;
  std::uint64_t rnr_naks_sent = 0;
  std::uint64_t rnr_naks_received = 0;
  std::uint64_t seq_naks_sent = 0;
  std::uint64_t duplicates_received = 0;
  std::uint64_t dropped = 0;  ///< invalid or unroutable packets, silently dropped
  std::uint64_t icrc_errors = 0;
  std::uint64_t receive_overflows = 0;  ///< datagrams the host dropped on a full socket receive buffer
  std::uint64_t completions = 0;
  /// `sendmmsg` calls that sent two or more datagrams, and `recvmmsg`
  /// calls that read two or more: the link's batching (docs/wire.md).
  std::uint64_t send_batches = 0;
  std::uint64_t receive_batches = 0;
  /// Packets a full socket send buffer refused (a queue in front of a
  /// slower wire): kept in order and sent at a later pass, while the
  /// device started no new requests.  None is lost to a full buffer unless
  /// thousands wait (then counted in `dropped`).
  std::uint64_t send_deferred = 0;
  /// Reads of the management socket put off because management datagrams
  /// (MADs) were still queued, or a packet MADs already went ahead of once
  /// waits: a flood of them waits in (and overflows) the socket's buffer
  /// instead of growing the device's memory and starving the data.
  std::uint64_t management_deferred = 0;
  std::uint64_t gso_runs = 0;  ///< runs of packets sent as one UDP GSO datagram
  std::uint64_t gso_packets = 0;  ///< packets sent inside those runs
  std::uint64_t gro_runs = 0;  ///< datagrams received holding several packets (UDP GRO)
  /// Of those, runs read without their segment size (queued as UDP_GRO went
  /// off) and split by the PSNs of their packets.
  std::uint64_t gro_runs_unsized = 0;
  /// Times the data socket's UDP_GRO was switched off (a ping-pong: reads
  /// are cheaper without it) or back on (a burst).
  std::uint64_t gro_switches = 0;
  /// Times a ping-pong's datagrams from one peer were given a socket of
  /// their own (connected to that peer: cheaper to receive on).
  std::uint64_t peer_sockets = 0;
  /// Datagrams sent alone through a flow's connected socket (RC and UC,
  /// with a raw socket), and the probes that learned those sockets' IPv4
  /// IDs (one per flow, and again after a failed send).
  std::uint64_t flow_sends = 0;
  std::uint64_t flow_id_probes = 0;
  /// Runs of MIDDLE packets of one message the in-process link carried as
  /// one (each counts in packets_sent as the packets it stands for).
  std::uint64_t loopback_runs = 0;
  std::uint64_t cq_overflows = 0;
  /// Packet buffers the device has allocated (its pool: in flight, queued
  /// or free).  It grows to the most packets ever in hand at once and
  /// stays there.
  std::uint64_t packet_buffers = 0;
  /// READ requests for the READ whose responses were going out, from a PSN
  /// those had passed (a lost response asked again): the responses started
  /// again there at once (docs/wire.md, READ under loss).
  std::uint64_t read_restarts = 0;
  /// Memory keys in use: one per memory region (its L_Key and R_Key are
  /// one key) and one per memory window.
  std::uint64_t memory_keys = 0;
  /// Timers queued on the device now (retransmit, RNR, lazy ACK, the
  /// connection manager's), cancelled ones not yet swept out included.
  std::uint64_t timers = 0;
  /// Timers the device had no memory to queue: each was queued again at the
  /// next pass, or, still short, run early (the CM's) or ended its QP
  /// (`qp_fatal`, a retransmit or RNR timer).
  std::uint64_t timers_lost = 0;
  /// What the device's fault injection (soft_device_options::faults,
  /// `--faults`; docs/wire.md) did to the packets it sent: dropped (also
  /// counted in `dropped`), sent twice, one bit flipped, held for the
  /// delay time, held to go out behind the next packet.
  std::uint64_t faults_dropped = 0;
  std::uint64_t faults_duplicated = 0;
  std::uint64_t faults_corrupted = 0;
  std::uint64_t faults_delayed = 0;
  std::uint64_t faults_reordered = 0;
};

}  // namespace averbs
