// SPDX-License-Identifier: MIT
// splitmix64 (Steele, Lea and Flood): a generator small enough to keep in
// every object that draws (fault links, a device's key bytes), seedable
// and the same on every platform, and its finalizer as a 64-bit mixer.
#pragma once

#include <cstdint>

namespace averbs::soft {

inline std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The next draw of the generator whose state is `state`.
inline std::uint64_t splitmix_next(std::uint64_t& state) noexcept {
  return mix64(state += 0x9E3779B97F4A7C15ull);
}

}  // namespace averbs::soft
