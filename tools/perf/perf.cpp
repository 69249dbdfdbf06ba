// SPDX-License-Identifier: MIT
#include "perf/perf.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace averbs::perf {

namespace {
constexpr std::size_t max_size = 8u << 20;  // perftest's 8 MiB
}

bool parse_test(const std::string& n, test_kind& out) {
  static const std::pair<const char*, test_kind> t[] = {
      {"send_lat", test_kind::send_lat},   {"send_bw", test_kind::send_bw},   {"write_lat", test_kind::write_lat},
      {"write_bw", test_kind::write_bw},   {"read_lat", test_kind::read_lat}, {"read_bw", test_kind::read_bw},
      {"atomic_lat", test_kind::atomic_lat}, {"atomic_bw", test_kind::atomic_bw}};
  for (auto& [name, k] : t) {
    if (n == name) {
      out = k;
      return true;
    }
  }
  return false;
}

const char* test_name(test_kind k) {
  switch (k) {
    case test_kind::send_lat: return "Send Latency";
    case test_kind::send_bw: return "Send BW";
    case test_kind::write_lat: return "RDMA_Write Latency";
    case test_kind::write_bw: return "RDMA_Write BW";
    case test_kind::read_lat: return "RDMA_Read Latency";
    case test_kind::read_bw: return "RDMA_Read BW";
    case test_kind::atomic_lat: return "Atomic FETCH_AND_ADD Latency";
    case test_kind::atomic_bw: return "Atomic FETCH_AND_ADD BW";
  }
  return "";
}

bool is_latency(test_kind k) {
  return k == test_kind::send_lat || k == test_kind::write_lat || k == test_kind::read_lat ||
         k == test_kind::atomic_lat;
}

static bool is_atomic(test_kind k) { return k == test_kind::atomic_lat || k == test_kind::atomic_bw; }

std::vector<std::size_t> sizes_for(const options& o) {
  if (is_atomic(o.test)) return {8};
  if (o.all_sizes) {
    std::vector<std::size_t> v;
    for (std::size_t s = 2; s <= max_size; s <<= 1) v.push_back(s);
    return v;
  }
  if (o.size != 0) return {o.size};
  return {is_latency(o.test) ? 2u : 65536u};
}

std::size_t iters_for(const options& o) {
  if (o.iters != 0) return o.iters;
  return o.test == test_kind::write_bw ? 5000 : 1000;
}

// ---------------------------------------------------------------------------

cycle_clock::cycle_clock() {
  using sc = std::chrono::steady_clock;
  const auto t0 = sc::now();
  const std::uint64_t c0 = now();
  while (sc::now() - t0 < std::chrono::milliseconds(20)) {
  }
  const std::uint64_t c1 = now();
  const double us = std::chrono::duration<double, std::micro>(sc::now() - t0).count();
  per_us_ = static_cast<double>(c1 - c0) / us;
}

std::uint64_t cycle_clock::now() const noexcept {
#if defined(__x86_64__)
  unsigned aux;
  return __rdtscp(&aux);
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

latency_result summarize_latency(std::vector<std::uint64_t> d, const cycle_clock& c, std::size_t bytes,
                                 std::size_t iters, double rtt_factor) {
  latency_result r;
  r.bytes = bytes;
  r.iters = iters;
  std::sort(d.begin(), d.end());
  // perftest drops the two largest samples (LAT_MEASURE_TAIL).
  const std::size_t n = d.size() > 3 ? d.size() - 2 : d.size();
  if (n == 0) return r;
  auto us = [&](std::uint64_t cyc) { return c.us(cyc) / rtt_factor; };
  r.t_min = us(d[0]);
  r.t_max = us(d[n - 1]);
  r.t_typical = n % 2 == 0 ? us((d[n / 2] + d[n / 2 - 1]) / 2) : us(d[n / 2]);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += us(d[i]);
  r.t_avg = sum / static_cast<double>(n);
  double var = 0;
  for (std::size_t i = 0; i < n; ++i) var += (us(d[i]) - r.t_avg) * (us(d[i]) - r.t_avg);
  r.t_stdev = std::sqrt(var / static_cast<double>(n));
  r.p99 = us(d[std::min(n - 1, static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.99)))]);
  r.p999 = us(d[std::min(n - 1, static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.999)))]);
  return r;
}

