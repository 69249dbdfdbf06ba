// SPDX-License-Identifier: MIT
// How often a thread blocked: its voluntary context switches (/proc).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace averbs::test {

/// Blocking waits of thread `tid` so far; -1 if /proc does not say.
inline long voluntary_switches(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(24));
  return -1;
}

/// Waits (up to 10 s) until every thread in `tids` sleeps and stays asleep
/// for 20 ms (its voluntary switches unchanged, its state S), so counts
/// taken next see only wake-ups that come after: a fixed sleep of the test
/// thread does not prove that on a loaded machine, where a thread may go
/// to sleep only later (and that switch would count as a wake-up).
/// Returns whether they did.
template <class Tids>
bool wait_until_asleep(const Tids& tids) {
  auto sleeping = [](pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string stat;
    std::getline(in, stat);
    const auto paren = stat.rfind(')');  // the name may hold spaces
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'S';
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    std::vector<long> before;
    for (const auto& t : tids) before.push_back(voluntary_switches(t));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bool quiet = true;
    std::size_t i = 0;
    for (const auto& t : tids) quiet = quiet && sleeping(t) && voluntary_switches(t) == before[i++];
    if (quiet) return true;
  }
  return false;
}

}  // namespace averbs::test
