// SPDX-License-Identifier: MIT
// Control verbs racing a destroy of the object they name, on another
// thread: each runs wholly before the destroy or finds a stale handle,
// never touches a freed object (clean under TSan and ASan: scripts/test.sh
// builds this one for its TSan stage).
#include "verbs_fixture.hpp"

#include <atomic>
#include <thread>

namespace averbs::test {
namespace {

using verbs_stress = verbs_test;

constexpr int rounds = 200;

// Runs `use` on its own thread until it reports a stale handle (or 1 s),
// while this thread lets it start and then runs `destroy`.
template <class Use, class Destroy>
void race(Use&& use, Destroy&& destroy) {
  std::atomic<bool> started{false};
  std::error_code last;
  std::thread user([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
      last = use();
      if (i == 0) started.store(true);
      if (last == errc::stale_handle) break;
      ASSERT_FALSE(last) << last.message();
    }
  });
  while (!started.load()) std::this_thread::yield();
  destroy();
  user.join();
  EXPECT_EQ(last, errc::stale_handle);  // once destroyed, every later call says so
}

TEST_F(verbs_stress, modify_query_and_state_racing_destroy_qp) {
  cq c = dev.create_cq(64);
  const qp_options o;
  for (int r = 0; r < rounds; ++r) {
    qp q = make_qp(o, c, c);
    q.modify(init_attr(o), init_mask(qp_type::rc));
    const qp other = q;  // a copy: the same QP
    race(
        [&] {
          std::error_code ec;
          qp_attr a;
          a.qp_access_flags = access_local_write | access_remote_write;
          other.modify(a, qp_attr_access_flags, ec);  // INIT -> INIT
          if (ec) return ec;
          (void)other.query(ec);
          if (ec) return ec;
          const qp_state st = other.state();  // ERR once destroyed
          return st == qp_state::init || st == qp_state::err ? ec : make_error_code(errc::invalid_state);
        },
        [&] { q.destroy(); });
    EXPECT_EQ(other.state(), qp_state::err);  // a destroyed QP reads as ERR
    qps.clear();
  }
}

class verbs_stress_traffic : public conformance_test {
 protected:
  /// Runs `post` on its own thread until it is refused (or 1 s), draining
  /// `q` after each, while this thread lets it start and then runs
  /// `destroy`; the refusal.
  template <class Post, class Destroy>
  std::error_code race_until_refused(const cq& q, Post&& post, Destroy&& destroy) {
    std::atomic<bool> started{false};
    std::error_code last;
    std::thread user([&] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
        last = post();
        if (i == 0) started.store(true);
        if (last) break;
        (void)drain(q);
      }
    });
    while (!started.load()) std::this_thread::yield();
    destroy();
    user.join();
    (void)drain(q);
    return last;
  }
};

// A UD send naming an AH another thread destroys: posted before the
// destroy, or refused after it (invalid_argument).  The post used to read
// the AH's engine pointer outside the engine's lock, and the engine then
// read the AH through it: freed meanwhile (TSan reports the unlocked read
// racing the destroy).  It now looks the AH up under the lock by slot and
// generation.
TEST_F(verbs_stress_traffic, ud_sends_naming_an_ah_racing_its_destroy) {
  auto p = connected_pair(qp_options{.type = qp_type::ud});
  auto src = make_buffer(16);
  for (int r = 0; r < 50; ++r) {
    ah h = make_ah();
    const ah copy = h;  // the same AH
    const std::error_code last = race_until_refused(
        p.cq_a, [&] { return post_ud(p.a, copy, p.b.num(), ud_qkey, {src.whole()}, 1); },
        [&] { h.destroy(); });
    EXPECT_EQ(last, errc::invalid_argument) << last.message();
  }
}

// The same for a type-1 bind naming a window another thread deallocates.
TEST_F(verbs_stress_traffic, type1_binds_racing_the_windows_dealloc) {
  auto p = connected_pair();
  auto region = make_buffer(4096, access_local_write | access_remote_write | access_mw_bind);
  for (int r = 0; r < 50; ++r) {
    mw w = pd_.alloc_mw(mw_type::type1);
    const mw copy = w;  // the same window
    const std::error_code last = race_until_refused(
        p.cq_b,
        [&] {
          return p.b.bind_mw(copy, 1, send_signaled,
                             {region.m.lkey(), region.addr(), 4096, access_remote_write});
        },
        [&] { w.dealloc(); });
    EXPECT_EQ(last, errc::invalid_argument) << last.message();
  }
}

