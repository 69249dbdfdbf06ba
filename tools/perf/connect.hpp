// SPDX-License-Identifier: MIT
// `averbs perf --test connect`: connection setup rate through the CM.
//
// The client establishes N RC connections, pipelined (a window of
// asynchronous connects in flight on one thread), then S more one at a
// time with the synchronous call, and reports connections per second for
// each, and the memory each established QP costs (resident set growth over
// the pipelined phase, divided by the QPs it created).  With verification
// on, every connection then carries one SEND, which the server's QP must
// receive, so each counted connection is known to work.
#pragma once

#include "perf/perf.hpp"

#include <averbs/cm.hpp>
#include <averbs/verbs.hpp>

#include <atomic>
#include <cstdint>
#include <string>

namespace averbs::perf {

struct connect_options {
  std::string device = "embedded";
  cm::address server;          // where the server listens (its device address, CM port)
  std::size_t connections = 1000;
  std::size_t window = 256;    // asynchronous connects in flight
  std::size_t sync_connections = 0;  // 0: min(connections, 10000)
  bool verify = true;
  std::uint16_t oob_port = 18515;
  std::uint8_t ack_timeout = 14;  // -u: the connections' QPs' (conn_params::ack_timeout)
};

struct connect_stats {
  std::size_t connections = 0;
  double seconds = 0;
  double per_second = 0;
  std::size_t sync_connections = 0;
  double sync_seconds = 0;
  double sync_per_second = 0;
  double bytes_per_qp = 0;
  std::size_t verified = 0;  // connections whose SEND completed successfully
  std::size_t failed = 0;    // connects that completed with an error
  std::size_t qps = 0;       // QPs the memory figure divides by
};

/// Serves connection requests on `o.server` until `stop` is set (loopback)
/// or the client says it is done (out-of-band, when `oob_link` is given).
/// Returns the number of connections accepted; `received` counts the
/// verification SENDs that arrived, `expected` (out-of-band only) the
/// connections the client said it established.  `listening`, if given, is
/// set once requests are taken (a client in this process starts then).
std::size_t serve_connections(context& ctx, const connect_options& o, const std::atomic<bool>* stop,
                              class oob* oob_link, std::size_t* received, std::size_t* expected = nullptr,
                              std::atomic<bool>* listening = nullptr);

/// The client side: the pipelined phase, the synchronous phase and the
/// verification, as described above.  `server_link`, if given, is watched
/// throughout: the server's end closing stops the run with an error (its
/// connects would otherwise each time out, one after another).
connect_stats run_connections(context& ctx, const connect_options& o, const class oob* server_link = nullptr);

void print_connect_header();
void print_connect(const connect_stats& s);

/// Resident memory of this process, in bytes.
std::size_t resident_bytes();

}  // namespace averbs::perf
