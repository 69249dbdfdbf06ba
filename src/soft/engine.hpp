// SPDX-License-Identifier: MIT
// The soft RDMA device engine (the "HCA"): verbs objects, the QP state
// machine, and the requester, responder and completer that run RC, UC and UD
// on RoCEv2 packets, structured as rxe structures them.
//
// Implementation overview
// -----------------------
// One lock (`device::lock_`) protects the whole engine; every entry point
// takes it.  Work runs to quiescence inside the calling thread (`run()`):
// posting a send runs the requester, whose packets cross the link; the
// loopback link queues them on this device's receive queue, which `run()`
// drains through the responder (requests) and the completer (responses)
// until nothing is left to do.  Timers (retransmit, RNR) live on the
// device's timer queue, on its injectable clock, and are driven by any
// context that opened the device (the device is one of its progress
// sources) and by poll_cq.
//
// Application memory is reached only through `memory_access`; payloads are
// carried by reference (zero copy) while a packet is inside one `run()`, and
// copied when a link must keep them.  Work queues are position-independent
// rings (ring.hpp); the engine-private state of each send WQE lives beside
// the ring, not in it.
#pragma once

#include "core/timer_queue.hpp"
#include "soft/gsi.hpp"
#include "soft/limits.hpp"
#include "soft/memory.hpp"
#include "soft/ring.hpp"
#include "wire/roce.hpp"

#include <averbs/async/clock.hpp>
#include <averbs/async/context.hpp>
#include <averbs/async/detail/core.hpp>
#include <averbs/verbs/types.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace averbs::soft {

class device;
struct pd_t;
struct mr_t;
struct mw_t;
struct cq_t;
struct srq_t;
struct qp_t;
struct packet;

/// Where a public handle's AH or window lives: its device, slot and
/// generation, copied when it was made (a handle never changes them).  The
/// engine looks it up under its lock (find_ah, find_mw), so a work request
/// naming one that another thread destroys meanwhile finds it gone instead
/// of reading freed memory.
struct object_ref {
  const device* owner = nullptr;
  std::uint32_t index = 0;
  std::uint32_t gen = 0;
};

/// `now + d`, saturating at the clock's end (a deadline that never comes)
/// instead of wrapping into the past: a manual clock may stand at
/// time_point::max().
inline clock::time_point deadline_after(clock::time_point now, clock::duration d) noexcept {
  return d >= clock::time_point::max() - now ? clock::time_point::max() : now + d;
}

// ---------------------------------------------------------------------------
// Work-queue entry layouts.  Warning: frozen once rings live in shared
// memory between the application and the daemon.

struct wqe_sge {
  std::uint64_t addr;
  std::uint32_t length;
  std::uint32_t lkey;
};

struct send_wqe {
  std::uint64_t wr_id;
  std::uint8_t opcode;  // averbs::wr_opcode
  std::uint8_t mw_type; // bind_mw: 1 (ibv_bind_mw) or 2 (IBV_WR_BIND_MW)
  std::uint16_t num_sge;
  std::uint32_t flags;  // averbs::send_flags
  std::uint32_t imm;    // immediate data (network order) or R_Key to invalidate
  std::uint32_t length; // total payload bytes
  std::uint64_t remote_addr;
  std::uint32_t rkey;
  std::uint32_t inline_len;  // inline payload bytes following the header
  std::uint64_t compare_add;
  std::uint64_t swap;
  std::uint32_t ah;          // UD: AH handle
  std::uint32_t remote_qpn;
  std::uint32_t remote_qkey;
  std::uint32_t mw;          // bind_mw: MW handle
  std::uint32_t bind_rkey;
  std::uint32_t bind_lkey;
  std::uint64_t bind_addr;
  std::uint64_t bind_length;
  std::uint32_t bind_access;
  std::uint32_t ah_gen;      // UD: the AH's generation (its slot may be reused)
  std::uint32_t mw_gen;      // bind_mw: the window's generation (its slot may be reused)
  // followed by wqe_sge[num_sge], or by inline_len bytes
  wqe_sge* sges() noexcept { return reinterpret_cast<wqe_sge*>(this + 1); }
  std::byte* inline_data() noexcept { return reinterpret_cast<std::byte*>(this + 1); }
};
static_assert(sizeof(send_wqe) % 8 == 0);

struct recv_wqe {
  std::uint64_t wr_id;
  std::uint32_t num_sge;
  std::uint32_t reserved;
  wqe_sge* sges() noexcept { return reinterpret_cast<wqe_sge*>(this + 1); }
};

/// The bytes a receive's SGEs hold together (more than a message may be:
/// post_recv refuses that, as rxe does).
inline std::uint64_t recv_length(const recv_wr& wr) noexcept {
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i < wr.num_sge; ++i) n += wr.sg_list[i].length;
  return n;
}

// ---------------------------------------------------------------------------
// Objects.  Every field is guarded by device::lock_.

/// A request parked on an object (CQ notification, async event).
struct parked {
  detail::context_impl* ctx;
  detail::request_id id;
};

/// The async events of one opened device handle (an `ibv_context`'s): a
/// QP's, CQ's or SRQ's go to the handle that created it (through its PD),
/// port and device events to every handle, as the kernel's uverbs files
/// have them.
/// One device handle's asynchronous events.  Raised events wait in a ring
/// allocated when the handle opens: raising one never allocates (it
/// happens where running out of memory could not be reported).
struct event_channel {
  // Further events are dropped, oldest kept -- but the last slot is kept
  // for device_fatal, which a program that never read its events must
  // still get (device.hpp promises it).
  static constexpr std::size_t capacity = 4096;
  std::vector<async_event> ring = std::vector<async_event>(capacity);
  std::size_t head = 0, count = 0;
  std::vector<parked> waiters;
  bool push(const async_event& e) noexcept {
    if (count == capacity || (count == capacity - 1 && e.type != event_type::device_fatal)) return false;
    ring[(head + count++) % capacity] = e;
    return true;
  }
  /// Drops the queued events of an object being freed (its type's events
  /// naming `element`), as the kernel drops a destroyed object's: a later
  /// object in its slot, with its number, must not get them.
  template <class Names>
  void purge(Names names) noexcept {
    std::size_t kept = 0;
    for (std::size_t k = 0; k < count; ++k) {
      const async_event e = ring[(head + k) % capacity];
      if (!names(e)) ring[(head + kept++) % capacity] = e;
    }
    count = kept;
  }
  bool pop(async_event& e) noexcept {
    if (count == 0) return false;
    e = ring[head];
    head = (head + 1) % capacity;
    --count;
    return true;
  }
};

struct pd_t {
  std::uint32_t handle = 0;
  event_channel* events = nullptr;  // the creating handle's (null once it closed)
  std::uint32_t children = 0;
  bool released = false;  // the user dropped it; freed with its last child
};

struct mr_t {
  pd_t* pd = nullptr;
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  std::uint64_t iova = 0;       // address the keys name (0 when zero-based)
  std::uint64_t length = 0;
  std::uint64_t host_addr = 0;  // application address of iova
  std::byte* host = nullptr;    // mapped pointer of host_addr, or null
  std::uint32_t access = 0;
  std::uint32_t bound_mws = 0;
};

enum class mw_state : std::uint8_t { free, valid };

