// SPDX-License-Identifier: MIT
// Rule 7: client reference counting.  A handler in a dlopen()ed module keeps
// the module loaded until it has run, even after the host dlclose()s it.
#include <averbs/async.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>

#include <array>
#include <cstring>
#include <string>

namespace {

using namespace std::chrono_literals;

bool is_loaded(const char* path) {
  struct q {
    const char* path;
    bool found;
  } state{path, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) -> int {
        auto* st = static_cast<q*>(p);
        if (info->dlpi_name != nullptr && std::strcmp(info->dlpi_name, st->path) == 0) st->found = true;
        return 0;
      },
      &state);
  return state.found;
}

TEST(module, handlers_keep_a_dlclosed_module_loaded_until_they_ran) {
  averbs::manual_clock clk;
  averbs::context_options o;
  o.clock = &clk;
  averbs::context ctx(o);

  void* h = ::dlopen(AVERBS_TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << ::dlerror();
  auto start = reinterpret_cast<void (*)(averbs::context*, int, int*)>(::dlsym(h, "plugin_start"));
  ASSERT_NE(start, nullptr);
  int counter = 0;
  start(&ctx, 3, &counter);
  ASSERT_EQ(::dlclose(h), 0);
  EXPECT_TRUE(is_loaded(AVERBS_TEST_PLUGIN)) << "pending handlers hold the module";

  clk.advance(1ms);
  std::size_t ran = 0;
  while (ran < 3) ran += ctx.alertable_wait(1s);
  EXPECT_EQ(counter, 3) << "the handlers ran from the unloaded-by-host module";
  EXPECT_FALSE(is_loaded(AVERBS_TEST_PLUGIN)) << "the last handler released the module";
}

// A completion delivered to a port carries a result whose code (its
// manage function, its type) is the plugin's: the plugin stays loaded while
// the port, then the dequeued entry, holds it.  It used to be unloaded at
// the host's dlclose(), and get() called into unmapped code.
TEST(module, a_port_completion_keeps_a_dlclosed_module_loaded_until_its_entry_is_reset) {
  averbs::context ctx;
  averbs::completion_port port(ctx);
  void* h = ::dlopen(AVERBS_TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << ::dlerror();
  auto complete_into = reinterpret_cast<void (*)(averbs::context*, averbs::completion_port*)>(
      ::dlsym(h, "plugin_complete_into"));
  ASSERT_NE(complete_into, nullptr);
  complete_into(&ctx, &port);
  ASSERT_EQ(::dlclose(h), 0);
  EXPECT_TRUE(is_loaded(AVERBS_TEST_PLUGIN)) << "the queued completion holds the module";
  std::array<averbs::completion_entry, 1> e;
  ASSERT_EQ(port.get(e, 1s), 1u);
  EXPECT_EQ(e[0].key(), 7u);
  EXPECT_FALSE(e[0].error());
  EXPECT_EQ(e[0].result<std::uint64_t>(), nullptr) << "the plugin's type, not a uint64_t";
  averbs::completion_entry moved = std::move(e[0]);
  EXPECT_TRUE(is_loaded(AVERBS_TEST_PLUGIN)) << "the entry holds the module";
  moved.reset();
  EXPECT_FALSE(is_loaded(AVERBS_TEST_PLUGIN)) << "the entry's reset released the module";
}

TEST(module, handlers_in_the_main_program_take_no_module_reference) {
  // The fast path: a handler defined here is recognised by address and the
  // operation neither dlopen()s nor fails.
  averbs::context ctx;
  int n = 0;
  averbs::async_nop(ctx, {}, [&](std::error_code, std::uint64_t) { ++n; });
  EXPECT_EQ(ctx.alertable_wait(0ns), 1u);
  EXPECT_EQ(n, 1);
}

}  // namespace
