// CRC32C against published check values (RFC 3720 B.4 and the standard
// "123456789" check), and the hardware path against the table path.
#include "server/durability/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace optstate {
namespace {

TEST(Crc32cTest, MatchesPublishedCheckValues) {
  EXPECT_EQ(Crc32cExtend(0, "123456789", 9), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(Crc32cExtend(0, zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32cExtend(0, ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32cExtend(0, ascending.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32cExtendPortable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtend(0, "", 0), 0u);
}

TEST(Crc32cTest, ExtendingPieceByPieceEqualsTheWhole) {
  std::mt19937 rng(7);
  std::string data(10007, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32cExtend(0, data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{4096}, data.size()}) {
    uint32_t crc = Crc32cExtend(0, data.data(), cut);
    crc = Crc32cExtend(crc, data.data() + cut, data.size() - cut);
    EXPECT_EQ(crc, whole) << cut;
  }
}

TEST(Crc32cTest, HardwareAndTablePathsAgree) {
  std::mt19937 rng(11);
  for (size_t n = 0; n < 300; ++n) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const size_t offset = n % 8;  // Unaligned starts too.
    if (offset > n) continue;
    EXPECT_EQ(Crc32cExtend(123, data.data() + offset, n - offset),
              Crc32cExtendPortable(123, data.data() + offset, n - offset))
        << n;
  }
}

TEST(Crc32cTest, CombiningTheCrcsOfTwoPiecesEqualsTheCrcOfBoth) {
  std::mt19937 rng(13);
  std::string data(70001, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32cExtend(0, data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{3}, size_t{4096}, size_t{65537}, data.size()}) {
    const uint32_t a = Crc32cExtend(0, data.data(), cut);
    const uint32_t b = Crc32cExtend(0, data.data() + cut, data.size() - cut);
    EXPECT_EQ(Crc32cCombine(a, b, data.size() - cut), whole) << cut;
  }
  EXPECT_EQ(Crc32cCombine(Crc32cExtend(0, "1234", 4), Crc32cExtend(0, "56789", 5), 5), 0xE3069283u);
}

// Lengths around the three-stream rounds of the hardware path (3 x 8 KiB):
// below one, exactly one, one and a byte, several, with an unaligned start
// and a running CRC carried in.
TEST(Crc32cTest, InterleavedStreamsAgreeWithTheTablePath) {
  std::mt19937 rng(17);
  std::string data(4 * 24576 + 64, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t n : {size_t{24575}, size_t{24576}, size_t{24577}, size_t{24576 + 8},
                   size_t{2 * 24576 - 1}, size_t{3 * 24576 + 13}, size_t{4 * 24576}}) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      EXPECT_EQ(Crc32cExtend(0x1234567u, data.data() + offset, n),
                Crc32cExtendPortable(0x1234567u, data.data() + offset, n))
          << n << " from " << offset;
    }
  }
}

}  // namespace
}  // namespace optstate
