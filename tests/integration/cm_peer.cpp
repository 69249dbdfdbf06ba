// SPDX-License-Identifier: MIT
// One end of a CM connection between two processes, for the crash tests:
// it can die (SIGKILL, no goodbye) at a chosen point of the handshake or
// after it, and otherwise reports what the connection manager told it.
//
//   cm_peer --addr A --port P --serve [--accept-delay-ms N] [--crash-on request|established]
//   cm_peer --addr A --port P --connect IP [--crash-on req|established] [--disconnect-after-ms N]
//
// Prints, one per line: "ready" (listening), "requested", "connect: E",
// "accept: E", "notify: E", with E an errc name or "ok".  Once connected
// it keeps one SEND in flight every few milliseconds, so a vanished peer
// shows as the QP failing (retries exhausted), and waits for
// notify_disconnect.
#include <averbs/cm.hpp>
#include <averbs/verbs.hpp>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

using namespace averbs;
using namespace std::chrono_literals;

namespace {

const char* name_of(const std::error_code& ec) {
  if (!ec) return "ok";
  if (ec.category() != averbs::error_category()) return "other";
  switch (static_cast<errc>(ec.value())) {
    case errc::timed_out: return "timed_out";
    case errc::connection_refused: return "connection_refused";
    case errc::connection_rejected: return "connection_rejected";
    case errc::connection_reset: return "connection_reset";
    case errc::operation_aborted: return "operation_aborted";
    case errc::address_unreachable: return "address_unreachable";
    default: return "other";
  }
}

void say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

[[noreturn]] void crash() {
  ::raise(SIGKILL);
  std::abort();
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized_build = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized_build = true;
#else
constexpr bool sanitized_build = false;
#endif
#else
constexpr bool sanitized_build = false;
#endif

// Short timeouts, so a dead peer is noticed soon: 17 ms (a sanitizer
// build, several times slower on a loaded 2-core machine, can stall a
// process that long: 67 ms there, and more retries, as peer.cpp and
// cm_udp_test do).
cm::conn_params fast() {
  cm::conn_params p;
  p.cm_response_timeout = sanitized_build ? 14 : 12;
  p.max_cm_retries = sanitized_build ? 7 : 4;
  p.ack_timeout = sanitized_build ? 14 : 12;
  p.retry_count = sanitized_build ? 7 : 3;
  return p;
}

// Traffic until the connection ends; returns how notify completed.
std::error_code run_until_disconnected(context& ctx, const pd& p, const cq& c, const qp& q,
                                       const cm::connector& conn, long disconnect_after_ms) {
  std::vector<std::byte> buf(64);
  mr m = p.reg_mr(buf.data(), buf.size(), access_local_write);
  const sge s{reinterpret_cast<std::uintptr_t>(buf.data()), 32, m.lkey()};
  const sge r{reinterpret_cast<std::uintptr_t>(buf.data()) + 32, 32, m.lkey()};
  for (int i = 0; i < 8; ++i) q.post_recv(recv_wr{100, &r, 1});
  auto notified = conn.async_notify_disconnect(use_request);
  const auto start = std::chrono::steady_clock::now();
  auto last_send = start - 1s;
  bool in_flight = false;
  while (!notified.ready()) {
    const auto now = std::chrono::steady_clock::now();
    if (now - start > 20s) return make_error_code(errc::timed_out);
    if (disconnect_after_ms >= 0 && now - start > std::chrono::milliseconds(disconnect_after_ms)) {
      conn.disconnect();
      disconnect_after_ms = -1;
    }
    if (!in_flight && now - last_send > 5ms && q.state() == qp_state::rts) {
      send_wr w;
      w.wr_id = 1;
      w.sg_list = &s;
      w.num_sge = 1;
      w.flags = send_signaled;
      in_flight = !q.post_send(w);
      last_send = now;
    }
    work_completion wc[8];
    const std::size_t n = c.poll(wc);
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].wr_id == 1) in_flight = false;
      if (wc[i].wr_id == 100 && wc[i].status == wc_status::success) q.post_recv(recv_wr{100, &r, 1});
    }
    ctx.poll();
  }
  std::error_code ec;
  notified.get(ec);
  return ec;
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr, connect_to, crash_on;
  std::uint16_t port = 0;
  long accept_delay_ms = 0, disconnect_after_ms = -1;
  bool serve = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cm_peer: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--addr") addr = next();
    else if (a == "--port") port = static_cast<std::uint16_t>(std::atoi(next().c_str()));
    else if (a == "--serve") serve = true;
    else if (a == "--connect") connect_to = next();
    else if (a == "--crash-on") crash_on = next();
    else if (a == "--accept-delay-ms") accept_delay_ms = std::atol(next().c_str());
    else if (a == "--disconnect-after-ms") disconnect_after_ms = std::atol(next().c_str());
    else {
      std::fprintf(stderr, "cm_peer: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (addr.empty() || port == 0 || serve == !connect_to.empty()) {
    std::fprintf(stderr, "usage: cm_peer --addr A --port P (--serve | --connect IP) [options]\n");
    return 2;
  }
  try {
    soft_device_options o;
    o.name = "cm_peer";
    o.address = addr;
    o.port = port;
    soft_device sdev(o);
    context ctx;
    device dev = open_device(ctx, o.name);
    pd p = dev.alloc_pd();
    cq c = dev.create_cq(256);
    qp_init_attr ia;
    ia.send_cq = ia.recv_cq = c;
    ia.cap = {8, 16, 1, 1, 0};
    qp q = p.create_qp(ia);
    gid own;
    gid::parse(addr, own);
    std::error_code ec;
    cm::connector conn;
    if (serve) {
      cm::listener l = cm::listen(dev, {own, port});
      say("ready");
      cm::connection_request req = l.get_request();
      say("requested");
      if (crash_on == "request") crash();
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(accept_delay_ms);
      while (std::chrono::steady_clock::now() < until) ctx.poll();
      conn = req.conn;
      conn.accept(q, {}, fast(), ec);
      say(std::string("accept: ") + name_of(ec));
      if (ec) return 0;
    } else {
      gid peer;
      if (!gid::parse(connect_to, peer)) return 2;
      conn = cm::connector(dev);
      auto r = conn.async_connect(q, {peer, port}, {}, fast(), use_request);
      if (crash_on == "req") crash();  // the REQ left when the connect started
      r.get(ec);
      say(std::string("connect: ") + name_of(ec));
      if (ec) return 0;
    }
    if (crash_on == "established") crash();
    ec = run_until_disconnected(ctx, p, c, q, conn, disconnect_after_ms);
    say(std::string("notify: ") + name_of(ec));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cm_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
