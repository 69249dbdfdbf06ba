// SPDX-License-Identifier: MIT
// Tests that need something of the machine (root for network namespaces,
// CAP_NET_RAW, tshark, IPv6 loopback) skip with a reason where it is
// missing.  CI has all of it: .ci/run, running as root, sets
// AVERBS_STRICT_ENV=1, and there the same condition fails the test, so
// that a CI run that could not run a test does not pass as if it had.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace averbs::test {

inline bool strict_environment() noexcept {
  const char* v = std::getenv("AVERBS_STRICT_ENV");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace averbs::test

/// GTEST_SKIP() with `why`, or, under AVERBS_STRICT_ENV=1, a failure.
/// Returns from the calling function (a test body or SetUp) either way.
#define AVERBS_SKIP_FOR_ENVIRONMENT(why)                                                       \
  do {                                                                                         \
    if (::averbs::test::strict_environment())                                                  \
      GTEST_FAIL() << "AVERBS_STRICT_ENV=1 (CI): this machine must run the test, but " << why; \
    else                                                                                       \
      GTEST_SKIP() << why;                                                                     \
  } while (0)
