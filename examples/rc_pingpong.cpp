// SPDX-License-Identifier: MIT
// A first averbs program: an RC ping-pong between two processes, each with
// its own soft RDMA device on its own loopback address, connected through
// the connection manager -- rdma-core's ibv_rc_pingpong, with rdma_cm's
// addressing, in the averbs C++ API.
//
//   rc_pingpong 127.0.0.2              # server: a device on 127.0.0.2, waits
//   rc_pingpong 127.0.0.3 127.0.0.2    # client: a device on 127.0.0.3, connects
//
// Options: -n ITERS (1000), -p CM_PORT (7471, the listener's port, on
// both ends), and ADDR:PORT for a RoCE UDP port other than 4791 (both ends
// the same).  SERVER is an address alone.
//
// Every verb here is the synchronous form, which throws std::system_error;
// each also has an async_ form taking a completion token (docs/async.md).
#include <averbs/cm.hpp>
#include <averbs/verbs.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace {

constexpr std::size_t msg_size = 64;

// Posts one receive of the buffer's second half.
void post_recv(const averbs::qp& qp, const averbs::mr& mr, std::byte* buf) {
  const averbs::sge sg{reinterpret_cast<std::uintptr_t>(buf + msg_size), msg_size, mr.lkey()};
  averbs::recv_wr wr;
  wr.wr_id = 2;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  if (auto ec = qp.post_recv(wr)) throw std::system_error(ec, "post_recv");
}

// Sends the buffer's first half.
void post_send(const averbs::qp& qp, const averbs::mr& mr, std::byte* buf) {
  const averbs::sge sg{reinterpret_cast<std::uintptr_t>(buf), msg_size, mr.lkey()};
  averbs::send_wr wr;
  wr.wr_id = 1;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.opcode = averbs::wr_opcode::send;
  wr.flags = averbs::send_signaled;
  if (auto ec = qp.post_send(wr)) throw std::system_error(ec, "post_send");
}

// Completions seen so far, of sends (wr_id 1) and of receives (wr_id 2).
struct seen {
  std::uint64_t sends = 0, recvs = 0;
};

// Polls until `s` counts at least `sends` and `recvs` completions.  A
// completion that comes before it is waited for is counted, not lost (the
// next ping's receive may complete before the last answer's send does).
// Polling also drives the device: the library starts no threads.
void wait_until(const averbs::cq& cq, seen& s, std::uint64_t sends, std::uint64_t recvs) {
  std::array<averbs::work_completion, 4> wc;
  while (s.sends < sends || s.recvs < recvs) {
    const std::size_t n = cq.poll(wc);
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].status != averbs::wc_status::success)
        throw std::system_error(make_error_code(wc[i].status), "work completion");
      ++(wc[i].wr_id == 1 ? s.sends : s.recvs);
    }
  }
}

