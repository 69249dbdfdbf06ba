// SPDX-License-Identifier: MIT
// Shared helpers for the benchmark programs: trials, medians, a table.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace averbs::bench {

struct figure {
  double median = 0, min = 0, max = 0;
};

inline figure summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();  // an even count: the mean of the middle two
  return {n % 2 == 0 ? (v[n / 2 - 1] + v[n / 2]) / 2 : v[n / 2], v.front(), v.back()};
}

/// Runs `body(ops)` `trials` times after one warm-up and returns the
/// nanoseconds per operation of each trial.
template <class Body>
figure ns_per_op(int trials, long ops, Body&& body) {
  body(ops / 10 + 1);
  std::vector<double> v;
  for (int t = 0; t < trials; ++t) {
    const auto a = std::chrono::steady_clock::now();
    body(ops);
    const auto b = std::chrono::steady_clock::now();
    v.push_back(std::chrono::duration<double, std::nano>(b - a).count() / static_cast<double>(ops));
  }
  return summarize(std::move(v));
}

}  // namespace averbs::bench
