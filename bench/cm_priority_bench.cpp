// SPDX-License-Identifier: MIT
// Does management traffic keep its priority?  Connection setup latency
// (connect → REQ → REP → RTU, QP creation included) measured idle and
// while a bulk RDMA WRITE stream saturates the same two devices.
//
// Two UDP devices on their own loopback addresses, each driven by its own
// thread and context (a client and a server, as two processes would be):
// the server accepts every request; the client runs a 1 MiB RDMA WRITE
// stream (16 in flight) over a connection of its own and, alternately
// idle and loaded, times `--connects` sequential connects.  Prints the
// median and 90th percentile of each phase, the write bandwidth while
// loaded, and the ratio loaded/idle (target: at most 2).
//
//   cm_priority_bench [--connects N] [--rounds R] [--base-address 127.0.77] [--port P]
#include <averbs/cm.hpp>
#include <averbs/verbs.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace averbs;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::size_t bulk_size = 1 << 20;
constexpr int bulk_depth = 16;

struct bulk_target {
  std::uint64_t addr;
  std::uint32_t rkey;
};

// Accepts every request on `l` until `stop`; the first connection's accept
// carries the address and key of a buffer the client may write to.
void serve(const std::string& dev_name, const cm::address& at, std::atomic<bool>& stop, std::atomic<bool>& ready) {
  context ctx;
  device dev = open_device(ctx, dev_name);
  pd p = dev.alloc_pd();
  cq c = dev.create_cq(4096);
  std::vector<std::byte> target(bulk_size);
  mr m = p.reg_mr(target.data(), target.size(), access_local_write | access_remote_write);
  cm::listener l = cm::listen(dev, at, 1024);
  completion_port port(ctx);
  for (int i = 0; i < 8; ++i) l.async_get_request(bind_port(port, 1));
  ready = true;
  std::vector<cm::connector> conns;
  std::vector<qp> qps;
  completion_entry e[16];
  bool first = true;
  while (!stop.load(std::memory_order_relaxed)) {
    const std::size_t n = port.get(e, std::chrono::milliseconds(1));
    for (std::size_t i = 0; i < n; ++i) {
      if (e[i].key() != 1 || e[i].error()) continue;
      l.async_get_request(bind_port(port, 1));
      conns.push_back(e[i].result<cm::connection_request>()->conn);
      qp_init_attr ia;
      ia.send_cq = ia.recv_cq = c;
      ia.cap = {4, 4, 1, 1, 0};
      qps.push_back(p.create_qp(ia));
      bulk_target t{reinterpret_cast<std::uintptr_t>(target.data()), m.rkey()};
      std::vector<std::byte> pdata(sizeof t);
      if (first) std::memcpy(pdata.data(), &t, sizeof t);
      first = false;
      conns.back().async_accept(qps.back(), pdata, bind_port(port, 2));
    }
  }
}

