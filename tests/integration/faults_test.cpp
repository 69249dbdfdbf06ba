// SPDX-License-Identifier: MIT
// RC stays reliable over a UDP link that loses, duplicates, reorders and
// corrupts packets (averbs' own fault injection, seeded): every byte
// arrives, every work request completes exactly once, atomics execute
// exactly once.  And when the peer vanishes, retries end in retry_exc_err.
#include "udp_pair.hpp"

#include <set>

namespace averbs::test {
namespace {

constexpr std::size_t msgs = 60;
constexpr std::size_t msg_size = 8192;  // 8 packets at MTU 1024

// What the faults must have made the devices count: a specification that
// was ignored would otherwise pass as a clean run.  Every kind the
// specification names must show in the injector's own counters
// (device_counters::faults_*; the seeds repeat their draws, and a few
// hundred packets at 1 % meet several).  The effects on the transport
// below are checked only at rates where a run without them is out of the
// question (10 %: e^-40 for a few hundred packets).
enum class acted { unchecked, drops, duplicates, out_of_order, corruption, something };

struct fault_case {
  const char* name;
  const char* spec;
  acted shows = acted::unchecked;
};

class faults : public udp_pair_test, public ::testing::WithParamInterface<fault_case> {
 protected:
  void SetUp() override {
    make(a, 0, GetParam().spec);
    make(b, 1, GetParam().spec);
    make_qps(qp_type::rc, msgs * msg_size * 2);
  }
  void TearDown() override {
    if (!HasFatalFailure()) {
      expect_nothing_more();
      expect_faults_acted();
    }
    udp_pair_test::TearDown();
  }
  // Exactly once: poll() stops at the count it was asked for, so a late
  // second completion would go unseen; both devices run on a while longer
  // and their CQs stay empty.
  void expect_nothing_more() {
    work_completion wc[4];
    std::size_t late_a = 0, late_b = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
    while (std::chrono::steady_clock::now() < until) {
      late_a += a.c.poll(wc);
      late_b += b.c.poll(wc);
    }
    EXPECT_EQ(late_a, 0u) << "completions after the last expected one";
    EXPECT_EQ(late_b, 0u) << "completions after the last expected one";
  }
  void expect_faults_acted() {
    device_counters s{};
    for (endpoint* e : {&a, &b}) {
      const device_counters c = e->dev.counters();
      s.dropped += c.dropped;
      s.retransmits += c.retransmits;
      s.tail_probes += c.tail_probes;
      s.duplicates_received += c.duplicates_received;
      s.seq_naks_sent += c.seq_naks_sent;
      s.icrc_errors += c.icrc_errors;
      s.faults_dropped += c.faults_dropped;
      s.faults_duplicated += c.faults_duplicated;
      s.faults_reordered += c.faults_reordered;
      s.faults_corrupted += c.faults_corrupted;
      s.faults_delayed += c.faults_delayed;
    }
    const std::uint64_t recovered = s.retransmits + s.tail_probes;
    const std::string spec = GetParam().spec;
    auto names = [&](const char* kind) { return spec.find(kind) != std::string::npos; };
    EXPECT_TRUE(!names("drop=") || s.faults_dropped > 0) << "no packet was dropped";
    EXPECT_TRUE(!names("dup=") || s.faults_duplicated > 0) << "no packet was duplicated";
    EXPECT_TRUE(!names("reorder=") || s.faults_reordered > 0) << "no packet was reordered";
    EXPECT_TRUE(!names("corrupt=") || s.faults_corrupted > 0) << "no packet was corrupted";
    EXPECT_TRUE(!names("delay=") || s.faults_delayed > 0) << "no packet was delayed";
    EXPECT_TRUE(!spec.empty() || s.faults_dropped + s.faults_duplicated + s.faults_reordered +
                                         s.faults_corrupted + s.faults_delayed ==
                                     0)
        << "faults injected without a specification";
    switch (GetParam().shows) {
      case acted::unchecked:
        break;
      case acted::drops:
        EXPECT_GT(s.dropped, 0u);
        EXPECT_GT(recovered, 0u) << "losses need resends";
        break;
      case acted::duplicates:
        EXPECT_GT(s.duplicates_received, 0u);
        break;
      case acted::out_of_order:
        EXPECT_GT(s.seq_naks_sent + s.duplicates_received + recovered, 0u) << "nothing arrived out of order";
        break;
      case acted::corruption:
        // A flip that leaves the headers undecodable is dropped before
        // the ICRC is looked at (as rxe checks).
        EXPECT_GT(s.icrc_errors + s.dropped, 0u);
        EXPECT_GT(recovered, 0u) << "damaged packets need resends";
        break;
      case acted::something:
        EXPECT_GT(s.dropped + s.icrc_errors + s.duplicates_received + s.seq_naks_sent + recovered, 0u);
        break;
    }
  }
  std::uint8_t pattern(std::size_t msg, std::size_t i) const { return static_cast<std::uint8_t>(msg * 31 + i * 7 + 1); }
  void fill_a() {
    for (std::size_t m = 0; m < msgs; ++m)
      for (std::size_t i = 0; i < msg_size; ++i) a.buf[m * msg_size + i] = std::byte(pattern(m, i));
  }
  ::testing::AssertionResult region_ok(const std::vector<std::byte>& buf, std::size_t base, std::size_t m) const {
    for (std::size_t i = 0; i < msg_size; ++i)
      if (buf[base + m * msg_size + i] != std::byte(pattern(m, i)))
        return ::testing::AssertionFailure() << "message " << m << " byte " << i;
    return ::testing::AssertionSuccess();
  }
  // Each wr_id completes exactly once, successfully.
  void expect_exactly_once(const std::vector<work_completion>& wcs, std::size_t n) {
    std::set<std::uint64_t> ids;
    for (const auto& wc : wcs) {
      EXPECT_EQ(wc.status, wc_status::success) << "wr_id " << wc.wr_id << ": " << to_string(wc.status);
      EXPECT_TRUE(ids.insert(wc.wr_id).second) << "wr_id " << wc.wr_id << " completed twice";
    }
    EXPECT_EQ(ids.size(), n);
  }
  std::error_code post(endpoint& e, wr_opcode op, std::uint64_t id, std::uint64_t laddr, std::uint32_t len,
                       std::uint64_t raddr, std::uint32_t rkey, std::uint64_t add = 0,
                       std::uint64_t swap = 0) {
    return post_wr(e.q, op, id, reinterpret_cast<const void*>(laddr), len, e.m,
                   reinterpret_cast<const void*>(raddr), rkey, add, swap);
  }
  std::uint64_t addr(const endpoint& e, std::size_t off) const {
    return reinterpret_cast<std::uintptr_t>(e.buf.data()) + off;
  }
};

TEST_P(faults, send_arrives_whole_and_once) {
  fill_a();
  for (std::size_t m = 0; m < msgs; ++m) {
    sge g{addr(b, m * msg_size), msg_size, b.m.lkey()};
    recv_wr r;
    r.wr_id = m;
    r.sg_list = &g;
    r.num_sge = 1;
    ASSERT_FALSE(b.q.post_recv(r));
  }
  for (std::size_t m = 0; m < msgs; ++m)
    ASSERT_FALSE(post(a, wr_opcode::send, m, addr(a, m * msg_size), msg_size, 0, 0));
  auto sent = poll(a.c, msgs);
  auto recvd = poll(b.c, msgs);
  expect_exactly_once(sent, msgs);
  expect_exactly_once(recvd, msgs);
  for (const auto& wc : recvd) {
    EXPECT_EQ(wc.byte_len, msg_size);
    EXPECT_TRUE(region_ok(b.buf, 0, wc.wr_id));
  }
}

TEST_P(faults, write_arrives_whole_and_once) {
  fill_a();
  for (std::size_t m = 0; m < msgs; ++m)
    ASSERT_FALSE(post(a, wr_opcode::rdma_write, m, addr(a, m * msg_size), msg_size, addr(b, m * msg_size), b.m.rkey()));
  expect_exactly_once(poll(a.c, msgs), msgs);
  for (std::size_t m = 0; m < msgs; ++m) EXPECT_TRUE(region_ok(b.buf, 0, m));
}

TEST_P(faults, read_returns_every_byte_once) {
  for (std::size_t m = 0; m < msgs; ++m)
    for (std::size_t i = 0; i < msg_size; ++i) b.buf[m * msg_size + i] = std::byte(pattern(m, i));
  const std::size_t base = msgs * msg_size;  // land in the upper half of A's buffer
  for (std::size_t m = 0; m < msgs; ++m)
    ASSERT_FALSE(post(a, wr_opcode::rdma_read, m, addr(a, base + m * msg_size), msg_size, addr(b, m * msg_size),
                      b.m.rkey()));
  expect_exactly_once(poll(a.c, msgs), msgs);
  for (std::size_t m = 0; m < msgs; ++m) EXPECT_TRUE(region_ok(a.buf, base, m));
}

TEST_P(faults, atomics_execute_exactly_once) {
  constexpr std::size_t n = 200;
  std::memset(b.buf.data(), 0, 8);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_FALSE(post(a, wr_opcode::atomic_fetch_and_add, i, addr(a, 8 * i), 8, addr(b, 0), b.m.rkey(), 1));
  expect_exactly_once(poll(a.c, n), n);
  std::uint64_t total;
  std::memcpy(&total, b.buf.data(), 8);
  EXPECT_EQ(total, n) << "a replayed atomic must not execute again";
  std::set<std::uint64_t> olds;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v;
    std::memcpy(&v, a.buf.data() + 8 * i, 8);
    olds.insert(v);
  }
  EXPECT_EQ(olds.size(), n) << "each fetch-and-add saw a distinct old value";
  EXPECT_EQ(*olds.rbegin(), n - 1);
}

// A chain of compare-and-swaps on one word, i -> i + 1: each sees exactly
// the value the one before it left.  One executed again instead of
// answered from the responder's replay cache would find a later value, not
// swap, and report that value as its old one (when its first response was
// the one lost).
TEST_P(faults, compare_and_swap_chain_executes_exactly_once) {
  constexpr std::size_t n = 200;
  std::memset(b.buf.data(), 0, 8);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_FALSE(
        post(a, wr_opcode::atomic_cmp_and_swp, i, addr(a, 8 * i), 8, addr(b, 0), b.m.rkey(), i, i + 1));
  expect_exactly_once(poll(a.c, n), n);
  std::uint64_t last;
  std::memcpy(&last, b.buf.data(), 8);
  EXPECT_EQ(last, n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t old;
    std::memcpy(&old, a.buf.data() + 8 * i, 8);
    EXPECT_EQ(old, i) << "compare-and-swap " << i;
  }
}

// ATOMIC WRITEs to one word, values 1..n: the word ends at n and stays
// there.  A duplicate or a resend that stored again would put an older
// value back over a newer one (a delayed or reordered copy arrives after
// later writes; the devices run on a while to let such copies in).
TEST_P(faults, atomic_writes_store_exactly_once_in_order) {
  constexpr std::size_t n = 200;
  std::memset(b.buf.data(), 0, 8);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t v = i + 1;
    std::memcpy(a.buf.data() + 8 * i, &v, 8);
  }
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_FALSE(post(a, wr_opcode::atomic_write, i, addr(a, 8 * i), 8, addr(b, 0), b.m.rkey()));
  const auto wcs = poll(a.c, n);
  expect_exactly_once(wcs, n);
  for (const auto& wc : wcs) EXPECT_EQ(wc.opcode, wc_opcode::atomic_write);
  std::uint64_t last;
  std::memcpy(&last, b.buf.data(), 8);
  EXPECT_EQ(last, n);
  work_completion wc[4];
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  while (std::chrono::steady_clock::now() < until) {
    (void)a.c.poll(wc);
    (void)b.c.poll(wc);
  }
  std::memcpy(&last, b.buf.data(), 8);
  EXPECT_EQ(last, n) << "a late copy stored an older value";
}