struct mw_t {
  pd_t* pd = nullptr;
  mw_type type = mw_type::type1;
  std::uint32_t handle = 0;
  std::uint32_t gen = 0;          // which window in its slot: a bind queued for a freed one fails
  std::uint32_t rkey = 0;         // the key the window answers to now
  std::uint32_t posted_rkey = 0;  // type 1: the key of the last bind posted (what bind_mw returned)
  mw_state state = mw_state::free;
  mr_t* mr = nullptr;
  std::uint64_t addr = 0;    // first address the window's rkey names
  std::uint64_t length = 0;
  std::uint64_t mr_offset = 0;  // offset of the window inside the MR
  std::uint32_t access = 0;
  qp_t* qp = nullptr;        // type 2: the QP it is bound through
};

struct ah_t {
  pd_t* pd = nullptr;
  std::uint32_t handle = 0;
  std::uint32_t gen = 0;  // which AH in its slot: a send queued for a destroyed one fails
  ah_attr attr{};
  gid sgid{};
};


/// A parked CQ notification: next completion, or next solicited one.
struct cq_notify {
  parked p;
  bool solicited_only;
};

struct cq_t {
  std::uint32_t handle = 0;         // its slot in the device's table
  event_channel* events = nullptr;  // the creating handle's (null once it closed)
  ring q;
  /// The number async events name it by (`cq::handle()`): never 0, and not
  /// the number of an earlier CQ of the device (device::new_event_id), so
  /// an event delivered before a destroy cannot name the CQ that takes
  /// the slot next.
  std::uint32_t id = 0;
  std::uint32_t event_id() const noexcept { return id; }
  std::uint32_t cqe = 0;  // capacity the user sees
  std::uint32_t users = 0;
  bool armed = false;
  bool error = false;     // overflowed
  bool released = false;
  std::vector<cq_notify> notifies;
};

struct srq_t {
  std::uint32_t handle = 0;  // its slot in the device's table
  /// The number async events name it by (`srq::handle()`), as a CQ's.
  std::uint32_t id = 0;
  std::uint32_t event_id() const noexcept { return id; }
  pd_t* pd = nullptr;
  ring q;
  std::uint32_t max_wr = 0;
  std::uint32_t max_sge = 0;
  std::uint32_t limit = 0;  // armed when non-zero
  std::uint32_t users = 0;
  bool released = false;
};

enum class wqe_state : std::uint8_t { posted, processing, pending, done };

/// Engine-private state of one send WQE (parallel to the SQ ring).
struct send_state {
  wqe_state state = wqe_state::posted;
  wc_status status = wc_status::success;
  std::uint32_t first_psn = 0;
  std::uint32_t last_psn = 0;
  std::uint32_t sent = 0;        // payload bytes already sent
  std::uint32_t read_done = 0;   // READ: response bytes placed
  std::uint64_t read_va = 0;     // READ retried for the remainder: its VA
};

/// A READ, atomic or ATOMIC WRITE the responder executed, kept for duplicate replay.
struct rd_resource {
  enum class kind : std::uint8_t { none, read, atomic, atomic_write } type = kind::none;
  std::uint32_t first_psn = 0;
  std::uint32_t last_psn = 0;
  std::uint64_t va = 0;
  std::uint32_t rkey = 0;
  std::uint32_t length = 0;
  std::uint64_t orig = 0;  // atomic: the value before execution
};

struct qp_t {
  device* dev = nullptr;
  std::uint32_t qpn = 0;
  std::uint32_t index = 0;
  qp_type type = qp_type::rc;
  qp_state state = qp_state::reset;
  bool released = false;
  bool sq_sig_all = false;
  void* cm = nullptr;  // the connection manager drives this QP (gsi_agent::on_qp)
  pd_t* pd = nullptr;
  cq_t* scq = nullptr;
  cq_t* rcq = nullptr;
  srq_t* srq = nullptr;
  qp_cap cap{};
  std::uint32_t send_wqe_size = 0;
  ring sq;
  std::vector<send_state> sq_state;
  ring rq;

  // Attributes (modify_qp).
  std::uint32_t qkey = 0;
  std::uint32_t dest_qpn = 0;
  std::uint32_t access_flags = 0;
  mtu path_mtu = mtu::mtu_256;
  std::uint32_t mtu_bytes = 256;
  ah_attr av{};
  gid sgid{};
  std::uint16_t sport = 0;
  std::uint16_t pkey_index = 0;
  std::uint8_t port = 1;
  std::uint8_t timeout = 0;
  std::uint8_t retry_cnt = 0;
  std::uint8_t rnr_retry = 0;
  std::uint8_t min_rnr_timer = 0;
  std::uint8_t max_rd_atomic = 0;
  std::uint8_t max_dest_rd_atomic = 0;
  std::uint32_t sq_psn = 0;
  std::uint32_t rq_psn = 0;
  bool sqd_notify = false;
  bool sq_draining = false;
  bool sq_error_completed = false;  // complete_wqes posted the error that moves it to ERR (flush_qp)
  // The alternate path: never set (refused on RoCE), reported empty.
  ah_attr alt_av{};
  std::uint16_t alt_pkey_index = 0;
  std::uint8_t alt_port = 0;
  std::uint8_t alt_timeout = 0;
  mig_state path_mig_state = mig_state::migrated;

  // Go-back-N (IBTA 9.7.6.2): a WQE's PSN range is fixed when it starts,
  // taken from `next_psn`, which never goes back.  A retry only moves the
  // transmit position (`wqe_index` and each WQE's offset) back to
  // comp.psn; every packet's PSN follows from its WQE's range and offset.
  struct requester {
    bool started = false;           // RTR->RTS since the last reset: next_psn is live
    std::uint32_t wqe_index = 0;    // next WQE to transmit from (free-running)
    std::uint32_t start_index = 0;  // one past the last WQE ever started
    std::uint32_t psn = 0;          // PSN of the last packet transmitted + 1 (a retry moves it back)
    std::uint32_t next_psn = 0;     // first PSN of the next WQE to start
    std::uint32_t rd_atomic = 0;    // READ/atomic WQEs started and not done
    std::uint32_t noack_pkts = 0;   // packets sent since the last AckReq
    bool last_unasked = false;      // the last packet sent did not ask for an ACK
    std::uint32_t sent_psn = 0;     // one past the highest PSN ever transmitted
    bool scheduled = false;
    qp_t* next_ready = nullptr;     // the device's run queue (intrusive)
    bool probing = false;           // send_probe() is sending its one packet
    bool starved = false;           // stopped for want of a packet buffer (starve())
  } req;

