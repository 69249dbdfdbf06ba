// SPDX-License-Identifier: MIT
// `averbs perf` between two processes, as a user runs it: the statistics
// it prints (perftest's definitions), the greeting that makes two
// differently configured ends stop with a message, the out-of-band
// connection's deadlines, and ends that notice when the other process dies
// instead of spinning forever.
#include "perf/perf.hpp"
#include "environment.hpp"
#include "perf/oob.hpp"
#include "process.hpp"
#include "udp_pair.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;
using perf::oob;

// --- statistics ------------------------------------------------------------

TEST(perf_statistics, latency_figures_follow_perftest) {
  // 100 samples of 1..100 cycles, shuffled: perftest drops the two largest
  // from the statistics and prints the sample at index n (of n + 2) as
  // t_max: the second largest, 99.
  std::vector<std::uint64_t> d(100);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = i + 1;
  std::shuffle(d.begin(), d.end(), std::mt19937(7));
  const perf::cycle_clock c;
  const perf::latency_result r = perf::summarize_latency(d, c, 8, 100, 1);
  EXPECT_DOUBLE_EQ(r.t_min, c.us(1));
  EXPECT_DOUBLE_EQ(r.t_max, c.us(99));
  EXPECT_DOUBLE_EQ(r.t_typical, c.us((49 + 50) / 2));    // median of the 98 kept
  EXPECT_DOUBLE_EQ(r.p99, c.us(99));                     // index ceil(0.99 * 98) = 98
  EXPECT_NEAR(r.t_avg, c.us(1) * 49.5, c.us(1) * 1e-9);  // mean of 1..98
}

TEST(perf_statistics, peak_times_each_run_from_its_first_post_to_its_last_completion) {
  // Ten messages posted 10 cycles apart, a signaled completion every 4th
  // and the last: indices 3, 7 and 9.  Completions 3 and 7 are seen close
  // together (one poll found both), which a rate between consecutive
  // completions would count as 4 messages in 10 cycles.  perftest's
  // measure is messages 0..7 in 110 cycles: 13.75 a message.
  std::vector<std::uint64_t> posted(10), completed(10, 0);
  for (std::size_t i = 0; i < posted.size(); ++i) posted[i] = 10 * i;
  completed[3] = 100;
  completed[7] = 110;
  completed[9] = 200;
  EXPECT_DOUBLE_EQ(perf::peak_cycles_per_message(posted, completed, 4), 110.0 / 8);
  // Every message signaled: the best single run is still 0..7.
  std::vector<std::uint64_t> all = completed;
  for (std::size_t i : {0u, 1u, 2u}) all[i] = 100;
  for (std::size_t i : {4u, 5u, 6u}) all[i] = 110;
  all[8] = 200;
  EXPECT_DOUBLE_EQ(perf::peak_cycles_per_message(posted, all, 1), 110.0 / 8);
  EXPECT_EQ(perf::peak_cycles_per_message({}, {}, 4), 0.0);
}

// --- the greeting ----------------------------------------------------------

perf::options opts(perf::test_kind k) {
  perf::options o;
  o.test = k;
  return o;
}