INSTANTIATE_TEST_SUITE_P(
    rc, faults,
    ::testing::Values(fault_case{"clean", ""}, fault_case{"loss_1pct", "drop=0.01,seed=11"},
                      fault_case{"loss_10pct", "drop=0.10,seed=12", acted::drops},
                      fault_case{"dup_1pct", "dup=0.01,seed=13"},
                      fault_case{"dup_10pct", "dup=0.10,seed=14", acted::duplicates},
                      fault_case{"reorder_1pct", "reorder=0.01,seed=15"},
                      fault_case{"reorder_10pct", "reorder=0.10,seed=16", acted::out_of_order},
                      fault_case{"corrupt_1pct", "corrupt=0.01,seed=17"},
                      fault_case{"corrupt_10pct", "corrupt=0.10,seed=18", acted::corruption},
                      fault_case{"delay_10pct", "delay=0.10,delay_us=300,seed=19", acted::out_of_order},
                      fault_case{"everything",
                                 "drop=0.02,dup=0.02,reorder=0.02,corrupt=0.02,delay=0.02,seed=20",
                                 acted::something}),
    [](const ::testing::TestParamInfo<fault_case>& i) { return std::string(i.param.name); });

// UC drops a message on loss (IBTA 9.8.3: a gap drops the rest of the
// message; nothing is resent): under 10 % drop every SEND completes at
// its sender, the receives complete only for messages that arrived whole,
// in order, and the QPs stay in RTS.
using uc_faults = udp_pair_test;

