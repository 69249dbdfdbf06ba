// SPDX-License-Identifier: MIT
// How often a thread blocked: its voluntary context switches (/proc).
#pragma once

#include <sys/types.h>

#include <fstream>
#include <string>

namespace averbs::test {

/// Blocking waits of thread `tid` so far; -1 if /proc does not say.
inline long voluntary_switches(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(24));
  return -1;
}

}  // namespace averbs::test
