// SPDX-License-Identifier: MIT
// averbs perf: perftest's latency and bandwidth tests on an averbs device.
#include "averbs/commands.hpp"
#include "perf/connect.hpp"
#include "perf/perf.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace averbs::cli {

namespace {

int help() {
  std::printf(
      "usage: averbs perf --test TEST [options]\n\n"
      "Runs one of perftest's tests with both ends in this process on one device\n"
      "(the loopback link) and prints perftest's columns.\n\n"
      "  --test TEST        send_lat, send_bw, write_lat, write_bw, read_lat, read_bw,\n"
      "                     atomic_lat, atomic_bw, connect\n"
      "  -d, --ib-dev DEV   device (default: embedded)\n"
      "  -s, --size BYTES   message size (default 2 for latency, 65536 for bandwidth,\n"
      "                     8 for atomics)\n"
      "  -a, --all          all sizes from 2 to 8388608 bytes\n"
      "  -n, --iters N      iterations (default 1000; 5000 for write_bw)\n"
      "  -D, --duration S   bandwidth tests: run S seconds instead of -n iterations\n"
      "  -m, --mtu BYTES    path MTU: 256, 512, 1024, 2048, 4096 (default and most: the\n"
      "                     port's active MTU, from the interface's MTU)\n"
      "  -t, --tx-depth N   send queue depth, 1..15000 (default 1 latency, 128 bandwidth)\n"
      "  -r, --rx-depth N   receive queue depth, 1..15000 (default 512)\n"
      "  -Q, --cq-mod N     a signaled completion every N sends, 1..1024 (default 100;\n"
      "                     every send for a size over 8 KiB without -a, as perftest)\n"
      "  -I, --inline BYTES inline sends up to this size, 0..512 (default 0; also --inline_size)\n"
      "  -o, --outs N       outstanding READs/atomics (default 16)\n"
      "  -x, --gid-index N  source GID index (default 0)\n"
      "  -i, --ib-port 1    the port (an averbs device has one)\n"
      "  -F, --CPU-freq     accepted for perftest's command lines; no effect\n"
      "  -u, --qp-timeout T QP local ACK timeout, 4.096 us * 2^T (default 14, 67 ms; the connect test's QPs "
      "too)\n"
      "  -p, --port PORT    out-of-band TCP port between the two processes (18515)\n"
      "      --report_gbits bandwidth in Gb/s (10^9 bits) instead of MB/s (2^20 bytes) (or --report-gbits)\n"
      "      --addr A[:P]   create the device (named by -d, default udp0) bound to\n"
      "                     address A, RoCEv2 UDP port P (4791)\n"
      "      --faults SPEC  inject faults on the device's link, e.g. drop=0.01,seed=3\n"
      "      --no-icrc      do not check received ICRCs (peers whose IPv4 ID we\n"
      "                     cannot see: rxe, NICs)\n"
      "      --no-gso       send every packet on its own (no UDP GSO runs)\n"
      "                     (these three with --addr; a device named by the\n"
      "                     environment or the configuration file is set there)\n"
      "      --counters     print the device's packet counters at the end\n\n"
      "connect: -n N (5 or more) RC connections through the connection manager, pipelined\n"
      "(-w, --window W in flight, default 256), then --sync S more one at a time\n"
      "(1 or more; default min(N, 10000)); prints conn/s for both and memory per\n"
      "QP.  Each pipelined connection carries one SEND unless --no-verify.  The\n"
      "CM port is the -p port; HOST must be an IP address.  A server waits ten\n"
      "minutes for its client, then gives up after a minute with no connection\n"
      "and no word from it.\n\n"
      "Two processes, two devices (perftest's server/client): with a device bound\n"
      "to an address, `averbs perf --test T` waits for a client and\n"
      "`averbs perf --test T HOST` connects to the server at HOST, the address of\n"
      "the server's device (the server listens there only, not on every address\n"
      "as perftest: several servers share a host).  The two must\n"
      "run the same test, sizes and iterations (each checks the other's); the\n"
      "path MTU and READ depth are the smaller of the two.  Devices come\n"
      "from --addr, AVERBS_DEVICES=name@address[:port],... or the configuration\n"
      "file ($AVERBS_CONFIG, else /etc/averbs/devices.conf; see docs/wire.md).\n");
  return 0;
}

void print_counters(const device_counters& c) {
  std::printf(
      " packets sent %llu, received %llu; go-back-N resends %llu, timeouts %llu, tail probes %llu; "
      "duplicates received %llu; READ restarts %llu;\n"
      " sequence NAKs sent %llu; RNR NAKs sent %llu, received %llu; dropped %llu; ICRC errors %llu;\n"
      " sendmmsg calls of 2+ datagrams %llu, recvmmsg of 2+ %llu;"
      " GSO runs sent %llu (%llu packets), GRO runs received %llu (%llu without a segment size; UDP_GRO "
      "switched %llu times); peer sockets %llu;\n"
      " in-process runs %llu;"
      " sent alone through a flow's socket %llu (ID probes %llu);\n"
      " receive buffer overflows %llu; held for a full send buffer %llu; management reads put off %llu;"
      " faults injected: dropped %llu, "
      "duplicated %llu, corrupted %llu, "
      "delayed %llu, reordered %llu\n",
      static_cast<unsigned long long>(c.packets_sent), static_cast<unsigned long long>(c.packets_received),
      static_cast<unsigned long long>(c.retransmits), static_cast<unsigned long long>(c.retry_timeouts),
      static_cast<unsigned long long>(c.tail_probes), static_cast<unsigned long long>(c.duplicates_received),
      static_cast<unsigned long long>(c.read_restarts), static_cast<unsigned long long>(c.seq_naks_sent),
      static_cast<unsigned long long>(c.rnr_naks_sent), static_cast<unsigned long long>(c.rnr_naks_received),
      static_cast<unsigned long long>(c.dropped), static_cast<unsigned long long>(c.icrc_errors),
      static_cast<unsigned long long>(c.send_batches), static_cast<unsigned long long>(c.receive_batches),
      static_cast<unsigned long long>(c.gso_runs), static_cast<unsigned long long>(c.gso_packets),
      static_cast<unsigned long long>(c.gro_runs), static_cast<unsigned long long>(c.gro_runs_unsized),
      static_cast<unsigned long long>(c.gro_switches), static_cast<unsigned long long>(c.peer_sockets),
      static_cast<unsigned long long>(c.loopback_runs), static_cast<unsigned long long>(c.flow_sends),
      static_cast<unsigned long long>(c.flow_id_probes), static_cast<unsigned long long>(c.receive_overflows),
      static_cast<unsigned long long>(c.send_deferred),
      static_cast<unsigned long long>(c.management_deferred),
      static_cast<unsigned long long>(c.faults_dropped), static_cast<unsigned long long>(c.faults_duplicated),
      static_cast<unsigned long long>(c.faults_corrupted), static_cast<unsigned long long>(c.faults_delayed),
      static_cast<unsigned long long>(c.faults_reordered));
}

// The device named `name`, or an error that names it and says where
// devices come from.
device open_named(context& ctx, const std::string& name) {
  try {
    return open_device(ctx, name);
  } catch (const std::system_error& e) {
    if (e.code() != errc::not_found) throw;
    throw std::system_error(e.code(), "no device named '" + name +
                                          "' (devices come from --addr, AVERBS_DEVICES or the configuration "
                                          "file; 'averbs devices -l' lists them)");
  }
}

// --test connect.  Loopback devices run the server on a second thread with
// its own context; network devices run one end per process.
int run_connect(const perf::options& o, perf::connect_options co, const std::string& host, bool show_counters) {
  context ctx;
  device dev = open_named(ctx, o.device);
  const bool remote = dev.udp_port() != 0;
  const gid own = dev.query_gid(1, o.gid_index);
  if (own.is_zero())
    throw std::runtime_error("GID index " + std::to_string(o.gid_index) + " of port 1 is empty");
  co.device = o.device;
  co.oob_port = o.oob_port;
  if (!remote && !host.empty()) {
    std::fprintf(stderr, "averbs perf: device '%s' has no network link; give it an address (--addr)\n",
                 o.device.c_str());
    return 2;
  }
  // Every connection stays open to the end, and on a loopback device both
  // of its QPs are this device's: refused before anything is allocated.
  if (!remote || !host.empty()) {
    const std::size_t sync =
        co.sync_connections != 0 ? co.sync_connections : std::min<std::size_t>(co.connections, 10000);
    const std::size_t per = remote ? 1 : 2, room = dev.query().max_qp / per;
    if (co.connections + sync > room) {
      std::fprintf(stderr,
                   "averbs perf: %zu + %zu connections kept open need more QPs than device '%s' has "
                   "(at most %zu connections%s)\n",
                   co.connections, sync, o.device.c_str(), room,
                   remote ? "" : ", two QPs each in one process");
      return 2;
    }
  }
  std::printf("---------------------------------------------------------------------------------------\n");
  std::printf("                    Connection setup (IB CM over QP1, RC)\n");
  std::printf(" Device         : %s\n", o.device.c_str());
  if (!remote) {
    co.server = {own, o.oob_port};
    std::atomic<bool> stop{false}, listening{false}, server_done{false};
    std::size_t accepted = 0, received = 0;
    std::exception_ptr server_error;
    std::thread server([&] {
      try {
        context sctx;
        accepted = perf::serve_connections(sctx, co, &stop, nullptr, &received, nullptr, &listening);
      } catch (...) {
        server_error = std::current_exception();
      }
      server_done = true;
    });
    perf::connect_stats st;
    try {
      // A request that came before the listener would be refused.
      while (!listening.load(std::memory_order_acquire) && !server_done.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (server_done.load() && server_error) throw std::runtime_error("the server side could not start");
      st = perf::run_connections(ctx, co);
    } catch (...) {
      stop = true;
      server.join();
      if (server_error) std::rethrow_exception(server_error);  // the first cause
      throw;
    }
    stop = true;
    server.join();
    if (server_error) std::rethrow_exception(server_error);
    std::printf(" Both ends in this process (loopback link); memory counts both QPs of a connection\n");
    std::printf("---------------------------------------------------------------------------------------\n");
    perf::print_connect_header();
    st.bytes_per_qp /= 2;
    perf::print_connect(st);
    std::printf(" server: %zu accepted, %zu SENDs received\n", accepted, received);
    std::printf("---------------------------------------------------------------------------------------\n");
    return st.failed == 0 && (!co.verify || st.verified == st.connections) ? 0 : 1;
  }
  if (host.empty()) {
    co.server = {own, o.oob_port};
    perf::oob l = perf::oob::listen(perf::ip_text(own), o.oob_port);
    std::printf(" Server at %s, waiting for the client\n", co.server.to_string().c_str());
    std::fflush(stdout);
    perf::oob link = l.accept(std::chrono::minutes(10));
    l = perf::oob();  // one client: a second is refused, not left in the backlog for a minute
    std::size_t received = 0, expected = 0;
    const std::size_t accepted = perf::serve_connections(ctx, co, nullptr, &link, &received, &expected);
    std::printf(" server: %zu accepted, %zu SENDs received\n", accepted, received);
    // The client counts what it established; the server must have them all.
    const bool all = accepted >= expected;
    if (!all)
      std::printf(" server: the client established %zu, this side accepted only %zu\n", expected, accepted);
    if (show_counters || !all) print_counters(dev.counters());
    std::printf("---------------------------------------------------------------------------------------\n");
    return all ? 0 : 1;
  }
  gid server_ip;
  if (!gid::parse(host, server_ip)) {
    std::fprintf(stderr, "averbs perf: '%s' is not an IP address\n", host.c_str());
    return 2;
  }
  co.server = {server_ip, o.oob_port};
  perf::oob link = perf::oob::connect(host, o.oob_port, std::chrono::seconds(30));
  link.expect_word(1, "the server's greeting (is the server running --test connect?)");
  std::printf(" Client of %s\n", co.server.to_string().c_str());
  std::printf("---------------------------------------------------------------------------------------\n");
  const perf::connect_stats st = perf::run_connections(ctx, co, &link);
  link.send_word(std::max<std::uint64_t>(st.connections + st.sync_connections, 1));  // done: how many
  perf::print_connect_header();
  perf::print_connect(st);
  // A failed connect is a lost exchange: the counters say where.
  if (show_counters || st.failed != 0) print_counters(dev.counters());
  std::printf("---------------------------------------------------------------------------------------\n");
  return st.failed == 0 && (!co.verify || st.verified == st.connections) ? 0 : 1;
}

}  // namespace

namespace {

// perftest reads its options with getopt_long: "--size=65536" and
// "-s65536" mean "-s 65536" there, so they do here.
// Only options that take a value: "--counters=1" stays one (unknown)
// argument rather than leaving a "1" that would be taken for the server.
std::vector<std::string> split_attached_values(std::span<char* const> raw) {
  constexpr std::string_view takes_value = "dpsnmtrQIDixouw";
  static const std::vector<std::string_view> long_with_value = {
      "--test",    "--ib-dev",    "--port",     "--addr",       "--faults", "--size",        "--iters",
      "--mtu",     "--tx-depth",  "--rx-depth", "--cq-mod",     "--inline", "--inline_size", "--duration",
      "--ib-port", "--gid-index", "--outs",     "--qp-timeout", "--window", "--sync"};
  std::vector<std::string> out;
  for (const char* r : raw) {
    const std::string a = r;
    const auto eq = a.find('=');
    if (a.size() > 2 && a[0] == '-' && a[1] == '-' && eq != std::string::npos &&
        std::find(long_with_value.begin(), long_with_value.end(), std::string_view(a).substr(0, eq)) !=
            long_with_value.end()) {
      out.push_back(a.substr(0, a.find('=')));
      out.push_back(a.substr(a.find('=') + 1));
    } else if (a.size() > 2 && a[0] == '-' && a[1] != '-' &&
               takes_value.find(a[1]) != std::string_view::npos) {
      out.push_back(a.substr(0, 2));
      out.push_back(a.substr(2));
    } else {
      out.push_back(a);
    }
  }
  return out;
}

}  // namespace

int cmd_perf(std::span<char* const> raw_args) {
  const std::vector<std::string> args = split_attached_values(raw_args);
  perf::options o;
  bool mtu_given = false;
  std::string data_option, connect_option;  // the first option of a data test, of --test connect, given
  bool have_test = false, named_device = false, icrc = true, connect_test = false, show_counters = false, gso = true;
  std::string host, addr, faults;
  perf::connect_options co;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "averbs perf: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return args[++i];
    };
    // A whole number in [lo, hi], read as perftest reads it (strtol base
    // 0: decimal, 0x hexadecimal, 0 octal); anything else is a usage error.
    auto number = [&](long lo, long hi) -> long {
      const std::string v = value();
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(v.c_str(), &end, 0);
      if (end == v.c_str() || *end != '\0' || errno == ERANGE || n < lo || n > hi) {
        std::fprintf(stderr, "averbs perf: %s: '%s' is not a number from %ld to %ld\n", a.c_str(), v.c_str(),
                     lo, hi);
        std::exit(2);
      }
      return n;
    };
    if (a == "-h" || a == "--help") return help();
    if (a == "--test") {
      const std::string t = value();
      if (t == "connect") {
        connect_test = have_test = true;
        continue;
      }
      if (!perf::parse_test(t, o.test)) {
        std::fprintf(stderr, "averbs perf: unknown test '%s'\n", t.c_str());
        return 2;
      }
      have_test = true;
      connect_test = false;  // the last --test counts, as every other option
    } else if (a == "-d" || a == "--ib-dev") {
      o.device = value();
      named_device = true;
      if (o.device.empty()) {  // (open_device("") would be the embedded one)
        std::fprintf(stderr, "averbs perf: %s needs a device name\n", a.c_str());
        return 2;
      }
    } else if (a == "-p" || a == "--port") {
      o.oob_port = static_cast<std::uint16_t>(number(1, 65535));
    } else if (a == "--addr") {
      addr = value();
      if (addr.empty()) {
        std::fprintf(stderr, "averbs perf: --addr needs an address\n");
        return 2;
      }
    } else if (a == "--faults") {
      faults = value();
      if (faults.empty()) {
        std::fprintf(stderr, "averbs perf: --faults needs a specification (drop=0.01,...)\n");
        return 2;
      }
    } else if (a == "--no-icrc") {
      icrc = false;
    } else if (a == "--counters") {
      show_counters = true;
    } else if (a == "--no-gso") {
      gso = false;
    } else if (a == "-s" || a == "--size") {
      if (data_option.empty()) data_option = a;
      o.size = static_cast<std::size_t>(number(1, 8l << 20));
    } else if (a == "-a" || a == "--all") {
      if (data_option.empty()) data_option = a;
      o.all_sizes = true;
    } else if (a == "-n" || a == "--iters") {
      // perftest's floor; the ceiling keeps a latency run's samples in memory.
      o.iters = static_cast<std::size_t>(number(5, 100'000'000));
    } else if (a == "-m" || a == "--mtu") {
      if (data_option.empty()) data_option = a;
      mtu_given = true;
      if (!perf::mtu_of_bytes(number(256, 4096), o.path_mtu)) {
        std::fprintf(stderr, "averbs perf: MTU must be 256, 512, 1024, 2048 or 4096\n");
        return 2;
      }
    } else if (a == "-t" || a == "--tx-depth") {
      if (data_option.empty()) data_option = a;
      o.tx_depth = static_cast<std::uint32_t>(number(1, 15000));
    } else if (a == "-r" || a == "--rx-depth") {
      if (data_option.empty()) data_option = a;
      o.rx_depth = static_cast<std::uint32_t>(number(1, 15000));
    } else if (a == "-Q" || a == "--cq-mod") {
      if (data_option.empty()) data_option = a;
      o.cq_mod = static_cast<std::uint32_t>(number(1, 1024));
      o.cq_mod_given = true;
    } else if (a == "--report_gbits" || a == "--report-gbits") {
      if (data_option.empty()) data_option = a;
      o.report_gbits = true;
    } else if (a == "-I" || a == "--inline" || a == "--inline_size") {
      if (data_option.empty()) data_option = a;
      o.inline_size = static_cast<std::uint32_t>(number(0, 512));  // the device's max_inline_data
    } else if (a == "-D" || a == "--duration") {
      o.duration = static_cast<std::uint32_t>(number(1, 86400));
    } else if (a == "-i" || a == "--ib-port") {
      (void)number(1, 1);  // an averbs device has one port
    } else if (a == "-x" || a == "--gid-index") {
      o.gid_index = static_cast<std::uint32_t>(number(0, 255));
    } else if (a == "-F" || a == "--CPU-freq") {
      // perftest's "do not fail on a CPU frequency warning": this tool
      // calibrates its cycle counter against the monotonic clock and warns
      // about nothing, so there is nothing to ignore.
    } else if (a == "-o" || a == "--outs") {
      if (data_option.empty()) data_option = a;
      o.outstanding_reads = static_cast<std::uint32_t>(number(1, 128));
    } else if (a == "-u" || a == "--qp-timeout") {
      o.qp_timeout = static_cast<std::uint8_t>(number(0, 31));  // 0: no timeout (IBTA), as perftest allows
      co.ack_timeout = o.qp_timeout;
    } else if (a == "-w" || a == "--window") {
      if (connect_option.empty()) connect_option = a;
      co.window = static_cast<std::size_t>(number(1, 1'000'000));
    } else if (a == "--sync") {
      if (connect_option.empty()) connect_option = a;
      co.sync_connections = static_cast<std::size_t>(number(1, 100'000'000));
    } else if (a == "--no-verify") {
      if (connect_option.empty()) connect_option = a;
      co.verify = false;
    } else if (!a.empty() && a[0] != '-' && host.empty()) {
      host = a;
    } else if (!a.empty() && a[0] != '-') {
      std::fprintf(stderr, "averbs perf: one server HOST only ('%s', then '%s')\n", host.c_str(), a.c_str());
      return 2;
    } else {
      std::fprintf(stderr, "averbs perf: unknown option '%s' (try --help)\n", a.c_str());
      return 2;
    }
  }
  if (!have_test) {
    std::fprintf(stderr, "averbs perf: --test is required (try --help)\n");
    return 2;
  }
  // An option of the other kind of test is a mistake, not a no-op.
  if (connect_test && !data_option.empty()) {
    std::fprintf(stderr, "averbs perf: %s does not apply to --test connect\n", data_option.c_str());
    return 2;
  }
  if (!connect_test && !connect_option.empty()) {
    std::fprintf(stderr, "averbs perf: %s applies to --test connect only\n", connect_option.c_str());
    return 2;
  }
  if (o.duration != 0 && (connect_test || perf::is_latency(o.test) || o.iters != 0 || o.all_sizes)) {
    std::fprintf(stderr, "averbs perf: -D runs a bandwidth test for a time, at one size: not with %s\n",
                 connect_test || perf::is_latency(o.test) ? "this test"
                 : o.iters != 0                           ? "-n"
                                                          : "-a");
    return 2;
  }
  if ((o.test == perf::test_kind::atomic_lat || o.test == perf::test_kind::atomic_bw) && !connect_test &&
      ((o.size != 0 && o.size != 8) || o.all_sizes)) {
    std::fprintf(stderr, "averbs perf: atomic tests move 8 bytes; -s and -a do not apply\n");
    return 2;
  }
  if (!addr.empty() && named_device && o.device == "embedded") {  // (-d '' is refused above)
    std::fprintf(stderr, "averbs perf: --addr creates a device: name it other than '%s' with -d\n",
                 o.device.c_str());
    return 2;
  }
  try {
    std::unique_ptr<soft_device> own;
    if (!addr.empty()) {
      soft_device_options so;
      so.name = named_device ? o.device : "udp0";
      o.device = so.name;
      // "a.b.c.d[:port]", "[v6]:port" or a bare IPv6 address.
      cm::address a;
      // A port given as 0 is refused, as AVERBS_DEVICES and the
      // configuration file refuse it (parse() reads it as "no port").
      const bool port_given = addr.front() == '[' ? addr.find("]:") != std::string::npos
                                                  : std::count(addr.begin(), addr.end(), ':') == 1;
      if (!cm::address::parse(addr, a) || a.is_any() || (port_given && a.port == 0)) {
        std::fprintf(stderr, "averbs perf: --addr '%s' is not an address[:port] (port 1..65535)\n",
                     addr.c_str());
        return 2;
      }
      so.address = perf::ip_text(a.ip);
      if (a.port != 0) so.port = a.port;
      so.check_icrc = icrc;
      so.gso = gso;
      // Errors name the option they come from, not the API beneath.
      try {
        own = std::make_unique<soft_device>(so);
      } catch (const std::system_error& e) {
        std::string m = e.what();
        constexpr std::string_view api = "soft_device: ";
        if (m.starts_with(api)) m = "--addr " + addr + ": " + m.substr(api.size());
        std::fprintf(stderr, "averbs perf: %s\n", m.c_str());
        return e.code() == errc::invalid_argument ? 2 : 1;
      }
      try {
        if (!faults.empty()) own->set_faults(faults);
      } catch (const std::system_error& e) {
        std::fprintf(stderr, "averbs perf: --%s\n", e.what());  // "faults: ..."
        return 2;
      }
    } else if (!faults.empty()) {
      std::fprintf(stderr, "averbs perf: --faults needs --addr (or AVERBS_FAULTS with AVERBS_DEVICES)\n");
      return 2;
    } else if (!icrc || !gso) {
      // They configure the device --addr creates; one named by the
      // environment or the configuration file is configured there.
      std::fprintf(
          stderr,
          "averbs perf: %s needs --addr (or AVERBS_%s=0 with AVERBS_DEVICES, %s=0 in the configuration "
          "file)\n",
          !icrc ? "--no-icrc" : "--no-gso", !icrc ? "ICRC" : "GSO", !icrc ? "icrc" : "gso");
      return 2;
    }
    if (connect_test) {
      co.connections = o.iters != 0 ? o.iters : 1000;
      return run_connect(o, co, host, show_counters);
    }
    context ctx;
    const bool lat = perf::is_latency(o.test);
    const std::size_t iters = perf::iters_for(o);
    const auto sizes = perf::sizes_for(o);
    // A device with a network link runs one end per process; the loopback
    // devices run both ends here.
    const device probe = open_named(ctx, o.device);
    const bool two_processes = probe.udp_port() != 0;
    // perftest's rule: the port's active MTU (a UDP device's follows its
    // interface's MTU, as rxe's), and a larger one asked for is lowered to it.
    const mtu active = probe.query_port(1).active_mtu;
    if (!mtu_given) {
      o.path_mtu = active;
    } else if (static_cast<unsigned>(o.path_mtu) > static_cast<unsigned>(active)) {
      std::printf("Requested mtu is higher than active mtu \nChanging to active mtu - %u\n", mtu_bytes(active));
      o.path_mtu = active;
    }
    if (!two_processes && !host.empty()) {
      std::fprintf(stderr, "averbs perf: device '%s' has no network link; give it an address (--addr)\n",
                   o.device.c_str());
      return 2;
    }
    if (two_processes) {
      perf::remote_run run(ctx, o, host, *std::max_element(sizes.begin(), sizes.end()));
      // perftest measures no peak on a SEND receiver, nor past 20,000 iterations.
      const bool receiver = run.is_server() && o.test == perf::test_kind::send_bw;
      if (!lat && (receiver || iters > perf::peak_max_iters || o.duration != 0))
        std::printf(" WARNING: BW peak won't be measured in this run.\n");
      // Printed after the greeting: the path MTU is the smaller of the two ends'.
      perf::print_banner(run.negotiated(), o.device, true);
      lat ? perf::print_latency_header() : perf::print_bandwidth_header(o.report_gbits);
      std::fflush(stdout);  // the banner shows the run started, also through a pipe
      for (std::size_t size : sizes) {
        if (lat) {
          const auto r = run.latency(size, iters);
          // The server of a one-sided test measures nothing.
          if (!run.is_server() || o.test == perf::test_kind::send_lat || o.test == perf::test_kind::write_lat)
            perf::print_latency(r);
        } else {
          // The server of a one-sided test prints the client's figures, as
          // perftest's does (they come with the client's end of the size).
          perf::print_bandwidth(run.bandwidth(size, iters));
        }
        std::fflush(stdout);
      }
      perf::print_rule();
      if (show_counters) print_counters(open_device(ctx, o.device).counters());
      return 0;
    }
    if (!lat && (iters > perf::peak_max_iters || o.duration != 0))
      std::printf(" WARNING: BW peak won't be measured in this run.\n");
    perf::loopback_run run(ctx, o);
    perf::print_banner(o, o.device);
    lat ? perf::print_latency_header() : perf::print_bandwidth_header(o.report_gbits);
    std::fflush(stdout);
    for (std::size_t size : sizes) {
      if (lat) perf::print_latency(run.latency(size, iters));
      else perf::print_bandwidth(run.bandwidth(size, iters));
      std::fflush(stdout);
    }
    perf::print_rule();
    if (show_counters) print_counters(open_device(ctx, o.device).counters());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "averbs perf: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace averbs::cli