  struct completer {
    std::uint32_t psn = 0;        // oldest PSN not yet acknowledged
    std::uint8_t retry_left = 0;
    std::uint8_t rnr_left = 0;
    bool timer_armed = false;      // the retransmit deadline below is live
    bool timer_scheduled = false;  // a heap entry of this generation exists
    bool rnr_waiting = false;
    bool gap_retry = false;        // a retry for a missing response is under way at `psn`
    bool retry_counted = false;    // a counted retry since the last progress (rxe's started_retry)
    bool ask_all = false;          // after a timeout on an unasked tail: every last packet asks
    std::uint8_t nak_retries = 0;  // uncounted retries for repeated sequence NAKs since the last progress
    // Tail probe (arm_tail_probe): armed when the requester stops (its
    // PSN window full or its send queue empty), and kept while anything
    // is unacknowledged; at most max_tail_probes sent per progress.  One heap entry
    // per QP: when it fires before `probe_at` it is put back there, as
    // the retransmit timer's is.
    bool probe_armed = false;
    bool probe_scheduled = false;  // a heap entry of this generation exists
    // Fell due with no progress: sent once the link has been read since
    // (run_due_probes), so that an answer already waiting counts first.
    bool probe_due = false;
    bool probed = false;                // one was sent since the last progress
    // How many (limits::max_tail_probes at most): each waits twice as long
    // as the one before.  A lost probe, or a lost last response to it,
    // then costs one more probe, not the whole retransmit timeout.
    std::uint8_t probes_sent = 0;
    clock::time_point probe_sent_at{};  // the last one's
    // That one was a READ's or atomic's request: its responses start at
    // probe_psn, and their first is no hole.
    bool probe_read = false;
    // comp.psn when it was armed: the PSN a probe resends, unchanged until
    // progress answers it (an answer ending at probe_psn + 1 found a hole).
    std::uint32_t probe_psn = 0;
    std::uint64_t probe_poll_mark = 0;  // link_polls_ when it fell due
    clock::time_point probe_at{};
    std::uint64_t timer_gen = 0;   // stale heap entries carry an older one
    clock::time_point deadline{};
    // A timer the heap had no memory for (schedule_qp_timer): what it was,
    // for recover_stalled_qps to schedule again.
    bool timer_lost = false;
    bool lost_rnr = false;
    std::uint64_t lost_gen = 0;
    clock::time_point lost_when{};
  } comp;

  struct responder {
    bool started = false;         // INIT->RTR since the last reset: psn is live
    std::uint32_t psn = 0;        // next expected request PSN
    std::uint32_t msn = 0;
    std::uint8_t last_opcode = 0xFF;  // previous request opcode; 0xFF none
    bool nak_sent = false;        // one PSN-sequence NAK per gap (unless it persists)
    std::uint32_t nak_count = 0;  // packets seen past the gap since the NAK
    bool rnr_seen = false;        // behind an RNR NAK: rnr_highest holds the pipeline's last PSN so far
    std::uint32_t rnr_highest = 0;
    bool rnr_nak = false;         // the NAK outstanding is an RNR NAK: the requester waits, then resends
    // Until then a packet past the gap was pipelined behind the RNR NAK'd
    // one; from then on it may follow a lost resend (rnr_pipeline_time).
    clock::time_point rnr_until{};
    bool drop_msg = false;        // UC: dropping until the next FIRST/ONLY
    bool comm_est = false;        // COMM_EST raised
    // The message in progress.
    bool have_wqe = false;
    std::uint32_t wqe_index = 0;  // RQ/SRQ slot of the receive in use
    recv_wqe* wqe = nullptr;
    std::vector<std::byte> srq_wqe;  // SRQ receives are copied out of the ring
    std::uint32_t offset = 0;     // bytes placed so far
    std::uint64_t va = 0;         // RDMA WRITE target of the message
    std::uint32_t rkey = 0;
    std::uint32_t length = 0;     // RETH length of the message
    std::uint32_t last_ack_psn = 0;
    std::uint32_t newest_psn = 0;  // of the newest SEND or WRITE taken in sequence
    bool ack_pending = false;      // a coalesced ACK waits for the queue to drain
    bool ack_lazy = false;         // an ACK nobody asked for waits (queue_lazy_ack)
    bool lazy_listed = false;      // in the device's lazy_acks_ (until its timer drains it)
    bool ack_listed = false;       // in the device's ack_ready_ (until flush_acks drains it)
    std::vector<rd_resource> resources;
    std::uint32_t res_head = 0;
    // The READ being answered.  Its responses leave a send batch per turn
    // of the run queue (device::responder_turn), as rxe's responder sends
    // one per step, not all at once: a 2 GiB READ neither holds the device
    // lock for its whole length nor queues half a million packets.  The
    // requests that arrive meanwhile wait in `held`, in order, so the
    // responder still executes requests one after the other (a WRITE
    // behind the READ cannot change what the READ returns).
    struct read_reply {
      bool active = false;
      bool continues = false;       // a duplicate's from past the READ's first PSN (MIDDLE/LAST)
      std::uint32_t first_psn = 0;  // of its first response
      std::uint32_t packets = 0;
      std::uint32_t sent = 0;
      std::uint64_t va = 0;
      std::uint32_t rkey = 0;
      std::uint32_t length = 0;
    } reading;
    packet* held_head = nullptr;
    packet* held_tail = nullptr;
    std::uint32_t held = 0;
  } resp;
};

// ---------------------------------------------------------------------------
// Packets.

struct packet {
  struct seg {
    const std::byte* p;
    std::uint32_t len;
  };
  static constexpr std::size_t max_segs = 4;
  static constexpr std::size_t buffer_size = 4096 + 64;

  std::array<std::byte, wire::max_header_size> header{};  // encoded BTH + ext headers
  std::uint8_t header_len = 0;
  wire::transport_headers hdr{};     // decoded
  const wire::opcode_info* op = nullptr;
  std::array<seg, max_segs> segs{};
  std::uint8_t nsegs = 0;
  std::uint32_t payload_len = 0;     // without pad
  /// Wire packets this one stands for: 1, or a run of `run` MIDDLE packets
  /// of one message, each a full path MTU of payload, PSNs psn .. psn+run-1.
  /// Only a link whose max_run() allows it carries runs (the in-process
  /// link: nothing between requester and responder can lose or reorder a
  /// part, so the responder places the run with one copy).  A run's payload
  /// is always by reference, never in `buf`.
  std::uint16_t run = 1;
  std::byte* buf = nullptr;          // owned payload storage (buffer_size)
  gid src{};
  gid dst{};
  std::uint16_t sport = 0;
  std::uint8_t hop_limit = 64;
  std::uint8_t tclass = 0;
  std::uint32_t flow_label = 0;  // as received (IPv6); sent as 0, as rxe
  bool has_icrc = false;
  /// `hdr` and `op` hold what the receiving link decoded from `header`
  /// (the UDP link decodes a datagram whole to check it): run() need not
  /// decode it again.  Cleared by alloc_packet().
  bool decoded = false;
  /// Read from the management socket (a MAD): counted while queued
  /// (device::mads_queued_).  Cleared by alloc_packet().
  bool management = false;
  /// Queued, and MADs read since went ahead of it: no more do until it is
  /// handled (device::poll_priority_every).  Cleared by alloc_packet().
  bool overtaken = false;
  std::uint32_t icrc = 0;            // as computed by the sender's device
  packet* next = nullptr;

  /// Copies the referenced payload into `buf` so the packet can outlive
  /// the memory it points to.
  void own_payload() noexcept;
};

