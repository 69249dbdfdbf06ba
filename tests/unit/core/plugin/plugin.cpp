// SPDX-License-Identifier: MIT
// A dlopen()ed client of averbs.  It starts operations whose handlers live
// in this module; the host dlclose()s it while they are pending.
#include <averbs/async.hpp>

#include <chrono>

extern "C" __attribute__((visibility("default"))) void plugin_start(averbs::context* ctx, int n,
                                                                    int* counter) {
  using namespace std::chrono_literals;
  averbs::nop_params p;
  p.delay = 1ms;
  for (int i = 0; i < n; ++i) {
    p.value = static_cast<std::uint64_t>(i);
    averbs::async_nop(*ctx, p, [counter](std::error_code ec, std::uint64_t) {
      if (!ec) ++*counter;
    });
  }
}