TEST_F(verbs_stress, reg_mr_racing_dealloc_pd) {
  std::vector<std::byte> buf(4096);
  // Fewer rounds: each hands the handle lock back and forth hundreds of
  // times, a sleeping wake-up each (40 us on this VM).
  for (int r = 0; r < rounds / 4; ++r) {
    pd p = dev.alloc_pd();
    const pd other = p;
    // A dealloc refused (busy) for a while asks the registering thread to
    // hold off, so one gets through: a thread that always holds a region
    // would refuse every dealloc (livelock, not a race), and on a loaded
    // machine it could, until the user thread's second ran out.
    std::atomic<bool> hold{false};
    race(
        [&] {
          while (hold.load()) std::this_thread::yield();
          std::error_code ec;
          mr m = other.reg_mr(buf.data(), buf.size(), access_local_write, ec);
          if (!ec) m.dereg();
          return ec;
        },
        [&] {
          std::error_code ec;
          for (int tries = 0;; ++tries) {
            p.dealloc(ec);
            if (ec != errc::busy) break;
            if (tries == 100) hold.store(true);
            std::this_thread::yield();
          }
          hold.store(false);
          EXPECT_FALSE(ec) << ec.message();
        });
  }
}

TEST_F(verbs_stress, resize_and_notify_racing_destroy_cq) {
  for (int r = 0; r < rounds; ++r) {
    cq c = dev.create_cq(64);
    const cq other = c;
    race(
        [&] {
          std::error_code ec;
          other.resize(32 + static_cast<std::uint32_t>(r % 64), ec);
          if (ec) return ec;
          auto n = other.async_notify(false, use_request);
          other.cancel_notifies();
          try {
            n.get();
          } catch (const std::system_error& e) {
            if (e.code() != errc::operation_aborted) return e.code();
          }
          return std::error_code{};
        },
        [&] { c.destroy(); });
  }
}

// A destroy refused (the SRQ is in use) leaves the object as it was for
// every other thread: its receives post and a second destroy is refused
// too, never stale_handle for a live object.
TEST_F(verbs_stress, a_refused_destroy_leaves_the_srq_usable_meanwhile) {
  cq c = dev.create_cq(64);
  srq s = pd_.create_srq({20000, 1, 0});
  qp_options o;
  qp_init_attr ia;
  ia.send_cq = c;
  ia.recv_cq = c;
  ia.srq = s;
  ia.cap = o.cap;
  qp user = pd_.create_qp(ia);  // keeps the SRQ busy
  std::vector<std::byte> buf(64);
  mr m = pd_.reg_mr(buf.data(), buf.size(), access_local_write);
  const sge g{reinterpret_cast<std::uintptr_t>(buf.data()), 64, m.lkey()};
  const srq other = s;
  std::atomic<bool> go{false};
  std::thread destroyer([&] {
    go.store(true);
    for (int i = 0; i < 20000; ++i) {
      std::error_code ec;
      other.destroy(ec);
      ASSERT_EQ(ec, errc::busy) << ec.message();
    }
  });
  while (!go.load()) std::this_thread::yield();
  for (int i = 0; i < 20000; ++i) {
    recv_wr r;
    r.wr_id = static_cast<std::uint64_t>(i);
    r.sg_list = &g;
    r.num_sge = 1;
    ASSERT_FALSE(s.post_recv(r)) << "receive " << i;
  }
  destroyer.join();
}

// Two rereg calls changing the PD of one region, on two threads: each
// runs wholly (the handle's PD is not written by both at once).
TEST_F(verbs_stress, rereg_racing_rereg_of_the_same_region) {
  std::vector<std::byte> buf(4096);
  pd a = dev.alloc_pd(), b = dev.alloc_pd();
  mr m = a.reg_mr(buf.data(), buf.size(), access_local_write);
  const mr other = m;
  std::atomic<bool> go{false};
  std::thread t([&] {
    go.store(true);
    for (int i = 0; i < rounds * 5; ++i) other.rereg(rereg_change_pd, i % 2 ? &a : &b, nullptr, 0, 0);
  });
  while (!go.load()) std::this_thread::yield();
  for (int i = 0; i < rounds * 5; ++i) m.rereg(rereg_change_pd, i % 2 ? &b : &a, nullptr, 0, 0);
  t.join();
  // Every rereg succeeded (each throws otherwise) and the region is whole:
  // it still covers its buffer under its current keys, in one PD or the
  // other (both PDs busy with it would refuse a dealloc of neither).
  EXPECT_NE(m.lkey(), 0u);
  EXPECT_EQ(m.addr(), buf.data());
  EXPECT_EQ(m.length(), buf.size());
  std::error_code ea, eb;
  a.dealloc(ea);
  b.dealloc(eb);
  EXPECT_TRUE((ea == errc::busy) != (eb == errc::busy)) << ea.message() << " / " << eb.message();
  m.dereg();
}

}  // namespace
}  // namespace averbs::test
