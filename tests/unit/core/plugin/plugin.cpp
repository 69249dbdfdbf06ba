// SPDX-License-Identifier: MIT
// A dlopen()ed client of averbs.  It starts operations whose handlers live
// in this module; the host dlclose()s it while they are pending.
#include <averbs/async.hpp>

#include <chrono>
#include <string>

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

namespace {
// A result type only this module instantiates: its move and destroy code
// (the completion's result_manager) lives here.
struct plugin_result {
  std::uint64_t value = 0;
  std::string text;
};
}  // namespace

// Completes one operation of that type into `port` at once (key 7).  The
// completion waits in the port, holding its result, after the host
// dlclose()s this module.
extern "C" __attribute__((visibility("default"))) void plugin_complete_into(averbs::context* ctx,
                                                                            averbs::completion_port* port) {
  averbs::detail::initiate<plugin_result>(*ctx, nullptr, averbs::bind_port(*port, 7),
                                          [](averbs::detail::completer<plugin_result> c) noexcept {
                                            c.complete({}, plugin_result{42, std::string(64, 'p')});
                                          });
}
