// SPDX-License-Identifier: MIT
// The asynchronous verbs, in one thread.  Every control operation has an
// async_ form that takes a completion token, and the caller chooses, call
// by call, how it learns the result: a request it waits on, an entry in a
// completion port, a callback, a future or a coroutine (docs/async.md).
// Nothing here blocks on the other side: one thread drives two devices, a
// server and a client, each on its own loopback address, and connects them
// through the connection manager, which one thread cannot do with the
// synchronous forms (accept would wait for a connect that never starts).
//
//   async_tour 127.0.0.2 127.0.0.3     # the server's address, the client's
//
// Options: -p CM_PORT (7471, the listener's port), and ADDR:PORT for a RoCE
// UDP port other than 4791 (both the same).
//
// The library starts no threads: results arrive while this thread waits
// on the context (request.get(), port.get(), alertable_wait(), poll()),
// and only then: a callback never runs inside the call that starts it.
#include <averbs/async.hpp>
#include <averbs/cm.hpp>
#include <averbs/verbs.hpp>

#include <array>
#include <chrono>
#include <coroutine>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <optional>
#include <span>
#include <string>

namespace {

using namespace std::chrono_literals;

// The smallest coroutine type: it starts at once and runs to its end by
// itself.  A program would use its own task type, or a library's; any
// coroutine can co_await an operation given `averbs::use_awaitable`.
struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s)); }

// Private data comes back padded to its field's size (REQ 56, REP 196).
std::string text_of(const std::vector<std::byte>& d) {
  const char* p = reinterpret_cast<const char*>(d.data());
  return std::string(p, ::strnlen(p, d.size()));
}

// The client's side of the connection, as a coroutine: it reads as a
// blocking program would, and suspends (returns to its caller) at each
// co_await until the connect completes.
task connect_from_client(const averbs::cm::connector& conn, const averbs::qp& qp, averbs::cm::address to,
                         std::optional<std::string>& outcome) {
  try {
    const std::string hello = "hello from the client";
    const averbs::cm::connect_result r =
        co_await conn.async_connect(qp, to, bytes_of(hello), averbs::use_awaitable);
    outcome = "connected; the server said '" + text_of(r.private_data) + "'";
  } catch (const std::system_error& e) {
    outcome = std::string("connect failed: ") + e.what();
  }
}

// Waits on the context, running what completes (callbacks and coroutines
// included), until `done()`; false after 30 s.
bool wait_until(averbs::context& ctx, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    ctx.alertable_wait(10ms);
  }
  return true;
}

averbs::qp make_qp(const averbs::pd& pd, const averbs::cq& cq) {
  averbs::qp_init_attr ia;
  ia.send_cq = ia.recv_cq = cq;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  return pd.create_qp(ia);  // in RESET: accept and connect take it to RTS
}

