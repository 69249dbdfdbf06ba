// SPDX-License-Identifier: MIT
// averbs perf: perftest's latency and bandwidth tests on an averbs device.
#include "averbs/commands.hpp"
#include "perf/perf.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace averbs::cli {

namespace {

int help() {
  std::printf(
      "usage: averbs perf --test TEST [options]\n\n"
      "Runs one of perftest's tests with both ends in this process on one device\n"
      "(the loopback link) and prints perftest's columns.\n\n"
      "  --test TEST        send_lat, send_bw, write_lat, write_bw, read_lat, read_bw,\n"
      "                     atomic_lat, atomic_bw\n"
      "  -d, --ib-dev DEV   device (default: embedded)\n"
      "  -s, --size BYTES   message size (default 2 for latency, 65536 for bandwidth,\n"
      "                     8 for atomics)\n"
      "  -a, --all          all sizes from 2 to 8388608 bytes\n"
      "  -n, --iters N      iterations (default 1000; 5000 for write_bw)\n"
      "  -m, --mtu BYTES    path MTU: 256, 512, 1024, 2048, 4096 (default 4096)\n"
      "  -t, --tx-depth N   send queue depth (default 1 latency, 128 bandwidth)\n"
      "  -I, --inline BYTES inline sends up to this size (default 0)\n"
      "  -o, --outs N       outstanding READs/atomics (default 16)\n");
  return 0;
}

bool parse_mtu(long v, mtu& out) {
  switch (v) {
    case 256: out = mtu::mtu_256; return true;
    case 512: out = mtu::mtu_512; return true;
    case 1024: out = mtu::mtu_1024; return true;
    case 2048: out = mtu::mtu_2048; return true;
    case 4096: out = mtu::mtu_4096; return true;
  }
  return false;
}

}  // namespace

int cmd_perf(std::span<char* const> args) {
  perf::options o;
  bool have_test = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "averbs perf: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return args[++i];
    };
    auto number = [&]() -> long {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 0) {
        std::fprintf(stderr, "averbs perf: %s: '%s' is not a number\n", a.c_str(), v.c_str());
        std::exit(2);
      }
      return n;
    };
    if (a == "-h" || a == "--help") return help();
    if (a == "--test") {
      if (!perf::parse_test(value(), o.test)) {
        std::fprintf(stderr, "averbs perf: unknown test '%s'\n", args[i]);
        return 2;
      }
      have_test = true;
    } else if (a == "-d" || a == "--ib-dev") {
      o.device = value();
    } else if (a == "-s" || a == "--size") {
      o.size = static_cast<std::size_t>(number());
      if (o.size == 0 || o.size > (8u << 20)) {
        std::fprintf(stderr, "averbs perf: size must be 1..8388608\n");
        return 2;
      }
    } else if (a == "-a" || a == "--all") {
      o.all_sizes = true;
    } else if (a == "-n" || a == "--iters") {
      o.iters = static_cast<std::size_t>(number());
      if (o.iters < 5) {
        std::fprintf(stderr, "averbs perf: at least 5 iterations\n");
        return 2;
      }
    } else if (a == "-m" || a == "--mtu") {
      if (!parse_mtu(number(), o.path_mtu)) {
        std::fprintf(stderr, "averbs perf: MTU must be 256, 512, 1024, 2048 or 4096\n");
        return 2;
      }
    } else if (a == "-t" || a == "--tx-depth") {
      o.tx_depth = static_cast<std::uint32_t>(number());
    } else if (a == "-I" || a == "--inline") {
      o.inline_size = static_cast<std::uint32_t>(number());
    } else if (a == "-o" || a == "--outs") {
      o.outstanding_reads = static_cast<std::uint32_t>(number());
      if (o.outstanding_reads < 1 || o.outstanding_reads > 128) {
        std::fprintf(stderr, "averbs perf: outstanding reads must be 1..128\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "averbs perf: unknown option '%s' (try --help)\n", a.c_str());
      return 2;
    }
  }
  if (!have_test) {
    std::fprintf(stderr, "averbs perf: --test is required (try --help)\n");
    return 2;
  }
  try {
    context ctx;
    perf::loopback_run run(ctx, o);
    perf::print_banner(o, o.device);
    const bool lat = perf::is_latency(o.test);
    lat ? perf::print_latency_header() : perf::print_bandwidth_header();
    const std::size_t iters = perf::iters_for(o);
    for (std::size_t size : perf::sizes_for(o)) {
      if (lat) perf::print_latency(run.latency(size, iters));
      else perf::print_bandwidth(run.bandwidth(size, iters));
      std::fflush(stdout);
    }
    perf::print_rule();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "averbs perf: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace averbs::cli
