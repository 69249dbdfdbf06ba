// SPDX-License-Identifier: MIT
// Conformance: protection domains and address handles (rdma-core
// tests/test_pd.py, tests/test_addr.py; pd.hpp, ah.hpp), and the objects of
// a removed device.
#include "soft/engine.hpp"
#include "verbs_fixture.hpp"

#include <unistd.h>

#include <cstdlib>
#include <future>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;

ah_attr loopback_av() {
  ah_attr a;
  a.is_global = true;
  a.grh.dgid = gid::from_ipv4(0x7F000001);
  a.grh.sgid_index = 0;
  a.port_num = 1;
  return a;
}

class pd_test : public verbs_test {
 protected:
  qp_init_attr qp_attr_with(const cq& c) {
    qp_init_attr ia;
    ia.send_cq = c;
    ia.recv_cq = c;
    ia.cap = {4, 4, 1, 1, 0};
    ia.type = qp_type::rc;
    return ia;
  }
  static std::error_code dealloc(const pd& p) {
    std::error_code ec;
    p.dealloc(ec);
    return ec;
  }
  std::error_code create_ah(const ah_attr& a) {
    std::error_code ec;
    pd_.create_ah(a, ec);
    return ec;
  }
  std::vector<std::byte> mem = std::vector<std::byte>(4096);
};

// ===========================================================================
// Allocation and deallocation.

// In the engine a PD whose handle is gone lives on while a child needs it
// and is freed with its last one.  A QP (or SRQ) that was that child read
// the PD's slot number from the PD it had just freed (a use after free
// ASan reports; the slot freed was garbage).  The public handles keep
// their PD alive, so only an engine user (the CM, a daemon) meets this.
TEST_F(pd_test, an_engine_pd_released_before_its_qp_and_srq_goes_with_the_last) {
  soft::device& e = dev_holder->engine();
  soft::event_channel* ch = e.open_events();
  soft::pd_t* p = nullptr;
  soft::cq_t* c = nullptr;
  soft::srq_t* s = nullptr;
  soft::qp_t* q = nullptr;
  ASSERT_FALSE(e.alloc_pd(ch, p));
  ASSERT_FALSE(e.create_cq(16, ch, c));
  srq_attr sa;
  sa.max_wr = 4;
  sa.max_sge = 1;
  ASSERT_FALSE(e.create_srq(p, sa, s));
  soft::device::qp_init in;
  in.send_cq = in.recv_cq = c;
  in.srq = s;
  in.cap = {4, 0, 1, 0, 0};
  ASSERT_FALSE(e.create_qp(p, in, q));
  e.release_srq(s);  // the QP keeps the SRQ, and both the PD
  e.release_pd(p);
  ASSERT_FALSE(e.destroy_qp(q));  // frees the SRQ, then the PD
  // The slots are free and whole: new objects take them.
  for (int i = 0; i < 3; ++i) {
    soft::pd_t* again = nullptr;
    ASSERT_FALSE(e.alloc_pd(ch, again));
    ASSERT_FALSE(e.dealloc_pd(again));
  }
  ASSERT_FALSE(e.destroy_cq(c));
  e.close_events(ch);
}

TEST_F(pd_test, alloc_and_dealloc) {
  pd p = dev.alloc_pd();
  ASSERT_TRUE(p);
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, two_hundred_pds_are_allocated_and_deallocated) {
  // rdma-core test_pd.py test_multiple_pd_creation.
  std::vector<pd> v;
  for (int i = 0; i < 200; ++i) {
    std::error_code ec;
    v.push_back(dev.alloc_pd(ec));
    ASSERT_EQ(ec, std::error_code{}) << i;
  }
  for (const pd& p : v) EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dealloc_twice_bad_flow) {
  pd p = dev.alloc_pd();
  ASSERT_EQ(dealloc(p), std::error_code{});
  EXPECT_EQ(dealloc(p), errc::stale_handle);
}

TEST_F(pd_test, deallocated_pd_creates_nothing_bad_flow) {
  pd p = dev.alloc_pd();
  ASSERT_EQ(dealloc(p), std::error_code{});
  std::error_code ec;
  p.reg_mr(mem.data(), mem.size(), access_local_write, ec);
  EXPECT_EQ(ec, errc::stale_handle);
  p.create_ah(loopback_av(), ec);
  EXPECT_EQ(ec, errc::stale_handle);
  p.alloc_mw(mw_type::type1, ec);
  EXPECT_EQ(ec, errc::stale_handle);
  p.create_srq({16, 1, 0}, ec);
  EXPECT_EQ(ec, errc::stale_handle);
  cq c = dev.create_cq(16);
  p.create_qp(qp_attr_with(c), ec);
  EXPECT_EQ(ec, errc::stale_handle);
}

