// SPDX-License-Identifier: MIT
// Two processes, each with its own device on its own address, exchange QP
// numbers, PSNs, GIDs and keys over TCP and run every operation (peer.cpp).
// The same over IPv6, over faulty links, and between two hosts: two
// network namespaces joined by a veth pair (root only).
#include "environment.hpp"
#include "process.hpp"
#include "udp_pair.hpp"

#include <unistd.h>

#include <cstdlib>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;

struct run_result {
  int server = -2, client = -2;
  std::string server_out, client_out;
};

run_result run_pair(const std::vector<std::string>& server_prefix, const std::string& server_addr,
                    const std::vector<std::string>& client_prefix, const std::string& client_addr,
                    const std::string& connect_to, std::uint16_t oob_port, const std::string& faults = "") {
  run_result r;
  auto argv = [&](const std::vector<std::string>& prefix, const std::string& addr, bool client) {
    std::vector<std::string> v = prefix;
    v.insert(v.end(), {AVERBS_PEER, "--addr", addr, "--oob-port", std::to_string(oob_port)});
    if (client) v.insert(v.end(), {"--connect", connect_to});
    if (!faults.empty()) v.insert(v.end(), {"--faults", faults});
    return v;
  };
  child server(argv(server_prefix, server_addr, false));
  if (!server.started() || !server.wait_for_line("listening", 30s)) {
    r.server_out = server.output();
    return r;
  }
  child client(argv(client_prefix, client_addr, true));
  r.client = client.wait(120s);
  r.server = server.wait(30s);
  r.client_out = client.output();
  r.server_out = server.output();
  return r;
}

std::string with_port(const std::string& addr, std::uint16_t port) { return addr + ":" + std::to_string(port); }

TEST(two_processes, every_operation_between_two_processes) {
  const std::uint16_t port = test_port();
  auto r = run_pair({}, with_port(test_address(0), port), {}, with_port(test_address(1), port), test_address(0),
                    static_cast<std::uint16_t>(port + 1));
  EXPECT_EQ(r.client, 0) << r.client_out;
  EXPECT_EQ(r.server, 0) << r.server_out;
}

// The number of faults a peer's last line says its link injected.
std::uint64_t faults_injected(const std::string& out) {
  const auto at = out.find("faults injected ");
  return at == std::string::npos ? 0 : std::strtoull(out.c_str() + at + 16, nullptr, 10);
}

TEST(two_processes, every_operation_over_lossy_duplicating_reordering_links) {
  const std::uint16_t port = test_port();
  auto r = run_pair({}, with_port(test_address(0), port), {}, with_port(test_address(1), port), test_address(0),
                    static_cast<std::uint16_t>(port + 1), "drop=0.05,dup=0.02,reorder=0.05,corrupt=0.02,seed=5");
  EXPECT_EQ(r.client, 0) << r.client_out;
  EXPECT_EQ(r.server, 0) << r.server_out;
  // The faults were there (a --faults the peers ignored would pass too).
  EXPECT_GT(faults_injected(r.client_out), 0u) << r.client_out;
  EXPECT_GT(faults_injected(r.server_out), 0u) << r.server_out;
}

