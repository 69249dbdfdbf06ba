// SPDX-License-Identifier: MIT
// averbs nop: the built-in no-op operation through every completion token,
// with an optional delay and an injected error.  Shows a newcomer what each
// delivery mode looks like and what it costs on this machine.
#include "averbs/commands.hpp"

#include <averbs/async.hpp>

#include <array>
#include <chrono>
#include <coroutine>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <string>

namespace averbs::cli {

namespace {

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

task awaiting(context* ctx, nop_params p, std::string* out) {
  try {
    const std::uint64_t v = co_await async_nop(*ctx, p, use_awaitable);
    *out = "value " + std::to_string(v);
  } catch (const std::system_error& e) {
    *out = "error: " + e.code().message();
  }
}

std::string describe(const std::error_code& ec, std::uint64_t v) {
  return ec ? "error: " + ec.message() : "value " + std::to_string(v);
}

void report(const char* token, const std::string& what, clk::time_point start) {
  const double us = std::chrono::duration<double, std::micro>(clk::now() - start).count();
  std::printf("  %-34s %-44s %9.1f us\n", token, what.c_str(), us);
}

int help() {
  std::printf(
      "usage: averbs nop [--delay-us N] [--defer] [--error NAME] [--value N]\n\n"
      "Runs the no-op operation once with each completion token and prints what\n"
      "each delivered and how long it took.\n\n"
      "  --delay-us N   complete after N microseconds on the context clock\n"
      "  --defer        complete at the next progress pass (as a device would)\n"
      "  --error NAME   inject an error: aborted, timeout, busy, rem_access_err\n"
      "  --value N      the result value (default 42)\n");
  return 0;
}

}  // namespace

int cmd_nop(std::span<char* const> args) {
  nop_params p;
  p.value = 42;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string a = args[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "averbs nop: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return args[++i];
    };
    if (a == "-h" || a == "--help") return help();
    if (a == "--delay-us") {
      const char* v = next();
      std::int64_t us = 0;
      if (!parse_number(v, 0, 3'600'000'000, us)) {  // an hour at most
        std::fprintf(stderr, "averbs nop: --delay-us: '%s' is not a number from 0 to 3600000000\n", v);
        return 2;
      }
      p.delay = std::chrono::microseconds(us);
    } else if (a == "--defer") {
      p.defer = true;
    } else if (a == "--value") {
      const char* v = next();
      if (!parse_number(v, p.value)) {
        std::fprintf(stderr, "averbs nop: --value: '%s' is not an unsigned 64-bit number\n", v);
        return 2;
      }
    } else if (a == "--error") {
      const std::string e = next();
      if (e == "aborted") p.error = errc::operation_aborted;
      else if (e == "timeout") p.error = errc::timed_out;
      else if (e == "busy") p.error = errc::busy;
      else if (e == "rem_access_err") p.error = wc_status::rem_access_err;
      else {
        std::fprintf(stderr, "averbs nop: unknown error '%s'\n", e.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "averbs nop: unknown option '%s'\n", a.c_str());
      return 2;
    }
  }

  context ctx;
  completion_port port(ctx);
  std::printf("no-op: delay %lld us%s, %s\n", static_cast<long long>(p.delay.count() / 1000),
              p.defer ? ", deferred" : "", p.error ? p.error.message().c_str() : "no error");

  auto t = clk::now();
  {
    std::error_code ec;
    const std::uint64_t v = nop(ctx, p, ec);
    report("synchronous nop()", describe(ec, v), t);
  }
  t = clk::now();
  {
    auto r = async_nop(ctx, p, use_request);
    std::error_code ec;
    const std::uint64_t v = r.get(ec);
    report("use_request + get()", describe(ec, v), t);
  }
  t = clk::now();
  {
    async_nop(ctx, p, bind_port(port, 7));
    std::array<completion_entry, 1> e;
    port.get(e, infinite);
    report("bind_port(port, key 7) + get()",
           "key " + std::to_string(e[0].key()) + ", " + describe(e[0].error(), *e[0].result<std::uint64_t>()), t);
  }
  t = clk::now();
  {
    std::string out;
    async_nop(ctx, p, [&out](std::error_code ec, std::uint64_t v) { out = describe(ec, v); });
    std::printf("  %-34s %s\n", "callback", out.empty() ? "(not run inside the initiating call)" : "RAN INLINE");
    while (out.empty()) ctx.alertable_wait(infinite);
    report("callback after alertable_wait()", out, t);
  }
  t = clk::now();
  {
    auto f = async_nop(ctx, p, use_future);
    while (f.wait_for(0s) != std::future_status::ready) ctx.poll();
    std::string out;
    try {
      out = describe({}, f.get());
    } catch (const std::system_error& e) {
      out = "error: " + e.code().message();
    }
    report("use_future", out, t);
  }
  t = clk::now();
  {
    std::string out;
    awaiting(&ctx, p, &out);
    while (out.empty()) ctx.alertable_wait(infinite);
    report("use_awaitable (co_await)", out, t);
  }
  const context_stats st = ctx.stats();
  std::printf("context: %llu started, %llu completed, %llu cancelled, %llu handlers run, %llu in flight\n",
              static_cast<unsigned long long>(st.started), static_cast<unsigned long long>(st.completed),
              static_cast<unsigned long long>(st.cancelled), static_cast<unsigned long long>(st.handlers_run),
              static_cast<unsigned long long>(st.in_flight));
  return 0;
}

}  // namespace averbs::cli