TEST_F(uc_faults, uc_drops_what_it_loses_and_delivers_the_rest_whole) {
  make(a, 0, "drop=0.10,seed=21");
  make(b, 1, "drop=0.10,seed=22");
  constexpr std::size_t n = 60, size = 8192;  // 8 packets each at MTU 1024
  make_qps(qp_type::uc, n * size);
  auto pattern = [](std::size_t m, std::size_t i) {
    return std::byte(static_cast<std::uint8_t>(m * 31 + i * 7 + 1));
  };
  for (std::size_t m = 0; m < n; ++m)
    for (std::size_t i = 0; i < size; ++i) a.buf[m * size + i] = pattern(m, i);
  for (std::size_t m = 0; m < n; ++m) {
    sge g{reinterpret_cast<std::uintptr_t>(b.buf.data()) + m * size, size, b.m.lkey()};
    recv_wr r;
    r.wr_id = m;
    r.sg_list = &g;
    r.num_sge = 1;
    ASSERT_FALSE(b.q.post_recv(r));
  }
  for (std::size_t m = 0; m < n; ++m)
    ASSERT_FALSE(post_wr(a.q, wr_opcode::send, m, a.buf.data() + m * size, size, a.m));
  const auto sent = poll(a.c, n);
  ASSERT_EQ(sent.size(), n) << "a UC SEND completes when sent, lost or not";
  for (const auto& wc : sent) EXPECT_EQ(wc.status, wc_status::success);
  // Whatever arrives has arrived well before this (the devices run on).
  const auto got = poll(b.c, n, std::chrono::milliseconds(300));
  EXPECT_GT(got.size(), 0u);
  EXPECT_LT(got.size(), n) << "nothing was lost at 10 % drop: the faults did not act";
  std::size_t next_msg = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].status, wc_status::success) << to_string(got[k].status);
    ASSERT_EQ(got[k].wr_id, k) << "receives complete in order";
    ASSERT_EQ(got[k].byte_len, size) << "only whole messages complete";
    // Receive k holds some later message, whole.
    const std::byte* r = b.buf.data() + k * size;
    std::size_t m = next_msg;
    while (m < n && r[0] != pattern(m, 0)) ++m;
    ASSERT_LT(m, n) << "receive " << k << " holds no message sent after the last one";
    for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(r[i], pattern(m, i)) << "receive " << k << " byte " << i;
    next_msg = m + 1;
  }
  EXPECT_GT(a.dev.counters().faults_dropped, 0u);
  EXPECT_EQ(a.q.query().state, qp_state::rts);
  EXPECT_EQ(b.q.query().state, qp_state::rts);
}