/// Where packets leave the device.  Every member is called with the device
/// lock held.
class link {
 public:
  virtual ~link() = default;
  /// Takes ownership of the packet.  Payload references stay valid until
  /// the end of the current run (`flush()`); a link that keeps a packet
  /// longer must call `own_payload()`.
  virtual void send(packet* p) noexcept = 0;
  /// Sends at once, ahead of anything batched (management datagrams).
  virtual void send_urgent(packet* p) noexcept {
    send(p);
    flush();
  }
  /// The run is ending: push out anything batched.
  virtual void flush() noexcept {}
  /// Whether packets wait for room in a full send buffer: the device starts
  /// no new request or READ response packets meanwhile (rxe's requester
  /// waits alike for its packets in the qdisc).
  virtual bool send_blocked() const noexcept { return false; }
  /// The port went down (a cable cut): drops, counted, what the link holds
  /// to send later.
  virtual void drop_queued() noexcept {}
  /// Moves what has arrived into the device's receive queue; returns the
  /// number of packets.
  virtual std::size_t poll() noexcept { return 0; }
  /// Moves waiting management datagrams (QP1) to the front of the receive
  /// queue; cheap when there are none.  Called between packets of a long
  /// engine pass.
  virtual std::size_t poll_priority() noexcept { return 0; }
  /// True if the device must compute ICRCs for this link.
  virtual bool wants_icrc() const noexcept { return false; }
  /// The UDP ports the packet will carry on the wire (for the ICRC).
  virtual std::uint16_t wire_src_port(const packet& p) const noexcept { return p.sport; }
  virtual std::uint16_t wire_dst_port() const noexcept { return wire::roce_udp_port; }
  /// Datagrams the host dropped before the link could read them (a full
  /// socket receive buffer).
  virtual std::uint64_t receive_overflows() const noexcept { return 0; }
  /// A management datagram (QP1) arrived or left: a link that trades
  /// their latency for bulk throughput stops doing so for a while.
  virtual void note_management() noexcept {}
  /// How many packets the link sends in one go now (a requester's turn
  /// on a network link produces about that many).
  virtual std::size_t send_batch() const noexcept { return 8; }
  /// Whether management datagrams came or went lately (connections are
  /// being set up or torn down).
  virtual bool management_active(std::chrono::steady_clock::time_point) const noexcept { return false; }
  /// The longest run of MIDDLE packets the link carries as one packet
  /// (packet::run); 1 for a link that puts packets on a wire.
  virtual std::uint16_t max_run() const noexcept { return 1; }
  /// Whether every peer acknowledges a message whose last packet does not
  /// ask for it (lazily, as this engine's responder does): true where all
  /// peers are this engine (in-process); false on a wire, which may carry
  /// rxe, whose responder acknowledges only what asks.
  virtual bool peers_ack_unasked() const noexcept { return true; }
  /// A UD QP exists: received datagrams should carry their IP traffic
  /// class and hop limit (UD's GRH reports them), at the cost of control
  /// messages on every read from then on.
  virtual void want_ip_fields() noexcept {}
};

/// Puts a freed slot's index on its free list.  Out of memory -- a destroy
/// cannot report it -- the slot is given up instead (never reused), not
/// the process.
template <class List>
void free_slot(List& list, std::uint32_t i) noexcept {
  try {
    list.push_back(i);
  } catch (const std::bad_alloc&) {
  }
}

/// The host's addresses as GIDs (IPv4-mapped first, then IPv6; 127.0.0.1
/// if none): the embedded device's GID table.
std::vector<gid> host_addresses();

/// Injected faults on a link (a runtime setting of the shipped build).
struct fault_config {
  double drop = 0;       // probability per packet
  double duplicate = 0;
  double reorder = 0;  // held back behind the next packet (at most delay_time)
  double corrupt = 0;  // one bit flipped, outside BTH byte 4 (the ICRC catches it)
  double delay = 0;
  std::chrono::nanoseconds delay_time{std::chrono::microseconds(200)};
  std::uint64_t seed = 1;
  bool any() const noexcept { return drop > 0 || duplicate > 0 || reorder > 0 || corrupt > 0 || delay > 0; }
};

/// Parses "drop=0.01,dup=0.01,reorder=0.01,corrupt=0.01,delay=0.01,delay_us=200,seed=7".
bool parse_faults(const std::string& text, fault_config& out, std::string& error);

// ---------------------------------------------------------------------------

struct device_config {
  std::string name;
  averbs::clock* clock = nullptr;  // null: the real clock
  std::vector<gid> gids;           // empty: this host's addresses
  std::uint64_t node_guid = 0;     // 0: derived from the name
  std::uint32_t first_qpn = 0;     // 0: random (see limits::qpn_first_max)
  /// RoCEv2 over UDP bound to this address (its GID table is just it);
  /// zero: the in-process loopback link.
  gid address{};
  std::uint16_t port = wire::roce_udp_port;
  /// Verify received ICRCs (off for peers whose IPv4 ID is unknown, such
  /// as rxe and NICs).  The loopback link checks ICRCs only while faults
  /// that corrupt are configured.
  bool check_icrc = true;
  /// Send with a raw socket so each QP's UDP source port carries rxe's
  /// entropy (needs CAP_NET_RAW; without it the bound port is used).
  bool raw_send = true;
  /// UDP GSO for runs of packets (soft_device_options::gso).
  bool gso = true;
  fault_config faults{};
};

class device final : public progress_source, public clock_listener {
 public:
  explicit device(const device_config& cfg);
  ~device();
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  const std::string& name() const noexcept { return name_; }
  averbs::clock& clock() const noexcept { return *clock_; }

  // --- queries --------------------------------------------------------------
  device_attr query_device() const;
  std::error_code query_port(std::uint8_t port, port_attr& out) const;
  std::error_code query_gid(std::uint8_t port, std::uint32_t index, gid& out) const;
  std::error_code query_pkey(std::uint8_t port, std::uint16_t index, std::uint16_t& out) const;
  std::vector<gid> gids() const;
  device_counters counters() const;
  /// Whether packets wait for room to leave (the link's backlog).
  bool send_blocked() const;
  /// Finds the GID table index of a local address.
  bool find_gid(const gid& g, std::uint32_t& index) const;

  // --- objects ----------------------------------------------------------------
  /// A new handle's event queue; close_events() before the handle goes.
  /// Null once the device is removed (fatal()): it would never hear of it.
  event_channel* open_events();
  void close_events(event_channel* ch) noexcept;
  std::error_code alloc_pd(event_channel* events, pd_t*& out);
  std::error_code dealloc_pd(pd_t* pd);     ///< errc::busy with children
  void release_pd(pd_t* pd) noexcept;       ///< handle dropped

  std::error_code reg_mr(pd_t* pd, std::uint64_t addr, std::uint64_t length, std::uint32_t access,
                         mr_t*& out);
  std::error_code rereg_mr(mr_t* mr, int flags, pd_t* pd, std::uint64_t addr, std::uint64_t length,
                           std::uint32_t access);
  std::error_code dereg_mr(mr_t* mr);
  /// Handle dropped: unbinds any windows still on the region, then frees it.
  void release_mr(mr_t* mr) noexcept;

  std::error_code alloc_mw(pd_t* pd, mw_type type, mw_t*& out);
  std::error_code dealloc_mw(mw_t* mw);
  std::uint32_t mw_rkey(mw_t* mw) const;

  std::error_code create_ah(pd_t* pd, const ah_attr& attr, ah_t*& out);
  std::error_code destroy_ah(ah_t* ah);

