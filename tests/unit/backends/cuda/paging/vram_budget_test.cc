// VramBudget: clamping of the target, saturating availability, the fits()
// boundary, and properties over random totals, reservations and targets.
#include "server/backends/cuda/paging/vram_budget.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace optstate {
namespace {

TEST(VramBudgetTest, TargetBelowHalfIsClampedToHalf) {
  VramBudget budget(1000, 0, 0.1);
  EXPECT_EQ(budget.target_utilization(), 0.5);
  EXPECT_EQ(budget.available_bytes(), 500u);
}

TEST(VramBudgetTest, TargetAboveNinetyFivePercentIsClamped) {
  VramBudget budget(1000, 0, 1.0);
  EXPECT_EQ(budget.target_utilization(), 0.95);
  EXPECT_EQ(budget.available_bytes(), 950u);
  EXPECT_EQ(VramBudget(1000, 0, 7.0).available_bytes(), 950u);
}

TEST(VramBudgetTest, NanTargetReadsAsHalf) {
  VramBudget budget(1000, 0, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(budget.target_utilization(), 0.5);
  EXPECT_EQ(budget.available_bytes(), 500u);
}

TEST(VramBudgetTest, TargetInsideRangeIsKept) {
  EXPECT_EQ(VramBudget::ClampTargetUtilization(0.8), 0.8);
  EXPECT_EQ(VramBudget::ClampTargetUtilization(0.5), 0.5);
  EXPECT_EQ(VramBudget::ClampTargetUtilization(0.95), 0.95);
  EXPECT_EQ(VramBudget(1000, 0, 0.8).available_bytes(), 800u);
}

TEST(VramBudgetTest, AvailableIsShareLessReserved) {
  EXPECT_EQ(VramBudget(1000, 100, 0.9).available_bytes(), 800u);
  // 141 GiB H200 figure, 2 GiB reserved, 90%.
  const uint64_t total = 151'397'597'184ull;
  EXPECT_EQ(VramBudget(total, 2ull << 30, 0.9).available_bytes(),
            static_cast<uint64_t>(std::floor(total * 0.9L)) - (2ull << 30));
}

TEST(VramBudgetTest, AvailableIsNeverNegative) {
  EXPECT_EQ(VramBudget(1000, 2000, 0.9).available_bytes(), 0u);
  EXPECT_EQ(VramBudget(1000, 900, 0.9).available_bytes(), 0u);  // reserved == share
  EXPECT_EQ(VramBudget(1000, 899, 0.9).available_bytes(), 1u);
  EXPECT_EQ(VramBudget(0, 0, 0.9).available_bytes(), 0u);
  EXPECT_EQ(VramBudget(0, UINT64_MAX, 0.9).available_bytes(), 0u);
}

TEST(VramBudgetTest, FitsAtTheBoundary) {
  VramBudget budget(1000, 100, 0.9);  // 800 available
  EXPECT_TRUE(budget.fits(0));
  EXPECT_TRUE(budget.fits(799));
  EXPECT_TRUE(budget.fits(800));
  EXPECT_FALSE(budget.fits(801));
  EXPECT_FALSE(budget.fits(UINT64_MAX));
  VramBudget empty(1000, 5000, 0.9);
  EXPECT_TRUE(empty.fits(0));
  EXPECT_FALSE(empty.fits(1));
}

TEST(VramBudgetTest, LargestTotalDoesNotOverflow) {
  VramBudget budget(UINT64_MAX, 0, 0.95);
  EXPECT_LE(budget.available_bytes(), UINT64_MAX);
  const long double expected = std::floor(static_cast<long double>(UINT64_MAX) * 0.95L);
  EXPECT_NEAR(static_cast<long double>(budget.available_bytes()), expected, 4096.0L);
}

// Random totals (small, realistic and full 64-bit), reservations around the
// share, and targets inside and outside [0.5, 0.95], including NaN.
TEST(VramBudgetPropertyTest, RandomBudgetsKeepTheirInvariants) {
  std::mt19937_64 rng(20261129);
  std::uniform_real_distribution<double> target_dist(-0.5, 1.5);
  for (int i = 0; i < 20000; ++i) {
    uint64_t total;
    switch (i % 3) {
      case 0:
        total = rng() % 4096;
        break;
      case 1:
        total = rng() % (200ull << 30);
        break;
      default:
        total = rng();
        break;
    }
    const double target = i % 97 == 0 ? std::nan("") : target_dist(rng);
    const long double share_estimate =
        static_cast<long double>(total) * VramBudget::ClampTargetUtilization(target);
    uint64_t reserved;
    switch (i % 4) {
      case 0:
        reserved = 0;
        break;
      case 1:
        reserved = total == 0 ? 0 : rng() % total;
        break;
      case 2:
        reserved = static_cast<uint64_t>(share_estimate);
        break;
      default:
        reserved = rng();
        break;
    }
    const VramBudget budget(total, reserved, target);
    SCOPED_TRACE(budget.ToString());

    const double t = budget.target_utilization();
    ASSERT_GE(t, 0.5);
    ASSERT_LE(t, 0.95);
    if (target >= 0.5 && target <= 0.95) {
      ASSERT_EQ(t, target);
    }

    const uint64_t available = budget.available_bytes();
    ASSERT_LE(available, total);
    // available + reserved is floor(total * t) unless it saturated at zero,
    // with t read to nine decimals: off by at most total * 0.5e-9, plus a
    // byte for the floor and the long double estimate.
    const long double slack = static_cast<long double>(total) * 0.5e-9L + 2.0L;
    if (available > 0) {
      const long double share = static_cast<long double>(available) + reserved;
      ASSERT_LE(share, share_estimate + slack);
      ASSERT_GE(share, share_estimate - slack);
    } else {
      ASSERT_GE(static_cast<long double>(reserved) + slack, share_estimate);
    }

    ASSERT_TRUE(budget.fits(available));
    ASSERT_TRUE(budget.fits(0));
    if (available < UINT64_MAX) {
      ASSERT_FALSE(budget.fits(available + 1));
    }

    // One more reserved byte costs exactly one byte until availability is 0.
    if (reserved < UINT64_MAX) {
      const VramBudget tighter(total, reserved + 1, target);
      ASSERT_EQ(tighter.available_bytes(), available == 0 ? 0 : available - 1);
    }
    // A larger target never gives less.
    const VramBudget looser(total, reserved, std::min(0.95, t + 0.01));
    ASSERT_GE(looser.available_bytes(), available);
  }
}

// Exact against 128-bit integer arithmetic for targets of three decimals.
TEST(VramBudgetPropertyTest, MatchesIntegerArithmeticForDecimalTargets) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t total = i % 2 == 0 ? rng() % (1ull << 40) : rng();
    const uint64_t permille = 500 + rng() % 451;  // 0.500 .. 0.950
    const double target = static_cast<double>(permille) / 1000.0;
    const uint64_t reserved = rng() % (total / 2 + 1);
    const VramBudget budget(total, reserved, target);
    const auto share =
        static_cast<uint64_t>(static_cast<unsigned __int128>(total) * permille / 1000);
    ASSERT_EQ(budget.available_bytes(), share > reserved ? share - reserved : 0)
        << "total=" << total << " target=" << target << " reserved=" << reserved;
  }
}

}  // namespace
}  // namespace optstate
