// SPDX-License-Identifier: MIT
// Cost per operation of each delivery mode of the request core, using the
// no-op operation, next to a baseline measured in the same run: a bare
// eventfd write + epoll_wait + read round trip on one thread.
//
// Usage: delivery_bench [--ops N] [--trials N] [--batch N]
#include "bench_util.hpp"

#include <averbs/async.hpp>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <coroutine>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <vector>

using namespace std::chrono_literals;
using averbs::bench::figure;
using averbs::bench::ns_per_op;

namespace {

struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

task await_loop(averbs::context* ctx, long n, long* done) {
  for (long i = 0; i < n; ++i) co_await averbs::async_nop(*ctx, {}, averbs::use_awaitable);
  *done = n;
}

void row(const char* name, const figure& f, double baseline) {
  std::printf("%-44s %9.1f %9.1f %9.1f   %5.2fx\n", name, f.median, f.min, f.max, f.median / baseline);
}

}  // namespace

int main(int argc, char** argv) {
  long ops = 1'000'000;
  int trials = 7;
  int batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--ops") == 0) ops = std::atol(argv[i + 1]);
    else if (std::strcmp(argv[i], "--trials") == 0) trials = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--batch") == 0) batch = std::atoi(argv[i + 1]);
  }
  const long rt_ops = ops / 10;  // syscall-bound rows run fewer operations

  // Baseline: what a completion through a descriptor costs at minimum.
  const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN, {}};
  ::epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev);
  const figure base = ns_per_op(trials, rt_ops, [&](long n) {
    for (long i = 0; i < n; ++i) {
      const std::uint64_t one = 1;
      std::uint64_t v;
      if (::write(efd, &one, sizeof one) != sizeof one) std::abort();
      epoll_event out;
      if (::epoll_wait(ep, &out, 1, -1) != 1) std::abort();
      if (::read(efd, &v, sizeof v) != sizeof v) std::abort();
    }
  });

  averbs::context_options o;
  averbs::context ctx(o);
  averbs::completion_port port(ctx);
  std::vector<averbs::completion_entry> entries(static_cast<std::size_t>(batch));
  averbs::nop_params inl;
  averbs::nop_params def;
  def.defer = true;

  std::printf("averbs delivery benchmark: %d trials, median and min-max, ns per operation\n", trials);
  std::printf("%-44s %9s %9s %9s   %6s\n", "mode", "median", "min", "max", "vs base");
  row("baseline: eventfd write+epoll_wait+read", base, base.median);

  row("use_request, completion via doorbell+epoll",
      ns_per_op(trials, rt_ops, [&](long n) {
        for (long i = 0; i < n; ++i) averbs::async_nop(ctx, def, averbs::use_request).get();
      }),
      base.median);
  row("use_request, inline completion",
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; ++i) averbs::async_nop(ctx, inl, averbs::use_request).get();
      }),
      base.median);
  row("synchronous nop()",
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; ++i) averbs::nop(ctx, inl);
      }),
      base.median);

  char label[96];
  std::snprintf(label, sizeof label, "port, batches of %d", batch);
  row(label,
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; i += batch) {
          for (int k = 0; k < batch; ++k) averbs::async_nop(ctx, inl, averbs::bind_port(port, k));
          port.get(entries, 0ns);
        }
      }),
      base.median);
  std::snprintf(label, sizeof label, "port, batches of %d, deferred", batch);
  row(label,
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; i += batch) {
          for (int k = 0; k < batch; ++k) averbs::async_nop(ctx, def, averbs::bind_port(port, k));
          std::size_t got = 0;
          while (got < static_cast<std::size_t>(batch)) got += port.get(entries, 1s);
        }
      }),
      base.median);
  row("port, one at a time",
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; ++i) {
          averbs::async_nop(ctx, inl, averbs::bind_port(port, 1));
          port.get(std::span(entries.data(), 1), 0ns);
        }
      }),
      base.median);
  row("port, skip_on_inline_success",
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; ++i)
          averbs::async_nop(ctx, inl, averbs::bind_port(port, 1, averbs::port_flags::skip_on_inline_success));
      }),
      base.median);

  long hits = 0;
  std::snprintf(label, sizeof label, "callback, batches of %d", batch);
  row(label,
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; i += batch) {
          for (int k = 0; k < batch; ++k) averbs::async_nop(ctx, inl, [&hits](std::error_code, std::uint64_t) { ++hits; });
          ctx.alertable_wait(0ns);
        }
      }),
      base.median);
  std::snprintf(label, sizeof label, "callback, batches of %d, deferred", batch);
  row(label,
      ns_per_op(trials, ops, [&](long n) {
        for (long i = 0; i < n; i += batch) {
          const long target = hits + batch;
          for (int k = 0; k < batch; ++k) averbs::async_nop(ctx, def, [&hits](std::error_code, std::uint64_t) { ++hits; });
          while (hits < target) ctx.alertable_wait(1s);
        }
      }),
      base.median);
  row("use_future, inline completion",
      ns_per_op(trials, rt_ops, [&](long n) {
        for (long i = 0; i < n; ++i) averbs::async_nop(ctx, inl, averbs::use_future).get();
      }),
      base.median);
  row("use_awaitable, inline completion",
      ns_per_op(trials, ops, [&](long n) {
        long done = 0;
        await_loop(&ctx, n, &done);
        while (done != n) ctx.alertable_wait(0ns);
      }),
      base.median);

  std::printf("\ntargets: callback and port in batches < 100 ns/op; use_request via doorbell <= 1.5x baseline\n");
  ::close(ep);
  ::close(efd);
  return hits > 0 ? 0 : 1;
}