  std::error_code create_cq(std::uint32_t cqe, event_channel* events, cq_t*& out);
  std::error_code resize_cq(cq_t* cq, std::uint32_t cqe);
  /// The capacity the user sees (resize_cq changes it).
  std::uint32_t cqe_of(cq_t* cq) const;
  std::error_code destroy_cq(cq_t* cq);     ///< errc::busy while QPs use it
  void release_cq(cq_t* cq) noexcept;

  std::error_code create_srq(pd_t* pd, const srq_attr& attr, srq_t*& out);
  std::error_code modify_srq(srq_t* srq, const srq_attr& attr, std::uint32_t mask);
  std::error_code query_srq(srq_t* srq, srq_attr& out);
  std::error_code destroy_srq(srq_t* srq);
  void release_srq(srq_t* srq) noexcept;

  struct qp_init {
    cq_t* send_cq = nullptr;
    cq_t* recv_cq = nullptr;
    srq_t* srq = nullptr;
    qp_cap cap{};
    qp_type type = qp_type::rc;
    bool sq_sig_all = false;
  };
  std::error_code create_qp(pd_t* pd, const qp_init& init, qp_t*& out);
  std::error_code modify_qp(qp_t* qp, const qp_attr& attr, std::uint32_t mask);
  /// Same, with lock() held (the connection manager).
  std::error_code modify_qp_locked(qp_t* qp, const qp_attr& attr, std::uint32_t mask);
  std::error_code query_qp(qp_t* qp, qp_attr& out, qp_cap& init_cap);
  qp_state state_of(qp_t* qp) const;
  /// Discards the QP's work without completions (as RESET) and frees it.
  std::error_code destroy_qp(qp_t* qp);

  // --- data path ---------------------------------------------------------------
  /// Posts a chain of `n` work requests; on failure `*bad` is the index of the
  /// first one not posted.
  std::error_code post_send(qp_t* qp, const send_wr* wrs, std::size_t n, std::size_t* bad);
  std::error_code post_recv(qp_t* qp, const recv_wr* wrs, std::size_t n, std::size_t* bad);
  std::error_code post_srq_recv(srq_t* srq, const recv_wr* wrs, std::size_t n, std::size_t* bad);
  /// type-1 memory window bind: posts a bind WQE.
  std::error_code bind_mw1(qp_t* qp, const object_ref& mw, std::uint64_t wr_id, std::uint32_t flags,
                           const mw_bind_info& info, std::uint32_t& new_rkey);
  std::size_t poll_cq(cq_t* cq, std::span<work_completion> out);

  /// Parks a CQ notification request (next completion, or next solicited).
  void arm_cq(cq_t* cq, bool solicited_only, detail::context_impl& ctx, detail::request_id id);
  /// Parks a request for the next async event of `ch` (completes at once if
  /// one is queued).
  void get_event(event_channel* ch, detail::context_impl& ctx, detail::request_id id);
  /// Raises a port event and sets the port state (tests pull the cable).
  void set_port_state(port_state s);
  /// Raises DEVICE_FATAL, moves every QP to error, fails parked requests.
  void fatal();

  // --- QP1 (general services) -----------------------------------------------------
  // Everything here needs lock() held.
  /// The agent that owns QP1 (the connection manager).
  gsi_agent& gsi() noexcept { return *gsi_; }
  std::uint64_t node_guid() const noexcept { return node_guid_; }
  bool removed() const noexcept { return fatal_; }
  const std::vector<gid>& gid_table() const noexcept { return gids_; }
  /// An address vector a packet can leave by (an AH's, a QP path's): a
  /// GRH (RoCE, rdma_check_ah_attr) on port 1 naming one of our GIDs, a
  /// destination, both of one family (the kernel's route resolution
  /// refuses a mixed pair).  The GID table never changes: no lock needed.
  bool valid_av(const ah_attr& av) const noexcept {
    return av.is_global && av.port_num == 1 && av.grh.sgid_index < gids_.size() && !av.grh.dgid.is_zero() &&
           !av.grh.dgid.is_group() &&  // a connected QP's peer is one port
           gids_[av.grh.sgid_index].is_ipv4_mapped() == av.grh.dgid.is_ipv4_mapped();
  }
  /// The hop limit a packet to `dst` leaves with.  As the kernel's RoCE
  /// route resolution does for a user AH or a connected QP's path
  /// (ib_resolve_eth_dmac), the route's replaces the AV's: a zero-filled
  /// AV does not send TTL 0, and query reports what is sent.
  std::uint8_t route_hop_limit(const gid& dst) const noexcept {
    return dst.is_ipv4_mapped() ? hop_limit_v4_ : hop_limit_v6_;
  }
  /// Whether the port carries packets (ACTIVE); else `p` is dropped and
  /// counted (soft_device::set_port_state: a cable pulled).
  bool port_carries(packet* p) noexcept;
  mtu active_mtu() const noexcept;
  /// Sends one 256-byte MAD from QP1 to `dqpn` at `dst` (UD SEND_ONLY,
  /// Q_Key 0x80010000), ahead of queued data.
  void send_mad(const gid& src, const gid& dst, std::uint32_t dqpn, std::span<const std::byte> mad,
                std::uint8_t hop_limit, std::uint8_t traffic_class) noexcept;
  /// Adds a timer on the device's clock (runs with lock() held).  Given
  /// `alive` (called with lock() held), a timer its owner cancels long
  /// before its deadline is swept out once the owner says so
  /// (timer_cancelled()), instead of waiting in the queue until then.
  bool schedule_timer(clock::time_point when, detail::timer_fn fn, void* arg, const detail::timer_payload& p,
                      detail::timer_alive_fn alive = nullptr) noexcept;
  /// One timer scheduled with `alive` was cancelled (lock() held).
  void timer_cancelled() noexcept { timers_.note_cancelled(); }
  /// The agent (QP1's) has work a shortage of memory stopped: its
  /// recover() runs at the start of the next pass (lock() held).
  void recover_agent_later() noexcept {
    agent_recovery_ = true;
    signal_pending();
  }
  /// Keeps `obj` alive until lock() is next released by the engine, and
  /// releases it then: user-side handles whose destructor takes the lock
  /// must not die while it is held.
  void release_later(std::shared_ptr<void> obj) noexcept;
  /// Releases what release_later() kept.  Call without the lock.
  void drain_released() noexcept;
  /// Ends the current engine pass early: a request completed, and the
  /// thread driving the engine may be the one waiting for it.
  void yield_pass() noexcept { yield_now_ = true; }
  /// Lets the engine handle what the CM queued: the in-process link
  /// delivers into this device's receive queue, which needs a pass; a
  /// network link has sent already, and a pass here would only delay the
  /// caller behind queued data.
  void kick() noexcept {
    if (!yield_) run();
  }

  // --- the link ----------------------------------------------------------------
  /// Sets the faults injected on the outgoing link.
  void set_faults(const fault_config& f);
  /// The UDP port of the link (0: loopback).
  std::uint16_t udp_port() const noexcept;
  /// Watches a descriptor of the link: the device's progress descriptor
  /// becomes readable with it.
  void watch_fd(int fd);
  /// Same, except while a program busy-polls its CQs and no context sleeps
  /// on the device: a socket in an epoll set costs a wake-up callback per
  /// datagram, which such a data path pays for nothing.  progress() and
  /// sleeping() put it back.
  void watch_fd_unless_busy(int fd);
  /// Takes `fd` out of the descriptors watch_fd_unless_busy() added.
  void forget_fd(int fd) noexcept;
  /// A packet arrived from the link (takes ownership).  Must hold lock_.
  void receive_locked(packet* p);
  /// Same, ahead of everything queued (management datagrams).
  void receive_front_locked(packet* p);
  packet* alloc_packet() noexcept;
  void free_packet(packet* p) noexcept;
  std::mutex& lock() noexcept { return lock_; }

