// SPDX-License-Identifier: MIT
// The ICRC's CRC-32: every path this CPU has (the VPCLMULQDQ folds on 512-
// and 256-bit registers, libdeflate) against zlib's crc32, an independent
// implementation, at every length around the fold's block boundaries, at
// odd alignments and when continued from a previous value.
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

// The paths this CPU can take, each named for the failure message.
std::vector<w::crc32_path> paths_here() {
  std::vector<w::crc32_path> v;
  for (auto p : {w::crc32_path::libdeflate, w::crc32_path::vpclmul256, w::crc32_path::vpclmul512})
    if (w::crc32_has_path(p)) v.push_back(p);
  return v;
}

const char* name(w::crc32_path p) {
  switch (p) {
    case w::crc32_path::libdeflate:
      return "libdeflate";
    case w::crc32_path::vpclmul256:
      return "vpclmul256";
    case w::crc32_path::vpclmul512:
      return "vpclmul512";
  }
  return "?";
}

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(gen());
  return v;
}

TEST(crc32, matches_zlib_at_every_length_to_1100_and_every_alignment_mod_8) {
  const auto data = random_bytes(1200, 1);
  for (auto path : paths_here())
    for (std::size_t off = 0; off < 8; ++off)
      for (std::size_t n = 0; n <= 1100; ++n)
        ASSERT_EQ(w::crc32_by(path, 0, data.data() + off, n), zlib_crc(0, data.data() + off, n))
            << name(path) << " offset " << off << " length " << n;
}

TEST(crc32, matches_zlib_on_packet_and_jumbo_sizes) {
  const auto data = random_bytes(70000, 2);
  for (auto path : paths_here())
    for (std::size_t n : {4096u, 4096u + 4u, 4096u + 60u, 8192u, 9000u, 65536u, 65536u + 13u})
      EXPECT_EQ(w::crc32_by(path, 0, data.data() + 3, n), zlib_crc(0, data.data() + 3, n))
          << name(path) << " length " << n;
}

TEST(crc32, continues_from_a_previous_value_across_the_fold) {
  const auto data = random_bytes(5000, 3);
  const std::uint32_t whole = zlib_crc(0, data.data(), data.size());
  for (auto path : paths_here())
    for (std::size_t cut : {1u, 8u, 12u, 255u, 256u, 257u, 1000u, 4096u, 4999u}) {
      const std::uint32_t first = w::crc32_by(path, 0, data.data(), cut);
      EXPECT_EQ(w::crc32_by(path, first, data.data() + cut, data.size() - cut), whole)
          << name(path) << " cut at " << cut;
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
  for (auto path : paths_here())
    for (std::byte fill : {std::byte{0}, std::byte{0xFF}}) {
      const std::vector<std::byte> v(4096, fill);
      EXPECT_EQ(w::crc32_by(path, 0, v.data(), v.size()), zlib_crc(0, v.data(), v.size())) << name(path);
      EXPECT_EQ(w::crc32_by(path, 0xFFFFFFFFu, v.data(), v.size()), zlib_crc(0xFFFFFFFFu, v.data(), v.size()))
          << name(path);
    }
}

// crc32() takes the widest fold the CPU has; the tests above covered it.
TEST(crc32, takes_the_widest_path_this_cpu_has) {
  const auto here = paths_here();
  EXPECT_EQ(w::crc32_best_path(), here.back()) << name(w::crc32_best_path());
  const auto data = random_bytes(4096, 4);
  EXPECT_EQ(w::crc32(0x12345678u, data.data(), data.size()),
            w::crc32_by(here.back(), 0x12345678u, data.data(), data.size()));
}

TEST(crc32, the_512_bit_fold_is_tested_where_the_cpu_has_it) {
  if (!w::crc32_has_path(w::crc32_path::vpclmul512))
    GTEST_SKIP() << "this CPU has no AVX-512 VPCLMULQDQ; the tests above covered the paths it has: "
                 << name(paths_here().back()) << " and below";
  EXPECT_EQ(w::crc32_best_path(), w::crc32_path::vpclmul512);
}

}  // namespace