struct phase {
  std::vector<double> us;  // one per connect
  double write_mbps = 0;
};

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  int connects = 200, rounds = 5;
  std::string base = "127.0.77";
  std::uint16_t port_num = 24791;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--connects" && i + 1 < argc) connects = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--base-address" && i + 1 < argc) base = argv[++i];
    else if (a == "--port" && i + 1 < argc) port_num = static_cast<std::uint16_t>(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: cm_priority_bench [--connects N] [--rounds R] [--base-address A.B.C] [--port P]\n");
      return 2;
    }
  }
  const std::string addr_c = base + ".2", addr_s = base + ".3";
  soft_device sc(soft_device_options{.name = "prio_client", .address = addr_c, .port = port_num});
  soft_device ss(soft_device_options{.name = "prio_server", .address = addr_s, .port = port_num});
  gid sip;
  gid::parse(addr_s, sip);
  const cm::address server{sip, 7471};

  std::atomic<bool> stop{false}, ready{false};
  std::thread server_thread(serve, "prio_server", server, std::ref(stop), std::ref(ready));
  while (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  context ctx;
  device dev = open_device(ctx, "prio_client");
  pd p = dev.alloc_pd();
  cq c = dev.create_cq(4096);
  auto make_qp = [&] {
    qp_init_attr ia;
    ia.send_cq = ia.recv_cq = c;
    ia.cap = {bulk_depth * 2, 4, 1, 1, 0};
    return p.create_qp(ia);
  };
  // The bulk connection, through the CM; the REP says where to write.
  qp bulk = make_qp();
  cm::connector bulk_conn(dev);
  const cm::connect_result r = bulk_conn.connect(bulk, server);
  bulk_target t;
  std::memcpy(&t, r.private_data.data(), sizeof t);
  std::vector<std::byte> src(bulk_size, std::byte{0x5A});
  mr ms = p.reg_mr(src.data(), src.size(), access_local_write);
  const sge s{reinterpret_cast<std::uintptr_t>(src.data()), static_cast<std::uint32_t>(bulk_size), ms.lkey()};
  int in_flight = 0;
  std::uint64_t written = 0;
  auto pump = [&](bool load) {
    work_completion wc[32];
    const std::size_t n = c.poll(wc);
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].status != wc_status::success) {
        std::fprintf(stderr, "bulk write failed: %s\n", to_string(wc[i].status).data());
        std::exit(1);
      }
      --in_flight;
      written += bulk_size;
    }
    // Refill the pipeline with one post (a WR list), as perftest's -l
    // does: the engine runs one pass for all of them.
    send_wr ws[bulk_depth];
    int k = 0;
    while (load && in_flight + k < bulk_depth) {
      send_wr& w = ws[k];
      w = send_wr{};
      w.opcode = wr_opcode::rdma_write;
      w.sg_list = &s;
      w.num_sge = 1;
      w.flags = send_signaled;
      w.remote_addr = t.addr;
      w.rkey = t.rkey;
      ++k;
    }
    if (k > 0) {
      std::size_t bad = 0;
      if (bulk.post_send(std::span(ws, static_cast<std::size_t>(k)), &bad)) k = static_cast<int>(bad);
      in_flight += k;
    }
  };
  auto run_phase = [&](bool load) {
    phase ph;
    // Let the stream reach its pace first.
    const auto warm = clock_type::now() + std::chrono::milliseconds(load ? 50 : 0);
    while (clock_type::now() < warm) pump(load);
    const std::uint64_t w0 = written;
    const auto t0 = clock_type::now();
    std::vector<cm::connector> keep;
    std::vector<qp> keep_qps;
    for (int i = 0; i < connects; ++i) {
      const auto a = clock_type::now();
      keep_qps.push_back(make_qp());
      keep.emplace_back(dev);
      auto req = keep.back().async_connect(keep_qps.back(), server, {}, use_request);
      // The loop of a program that streams and connects on one thread:
      // polling its CQ drives the device, the CM included.
      while (!req.ready()) pump(load);
      req.get();
      ph.us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - a).count());
    }
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    ph.write_mbps = static_cast<double>(written - w0) / secs / (1 << 20);
    while (in_flight > 0) pump(false);
    return ph;
  };

  std::printf("Connection setup latency, %d sequential connects per phase, %d rounds\n", connects, rounds);
  std::printf("(client %s, server %s, each device on its own thread; load: 1 MiB RDMA WRITEs, %d in flight)\n\n",
              addr_c.c_str(), addr_s.c_str(), bulk_depth);
  std::printf(" round  idle p50[us]  idle p90[us]  loaded p50[us]  loaded p90[us]  write[MB/s]  ratio p50\n");
  std::vector<double> idle50, load50, ratios, bw;
  for (int round = 0; round < rounds; ++round) {
    const phase idle = run_phase(false);
    const phase loaded = run_phase(true);
    const double i50 = pct(idle.us, 0.5), l50 = pct(loaded.us, 0.5);
    idle50.push_back(i50);
    load50.push_back(l50);
    ratios.push_back(l50 / i50);
    bw.push_back(loaded.write_mbps);
    std::printf(" %-6d %-13.1f %-13.1f %-15.1f %-15.1f %-12.0f %.2f\n", round, i50, pct(idle.us, 0.9), l50,
                pct(loaded.us, 0.9), loaded.write_mbps, l50 / i50);
    std::fflush(stdout);
  }
  std::printf("\n median: idle %.1f us, loaded %.1f us, ratio %.2f (target <= 2.00) at %.0f MB/s of writes\n",
              pct(idle50, 0.5), pct(load50, 0.5), pct(ratios, 0.5), pct(bw, 0.5));
  stop = true;
  server_thread.join();
  return 0;
}