  // --- progress_source, clock_listener ---------------------------------------------
  int native_handle() const noexcept override { return ep_; }
  bool busy_poll() const noexcept override { return busy_poll_; }
  void progress() noexcept override;
  void sleeping(bool armed) noexcept override;
  void on_clock_changed() noexcept override;

 private:
  friend class loopback_link;
  friend class fault_link;
  friend class udp_link;
  struct key_entry {
    enum class kind : std::uint8_t { free, mr, mw } type = kind::free;
    std::uint8_t key = 0;
    void* obj = nullptr;
  };

  // Must hold lock_ for everything below.
  void run() noexcept;
  /// The device clock, read at most once per engine pass: the retransmit
  /// deadline moves with every request and every ACK, and a clock read
  /// for each was 6 % of the in-process message rate.  Stale by at most
  /// 64 turns of the pass loop (microseconds), which only makes a
  /// deadline early by as much.
  clock::time_point pass_now() noexcept {
    if (!pass_now_valid_) {
      if (!running_) return clock_->now();
      pass_now_ = clock_->now();
      pass_now_valid_ = true;
    }
    return pass_now_;
  }
  /// One clock read for a poll and the pass after it (a clock read costs
  /// ~25 ns on the reference VM, and a ping-pong's turnaround read it
  /// eight times): the pass's budget starts at `now`, and when the device
  /// clock is CLOCK_MONOTONIC too, pass_now() is `now` as well.
  void seed_pass(std::chrono::steady_clock::time_point now) noexcept {
    pass_started_ = now;
    pass_started_valid_ = true;
    if (clock_is_steady_) {
      pass_now_ = clock::time_point(std::chrono::duration_cast<clock::duration>(now.time_since_epoch()));
      pass_now_valid_ = true;
    }
  }
  void destroy_qp_locked(qp_t* qp) noexcept;
  /// A child of `pd` went away: frees a released PD with its last child.
  void drop_pd_child(pd_t* pd) noexcept;
  std::error_code dereg_mr_locked(mr_t* mr) noexcept;
  void receive_gsi(packet* p) noexcept;
  void schedule_requester(qp_t* qp) noexcept;
  void requester(qp_t* qp) noexcept;
  bool send_packet_of(qp_t* qp, std::uint32_t index) noexcept;
  void respond(qp_t* qp, packet* p) noexcept;
  void respond_ud(qp_t* qp, packet* p) noexcept;
  void respond_duplicate(qp_t* qp, packet* p) noexcept;
  void complete_rx(qp_t* qp, packet* p) noexcept;
  void complete_wqes(qp_t* qp) noexcept;
  void retry(qp_t* qp, bool count) noexcept;
  void gap_retry(qp_t* qp) noexcept;
  void fail_oldest(qp_t* qp, wc_status status) noexcept;
  void arm_retry_timer(qp_t* qp) noexcept;
  void note_request_sent(qp_t* qp) noexcept;
  /// A go-back-N resend is under way: the transmit position is behind the
  /// highest PSN ever sent.
  static bool resending(const qp_t* qp) noexcept { return wire::psn_compare(qp->req.psn, qp->req.sent_psn) < 0; }
  void disarm_timers(qp_t* qp) noexcept;
  void schedule_qp_timer(qp_t* qp, clock::time_point when, bool rnr) noexcept;
  void add_qp_timer(std::uint32_t qpn, std::uint64_t gen, clock::time_point when, bool rnr);
  /// Whether a QP timer (retransmit, RNR, tail probe; payload: the QPN in
  /// the low 32 bits of `a`, the generation in `b`) is still its QP's.  The
  /// timer queue's sweep asks, under the device lock (disarm_timers and
  /// the CM's disarm are what ask for a sweep).
  static bool qp_timer_alive(void* arg, const detail::timer_payload& p) noexcept;
  void recover_stalled_qps() noexcept;
  bool starve(qp_t* qp) noexcept;
  void park(qp_t* qp) noexcept;
  void flush_ack(qp_t* qp) noexcept;
  /// Sends the ACK `qp` holds (coalesced or lazy), now, ahead of anything
  /// queued after it: before the QP stops (ERR, destroy), when no later
  /// pass would send it.
  void send_held_ack(qp_t* qp) noexcept;
  void flush_acks() noexcept;
  void list_ack(qp_t* qp) noexcept;
  void queue_lazy_ack(qp_t* qp) noexcept;
  void on_lazy_ack_timer() noexcept;
  void on_ack_timer() noexcept;
  void on_qp_timer(std::uint32_t qpn, std::uint64_t gen, bool rnr) noexcept;
  static std::chrono::nanoseconds tail_probe_delay(const qp_t* qp) noexcept;
  void arm_tail_probe(qp_t* qp) noexcept;
  static bool requester_stops(qp_t* qp) noexcept;
  /// The QP numbered `qpn`, or null (none, or another device's number).
  qp_t* qp_by_number(std::uint32_t qpn) const noexcept {
    return qpn >= first_qpn_ && qpn - first_qpn_ < qps_.size() ? qps_[qpn - first_qpn_].get() : nullptr;
  }
  /// The oldest started WQE not yet done, and its index; null if none.
  static send_state* oldest_unfinished(qp_t* qp, std::uint32_t& index) noexcept;
  void schedule_tail_probe(qp_t* qp) noexcept;
  void on_tail_probe(std::uint32_t qpn, std::uint64_t gen) noexcept;
  void consider_tail_probe(qp_t* qp, clock::time_point now, bool link_read) noexcept;
  void run_due_probes() noexcept;
  void send_probe(qp_t* qp) noexcept;
  void qp_to_error(qp_t* qp) noexcept;
  /// UC and UD: a send queue error stops the send queue only (SQE).
  void qp_to_sqe(qp_t* qp) noexcept;
  void flush_held_srq_recv(qp_t* qp) noexcept;
  /// Removes the QP's completions from its CQs (RESET and destroy).
  void clean_cqs(const qp_t* qp) noexcept;
  void set_source_port(qp_t* qp) noexcept;
  void flush_qp(qp_t* qp) noexcept;
  /// False if the send CQ overran.
  bool flush_sq(qp_t* qp) noexcept;
  /// Posting to a QP in ERR flushes everything, in SQE its send queue.
  void flush_posted(qp_t* qp) noexcept;
  void check_sq_drained(qp_t* qp) noexcept;
  bool post_cqe(cq_t* cq, const work_completion& wc, bool solicited) noexcept;
  /// Drop an object's queued events as its slot is freed.
  void purge_cq_events(const cq_t* cq) noexcept;
  void purge_srq_events(const srq_t* srq) noexcept;
  void purge_qp_events(const qp_t* qp) noexcept;
  /// Queues an event on `ch` (dropped if its handle has closed).
  void raise_event(event_channel* ch, event_type t, std::uint32_t element) noexcept;
  /// A port or device event: every handle gets it.
  void broadcast_event(event_type t, std::uint32_t element) noexcept;
  void send_ack(qp_t* qp, std::uint8_t syndrome, std::uint32_t psn) noexcept;
  void send_rnr_nak(qp_t* qp, std::uint32_t psn) noexcept;
  void send_atomic_ack(qp_t* qp, std::uint32_t psn, std::uint64_t orig) noexcept;
  void send_empty_read_response(qp_t* qp, std::uint32_t psn) noexcept;
  void start_read_reply(qp_t* qp, std::uint32_t psn, const wire::reth& t, bool continues) noexcept;
  bool pump_read_reply(qp_t* qp) noexcept;
  void responder_turn(qp_t* qp) noexcept;
  /// A READ is being answered, or requests wait behind one: new requests
  /// wait too, and the QP's turn on the run queue is its responder's first.
  static bool answering_read(const qp_t* qp) noexcept {
    return qp->resp.reading.active || qp->resp.held_head != nullptr;
  }
  void hold_request(qp_t* qp, packet* p) noexcept;
  void drop_held_requests(qp_t* qp) noexcept;
  bool rewinds_read(qp_t* qp, const packet* p) noexcept;
  packet* new_packet(qp_t* qp, wire::opcode op, std::uint32_t psn) noexcept;
  void finish_packet(qp_t* qp, packet* p) noexcept;
  void transmit(packet* p) noexcept;
  std::uint32_t icrc_of(const packet* p, std::uint16_t sport, std::uint16_t dport) noexcept;
  void compute_icrc(packet* p) noexcept;
  bool verify_icrc(const packet* p, std::uint16_t src_port, std::uint16_t dst_port) noexcept;
  bool next_recv(qp_t* qp) noexcept;
  /// Completes the receive in use in error (it is consumed) and posts it.
  /// Completes the receive in use with `status`; false if its CQ could not take it.
  bool fail_recv_wqe(qp_t* qp, wc_status status, std::uint32_t src_qp) noexcept;
  void consume_recv(qp_t* qp) noexcept;
  void check_srq_limit(srq_t* srq) noexcept;
  std::error_code post_one_send(qp_t* qp, const send_wr& wr) noexcept;

