// SPDX-License-Identifier: MIT
#include "perf/perf.hpp"

#include <algorithm>
#include <bit>
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
  // perftest drops the two largest samples (LAT_MEASURE_TAIL) from the
  // statistics, and reports as t_max and the percentiles the sample at
  // index n, ceil(0.99 n) and ceil(0.999 n) of those left: the largest
  // kept is the second largest of all.
  const std::size_t n = d.size() > 3 ? d.size() - 2 : d.size();
  if (n == 0) return r;
  auto us = [&](std::uint64_t cyc) { return c.us(cyc) / rtt_factor; };
  auto at = [&](std::size_t i) { return us(d[std::min(i, d.size() - 1)]); };
  r.t_min = us(d[0]);
  r.t_max = at(n);
  r.t_typical = n % 2 == 0 ? us((d[n / 2] + d[n / 2 - 1]) / 2) : us(d[n / 2]);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += us(d[i]);
  r.t_avg = sum / static_cast<double>(n);
  double var = 0;
  for (std::size_t i = 0; i < n; ++i) var += (us(d[i]) - r.t_avg) * (us(d[i]) - r.t_avg);
  r.t_stdev = std::sqrt(var / static_cast<double>(n));
  r.p99 = at(static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.99)));
  r.p999 = at(static_cast<std::size_t>(std::ceil(static_cast<double>(n) * 0.999)));
  return r;
}

double peak_cycles_per_message(const std::vector<std::uint64_t>& posted,
                               const std::vector<std::uint64_t>& completed, std::size_t cq_mod) {
  const std::size_t n = std::min(posted.size(), completed.size());
  if (n == 0 || cq_mod == 0) return 0;
  double best = 0;
  auto consider = [&](std::size_t i, std::size_t j) {
    if (completed[j] <= posted[i]) return;  // clock went backwards across CPUs: no sample
    const double t = static_cast<double>(completed[j] - posted[i]) / static_cast<double>(j - i + 1);
    if (best == 0 || t < best) best = t;
  };
  for (std::size_t i = 0; i < n; ++i) {
    // The first signaled completion at or after i: index k * cq_mod - 1.
    for (std::size_t j = (i / cq_mod + 1) * cq_mod - 1; j < n; j += cq_mod) consider(i, j);
    if (n % cq_mod != 0) consider(i, n - 1);  // the last message is always signaled
  }
  return best;
}