// ---------------------------------------------------------------------------

struct loopback_run::side {
  cq scq, rcq;
  qp q;
  std::vector<std::byte> buf;
  mr m;
  std::uint32_t posted_recvs = 0;
};

namespace {

constexpr std::uint32_t all_access = access_local_write | access_remote_write | access_remote_read | access_remote_atomic;

// INIT, with every access a perftest test may use.
void to_init(const qp& q) {
  qp_attr a;
  a.state = qp_state::init;
  a.port_num = 1;
  a.qp_access_flags = all_access;
  q.modify(a, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_access_flags);
}

// RTR towards the peer's QP, then RTS with perftest's retry counts.
void to_rts(const qp& q, const options& o, std::uint32_t dest_qpn, std::uint32_t rq_psn, const gid& dgid,
            std::uint8_t min_rnr_timer) {
  qp_attr a;
  a.state = qp_state::rtr;
  a.path_mtu = o.path_mtu;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = static_cast<std::uint8_t>(o.outstanding_reads);
  a.min_rnr_timer = min_rnr_timer;
  a.ah.is_global = true;
  a.ah.grh.dgid = dgid;
  q.modify(a, qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn |
                  qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer);
  a = {};
  a.state = qp_state::rts;
  a.timeout = o.qp_timeout;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = static_cast<std::uint8_t>(o.outstanding_reads);
  q.modify(a, qp_attr_state | qp_attr_sq_psn | qp_attr_timeout | qp_attr_retry_cnt | qp_attr_rnr_retry |
                  qp_attr_max_qp_rd_atomic);
}

}  // namespace

loopback_run::loopback_run(context& ctx, const options& o) : o_(o), ctx_(ctx) {
  dev_ = open_device(ctx_, o.device);
  pd_ = dev_.alloc_pd();
}

loopback_run::~loopback_run() = default;

void loopback_run::setup(std::size_t size) {
  sides_.clear();
  const bool lat = is_latency(o_.test);
  const std::uint32_t tx = o_.tx_depth != 0 ? o_.tx_depth : (lat ? 1 : 128);
  for (int i = 0; i < 2; ++i) {
    auto s = std::make_unique<side>();
    s->scq = dev_.create_cq(std::max<std::uint32_t>(tx * 2, 256));
    s->rcq = dev_.create_cq(o_.rx_depth * 2);
    qp_init_attr ia;
    ia.send_cq = s->scq;
    ia.recv_cq = s->rcq;
    ia.cap = {std::max<std::uint32_t>(tx, 128), o_.rx_depth, 1, 1, o_.inline_size};
    ia.type = qp_type::rc;
    s->q = pd_.create_qp(ia);
    // [0, size): where the peer writes (and write_lat polls); [size, 2 size):
    // what this side sends.
    s->buf.assign(2 * std::max<std::size_t>(size, 8) + 64, std::byte{0});
    s->m = pd_.reg_mr(s->buf.data(), s->buf.size(), all_access);
    sides_.push_back(std::move(s));
  }
  const gid g = dev_.query_gid(1, 0);
  for (int i = 0; i < 2; ++i) {
    to_init(sides_[i]->q);
    to_rts(sides_[i]->q, o_, sides_[1 - i]->q.num(), 0, g, 12);
  }
}

namespace {

// Polls until one completion arrives; aborts the run on an error status.
work_completion poll_one(const cq& q) {
  work_completion wc;
  while (q.poll({&wc, 1}) == 0) {
  }
  if (wc.status != wc_status::success)
    throw std::runtime_error(std::string("completion error: ") + std::string(to_string(wc.status)));
  return wc;
}

}  // namespace