int usage() {
  std::fprintf(stderr, "usage: async_tour [-p CM_PORT] SERVER_ADDR[:ROCE_PORT] CLIENT_ADDR[:ROCE_PORT]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint16_t cm_port = 7471;
  std::string server_text, client_text;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-p" && i + 1 < argc) {
      const long v = std::strtol(argv[++i], nullptr, 10);
      if (v < 1 || v > 65535) return usage();
      cm_port = static_cast<std::uint16_t>(v);
    } else if (server_text.empty()) {
      server_text = a;
    } else if (client_text.empty()) {
      client_text = a;
    } else {
      return usage();
    }
  }
  averbs::cm::address server_at, client_at;
  if (client_text.empty() || !averbs::cm::address::parse(server_text, server_at) ||
      !averbs::cm::address::parse(client_text, client_at))
    return usage();

  try {
    // Two soft RDMA devices in this process, as two hosts would each have one.
    auto options = [](const char* name, const averbs::cm::address& at) {
      averbs::soft_device_options o;
      o.name = name;
      o.address = at.ip.to_string();
      if (at.port != 0) o.port = at.port;
      return o;
    };
    averbs::soft_device server_here(options("tour_server", server_at));
    averbs::soft_device client_here(options("tour_client", client_at));
    averbs::context ctx;
    averbs::completion_port port(ctx);

    // 1. A waitable request: the call returns at once; get() waits for the
    //    result, driving the context meanwhile (ready() asks without waiting).
    auto opening = averbs::async_open_device(ctx, "tour_server", averbs::use_request);
    averbs::device sdev = opening.get();
    std::printf("1. use_request: opened %s\n", sdev.name().c_str());

    // 2. A completion port: the result is queued there with the key given,
    //    for whoever takes entries off the port (a loop serving many
    //    operations tells them apart by key).
    averbs::async_open_device(ctx, "tour_client", averbs::bind_port(port, 2));
    std::array<averbs::completion_entry, 1> entry;
    port.get(entry, averbs::infinite);
    if (entry[0].error()) throw std::system_error(entry[0].error(), "open tour_client");
    averbs::device cdev = std::move(*entry[0].result<averbs::device>());
    std::printf("2. bind_port: key %llu, opened %s\n", static_cast<unsigned long long>(entry[0].key()),
                cdev.name().c_str());

    // 3. A callback: it runs on this thread, in a wait that follows.
    std::optional<averbs::pd> spd;
    std::error_code failed;
    sdev.async_alloc_pd([&](std::error_code ec, averbs::pd p) {
      if (ec)
        failed = ec;
      else
        spd = std::move(p);
    });
    if (!wait_until(ctx, [&] { return spd.has_value() || failed; }))
      throw std::runtime_error("alloc_pd by callback did not complete in 30 s");
    if (failed) throw std::system_error(failed, "alloc_pd by callback");
    std::printf("3. callback: a protection domain on %s\n", sdev.name().c_str());

    // 4. A future: ready once a wait has delivered it.
    std::future<averbs::pd> pd_later = cdev.async_alloc_pd(averbs::use_future);
    if (!wait_until(ctx, [&] { return pd_later.wait_for(0s) == std::future_status::ready; }))
      throw std::runtime_error("alloc_pd by future did not complete in 30 s");
    averbs::pd cpd = pd_later.get();  // (throws what the operation failed with)
    std::printf("4. use_future: a protection domain on %s\n", cdev.name().c_str());

    // The rest synchronously: each of these also has its async_ form.
    averbs::cq scq = sdev.create_cq(8), ccq = cdev.create_cq(8);
    averbs::qp sqp = make_qp(*spd, scq), cqp = make_qp(cpd, ccq);

    // 5. The connection, with nothing blocking: the server takes the
    //    request and accepts it by callbacks, the client connects in a
    //    coroutine (use_awaitable), and one thread waits for both.
    averbs::cm::listener l = averbs::cm::listen(sdev, {server_at.ip, cm_port});
    std::optional<averbs::cm::connector> passive;  // keep it: dropping it disconnects
    std::optional<std::string> accepted, connected;
    const std::string reply = "welcome, from the server";
    l.async_get_request([&](std::error_code ec, averbs::cm::connection_request req) {
      if (ec) {
        accepted = "no request: " + ec.message();
        return;
      }
      passive = req.conn;
      const std::string said = text_of(req.private_data);
      passive->async_accept(sqp, bytes_of(reply), [&accepted, said](std::error_code ec2) {
        accepted = ec2 ? "accept failed: " + ec2.message() : "accepted; the client said '" + said + "'";
      });
    });
    averbs::cm::connector active(cdev);
    connect_from_client(active, cqp, {server_at.ip, cm_port}, connected);
    if (!wait_until(ctx, [&] { return accepted && connected; })) {
      // (Not by an exception: the suspended coroutine refers to
      // `connected`, which unwinding would destroy under it.)
      std::fprintf(stderr, "async_tour: the connection did not complete in 30 s\n");
      std::quick_exit(1);
    }
    std::printf("5. server, by callbacks: %s\n   client, in a coroutine: %s\n", accepted->c_str(),
                connected->c_str());
    if (!passive || sqp.query().state != averbs::qp_state::rts || cqp.query().state != averbs::qp_state::rts)
      throw std::runtime_error("the QPs are not both in RTS");

    // 6. A SEND over the connection: the CQs are polled, which drives the
    //    devices too.
    std::array<std::byte, 64> sbuf{}, cbuf{};
    averbs::mr smr = spd->reg_mr(sbuf.data(), sbuf.size(), averbs::access_local_write);
    averbs::mr cmr = cpd.reg_mr(cbuf.data(), cbuf.size(), averbs::access_local_write);
    const averbs::sge rs{reinterpret_cast<std::uintptr_t>(sbuf.data()),
                         static_cast<std::uint32_t>(sbuf.size()), smr.lkey()};
    averbs::recv_wr rw;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    if (auto ec = sqp.post_recv(rw)) throw std::system_error(ec, "post_recv");
    std::snprintf(reinterpret_cast<char*>(cbuf.data()), cbuf.size(), "a SEND from the client");
    const averbs::sge ss{reinterpret_cast<std::uintptr_t>(cbuf.data()),
                         static_cast<std::uint32_t>(cbuf.size()), cmr.lkey()};
    averbs::send_wr sw;
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.opcode = averbs::wr_opcode::send;
    sw.flags = averbs::send_signaled;
    if (auto ec = cqp.post_send(sw)) throw std::system_error(ec, "post_send");
    std::optional<averbs::work_completion> got, sent;
    if (!wait_until(ctx, [&] {
          std::array<averbs::work_completion, 1> wc;
          if (!got && scq.poll(wc) == 1) got = wc[0];
          if (!sent && ccq.poll(wc) == 1) sent = wc[0];
          return got && sent;
        }))
      throw std::runtime_error("the SEND did not complete in 30 s");
    if (got->status != averbs::wc_status::success || sent->status != averbs::wc_status::success)
      throw std::system_error(
          make_error_code(got->status != averbs::wc_status::success ? got->status : sent->status), "SEND");
    std::printf("6. the server received '%s'\n", reinterpret_cast<const char*>(sbuf.data()));

    // 7. Disconnect: the client's request and the server's notification,
    //    both in flight at once.
    std::optional<std::string> noticed;
    passive->async_notify_disconnect([&](std::error_code ec) {
      noticed = ec ? "notify failed: " + ec.message() : "the client disconnected";
    });
    auto leaving = active.async_disconnect(averbs::use_request);
    leaving.get();  // waits for the DREP; the server's callback runs in the same wait or the next
    if (!wait_until(ctx, [&] { return noticed.has_value(); }))
      throw std::runtime_error("the server was not told of the disconnect in 30 s");
    std::printf("7. client: disconnected (QP %s); server: %s (QP %s)\n",
                cqp.query().state == averbs::qp_state::err ? "in ERR" : "NOT in ERR", noticed->c_str(),
                sqp.query().state == averbs::qp_state::err ? "in ERR" : "NOT in ERR");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "async_tour: %s\n", e.what());
    return 1;
  }
  return 0;
}
