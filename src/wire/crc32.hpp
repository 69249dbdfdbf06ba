// SPDX-License-Identifier: MIT
// CRC-32 (IEEE 802.3, reflected, as zlib and the RoCE ICRC use it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace averbs::wire {

/// The CRC-32 polynomial 0x04C11DB7 in reflected bit order (bit 31 is x^0).
inline constexpr std::uint32_t crc32_poly_reflected = 0xEDB88320u;

/// Continues a CRC-32: `crc` is a finished value (0 to start), as zlib's
/// and libdeflate's crc32 take it.  Long buffers are folded 256 bytes at a
/// time with VPCLMULQDQ on CPUs that have AVX-512 and it; everything else
/// goes to libdeflate.
std::uint32_t crc32(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept;

/// libdeflate only (the reference the fast path is tested against).
std::uint32_t crc32_portable(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept;

/// Whether crc32() folds with VPCLMULQDQ on this CPU.
bool crc32_has_vpclmul() noexcept;

}  // namespace averbs::wire