latency_result loopback_run::latency(std::size_t size, std::size_t iters) {
  setup(size);
  side& a = *sides_[0];
  side& b = *sides_[1];
  const auto k = o_.test;
  std::vector<std::uint64_t> samples;
  samples.reserve(iters);
  sge ga{reinterpret_cast<std::uintptr_t>(a.buf.data()), static_cast<std::uint32_t>(size), a.m.lkey()};
  sge gb{reinterpret_cast<std::uintptr_t>(b.buf.data()), static_cast<std::uint32_t>(size), b.m.lkey()};
  const std::uint32_t inl = size <= o_.inline_size ? std::uint32_t{send_inline} : 0u;
  constexpr std::uint32_t signal_every = 32;
  auto send = [&](side& s, const sge& g, wr_opcode op, std::size_t i, std::uint64_t raddr, std::uint32_t rkey) {
    send_wr wr;
    wr.wr_id = i;
    wr.sg_list = &g;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.flags = inl | ((i % signal_every) == signal_every - 1 ? std::uint32_t{send_signaled} : 0u);
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    if (auto ec = s.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
    if ((wr.flags & send_signaled) != 0) poll_one(s.scq);
  };
  auto repost = [&](side& s, const sge& g) {
    recv_wr r;
    r.sg_list = &g;
    r.num_sge = 1;
    if (auto ec = s.q.post_recv(r)) throw std::runtime_error("post_recv: " + ec.message());
  };
  double rtt_factor = 2;
  if (k == test_kind::send_lat) {
    repost(a, ga);
    repost(b, gb);
    std::uint64_t prev = clock_.now();
    for (std::size_t i = 0; i < iters; ++i) {
      send(a, ga, wr_opcode::send, i, 0, 0);
      poll_one(b.rcq);
      repost(b, gb);
      send(b, gb, wr_opcode::send, i, 0, 0);
      poll_one(a.rcq);
      repost(a, ga);
      const std::uint64_t t = clock_.now();
      samples.push_back(t - prev);
      prev = t;
    }
  } else if (k == test_kind::write_lat) {
    // Each side writes from the upper half of its buffer into the lower half
    // of the other's, and watches the last byte of its own lower half.
    volatile auto* last_a = reinterpret_cast<volatile std::uint8_t*>(a.buf.data() + size - 1);
    volatile auto* last_b = reinterpret_cast<volatile std::uint8_t*>(b.buf.data() + size - 1);
    const sge src_a{ga.addr + size, ga.length, ga.lkey}, src_b{gb.addr + size, gb.length, gb.lkey};
    std::uint64_t prev = clock_.now();
    for (std::size_t i = 0; i < iters; ++i) {
      const auto v = static_cast<std::uint8_t>(i + 1);
      a.buf[2 * size - 1] = std::byte{v};
      send(a, src_a, wr_opcode::rdma_write, i, reinterpret_cast<std::uintptr_t>(b.buf.data()), b.m.rkey());
      while (*last_b != v) b.scq.poll({});
      b.buf[2 * size - 1] = std::byte{v};
      send(b, src_b, wr_opcode::rdma_write, i, reinterpret_cast<std::uintptr_t>(a.buf.data()), a.m.rkey());
      while (*last_a != v) a.scq.poll({});
      const std::uint64_t t = clock_.now();
      samples.push_back(t - prev);
      prev = t;
    }
  } else {
    rtt_factor = 1;
    const bool atomic = k == test_kind::atomic_lat;
    sge g8{ga.addr, atomic ? 8u : ga.length, ga.lkey};
    for (std::size_t i = 0; i < iters; ++i) {
      const std::uint64_t t0 = clock_.now();
      send_wr wr;
      wr.wr_id = i;
      wr.sg_list = &g8;
      wr.num_sge = 1;
      wr.opcode = atomic ? wr_opcode::atomic_fetch_and_add : wr_opcode::rdma_read;
      wr.flags = send_signaled;
      wr.remote_addr = reinterpret_cast<std::uintptr_t>(b.buf.data());
      wr.rkey = b.m.rkey();
      wr.compare_add = 1;
      if (auto ec = a.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
      poll_one(a.scq);
      samples.push_back(clock_.now() - t0);
    }
  }
  return summarize_latency(std::move(samples), clock_, size, iters, rtt_factor);
}

bandwidth_result loopback_run::bandwidth(std::size_t size, std::size_t iters) {
  setup(size);
  side& a = *sides_[0];
  side& b = *sides_[1];
  const auto k = o_.test;
  const std::uint32_t tx = o_.tx_depth != 0 ? o_.tx_depth : 128;
  const std::uint32_t depth =
      k == test_kind::read_bw || k == test_kind::atomic_bw ? std::min(tx, o_.outstanding_reads) : tx;
  const std::uint32_t cq_mod = std::max<std::uint32_t>(1, std::min<std::uint32_t>(o_.cq_mod, depth));
  sge ga{reinterpret_cast<std::uintptr_t>(a.buf.data()), static_cast<std::uint32_t>(size), a.m.lkey()};
  sge gb{reinterpret_cast<std::uintptr_t>(b.buf.data()), static_cast<std::uint32_t>(size), b.m.lkey()};
  if (k == test_kind::atomic_bw) ga.length = 8;
  wr_opcode op = wr_opcode::send;
  if (k == test_kind::write_bw) op = wr_opcode::rdma_write;
  if (k == test_kind::read_bw) op = wr_opcode::rdma_read;
  if (k == test_kind::atomic_bw) op = wr_opcode::atomic_fetch_and_add;
  const bool sends = k == test_kind::send_bw;
  recv_wr rwr;
  rwr.sg_list = &gb;
  rwr.num_sge = 1;
  std::size_t recvs_posted = 0;
  if (sends) {
    for (; recvs_posted < std::min<std::size_t>(iters, o_.rx_depth); ++recvs_posted)
      if (auto ec = b.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
  }
  const std::uint32_t inl =
      size <= o_.inline_size && (sends || k == test_kind::write_bw) ? std::uint32_t{send_inline} : 0u;
  std::vector<std::uint64_t> done_at;  // time of each cq_mod-th completion
  done_at.reserve(iters / cq_mod + 2);
  std::size_t posted = 0, completed = 0, received = 0;
  work_completion wcs[64];
  const std::uint64_t start = clock_.now();
  while (completed < iters) {
    // SENDs only when a receive waits for them: outrunning the receiver
    // would measure RNR back-off, not the transport.
    while (posted < iters && posted - completed < depth && (!sends || posted < recvs_posted)) {
      send_wr wr;
      wr.wr_id = posted;
      wr.sg_list = &ga;
      wr.num_sge = 1;
      wr.opcode = op;
      wr.flags = inl | (((posted + 1) % cq_mod == 0 || posted + 1 == iters) ? std::uint32_t{send_signaled} : 0u);
      wr.remote_addr = reinterpret_cast<std::uintptr_t>(b.buf.data());
      wr.rkey = b.m.rkey();
      wr.compare_add = 1;
      if (auto ec = a.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
      ++posted;
    }
    const std::size_t n = a.scq.poll(wcs);
    for (std::size_t i = 0; i < n; ++i) {
      if (wcs[i].status != wc_status::success)
        throw std::runtime_error(std::string("completion error: ") + std::string(to_string(wcs[i].status)));
      completed = wcs[i].wr_id + 1;
      done_at.push_back(clock_.now());
    }
    if (sends) {
      const std::size_t r = b.rcq.poll(wcs);
      received += r;
      for (std::size_t i = 0; i < r && recvs_posted < iters; ++i, ++recvs_posted)
        if (auto ec = b.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
    }
  }
  const std::uint64_t end = clock_.now();
  bandwidth_result r;
  r.bytes = size;
  r.iters = iters;
  const double secs = clock_.us(end - start) / 1e6;
  r.bw_avg = static_cast<double>(size) * static_cast<double>(iters) / secs / (1 << 20);
  r.msg_rate = static_cast<double>(iters) / secs / 1e6;
  // Peak: the best rate between consecutive signaled completions.
  double best = 0;
  std::uint64_t prev = start;
  for (std::uint64_t t : done_at) {
    if (t > prev) best = std::max(best, static_cast<double>(cq_mod) / (clock_.us(t - prev) / 1e6));
    prev = t;
  }
  r.bw_peak = best * static_cast<double>(size) / (1 << 20);
  if (r.bw_peak < r.bw_avg) r.bw_peak = r.bw_avg;
  (void)received;
  if (std::getenv("AVERBS_PERF_COUNTERS") != nullptr) {
    const device_counters c = dev_.counters();
    std::fprintf(stderr, "counters: sent %llu received %llu rnr_naks %llu retransmits %llu dropped %llu\n",
                 (unsigned long long)c.packets_sent, (unsigned long long)c.packets_received,
                 (unsigned long long)c.rnr_naks_sent, (unsigned long long)c.retransmits, (unsigned long long)c.dropped);
  }
  return r;
}

// ---------------------------------------------------------------------------
// Two processes.

struct remote_run::state {
  device dev;
  pd p;
  cq scq, rcq;
  qp q;
  std::vector<std::byte> buf;
  mr m;
  oob link;
  peer_info peer;
  std::size_t half = 0;
  bool link_ready() const { return link.readable(); }
  /// Keeps the device responding (one-sided tests need the responder to
  /// run) until the client speaks.  The socket is looked at every 64th
  /// turn: a poll syscall per turn was a few percent of the responder's
  /// CPU in read_bw.
  void respond_until_link_ready() {
    for (unsigned turn = 1;; ++turn) {
      rcq.poll({});
      if (turn % 64 == 0 && link_ready()) return;
    }
  }
};

remote_run::remote_run(context& ctx, const options& o, const std::string& host, std::size_t max_size)
    : o_(o), host_(host), s_(std::make_unique<state>()) {
  state& s = *s_;
  s.dev = open_device(ctx, o.device);
  s.p = s.dev.alloc_pd();
  s.scq = s.dev.create_cq(1024);
  s.rcq = s.dev.create_cq(std::max<std::uint32_t>(o.rx_depth * 2, 1024));
  qp_init_attr ia;
  ia.send_cq = s.scq;
  ia.recv_cq = s.rcq;
  const std::uint32_t tx = std::max<std::uint32_t>(o.tx_depth != 0 ? o.tx_depth : 128, 128);
  ia.cap = {tx, o.rx_depth, 1, 1, o.inline_size};
  s.q = s.p.create_qp(ia);
  // [0, max): where the peer writes; [max, 2 max): what this side sends.
  s.buf.assign(2 * std::max<std::size_t>(max_size, 8) + 64, std::byte{0});
  s.half = std::max<std::size_t>(max_size, 8);
  s.m = s.p.reg_mr(s.buf.data(), s.buf.size(), all_access);
  to_init(s.q);

  const gid g = s.dev.query_gid(1, 0);
  peer_info me{s.q.num(), 0, g, s.m.rkey(), reinterpret_cast<std::uintptr_t>(s.buf.data()), s.buf.size()};
  if (is_server()) {
    // Listen on the device's own address: several servers can share a host.
    oob listener = oob::listen(g.is_ipv4_mapped() ? std::to_string(g.raw[12]) + "." + std::to_string(g.raw[13]) +
                                                        "." + std::to_string(g.raw[14]) + "." +
                                                        std::to_string(g.raw[15])
                                                  : g.to_string(),
                               o.oob_port);
    s.link = listener.accept(std::chrono::minutes(10));
    s.peer = s.link.recv_info();
    s.link.send_info(me);
  } else {
    s.link = oob::connect(host, o.oob_port, std::chrono::seconds(30));
    s.link.send_info(me);
    s.peer = s.link.recv_info();
  }
  // min_rnr_timer 1 (10 us): a receiver reposting quickly should not cost 655 ms (P7).
  to_rts(s.q, o, s.peer.qpn, s.peer.psn, s.peer.g, 1);
  // Both sides are in RTS before either sends.
  s.link.send_word(1);
  (void)s.link.recv_word();
}

remote_run::~remote_run() = default;

latency_result remote_run::latency(std::size_t size, std::size_t iters) {
  state& s = *s_;
  const auto k = o_.test;
  std::vector<std::uint64_t> samples;
  samples.reserve(iters);
  sge g{reinterpret_cast<std::uintptr_t>(s.buf.data()), static_cast<std::uint32_t>(size), s.m.lkey()};
  const std::uint32_t inl = size <= o_.inline_size ? std::uint32_t{send_inline} : 0u;
  constexpr std::uint32_t signal_every = 32;
  auto post = [&](wr_opcode op, std::size_t i) {
    send_wr wr;
    wr.wr_id = i;
    wr.sg_list = &g;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.flags = inl | ((i % signal_every) == signal_every - 1 ? std::uint32_t{send_signaled} : 0u);
    wr.remote_addr = s.peer.addr;
    wr.rkey = s.peer.rkey;
    if (auto ec = s.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
    if ((wr.flags & send_signaled) != 0) poll_one(s.scq);
  };
  recv_wr rwr;
  rwr.sg_list = &g;
  rwr.num_sge = 1;
  double rtt_factor = 2;
  if (k == test_kind::send_lat) {
    for (int i = 0; i < 2; ++i)
      if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
    s.link.send_word(2);  // receives posted
    (void)s.link.recv_word();
    std::uint64_t prev = clock_.now();
    for (std::size_t i = 0; i < iters; ++i) {
      if (!is_server()) {
        post(wr_opcode::send, i);
        poll_one(s.rcq);
      } else {
        poll_one(s.rcq);
        post(wr_opcode::send, i);
      }
      if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
      const std::uint64_t t = clock_.now();
      samples.push_back(t - prev);
      prev = t;
    }
  } else if (k == test_kind::write_lat) {
    // Write from the upper half into the peer's lower half; watch our own
    // lower half's last byte.
    volatile auto* mine = reinterpret_cast<volatile std::uint8_t*>(s.buf.data() + size - 1);
    g.addr += s.half;
    std::uint64_t prev = clock_.now();
    for (std::size_t i = 0; i < iters; ++i) {
      const auto v = static_cast<std::uint8_t>(i + 1);
      if (!is_server()) {
        s.buf[s.half + size - 1] = std::byte{v};
        post(wr_opcode::rdma_write, i);
        while (*mine != v) s.scq.poll({});
      } else {
        while (*mine != v) s.scq.poll({});
        s.buf[s.half + size - 1] = std::byte{v};
        post(wr_opcode::rdma_write, i);
      }
      const std::uint64_t t = clock_.now();
      samples.push_back(t - prev);
      prev = t;
    }
  } else {
    rtt_factor = 1;
    if (!is_server()) {
      const bool atomic = k == test_kind::atomic_lat;
      sge g8{g.addr, atomic ? 8u : g.length, g.lkey};
      for (std::size_t i = 0; i < iters; ++i) {
        const std::uint64_t t0 = clock_.now();
        send_wr wr;
        wr.wr_id = i;
        wr.sg_list = &g8;
        wr.num_sge = 1;
        wr.opcode = atomic ? wr_opcode::atomic_fetch_and_add : wr_opcode::rdma_read;
        wr.flags = send_signaled;
        wr.remote_addr = s.peer.addr;
        wr.rkey = s.peer.rkey;
        wr.compare_add = 1;
        if (auto ec = s.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
        poll_one(s.scq);
        samples.push_back(clock_.now() - t0);
      }
    }
  }
  // Agree the size is over; the server keeps its device responding while
  // it waits (one-sided tests need the responder to run).
  if (is_server()) {
    s.respond_until_link_ready();
  }
  s.link.send_word(3);
  (void)s.link.recv_word();
  if (is_server() && samples.empty()) return {size, iters};
  return summarize_latency(std::move(samples), clock_, size, iters, rtt_factor);
}

bandwidth_result remote_run::bandwidth(std::size_t size, std::size_t iters) {
  state& s = *s_;
  const auto k = o_.test;
  const std::uint32_t tx = o_.tx_depth != 0 ? o_.tx_depth : 128;
  const std::uint32_t depth =
      k == test_kind::read_bw || k == test_kind::atomic_bw ? std::min(tx, o_.outstanding_reads) : tx;
  const std::uint32_t cq_mod = std::max<std::uint32_t>(1, std::min<std::uint32_t>(o_.cq_mod, depth));
  sge g{reinterpret_cast<std::uintptr_t>(s.buf.data()), static_cast<std::uint32_t>(size), s.m.lkey()};
  if (k == test_kind::atomic_bw) g.length = 8;
  const bool sends = k == test_kind::send_bw;
  bandwidth_result r;
  r.bytes = size;
  r.iters = iters;
  work_completion wcs[64];
  if (is_server()) {
    if (sends) {
      recv_wr rwr;
      rwr.sg_list = &g;
      rwr.num_sge = 1;
      std::size_t posted = 0, received = 0;
      for (; posted < std::min<std::size_t>(iters, o_.rx_depth); ++posted)
        if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
      s.link.send_word(4);  // receives are posted
      while (received < iters) {
        const std::size_t n = s.rcq.poll(wcs);
        for (std::size_t i = 0; i < n; ++i) {
          if (wcs[i].status != wc_status::success)
            throw std::runtime_error(std::string("completion error: ") + std::string(to_string(wcs[i].status)));
          ++received;
          if (posted < iters) {
            if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
            ++posted;
          }
        }
      }
    } else {
      s.link.send_word(4);
    }
    // One-sided tests: the responder runs while we wait for the client.
    s.respond_until_link_ready();
    (void)s.link.recv_word();
    s.link.send_word(5);
    return r;
  }
  (void)s.link.recv_word();  // the server is ready
  wr_opcode op = wr_opcode::send;
  if (k == test_kind::write_bw) op = wr_opcode::rdma_write;
  if (k == test_kind::read_bw) op = wr_opcode::rdma_read;
  if (k == test_kind::atomic_bw) op = wr_opcode::atomic_fetch_and_add;
  const std::uint32_t inl =
      size <= o_.inline_size && (sends || k == test_kind::write_bw) ? std::uint32_t{send_inline} : 0u;
  std::vector<std::uint64_t> done_at;
  done_at.reserve(iters / cq_mod + 2);
  std::size_t posted = 0, completed = 0;
  const std::uint64_t start = clock_.now();
  while (completed < iters) {
    while (posted < iters && posted - completed < depth) {
      send_wr wr;
      wr.wr_id = posted;
      wr.sg_list = &g;
      wr.num_sge = 1;
      wr.opcode = op;
      wr.flags = inl | (((posted + 1) % cq_mod == 0 || posted + 1 == iters) ? std::uint32_t{send_signaled} : 0u);
      wr.remote_addr = s.peer.addr;
      wr.rkey = s.peer.rkey;
      wr.compare_add = 1;
      if (auto ec = s.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
      ++posted;
    }
    const std::size_t n = s.scq.poll(wcs);
    for (std::size_t i = 0; i < n; ++i) {
      if (wcs[i].status != wc_status::success)
        throw std::runtime_error(std::string("completion error: ") + std::string(to_string(wcs[i].status)));
      completed = wcs[i].wr_id + 1;
      done_at.push_back(clock_.now());
    }
  }
  const std::uint64_t end = clock_.now();
  s.link.send_word(6);
  (void)s.link.recv_word();
  const double secs = clock_.us(end - start) / 1e6;
  r.bw_avg = static_cast<double>(size) * static_cast<double>(iters) / secs / (1 << 20);
  r.msg_rate = static_cast<double>(iters) / secs / 1e6;
  double best = 0;
  std::uint64_t prev = start;
  for (std::uint64_t t : done_at) {
    if (t > prev) best = std::max(best, static_cast<double>(cq_mod) / (clock_.us(t - prev) / 1e6));
    prev = t;
  }
  r.bw_peak = std::max(best * static_cast<double>(size) / (1 << 20), r.bw_avg);
  return r;
}

// ---------------------------------------------------------------------------

void print_rule() {
  std::printf("---------------------------------------------------------------------------------------\n");
}

void print_banner(const options& o, const std::string& device_name, bool remote) {
  print_rule();
  std::printf("                    %s Test\n", test_name(o.test));
  std::printf(" Dual-port       : OFF\t\tDevice         : %s\n", device_name.c_str());
  std::printf(" Number of qps   : 1\t\tTransport type : IB\n");
  std::printf(" Connection type : RC\t\tUsing SRQ      : OFF\n");
  std::printf(" Mtu             : %u[B]\n", mtu_bytes(o.path_mtu));
  std::printf(" Link type       : Ethernet\n");
  std::printf(" Max inline data : %u[B]\n", o.inline_size);
  std::printf(" Data ex. method : %s\n", remote ? "Ethernet (out-of-band TCP), RoCEv2 over UDP between two processes"
                                                 : "in-process (loopback link)");
  print_rule();
}

void print_latency_header() {
  std::printf(
      " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99%% "
      "percentile[usec]   99.9%% percentile[usec] \n");
}

void print_latency(const latency_result& r) {
  std::printf(" %-7zu %zu          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
              r.bytes, r.iters, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p999);
}

void print_bandwidth_header() {
  std::printf(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n");
}

void print_bandwidth(const bandwidth_result& r) {
  std::printf(" %-7zu    %-10zu       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.bytes, r.iters, r.bw_peak, r.bw_avg,
              r.msg_rate);
}

}  // namespace averbs::perf
