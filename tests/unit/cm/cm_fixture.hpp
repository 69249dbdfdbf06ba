// SPDX-License-Identifier: MIT
// Fixture for the connection-manager tests: a private in-process soft
// device with a manual clock, so the CM's retransmission, MRA and timewait
// timers fire exactly when a test advances time.  Both ends of each
// connection live on this device (it owns the addresses 10.99.0.1 and
// fd99::1; its loopback link delivers to itself), so every MAD the CM sends
// crosses the same code a remote peer's would.
#pragma once

#include <averbs/cm.hpp>
#include <averbs/verbs.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace averbs::test {

inline std::vector<std::byte> bytes(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}
inline std::string text(const std::vector<std::byte>& v, std::size_t n) {
  return std::string(reinterpret_cast<const char*>(v.data()), std::min(n, v.size()));
}

class cm_test : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    name_ = std::string("cm_") + info->test_suite_name() + "." + info->name();
    gid::parse("10.99.0.1", ip4);
    gid::parse("fd99::1", ip6);
    sdev = std::make_unique<soft_device>(soft_device_options{name_, &clock, {ip4, ip6}});
    context_options o;
    o.clock = &clock;
    ctx = std::make_unique<context>(o);
    dev = open_device(*ctx, name_);
    pd_ = dev.alloc_pd();
    cq_ = dev.create_cq(1024);
  }
  void TearDown() override {
    qps.clear();
    cq_ = {};
    pd_ = {};
    dev = {};
    ctx.reset();
    sdev.reset();
  }

  qp make_qp(qp_type t = qp_type::rc) {
    qp_init_attr ia;
    ia.send_cq = cq_;
    ia.recv_cq = cq_;
    ia.cap = {16, 16, 1, 1, 64};
    ia.type = t;
    qp q = pd_.create_qp(ia);
    qps.push_back(q);
    return q;
  }

  cm::address at(std::uint16_t port, bool v6 = false) const { return {v6 ? ip6 : ip4, port}; }

  /// Moves the clock and lets the device run its timers.
  void advance(std::chrono::nanoseconds d) {
    clock.advance(d);
    ctx->poll();
  }

  /// Starts accepting `req` on `q` with every packet dropped (its REP is
  /// lost; the faults stay set) and lets the device run once.
  averbs::request<void> accept_losing_the_rep(const cm::connector& req, const qp& q,
                                              const cm::conn_params& p) {
    sdev->set_faults("drop=1");
    auto accepted = req.async_accept(q, {}, p, use_request);
    ctx->poll();
    return accepted;
  }

  /// A connected pair: `a` connected to `b` through a listener at `port`.
  struct pair {
    cm::connector active, passive;
    qp a, b;
    cm::connect_result result;
  };
  pair connect_pair(std::uint16_t port, cm::listener& l) {
    pair p;
    p.a = make_qp();
    p.b = make_qp();
    p.active = cm::connector(dev);
    auto got = l.async_get_request(use_request);
    auto conn = p.active.async_connect(p.a, at(port), bytes("hello"), use_request);
    cm::connection_request req = got.get();
    p.passive = req.conn;
    p.passive.accept(p.b, bytes("welcome"));
    p.result = conn.get();
    return p;
  }

  /// 64 bytes to send (filled with `fill`) and 64 to receive into,
  /// registered, with their SGEs.
  struct send_buffers {
    std::vector<std::byte> src, dst;
    mr ms, md;
    sge ss, rs;
  };
  std::unique_ptr<send_buffers> make_send_buffers(std::byte fill) {
    auto b = std::make_unique<send_buffers>();
    b->src.assign(64, fill);
    b->dst.assign(64, std::byte{0});
    b->ms = pd_.reg_mr(b->src.data(), b->src.size(), access_local_write);
    b->md = pd_.reg_mr(b->dst.data(), b->dst.size(), access_local_write);
    b->ss = {reinterpret_cast<std::uintptr_t>(b->src.data()), 64, b->ms.lkey()};
    b->rs = {reinterpret_cast<std::uintptr_t>(b->dst.data()), 64, b->md.lkey()};
    return b;
  }

  /// Posts `b`'s receive (wr_id 7) on `to`, then its SEND (wr_id 8, with
  /// `flags`) on `from`.
  static void post_send_of(const send_buffers& b, const qp& from, const qp& to, std::uint32_t flags) {
    recv_wr r;
    r.wr_id = 7;
    r.sg_list = &b.rs;
    r.num_sge = 1;
    ASSERT_FALSE(to.post_recv(r));
    send_wr s;
    s.wr_id = 8;
    s.opcode = wr_opcode::send;
    s.flags = flags;
    s.sg_list = &b.ss;
    s.num_sge = 1;
    ASSERT_FALSE(from.post_send(s));
  }

  /// Runs one SEND from `from` to `to` and checks it arrives.
  void check_send(const qp& from, const qp& to) {
    const auto bufs = make_send_buffers(std::byte{0x5A});
    ASSERT_NO_FATAL_FAILURE(post_send_of(*bufs, from, to, send_signaled));
    const std::vector<std::byte>& src = bufs->src;
    const std::vector<std::byte>& dst = bufs->dst;
    int got = 0;
    for (int i = 0; i < 1000 && got < 2; ++i) {
      work_completion wc[4];
      const std::size_t n = cq_.poll(wc);
      for (std::size_t k = 0; k < n; ++k) {
        EXPECT_EQ(wc[k].status, wc_status::success) << to_string(wc[k].status);
        ++got;
      }
    }
    EXPECT_EQ(got, 2);
    EXPECT_EQ(dst, src);
  }

  std::string other_name() const { return name_ + ".other"; }

  manual_clock clock;
  std::unique_ptr<soft_device> sdev;
  std::unique_ptr<context> ctx;
  device dev;
  pd pd_;
  cq cq_;
  std::vector<qp> qps;
  gid ip4, ip6;

 private:
  std::string name_;
};

}  // namespace averbs::test
