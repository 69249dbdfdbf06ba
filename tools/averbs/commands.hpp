// SPDX-License-Identifier: MIT
// The averbs command-line program: one entry per subcommand.
#pragma once

#include <span>
#include <string_view>

namespace averbs::cli {

/// A subcommand's entry point: receives the arguments after its name and
/// returns the process exit status.
using command_fn = int (*)(std::span<char* const> args);

struct command {
  std::string_view name;
  std::string_view summary;
  command_fn run;
};

int cmd_devices(std::span<char* const> args);
int cmd_nop(std::span<char* const> args);
int cmd_perf(std::span<char* const> args);

}  // namespace averbs::cli