int usage() {
  std::fprintf(stderr, "usage: rc_pingpong [-n ITERS] [-p CM_PORT] ADDR[:ROCE_PORT] [SERVER_ADDR]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 1000;
  std::uint16_t cm_port = 7471;
  std::string own, server;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "-n" || a == "-p") && i + 1 < argc) {
      const long v = std::strtol(argv[++i], nullptr, 10);
      if (v < 1 || v > (a == "-n" ? 100'000'000 : 65535)) return usage();
      if (a == "-n")
        iters = static_cast<int>(v);
      else
        cm_port = static_cast<std::uint16_t>(v);
    } else if (own.empty()) {
      own = a;
    } else if (server.empty()) {
      server = a;
    } else {
      return usage();
    }
  }
  averbs::cm::address at, to;
  // The server is an address alone: the CM port is -p's (a port there
  // would be read as the CM's, unlike ADDR's, which is the RoCE port).
  if (own.empty() || !averbs::cm::address::parse(own, at) ||
      (!server.empty() && (!averbs::cm::address::parse(server, to) || to.port != 0)))
    return usage();
  const bool client = !server.empty();

  try {
    // 1. A soft RDMA device speaking RoCEv2 over UDP from our address.  It
    //    lives in this process (a device daemon many processes share is
    //    not there yet); open_device() finds it by name.
    averbs::soft_device_options so;
    so.name = "pingpong";
    so.address = at.ip.to_string();
    if (at.port != 0) so.port = at.port;
    averbs::soft_device device_here(so);

    // 2. A context (where requests complete), the device, and the objects.
    averbs::context ctx;
    averbs::device dev = averbs::open_device(ctx, "pingpong");
    averbs::pd pd = dev.alloc_pd();
    averbs::cq cq = dev.create_cq(16);
    std::array<std::byte, 2 * msg_size> buf{};
    averbs::mr mr = pd.reg_mr(buf.data(), buf.size(), averbs::access_local_write);
    averbs::qp_init_attr ia;
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.type = averbs::qp_type::rc;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    averbs::qp qp = pd.create_qp(ia);

    // 3. Connect.  connect() and accept() each take the QP from RESET or
    //    INIT to RTS (the IB CM exchange over QP1: REQ, REP, RTU).  The QP
    //    is moved to INIT here, as rdma_cm's rdma_create_qp() leaves it, so
    //    that a receive can be posted before the peer's first message.
    averbs::qp_attr init;
    init.state = averbs::qp_state::init;
    init.port_num = 1;
    init.pkey_index = 0;
    init.qp_access_flags = 0;  // no remote access: SENDs only
    qp.modify(init, averbs::qp_attr_state | averbs::qp_attr_port | averbs::qp_attr_pkey_index |
                        averbs::qp_attr_access_flags);
    post_recv(qp, mr, buf.data());
    averbs::cm::connector conn;
    if (client) {
      to.port = cm_port;
      conn = averbs::cm::connector(dev);
      conn.connect(qp, to);
    } else {
      averbs::cm::listener listener = averbs::cm::listen(dev, {at.ip, cm_port});
      std::printf("listening on %s\n", listener.local_address().to_string().c_str());
      std::fflush(stdout);
      averbs::cm::connection_request req = listener.get_request();
      conn = req.conn;
      conn.accept(qp);
    }

    // 4. Ping-pong: the client sends and waits for the answer; the server
    //    answers what it receives.  Each side reposts its receive before
    //    sending, so the next message always finds one.
    const auto start = std::chrono::steady_clock::now();
    seen done;
    for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(iters); ++i) {
      if (client) {
        std::snprintf(reinterpret_cast<char*>(buf.data()), msg_size, "ping %llu",
                      static_cast<unsigned long long>(i));
        post_send(qp, mr, buf.data());
        wait_until(cq, done, i + 1, i + 1);  // the ping acknowledged, and the answer
        if (std::strcmp(reinterpret_cast<const char*>(buf.data() + msg_size),
                        reinterpret_cast<const char*>(buf.data())) != 0)
          throw std::runtime_error("the answer differs from the ping");
        post_recv(qp, mr, buf.data());
      } else {
        wait_until(cq, done, i, i + 1);                            // the ping, and the last answer sent
        std::memcpy(buf.data(), buf.data() + msg_size, msg_size);  // echo it
        post_recv(qp, mr, buf.data());
        post_send(qp, mr, buf.data());
      }
    }
    // (Each round trip here also waits for the ping's acknowledgement: the
    // send is signaled.  `averbs perf --test send_lat` signals every 32nd
    // send, as perftest does, and measures the latency itself.)
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    std::printf("%d round trips of %zu bytes, %.2f us each\n", iters, msg_size, took.count() / iters);

    // 5. Disconnect: the client asks (DREQ) once it has every answer; the
    //    server waits for its last answer to be acknowledged, then for the
    //    DREQ.  Both QPs end in ERR, and the handles clean up as they go
    //    out of scope.
    if (client) {
      conn.disconnect();
    } else {
      wait_until(cq, done, static_cast<std::uint64_t>(iters), static_cast<std::uint64_t>(iters));
      conn.notify_disconnect();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rc_pingpong: %s\n", e.what());
    return 1;
  }
  return 0;
}
