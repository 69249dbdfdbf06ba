// SPDX-License-Identifier: MIT
// Conformance: devices and ports (rdma-core tests/test_device.py;
// docs/verbs.md "Limits"), every completion token on a device query
// (docs/async.md), and what removing a device does (soft_device.hpp).
#include "soft/engine.hpp"
#include "verbs_fixture.hpp"

#include <algorithm>
#include <array>
#include <coroutine>
#include <cstdlib>
#include <exception>
#include <future>
#include <type_traits>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;

const gid test_gid = gid::from_ipv4(0x7F000001);

struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

task query_port_in_coroutine(const device* d, std::uint8_t port, port_attr* out, std::error_code* ec, int* done) {
  try {
    *out = co_await d->async_query_port(port, use_awaitable);
  } catch (const std::system_error& e) {
    *ec = e.code();
  }
  *done = 1;
}

class device_test : public verbs_test {
 protected:
  void expect_removal_fails_a_notify_of(const cq& c);
  /// Drives progress and runs this thread's handlers with zero-timeout waits
  /// (the test's clock is manual) until `done()` or the patience runs out.
  template <class Done>
  void run_handlers_until(Done done) {
    for (int i = 0; i < 10000 && !done(); ++i) {
      ctx->poll();
      ctx->alertable_wait(0ns);
    }
  }
  std::size_t get_entry(completion_port& port, std::span<completion_entry> e) {
    for (int i = 0; i < 10000; ++i) {
      ctx->poll();
      if (const std::size_t n = port.get(e, 0ns)) return n;
    }
    return 0;
  }
  template <class T>
  void wait_ready(std::future<T>& f) {
    for (int i = 0; i < 10000 && f.wait_for(0s) != std::future_status::ready; ++i) ctx->poll();
  }
  /// Removes the test's device, as unplugging it would.
  void remove_device() { dev_holder.reset(); }
};

// ===========================================================================
// Listing and opening.

TEST_F(device_test, list_devices_contains_embedded_and_the_test_device) {
  const std::vector<std::string> names = list_devices();
  EXPECT_NE(std::find(names.begin(), names.end(), "embedded"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), dev_holder->name()), names.end());
}

TEST_F(device_test, opened_device_has_the_registered_name) {
  EXPECT_EQ(dev.name(), dev_holder->name());
  EXPECT_EQ(&dev.get_context(), ctx.get());
}

TEST_F(device_test, open_unknown_device_bad_flow) {
  std::error_code ec;
  device d = open_device(*ctx, "no-such-device", ec);
  EXPECT_EQ(ec, errc::not_found);
  EXPECT_FALSE(d);
}

TEST_F(device_test, open_empty_name_opens_the_embedded_device) {
  device d = open_device(*ctx, "");
  ASSERT_TRUE(d);
  EXPECT_EQ(d.name(), "embedded");
  EXPECT_EQ(d.query_port(1).state, port_state::active);
}

TEST_F(device_test, registering_a_name_twice_bad_flow) {
  try {
    soft_device again(soft_device_options{dev_holder->name(), &clock, {test_gid}});
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::already_exists);
  }
}

TEST_F(device_test, two_opens_share_the_device) {
  device d2 = open_device(*ctx, dev.name());
  pd p = d2.alloc_pd();
  EXPECT_EQ(d2.query().node_guid, dev.query().node_guid);
}

// ===========================================================================
// query_device (docs/verbs.md "Limits").

TEST_F(device_test, query_device_reports_non_zero_guids) {
  const device_attr a = dev.query();
  EXPECT_NE(a.node_guid, 0u);
  EXPECT_NE(a.sys_image_guid, 0u);
}