namespace {

// Bytes per second in the unit the report uses: MB/s (2^20 B), or Gb/s.
double bw_units(double bytes_per_second, const options& o) {
  return o.report_gbits ? bytes_per_second * 8 / 1e9 : bytes_per_second / (1 << 20);
}

// Average and peak of a sender's run: `start` and `end` bracket it;
// `posted`/`completed` as peak_cycles_per_message takes them.
bandwidth_result bandwidth_report(const options& o, const cycle_clock& clock, std::size_t size,
                                  std::size_t iters, std::uint64_t start, std::uint64_t end,
                                  const std::vector<std::uint64_t>& posted,
                                  const std::vector<std::uint64_t>& completed, std::size_t cq_mod) {
  bandwidth_result r;
  r.bytes = size;
  r.iters = iters;
  const double secs = clock.us(end - start) / 1e6;
  if (secs <= 0) return r;
  r.bw_avg = bw_units(static_cast<double>(size) * static_cast<double>(iters) / secs, o);
  r.msg_rate = static_cast<double>(iters) / secs / 1e6;
  if (iters <= peak_max_iters) {
    const double cyc = peak_cycles_per_message(posted, completed, cq_mod);
    if (cyc > 0) r.bw_peak = bw_units(static_cast<double>(size) * clock.per_second() / cyc, o);
  }
  return r;
}

std::uint32_t bandwidth_cq_mod(const options& o, std::size_t size) {
  return !o.cq_mod_given && !o.all_sizes && size > 8192 ? 1 : o.cq_mod;
}

// How many messages a bandwidth sender posts: `iters`, or with -D as many
// as the duration allows, rounded up to a whole `cq_mod` so that the last
// is signaled (its completion says every earlier one completed).  A timed
// run is measured as perftest measures it: over its middle, from a quarter
// of the duration in to a quarter before its end, leaving out ramp-up and
// drain.
class send_budget {
 public:
  send_budget(const options& o, const cycle_clock& c, std::size_t iters, std::size_t cq_mod,
              std::uint64_t start)
      : clock_(c),
        timed_(o.duration != 0),
        limit_(timed_ ? SIZE_MAX : iters),
        cq_mod_(cq_mod),
        deadline_(start + static_cast<std::uint64_t>(o.duration * c.per_second())),
        sample_from_(start + static_cast<std::uint64_t>(o.duration * c.per_second() / 4)),
        sample_to_(start + static_cast<std::uint64_t>(o.duration * c.per_second() * 3 / 4)) {}
  /// The number to post, as far as it is known with `posted` posted.  Read
  /// it once per message: it is fixed the first time the deadline is seen.
  std::size_t limit(std::size_t posted) noexcept {
    if (limit_ == SIZE_MAX && clock_.now() >= deadline_)
      limit_ = std::max(cq_mod_, (posted + cq_mod_ - 1) / cq_mod_ * cq_mod_);
    return limit_;
  }
  /// After a poll that found completions: `completed` done by now.
  void completed(std::size_t completed) noexcept {
    if (!timed_ || window_[1].at != 0) return;
    const std::uint64_t now = clock_.now();
    if (window_[0].at == 0 && now >= sample_from_)
      window_[0] = {now, completed};
    else if (window_[0].at != 0 && now >= sample_to_)
      window_[1] = {now, completed};
  }
  /// A timed run's figures from its middle, when it has one.
  void apply(bandwidth_result& r, std::size_t size, const options& o) const {
    if (!timed_ || window_[1].at <= window_[0].at || window_[1].done <= window_[0].done) return;
    const double secs = clock_.us(window_[1].at - window_[0].at) / 1e6;
    const auto n = static_cast<double>(window_[1].done - window_[0].done);
    r.bw_avg = bw_units(static_cast<double>(size) * n / secs, o);
    r.msg_rate = n / secs / 1e6;
  }

 private:
  struct mark {
    std::uint64_t at = 0;
    std::size_t done = 0;
  };
  const cycle_clock& clock_;
  bool timed_;
  std::size_t limit_, cq_mod_;
  std::uint64_t deadline_, sample_from_, sample_to_;
  mark window_[2];
};

}  // namespace

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

