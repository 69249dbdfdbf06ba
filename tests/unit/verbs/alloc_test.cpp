// SPDX-License-Identifier: MIT
// Posting and polling never allocate in steady state: this program counts
// every operator new in the process (libaverbs included) across a million
// send/receive cycles, a hundred thousand multi-packet writes and reads,
// and a hundred thousand atomics after warm-up, and asserts none.
#include "counting_new.hpp"
#include "verbs_fixture.hpp"

namespace averbs::test {
namespace {

class data_path_alloc : public verbs_test {
 protected:
  template <class Body>
  std::uint64_t allocations_during(int n, Body&& body) {
    body(n / 10 + 64);  // warm-up: packet pools and queues reach their size
    const std::uint64_t before = heap_allocations();
    body(n);
    return heap_allocations() - before;
  }
};

TEST_F(data_path_alloc, send_recv_cycles_do_not_allocate) {
  auto p = connected_pair();
  auto src = make_buffer(64), dst = make_buffer(64);
  const sge s = src.part(0, 8), d = dst.part(0, 8);
  send_wr w;
  w.opcode = wr_opcode::send;
  w.sg_list = &s;
  w.num_sge = 1;
  w.flags = send_signaled;
  recv_wr r;
  r.sg_list = &d;
  r.num_sge = 1;
  work_completion wc[2];
  std::uint64_t ok = 0;
  EXPECT_EQ(allocations_during(1'000'000,
                               [&](int n) {
                                 for (int i = 0; i < n; ++i) {
                                   if (p.b.post_recv(r) || p.a.post_send(w)) return;
                                   while (p.cq_a.poll({wc, 1}) == 0) {
                                   }
                                   while (p.cq_b.poll({wc + 1, 1}) == 0) {
                                   }
                                   ok += wc[0].status == wc_status::success && wc[1].status == wc_status::success;
                                 }
                               }),
            0u);
  EXPECT_GT(ok, 1'000'000u);
}

TEST_F(data_path_alloc, multi_packet_writes_reads_and_atomics_do_not_allocate) {
  auto p = connected_pair();
  auto local = make_buffer(16384), remote = make_buffer(16384);
  const sge big = local.part(0, 10000), eight = local.part(0, 8);
  work_completion wc;
  std::uint64_t ok = 0;
  auto run = [&](wr_opcode op, const sge& g) {
    send_wr w;
    w.opcode = op;
    w.sg_list = &g;
    w.num_sge = 1;
    w.flags = send_signaled;
    w.remote_addr = remote.addr();
    w.rkey = remote.m.rkey();
    w.compare_add = 1;
    if (p.a.post_send(w)) return;
    while (p.cq_a.poll({&wc, 1}) == 0) {
    }
    ok += wc.status == wc_status::success;
  };
  EXPECT_EQ(allocations_during(100'000,
                               [&](int n) {
                                 for (int i = 0; i < n; ++i) {
                                   run(wr_opcode::rdma_write, big);
                                   run(wr_opcode::rdma_read, big);
                                   run(wr_opcode::atomic_fetch_and_add, eight);
                                 }
                               }),
            0u);
  EXPECT_GT(ok, 300'000u);
}

}  // namespace
}  // namespace averbs::test
