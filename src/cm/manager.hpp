// SPDX-License-Identifier: MIT
// The connection manager of one soft device: the IB CM state machine
// (IBTA vol. 1 ch. 12) over QP1, with rdma_cm's IP addressing, driving the
// QPs it connects.  It is the device's gsi_agent, so it runs inside the
// engine, under the device lock, on whatever thread makes progress: every
// member below needs soft::device::lock() held.
//
// Implementation overview
// -----------------------
// A `conn` is one cm_id: a connection on either side, keyed by its local
// comm ID.  Passive conns are also found by (peer CA GUID, peer comm ID),
// which spots retransmitted REQs, and every conn with a peer QP by (peer CA
// GUID, peer QPN), which spots stale connections (IBTA 12.9.8.3).  A conn
// has at most one timer at a time (retransmission, MRA, timewait), on the
// device's clock; a generation number retires the ones it no longer wants.
//
// User requests park as `waiter`s on the conn or listener and complete
// from here.  A conn outlives its connector handle while the protocol
// still owes the peer something (DREQ/DREP, timewait).
#pragma once

#include "soft/engine.hpp"
#include "wire/cm.hpp"

#include <averbs/cm.hpp>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

namespace averbs::cm::detail {

struct connector_obj;

/// A request parked until the protocol completes it.
struct waiter {
  averbs::detail::context_impl* ctx = nullptr;
  averbs::detail::request_id id{};
  explicit operator bool() const noexcept { return ctx != nullptr; }
};

enum class state : std::uint8_t {
  idle,         // active, nothing sent
  req_sent,     // active: REQ out (MRA may have stretched the wait)
  sidr_sent,    // active: SIDR_REQ out
  req_rcvd,     // passive: REQ in, waiting for the application
  sidr_rcvd,    // passive: SIDR_REQ in, waiting for the application
  rep_sent,     // passive: REP out, waiting for RTU
  established,  // (UD: the service was resolved)
  dreq_sent,    // DREQ out, waiting for DREP
  timewait,
  closed,
};

struct listen_t;

struct conn {
  std::uint32_t local_id = 0;
  std::uint32_t remote_id = 0;
  std::uint64_t remote_guid = 0;  // a SIDR request's: its sender address's first 8 bytes
  std::uint64_t remote_low = 0;   // a SIDR request's: the address's last 8 bytes
  std::uint64_t tid = 0;       // transaction of the connection exchange
  std::uint64_t dreq_tid = 0;  // transaction of our DREQ, or of the peer's we answer
  state st = state::idle;
  bool passive = false;
  bool has_handle = false;     // a connector refers to it
  bool mra_sent = false;
  bool was_connected = false;
  bool ended = false;          // the connection ended; `end` says how
  bool qpn_indexed = false;    // in by_qpn_
  bool remote_indexed = false; // in by_remote_
  bool remote_sidr = false;    // ... under a SIDR_REQ's key (remote_guid, remote_id, remote_low)
  bool ud_bound = false;       // a passive UD connection accepted: established until disconnect()
  std::error_code end{};
  soft::qp_t* qp = nullptr;
  qp_type type = qp_type::rc;
  std::uint32_t qpn = 0;
  std::uint32_t remote_qpn = 0;
  std::uint32_t remote_qkey = 0;
  std::uint32_t local_psn = 0;
  std::uint32_t remote_psn = 0;
  address local{};
  address peer{};
  std::uint32_t gid_index = 0;
  std::uint8_t hop_limit = 64;
  std::uint8_t traffic_class = 0;
  mtu path_mtu = mtu::mtu_1024;
  conn_params params{};        // this side's
  // What the peer's REQ asked for (passive).
  std::uint8_t peer_rr = 0;
  std::uint8_t peer_id = 0;
  std::uint8_t peer_retry = 7;
  std::uint8_t peer_rnr = 7;
  std::uint8_t peer_ack_timeout = 14;
  std::uint8_t peer_cm_timeout = 16;   // how long the peer allows us to answer its REQ
  std::uint8_t peer_rep_timeout = 16;  // how long the peer may take to answer our REP
  std::uint8_t peer_max_retries = 10;
  bool mra_rcvd = false;               // the peer asked for more time once; later MRAs are ignored
  gid peer_gid{};                      // REQ primary local GID (the peer's port)
  // The address the peer's REQ (passive) or REP (active) came from: only a
  // REQ or REP from there may end this connection as stale, or replace it
  // while it waits for accept.
  gid peer_addr{};
  // Retransmission.
  std::unique_ptr<std::array<std::byte, wire::cm::mad_size>> mad;
  std::uint8_t retries_left = 0;
  std::uint64_t timer_gen = 0;
  // A timer the device had no memory to queue (arm()): recover() queues it
  // at the next pass, or runs it then if there is still no memory.
  bool timer_lost = false;
  std::uint64_t lost_gen = 0;
  averbs::clock::time_point lost_when{};
  // What the application sees.
  std::vector<std::byte> pdata;  // private data of the peer's last message
  std::uint16_t rej_reason = 0;
  waiter op;      // connect or accept
  waiter notify;  // notify_disconnect
  listen_t* listener = nullptr;  // passive, while waiting in a backlog
};

struct listen_t {
  address at{};
  port_space ps = port_space::tcp;
  std::size_t backlog = 0;
  std::deque<conn*> queue;  // requests not yet handed out
  struct get {
    waiter w;
    std::shared_ptr<connector_obj> spare;  // becomes the request's connector
  };
  std::deque<get> gets;
  bool closed = false;
};

class manager final : public soft::gsi_agent {
 public:
  explicit manager(soft::device& d);
  ~manager() override;