// The port's GID at `index` (-x); an empty entry is an error.
gid source_gid(const device& d, std::uint32_t index) {
  const gid g = d.query_gid(1, index);
  if (g.is_zero()) throw std::runtime_error("GID index " + std::to_string(index) + " of port 1 is empty");
  return g;
}

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
  a.ah.grh.sgid_index = static_cast<std::uint8_t>(o.gid_index);
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
  const gid g = source_gid(dev_, o_.gid_index);
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
  // As perftest: READs and atomics beyond the initiator depth (-o) wait in
  // the send queue, not in this loop; and without -Q, a size over 8 KiB
  // (not in a sweep) signals every message.
  const std::uint32_t depth = o_.tx_depth != 0 ? o_.tx_depth : 128;
  const std::uint32_t cq_mod =
      std::max<std::uint32_t>(1, std::min<std::uint32_t>(bandwidth_cq_mod(o_, size), depth));
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
  const std::size_t recv_cap = o_.duration != 0 ? SIZE_MAX : iters;  // -D: receives as long as sends come
  std::size_t recvs_posted = 0;
  if (sends) {
    for (; recvs_posted < std::min<std::size_t>(recv_cap, o_.rx_depth); ++recvs_posted)
      if (auto ec = b.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
  }
  const std::uint32_t inl =
      size <= o_.inline_size && (sends || k == test_kind::write_bw) ? std::uint32_t{send_inline} : 0u;
  // Post time of each message, and when its signaled completion was seen
  // (only where the peak is measured).
  const bool peak = o_.duration == 0 && iters <= peak_max_iters;
  std::vector<std::uint64_t> t_posted(peak ? iters : 0), t_completed(peak ? iters : 0);
  std::size_t posted = 0, completed = 0, received = 0;
  work_completion wcs[64];
  const std::uint64_t start = clock_.now();
  send_budget budget(o_, clock_, iters, cq_mod, start);
  for (std::size_t limit = budget.limit(0); completed < limit; limit = budget.limit(posted)) {
    // SENDs only when a receive waits for them: outrunning the receiver
    // would measure RNR back-off, not the transport.
    for (; posted < limit && posted - completed < depth && (!sends || posted < recvs_posted);
         limit = budget.limit(posted)) {
      send_wr wr;
      wr.wr_id = posted;
      wr.sg_list = &ga;
      wr.num_sge = 1;
      wr.opcode = op;
      wr.flags =
          inl | (((posted + 1) % cq_mod == 0 || posted + 1 == limit) ? std::uint32_t{send_signaled} : 0u);
      wr.remote_addr = reinterpret_cast<std::uintptr_t>(b.buf.data());
      wr.rkey = b.m.rkey();
      wr.compare_add = 1;
      if (peak) t_posted[posted] = clock_.now();
      if (auto ec = a.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
      ++posted;
    }
    const std::size_t n = a.scq.poll(wcs);
    for (std::size_t i = 0; i < n; ++i) {
      if (wcs[i].status != wc_status::success)
        throw std::runtime_error(std::string("completion error: ") + std::string(to_string(wcs[i].status)));
      completed = wcs[i].wr_id + 1;
      if (peak) t_completed[wcs[i].wr_id] = clock_.now();
    }
    if (n != 0) budget.completed(completed);
    if (sends) {
      const std::size_t r = b.rcq.poll(wcs);
      received += r;
      for (std::size_t i = 0; i < r && recvs_posted < recv_cap; ++i, ++recvs_posted)
        if (auto ec = b.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
    }
  }
  bandwidth_result r =
      bandwidth_report(o_, clock_, size, completed, start, clock_.now(), t_posted, t_completed, cq_mod);
  budget.apply(r, size, o_);
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

bool mtu_of_bytes(long bytes, mtu& out) noexcept {
  for (mtu m : {mtu::mtu_256, mtu::mtu_512, mtu::mtu_1024, mtu::mtu_2048, mtu::mtu_4096}) {
    if (bytes == static_cast<long>(mtu_bytes(m))) {
      out = m;
      return true;
    }
  }
  return false;
}

std::string ip_text(const gid& g) {
  if (g.is_ipv4_mapped())
    return std::to_string(g.raw[12]) + "." + std::to_string(g.raw[13]) + "." + std::to_string(g.raw[14]) +
           "." + std::to_string(g.raw[15]);
  return g.to_string();
}

test_params params_of(const options& o) {
  test_params p;
  p.test = static_cast<std::uint32_t>(o.test);
  p.mtu_bytes = mtu_bytes(o.path_mtu);
  p.outs = o.outstanding_reads;
  p.all_sizes = o.all_sizes ? 1 : 0;
  p.size = o.all_sizes ? 0 : sizes_for(o).front();
  p.iters = iters_for(o);
  p.duration = o.duration;
  return p;
}

void agree(options& o, const test_params& peer) {
  const test_params me = params_of(o);
  auto sizes = [](const test_params& p) {
    return p.all_sizes != 0 ? std::string("all sizes (-a)") : std::to_string(p.size) + " bytes";
  };
  if (peer.test != me.test) {
    const char* theirs = peer.test <= static_cast<std::uint32_t>(test_kind::atomic_bw)
                             ? test_name(static_cast<test_kind>(peer.test))
                             : "an unknown test";
    throw std::runtime_error(std::string("the peer runs ") + theirs + ", this side " + test_name(o.test));
  }
  if (peer.all_sizes != me.all_sizes || peer.size != me.size)
    throw std::runtime_error("the peer runs " + sizes(peer) + ", this side " + sizes(me) +
                             " (give both the same -s or -a)");
  auto length = [](const test_params& p) {
    return p.duration != 0 ? std::to_string(p.duration) + " s" : std::to_string(p.iters) + " iterations";
  };
  if (peer.duration != me.duration || (me.duration == 0 && peer.iters != me.iters))
    throw std::runtime_error("the peer runs " + length(peer) + ", this side " + length(me) +
                             " (give both the same -n or -D)");
  // perftest's check_mtu: the smaller of the two.  An MTU that is none of
  // IBTA's is a peer we do not understand.
  mtu theirs{};
  if (!mtu_of_bytes(peer.mtu_bytes, theirs))
    throw std::runtime_error("the peer asks for a path MTU of " + std::to_string(peer.mtu_bytes) + " bytes");
  if (static_cast<unsigned>(theirs) < static_cast<unsigned>(o.path_mtu)) o.path_mtu = theirs;
  if (peer.outs == 0 || peer.outs > 255)
    throw std::runtime_error("the peer asks for " + std::to_string(peer.outs) + " outstanding READs");
  o.outstanding_reads = std::min(o.outstanding_reads, peer.outs);
}

namespace {

// The out-of-band steps: each end sends the word and expects the same.
constexpr std::uint64_t step_rts = 1, step_receives_posted = 2, step_size_done = 3, step_server_ready = 4,
                        step_server_done = 5, step_client_done = 6;

void check(const work_completion& wc, const char* what) {
  if (wc.status != wc_status::success)
    throw std::runtime_error(std::string("completion error: ") + std::string(to_string(wc.status)) + " (" +
                             what + ")");
}

// A bandwidth sender's figures, for the server to print (perftest's
// xchg_bw_reports): four words behind its end of the size.  Bandwidth goes
// in MB/s whatever unit each end reports in (--report_gbits is one end's
// choice, not part of the greeting): each side converts.
constexpr double mbytes_per_gbit = 1e9 / 8 / (1 << 20);

void send_bandwidth(const oob& link, const bandwidth_result& r, const options& o) {
  const double to_mb = o.report_gbits ? mbytes_per_gbit : 1;
  link.send_word(r.iters);
  link.send_word(std::bit_cast<std::uint64_t>(r.bw_peak * to_mb));
  link.send_word(std::bit_cast<std::uint64_t>(r.bw_avg * to_mb));
  link.send_word(std::bit_cast<std::uint64_t>(r.msg_rate));
}

bandwidth_result recv_bandwidth(const oob& link, const options& o) {
  bandwidth_result r;
  r.iters = static_cast<std::size_t>(link.recv_word());
  r.bw_peak = std::bit_cast<double>(link.recv_word());
  r.bw_avg = std::bit_cast<double>(link.recv_word());
  r.msg_rate = std::bit_cast<double>(link.recv_word());
  // Not a number, negative or absurd: a peer out of step, not figures.
  for (double v : {r.bw_peak, r.bw_avg, r.msg_rate})
    if (!std::isfinite(v) || v < 0 || v > 1e12)
      throw std::runtime_error("the client's figures are not figures");
  if (o.report_gbits) {
    r.bw_peak /= mbytes_per_gbit;
    r.bw_avg /= mbytes_per_gbit;
  }
  return r;
}

}  // namespace

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
  bool receives_posted = false;  // send_lat: two receives of `half` bytes, kept from size to size
  std::chrono::steady_clock::duration stall_limit{};

  /// Counts the idle turns of one wait; every 64th looks at the
  /// out-of-band connection (closed when the peer's process ends) and at
  /// how long nothing has happened.
  class watch {
   public:
    watch(const state& s, const char* what) : s_(s), what_(what) {}
    void idle() {
      if (++idle_ % 64 != 0) return;
      const auto now = std::chrono::steady_clock::now();
      if (idle_ == 64) {
        since_ = now;
      } else if (now - since_ > s_.stall_limit) {
        throw std::runtime_error(
            "nothing happened for " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(s_.stall_limit).count()) +
            " s while waiting for " + what_);
      }
      if (s_.link.peer_closed())
        throw std::runtime_error(
            std::string("the peer went away (its out-of-band connection closed) while waiting for ") + what_);
    }
    void progress() { idle_ = 0; }

   private:
    const state& s_;
    const char* what_;
    std::uint64_t idle_ = 0;
    std::chrono::steady_clock::time_point since_{};
  };

  /// The next completion on `c`, which must be a success.
  work_completion next(const cq& c, const char* what) const {
    watch w(*this, what);
    work_completion wc;
    while (c.poll({&wc, 1}) == 0) w.idle();
    if (wc.status == wc_status::wr_flush_err && &c != &scq) {
      // A flushed receive says only that the QP is in error; the cause
      // (a SEND whose retries ran out, say) is on the send queue.
      for (work_completion sw; scq.poll({&sw, 1}) == 1;)
        if (sw.status != wc_status::success && sw.status != wc_status::wr_flush_err)
          check(sw, "our SEND, before the receive queue was flushed");
    }
    check(wc, what);
    return wc;
  }

  /// Spins until the peer's RDMA WRITE sets `*at` to `v`, keeping the
  /// device running; an error on our send queue ends the wait.
  void until_written(const volatile std::uint8_t* at, std::uint8_t v, const char* what) const {
    watch w(*this, what);
    work_completion wc;
    while (*at != v) {
      if (scq.poll({&wc, 1}) == 1)
        check(wc, what);
      else
        w.idle();
    }
  }

  /// Receives the out-of-band word `want`, keeping the device running
  /// while it waits: the peer may be waiting for our ACKs (a device holds
  /// them back for a few tens of microseconds, and its timers run only
  /// while its process polls) or, in one-sided tests, for our responses.
  /// The socket is looked at every 64th turn (a poll syscall per turn was
  /// a few percent of the responder's CPU in read_bw); a peer from which
  /// nothing arrives for `stall_limit`, on either connection (stopped, or
  /// its host gone without a FIN), is given up.
  void await_word(std::uint64_t want, const char* what) const {
    auto since = std::chrono::steady_clock::now();
    std::uint64_t seen = dev.counters().packets_received;
    for (unsigned turn = 1;; ++turn) {
      rcq.poll({});
      if (turn % 64 != 0) continue;
      if (link.readable()) break;
      if (turn % 8192 != 0) continue;
      const auto now = std::chrono::steady_clock::now();
      const std::uint64_t got = dev.counters().packets_received;
      if (got != seen) {
        seen = got;
        since = now;
      } else if (now - since > stall_limit) {
        throw std::runtime_error(
            "nothing came from the peer for " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(stall_limit).count()) +
            " s while waiting for " + what);
      }
    }
    link.expect_word(want, what);
  }

  /// Tells the peer this side reached `step` and waits until it has too.
  void meet(std::uint64_t step, const char* what) const {
    link.send_word(step);
    await_word(step, what);
  }
};