  // Keys and memory.
  mr_t* lookup_lkey(pd_t* pd, std::uint32_t lkey) noexcept;
  mr_t* find_mr(std::uint32_t lkey) noexcept;  ///< the MR with this L_Key, whatever its PD
  /// Resolves an R_Key range for remote access: MR or MW, PD, access, bounds.
  /// On success `host` (may be null) and `addr` name the range's start.
  bool resolve_rkey(qp_t* qp, std::uint32_t rkey, std::uint64_t va, std::uint64_t len, std::uint32_t need,
                    std::byte*& host, std::uint64_t& addr) noexcept;
  /// How many MIDDLE packets of send WQE `w` the next packet, at `psn`,
  /// may carry as one run (1: no run).
  std::uint32_t run_length(qp_t* qp, send_wqe* w, std::uint32_t psn, std::uint32_t remaining) noexcept;
  bool copy_from_sges(pd_t* pd, wqe_sge* sges, std::uint32_t nsge, std::uint32_t offset, std::uint32_t len,
                      packet* p) noexcept;
  bool copy_to_sges(pd_t* pd, wqe_sge* sges, std::uint32_t nsge, std::uint32_t offset, const packet* p,
                    std::uint32_t skip, std::uint32_t len) noexcept;
  bool write_host(std::byte* host, std::uint64_t addr, const packet* p, std::uint32_t skip,
                  std::uint32_t len) noexcept;
  std::error_code invalidate_rkey(pd_t* pd, std::uint32_t rkey, qp_t* qp, bool remote) noexcept;
  std::error_code bind_mw(qp_t* qp, send_wqe* w) noexcept;
  /// The live AH or window `r` names, or null (gone, or another device's:
  /// a caller may pass one).  Must hold lock_.
  ah_t* find_ah(const object_ref& r) const noexcept { return find_live(ahs_, r); }
  mw_t* find_mw(const object_ref& r) const noexcept { return find_live(mws_, r); }
  template <class T>
  T* find_live(const std::vector<std::unique_ptr<T>>& table, const object_ref& r) const noexcept {
    return r.owner == this && r.index < table.size() && table[r.index] != nullptr &&
                   table[r.index]->gen == r.gen
               ? table[r.index].get()
               : nullptr;
  }
  std::uint32_t alloc_key(key_entry::kind k, void* obj) noexcept;
  void free_key(std::uint32_t key) noexcept;

  std::string name_;
  averbs::clock* clock_;
  std::uint64_t node_guid_;
  std::vector<gid> gids_;
  std::uint8_t hop_limit_v4_ = 64;  // route_hop_limit(), read at creation
  std::uint8_t hop_limit_v6_ = 64;
  port_state port_state_ = port_state::active;
  std::uint32_t bad_pkey_cntr_ = 0;   // PortInfo P_KeyViolations (query_port)
  std::uint32_t qkey_viol_cntr_ = 0;  // PortInfo Q_KeyViolations
  /// PortInfo's violation counters are 16 bits and stop at their maximum
  /// (as rxe's), not wrap.
  static void count_violation(std::uint32_t& c) noexcept {
    if (c < 0xFFFF) ++c;
  }
  mtu active_mtu_ = mtu::mtu_4096;  // from the interface MTU of a UDP device
  bool fatal_ = false;  // the device was removed
  direct_memory direct_;
  memory_access* mem_ = &direct_;

