// SPDX-License-Identifier: MIT
// The ICRC's CRC-32 per path, side by side on this CPU: the 512- and
// 256-bit VPCLMULQDQ folds (where the CPU has them), libdeflate (the
// fallback) and zlib (for reference), over one packet's payload and a few
// other sizes.  Prints bytes per second; asserts nothing.
//
//   build/release/bench/crc32_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true    (one line)
#include <benchmark/benchmark.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "wire/crc32.hpp"

namespace {

namespace w = averbs::wire;

const std::vector<std::byte>& data() {
  static const std::vector<std::byte> v = [] {
    std::vector<std::byte> d(65536 + 64);
    std::mt19937 gen(1);
    for (auto& b : d) b = static_cast<std::byte>(gen());
    return d;
  }();
  return v;
}

void by_path(benchmark::State& state, w::crc32_path path) {
  if (!w::crc32_has_path(path)) {
    state.SkipWithError("this CPU lacks the instructions of this path");
    return;
  }
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::byte* p = data().data() + 4;  // a packet's payload after its headers is not 64-byte aligned
  std::uint32_t crc = 0;
  for (auto _ : state) {
    crc = w::crc32_by(path, crc, p, n);
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void zlib(benchmark::State& state) {
  const auto n = static_cast<uInt>(state.range(0));
  const auto* p = reinterpret_cast<const Bytef*>(data().data() + 4);
  uLong crc = 0;
  for (auto _ : state) {
    crc = ::crc32(crc, p, n);
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {256, 384, 512, 768, 1024, 4096, 65536}) b->Arg(n);
}

BENCHMARK_CAPTURE(by_path, vpclmul512, w::crc32_path::vpclmul512)->Apply(sizes);
BENCHMARK_CAPTURE(by_path, vpclmul256, w::crc32_path::vpclmul256)->Apply(sizes);
BENCHMARK_CAPTURE(by_path, libdeflate, w::crc32_path::libdeflate)->Apply(sizes);
BENCHMARK(zlib)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
