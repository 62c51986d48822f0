// SegmentedBytes against the same bytes held whole: every cut of a buffer
// into segments gives the same bytes, ranges and element runs.
#include "server/base/segmented_bytes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/random_cuts.h"
#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

using ::optstate::testing::RandomCuts;
namespace seeds = ::optstate::testing;

// `bytes` cut at `cuts` (ascending).
SegmentedBytes Cut(const std::string& bytes, const std::vector<size_t>& cuts) {
  SegmentedBytes segmented;
  ::optstate::testing::ForEachPiece(bytes, cuts,
                                    [&](absl::string_view piece) { segmented.Append(piece); });
  return segmented;
}

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

TEST(SegmentedBytes, OneBufferIsOneSegment) {
  const std::string bytes = "abcdefgh";
  const SegmentedBytes whole(bytes);
  EXPECT_EQ(whole.size(), 8u);
  EXPECT_EQ(whole.segment_count(), 1u);
  EXPECT_EQ(whole.Contiguous(2, 6), bytes.data() + 2);
  EXPECT_TRUE(SegmentedBytes().empty());
  EXPECT_EQ(SegmentedBytes(std::string()).segment_count(), 0u) << "empty segments are dropped";
}

TEST(SegmentedBytes, ContiguousOnlyWithinOneSegment) {
  const std::string bytes = "abcdefgh";
  const SegmentedBytes cut = Cut(bytes, {3, 5});  // abc | de | fgh
  EXPECT_EQ(cut.segment_count(), 3u);
  EXPECT_EQ(cut.Contiguous(0, 3), bytes.data());
  EXPECT_EQ(cut.Contiguous(3, 2), bytes.data() + 3);
  EXPECT_EQ(cut.Contiguous(2, 2), nullptr);
  EXPECT_EQ(cut.Contiguous(4, 4), nullptr);
  EXPECT_EQ(cut.Contiguous(7, 1), bytes.data() + 7);
}

TEST(SegmentedBytes, AnyCutGivesTheSameRangesAndElements) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t element_size = trial % 2 == 0 ? 4 : 2;
    const size_t n = std::uniform_int_distribution<size_t>(1, 300)(rng) * element_size;
    const std::string bytes = RandomBytes(n, rng);
    const SegmentedBytes cut = Cut(bytes, RandomCuts(n, trial % 5 == 0 ? 200 : 8, rng));
    ASSERT_EQ(cut.size(), n);

    const size_t begin = std::uniform_int_distribution<size_t>(0, n)(rng);
    const size_t length = std::uniform_int_distribution<size_t>(0, n - begin)(rng);
    std::string copied(length, '\0');
    cut.CopyTo(begin, length, copied.data());
    ASSERT_EQ(copied, bytes.substr(begin, length)) << trial;
    if (const char* direct = cut.Contiguous(begin, length); direct != nullptr && length > 0) {
      ASSERT_EQ(std::string(direct, length), bytes.substr(begin, length)) << trial;
    }

    // Element runs from an element boundary, joined up, are the bytes; each
    // run starts where the last ended.
    const size_t first_element = begin / element_size;
    const size_t count = (n / element_size) - first_element;
    std::string joined;
    size_t next = 0;
    ASSERT_TRUE(cut.ForEachElementRun(first_element * element_size, element_size, count,
                                      [&](size_t first, size_t runs, const char* data) {
                                        EXPECT_EQ(first, next);
                                        EXPECT_GT(runs, 0u);
                                        next = first + runs;
                                        joined.append(data, runs * element_size);
                                        return true;
                                      }));
    ASSERT_EQ(next, count) << trial;
    ASSERT_EQ(joined, bytes.substr(first_element * element_size)) << trial;
  }
}

TEST(SegmentedBytes, ElementRunsStopWhenTheVisitorSaysSo) {
  const std::string bytes(64, 'x');
  const SegmentedBytes cut = Cut(bytes, {5, 9, 30});
  int visits = 0;
  EXPECT_FALSE(
      cut.ForEachElementRun(0, 4, 16, [&](size_t, size_t, const char*) { return ++visits < 2; }));
  EXPECT_EQ(visits, 2);
}

TEST(SegmentedBytes, AnElementSplitAcrossManySegmentsIsJoined) {
  const std::string bytes = "0123456789ab";
  const SegmentedBytes cut = Cut(bytes, {1, 2, 3, 5, 6, 7});  // Mostly 1-byte segments.
  std::vector<std::string> elements;
  ASSERT_TRUE(cut.ForEachElementRun(0, 4, 3, [&](size_t first, size_t n, const char* data) {
    for (size_t i = 0; i < n; ++i) elements.emplace_back(data + 4 * i, 4);
    return true;
  }));
  EXPECT_EQ(elements, (std::vector<std::string>{"0123", "4567", "89ab"}));
}

}  // namespace
}  // namespace optstate
