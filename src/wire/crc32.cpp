// SPDX-License-Identifier: MIT
// CRC-32 by carry-less multiplication, 512 (or 256) bits per instruction.
//
// Why our own: the ICRC of every 4 KiB packet was a fifth of the sender's
// CPU in a bulk WRITE over UDP.  Debian 12's libdeflate (1.14) folds 128
// bits at a time with PCLMULQDQ, about 14 GB/s here; folding four 512-bit
// registers with VPCLMULQDQ (or eight 256-bit ones where the CPU has
// VPCLMULQDQ but not AVX-512) is several times that (twice, 186 against
// 329 ns per 4 KiB, on a Zen 3).  libdeflate still does buffers of 16 to
// 255 bytes (511 on the 256-bit path), the tail, and CPUs without
// VPCLMULQDQ; below 16 bytes a slicing-by-4 loop here (crc32_short).
//
// The method is the folding of Gopal et al., "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ Instruction" (Intel, 2009), in the
// bit-reflected form: a 128-bit lane is a polynomial whose first message
// bit is its x^127 term.  Moving a lane forward by d bits multiplies it by
// x^d; split into its first 64 bits H and last 64 bits L that is
// H * x^(d+64) + L * x^d, and modulo P each factor is a 32-bit constant,
// so two carry-less 64x64 products give a 96-bit value congruent to the
// lane, XORed into the lane d bits on.  The constants are computed here
// from P at first use.
#include "wire/crc32.hpp"

#include <libdeflate.h>

#include <array>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace averbs::wire {

std::uint32_t crc32_portable(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  return n == 0 ? crc : static_cast<std::uint32_t>(libdeflate_crc32(crc, p, n));
}

namespace {

// Below 16 bytes libdeflate (1.14) goes a byte at a time: 27 ns for the
// 12-byte BTH that every bulk packet's ICRC starts with, against 9 ns for
// 16 bytes.  Four bytes per step here (zlib's "slicing" tables: t[k][b]
// is the CRC register after byte b and k zero bytes).
struct slice4_tables {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  constexpr slice4_tables() noexcept {
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1u) != 0 ? (c >> 1) ^ crc32_poly_reflected : c >> 1;
      t[0][b] = c;
    }
    for (std::size_t k = 1; k < 4; ++k)
      for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};

constexpr slice4_tables slice4{};

std::uint32_t crc32_short(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  const auto& t = slice4.t;
  std::uint32_t c = ~crc;
  for (; n >= 4; n -= 4, p += 4) {
    c ^= std::to_integer<std::uint32_t>(p[0]) | std::to_integer<std::uint32_t>(p[1]) << 8 |
         std::to_integer<std::uint32_t>(p[2]) << 16 | std::to_integer<std::uint32_t>(p[3]) << 24;
    c = t[3][c & 0xFF] ^ t[2][(c >> 8) & 0xFF] ^ t[1][(c >> 16) & 0xFF] ^ t[0][c >> 24];
  }
  for (; n != 0; --n, ++p) c = t[0][(c ^ std::to_integer<std::uint32_t>(*p)) & 0xFF] ^ (c >> 8);
  return ~c;
}

constexpr std::size_t short_length = 16;  // below this, crc32_short

}  // namespace

#if defined(__x86_64__)

namespace {

// x^n mod P with P = x^32 + 0x04C11DB7 (bit j: the x^j coefficient).
std::uint64_t xpow_mod(unsigned n) noexcept {
  std::uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if ((r & (std::uint64_t{1} << 32)) != 0) r ^= 0x104C11DB7u;
  }
  return r;
}

std::uint64_t reflect64(std::uint64_t v) noexcept {
  std::uint64_t r = 0;
  for (int i = 0; i < 64; ++i) r |= ((v >> i) & 1u) << (63 - i);
  return r;
}

// The two multipliers that move a lane forward by d bits, in the lane's
// bit order: clmul(a, reflect64(k)) has bit t = the x^(126-t) term of
// a * k, one short of the lane's x^(127-t); so k is x^(N-1) mod P for
// the x^N the half needs.
struct fold_constants {
  std::uint64_t first;  // multiplies the lane's first 64 bits: x^(d+64)
  std::uint64_t last;   // multiplies its last 64 bits: x^d
};

fold_constants constants_for(unsigned d) noexcept { return {reflect64(xpow_mod(d + 63)), reflect64(xpow_mod(d - 1))}; }

