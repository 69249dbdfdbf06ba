// SPDX-License-Identifier: MIT
// The example programs do what their comments say: examples/rc_pingpong as
// a server and a client process, each with its own device and address.
#include "process.hpp"
#include "udp_pair.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace averbs::test {
namespace {

using namespace std::chrono_literals;

TEST(examples, rc_pingpong_runs_between_two_processes) {
  const std::string port = std::to_string(test_port()), cm_port = std::to_string(test_port() + 1);
  child server({AVERBS_RC_PINGPONG, "-n", "200", "-p", cm_port, test_address(0) + ":" + port}, true);
  ASSERT_TRUE(server.wait_for_text("listening on", 30s)) << server.output();
  child client(
      {AVERBS_RC_PINGPONG, "-n", "200", "-p", cm_port, test_address(1) + ":" + port, test_address(0)}, true);
  EXPECT_EQ(client.wait(60s), 0) << client.output();
  EXPECT_EQ(server.wait(60s), 0) << server.output();
  EXPECT_NE(client.output().find("200 round trips of 64 bytes"), std::string::npos) << client.output();
  EXPECT_NE(server.output().find("200 round trips of 64 bytes"), std::string::npos) << server.output();
}

TEST(examples, rc_pingpong_refuses_a_bad_command_line) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{},
                                               {"not-an-address"},
                                               {"127.0.0.2", "127.0.0.3", "127.0.0.4"},
                                               {"-n", "0", "127.0.0.2"},
                                               // a port on the server would be the CM's: -p gives it
                                               {"127.0.0.3", "127.0.0.2:4791"}}) {
    std::vector<std::string> argv{AVERBS_RC_PINGPONG};
    argv.insert(argv.end(), args.begin(), args.end());
    child c(argv, true);
    EXPECT_EQ(c.wait(30s), 2) << c.output();
    EXPECT_NE(c.output().find("usage: rc_pingpong"), std::string::npos) << c.output();
  }
}

}  // namespace
}  // namespace averbs::test
