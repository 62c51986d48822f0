// PagingPolicy: placement under each strategy, refusal messages, first-fit
// promotion after a resident group goes, fallback, and the budget's carve-out
// for the staging pool.
#include "server/backends/cuda/paging/paging_policy.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optstate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// 1000 bytes available (total 2000 at 50%), 100 of them for the pool: 900
// for resident groups.
PagingPolicy SmallPolicy(PagingStrategy strategy) {
  return PagingPolicy(strategy, VramBudget(2000, 0, 0.5), 100);
}

TEST(PagingStrategyTest, ParsesTheFlagValues) {
  EXPECT_EQ(*ParsePagingStrategy("none"), PagingStrategy::kNone);
  EXPECT_EQ(*ParsePagingStrategy("adaptive"), PagingStrategy::kAdaptive);
  EXPECT_EQ(*ParsePagingStrategy("fully_paged"), PagingStrategy::kFullyPaged);
  for (PagingStrategy s :
       {PagingStrategy::kNone, PagingStrategy::kAdaptive, PagingStrategy::kFullyPaged}) {
    EXPECT_EQ(*ParsePagingStrategy(PagingStrategyName(s)), s);
  }
  absl::StatusOr<PagingStrategy> bad = ParsePagingStrategy("paged");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("none, adaptive or fully_paged"));
}

TEST(PagingPolicyTest, StagingPoolIsCarvedOutOfTheBudget) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kAdaptive);
  EXPECT_EQ(policy.budget().available_bytes(), 1000u);
  EXPECT_EQ(policy.resident_capacity_bytes(), 900u);
  PagingPolicy starved(PagingStrategy::kAdaptive, VramBudget(2000, 0, 0.5), 5000);
  EXPECT_EQ(starved.resident_capacity_bytes(), 0u);
  EXPECT_EQ(*starved.Admit(1, "a", 1), Placement::kDevicePaged);
}

TEST(PagingPolicyTest, NoneKeepsEveryGroupResidentWhileItFits) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kNone);
  EXPECT_EQ(*policy.Admit(1, "a", 400), Placement::kDeviceResident);
  EXPECT_EQ(*policy.Admit(2, "b", 500), Placement::kDeviceResident);  // Exactly full.
  EXPECT_EQ(policy.resident_bytes(), 900u);
}

TEST(PagingPolicyTest, NoneRefusesWhatDoesNotFitSayingBytesNeededAndAvailable) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kNone);
  ASSERT_TRUE(policy.Admit(1, "a", 400).ok());
  absl::StatusOr<Placement> refused = policy.Admit(2, "big.weight", 501);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("'big.weight'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("needs 501 bytes"));
  EXPECT_THAT(refused.status().message(), HasSubstr("only 500 of 900 bytes are available"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--paging=adaptive"));
  // A refused group is not recorded and takes nothing.
  EXPECT_EQ(policy.num_groups(), 1u);
  EXPECT_EQ(policy.resident_bytes(), 400u);
  EXPECT_EQ(policy.placement(2), Placement::kHost);
  // Freeing room makes it fit; none never promotes.
  EXPECT_THAT(policy.Remove(1), IsEmpty());
  EXPECT_EQ(*policy.Admit(2, "big.weight", 501), Placement::kDeviceResident);
}

TEST(PagingPolicyTest, AdaptivePagesWhatDoesNotFitAndKeepsFillingFirstFit) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kAdaptive);
  EXPECT_EQ(*policy.Admit(1, "a", 600), Placement::kDeviceResident);
  EXPECT_EQ(*policy.Admit(2, "b", 400), Placement::kDevicePaged);
  EXPECT_EQ(*policy.Admit(3, "c", 300), Placement::kDeviceResident);  // Exactly fills.
  EXPECT_EQ(*policy.Admit(4, "d", 1), Placement::kDevicePaged);
  EXPECT_EQ(policy.resident_bytes(), 900u);
  EXPECT_EQ(policy.placement(2), Placement::kDevicePaged);
}

