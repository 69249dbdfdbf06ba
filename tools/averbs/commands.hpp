// SPDX-License-Identifier: MIT
// The averbs command-line program: one entry per subcommand.
#pragma once

#include <cstdint>
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

/// `text` as a whole decimal number in [lo, hi] (no sign for an unsigned
/// range, no trailing junk, no overflow); false otherwise.
bool parse_number(std::string_view text, std::int64_t lo, std::int64_t hi, std::int64_t& out) noexcept;
bool parse_number(std::string_view text, std::uint64_t& out) noexcept;  ///< any 64-bit unsigned value

int cmd_devices(std::span<char* const> args);
int cmd_nop(std::span<char* const> args);
int cmd_perf(std::span<char* const> args);

}  // namespace averbs::cli