  mutable std::mutex lock_;
  bool running_ = false;
  clock::time_point pass_now_{};
  bool pass_now_valid_ = false;  // pass_now_ was read in this pass (or seeded for it)
  std::chrono::steady_clock::time_point pass_started_{};
  bool pass_started_valid_ = false;  // seed_pass() gave the next pass its start
  bool clock_is_steady_ = false;     // clock_ reads CLOCK_MONOTONIC, as std::chrono::steady_clock
  link* link_;                    // faults_ when faults are set, else base_link_
  std::unique_ptr<link> base_link_;
  std::unique_ptr<link> faults_;
  int ep_ = -1;                   // the progress descriptor: timer + link fds
  std::mutex sleep_mu_;
  int sleepers_ = 0;              // contexts asleep on ep_; Must hold sleep_mu_.
  std::vector<int> sleep_fds_;    // watched unless the CQs are busy-polled; Must hold sleep_mu_.
  std::atomic<bool> fds_watched_{true};  // a fresh device is watched: an event loop may wait on it first
  // While the CQs are busy-polled (sockets unwatched) nobody sleeps on ep_
  // and poll_cq() runs the timers by the clock: the timerfd is not
  // re-armed then (a syscall per deadline); watch_locked() arms it with
  // this.  Must hold sleep_mu_.
  clock::time_point timer_fd_wanted_ = clock::time_point::max();
  bool timer_fd_stale_ = false;
  bool timer_fd_set_ = false;  // armed since last drained: it may have fired.  Must hold sleep_mu_.
  std::atomic<std::uint32_t> busy_passes_{0};  // link polls since the sockets were (re)watched
  void unwatch_if_busy() noexcept;
  /// Puts the sleep descriptors (back) into ep_.  Must hold sleep_mu_.
  void watch_locked() noexcept;
  bool busy_poll_ = false;
  packet* rx_head_ = nullptr;
  packet* rx_tail_ = nullptr;
  packet* rx_front_last_ = nullptr;  // the last management datagram queued ahead of the data
  /// Management datagrams on the receive queue.  None is read while any
  /// waits: a flood of MADs (each answered with a send that costs more than
  /// its read) would otherwise grow the queue, and the packet pool, which
  /// never shrinks, without bound, or keep its front full and the data
  /// behind unreached; and a packet already overtaken by MADs is not
  /// overtaken again.  The socket's buffer holds the rest, and drops what
  /// it cannot.
  std::size_t mads_queued_ = 0;
  /// After a MAD, the sends waiting (a requester's turn, ACKs) go once
  /// before the next packet received, in this pass or the next (one MAD
  /// may take a whole pass's budget): a flood of MADs keeps the receive
  /// queue from draining, which is when they would go otherwise, and a
  /// connection's messages and ACKs stopped for as long as it lasted.
  bool sends_turn_ = false;
  // The run queue: QPs with packets to send, a requester's or READ
  // responses (schedule_requester(); a turn runs responder_turn(), then
  // requester()), in order; intrusive so scheduling never allocates.
  qp_t* req_head_ = nullptr;
  qp_t* req_tail_ = nullptr;
  std::vector<qp_t*> ack_ready_;  // QPs with a coalesced ACK to send; capacity >= live QPs (create_qp)
  std::vector<qp_t*> lazy_acks_;  // QPs with an unrequested ACK to send later
  bool lazy_timer_pending_ = false;
  static constexpr std::chrono::microseconds lazy_ack_delay{100};
  // A tail probe waits 1/64 of the QP's retransmit timeout, at least this
  // long; none is sent when that is more than a quarter of the timeout.
  static constexpr std::chrono::microseconds tail_probe_floor{250};
  // How long after an RNR NAK the packets past its gap still count as the
  // requester's pipeline, at least (send_rnr_nak): a burst queued in the
  // socket while the engine was busy is read well after it was sent.
  static constexpr std::chrono::milliseconds rnr_pipeline_time{1};
  std::uint64_t link_polls_ = 0;  // poll_link() calls (run_due_probes)
  std::uint32_t probes_due_ = 0;  // QPs with probe_due set, at the last count
  // Network links hold coalesced ACKs for one engine pass, so they leave in
  // the same batch as the reply the application is about to post (a
  // loopback sendmsg costs microseconds).  A timer sends them if nothing
  // runs meanwhile.
  bool ack_defer_ = false;
  // A network device's engine pass yields after this long (see run()).
  static constexpr std::chrono::microseconds pass_budget{10};
  // ... and reads the management socket at least this often.
  static constexpr std::chrono::microseconds priority_interval{4};
  // ... or this often while connections are being set up.
  static constexpr std::chrono::microseconds busy_priority_interval{1};
  std::chrono::steady_clock::time_point last_priority_poll_{};
  bool yield_now_ = false;
  bool yield_ = false;
  int pending_fd_ = -1;          // readable while queued work waits for a pass
  bool pending_signaled_ = false;
  void poll_link() noexcept;
  /// Reads the management socket if `interval` has passed since it last was.
  void poll_priority_every(std::chrono::steady_clock::time_point now, std::chrono::microseconds interval) noexcept;
  void signal_pending() noexcept;
  bool acks_held_ = false;
  bool ack_timer_pending_ = false;
  std::uint32_t polls_ = 0;
  packet* free_packets_ = nullptr;
  std::vector<std::unique_ptr<packet>> packet_store_;
  std::vector<std::unique_ptr<std::byte[]>> buffer_store_;

  // Object tables.
  std::vector<std::unique_ptr<pd_t>> pds_;
  std::vector<std::uint32_t> free_pds_;
  std::vector<key_entry> keys_;  // index = key >> 8
  // Free key indices, oldest first: a ring as long as keys_ (free_key()
  // must not allocate).  An index comes back only once key_reuse_distance
  // others are free behind it, with a random key byte (alloc_key()).
  std::vector<std::uint32_t> free_keys_;
  std::size_t free_head_ = 0;
  std::size_t free_count_ = 0;
  std::uint64_t key_random_ = 0;            // splitmix64 state (soft/splitmix.hpp), seeded from the OS
  std::vector<std::unique_ptr<mr_t>> mrs_;  // owns MRs (by key index)
  std::vector<std::unique_ptr<mw_t>> mws_;
  std::vector<std::unique_ptr<ah_t>> ahs_;
  std::vector<std::uint32_t> free_ahs_;
  std::vector<std::unique_ptr<cq_t>> cqs_;
  std::vector<std::uint32_t> free_cqs_;
  // The last number a CQ or SRQ was given for its events (cq_t::id).
  std::uint32_t last_event_id_ = 0;
  std::uint32_t new_event_id() noexcept {
    if (++last_event_id_ == 0) ++last_event_id_;  // (0 names nothing)
    return last_event_id_;
  }
  std::vector<std::unique_ptr<srq_t>> srqs_;
  std::vector<std::uint32_t> free_srqs_;
  std::vector<std::unique_ptr<qp_t>> qps_;  // index = qpn - first_qpn_
  std::uint32_t first_qpn_ = limits::qpn_base;  // random; see limits::qpn_first_max
  std::deque<std::uint32_t> free_qps_;      // FIFO: a QPN is reused late
  std::uint32_t ah_gen_ = 0;  // the last AH generation given
  std::uint32_t mw_gen_ = 0;  // the last MW generation given
  std::uint32_t live_pds_ = 0, live_mrs_ = 0, live_mws_ = 0, live_ahs_ = 0, live_cqs_ = 0,
                live_srqs_ = 0, live_qps_ = 0;

  // Async events.
  std::vector<std::unique_ptr<event_channel>> channels_;

  // Timers.
  detail::timer_queue timers_;
  std::uint32_t lost_timers_ = 0;  // QPs with comp.timer_lost set
  std::uint32_t starved_requesters_ = 0;  // QPs with req.starved set
  bool agent_recovery_ = false;           // recover_agent_later() was called
  std::uint64_t qp_generation_ = 0;       // QPs created: the high half of each one's first timer_gen
  int timer_fd_ = -1;
  clock::time_point armed_deadline_ = clock::time_point::max();
  /// Points the timer descriptor at the heap's earliest deadline (`force`:
  /// disarms it when there is none, even if none was armed, as after
  /// run_timers()).
  void rearm_timer_fd(bool force = false) noexcept;
  void set_timer_fd(clock::time_point when) noexcept;
  void run_timers() noexcept;

  device_counters counters_{};
  wire::icrc_prefix_cache icrc_prefixes_;  // compute_icrc() and verify_icrc()

  // QP1.
  std::unique_ptr<gsi_agent> gsi_;
  std::uint32_t gsi_psn_ = 0;
  std::vector<std::shared_ptr<void>> graveyard_;
  std::atomic<bool> graveyard_full_{false};
};

/// Implemented by the verbs layer (an empty ref for an empty handle).
object_ref engine_ref(const averbs::ah* h) noexcept;
object_ref engine_ref(const averbs::mw* h) noexcept;

/// Completes a parked request; releases the context reference it held.
void complete_parked(const parked& p, const std::error_code& ec, void* result) noexcept;

}  // namespace averbs::soft