// A datagram that came to GID entry 300 cannot be answered by an AV, whose
// source GID index has 8 bits: refused, not answered from entry 44.
TEST_F(device_test, init_ah_from_wc_refuses_a_gid_entry_an_av_cannot_name) {
  soft_device_options o{dev_holder->name() + ".many", &clock, {}};
  for (std::uint32_t i = 0; i < 301; ++i)
    o.gids.push_back(gid::from_ipv4(0x0A000000u + 1 + i));  // 10.0.0.1 ...
  soft_device many(o);
  device d = open_device(*ctx, many.name());
  work_completion wc;
  wc.wc_flags = wc_grh;
  std::array<std::byte, 40> area{};
  area[20] = std::byte{0x45};  // IPv4, as a UD receive finds it in bytes 20..39
  const std::array<std::uint8_t, 4> from{10, 9, 9, 9};
  for (std::size_t i = 0; i < 4; ++i) area[32 + i] = std::byte{from[i]};
  auto to = [&](std::uint32_t entry) {
    const std::uint32_t ip = 0x0A000000u + 1 + entry;
    for (std::size_t i = 0; i < 4; ++i) area[36 + i] = static_cast<std::byte>(ip >> (24 - 8 * i));
  };
  std::error_code ec;
  to(255);
  EXPECT_EQ(d.init_ah_from_wc(1, wc, area, ec).grh.sgid_index, 255);
  EXPECT_FALSE(ec) << ec.message();
  to(300);
  d.init_ah_from_wc(1, wc, area, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, node_guids_of_two_devices_differ) {
  soft_device other(soft_device_options{dev_holder->name() + ".other", &clock, {test_gid}});
  device d2 = open_device(*ctx, other.name());
  EXPECT_NE(d2.query().node_guid, dev.query().node_guid);
}

TEST_F(device_test, query_device_reports_the_rxe_vendor_id) {
  EXPECT_EQ(dev.query().vendor_id, 0xFFFFFFu);
}

TEST_F(device_test, query_device_reports_queue_pair_limits) {
  const device_attr a = dev.query();
  EXPECT_EQ(a.max_qp, 1048560u);
  EXPECT_EQ(a.max_qp_wr, 1048576u);
  EXPECT_EQ(a.max_sge, 32u);
  EXPECT_EQ(a.max_sge_rd, 32u);
  EXPECT_EQ(a.max_inline_data, 512u);
}

TEST_F(device_test, query_device_reports_completion_queue_limits) {
  const device_attr a = dev.query();
  EXPECT_EQ(a.max_cq, 1048576u);
  EXPECT_EQ(a.max_cqe, 32767u);
}

TEST_F(device_test, query_device_reports_memory_and_protection_limits) {
  const device_attr a = dev.query();
  EXPECT_EQ(a.max_mr, 524287u);
  EXPECT_EQ(a.max_mw, 524287u);
  EXPECT_EQ(a.max_pd, 1048576u);
  EXPECT_EQ(a.max_ah, 32767u);
  EXPECT_GT(a.max_mr_size, 0u);
}

TEST_F(device_test, query_device_reports_shared_receive_queue_limits) {
  const device_attr a = dev.query();
  EXPECT_EQ(a.max_srq, 917503u);
  EXPECT_EQ(a.max_srq_wr, 1048576u);
  EXPECT_EQ(a.max_srq_sge, 27u);
}

TEST_F(device_test, query_device_reports_rdma_read_and_atomic_limits) {
  const device_attr a = dev.query();
  EXPECT_EQ(a.max_qp_rd_atom, 128u);
  EXPECT_EQ(a.max_qp_init_rd_atom, 128u);
  EXPECT_EQ(a.max_res_rd_atom, 258048u);
  EXPECT_EQ(a.atomic_cap, 1u);  // IBV_ATOMIC_HCA
}

TEST_F(device_test, query_device_reports_capability_flags_and_one_port) {
  const device_attr a = dev.query();
  EXPECT_EQ(a.device_cap_flags, 0x01223c66u);  // rxe's without AUTO_PATH_MIG
  EXPECT_EQ(a.phys_port_cnt, 1);
  EXPECT_EQ(a.max_pkeys, 1);
}

// ===========================================================================
// Ports, GIDs and P_Keys.

TEST_F(device_test, query_port_1_reports_an_active_ethernet_port) {
  const port_attr a = dev.query_port(1);
  EXPECT_EQ(a.state, port_state::active);
  EXPECT_EQ(a.max_mtu, mtu::mtu_4096);
  EXPECT_EQ(a.active_mtu, mtu::mtu_4096);
  EXPECT_EQ(a.link_layer, link_layer::ethernet);
  EXPECT_EQ(a.gid_tbl_len, 1024u);
  EXPECT_EQ(a.pkey_tbl_len, 1);
  EXPECT_GT(a.max_msg_sz, 0x1000u);  // rdma-core test_query_port
  EXPECT_EQ(a.max_msg_sz, 0x80000000u);  // docs/verbs.md: 2 GiB
}

TEST_F(device_test, query_port_0_bad_flow) {
  std::error_code ec;
  dev.query_port(0, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, query_port_2_bad_flow) {
  std::error_code ec;
  dev.query_port(2, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, query_gid_0_is_the_device_gid) {
  EXPECT_EQ(dev.query_gid(1, 0), test_gid);
  const std::vector<gid> used = dev.gids();
  ASSERT_EQ(used.size(), 1u);
  EXPECT_EQ(used[0], test_gid);
}

TEST_F(device_test, query_gid_beyond_the_used_entries_is_zero) {
  EXPECT_TRUE(dev.query_gid(1, 1).is_zero());
  EXPECT_TRUE(dev.query_gid(1, 1023).is_zero());
}

TEST_F(device_test, query_gid_1024_bad_flow) {
  std::error_code ec;
  dev.query_gid(1, 1024, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, query_gid_on_port_2_bad_flow) {
  std::error_code ec;
  dev.query_gid(2, 0, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, query_pkey_0_is_the_default_pkey) {
  EXPECT_EQ(dev.query_pkey(1, 0), 0xFFFF);
}

TEST_F(device_test, query_pkey_1_bad_flow) {
  std::error_code ec;
  dev.query_pkey(1, 1, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, query_pkey_on_port_2_bad_flow) {
  std::error_code ec;
  dev.query_pkey(2, 0, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, port_state_change_is_reported_by_query_port_and_an_event) {
  dev_holder->set_port_state(port_state::down);
  EXPECT_EQ(dev.query_port(1).state, port_state::down);
  async_event ev = dev.get_event();
  EXPECT_EQ(ev.type, event_type::port_err);
  EXPECT_EQ(ev.element, 1u);
  dev_holder->set_port_state(port_state::active);
  EXPECT_EQ(dev.query_port(1).state, port_state::active);
  ev = dev.get_event();
  EXPECT_EQ(ev.type, event_type::port_active);
  EXPECT_EQ(ev.element, 1u);
}

// ===========================================================================
// Every token on query_port (docs/async.md), success and error.

TEST_F(device_test, query_port_with_use_request) {
  auto r = dev.async_query_port(1, use_request);
  static_assert(std::is_same_v<decltype(r), request<port_attr>>);
  std::error_code ec = make_error_code(errc::timed_out);
  const port_attr a = r.get(ec);
  EXPECT_EQ(ec, std::error_code{});
  EXPECT_EQ(a.state, port_state::active);
  EXPECT_EQ(a.gid_tbl_len, 1024u);
}

TEST_F(device_test, query_port_with_use_request_bad_flow) {
  auto r = dev.async_query_port(2, use_request);
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, query_port_with_bind_port) {
  completion_port port(*ctx);
  auto s = dev.async_query_port(1, bind_port(port, 0x5150));
  static_assert(std::is_same_v<decltype(s), port_submission<port_attr>>);
  std::array<completion_entry, 1> e;
  ASSERT_EQ(get_entry(port, e), 1u);
  EXPECT_EQ(e[0].key(), 0x5150u);
  EXPECT_EQ(e[0].error(), std::error_code{});
  const port_attr* a = e[0].result<port_attr>();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->state, port_state::active);
}

// Destroying a port destroys the results nobody took.  One may hold the
// last reference to a device handle whose teardown cancels an event request
// bound to the same port: that completion must find the port closed, not
// its lock held by the same thread (a self-deadlock before).
TEST_F(device_test, destroying_a_port_whose_results_close_a_device_with_a_request_on_it) {
  {
    completion_port port(*ctx);
    {
      device other = open_device(*ctx, dev.name());
      other.async_get_event(bind_port(port, 1));  // parked in the engine
      other.async_alloc_pd(bind_port(port, 2));   // a PD handle waits in the port, holding `other`
    }
    ctx->poll();
  }  // ~completion_port: the PD goes, then the device handle, which cancels the event request
  EXPECT_TRUE(dev.query_port(1).state == port_state::active) << "the device still works";
}

TEST_F(device_test, query_port_with_bind_port_bad_flow) {
  completion_port port(*ctx);
  dev.async_query_port(0, bind_port(port, 9));
  std::array<completion_entry, 1> e;
  ASSERT_EQ(get_entry(port, e), 1u);
  EXPECT_EQ(e[0].key(), 9u);
  EXPECT_EQ(e[0].error(), errc::invalid_argument);
}

TEST_F(device_test, query_port_with_callback_runs_in_an_alertable_wait) {
  int calls = 0;
  std::error_code seen = make_error_code(errc::timed_out);
  port_attr got;
  static_assert(std::is_void_v<decltype(dev.async_query_port(1, [](std::error_code, port_attr) {}))>);
  dev.async_query_port(1, [&](std::error_code ec, port_attr a) {
    ++calls;
    seen = ec;
    got = a;
  });
  EXPECT_EQ(calls, 0) << "the handler ran inside the initiating call";
  ctx->poll();
  EXPECT_EQ(calls, 0) << "the handler ran outside an alertable wait";
  run_handlers_until([&] { return calls != 0; });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, std::error_code{});
  EXPECT_EQ(got.active_mtu, mtu::mtu_4096);
}

TEST_F(device_test, query_port_with_callback_bad_flow) {
  int calls = 0;
  std::error_code seen;
  dev.async_query_port(2, [&](std::error_code ec, port_attr) {
    ++calls;
    seen = ec;
  });
  run_handlers_until([&] { return calls != 0; });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, errc::invalid_argument);
}

TEST_F(device_test, query_port_with_use_future) {
  auto f = dev.async_query_port(1, use_future);
  static_assert(std::is_same_v<decltype(f), std::future<port_attr>>);
  wait_ready(f);
  EXPECT_EQ(f.get().link_layer, link_layer::ethernet);
}

TEST_F(device_test, query_port_with_use_future_bad_flow) {
  auto f = dev.async_query_port(2, use_future);
  wait_ready(f);
  try {
    f.get();
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
}

TEST_F(device_test, query_port_with_use_awaitable) {
  port_attr got;
  std::error_code ec;
  int done = 0;
  query_port_in_coroutine(&dev, 1, &got, &ec, &done);
  run_handlers_until([&] { return done != 0; });
  EXPECT_EQ(done, 1);
  EXPECT_EQ(ec, std::error_code{});
  EXPECT_EQ(got.state, port_state::active);
}

TEST_F(device_test, query_port_with_use_awaitable_bad_flow) {
  port_attr got;
  std::error_code ec;
  int done = 0;
  query_port_in_coroutine(&dev, 2, &got, &ec, &done);
  run_handlers_until([&] { return done != 0; });
  EXPECT_EQ(done, 1);
  EXPECT_EQ(ec, errc::invalid_argument);
}

TEST_F(device_test, throwing_overloads_throw_the_code_of_the_ec_overloads) {
  std::error_code ec;
  dev.query_port(2, ec);
  try {
    dev.query_port(2);
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), ec);
  }
  dev.query_gid(1, 1024, ec);
  try {
    dev.query_gid(1, 1024);
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), ec);
  }
  open_device(*ctx, "no-such-device", ec);
  EXPECT_EQ(ec, errc::not_found);
  try {
    open_device(*ctx, "no-such-device");
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), ec);
  }
}