  // --- soft::gsi_agent ---------------------------------------------------------
  void on_mad(const soft::mad_in& m) noexcept override;
  void on_qp(soft::qp_t* qp, soft::qp_note n) noexcept override;
  void on_fatal() noexcept override;
  void recover() noexcept override;

  // --- the connector and listener operations -------------------------------------
  soft::device& dev() noexcept { return dev_; }
  conn* create() noexcept;
  /// The connector handle went away.
  void release(conn* c) noexcept;
  void connect(connector_obj& o, soft::qp_t* qp, const address& to, std::span<const std::byte> pdata,
               const conn_params& p, waiter w) noexcept;
  void accept(conn* c, soft::qp_t* qp, std::span<const std::byte> pdata, const conn_params& p, waiter w) noexcept;
  std::error_code reject(conn* c, std::span<const std::byte> pdata) noexcept;
  std::error_code disconnect(conn* c) noexcept;
  void notify_disconnect(conn* c, waiter w) noexcept;

  std::error_code listen(const address& at, port_space ps, int backlog, listen_t*& out) noexcept;
  /// Stops a listener: parked requests abort, waiting ones are rejected.
  void close(listen_t* l) noexcept;
  void get_request(listen_t* l, waiter w, std::shared_ptr<connector_obj> spare) noexcept;
  std::size_t cancel_gets(listen_t* l) noexcept;

  static conn_state public_state(const conn* c) noexcept;
  /// public_state(), after ending a connect or accept its caller cancelled
  /// (REJ, the accept's QP to ERR): what the application sees is then
  /// what the peer and the QP see too.
  conn_state state_of(conn* c) noexcept;

  /// Counters for tests and tools.
  struct stats {
    std::uint64_t mads_sent = 0;
    std::uint64_t mads_received = 0;
    std::uint64_t mads_dropped = 0;   // malformed, unexpected, or for nobody
    std::uint64_t retransmits = 0;
    std::uint64_t duplicates = 0;     // retransmitted messages recognised
    std::uint64_t backlog_drops = 0;
    std::uint64_t stale_rejects = 0;
  };
  const stats& counters() const noexcept { return stats_; }
  std::size_t live_conns() const noexcept { return conns_.size(); }