namespace {
// Why a GID the peer sent cannot be the other end of our QP, or null: it
// must be a unicast address of our GID's family (the device would refuse a
// mixed pair only as "invalid argument", and send to a group address).
const char* unusable_peer_gid(const gid& peer, const gid& own) {
  const bool v4 = peer.is_ipv4_mapped();
  if (v4 != own.is_ipv4_mapped())
    return v4 ? "an IPv4 address (this device's is IPv6)" : "an IPv6 address (this device's is IPv4)";
  if (peer.is_unspecified()) return "the unspecified address";
  if (peer.is_group()) return "a multicast or broadcast address";
  return nullptr;
}
}  // namespace

remote_run::remote_run(context& ctx, const options& o, const std::string& host, std::size_t max_size)
    : o_(o), host_(host), s_(std::make_unique<state>()) {
  state& s = *s_;
  s.dev = open_device(ctx, o_.device);
  s.p = s.dev.alloc_pd();
  const std::uint32_t tx = std::max<std::uint32_t>(o_.tx_depth != 0 ? o_.tx_depth : 128, 128);
  // Room for every send to complete signaled (-Q 1), as the loopback run has.
  s.scq = s.dev.create_cq(std::max<std::uint32_t>(tx * 2, 1024));
  s.rcq = s.dev.create_cq(std::max<std::uint32_t>(o_.rx_depth * 2, 1024));
  qp_init_attr ia;
  ia.send_cq = s.scq;
  ia.recv_cq = s.rcq;
  // send_lat keeps two receives posted whatever -r says.
  ia.cap = {tx, std::max<std::uint32_t>(o_.rx_depth, 2), 1, 1, o_.inline_size};
  s.q = s.p.create_qp(ia);
  // [0, max): where the peer writes; [max, 2 max): what this side sends.
  s.buf.assign(2 * std::max<std::size_t>(max_size, 8) + 64, std::byte{0});
  s.half = std::max<std::size_t>(max_size, 8);
  s.m = s.p.reg_mr(s.buf.data(), s.buf.size(), all_access);
  to_init(s.q);

  const gid g = source_gid(s.dev, o_.gid_index);
  peer_info me{s.q.num(), 0, g, s.m.rkey(), reinterpret_cast<std::uintptr_t>(s.buf.data()), s.buf.size()};
  if (is_server()) {
    // Listen on the device's own address: several servers can share a host.
    oob listener = oob::listen(ip_text(g), o_.oob_port);
    s.link = listener.accept(std::chrono::minutes(10));
  } else {
    s.link = oob::connect(host, o_.oob_port, std::chrono::seconds(30));
  }
  // Both send before either receives: TCP buffers the few bytes.
  test_params mine = params_of(o_);
  mine.roce_port = s.dev.udp_port();
  s.link.send_params(mine);
  const test_params theirs = s.link.recv_params();
  agree(o_, theirs);
  // A device sends to its own RoCE port: with two, every packet is lost.
  if (theirs.roce_port != mine.roce_port)
    throw std::runtime_error("the peer's device uses RoCE UDP port " + std::to_string(theirs.roce_port) +
                             ", this side's " + std::to_string(mine.roce_port) +
                             " (give both --addr the same :PORT)");
  s.link.send_info(me);
  s.peer = s.link.recv_info();
  if (s.peer.qpn == 0 || s.peer.qpn > 0xFFFFFF)
    throw std::runtime_error("the peer sent QP number " + std::to_string(s.peer.qpn));
  if (s.peer.qpn == me.qpn && s.peer.g == me.g)
    throw std::runtime_error("the peer is this process (its QP " + std::to_string(me.qpn) + " and GID " +
                             me.g.to_string() + " are ours): the out-of-band connection reached itself");
  if (const char* why = unusable_peer_gid(s.peer.g, g))
    throw std::runtime_error("the peer sent GID " + s.peer.g.to_string() + ", " + why);
  if (s.peer.size < s.half)
    throw std::runtime_error("the peer's buffer (" + std::to_string(s.peer.size) +
                             " bytes) is smaller than the largest message");
  // A QP gives up after retry_cnt + 1 ACK timeouts; a wait that sees
  // nothing for twice that, and at least a minute, is stuck.
  const double ack_timeout_s = 4.096e-6 * std::ldexp(1.0, o_.qp_timeout);
  s.stall_limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(60.0, 2 * 8 * ack_timeout_s)));
  // min_rnr_timer 1 (10 us): a receiver reposting quickly should not cost 655 ms (P7).
  to_rts(s.q, o_, s.peer.qpn, s.peer.psn, s.peer.g, 1);
  // Both sides are in RTS before either sends.
  s.meet(step_rts, "connection setup");
}

