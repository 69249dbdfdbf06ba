// SPDX-License-Identifier: MIT
// Latency and bandwidth tests in the manner of perftest (ib_send_lat,
// ib_write_bw, ...), shared by `averbs perf` and the bench programs.
//
// Statistics follow perftest: latency samples are one iteration each
// (ping-pong round trips are halved for SEND and WRITE, not for READ and
// atomics), sorted, the two largest dropped; t_typical is the median of the
// rest; t_max is the largest sample kept.  Bandwidth is MB = 2^20 bytes
// (Gb = 10^9 bits with --report_gbits); the peak is perftest's: the best
// rate over any run of messages, timed from the post of its first to the
// signaled completion that covers its last (not measured past 20,000
// iterations, nor on a SEND receiver, as in perftest).
#pragma once

#include "perf/oob.hpp"

#include <averbs/verbs.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace averbs::perf {

enum class test_kind { send_lat, send_bw, write_lat, write_bw, read_lat, read_bw, atomic_lat, atomic_bw };

bool parse_test(const std::string& name, test_kind& out);
const char* test_name(test_kind k);
bool is_latency(test_kind k);

struct options {
  test_kind test = test_kind::send_lat;
  std::string device = "embedded";
  std::size_t size = 0;        // 0: perftest's default for the test
  bool all_sizes = false;      // -a: 2 .. 8 MiB
  std::size_t iters = 0;       // 0: 1000, or 5000 for write_bw
  std::uint32_t duration = 0;  // -D: seconds a bandwidth test runs, instead of iterations
  mtu path_mtu = mtu::mtu_4096;
  std::uint32_t tx_depth = 0;  // 0: 1 for latency, 128 for bandwidth
  std::uint32_t rx_depth = 512;
  std::uint32_t cq_mod = 100;  // -Q: a signaled completion every cq_mod sends
  bool cq_mod_given = false;   // -Q given: else, as perftest, every send of a size over 8 KiB without -a
  bool report_gbits = false;   // --report_gbits: Gb/s instead of MB/s
  std::uint32_t inline_size = 0;
  std::uint32_t outstanding_reads = 16;
  std::uint8_t qp_timeout = 14;    // -u: local ACK timeout, 4.096 us * 2^t
  std::uint16_t oob_port = 18515;  // perftest's default
  std::uint32_t gid_index = 0;     // -x: the source GID
};

struct latency_result {
  std::size_t bytes = 0, iters = 0;
  double t_min = 0, t_max = 0, t_typical = 0, t_avg = 0, t_stdev = 0, p99 = 0, p999 = 0;  // microseconds
};

struct bandwidth_result {
  std::size_t bytes = 0, iters = 0;
  double bw_peak = 0, bw_avg = 0;  // MB/s (2^20), or Gb/s with --report_gbits; peak 0: not measured
  double msg_rate = 0;             // Mpps
};

/// perftest's peak bandwidth as the least cycles per message: over every
/// run of messages i..j, (completed[j] - posted[i]) / (j - i + 1), where j
/// is a signaled completion: every `cq_mod`-th message, and the last one.
/// `posted` holds each message's post time, `completed` the time its
/// signaled completion was seen (entries of unsignaled messages are not
/// read).  0 when there is nothing to measure.
double peak_cycles_per_message(const std::vector<std::uint64_t>& posted,
                               const std::vector<std::uint64_t>& completed, std::size_t cq_mod);
/// perftest measures the peak only up to this many iterations.
constexpr std::size_t peak_max_iters = 20000;

/// Cycle counter calibrated against the monotonic clock.
class cycle_clock {
 public:
  cycle_clock();
  std::uint64_t now() const noexcept;
  double us(std::uint64_t cycles) const noexcept { return static_cast<double>(cycles) / per_us_; }
  double per_second() const noexcept { return per_us_ * 1e6; }

 private:
  double per_us_ = 1000;
};

/// Both ends of a test in this process on one device (loopback link).
class loopback_run {
 public:
  loopback_run(context& ctx, const options& o);
  ~loopback_run();
  latency_result latency(std::size_t size, std::size_t iters);
  bandwidth_result bandwidth(std::size_t size, std::size_t iters);

 private:
  struct side;
  void setup(std::size_t size);
  const options& o_;
  context& ctx_;
  device dev_;
  pd pd_;
  cycle_clock clock_;
  std::vector<std::unique_ptr<side>> sides_;
};

/// The IB path MTU of `bytes` (256 .. 4096); false for any other size.
bool mtu_of_bytes(long bytes, mtu& out) noexcept;

/// An address as text: dotted IPv4 for an IPv4-mapped GID, else IPv6.
std::string ip_text(const gid& g);

/// The parameters `o` runs with, as the out-of-band greeting states them.
test_params params_of(const options& o);

/// Checks the peer's greeting against `o`: a different test, sizes or
/// iteration count is an error that names both; the path MTU and the
/// READ/atomic depth are lowered to the peer's when it asks for less.
void agree(options& o, const test_params& peer);

/// One end of a test between two processes (two devices, any link): the
/// server waits for the client on the out-of-band port; both then run the
/// same sequence of sizes.
///
/// Neither end hangs when the other goes away: every wait for a completion
/// or a write also watches the out-of-band connection (closed when the
/// peer's process ends) and gives up after a stall longer than the QP's
/// own retry budget.
class remote_run {
 public:
  /// Server when `host` is empty, else client of `host`.  Exchanges the
  /// greeting (see `agree`) and the queue pair details.
  remote_run(context& ctx, const options& o, const std::string& host, std::size_t max_size);
  ~remote_run();
  bool is_server() const noexcept { return host_.empty(); }
  /// The options after agreeing with the peer (path MTU, READ depth).
  const options& negotiated() const noexcept { return o_; }
  latency_result latency(std::size_t size, std::size_t iters);
  bandwidth_result bandwidth(std::size_t size, std::size_t iters);

 private:
  struct state;
  options o_;
  std::string host_;
  cycle_clock clock_;
  std::unique_ptr<state> s_;
};

latency_result summarize_latency(std::vector<std::uint64_t> cycles, const cycle_clock& c, std::size_t bytes,
                                 std::size_t iters, double rtt_factor);

void print_banner(const options& o, const std::string& device_name, bool remote = false);
void print_latency_header();
void print_latency(const latency_result& r);
void print_bandwidth_header(bool gbits = false);
void print_bandwidth(const bandwidth_result& r);
void print_rule();

/// Sizes the test runs: `-s`, perftest's default, or the `-a` sweep.
std::vector<std::size_t> sizes_for(const options& o);
std::size_t iters_for(const options& o);

}  // namespace averbs::perf