std::string agree_error(perf::options mine, const perf::options& theirs) {
  try {
    perf::agree(mine, perf::params_of(theirs));
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(perf_greeting, another_test_sizes_or_iterations_is_an_error_naming_both) {
  const perf::options lat = opts(perf::test_kind::send_lat);
  EXPECT_EQ(agree_error(lat, opts(perf::test_kind::write_bw)),
            "the peer runs RDMA_Write BW, this side Send Latency");
  perf::options big = lat;
  big.size = 4096;
  EXPECT_EQ(agree_error(lat, big),
            "the peer runs 4096 bytes, this side 2 bytes (give both the same -s or -a)");
  perf::options sweep = lat;
  sweep.all_sizes = true;
  EXPECT_EQ(agree_error(lat, sweep),
            "the peer runs all sizes (-a), this side 2 bytes (give both the same -s or -a)");
  perf::options many = lat;
  many.iters = 5000;
  EXPECT_EQ(agree_error(lat, many),
            "the peer runs 5000 iterations, this side 1000 iterations (give both the same -n or -D)");
  perf::options bw = opts(perf::test_kind::write_bw), timed = bw;
  timed.duration = 5;
  EXPECT_EQ(agree_error(bw, timed),
            "the peer runs 5 s, this side 5000 iterations (give both the same -n or -D)");
  EXPECT_EQ(agree_error(lat, lat), "");
}

TEST(perf_greeting, path_mtu_and_read_depth_are_the_smaller_of_the_two) {
  perf::options mine = opts(perf::test_kind::read_bw);
  perf::options theirs = mine;
  theirs.path_mtu = mtu::mtu_1024;
  theirs.outstanding_reads = 4;
  perf::agree(mine, perf::params_of(theirs));
  EXPECT_EQ(mine.path_mtu, mtu::mtu_1024);
  EXPECT_EQ(mine.outstanding_reads, 4u);
  // The peer asking for more changes nothing here.
  perf::options high = opts(perf::test_kind::read_bw);
  high.outstanding_reads = 64;
  perf::agree(mine, perf::params_of(high));
  EXPECT_EQ(mine.path_mtu, mtu::mtu_1024);
  EXPECT_EQ(mine.outstanding_reads, 4u);
  // An MTU no IBTA link has is refused.
  perf::test_params odd = perf::params_of(mine);
  odd.mtu_bytes = 1500;
  EXPECT_THROW(perf::agree(mine, odd), std::runtime_error);
}

// --- the out-of-band connection ---------------------------------------------

struct oob_pair {
  oob server, client;
  explicit oob_pair(const std::string& addr) {
    oob l = oob::listen(addr, 0);
    client = oob::connect(addr, l.bound_port(), 5s);
    server = l.accept(5s);
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(perf_oob, a_silent_peer_ends_a_receive_at_its_deadline) {
  oob_pair p(test_address(0));
  p.server.set_timeout(300ms);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(error_of([&] { (void)p.server.recv_word(); }),
            "the peer sent nothing on the out-of-band connection for 0.3 s");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(perf_oob, a_stranger_or_another_version_is_told_apart) {
  {
    oob_pair p(test_address(0));
    // 48 bytes that are not a greeting (an HTTP request, say).
    for (int i = 0; i < 6; ++i) p.client.send_word(0x474554202f204854ull);
    EXPECT_EQ(error_of([&] { (void)p.server.recv_params(); }),
              "the peer on the out-of-band port is not averbs perf (no greeting)");
  }
  // The magic, then version 4.
  oob_pair p(test_address(0));
  p.client.send_word(0x4156425045524600ull);
  p.client.send_word(std::uint64_t{4} << 32);
  for (int i = 0; i < 5; ++i) p.client.send_word(0);
  EXPECT_EQ(error_of([&] { (void)p.server.recv_params(); }),
            "the peer speaks version 4 of averbs perf's exchange, this is version 3");
}

// A stranger that sends less than a greeting and waits for an answer (an
// HTTP request, say) is told apart at once; a greeting cut short says how
// much came.  (The whole greeting used to be awaited first: the server
// waited out its deadline and then said the peer had sent nothing.)
TEST(perf_oob, a_short_stranger_or_a_greeting_cut_short_is_told_apart) {
  {
    oob_pair p(test_address(0));
    p.server.set_timeout(5s);
    p.client.send_word(0x474554202f204854ull);  // "GET / HT"
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(error_of([&] { (void)p.server.recv_params(); }),
              "the peer on the out-of-band port is not averbs perf (no greeting)");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s) << "waited for the rest of a greeting";
  }
  oob_pair p(test_address(0));
  p.server.set_timeout(300ms);
  p.client.send_word(0x4156425045524600ull);
  p.client.send_word(std::uint64_t{3} << 32);  // the version, and 4 bytes more
  EXPECT_EQ(
      error_of([&] { (void)p.server.recv_params(); }),
      "the peer sent 16 of the 52 bytes of a message on the out-of-band connection, then nothing until 0.3 s "
      "had passed");
}

TEST(perf_oob, a_greeting_arrives_as_sent) {
  oob_pair p(test_address(0));
  perf::options o = opts(perf::test_kind::atomic_bw);
  o.iters = 123456789;
  o.path_mtu = mtu::mtu_512;
  o.outstanding_reads = 7;
  perf::test_params sent = perf::params_of(o);
  sent.roce_port = 4791;
  p.client.send_params(sent);
  const perf::test_params got = p.server.recv_params();
  EXPECT_EQ(got.roce_port, 4791u);
  EXPECT_EQ(got.test, static_cast<std::uint32_t>(perf::test_kind::atomic_bw));
  EXPECT_EQ(got.iters, 123456789u);
  EXPECT_EQ(got.mtu_bytes, 512u);
  EXPECT_EQ(got.outs, 7u);
  EXPECT_EQ(got.size, 8u);
  EXPECT_EQ(got.all_sizes, 0u);
}

TEST(perf_oob, steps_out_of_order_and_a_closed_peer_are_noticed) {
  oob_pair p(test_address(0));
  p.client.send_word(4);
  EXPECT_FALSE(p.server.peer_closed());  // a message waiting is not a close
  EXPECT_EQ(error_of([&] { p.server.expect_word(3, "the end of a size"); }),
            "out-of-band exchange out of step at the end of a size: expected 3, the peer sent 4");
  EXPECT_FALSE(p.server.peer_closed());
  // A last word, then the close: seen as closed with the word still unread,
  // and the word is still there to read.
  p.client.send_word(5);
  p.client = oob();
  bool closed = false;
  for (int i = 0; i < 200 && !closed; ++i) {
    closed = p.server.peer_closed();
    if (!closed) std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(closed);
  EXPECT_EQ(p.server.recv_word(), 5u);
  EXPECT_EQ(error_of([&] { (void)p.server.recv_word(); }), "the peer closed the out-of-band connection");
}

TEST(perf_oob, a_connect_to_no_one_gives_up_at_its_deadline) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW((void)oob::connect(test_address(0), test_port(), 300ms), std::system_error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

// --- two processes ---------------------------------------------------------

// `averbs perf` with its own device on test_address(which); the client
// gets the server's address last.
std::vector<std::string> perf_cmd(int which, std::uint16_t port, std::vector<std::string> more, bool client) {
  std::vector<std::string> v{AVERBS_CLI, "perf",
                             "--addr",   test_address(which) + ":" + std::to_string(port),
                             "-p",       std::to_string(port + 1)};
  v.insert(v.end(), more.begin(), more.end());
  if (client) v.push_back(test_address(0));
  return v;
}

struct pair_result {
  int server = -2, client = -2;
  std::string server_out, client_out;
};

pair_result run_perf(const std::vector<std::string>& server_args, const std::vector<std::string>& client_args,
                     std::chrono::seconds limit = 120s) {
  const std::uint16_t port = test_port();
  child server(perf_cmd(0, port, server_args, false), true);
  child client(perf_cmd(1, port, client_args, true), true);
  pair_result r;
  r.client = client.wait(limit);
  r.server = server.wait(30s);
  r.client_out = client.output();
  r.server_out = server.output();
  return r;
}

TEST(perf_two_processes, send_lat_sweeps_every_size) {
  // Receives are posted once for the largest size: two posted per size
  // (as before) left short receives behind for the next, larger size.
  const auto r = run_perf({"--test", "send_lat", "-a", "-n", "5"}, {"--test", "send_lat", "-a", "-n", "5"});
  ASSERT_EQ(r.client, 0) << r.client_out;
  ASSERT_EQ(r.server, 0) << r.server_out;
  for (const char* size : {" 2       5 ", " 4096    5 ", " 8388608 5 "}) {
    EXPECT_NE(r.client_out.find(size), std::string::npos) << size << "\n" << r.client_out;
    EXPECT_NE(r.server_out.find(size), std::string::npos) << size << "\n" << r.server_out;
  }
}

TEST(perf_two_processes, the_send_bw_receiver_reports_its_bandwidth) {
  const std::vector<std::string> args{"--test", "send_bw", "-s", "65536", "-n", "300"};
  const auto r = run_perf(args, args);
  ASSERT_EQ(r.client, 0) << r.client_out;
  ASSERT_EQ(r.server, 0) << r.server_out;
  EXPECT_NE(r.server_out.find(" WARNING: BW peak won't be measured in this run."), std::string::npos)
      << r.server_out;
  // The receiver's row: no peak, a positive average.
  const auto row = r.server_out.find(" 65536      300 ");
  ASSERT_NE(row, std::string::npos) << r.server_out;
  double peak = -1, avg = -1;
  ASSERT_EQ(std::sscanf(r.server_out.c_str() + row, " 65536 300 %lf %lf", &peak, &avg), 2) << r.server_out;
  EXPECT_EQ(peak, 0.0);
  EXPECT_GT(avg, 0.0);
  EXPECT_NE(r.client_out.find(" 65536      300 "), std::string::npos) << r.client_out;
}

// The row of a 65536-byte, 300-iteration size in `out` (empty if none).
std::string row_65536(const std::string& out) {
  const auto at = out.find(" 65536      300 ");
  return at == std::string::npos ? std::string{} : out.substr(at, out.find('\n', at) - at);
}

const std::vector<std::string> write_bw_65536{"--test", "write_bw", "-s", "65536", "-n", "300"};

TEST(perf_two_processes, the_write_bw_server_prints_the_clients_figures) {
  // As perftest's server does (xchg_bw_reports): the same row as the client.
  const auto r = run_perf(write_bw_65536, write_bw_65536);
  ASSERT_EQ(r.client, 0) << r.client_out;
  ASSERT_EQ(r.server, 0) << r.server_out;
  const std::string crow = row_65536(r.client_out), srow = row_65536(r.server_out);
  ASSERT_FALSE(crow.empty()) << r.client_out;
  EXPECT_EQ(crow, srow) << r.server_out;
}

// --report_gbits is each end's own choice (perftest's too): a server in
// MB/s prints a client's Gb/s figures in MB/s, not as they came.
TEST(perf_two_processes, the_server_prints_the_clients_figures_in_its_own_unit) {
  std::vector<std::string> gbits = write_bw_65536;
  gbits.push_back("--report_gbits");
  const auto r = run_perf(write_bw_65536, gbits);
  ASSERT_EQ(r.client, 0) << r.client_out;
  ASSERT_EQ(r.server, 0) << r.server_out;
  const std::string crow = row_65536(r.client_out), srow = row_65536(r.server_out);
  double cpeak = 0, cavg = 0, speak = 0, savg = 0;
  ASSERT_EQ(std::sscanf(crow.c_str(), " 65536 300 %lf %lf", &cpeak, &cavg), 2) << r.client_out;
  ASSERT_EQ(std::sscanf(srow.c_str(), " 65536 300 %lf %lf", &speak, &savg), 2) << r.server_out;
  ASSERT_GT(cavg, 0.0);
  const double mb_per_gb = 1e9 / 8 / (1 << 20);  // 119.2
  EXPECT_NEAR(savg, cavg * mb_per_gb, cavg * mb_per_gb * 0.01) << r.server_out << r.client_out;
  EXPECT_NE(r.server_out.find("BW average[MB/sec]"), std::string::npos) << r.server_out;
}

TEST(perf_two_processes, the_path_mtu_is_the_smaller_of_the_two_ends) {
  const auto r = run_perf({"--test", "write_bw", "-s", "8192", "-n", "100", "-m", "1024"},
                          {"--test", "write_bw", "-s", "8192", "-n", "100"});
  ASSERT_EQ(r.client, 0) << r.client_out;
  ASSERT_EQ(r.server, 0) << r.server_out;
  EXPECT_NE(r.client_out.find(" Mtu             : 1024[B]"), std::string::npos) << r.client_out;
  EXPECT_NE(r.server_out.find(" Mtu             : 1024[B]"), std::string::npos) << r.server_out;
}

TEST(perf_two_processes, ends_running_different_tests_both_stop_and_say_why) {
  const auto r = run_perf({"--test", "write_bw"}, {"--test", "send_lat"}, 60s);
  EXPECT_EQ(r.client, 1) << r.client_out;
  EXPECT_EQ(r.server, 1) << r.server_out;
  EXPECT_NE(r.client_out.find("the peer runs RDMA_Write BW, this side Send Latency"), std::string::npos)
      << r.client_out;
  EXPECT_NE(r.server_out.find("the peer runs Send Latency, this side RDMA_Write BW"), std::string::npos)
      << r.server_out;
}

TEST(perf_two_processes, a_stranger_on_the_out_of_band_port_stops_the_server) {
  const std::uint16_t port = test_port();
  child server(perf_cmd(0, port, {"--test", "write_bw"}, false), true);
  oob stranger = oob::connect(test_address(0), static_cast<std::uint16_t>(port + 1), 30s);
  // "GET / HT"...: the server may hang up once it has read the first word
  // (a send after that can meet the closed connection).
  stranger.send_word(0x474554202f204854ull);
  try {
    for (int i = 1; i < 6; ++i) stranger.send_word(0x474554202f204854ull);
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(server.wait(30s), 1) << server.output();
  EXPECT_NE(server.output().find("is not averbs perf"), std::string::npos) << server.output();
}

// The peer's GID must be a unicast address of this device's family: a
// group address, the wildcard or the other family is refused by name
// (a multicast one used to be taken, and our RC traffic sent there).
TEST(perf_two_processes, a_peer_gid_no_qp_can_reach_stops_the_server_naming_it) {
  for (const char* bad : {"224.0.0.1", "0.0.0.0", "::1"}) {
    const std::uint16_t port = test_port();
    child server(perf_cmd(0, port, {"--test", "write_bw"}, false), true);
    oob fake = oob::connect(test_address(0), static_cast<std::uint16_t>(port + 1), 30s);
    fake.send_params(fake.recv_params());  // agrees with whatever the server runs
    const perf::peer_info theirs = fake.recv_info();
    perf::peer_info mine = theirs;
    mine.qpn = 0x123;
    ASSERT_TRUE(gid::parse(bad, mine.g));
    fake.send_info(mine);
    EXPECT_EQ(server.wait(30s), 1) << bad << ": " << server.output();
    EXPECT_NE(server.output().find("the peer sent GID "), std::string::npos)
        << bad << ": " << server.output();
  }
}

// Two ends whose devices use different RoCE UDP ports would lose every
// packet (a device sends to its own port): the greeting says so at once.
TEST(perf_two_processes, ends_on_different_roce_ports_both_stop_and_say_why) {
  const std::uint16_t port = test_port();
  std::vector<std::string> server_cmd = perf_cmd(0, port, {"--test", "write_bw", "-n", "10"}, false);
  std::vector<std::string> client_cmd = perf_cmd(1, port, {"--test", "write_bw", "-n", "10"}, true);
  client_cmd[3] = test_address(1) + ":" + std::to_string(port + 2);  // --addr A:P' instead of A:P
  child server(server_cmd, true);
  child client(client_cmd, true);
  EXPECT_EQ(client.wait(60s), 1) << client.output();
  EXPECT_EQ(server.wait(30s), 1) << server.output();
  const std::string why = "the peer's device uses RoCE UDP port ";
  EXPECT_NE(client.output().find(why + std::to_string(port) + ", this side's " + std::to_string(port + 2)),
            std::string::npos)
      << client.output();
  EXPECT_NE(server.output().find(why + std::to_string(port + 2)), std::string::npos) << server.output();
}

// A peer that sends back this side's own QP and GID is this process (an
// out-of-band connection that reached itself): refused, not measured.
TEST(perf_two_processes, a_peer_that_echoes_our_own_qp_and_gid_stops_the_server) {
  const std::uint16_t port = test_port();
  child server(perf_cmd(0, port, {"--test", "send_lat"}, false), true);
  oob mirror = oob::connect(test_address(0), static_cast<std::uint16_t>(port + 1), 30s);
  mirror.send_params(mirror.recv_params());
  mirror.send_info(mirror.recv_info());
  EXPECT_EQ(server.wait(30s), 1) << server.output();
  EXPECT_NE(server.output().find("the peer is this process"), std::string::npos) << server.output();
}

// Every 32nd send is signaled: with -n a multiple of 32 a size's last
// send waits for an ACK the other end's device still holds when it stops
// to agree the size is over.  Both ends keep their devices running
// through every out-of-band wait, so the ACK leaves.  (The waiting end
// used to run out of retries.)
class perf_size_end : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(perf_size_end, a_size_whose_last_send_is_signaled_ends_cleanly) {
  const auto r = run_perf(GetParam(), GetParam());
  EXPECT_EQ(r.client, 0) << r.client_out;
  EXPECT_EQ(r.server, 0) << r.server_out;
}

INSTANTIATE_TEST_SUITE_P(perf, perf_size_end,
                         ::testing::Values(std::vector<std::string>{"--test", "send_lat", "-s", "65536", "-n",
                                                                    "64"},
                                           std::vector<std::string>{"--test", "write_lat", "-n", "64"},
                                           std::vector<std::string>{"--test", "write_lat", "-a", "-n", "32"}),
                         [](const auto& param_info) {
                           std::string name = param_info.param[1];
                           for (std::size_t i = 2; i < param_info.param.size(); ++i)
                             if (param_info.param[i] == "-a") name += "_all_sizes";
                           return name;
                         });

// One end is killed mid-run; the other must end with an error, not spin.
// Each case: the test, which end dies, and what the survivor waits in.
struct death {
  const char* test;
  bool kill_client;
};

class perf_peer_death : public ::testing::TestWithParam<death> {};

TEST_P(perf_peer_death, the_other_end_stops_with_an_error) {
  const death d = GetParam();
  const std::uint16_t port = test_port();
  // Enough iterations to still be running when the kill comes; an ACK
  // timeout of 69 s (-u 24), so that the QP's own retries cannot be what
  // ends the survivor: the out-of-band connection tells it.
  const std::vector<std::string> args{"--test", d.test, "-n", "5000000", "-u", "24"};
  child server(perf_cmd(0, port, args, false), true);
  child client(perf_cmd(1, port, args, true), true);
  child& victim = d.kill_client ? client : server;
  child& survivor = d.kill_client ? server : client;
  ASSERT_TRUE(survivor.wait_for_text("#bytes", 60s)) << survivor.output();
  std::this_thread::sleep_for(300ms);  // into the iterations
  ASSERT_TRUE(victim.running()) << victim.output();
  victim.signal(SIGKILL);
  EXPECT_EQ(victim.wait(10s), 128 + SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(survivor.wait(60s), 1) << survivor.output();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 20s) << survivor.output();
  const std::string& out = survivor.output();
  EXPECT_TRUE(out.find("the peer went away") != std::string::npos ||
              out.find("the peer closed the out-of-band connection") != std::string::npos)
      << out;
}

INSTANTIATE_TEST_SUITE_P(perf, perf_peer_death,
                         ::testing::Values(death{"send_lat", true}, death{"send_lat", false},
                                           death{"write_lat", true}, death{"write_lat", false},
                                           death{"read_lat", true}, death{"send_bw", true},
                                           death{"read_bw", true}, death{"write_bw", false}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.test) +
                                  (param_info.param.kill_client ? "_client_dies" : "_server_dies");
                         });

// A peer that stops answering (stopped, not dead: its out-of-band
// connection stays open) ends send_lat with the cause, the SEND's
// exhausted retries, not with the receive that the error flushed.
// Pings ask for no ACK and are acknowledged lazily, so the stop nearly
// always finds one unacknowledged.  It can also land in the instant after
// a lazy ACK covered every ping and before the pong left: then nothing is
// left to retry, and the client ends at its stall limit (a minute), as it
// must (that outcome once failed this test, which waited 30 s).
TEST(perf_two_processes, send_lat_names_the_send_error_behind_a_flushed_receive) {
  const std::uint16_t port = test_port();
  const std::vector<std::string> args{"--test", "send_lat", "-n", "5000000", "-u", "12", "-r", "1"};
  child server(perf_cmd(0, port, args, false), true);
  child client(perf_cmd(1, port, args, true), true);
  ASSERT_TRUE(client.wait_for_text("#bytes", 60s)) << client.output();
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(server.running()) << server.output();
  server.signal(SIGSTOP);
  EXPECT_EQ(client.wait(90s), 1) << client.output();
  server.signal(SIGCONT);
  server.signal(SIGKILL);
  (void)server.wait(10s);
  const std::string out = client.output();
  const bool retried = out.find("transport retry counter exceeded") != std::string::npos;
  const bool stalled = out.find("nothing happened for 60 s while waiting for") != std::string::npos;
  EXPECT_TRUE(retried || stalled) << out;
  EXPECT_EQ(out.find("Work Request Flushed Error"), std::string::npos)
      << "blamed the flushed receive: " << out;
}

TEST(perf_two_processes, a_connect_server_that_accepted_too_few_fails) {
  const std::uint16_t port = test_port();
  child server({AVERBS_CLI, "perf", "--test", "connect", "--addr",
                test_address(0) + ":" + std::to_string(port), "-p", std::to_string(port)},
               true);
  oob client = oob::connect(test_address(0), port, 30s);
  EXPECT_EQ(client.recv_word(), 1u);  // the server listens
  client.send_word(5);                // "I established 5" (it did not)
  EXPECT_EQ(server.wait(60s), 1) << server.output();
  EXPECT_NE(server.output().find("the client established 5, this side accepted only 0"), std::string::npos)
      << server.output();
}

// A connect client whose server goes away stops at once, saying so: its
// connects to a dead server would each time out (about 3 s), one after
// another, and the run go on for as long as it has connects left.  The
// "server" here greets and closes; nobody answers the connects.
TEST(perf_two_processes, a_connect_client_stops_when_its_server_goes_away) {
  const std::uint16_t port = test_port();
  oob l = oob::listen(test_address(0), static_cast<std::uint16_t>(port + 1));
  child client(perf_cmd(1, port, {"--test", "connect", "-n", "100000"}, true), true);
  {
    oob server = l.accept(30s);
    server.send_word(1);  // ready, then gone
  }
  const auto closed = std::chrono::steady_clock::now();
  EXPECT_EQ(client.wait(60s), 1) << client.output();
  EXPECT_LT(std::chrono::steady_clock::now() - closed, 10s) << client.output();
  EXPECT_NE(client.output().find("the server went away"), std::string::npos) << client.output();
}

// A client of another test (its first word is its greeting's magic) is
// not taken for a count of connections.
TEST(perf_two_processes, a_connect_server_tells_a_client_of_another_test) {
  const std::uint16_t port = test_port();
  child server({AVERBS_CLI, "perf", "--test", "connect", "--addr",
                test_address(0) + ":" + std::to_string(port), "-p", std::to_string(port)},
               true);
  oob client = oob::connect(test_address(0), port, 30s);
  EXPECT_EQ(client.recv_word(), 1u);
  client.send_word(0x4156455242535046ull);  // eight bytes of a greeting
  EXPECT_EQ(server.wait(60s), 1) << server.output();
  EXPECT_NE(server.output().find("is it running --test connect?"), std::string::npos) << server.output();
}

// A server name with two addresses, the first refusing: the client goes on
// to the second (it tried the first alone until its 30 s were up).  The
// name exists only in a network namespace of the test's own: `ip netns
// exec` puts /etc/netns/NAME/hosts over /etc/hosts for what it runs.
TEST(perf_two_processes, a_client_tries_every_address_of_the_server_name) {
  if (::geteuid() != 0) AVERBS_SKIP_FOR_ENVIRONMENT("network namespaces need root");
  const std::uint16_t port = test_port();
  const std::string ns = "avb_h" + std::to_string(::getpid() % 100000) + "_" + std::to_string(port);
  const std::string dir = "/etc/netns/" + ns;
  std::string why;
  if (!sh("ip netns add " + ns, &why)) AVERBS_SKIP_FOR_ENVIRONMENT("ip netns add failed here: " << why);
  struct cleanup {
    std::string ns, dir;
    ~cleanup() {
      sh("rm -rf " + dir);
      sh("ip netns del " + ns);
    }
  } done{ns, dir};
  ASSERT_TRUE(sh("ip -n " + ns + " link set lo up"));
  ASSERT_TRUE(sh("mkdir -p " + dir));
  std::ofstream(dir + "/hosts") << "::1 twohomed\n127.0.0.1 twohomed\n";
  // The server listens on 127.0.0.1 only: ::1, first in the answer, refuses.
  child order({"ip", "netns", "exec", ns, "getent", "ahosts", "twohomed"});
  ASSERT_EQ(order.wait(30s), 0) << order.output();
  ASSERT_EQ(order.output().rfind("::1 ", 0), 0u) << "the resolver puts ::1 first:\n" << order.output();
  const std::vector<std::string> run{"--test", "write_bw", "-s", "4096",
                                     "-n",     "100",      "-p", std::to_string(port + 1)};
  std::vector<std::string> sv{"ip",       "netns", "exec",   ns,
                              AVERBS_CLI, "perf",  "--addr", "127.0.0.1:" + std::to_string(port)};
  std::vector<std::string> cv{"ip",       "netns", "exec",   ns,
                              AVERBS_CLI, "perf",  "--addr", "127.0.0.2:" + std::to_string(port)};
  sv.insert(sv.end(), run.begin(), run.end());
  cv.insert(cv.end(), run.begin(), run.end());
  cv.push_back("twohomed");
  child server(sv, true);
  child client(cv, true);
  EXPECT_EQ(client.wait(60s), 0) << client.output();
  EXPECT_EQ(server.wait(30s), 0) << server.output();
  EXPECT_NE(client.output().find(" 4096       100 "), std::string::npos) << client.output();
}

// -D: the sender runs for the time given; the receiver of a send_bw counts
// what came, and finds every SEND the sender completed.
TEST(perf_two_processes, a_timed_send_bw_receiver_counts_what_the_sender_sent) {
  const std::vector<std::string> args{"--test", "send_bw", "-D", "1", "-s", "4096"};
  const auto r = run_perf(args, args);
  ASSERT_EQ(r.client, 0) << r.client_out;
  ASSERT_EQ(r.server, 0) << r.server_out;
  auto row = [](const std::string& out) {
    std::size_t iters = 0;
    double peak = -1;
    const auto at = out.find("\n 4096 ");
    if (at == std::string::npos || std::sscanf(out.c_str() + at, " 4096 %zu %lf", &iters, &peak) != 2)
      return std::pair{std::size_t{0}, -1.0};
    return std::pair{iters, peak};
  };
  const auto [sent, sent_peak] = row(r.client_out);
  const auto [got, got_peak] = row(r.server_out);
  EXPECT_GT(sent, 0u) << r.client_out;
  EXPECT_EQ(got, sent) << r.server_out << r.client_out;
  EXPECT_EQ(sent_peak, 0.0);  // no peak in a timed run, as perftest
  EXPECT_EQ(got_peak, 0.0);
}

// perftest's -F, -i 1 and -x 0, common in its command lines, work; a GID
// index the device does not have is an error that says so.
TEST(perf_two_processes, perftest_port_gid_and_cpu_frequency_flags) {
  const std::vector<std::string> args{"--test", "write_bw", "-n", "100", "-F", "-i", "1", "-x", "0"};
  const auto r = run_perf(args, args);
  EXPECT_EQ(r.client, 0) << r.client_out;
  EXPECT_EQ(r.server, 0) << r.server_out;
  EXPECT_NE(r.client_out.find(" 65536      100 "), std::string::npos) << r.client_out;
  child server(perf_cmd(0, test_port(), {"--test", "write_bw", "-x", "5"}, false), true);
  EXPECT_EQ(server.wait(30s), 1) << server.output();
  EXPECT_NE(server.output().find("GID index 5 of port 1 is empty"), std::string::npos) << server.output();
  child loopback({AVERBS_CLI, "perf", "--test", "send_bw", "-n", "100", "-x", "5"}, true);
  EXPECT_EQ(loopback.wait(30s), 1) << loopback.output();
  EXPECT_NE(loopback.output().find("GID index 5 of port 1 is empty"), std::string::npos) << loopback.output();
  // The connect test too (it used GID index 0 whatever -x said).
  child connect({AVERBS_CLI, "perf", "--test", "connect", "-n", "5", "-x", "5"}, true);
  EXPECT_EQ(connect.wait(30s), 1) << connect.output();
  EXPECT_NE(connect.output().find("GID index 5 of port 1 is empty"), std::string::npos) << connect.output();
}

TEST(perf_loopback, a_timed_run_counts_what_it_sent) {
  child c({AVERBS_CLI, "perf", "--test", "send_bw", "-D", "1", "-s", "4096"}, true);
  ASSERT_EQ(c.wait(60s), 0) << c.output();
  const auto at = c.output().find("\n 4096 ");
  ASSERT_NE(at, std::string::npos) << c.output();
  std::size_t iters = 0;
  double peak = -1, avg = -1;
  ASSERT_EQ(std::sscanf(c.output().c_str() + at, " 4096 %zu %lf %lf", &iters, &peak, &avg), 3) << c.output();
  EXPECT_GT(iters, 0u);
  EXPECT_EQ(iters % 100, 0u) << "the last message sent is a signaled one (every 100th)";
  EXPECT_EQ(peak, 0.0);
  EXPECT_GT(avg, 0.0);
}

// --- options -----------------------------------------------------------------

TEST(perf_options, the_last_test_named_counts) {
  // As every other option: `--test connect --test send_lat` runs send_lat.
  child c({AVERBS_CLI, "perf", "--test", "connect", "--test", "send_lat", "-n", "5"}, true);
  EXPECT_EQ(c.wait(30s), 0) << c.output();
  EXPECT_NE(c.output().find("Send Latency Test"), std::string::npos) << c.output();
}

// perftest's command lines: getopt_long's "--size=N" and "-sN", its long
// name --inline_size, and hexadecimal numbers (strtol base 0).
TEST(perf_options, perftest_option_forms_are_accepted) {
  child c(
      {AVERBS_CLI, "perf", "--test=write_bw", "--size=0x1000", "-n7", "-t16", "--inline_size=0", "-Q", "0x4"},
      true);
  ASSERT_EQ(c.wait(60s), 0) << c.output();
  std::size_t iters = 0;
  const auto at = c.output().find("\n 4096 ");
  ASSERT_NE(at, std::string::npos) << c.output();
  ASSERT_EQ(std::sscanf(c.output().c_str() + at, " 4096 %zu", &iters), 1) << c.output();
  EXPECT_EQ(iters, 7u);
  // Octal too, as strtol base 0 reads it; -u 0 (no ACK timeout) as perftest allows.
  child octal({AVERBS_CLI, "perf", "--test=write_bw", "-s", "010", "-n", "5", "-u", "0"}, true);
  ASSERT_EQ(octal.wait(60s), 0) << octal.output();
  EXPECT_NE(octal.output().find("\n 8 "), std::string::npos) << "-s 010 is 8 bytes: " << octal.output();
  child bad({AVERBS_CLI, "perf", "--test=write_bw", "-s0x"}, true);
  EXPECT_EQ(bad.wait(30s), 2) << bad.output();
  EXPECT_NE(bad.output().find("-s: '0x' is not a number"), std::string::npos) << bad.output();
  // A flag takes no value: "--counters=1" is refused whole, its "1" not
  // taken for a server to connect to.
  child flag({AVERBS_CLI, "perf", "--test=write_bw", "--counters=1"}, true);
  EXPECT_EQ(flag.wait(30s), 2) << flag.output();
  EXPECT_NE(flag.output().find("unknown option '--counters=1'"), std::string::npos) << flag.output();
}

TEST(cli_options, bad_numbers_are_usage_errors_in_every_command) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"nop", "--delay-us", "5ms"}, "--delay-us: '5ms' is not a number"},
      {{"nop", "--value", "-1"}, "--value: '-1' is not an unsigned 64-bit number"},
      {{"nop", "--delay-us", "10000000000000000"}, "is not a number from 0 to 3600000000"},
      {{"devices", "-i", "0"}, "--ib-port: '0' is not a port number"},
      {{"devices", "-i", "abc"}, "--ib-port: 'abc' is not a port number"},
      {{"devices", "--ib-device=x"}, "unknown option '--ib-device=x'"},
      // An empty name is no name (it used to list every device).
      {{"devices", "--ib-dev="}, "--ib-dev needs a device name"},
      // --addr creates a device, which cannot be the embedded one.
      {{"perf", "--test", "send_lat", "-d", "embedded", "--addr", "127.0.0.2"},
       "name it other than 'embedded'"},
      {{"perf", "--test", "send_lat", "127.0.0.2", "127.0.0.3"}, "one server HOST only"},
      // An empty --addr is no address (it ran in one process, as without one).
      {{"perf", "--test", "send_lat", "--addr="}, "--addr needs an address"},
      // Nor is an empty -d a name (it ran on the embedded device), or an
      // empty --faults a specification (it ran without faults or a link).
      {{"perf", "--test", "send_lat", "-d", ""}, "-d needs a device name"},
      {{"perf", "--test", "send_lat", "--faults", ""}, "--faults needs a specification"},
      // What --addr and --faults are refused for names them, not the API
      // beneath ("soft_device: ...").
      {{"perf", "--test", "send_lat", "--addr", "224.0.0.1"},
       "--addr 224.0.0.1: address '224.0.0.1' is a multicast or broadcast address"},
      {{"perf", "--test", "send_lat", "--addr", test_address(0) + ":" + std::to_string(test_port()),
        "--faults", "drop=0.1,seed=x"},
       "--faults: bad value for seed: 'x'"},
      // An option of the other kind of test is refused (it was ignored).
      {{"perf", "--test", "connect", "-s", "4096"}, "-s does not apply to --test connect"},
      {{"perf", "--test", "connect", "-Q", "4"}, "-Q does not apply to --test connect"},
      {{"perf", "--test", "send_lat", "-w", "8"}, "-w applies to --test connect only"},
      {{"perf", "--test", "write_bw", "--no-verify"}, "--no-verify applies to --test connect only"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv{AVERBS_CLI};
    argv.insert(argv.end(), args.begin(), args.end());
    child c(argv, true);
    EXPECT_EQ(c.wait(30s), 2) << args.back() << ": " << c.output();
    EXPECT_NE(c.output().find(message), std::string::npos) << c.output();
  }
}

// `averbs devices` with a devices.conf shared by a server and a client
// lists another process's device (its address in use) and another host's
// (not an address of this one) without failing: they are not opened here.
// A broken line still fails, saying why.
TEST(cli_options, devices_lists_another_processes_and_another_hosts_devices_without_failing) {
  const std::uint16_t port = test_port();
  const std::string path = "/tmp/averbs_devices_cli_" + std::to_string(::getpid()) + ".conf";
  {
    std::ofstream f(path);
    f << "in_use    " << test_address(0) << ":" << port << "\n"
      << "elsewhere 10.255.255.1:" << port << "\n"
      << "mine      " << test_address(1) << ":" << port << "\n";
  }
  const int squat = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, "10.255.255.1", &sa.sin_addr);
  if (::bind(squat, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    ::close(squat);
    std::remove(path.c_str());
    // (A host setting, not something CI lacks: a skip there too.)
    GTEST_SKIP()
        << "10.255.255.1 can be bound here (net.ipv4.ip_nonlocal_bind): no other host's address to list";
  }
  ::inet_pton(AF_INET, test_address(0).c_str(), &sa.sin_addr);
  ASSERT_EQ(::bind(squat, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ::setenv("AVERBS_CONFIG", path.c_str(), 1);
  child c({AVERBS_CLI, "devices"}, true);
  EXPECT_EQ(c.wait(30s), 0) << c.output();
  const std::string& out = c.output();
  EXPECT_NE(out.find("hca_id:\tin_use\n\t(not opened: "), std::string::npos) << out;
  EXPECT_NE(out.find("hca_id:\telsewhere\n\t(not opened: "), std::string::npos) << out;
  EXPECT_NE(out.find("hca_id:\tmine\n\ttransport:"), std::string::npos) << out;
  {
    std::ofstream f(path, std::ios::app);
    f << "broken " << test_address(2) << ":" << port << " colour=red\n";
  }
  child bad({AVERBS_CLI, "devices"}, true);
  EXPECT_EQ(bad.wait(30s), 1) << bad.output();
  EXPECT_NE(bad.output().find("unknown option 'colour=red'"), std::string::npos) << bad.output();
  ::unsetenv("AVERBS_CONFIG");
  ::close(squat);
  std::remove(path.c_str());
}

TEST(cli_options, a_device_named_wrongly_by_the_environment_says_why) {
  ::setenv("AVERBS_DEVICES", "envbad@127.0.0.2:70000", 1);
  child c({AVERBS_CLI, "devices", "-d", "envbad"}, true);
  ::unsetenv("AVERBS_DEVICES");
  EXPECT_EQ(c.wait(30s), 255) << c.output();
  EXPECT_NE(c.output().find("bad port '70000'"), std::string::npos) << c.output();
}

// A device whose address another socket holds fails naming the device,
// its source and its address, not with the bare "bind: Address already in
// use" of the socket call.
TEST(cli_options, a_device_whose_address_is_taken_names_itself_and_the_address) {
  const std::uint16_t port = test_port();
  const int squat = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, test_address(0).c_str(), &sa.sin_addr);
  ASSERT_EQ(::bind(squat, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  const std::string at = test_address(0) + ":" + std::to_string(port);
  ::setenv("AVERBS_DEVICES", ("envbusy@" + at).c_str(), 1);
  child c({AVERBS_CLI, "devices", "-d", "envbusy"}, true);
  ::unsetenv("AVERBS_DEVICES");
  EXPECT_EQ(c.wait(30s), 255) << c.output();
  EXPECT_NE(c.output().find("AVERBS_DEVICES: device 'envbusy' at " + at + ": bind: Address already in use"),
            std::string::npos)
      << c.output();
  ::close(squat);
}

// A source that cannot be read lists none of its devices; `averbs
// devices` says why on stderr and ends with status 1 after what it found
// (it listed "embedded" alone and ended 0).
TEST(cli_options, devices_warns_of_a_source_it_cannot_read) {
  ::setenv("AVERBS_DEVICES", "udp0=127.0.0.2", 1);
  child listed({AVERBS_CLI, "devices", "-l"}, true);
  child shown({AVERBS_CLI, "devices"}, true);
  child one({AVERBS_CLI, "devices", "-d", "embedded"}, true);
  ::unsetenv("AVERBS_DEVICES");
  for (child* c : {&listed, &shown, &one}) {
    EXPECT_EQ(c->wait(30s), 1) << c->output();
    EXPECT_NE(
        c->output().find("averbs devices: warning: AVERBS_DEVICES: 'udp0=127.0.0.2' is not name@address"),
        std::string::npos)
        << c->output();
    EXPECT_NE(c->output().find("embedded"), std::string::npos) << "what was found is still listed";
  }
}

// A device that does not exist is named in the message.
TEST(cli_options, a_missing_device_is_named) {
  child missing({AVERBS_CLI, "perf", "--test", "send_lat", "-d", "no_such_device"}, true);
  EXPECT_EQ(missing.wait(30s), 1) << missing.output();
  EXPECT_NE(missing.output().find("no device named 'no_such_device'"), std::string::npos) << missing.output();
}

// A command that cannot even make its context (no descriptors left) says
// so and exits 1, where it used to abort.
TEST(cli_options, no_descriptors_is_a_message_not_an_abort) {
  if (sanitized_build)
    GTEST_SKIP() << "the sanitizer runtime needs descriptors of its own (a pipe to check memory before "
                    "reporting), which a limit of 5 takes away: it reports a false invalid-vptr error";
  for (const char* cmd : {"nop", "devices"}) {
    child starved({"/bin/sh", "-c", std::string("ulimit -n 5 && exec ") + AVERBS_CLI + " " + cmd}, true);
    EXPECT_EQ(starved.wait(30s), 1) << cmd << ": " << starved.output();
    EXPECT_NE(starved.output().find("Too many open files"), std::string::npos)
        << cmd << ": " << starved.output();
  }
}

TEST(perf_options, out_of_range_values_are_usage_errors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--test", "write_bw", "-t", "0"}, "-t: '0' is not a number from 1 to 15000"},
      {{"--test", "write_bw", "-t", "15001"}, "-t: '15001' is not a number from 1 to 15000"},
      {{"--test", "write_bw", "-r", "0"}, "-r: '0' is not a number from 1 to 15000"},
      {{"--test", "write_bw", "-Q", "2000"}, "-Q: '2000' is not a number from 1 to 1024"},
      {{"--test", "write_bw", "-I", "600"}, "-I: '600' is not a number from 0 to 512"},
      {{"--test", "write_bw", "--addr", "127.0.0.2:0"}, "--addr '127.0.0.2:0' is not an address[:port]"},
      {{"--test", "write_bw", "--no-icrc"}, "--no-icrc needs --addr"},
      {{"--test", "write_bw", "--no-gso"}, "--no-gso needs --addr"},
      {{"--test", "connect", "--sync", "0"}, "--sync: '0' is not a number from 1 to"},
      {{"--test", "write_bw", "-n", "99999999999999999999"}, "-n: '99999999999999999999' is not a number"},
      {{"--test", "write_bw", "-s", "1x"}, "-s: '1x' is not a number"},
      {{"--test", "atomic_bw", "-s", "64"}, "atomic tests move 8 bytes"},
      {{"--test", "atomic_lat", "-a"}, "atomic tests move 8 bytes"},
      {{"--test", "write_bw", "-i", "2"}, "-i: '2' is not a number from 1 to 1"},
      {{"--test", "send_lat", "-D", "2"},
       "-D runs a bandwidth test for a time, at one size: not with this test"},
      {{"--test", "write_bw", "-D", "2", "-n", "100"}, "not with -n"},
      {{"--test", "write_bw", "-x", "256"}, "-x: '256' is not a number from 0 to 255"},
      // Every connection stays open, two QPs each on a loopback device:
      // refused before the handles for them are allocated.
      {{"--test", "connect", "-n", "600000"}, "need more QPs than device 'embedded' has (at most 524280"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv{AVERBS_CLI, "perf"};
    argv.insert(argv.end(), args.begin(), args.end());
    child c(argv, true);
    EXPECT_EQ(c.wait(30s), 2) << args.back() << ": " << c.output();
    EXPECT_NE(c.output().find(message), std::string::npos) << c.output();
  }
}

}  // namespace
}  // namespace averbs::test
