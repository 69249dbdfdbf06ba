// SPDX-License-Identifier: MIT
// The example programs do what their comments say: examples/rc_pingpong as
// a server and a client process, each with its own device and address;
// examples/async_tour in one thread, through every completion token.
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

// One thread, two devices: each token delivers, the connection made by
// callbacks and a coroutine carries both sides' private data and a SEND,
// and the disconnect reaches both QPs.
TEST(examples, async_tour_connects_in_one_thread_through_every_token) {
  const std::string port = std::to_string(test_port()), cm_port = std::to_string(test_port() + 1);
  child tour({AVERBS_ASYNC_TOUR, "-p", cm_port, test_address(0) + ":" + port, test_address(1) + ":" + port},
             true);
  ASSERT_EQ(tour.wait(60s), 0) << tour.output();
  const std::string& out = tour.output();
  for (const char* line :
       {"1. use_request: opened tour_server", "2. bind_port: key 2, opened tour_client",
        "3. callback: a protection domain on tour_server",
        "4. use_future: a protection domain on tour_client",
        "5. server, by callbacks: accepted; the client said 'hello from the client'",
        "client, in a coroutine: connected; the server said 'welcome, from the server'",
        "6. the server received 'a SEND from the client'",
        "7. client: disconnected (QP in ERR); server: the client disconnected (QP in ERR)"})
    EXPECT_NE(out.find(line), std::string::npos) << "missing: " << line << "\n" << out;
}

TEST(examples, async_tour_refuses_a_bad_command_line) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{},
                                               {"127.0.0.2"},
                                               {"127.0.0.2", "nowhere"},
                                               {"-p", "0", "127.0.0.2", "127.0.0.3"}}) {
    std::vector<std::string> argv{AVERBS_ASYNC_TOUR};
    argv.insert(argv.end(), args.begin(), args.end());
    child c(argv, true);
    EXPECT_EQ(c.wait(30s), 2) << c.output();
    EXPECT_NE(c.output().find("usage: async_tour"), std::string::npos) << c.output();
  }
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