remote_run::~remote_run() = default;

latency_result remote_run::latency(std::size_t size, std::size_t iters) {
  state& s = *s_;
  const auto k = o_.test;
  std::vector<std::uint64_t> samples;
  // (The server of a READ or atomic test takes no sample.)
  if (!is_server() || k == test_kind::send_lat || k == test_kind::write_lat) samples.reserve(iters);
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
    if ((wr.flags & send_signaled) != 0) (void)s.next(s.scq, "a send completion");
  };
  // Receives take the largest message: the two posted at the first size
  // stay posted (one consumed, one reposted per turn) through the sweep.
  const sge rg{reinterpret_cast<std::uintptr_t>(s.buf.data()), static_cast<std::uint32_t>(s.half),
               s.m.lkey()};
  recv_wr rwr;
  rwr.sg_list = &rg;
  rwr.num_sge = 1;
  double rtt_factor = 2;
  if (k == test_kind::send_lat) {
    if (!s.receives_posted) {
      for (int i = 0; i < 2; ++i)
        if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
      s.receives_posted = true;
    }
    s.meet(step_receives_posted, "the start of a size");
    // A sample is the time between two of this side's posts, one round
    // trip, as perftest takes them (iters - 1 samples).  The server's
    // first post follows the client's first SEND: a clock started before
    // that (at the out-of-band meeting) would make its first sample
    // whatever the two processes' start-up skew was.
    std::uint64_t prev = 0;
    for (std::size_t i = 0; i < iters; ++i) {
      if (is_server()) (void)s.next(s.rcq, "the peer's SEND");
      const std::uint64_t t = clock_.now();
      if (i != 0) samples.push_back(t - prev);
      prev = t;
      post(wr_opcode::send, i);
      if (!is_server()) (void)s.next(s.rcq, "the peer's SEND");
      if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
    }
  } else if (k == test_kind::write_lat) {
    // Write from the upper half into the peer's lower half; watch our own
    // lower half's last byte.
    const volatile auto* mine = reinterpret_cast<const volatile std::uint8_t*>(s.buf.data() + size - 1);
    g.addr += s.half;
    std::uint64_t prev = 0;  // (between posts, as send_lat's)
    for (std::size_t i = 0; i < iters; ++i) {
      const auto v = static_cast<std::uint8_t>(i + 1);
      if (is_server()) s.until_written(mine, v, "the peer's RDMA WRITE");
      s.buf[s.half + size - 1] = std::byte{v};
      const std::uint64_t t = clock_.now();
      if (i != 0) samples.push_back(t - prev);
      prev = t;
      post(wr_opcode::rdma_write, i);
      if (!is_server()) s.until_written(mine, v, "the peer's RDMA WRITE");
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
        (void)s.next(s.scq, atomic ? "an atomic response" : "a READ response");
        samples.push_back(clock_.now() - t0);
      }
    }
  }
  // Agree the size is over.  Both keep their devices running while they
  // wait: the one whose last send was signaled waits for an ACK the other
  // may still hold, and a one-sided test's server is its responder.
  s.meet(step_size_done, "the end of a size");
  if (is_server() && samples.empty()) return {size, iters};
  return summarize_latency(std::move(samples), clock_, size, iters, rtt_factor);
}