using vanish = udp_pair_test;

TEST_F(vanish, retry_exhaustion_ends_in_retry_exc_err_and_error_qp) {
  make(a, 0);
  make(b, 1);
  make_qps(qp_type::rc, 1 << 16);  // retry_cnt 7, 4 ms apart (67 ms under sanitizers)
  b.q = {};  // the peer's QP goes away: its packets are dropped
  b.sdev.reset();
  sge g{reinterpret_cast<std::uintptr_t>(a.buf.data()), 64, a.m.lkey()};
  send_wr w;
  w.wr_id = 9;
  w.opcode = wr_opcode::rdma_write;
  w.sg_list = &g;
  w.num_sge = 1;
  w.flags = send_signaled;
  w.remote_addr = 0x1000;
  w.rkey = 0x100;
  ASSERT_FALSE(a.q.post_send(w));
  w.wr_id = 10;
  ASSERT_FALSE(a.q.post_send(w));
  work_completion wc[2];
  std::size_t got = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got < 2 && std::chrono::steady_clock::now() < until) got += a.c.poll({wc + got, 2 - got});
  ASSERT_EQ(got, 2u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, wc_status::retry_exc_err);
  EXPECT_EQ(wc[1].wr_id, 10u);
  EXPECT_EQ(wc[1].status, wc_status::wr_flush_err);
  EXPECT_EQ(a.q.state(), qp_state::err);
  // Seven counted retries, and at most one uncounted (the first timeout
  // after an unasked last packet, docs/wire.md), before the eighth
  // timeout gives up.
  const device_counters c = a.dev.counters();
  EXPECT_GE(c.retransmits, 7u) << "retry_cnt 7 means seven retransmissions";
  EXPECT_LE(c.retransmits, 8u);
  EXPECT_EQ(c.retry_timeouts, c.retransmits + 1) << "every resend after a timeout, and the last timeout";
}

}  // namespace
}  // namespace averbs::test