struct all_constants {
  fold_constants by2048, by1536, by1024, by512, by384, by256, by128;
};

const all_constants& constants() noexcept {
  static const all_constants k{constants_for(2048), constants_for(1536), constants_for(1024), constants_for(512),
                               constants_for(384),  constants_for(256),  constants_for(128)};
  return k;
}

constexpr std::size_t min_fold_length = 256;

__attribute__((target("avx512f,vpclmulqdq,pclmul"))) __m512i broadcast(const fold_constants& k) noexcept {
  const auto first = static_cast<long long>(k.first), last = static_cast<long long>(k.last);
  return _mm512_set_epi64(last, first, last, first, last, first, last, first);
}

// The lanes of x moved forward by the distance of k, XORed into y.
__attribute__((target("avx512f,vpclmulqdq,pclmul"))) __m512i fold(__m512i x, __m512i k, __m512i y) noexcept {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), y,
                                   0x96);
}

// One 128-bit lane moved forward by the distance of k, XORed into y (both
// folds end with it).
__attribute__((target("pclmul"))) __m128i fold128(__m128i x, const fold_constants& k, __m128i y) noexcept {
  const __m128i kk = _mm_set_epi64x(static_cast<long long>(k.last), static_cast<long long>(k.first));
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, kk, 0x00), _mm_clmulepi64_si128(x, kk, 0x11)), y);
}

// What is left -- the folded 128 bits `r`, then the `n` bytes at `p` -- has
// the CRC of the whole, computed from register 0 (libdeflate's ~0 in).
std::uint32_t finish(__m128i r, const std::byte* p, std::size_t n) noexcept {
  alignas(16) std::array<std::byte, 16> last;
  _mm_store_si128(reinterpret_cast<__m128i*>(last.data()), r);
  const auto c = static_cast<std::uint32_t>(libdeflate_crc32(0xFFFFFFFFu, last.data(), last.size()));
  return crc32_portable(c, p, n);
}

// n >= min_fold_length.
__attribute__((target("avx512f,vpclmulqdq,pclmul"))) std::uint32_t crc32_fold(std::uint32_t crc, const std::byte* p,
                                                                              std::size_t n) noexcept {
  const all_constants& k = constants();
  // The starting register XORed into the first 32 message bits makes the
  // rest a plain remainder computation (register 0).
  __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, static_cast<long long>(~crc)));
  __m512i x1 = _mm512_loadu_si512(p + 64);
  __m512i x2 = _mm512_loadu_si512(p + 128);
  __m512i x3 = _mm512_loadu_si512(p + 192);
  p += 256;
  n -= 256;
  const __m512i k2048 = broadcast(k.by2048);
  while (n >= 256) {
    x0 = fold(x0, k2048, _mm512_loadu_si512(p));
    x1 = fold(x1, k2048, _mm512_loadu_si512(p + 64));
    x2 = fold(x2, k2048, _mm512_loadu_si512(p + 128));
    x3 = fold(x3, k2048, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  const __m512i k512 = broadcast(k.by512);
  x3 = fold(x0, broadcast(k.by1536), fold(x1, broadcast(k.by1024), fold(x2, k512, x3)));
  while (n >= 64) {
    x3 = fold(x3, k512, _mm512_loadu_si512(p));
    p += 64;
    n -= 64;
  }
  // Four lanes into the last one.  (Through memory: GCC 12 warns about
  // its own _mm512_extracti32x4_epi32.)
  alignas(64) __m128i lane[4];
  _mm512_store_si512(lane, x3);
  __m128i r = fold128(lane[2], k.by128, lane[3]);
  r = fold128(lane[1], k.by256, r);
  r = fold128(lane[0], k.by384, r);
  return finish(r, p, n);
}

// The same folding with 256-bit registers, for CPUs that have VPCLMULQDQ
// but not AVX-512 (AMD's Zen 3, where libdeflate 1.14 takes ~330 ns per
// 4 KiB): eight registers of two lanes cover the same 256 bytes a pass.
__attribute__((target("avx2,vpclmulqdq,pclmul"))) __m256i broadcast256(const fold_constants& k) noexcept {
  const auto first = static_cast<long long>(k.first), last = static_cast<long long>(k.last);
  return _mm256_set_epi64x(last, first, last, first);
}

__attribute__((target("avx2,vpclmulqdq,pclmul"))) __m256i fold256(__m256i x, __m256i k, __m256i y) noexcept {
  return _mm256_xor_si256(
      _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00), _mm256_clmulepi64_epi128(x, k, 0x11)), y);
}

