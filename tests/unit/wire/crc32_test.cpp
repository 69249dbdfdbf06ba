// SPDX-License-Identifier: MIT
// The ICRC's CRC-32: the VPCLMULQDQ folding against zlib's crc32, an
// independent implementation, at every length around the fold's block
// boundaries, at odd alignments and when continued from a previous value.
#include "wire/crc32.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace {

namespace w = averbs::wire;

std::uint32_t zlib_crc(std::uint32_t crc, const std::byte* p, std::size_t n) {
  return static_cast<std::uint32_t>(::crc32(crc, reinterpret_cast<const Bytef*>(p), static_cast<uInt>(n)));
}

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(gen());
  return v;
}

TEST(crc32, matches_zlib_at_every_length_to_1100_and_every_alignment_mod_8) {
  const auto data = random_bytes(1200, 1);
  for (std::size_t off = 0; off < 8; ++off)
    for (std::size_t n = 0; n <= 1100; ++n)
      ASSERT_EQ(w::crc32(0, data.data() + off, n), zlib_crc(0, data.data() + off, n)) << "offset " << off << " length " << n;
}

TEST(crc32, matches_zlib_on_packet_and_jumbo_sizes) {
  const auto data = random_bytes(70000, 2);
  for (std::size_t n : {4096u, 4096u + 4u, 4096u + 60u, 8192u, 9000u, 65536u, 65536u + 13u})
    EXPECT_EQ(w::crc32(0, data.data() + 3, n), zlib_crc(0, data.data() + 3, n)) << "length " << n;
}

TEST(crc32, continues_from_a_previous_value_across_the_fold) {
  const auto data = random_bytes(5000, 3);
  const std::uint32_t whole = zlib_crc(0, data.data(), data.size());
  for (std::size_t cut : {1u, 8u, 12u, 255u, 256u, 257u, 1000u, 4096u, 4999u}) {
    const std::uint32_t first = w::crc32(0, data.data(), cut);
    EXPECT_EQ(w::crc32(first, data.data() + cut, data.size() - cut), whole) << "cut at " << cut;
  }
}

// Inputs under 16 bytes take their own path (four bytes per step):
// continued from arbitrary values, as the ICRC builder continues a cached
// header CRC with a packet's BTH.
TEST(crc32, short_inputs_continue_any_value_as_zlib_does) {
  const auto data = random_bytes(64, 5);
  std::mt19937 gen(6);
  for (int round = 0; round < 200; ++round) {
    const std::uint32_t start = round == 0 ? 0u : round == 1 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(gen());
    for (std::size_t n = 0; n < 16; ++n) {
      const std::size_t off = static_cast<std::size_t>(gen() % 40);
      ASSERT_EQ(w::crc32(start, data.data() + off, n), zlib_crc(start, data.data() + off, n))
          << "start " << start << " length " << n;
    }
  }
}

TEST(crc32, of_all_zeros_and_all_ones_matches_zlib) {
  for (std::byte fill : {std::byte{0}, std::byte{0xFF}}) {
    const std::vector<std::byte> v(4096, fill);
    EXPECT_EQ(w::crc32(0, v.data(), v.size()), zlib_crc(0, v.data(), v.size()));
    EXPECT_EQ(w::crc32(0xFFFFFFFFu, v.data(), v.size()), zlib_crc(0xFFFFFFFFu, v.data(), v.size()));
  }
}

TEST(crc32, the_folding_path_is_the_one_tested_on_this_cpu) {
  if (!w::crc32_has_vpclmul())
    GTEST_SKIP() << "this CPU has no AVX-512 VPCLMULQDQ: crc32() is libdeflate here, which the tests above cover";
  // The folding path and libdeflate agree, so the tests above exercised
  // the fold (every length >= 256) against zlib.
  const auto data = random_bytes(4096, 4);
  EXPECT_EQ(w::crc32(0x12345678u, data.data(), data.size()), w::crc32_portable(0x12345678u, data.data(), data.size()));
}

}  // namespace
