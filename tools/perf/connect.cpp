// SPDX-License-Identifier: MIT
#include "perf/connect.hpp"

#include "perf/oob.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <stdexcept>
#include <vector>

namespace averbs::perf {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::uint64_t tag_get = 1ull << 62;
constexpr std::uint64_t tag_accept = 2ull << 62;
constexpr std::uint64_t tag_connect = 3ull << 62;
constexpr std::uint64_t tag_mask = 3ull << 62;
// What a client may report having established: -n and --sync, up to 100
// million each (cmd_perf).
constexpr std::uint64_t max_client_connections = 200'000'000;

qp make_qp(const pd& p, const cq& c) {
  qp_init_attr ia;
  ia.send_cq = c;
  ia.recv_cq = c;
  ia.cap = {1, 1, 1, 1, 0};
  return p.create_qp(ia);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

std::size_t serve_connections(context& ctx, const connect_options& o, const std::atomic<bool>* stop,
                              oob* oob_link, std::size_t* received, std::size_t* expected_out,
                              std::atomic<bool>* listening) {
  device dev = open_device(ctx, o.device);
  pd p = dev.alloc_pd();
  cq c = dev.create_cq(32767);
  cm::listener l = cm::listen(dev, o.server, 65536);
  completion_port port(ctx);
  std::vector<std::byte> buf(64);
  mr m = p.reg_mr(buf.data(), buf.size(), access_local_write);
  const sge s{reinterpret_cast<std::uintptr_t>(buf.data()), 64, m.lkey()};

  struct conn {
    cm::connector c;
    qp q;
  };
  std::vector<conn> conns;
  constexpr int parked = 64;
  for (int i = 0; i < parked; ++i) l.async_get_request(bind_port(port, tag_get));
  if (oob_link != nullptr) oob_link->send_word(1);  // ready
  if (listening != nullptr) listening->store(true, std::memory_order_release);

  std::size_t accepted = 0, got = 0;
  std::uint64_t expected = 0;
  auto finish_by = std::chrono::steady_clock::time_point::max();
  // A client that goes silent (stopped, its host gone without a FIN, or
  // not a client at all) ends the wait after a minute without a request,
  // an accept or a word.
  constexpr auto idle_limit = std::chrono::seconds(60);
  auto idle_until = std::chrono::steady_clock::now() + idle_limit;
  completion_entry e[64];
  work_completion wc[64];
  for (;;) {
    if (stop != nullptr && stop->load(std::memory_order_acquire)) break;
    if (oob_link != nullptr && expected == 0 && oob_link->readable()) {
      // The client is done: it says how many connections it established.
      // The last accepts complete when their RTUs arrive: wait for them.
      expected = oob_link->recv_word();
      if (expected == 0 || expected > max_client_connections)
        throw std::runtime_error("the client sent " + std::to_string(expected) +
                                 " as its connection count: is it running --test connect?");
      finish_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    if (expected != 0 && (accepted >= expected || std::chrono::steady_clock::now() > finish_by)) break;
    if (oob_link != nullptr && expected == 0 && std::chrono::steady_clock::now() > idle_until)
      throw std::runtime_error("the client went silent: no connection and no word for " +
                               std::to_string(idle_limit.count()) + " s");
    const std::size_t n = port.get(e, std::chrono::milliseconds(1));
    if (n != 0) idle_until = std::chrono::steady_clock::now() + idle_limit;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t key = e[i].key();
      if ((key & tag_mask) == tag_get) {
        l.async_get_request(bind_port(port, tag_get));
        if (e[i].error()) continue;
        cm::connection_request* req = e[i].result<cm::connection_request>();
        const std::size_t idx = conns.size();
        conns.push_back({req->conn, make_qp(p, c)});
        conns.back().c.async_accept(conns.back().q, {}, bind_port(port, tag_accept | idx));
      } else if ((key & tag_mask) == tag_accept) {
        if (e[i].error()) continue;
        ++accepted;
        if (o.verify) conns[key & ~tag_mask].q.post_recv(recv_wr{key, &s, 1});
      }
    }
    for (std::size_t k = c.poll(wc); k > 0; k = c.poll(wc)) {
      idle_until = std::chrono::steady_clock::now() + idle_limit;  // the client's SENDs: it is alive
      for (std::size_t j = 0; j < k; ++j)
        if (wc[j].status == wc_status::success) ++got;
    }
  }
  if (received != nullptr) *received = got;
  if (expected_out != nullptr) *expected_out = static_cast<std::size_t>(expected);
  return accepted;
}

connect_stats run_connections(context& ctx, const connect_options& o, const oob* server_link) {
  connect_stats st;
  cm::conn_params params;
  params.ack_timeout = o.ack_timeout;
  auto check_server = [&](const char* phase) {
    if (server_link != nullptr && server_link->peer_closed())
      throw std::runtime_error(
          std::string("the server went away (its out-of-band connection closed) during ") + phase);
  };
  device dev = open_device(ctx, o.device);
  pd p = dev.alloc_pd();
  cq c = dev.create_cq(32767);
  std::vector<std::byte> buf(64);
  mr m = p.reg_mr(buf.data(), buf.size(), access_local_write);
  const sge s{reinterpret_cast<std::uintptr_t>(buf.data()), 8, m.lkey()};
  completion_port port(ctx);
  const std::size_t n = o.connections;
  std::vector<cm::connector> conns(n);
  std::vector<qp> qps(n);

  // Pipelined: a window of connects in flight, each completion starts the
  // next.  The QP is created as part of each connection's setup.
  const std::size_t rss0 = resident_bytes();
  const auto t0 = clock_type::now();
  std::size_t issued = 0, done = 0;
  auto issue = [&] {
    const std::size_t i = issued++;
    qps[i] = make_qp(p, c);
    conns[i] = cm::connector(dev);
    conns[i].async_connect(qps[i], o.server, {}, params, bind_port(port, tag_connect | i));
  };
  while (issued < n && issued < o.window) issue();
  completion_entry e[64];
  auto progress_by = clock_type::now() + std::chrono::seconds(30);
  while (done < n) {
    check_server("the pipelined connects");
    const std::size_t k = port.get(e, std::chrono::milliseconds(100));
    if (k == 0) {
      if (clock_type::now() > progress_by)
        throw std::runtime_error("connect: no progress for 30 s (" + std::to_string(done) + " done)");
      continue;
    }
    progress_by = clock_type::now() + std::chrono::seconds(30);
    for (std::size_t j = 0; j < k; ++j) {
      ++done;
      if (e[j].error()) {
        if (st.failed++ == 0)
          std::fprintf(stderr, "connect %llu: %s\n", static_cast<unsigned long long>(e[j].key() & ~tag_mask),
                       e[j].error().message().c_str());
      }
      if (issued < n) issue();
    }
  }
  st.seconds = seconds_since(t0);
  st.connections = n - st.failed;
  st.per_second = static_cast<double>(st.connections) / st.seconds;
  st.qps = n;
  const std::size_t rss1 = resident_bytes();
  st.bytes_per_qp = rss1 > rss0 ? static_cast<double>(rss1 - rss0) / static_cast<double>(n) : 0;

  // Every connection carries one SEND.
  if (o.verify) {
    std::size_t posted = 0, completed = 0;
    work_completion wc[64];
    const auto deadline = clock_type::now() + std::chrono::seconds(60);
    auto next_check = clock_type::now();
    while (completed < n) {
      // A window of SENDs in flight, as an application would keep: ten
      // thousand at once only measure how long a retry timer is.  256, as
      // the connect window: the ACKs of 1024 came back faster than a
      // client slowed down by ASan on a busy machine read its socket (2045
      // receive buffer overflows, all 1024 retransmitting at once, retries
      // exhausted in one CI run of ten_thousand_connections).
      while (posted < n && posted - completed < 256) {
        send_wr w;
        w.wr_id = posted;
        w.sg_list = &s;
        w.num_sge = 1;
        w.flags = send_signaled;
        if (qps[posted].post_send(w)) ++completed;  // a failed connect's QP cannot send
        ++posted;
      }
      const std::size_t k = c.poll(wc);
      for (std::size_t j = 0; j < k; ++j) {
        ++completed;
        if (wc[j].status == wc_status::success) ++st.verified;
        else if (completed - st.verified == 1)
          std::fprintf(stderr, "verify: connection %llu: %s\n", static_cast<unsigned long long>(wc[j].wr_id),
                       to_string(wc[j].status).data());
      }
      if (k == 0) {
        ctx.poll();
        const auto now = clock_type::now();
        if (now > deadline) throw std::runtime_error("verify: sends did not complete in 60 s");
        // Not on every empty poll: a client slowed down (ASan, a busy
        // machine) must keep reading its socket, or ACKs overflow it.
        if (now > next_check) {
          check_server("the verification");
          next_check = now + std::chrono::milliseconds(100);
        }
      }
    }
  }

  // One at a time, synchronously.
  st.sync_connections = o.sync_connections != 0 ? o.sync_connections : std::min<std::size_t>(n, 10000);
  std::vector<cm::connector> sconns(st.sync_connections);
  std::vector<qp> sqps(st.sync_connections);
  const auto t1 = clock_type::now();
  for (std::size_t i = 0; i < st.sync_connections; ++i) {
    if (i % 64 == 0) check_server("the synchronous connects");  // (a poll(2) each time)
    sqps[i] = make_qp(p, c);
    sconns[i] = cm::connector(dev);
    sconns[i].connect(sqps[i], o.server, {}, params);
  }
  st.sync_seconds = seconds_since(t1);
  st.sync_per_second = static_cast<double>(st.sync_connections) / st.sync_seconds;

  // Disconnect everything (each completes once its QP is flushed).
  for (auto& cn : conns)
    if (cn.state() == cm::conn_state::established) cn.async_disconnect(bind_port(port, 0));
  for (auto& cn : sconns) cn.async_disconnect(bind_port(port, 0));
  while (port.get(e, std::chrono::milliseconds(0)) > 0) {
  }
  return st;
}

void print_connect_header() {
  std::printf(" #connections   mode          time[s]    conn/s       memory/QP[B]   verified\n");
}

void print_connect(const connect_stats& s) {
  std::printf(" %-13zu pipelined     %-10.3f %-12.0f %-14.0f %zu\n", s.connections, s.seconds, s.per_second,
              s.bytes_per_qp, s.verified);
  std::printf(" %-13zu synchronous   %-10.3f %-12.0f %-14s %s\n", s.sync_connections, s.sync_seconds,
              s.sync_per_second, "-", "-");
  if (s.failed != 0) std::printf(" %zu connects failed\n", s.failed);
}

}  // namespace averbs::perf
