// SPDX-License-Identifier: MIT
// Counts every heap allocation of the test program (libaverbs included):
// link counting_new.cpp into the program, which replaces the global
// operator new, and read heap_allocations() around the code under test.
#pragma once

#include <cstdint>

namespace averbs::test {

/// operator new calls (all forms) since the program started.
std::uint64_t heap_allocations() noexcept;

/// While true, operator new fails (throws bad_alloc) on the calling thread.
void fail_allocations_on_this_thread(bool fail) noexcept;

/// The `n`th operator new from now on the calling thread fails, once (1:
/// the next one; 0 disarms).  Returns whether the last one armed has failed.
bool fail_nth_allocation_on_this_thread(std::uint64_t n) noexcept;

}  // namespace averbs::test