TEST_F(pd_test, dealloc_with_a_live_mr_bad_flow) {
  pd p = dev.alloc_pd();
  mr m = p.reg_mr(mem.data(), mem.size(), access_local_write);
  EXPECT_EQ(dealloc(p), errc::busy);
  m.dereg();
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dealloc_with_a_live_qp_bad_flow) {
  pd p = dev.alloc_pd();
  cq c = dev.create_cq(16);
  qp q = p.create_qp(qp_attr_with(c));
  EXPECT_EQ(dealloc(p), errc::busy);
  q.destroy();
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dealloc_with_a_live_ah_bad_flow) {
  pd p = dev.alloc_pd();
  ah a = p.create_ah(loopback_av());
  EXPECT_EQ(dealloc(p), errc::busy);
  a.destroy();
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dealloc_with_a_live_mw_bad_flow) {
  pd p = dev.alloc_pd();
  mw w = p.alloc_mw(mw_type::type2);
  EXPECT_EQ(dealloc(p), errc::busy);
  w.dealloc();
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dealloc_with_a_live_srq_bad_flow) {
  pd p = dev.alloc_pd();
  srq s = p.create_srq({16, 1, 0});
  EXPECT_EQ(dealloc(p), errc::busy);
  s.destroy();
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dealloc_after_the_last_child_handle_is_dropped) {
  pd p = dev.alloc_pd();
  {
    mr m = p.reg_mr(mem.data(), mem.size(), access_local_write);
    ah a = p.create_ah(loopback_av());
    EXPECT_EQ(dealloc(p), errc::busy);
  }
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dealloc_with_a_live_cq_succeeds) {
  // A CQ belongs to the device, not to a PD.
  pd p = dev.alloc_pd();
  cq c = dev.create_cq(16);
  EXPECT_EQ(dealloc(p), std::error_code{});
}

TEST_F(pd_test, dropping_the_pd_handle_keeps_its_children_usable) {
  mr m;
  {
    pd p = dev.alloc_pd();
    m = p.reg_mr(mem.data(), mem.size(), access_local_write | access_remote_read);
  }
  EXPECT_NE(m.lkey(), 0u);
  std::error_code ec;
  m.dereg(ec);
  EXPECT_EQ(ec, std::error_code{});
}

TEST_F(pd_test, throwing_dealloc_throws_the_code_of_the_ec_overload) {
  pd p = dev.alloc_pd();
  mr m = p.reg_mr(mem.data(), mem.size(), access_local_write);
  const std::error_code ec = dealloc(p);
  EXPECT_EQ(ec, errc::busy);
  try {
    p.dealloc();
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), ec);
  }
}

TEST_F(pd_test, async_dealloc_reports_busy_through_the_token) {
  pd p = dev.alloc_pd();
  ah a = p.create_ah(loopback_av());
  auto r = p.async_dealloc(use_request);
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, errc::busy);
  auto f = p.async_dealloc(use_future);
  for (int i = 0; i < 10000 && f.wait_for(0s) != std::future_status::ready; ++i) ctx->poll();
  try {
    f.get();
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::busy);
  }
}

