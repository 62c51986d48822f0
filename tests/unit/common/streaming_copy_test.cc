// CopyStreaming against memcpy's contract: every byte of the range copied,
// none outside it touched, at every alignment of both ends and every length
// around the 16-byte stores and 64-byte strides.
#include "optstate/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

namespace seeds = ::optstate::testing;

TEST(CopyStreamingTest, CopiesEveryByteOfTheRangeAndNoOtherAtEveryAlignment) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  constexpr size_t kRoom = 1024;
  std::vector<unsigned char> source(kRoom), before(kRoom);
  for (unsigned char& b : source) b = static_cast<unsigned char>(rng());
  for (unsigned char& b : before) b = static_cast<unsigned char>(rng());
  for (size_t dst_at = 0; dst_at < 32; ++dst_at) {
    for (size_t src_at = 0; src_at < 32; src_at += 3) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{63},
                           size_t{64}, size_t{65}, size_t{127}, size_t{128}, size_t{200},
                           size_t{640}, size_t{900}}) {
        alignas(64) unsigned char destination[kRoom];
        std::copy(before.begin(), before.end(), destination);
        CopyStreaming(destination + dst_at, source.data() + src_at, bytes);
        for (size_t i = 0; i < kRoom; ++i) {
          const bool inside = i >= dst_at && i < dst_at + bytes;
          const unsigned char expected = inside ? source[src_at + i - dst_at] : before[i];
          ASSERT_EQ(destination[i], expected)
              << "byte " << i << " of a copy of " << bytes << " bytes to +" << dst_at
              << " from +" << src_at;
        }
      }
    }
  }
}

TEST(CopyStreamingTest, CopiesALargeRangeAsMemcpyDoes) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> source((4 << 20) / 4 + 3);
  for (uint32_t& w : source) w = static_cast<uint32_t>(rng());
  std::vector<uint32_t> destination(source.size(), 0);
  CopyStreaming(destination.data() + 1, source.data() + 2, (source.size() - 3) * 4);
  EXPECT_EQ(destination[0], 0u);
  for (size_t i = 1; i + 2 < source.size(); ++i) ASSERT_EQ(destination[i], source[i + 1]) << i;
  EXPECT_EQ(destination[source.size() - 2], 0u);
  EXPECT_EQ(destination[source.size() - 1], 0u);
}

}  // namespace
}  // namespace optstate