 private:
  // A REQ's (CA GUID, comm ID or QPN, 0, false, sender's address): the
  // identifiers are on the wire for anyone to copy, and one who sends them
  // from elsewhere must not take them from their owner (a REQ squatting a
  // requester's comm ID or QPN would swallow or refuse its real one for
  // minutes).  A SIDR_REQ's (its sender's address in two halves, request
  // ID, true): SIDR has no CA GUID, and a key space of its own keeps a
  // SIDR sender from ever naming a REQ.
  struct key {
    std::uint64_t guid;
    std::uint32_t id;
    std::uint64_t low = 0;
    bool sidr = false;
    gid from{};  // (REQ-based keys; a SIDR key's address is in guid, low)
    friend bool operator==(const key&, const key&) = default;
  };
  struct key_hash {
    std::size_t operator()(const key& k) const noexcept {
      std::uint64_t a, b;
      std::memcpy(&a, k.from.raw.data(), 8);
      std::memcpy(&b, k.from.raw.data() + 8, 8);
      return std::hash<std::uint64_t>{}(k.guid ^ (std::uint64_t{k.id} * 0x9E3779B97F4A7C15ull) ^
                                        ((k.low + k.sidr) * 0xC2B2AE3D27D4EB4Full) ^
                                        ((a * 0xFF51AFD7ED558CCDull) + b) * 0xC4CEB9FE1A85EC53ull);
    }
  };
  static key remote_key(const conn& c) noexcept {
    return {c.remote_guid, c.remote_id, c.remote_low, c.remote_sidr, c.remote_sidr ? gid{} : c.peer_addr};
  }
  static key qpn_key(const conn& c) noexcept { return {c.remote_guid, c.remote_qpn, 0, false, c.peer_addr}; }
  // A passive connection for a request from `remote`, indexed and queued
  // on the listener; nullptr when out of memory (nothing is left behind).
  conn* queue_request(listen_t& l, const key& remote) noexcept;

  // Messages.
  template <class Msg>
  bool decoded(const soft::mad_in& m, Msg& out) noexcept;  // counts a malformed one
  void on_req(const soft::mad_in& m, const wire::cm::mad_header& h) noexcept;
  void on_rep(const soft::mad_in& m, const wire::cm::mad_header& h) noexcept;
  void on_rtu(const soft::mad_in& m) noexcept;
  void on_rej(const soft::mad_in& m) noexcept;
  void on_mra(const soft::mad_in& m) noexcept;
  void on_dreq(const soft::mad_in& m, const wire::cm::mad_header& h) noexcept;
  void on_drep(const soft::mad_in& m) noexcept;
  void on_sidr_req(const soft::mad_in& m, const wire::cm::mad_header& h) noexcept;
  void on_sidr_rep(const soft::mad_in& m) noexcept;

  // Sending.
  template <class Msg>
  void send_to(const gid& src, const gid& dst, std::uint8_t hop_limit, std::uint64_t tid, const Msg& msg) noexcept;
  template <class Msg>
  void send(conn& c, std::uint64_t tid, const Msg& msg, bool keep) noexcept;
  void resend(conn& c) noexcept;
  void send_rej(conn& c, wire::cm::msg_ref what, wire::cm::rej_reason why,
                std::span<const std::byte> pdata = {}) noexcept;
  void send_rtu(conn& c) noexcept;
  void send_mra(conn& c) noexcept;
  void send_dreq(conn& c) noexcept;
  void send_drep(conn& c) noexcept;
  void send_sidr_rep(conn& c, wire::cm::sidr_status s, std::span<const std::byte> pdata) noexcept;

  // Timers.
  // A timer is live while its connection exists with the generation it
  // was armed with; one replaced or disarmed is counted as cancelled, so
  // the device's queue sweeps the dead out (a peer chooses how long they
  // would otherwise stay: up to ~69 s each, a forgotten request's 20 min).
  void arm(conn& c, std::chrono::nanoseconds after) noexcept;
  void disarm(conn& c) noexcept;
  static void timer_thunk(void* arg, const averbs::detail::timer_payload& p) noexcept;
  static bool timer_alive(void* arg, const averbs::detail::timer_payload& p) noexcept;
  void on_timer(std::uint32_t id, std::uint64_t gen) noexcept;

