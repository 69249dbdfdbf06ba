// SPDX-License-Identifier: MIT
// CRC-32 (IEEE 802.3, reflected, as zlib and the RoCE ICRC use it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace averbs::wire {

/// The CRC-32 polynomial 0x04C11DB7 in reflected bit order (bit 31 is x^0).
inline constexpr std::uint32_t crc32_poly_reflected = 0xEDB88320u;

/// How crc32() computes long buffers (256 bytes and more on the 512-bit
/// path, 512 and more on the 256-bit one; libdeflate below).
enum class crc32_path {
  libdeflate,  ///< libdeflate's PCLMULQDQ, 128 bits at a time
  vpclmul256,  ///< VPCLMULQDQ on eight 256-bit registers (AVX2)
  vpclmul512,  ///< VPCLMULQDQ on four 512-bit registers (AVX-512)
};

/// Continues a CRC-32: `crc` is a finished value (0 to start), as zlib's
/// and libdeflate's crc32 take it.  Long buffers are folded 256 bytes at a
/// time with VPCLMULQDQ on CPUs that have it (crc32_best_path()); everything
/// else goes to libdeflate.
std::uint32_t crc32(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept;

/// libdeflate only (the reference the fast path is tested against).
std::uint32_t crc32_portable(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept;

/// The path crc32() takes on this CPU: the widest it has.
crc32_path crc32_best_path() noexcept;

/// Whether this CPU can take `path`.
bool crc32_has_path(crc32_path path) noexcept;

/// crc32() along `path` (libdeflate where the CPU lacks it): for the tests
/// and the benchmark, which compare the paths on one CPU.
std::uint32_t crc32_by(crc32_path path, std::uint32_t crc, const std::byte* p, std::size_t n) noexcept;

}  // namespace averbs::wire