__attribute__((target("avx2,vpclmulqdq,pclmul"))) __m256i load256(const std::byte* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Below 512 bytes libdeflate is as fast (crc32_bench on a Zen 3: 45 ns
// each at 512, 37 against 24 at 256): the fold's set-up and reduction cost
// about 30 ns.
constexpr std::size_t min_fold_length_avx2 = 512;

// n >= min_fold_length_avx2.
__attribute__((target("avx2,vpclmulqdq,pclmul"))) std::uint32_t crc32_fold_avx2(std::uint32_t crc,
                                                                                const std::byte* p,
                                                                                std::size_t n) noexcept {
  const all_constants& k = constants();
  __m256i x[8];
  for (std::size_t i = 0; i < 8; ++i) x[i] = load256(p + 32 * i);
  x[0] = _mm256_xor_si256(x[0], _mm256_set_epi64x(0, 0, 0, static_cast<long long>(~crc)));
  p += 256;
  n -= 256;
  const __m256i k2048 = broadcast256(k.by2048);
  while (n >= 256) {
    for (std::size_t i = 0; i < 8; ++i) x[i] = fold256(x[i], k2048, load256(p + 32 * i));
    p += 256;
    n -= 256;
  }
  // Eight registers into the last: each half onto the other, 128 bytes on,
  // then 64, then 32.
  const __m256i k1024 = broadcast256(k.by1024);
  for (std::size_t i = 0; i < 4; ++i) x[i + 4] = fold256(x[i], k1024, x[i + 4]);
  const __m256i k512 = broadcast256(k.by512);
  x[6] = fold256(x[4], k512, x[6]);
  x[7] = fold256(x[5], k512, x[7]);
  const __m256i k256 = broadcast256(k.by256);
  __m256i r = fold256(x[6], k256, x[7]);
  while (n >= 32) {
    r = fold256(r, k256, load256(p));
    p += 32;
    n -= 32;
  }
  return finish(fold128(_mm256_castsi256_si128(r), k.by128, _mm256_extracti128_si256(r, 1)), p, n);
}

struct cpu_paths {
  bool vpclmul256 = false, vpclmul512 = false;
};

cpu_paths detect() noexcept {
  __builtin_cpu_init();
  const bool vpclmul = __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul");
  return {vpclmul && __builtin_cpu_supports("avx2"), vpclmul && __builtin_cpu_supports("avx512f")};
}

const cpu_paths cpu = detect();
const crc32_path best_path = cpu.vpclmul512   ? crc32_path::vpclmul512
                             : cpu.vpclmul256 ? crc32_path::vpclmul256
                                              : crc32_path::libdeflate;

std::uint32_t crc32_along(crc32_path path, std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  if (n >= min_fold_length && path == crc32_path::vpclmul512) return crc32_fold(crc, p, n);
  if (n >= min_fold_length_avx2 && path == crc32_path::vpclmul256) return crc32_fold_avx2(crc, p, n);
  if (n < short_length) return crc32_short(crc, p, n);
  return crc32_portable(crc, p, n);
}

}  // namespace

crc32_path crc32_best_path() noexcept { return best_path; }

bool crc32_has_path(crc32_path path) noexcept {
  switch (path) {
    case crc32_path::libdeflate:
      return true;
    case crc32_path::vpclmul256:
      return cpu.vpclmul256;
    case crc32_path::vpclmul512:
      return cpu.vpclmul512;
  }
  return false;
}

std::uint32_t crc32(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  return crc32_along(best_path, crc, p, n);
}

std::uint32_t crc32_by(crc32_path path, std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  return crc32_along(crc32_has_path(path) ? path : crc32_path::libdeflate, crc, p, n);
}

#else

crc32_path crc32_best_path() noexcept { return crc32_path::libdeflate; }

bool crc32_has_path(crc32_path path) noexcept { return path == crc32_path::libdeflate; }

std::uint32_t crc32(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  if (n < short_length) return crc32_short(crc, p, n);
  return crc32_portable(crc, p, n);
}

std::uint32_t crc32_by(crc32_path, std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  return crc32(crc, p, n);
}

#endif

}  // namespace averbs::wire
