// SPDX-License-Identifier: MIT
#include "averbs/commands.hpp"

#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>

namespace {

using averbs::cli::command;

// Kept sorted by name.
constexpr std::array commands = {
    command{"devices", "list devices and their attributes, as ibv_devinfo does", &averbs::cli::cmd_devices},
    command{"nop", "run the no-op operation through every completion token", &averbs::cli::cmd_nop},
    command{"perf", "latency and bandwidth tests, as perftest's ib_*_lat / ib_*_bw", &averbs::cli::cmd_perf},
};

int usage(FILE* out) {
  std::fprintf(out,
               "usage: averbs <command> [options]\n"
               "       averbs --version\n\ncommands:\n");
  for (const command& c : commands)
    std::fprintf(out, "  %-10.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  std::fprintf(out, "\n'averbs <command> --help' describes a command's options.\n");
  return out == stdout ? 0 : 2;
}

}  // namespace

namespace averbs::cli {

bool parse_number(std::string_view text, std::int64_t lo, std::int64_t hi, std::int64_t& out) noexcept {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || v < lo || v > hi) return false;
  out = v;
  return true;
}

bool parse_number(std::string_view text, std::uint64_t& out) noexcept {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) return false;
  out = v;
  return true;
}

}  // namespace averbs::cli

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  const std::string_view name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") return usage(stdout);
  if (name == "--version" || name == "version") {
    std::printf("averbs %s\n", AVERBS_VERSION_STRING);
    return 0;
  }
  for (const command& c : commands) {
    if (c.name != name) continue;
    // What a command does not handle itself (no descriptors or memory for
    // a context, say) is still a message and an exit status, not an abort.
    try {
      return c.run(std::span<char* const>(argv + 2, static_cast<std::size_t>(argc - 2)));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "averbs %s: %s\n", argv[1], e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "averbs: unknown command '%s'\n\n", argv[1]);
  return usage(stderr);
}