TEST_F(pd_test, create_qp_with_a_cq_of_another_device_bad_flow) {
  soft_device other_dev(soft_device_options{dev.name() + ".other", &clock, {gid::from_ipv4(0x7F000001)}});
  device other = open_device(*ctx, other_dev.name());
  cq foreign = other.create_cq(16);
  std::error_code ec;
  pd_.create_qp(qp_attr_with(foreign), ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(pd_test, empty_pd_handle_throws_invalid_argument_bad_flow) {
  // Empty handles report invalid_argument (detail.hpp context_of, device.hpp).
  // Run in a child process so that a terminate does not take the other
  // tests with it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const pd empty;
        try {
          empty.dealloc();
          std::_Exit(2);
        } catch (const std::system_error& e) {
          std::_Exit(e.code() == errc::invalid_argument ? 0 : 1);
        }
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(pd_test, empty_pd_handle_reports_invalid_argument_through_ec_bad_flow) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::error_code ec;
        const pd empty;
        empty.dealloc(ec);
        std::_Exit(ec == errc::invalid_argument ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// ===========================================================================
// Address handles (rdma-core tests/test_addr.py).

TEST_F(pd_test, create_ah_with_grh_succeeds_and_keeps_its_attributes) {
  ah_attr want = loopback_av();
  want.grh.hop_limit = 7;
  want.grh.traffic_class = 4;
  want.sl = 2;
  ah a = pd_.create_ah(want);
  ASSERT_TRUE(a);
  EXPECT_EQ(a.attr().grh.dgid, want.grh.dgid);
  EXPECT_EQ(a.attr().grh.hop_limit, route_hop_limit()) << "the route's replaces the AV's 7, as the kernel's";
  EXPECT_EQ(a.attr().grh.traffic_class, 4);
  EXPECT_EQ(a.attr().sl, 2);
  EXPECT_EQ(a.attr().port_num, 1);
  EXPECT_TRUE(a.attr().is_global);
}

TEST_F(pd_test, create_ah_without_grh_bad_flow) {
  // RoCE needs a GRH (rdma_check_ah_attr; test_addr.py test_create_ah_roce).
  ah_attr a = loopback_av();
  a.is_global = false;
  EXPECT_EQ(create_ah(a), errc::invalid_argument);
}

TEST_F(pd_test, create_ah_on_port_0_bad_flow) {
  ah_attr a = loopback_av();
  a.port_num = 0;
  EXPECT_EQ(create_ah(a), errc::invalid_argument);
}

TEST_F(pd_test, create_ah_on_port_2_bad_flow) {
  ah_attr a = loopback_av();
  a.port_num = 2;
  EXPECT_EQ(create_ah(a), errc::invalid_argument);
}

TEST_F(pd_test, create_ah_with_sgid_index_beyond_the_table_bad_flow) {
  ah_attr a = loopback_av();
  a.grh.sgid_index = 1;  // the test device has one GID
  EXPECT_EQ(create_ah(a), errc::invalid_argument);
  a.grh.sgid_index = 255;
  EXPECT_EQ(create_ah(a), errc::invalid_argument);
}

TEST_F(pd_test, create_ah_with_zero_dgid_bad_flow) {
  ah_attr a = loopback_av();
  a.grh.dgid = gid{};
  EXPECT_EQ(create_ah(a), errc::invalid_argument);
}

// The device has no multicast (max_mcast_grp 0): an AH to a group address
// is not_supported, where it was taken and its sends left as IP multicast
// datagrams by whatever route the host had (helper-116 #3).  Limited
// broadcast is a group too.
TEST_F(pd_test, create_ah_to_a_group_address_is_not_supported) {
  ah_attr a = loopback_av();
  for (const char* g : {"239.1.2.3", "224.0.0.1", "255.255.255.255"}) {
    ASSERT_TRUE(gid::parse(g, a.grh.dgid)) << g;
    EXPECT_EQ(create_ah(a), errc::not_supported) << g;
  }
  EXPECT_EQ(dev.query().max_mcast_grp, 0u);
}

// IPv4 to IPv4 and IPv6 to IPv6 only (the kernel's route resolution
// refuses a mixed pair; no datagram could carry one): an AH or a QP's path
// whose source GID and destination differ in family is refused, where it
// was taken and every packet then dropped.
TEST_F(pd_test, an_address_vector_mixing_ipv4_and_ipv6_bad_flow) {
  gid v6;
  ASSERT_TRUE(gid::parse("::1", v6));
  soft_device mixed({"mixed_" + std::to_string(::getpid()), &clock, {gid::from_ipv4(0x7F000001), v6}});
  device d = open_device(*ctx, mixed.name());
  pd p = d.alloc_pd();
  ah_attr a;
  a.is_global = true;
  a.port_num = 1;
  a.grh.sgid_index = 1;  // ::1
  a.grh.dgid = gid::from_ipv4(0x7F000001);
  std::error_code ec;
  p.create_ah(a, ec);
  EXPECT_EQ(ec, errc::invalid_argument) << "IPv6 source, IPv4 destination";
  a.grh.sgid_index = 0;  // 127.0.0.1
  a.grh.dgid = v6;
  p.create_ah(a, ec);
  EXPECT_EQ(ec, errc::invalid_argument) << "IPv4 source, IPv6 destination";
  a.grh.sgid_index = 1;
  ah ok = p.create_ah(a, ec);
  EXPECT_FALSE(ec) << ec.message();

  cq c = d.create_cq(4);
  qp_init_attr ia;
  ia.send_cq = ia.recv_cq = c;
  ia.cap = {4, 4, 1, 1, 0};
  qp q = p.create_qp(ia);
  qp_attr at;
  at.state = qp_state::init;
  at.port_num = 1;
  q.modify(at, qp_attr_state | qp_attr_pkey_index | qp_attr_port | qp_attr_access_flags);
  at = {};
  at.state = qp_state::rtr;
  at.ah = a;
  at.ah.grh.dgid = gid::from_ipv4(0x7F000001);  // from ::1
  at.path_mtu = mtu::mtu_1024;
  at.dest_qp_num = 1234;
  at.max_dest_rd_atomic = 1;
  at.min_rnr_timer = 1;
  q.modify(at,
           qp_attr_state | qp_attr_av | qp_attr_path_mtu | qp_attr_dest_qpn | qp_attr_rq_psn |
               qp_attr_max_dest_rd_atomic | qp_attr_min_rnr_timer,
           ec);
  EXPECT_EQ(ec, errc::invalid_argument) << "a QP path from ::1 to 127.0.0.1";
  EXPECT_EQ(q.query().state, qp_state::init);
}

TEST_F(pd_test, destroy_ah) {
  ah a = pd_.create_ah(loopback_av());
  std::error_code ec;
  a.destroy(ec);
  EXPECT_EQ(ec, std::error_code{});
}

TEST_F(pd_test, destroy_ah_twice_bad_flow) {
  ah a = pd_.create_ah(loopback_av());
  a.destroy();
  std::error_code ec;
  a.destroy(ec);
  EXPECT_EQ(ec, errc::stale_handle);
}

TEST_F(pd_test, many_ahs_are_created_and_destroyed) {
  std::vector<ah> v;
  for (int i = 0; i < 100; ++i) {
    std::error_code ec;
    v.push_back(pd_.create_ah(loopback_av(), ec));
    ASSERT_EQ(ec, std::error_code{}) << i;
  }
  for (const ah& a : v) a.destroy();
}

TEST_F(pd_test, ud_send_with_a_destroyed_ah_bad_flow) {
  qp_options o;
  o.type = qp_type::ud;
  cq c = dev.create_cq(16);
  qp q = make_qp(o, c, c);
  bring_up(q, o, 0);
  ah a = pd_.create_ah(loopback_av());
  a.destroy();
  auto buf = make_buffer(64);
  const sge g = buf.whole();
  send_wr w;
  w.sg_list = &g;
  w.num_sge = 1;
  w.ah = &a;
  w.remote_qpn = q.num();
  w.remote_qkey = ud_qkey;
  EXPECT_EQ(q.post_send(w), errc::invalid_argument);
}

// ===========================================================================
// Objects of a removed device.

TEST_F(pd_test, removed_device_pd_calls_fail_with_device_removed) {
  pd p = dev.alloc_pd();
  dev_holder.reset();
  std::error_code ec;
  p.dealloc(ec);
  EXPECT_EQ(ec, errc::device_removed);
  p.reg_mr(mem.data(), mem.size(), access_local_write, ec);
  EXPECT_EQ(ec, errc::device_removed);
  p.create_ah(loopback_av(), ec);
  EXPECT_EQ(ec, errc::device_removed);
  p.alloc_mw(mw_type::type1, ec);
  EXPECT_EQ(ec, errc::device_removed);
  p.create_srq({16, 1, 0}, ec);
  EXPECT_EQ(ec, errc::device_removed);
}

TEST_F(pd_test, removed_device_create_qp_fails_with_device_removed) {
  cq c = dev.create_cq(16);
  dev_holder.reset();
  std::error_code ec;
  pd_.create_qp(qp_attr_with(c), ec);
  EXPECT_EQ(ec, errc::device_removed);
}

TEST_F(pd_test, removed_device_children_fail_with_device_removed) {
  mr m = pd_.reg_mr(mem.data(), mem.size(), access_local_write);
  ah a = pd_.create_ah(loopback_av());
  mw w = pd_.alloc_mw(mw_type::type1);
  srq s = pd_.create_srq({16, 1, 0});
  cq c = dev.create_cq(16);
  dev_holder.reset();
  std::error_code ec;
  m.dereg(ec);
  EXPECT_EQ(ec, errc::device_removed);
  a.destroy(ec);
  EXPECT_EQ(ec, errc::device_removed);
  w.dealloc(ec);
  EXPECT_EQ(ec, errc::device_removed);
  s.query(ec);
  EXPECT_EQ(ec, errc::device_removed);
  s.destroy(ec);
  EXPECT_EQ(ec, errc::device_removed);
  c.resize(32, ec);
  EXPECT_EQ(ec, errc::device_removed);
  c.destroy(ec);
  EXPECT_EQ(ec, errc::device_removed);
  const sge g{reinterpret_cast<std::uintptr_t>(mem.data()), 16, m.lkey()};
  const recv_wr r{1, &g, 1};
  EXPECT_EQ(s.post_recv(r), errc::device_removed);
}

TEST_F(pd_test, removed_device_qp_calls_fail_with_device_removed) {
  auto p = connected_pair();
  auto buf = make_buffer(64);
  dev_holder.reset();
  std::error_code ec;
  p.a.query(ec);
  EXPECT_EQ(ec, errc::device_removed);
  p.a.modify(init_attr({}), qp_attr_state, ec);
  EXPECT_EQ(ec, errc::device_removed);
  EXPECT_EQ(post_send(p.a, wr_opcode::send, {buf.whole()}), errc::device_removed);
  EXPECT_EQ(post_recv(p.b, {buf.whole()}), errc::device_removed);
  p.a.destroy(ec);
  EXPECT_EQ(ec, errc::device_removed);
  try {
    p.b.query();
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::device_removed);
  }
}

}  // namespace
}  // namespace averbs::test