TEST(PagingPolicyTest, AdaptivePromotesPagedGroupsInAdmissionOrderWhenResidentOneGoes) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kAdaptive);
  ASSERT_EQ(*policy.Admit(1, "a", 800), Placement::kDeviceResident);
  ASSERT_EQ(*policy.Admit(2, "b", 500), Placement::kDevicePaged);
  ASSERT_EQ(*policy.Admit(3, "c", 700), Placement::kDevicePaged);
  ASSERT_EQ(*policy.Admit(4, "d", 300), Placement::kDevicePaged);
  ASSERT_EQ(*policy.Admit(5, "e", 100), Placement::kDeviceResident);
  // 800 freed, 800 free: b (500) fits, c (700) no longer does, d (300) does.
  EXPECT_THAT(policy.Remove(1), ElementsAre(2, 4));
  EXPECT_EQ(policy.placement(2), Placement::kDeviceResident);
  EXPECT_EQ(policy.placement(3), Placement::kDevicePaged);
  EXPECT_EQ(policy.placement(4), Placement::kDeviceResident);
  EXPECT_EQ(policy.resident_bytes(), 900u);
}

TEST(PagingPolicyTest, RemovingAPagedGroupPromotesNobody) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kAdaptive);
  ASSERT_EQ(*policy.Admit(1, "a", 900), Placement::kDeviceResident);
  ASSERT_EQ(*policy.Admit(2, "b", 10), Placement::kDevicePaged);
  ASSERT_EQ(*policy.Admit(3, "c", 10), Placement::kDevicePaged);
  EXPECT_THAT(policy.Remove(2), IsEmpty());
  EXPECT_THAT(policy.Remove(42), IsEmpty());  // Unknown ids are ignored.
  EXPECT_EQ(policy.placement(3), Placement::kDevicePaged);
}

TEST(PagingPolicyTest, FullyPagedPagesEverything) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kFullyPaged);
  EXPECT_EQ(*policy.Admit(1, "a", 1), Placement::kDevicePaged);
  EXPECT_EQ(*policy.Admit(2, "b", 100000), Placement::kDevicePaged);
  EXPECT_EQ(policy.resident_bytes(), 0u);
  EXPECT_THAT(policy.Remove(1), IsEmpty());
}

TEST(PagingPolicyTest, FallBackToPagedReturnsBytesWithoutPromoting) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kAdaptive);
  ASSERT_EQ(*policy.Admit(1, "a", 800), Placement::kDeviceResident);
  ASSERT_EQ(*policy.Admit(2, "b", 500), Placement::kDevicePaged);
  policy.FallBackToPaged(1);
  EXPECT_EQ(policy.placement(1), Placement::kDevicePaged);
  EXPECT_EQ(policy.placement(2), Placement::kDevicePaged);
  EXPECT_EQ(policy.resident_bytes(), 0u);
  // Removing a group that fell back frees no resident bytes: no promotion.
  EXPECT_THAT(policy.Remove(1), IsEmpty());
  EXPECT_EQ(*policy.Admit(3, "c", 900), Placement::kDeviceResident);
}

TEST(PagingPolicyTest, RefusesADuplicateId) {
  PagingPolicy policy = SmallPolicy(PagingStrategy::kAdaptive);
  ASSERT_TRUE(policy.Admit(1, "a", 10).ok());
  EXPECT_EQ(policy.Admit(1, "a", 10).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagingPolicyTest, ConcurrentAdmitAndRemoveNeverOvercommit) {
  PagingPolicy policy(PagingStrategy::kAdaptive, VramBudget(1 << 20, 0, 0.5), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&policy, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        const uint64_t id = t * 1000000 + i;
        ASSERT_TRUE(policy.Admit(id, "g", 1000 + 37 * (i % 50)).ok());
        EXPECT_LE(policy.resident_bytes(), policy.resident_capacity_bytes());
        if (i % 3 != 0) policy.Remove(id);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(policy.resident_bytes(), policy.resident_capacity_bytes());
}

}  // namespace
}  // namespace optstate