TEST_F(device_test, empty_device_handle_throws_invalid_argument_bad_flow) {
  // device.hpp: "errc::invalid_argument for an empty handle (the operation
  // could not start)".  Run in a child process so that a terminate does
  // not take the other tests with it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const device empty;
        try {
          empty.query_port(1);
          std::_Exit(2);
        } catch (const std::system_error& e) {
          std::_Exit(e.code() == errc::invalid_argument ? 0 : 1);
        }
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(device_test, empty_device_handle_reports_invalid_argument_through_ec_bad_flow) {
  // device.hpp: "errc::invalid_argument for an empty handle".  Run in a
  // child process: a noexcept overload that throws terminates.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::error_code ec;
        const device empty;
        empty.query_port(1, ec);
        std::_Exit(ec == errc::invalid_argument ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// ===========================================================================
// Events: cancel and close.

TEST_F(device_test, cancel_events_completes_parked_get_event_with_operation_aborted) {
  auto r = dev.async_get_event(use_request);
  ctx->poll();
  EXPECT_FALSE(r.ready());
  EXPECT_EQ(dev.cancel_events(), 1u);
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
}

TEST_F(device_test, closing_the_device_completes_parked_get_event_with_operation_aborted) {
  device d2 = open_device(*ctx, dev.name());
  auto r = d2.async_get_event(use_request);
  d2 = device{};
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, errc::operation_aborted);
}

// ===========================================================================
// Device removal (soft_device.hpp: parked requests complete with
// device_removed, QPs go to error, later calls fail with device_removed).

TEST_F(device_test, removed_device_fails_later_device_calls_with_device_removed) {
  remove_device();
  std::error_code ec;
  dev.query(ec);
  EXPECT_EQ(ec, errc::device_removed);
  dev.query_port(1, ec);
  EXPECT_EQ(ec, errc::device_removed);
  dev.query_gid(1, 0, ec);
  EXPECT_EQ(ec, errc::device_removed);
  dev.query_pkey(1, 0, ec);
  EXPECT_EQ(ec, errc::device_removed);
  dev.alloc_pd(ec);
  EXPECT_EQ(ec, errc::device_removed);
  dev.create_cq(16, ec);
  EXPECT_EQ(ec, errc::device_removed);
  // The removal itself is still reported once (rdma-core hands out
  // IBV_EVENT_DEVICE_FATAL after removal), then nothing more.
  const async_event ev = dev.get_event(ec);
  EXPECT_FALSE(ec);
  EXPECT_EQ(ev.type, event_type::device_fatal);
  dev.get_event(ec);
  EXPECT_EQ(ec, errc::device_removed);
}

TEST_F(device_test, removed_device_throws_device_removed) {
  remove_device();
  try {
    dev.query();
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::device_removed);
  }
}

TEST_F(device_test, removed_device_is_no_longer_listed_or_openable) {
  const std::string name = dev.name();
  remove_device();
  const std::vector<std::string> names = list_devices();
  EXPECT_EQ(std::find(names.begin(), names.end(), name), names.end());
  std::error_code ec;
  open_device(*ctx, name, ec);
  EXPECT_EQ(ec, errc::not_found);
}

// An open that passed the registry's removal check as the device was being
// removed (unregister_device() marks the entry, then makes the engine
// fatal): here the engine goes fatal first, as in that window.  The open
// fails device_removed, as ibv_open_device on a removed device does; it
// used to succeed with an event channel opened after device_fatal was
// broadcast, so that handle never saw it.
TEST_F(device_test, an_open_that_meets_the_removal_fails_device_removed) {
  dev_holder->engine().fatal();
  std::error_code ec;
  device late = open_device(*ctx, dev_holder->name(), ec);
  EXPECT_EQ(ec, errc::device_removed);
  // The handle opened before does get its device_fatal.
  const async_event ev = dev.get_event(ec);
  EXPECT_FALSE(ec);
  EXPECT_EQ(ev.type, event_type::device_fatal);
}

TEST_F(device_test, removal_gives_a_parked_get_event_device_fatal_and_the_next_device_removed) {
  // device::fatal() raises device_fatal (docs/verbs.md "Events"), which the
  // first parked request receives; every other parked request completes
  // with device_removed (soft_device.hpp).
  auto first = dev.async_get_event(use_request);
  auto second = dev.async_get_event(use_request);
  ctx->poll();
  EXPECT_FALSE(first.ready());
  EXPECT_FALSE(second.ready());
  remove_device();
  std::error_code ec = make_error_code(errc::timed_out);
  const async_event ev = first.get(ec);
  EXPECT_EQ(ec, std::error_code{});
  EXPECT_EQ(ev.type, event_type::device_fatal);
  second.get(ec);
  EXPECT_EQ(ec, errc::device_removed);
}

// A notification parked on `c` completes with device_removed when the
// device goes.
void device_test::expect_removal_fails_a_notify_of(const cq& c) {
  auto r = c.async_notify(false, use_request);
  ctx->poll();
  EXPECT_FALSE(r.ready());
  remove_device();
  std::error_code ec;
  r.get(ec);
  EXPECT_EQ(ec, errc::device_removed);
}

TEST_F(device_test, removal_completes_parked_cq_notifications_with_device_removed) {
  expect_removal_fails_a_notify_of(dev.create_cq(16));
}

// Even when the removal flushes a QP's receives into that CQ: those
// completions can never be polled (removed_device_cq_polls_nothing), so
// they must not wake the notification with success first.
TEST_F(device_test, removal_completes_cq_notifications_with_device_removed_though_it_flushes_into_the_cq) {
  auto p = connected_pair();
  auto buf = make_buffer(64);
  ASSERT_FALSE(post_recv(p.b, {buf.whole()}, 1));
  expect_removal_fails_a_notify_of(p.cq_b);
}

TEST_F(device_test, removal_moves_queue_pairs_to_err) {
  auto p = connected_pair();
  qp_options ud;
  ud.type = qp_type::ud;
  cq c = dev.create_cq(16);
  qp u = make_qp(ud, c, c);
  u.modify(init_attr(ud), init_mask(qp_type::ud));
  remove_device();
  EXPECT_EQ(p.a.state(), qp_state::err);
  EXPECT_EQ(p.b.state(), qp_state::err);
  EXPECT_EQ(u.state(), qp_state::err);
}

TEST_F(device_test, removed_device_cq_polls_nothing) {
  auto p = connected_pair();
  auto buf = make_buffer(64);
  ASSERT_FALSE(post_recv(p.b, {buf.whole()}, 1));
  remove_device();
  work_completion wc[4];
  EXPECT_EQ(p.cq_b.poll(wc), 0u);
}

}  // namespace
}  // namespace averbs::test
