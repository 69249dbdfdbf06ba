// SPDX-License-Identifier: MIT
// The in-process targets of the soft device, each next to its reference
// measured in the same run (7 trials, medians and ranges):
//   * 8-byte RC send/recv latency (half round trip)  -- target < 0.5 us
//   * 8-byte RC send message rate                     -- target >= 5 M msg/s
//   * 1 MiB RDMA write bandwidth vs single-thread memcpy of 1 MiB
//                                                     -- target >= 70 %
// Usage: verbs_bench [--trials N]
#include "bench_util.hpp"
#include "perf/perf.hpp"

#include <averbs/verbs.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using averbs::bench::figure;
using averbs::bench::summarize;

namespace {

// memcpy through a volatile pointer so the copy is not optimised away.
void* (*volatile copy_fn)(void*, const void*, std::size_t) = std::memcpy;

double memcpy_mb_s(std::size_t size, int reps) {
  std::vector<std::byte> a(size, std::byte{1}), b(size);
  copy_fn(b.data(), a.data(), size);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) copy_fn(b.data(), a.data(), size);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(size) * reps / s / (1 << 20);
}

averbs::perf::options opts(averbs::perf::test_kind k, std::size_t size, std::size_t iters) {
  averbs::perf::options o;
  o.test = k;
  o.size = size;
  o.iters = iters;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 7;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--trials") == 0) trials = std::atoi(argv[i + 1]);

  averbs::context ctx;
  std::vector<double> lat, rate, write_bw, copy_bw, ratio;
  for (int t = 0; t < trials; ++t) {
    {
      auto o = opts(averbs::perf::test_kind::send_lat, 8, 20000);
      averbs::perf::loopback_run run(ctx, o);
      lat.push_back(run.latency(8, o.iters).t_typical);
    }
    {
      auto o = opts(averbs::perf::test_kind::send_bw, 8, 1000000);
      averbs::perf::loopback_run run(ctx, o);
      rate.push_back(run.bandwidth(8, o.iters).msg_rate);
    }
    {
      const double m = memcpy_mb_s(1 << 20, 2000);
      auto o = opts(averbs::perf::test_kind::write_bw, 1 << 20, 2000);
      averbs::perf::loopback_run run(ctx, o);
      const double w = run.bandwidth(1 << 20, o.iters).bw_avg;
      copy_bw.push_back(m);
      write_bw.push_back(w);
      ratio.push_back(w / m);
    }
  }
  const figure fl = summarize(lat), fr = summarize(rate), fw = summarize(write_bw), fc = summarize(copy_bw),
               fx = summarize(ratio);
  std::printf("averbs soft device, embedded (in-process loopback), %d trials: median (min-max)\n", trials);
  std::printf("  8 B RC send latency, t_typical      %7.3f us   (%.3f-%.3f)   target < 0.5 us\n", fl.median, fl.min,
              fl.max);
  std::printf("  8 B RC send message rate            %7.2f M/s  (%.2f-%.2f)   target >= 5 M/s\n", fr.median, fr.min,
              fr.max);
  std::printf("  1 MiB RDMA write bandwidth          %7.0f MB/s (%.0f-%.0f)\n", fw.median, fw.min, fw.max);
  std::printf("  1 MiB memcpy, same run              %7.0f MB/s (%.0f-%.0f)\n", fc.median, fc.min, fc.max);
  std::printf("  write / memcpy, per trial           %7.0f %%    (%.0f-%.0f)   target >= 70 %%\n", fx.median * 100,
              fx.min * 100, fx.max * 100);
  std::printf("(MB = 2^20 bytes, as perftest)\n");
  return 0;
}