  // QPs.
  std::error_code qp_to_init(conn& c, soft::qp_t* qp, const conn_params& p) noexcept;
  std::error_code qp_to_rts(conn& c, std::uint8_t rnr_retry, std::uint8_t max_rd_atomic,
                            std::uint8_t timeout, std::uint8_t retry) noexcept;
  void qp_to_error(conn& c) noexcept;
  void attach(conn& c, soft::qp_t* qp) noexcept;
  void detach(conn& c) noexcept;

  // Completion and bookkeeping.
  /// Whether the request took the result (false: none, or already
  /// completed, i.e. cancelled by the application meanwhile).
  bool complete(waiter& w, const std::error_code& ec, void* result = nullptr) noexcept;
  void end_connection(conn& c, const std::error_code& why) noexcept;
  void fail_op(conn& c, const std::error_code& ec) noexcept;
  bool finish_if_cancelled(conn& c) noexcept;
  static bool op_cancelled(const conn& c) noexcept;
  /// Whether a MAD for connection `c` comes from its peer's address (the
  /// REQ's sender, or the address a REQ went to).
  static bool from_peer(const conn& c, const soft::mad_in& m) noexcept { return m.src == c.peer_gid; }
  void enter_timewait(conn& c) noexcept;
  /// A new connection's peer QP is one `old` is still connected to (the
  /// peer came back): `old` ends (QP to ERR, connection_reset) and the
  /// peer hears a DREQ for it (IBTA 12.9.8.3; ib_cm).
  void end_stale(conn& old) noexcept;
  void close_conn(conn& c) noexcept;  // closed; freed if no handle
  void unindex_remote(conn& c) noexcept;  // forgets the peer's (CA GUID, comm ID)
  void erase(conn& c) noexcept;
  void index_qpn(conn& c) noexcept;
  void deliver(listen_t& l) noexcept;
  conn* find(std::uint32_t local_id) noexcept;
  std::uint32_t new_local_id() noexcept;
  std::uint64_t new_tid() noexcept;
  std::uint32_t new_psn() noexcept { return static_cast<std::uint32_t>(rng_()) & wire::psn_mask; }
  std::uint16_t ephemeral_port() noexcept;
  listen_t* find_listener(port_space ps, const gid& ip, std::uint16_t port) noexcept;
  std::chrono::nanoseconds timewait_time(const conn& c) const noexcept;

  soft::device& dev_;
  std::mt19937_64 rng_;
  std::uint32_t tid_hi_ = 0;
  std::uint32_t tid_seq_ = 0;
  std::uint32_t next_id_ = 0;
  std::uint16_t next_port_ = 0;
  bool fatal_ = false;
  bool changing_qp_ = false;  // our own QP transitions: no on_qp reaction
  std::uint32_t lost_timers_ = 0;  // conns with timer_lost set
  std::unordered_map<std::uint32_t, std::unique_ptr<conn>> conns_;
  std::unordered_map<key, conn*, key_hash> by_remote_;  // (peer guid, peer comm ID): passive
  std::unordered_map<key, conn*, key_hash> by_qpn_;     // (peer guid, peer QPN)
  std::vector<std::unique_ptr<listen_t>> listeners_;
  stats stats_;
};

/// The user side of a connector handle.
struct connector_obj {
  std::shared_ptr<averbs::detail::device_obj> dev;
  manager* m = nullptr;
  conn* c = nullptr;  // Must hold the device lock.
  ~connector_obj();
};

/// The user side of a listener handle.
struct listener_obj {
  std::shared_ptr<averbs::detail::device_obj> dev;
  manager* m = nullptr;
  listen_t* l = nullptr;  // null once closed; Must hold the device lock.
  address at{};
  void close() noexcept;
  ~listener_obj() { close(); }
};

manager& manager_of(soft::device& d) noexcept;

}  // namespace averbs::cm::detail