// Two hosts: network namespaces joined by a veth pair, each with its own
// address; averbs' fault injection stands in for netem (not in this kernel).
class two_hosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) AVERBS_SKIP_FOR_ENVIRONMENT("network namespaces need root");
    const std::string id = std::to_string(::getpid() % 100000) + "_" + std::to_string(test_port() % 1000);
    a_ = "avb_a" + id;
    b_ = "avb_b" + id;
    const int net = 1 + test_port() % 250;
    addr_a_ = "10.231." + std::to_string(net) + ".1";
    addr_b_ = "10.231." + std::to_string(net) + ".2";
    v6_a_ = "fd42:" + std::to_string(net) + "::1";
    v6_b_ = "fd42:" + std::to_string(net) + "::2";
    const std::string va = "va" + id, vb = "vb" + id;
    std::string why;
    if (!sh("ip netns add " + a_, &why)) AVERBS_SKIP_FOR_ENVIRONMENT("ip netns add failed here: " << why);
    created_a_ = true;
    if (!sh("ip netns add " + b_, &why)) AVERBS_SKIP_FOR_ENVIRONMENT("ip netns add failed here: " << why);
    created_ = true;
    ASSERT_TRUE(sh("ip link add " + va + " netns " + a_ + " type veth peer name " + vb + " netns " + b_));
    ASSERT_TRUE(sh("ip -n " + a_ + " addr add " + addr_a_ + "/24 dev " + va));
    ASSERT_TRUE(sh("ip -n " + b_ + " addr add " + addr_b_ + "/24 dev " + vb));
    // nodad: usable at once, without waiting for duplicate detection.
    ASSERT_TRUE(sh("ip -n " + a_ + " addr add " + v6_a_ + "/64 dev " + va + " nodad"));
    ASSERT_TRUE(sh("ip -n " + b_ + " addr add " + v6_b_ + "/64 dev " + vb + " nodad"));
    for (const auto& [ns, dev] : {std::pair{a_, va}, std::pair{b_, vb}}) {
      ASSERT_TRUE(sh("ip -n " + ns + " link set " + dev + " up"));
      ASSERT_TRUE(sh("ip -n " + ns + " link set lo up"));
    }
  }
  void TearDown() override {
    if (created_a_) sh("ip netns del " + a_);
    if (created_) sh("ip netns del " + b_);
  }
  run_result run(const std::string& faults, bool v6 = false) {
    const std::uint16_t port = test_port();
    if (v6)
      return run_pair({"ip", "netns", "exec", a_}, "[" + v6_a_ + "]:" + std::to_string(port),
                      {"ip", "netns", "exec", b_}, "[" + v6_b_ + "]:" + std::to_string(port), v6_a_,
                      static_cast<std::uint16_t>(port + 1), faults);
    return run_pair({"ip", "netns", "exec", a_}, with_port(addr_a_, port), {"ip", "netns", "exec", b_},
                    with_port(addr_b_, port), addr_a_, static_cast<std::uint16_t>(port + 1), faults);
  }
  std::string a_, b_, addr_a_, addr_b_, v6_a_, v6_b_;
  bool created_a_ = false, created_ = false;  // a_, and both
};

TEST_F(two_hosts, every_operation_between_two_namespaces) {
  auto r = run("");
  EXPECT_EQ(r.client, 0) << r.client_out;
  EXPECT_EQ(r.server, 0) << r.server_out;
}

TEST_F(two_hosts, every_operation_over_ipv6_between_two_namespaces) {
  auto r = run("", true);
  EXPECT_EQ(r.client, 0) << r.client_out;
  EXPECT_EQ(r.server, 0) << r.server_out;
}

TEST_F(two_hosts, every_operation_between_two_namespaces_with_faults) {
  auto r = run("drop=0.05,dup=0.02,reorder=0.05,corrupt=0.02,seed=9");
  EXPECT_EQ(r.client, 0) << r.client_out;
  EXPECT_EQ(r.server, 0) << r.server_out;
  EXPECT_GT(faults_injected(r.client_out), 0u) << r.client_out;
  EXPECT_GT(faults_injected(r.server_out), 0u) << r.server_out;
}

// averbs perf takes the port's active MTU, as perftest does: over a veth
// of MTU 1500 that is 1024 (rxe's choice for such a link), and 4096 asked
// for is lowered to it with perftest's message.  (It took 4096 whatever the
// link: every full packet was too long for it, and write_bw ended in
// "transport retry counter exceeded".)
TEST_F(two_hosts, perf_over_a_1500_byte_link_uses_the_ports_active_mtu) {
  const std::uint16_t port = test_port();
  int round = 0;
  for (const std::vector<std::string>& extra : {std::vector<std::string>{}, std::vector<std::string>{"-m", "4096"}}) {
    const std::string oob = std::to_string(port + 2 + round++);
    auto argv = [&](const std::string& ns, const std::string& addr, bool client) {
      std::vector<std::string> v{"ip",    "netns", "exec", ns,   AVERBS_CLI, "perf", "--test", "write_bw",
                                 "--addr", addr,   "-p",   oob,  "-s",       "65536", "-n",    "200"};
      v.insert(v.end(), extra.begin(), extra.end());
      if (client) v.push_back(addr_a_);
      return v;
    };
    child server(argv(a_, with_port(addr_a_, port), false));
    ASSERT_TRUE(server.started());
    child client(argv(b_, with_port(addr_b_, port), true));
    const int c = client.wait(60s);
    const int s = server.wait(30s);
    const std::string out = client.output();
    EXPECT_EQ(c, 0) << out;
    EXPECT_EQ(s, 0) << server.output();
    EXPECT_NE(out.find(" Mtu             : 1024[B]"), std::string::npos) << out;
    EXPECT_NE(out.find(" 65536      200 "), std::string::npos) << "no bandwidth row:\n" << out;
    if (!extra.empty()) {
      EXPECT_NE(out.find("Changing to active mtu - 1024"), std::string::npos) << out;
    }
  }
}

}  // namespace
}  // namespace averbs::test