bandwidth_result remote_run::bandwidth(std::size_t size, std::size_t iters) {
  state& s = *s_;
  const auto k = o_.test;
  // As perftest: READs and atomics beyond the initiator depth (-o) wait in
  // the send queue, not in this loop; and without -Q, a size over 8 KiB
  // (not in a sweep) signals every message.
  const std::uint32_t depth = o_.tx_depth != 0 ? o_.tx_depth : 128;
  const std::uint32_t cq_mod =
      std::max<std::uint32_t>(1, std::min<std::uint32_t>(bandwidth_cq_mod(o_, size), depth));
  sge g{reinterpret_cast<std::uintptr_t>(s.buf.data()), static_cast<std::uint32_t>(size), s.m.lkey()};
  if (k == test_kind::atomic_bw) g.length = 8;
  const bool sends = k == test_kind::send_bw;
  bandwidth_result r;
  r.bytes = size;
  r.iters = iters;
  work_completion wcs[64];
  if (is_server()) {
    if (sends) {
      // The receiver measures too, as perftest's does: from the first
      // SEND to the last; it has no peak.
      recv_wr rwr;
      rwr.sg_list = &g;
      rwr.num_sge = 1;
      // -D: the sender decides how many; receives are posted for as long
      // as SENDs come, and its end-of-size word says they stopped.
      const bool timed = o_.duration != 0;
      const std::size_t cap = timed ? SIZE_MAX : iters;
      std::size_t posted = 0, received = 0;
      for (; posted < std::min<std::size_t>(cap, o_.rx_depth); ++posted)
        if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
      s.link.send_word(step_server_ready);
      state::watch w(s, "the peer's SENDs");
      std::uint64_t first = 0, last = 0;
      bool sender_done = false;
      for (unsigned turn = 0; timed ? true : received < iters; ++turn) {
        const std::size_t n = s.rcq.poll(wcs);
        if (n == 0) {
          // The sender's last SEND completed before it said so, and its
          // receive completion was queued here before the ACK left.
          if (sender_done) break;
          if (timed && turn % 64 == 0 && s.link.readable())
            sender_done = true;
          else
            w.idle();
          continue;
        }
        w.progress();
        last = clock_.now();
        if (received == 0) first = last;
        for (std::size_t i = 0; i < n; ++i) {
          check(wcs[i], "the peer's SENDs");
          ++received;
          if (posted < cap) {
            if (auto ec = s.q.post_recv(rwr)) throw std::runtime_error("post_recv: " + ec.message());
            ++posted;
          }
        }
      }
      // All in one poll: the time it took is up to now.
      if (last == first) last = clock_.now();
      r = bandwidth_report(o_, clock_, size, received, first, last, {}, {}, 1);
    } else {
      s.link.send_word(step_server_ready);
    }
    // One-sided tests: the responder runs while we wait for the client.
    s.await_word(step_client_done, "the end of a size");
    const bandwidth_result client = recv_bandwidth(s.link, o_);
    if (!sends) {  // the server of a one-sided test reports the client's figures
      r = client;
      r.bytes = size;
    }
    s.link.send_word(step_server_done);
    return r;
  }
  s.await_word(step_server_ready, "the start of a size");
  wr_opcode op = wr_opcode::send;
  if (k == test_kind::write_bw) op = wr_opcode::rdma_write;
  if (k == test_kind::read_bw) op = wr_opcode::rdma_read;
  if (k == test_kind::atomic_bw) op = wr_opcode::atomic_fetch_and_add;
  const std::uint32_t inl =
      size <= o_.inline_size && (sends || k == test_kind::write_bw) ? std::uint32_t{send_inline} : 0u;
  const bool peak = o_.duration == 0 && iters <= peak_max_iters;
  std::vector<std::uint64_t> t_posted(peak ? iters : 0), t_completed(peak ? iters : 0);
  state::watch w(s, "send completions");
  std::size_t posted = 0, completed = 0;
  const std::uint64_t start = clock_.now();
  send_budget budget(o_, clock_, iters, cq_mod, start);
  for (std::size_t limit = budget.limit(0); completed < limit; limit = budget.limit(posted)) {
    for (; posted < limit && posted - completed < depth; limit = budget.limit(posted)) {
      send_wr wr;
      wr.wr_id = posted;
      wr.sg_list = &g;
      wr.num_sge = 1;
      wr.opcode = op;
      wr.flags =
          inl | (((posted + 1) % cq_mod == 0 || posted + 1 == limit) ? std::uint32_t{send_signaled} : 0u);
      wr.remote_addr = s.peer.addr;
      wr.rkey = s.peer.rkey;
      wr.compare_add = 1;
      if (peak) t_posted[posted] = clock_.now();
      if (auto ec = s.q.post_send(wr)) throw std::runtime_error("post_send: " + ec.message());
      ++posted;
    }
    const std::size_t n = s.scq.poll(wcs);
    if (n == 0) {
      w.idle();
      continue;
    }
    w.progress();
    for (std::size_t i = 0; i < n; ++i) {
      check(wcs[i], "send completions");
      completed = wcs[i].wr_id + 1;
      if (peak) t_completed[wcs[i].wr_id] = clock_.now();
    }
    budget.completed(completed);
  }
  const std::uint64_t end = clock_.now();
  r = bandwidth_report(o_, clock_, size, completed, start, end, t_posted, t_completed, cq_mod);
  budget.apply(r, size, o_);
  s.link.send_word(step_client_done);
  send_bandwidth(s.link, r, o_);
  s.await_word(step_server_done, "the end of a size");
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

void print_bandwidth_header(bool gbits) {
  if (gbits)
    std::printf(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n");
  else
    std::printf(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n");
}

void print_bandwidth(const bandwidth_result& r) {
  std::printf(" %-7zu    %-10zu       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.bytes, r.iters, r.bw_peak, r.bw_avg,
              r.msg_rate);
}

}  // namespace averbs::perf
