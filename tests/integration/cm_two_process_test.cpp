// SPDX-License-Identifier: MIT
// The connection manager between two processes over UDP on their own
// loopback addresses: 10,000 connections (`averbs perf --test connect`,
// every connection carrying one SEND), a disconnect the other process
// hears, and a peer that dies (SIGKILL) in the middle of the handshake or
// after it.
#include "process.hpp"
#include "udp_pair.hpp"

#include <string>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> peer(const std::string& addr, std::uint16_t port, std::vector<std::string> more) {
  std::vector<std::string> v{AVERBS_CM_PEER, "--addr", addr, "--port", std::to_string(port)};
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

bool has_line(const std::string& out, const std::string& line) {
  return out.find(line + "\n") != std::string::npos;
}

TEST(cm_two_processes, ten_thousand_connections) {
  const std::uint16_t port = test_port();
  const std::string a = test_address(0), b = test_address(1);
  // --counters: should an exchange get lost, the output says where.
  child server({AVERBS_CLI, "perf", "--test", "connect", "--addr", a + ":" + std::to_string(port), "-p",
                std::to_string(port), "--counters"});
  ASSERT_TRUE(server.started());
  ASSERT_TRUE(server.wait_for_line(" Server at " + a + ":" + std::to_string(port) + ", waiting for the client", 30s))
      << server.output();
  // An ACK timeout of 268 ms (-u 16), not 67: an ASan build on a busy
  // machine answers 256 SENDs to 10,000 QPs slower than 67 ms at times,
  // and the retransmissions that then pile up overflowed the client's
  // socket until 434 SENDs ran out of retries (one CI run).  The test is
  // about the connections, not the timer.
  child client({AVERBS_CLI, "perf", "--test", "connect", "--addr", b + ":" + std::to_string(port), "-p",
                std::to_string(port), "-n", "10000", "--sync", "500", "-u", "16", "--counters", a});
  // 30 + 180 + 60 s stay under ctest's 300 s, so a slow run fails here
  // with both outputs instead of being killed without them.
  const int c = client.wait(180s);
  const int s = server.wait(60s);
  EXPECT_EQ(c, 0) << client.output();
  EXPECT_EQ(s, 0) << server.output();
  // The client verified each connection with a SEND; the server saw them all.
  EXPECT_NE(client.output().find(" 10000         pipelined "), std::string::npos) << client.output();
  EXPECT_NE(client.output().find(" 500           synchronous "), std::string::npos) << client.output();
  EXPECT_NE(server.output().find("server: 10500 accepted, 10000 SENDs received"), std::string::npos)
      << server.output() << client.output();
}

TEST(cm_two_processes, a_disconnect_reaches_the_other_process) {
  const std::uint16_t port = test_port();
  const std::string a = test_address(0), b = test_address(1);
  child server(peer(a, port, {"--serve"}));
  ASSERT_TRUE(server.wait_for_line("ready", 30s)) << server.output();
  child client(peer(b, port, {"--connect", a, "--disconnect-after-ms", "50"}));
  EXPECT_EQ(client.wait(60s), 0);
  EXPECT_EQ(server.wait(60s), 0);
  EXPECT_TRUE(has_line(client.output(), "connect: ok")) << client.output();
  EXPECT_TRUE(has_line(client.output(), "notify: ok")) << client.output();
  EXPECT_TRUE(has_line(server.output(), "accept: ok")) << server.output();
  EXPECT_TRUE(has_line(server.output(), "notify: ok")) << server.output();
}

TEST(cm_two_processes, a_client_dying_mid_handshake_times_the_accept_out) {
  const std::uint16_t port = test_port();
  const std::string a = test_address(0), b = test_address(1);
  child server(peer(a, port, {"--serve", "--accept-delay-ms", "100"}));
  ASSERT_TRUE(server.wait_for_line("ready", 30s)) << server.output();
  child client(peer(b, port, {"--connect", a, "--crash-on", "req"}));
  EXPECT_EQ(client.wait(60s), 128 + SIGKILL);
  EXPECT_EQ(server.wait(60s), 0);
  EXPECT_TRUE(has_line(server.output(), "requested")) << server.output();
  EXPECT_TRUE(has_line(server.output(), "accept: timed_out")) << server.output();
}

TEST(cm_two_processes, a_server_dying_mid_handshake_times_the_connect_out) {
  const std::uint16_t port = test_port();
  const std::string a = test_address(0), b = test_address(1);
  child server(peer(a, port, {"--serve", "--crash-on", "request"}));
  ASSERT_TRUE(server.wait_for_line("ready", 30s)) << server.output();
  child client(peer(b, port, {"--connect", a}));
  EXPECT_EQ(client.wait(60s), 0);
  EXPECT_EQ(server.wait(60s), 128 + SIGKILL);
  EXPECT_TRUE(has_line(client.output(), "connect: timed_out")) << client.output();
}

TEST(cm_two_processes, a_client_dying_after_establishment_resets_the_server_side) {
  const std::uint16_t port = test_port();
  const std::string a = test_address(0), b = test_address(1);
  child server(peer(a, port, {"--serve"}));
  ASSERT_TRUE(server.wait_for_line("ready", 30s)) << server.output();
  child client(peer(b, port, {"--connect", a, "--crash-on", "established"}));
  EXPECT_EQ(client.wait(60s), 128 + SIGKILL);
  EXPECT_EQ(server.wait(60s), 0);
  EXPECT_TRUE(has_line(server.output(), "accept: ok")) << server.output();
  EXPECT_TRUE(has_line(server.output(), "notify: connection_reset")) << server.output();
}

TEST(cm_two_processes, a_server_dying_after_establishment_resets_the_client_side) {
  const std::uint16_t port = test_port();
  const std::string a = test_address(0), b = test_address(1);
  child server(peer(a, port, {"--serve", "--crash-on", "established"}));
  ASSERT_TRUE(server.wait_for_line("ready", 30s)) << server.output();
  child client(peer(b, port, {"--connect", a}));
  EXPECT_EQ(server.wait(60s), 128 + SIGKILL);
  EXPECT_EQ(client.wait(60s), 0);
  EXPECT_TRUE(has_line(client.output(), "connect: ok")) << client.output();
  EXPECT_TRUE(has_line(client.output(), "notify: connection_reset")) << client.output();
}

}  // namespace
}  // namespace averbs::test
