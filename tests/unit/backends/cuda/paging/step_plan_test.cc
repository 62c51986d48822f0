// Step plans: what a paged and a resident step copy, which page runs move in
// lazily, what uploads of initial params and syncs back to host copy, and
// what reading state to the host and overwriting it (checkpoints, imports)
// copy and mark stale.
#include "server/backends/cuda/paging/step_plan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optstate {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// 10 pages of 100 elements, the last one 50 long.
constexpr PageGeometry kGeometry{100, 950};

StepTraffic Traffic(uint64_t ins, uint64_t outs, uint64_t h2d, uint64_t d2h) {
  StepTraffic t;
  t.page_ins = ins;
  t.page_outs = outs;
  t.bytes_host_to_device = h2d;
  t.bytes_device_to_host = d2h;
  return t;
}

TEST(StepPlanTest, PagedStepMovesEveryTouchedPageInAndOut) {
  PageResidency residency(10);
  StepPlan plan = PlanStep(Placement::kDevicePaged, residency, kGeometry, 200, 500, 4);
  EXPECT_FALSE(plan.on_device_arrays);
  EXPECT_THAT(plan.page_ins, IsEmpty());
  // 3 pages, 300 elements: p, m, v and an fp32 gradient in; p, m, v out.
  EXPECT_EQ(plan.traffic, Traffic(3, 3, 300 * 16, 300 * 12));
}

TEST(StepPlanTest, PagedStepCountsTheShortLastPageAndNarrowGradients) {
  PageResidency residency(10);
  StepPlan plan = PlanStep(Placement::kDevicePaged, residency, kGeometry, 800, 950, 2);
  EXPECT_EQ(plan.traffic, Traffic(2, 2, 150 * 14, 150 * 12));
}

TEST(StepPlanTest, ResidentStepWithEveryPageOnDeviceMovesOnlyGradientAndParams) {
  PageResidency residency(10);
  residency.MarkOnDevice(0, 10);
  StepPlan plan = PlanStep(Placement::kDeviceResident, residency, kGeometry, 0, 950, 2);
  EXPECT_TRUE(plan.on_device_arrays);
  EXPECT_THAT(plan.page_ins, IsEmpty());
  EXPECT_EQ(plan.traffic, Traffic(0, 0, 950 * 2, 950 * 4));
  EXPECT_EQ(plan.first_page, 0u);
  EXPECT_EQ(plan.end_page, 10u);
}

TEST(StepPlanTest, ResidentStepPagesInMaximalRunsOfMissingPages) {
  PageResidency residency(10);
  residency.MarkOnDevice(3, 5);  // Pages 3, 4 on the device.
  residency.MarkOnDevice(8, 9);  // Page 8.
  StepPlan plan = PlanStep(Placement::kDeviceResident, residency, kGeometry, 100, 950, 4);
  EXPECT_THAT(plan.page_ins,
              ElementsAre(ElementRange{100, 300}, ElementRange{500, 800}, ElementRange{900, 950}));
  // Pages 1,2 + 5,6,7 + 9 = 6 page-ins of 200+300+50 elements.
  EXPECT_EQ(plan.traffic, Traffic(6, 0, 550 * 12 + 850 * 4, 850 * 4));
  EXPECT_EQ(plan.first_page, 1u);
  EXPECT_EQ(plan.end_page, 10u);
}

TEST(StepPlanTest, ParamsUploadGoesOnlyToPagesOnTheDevice) {
  PageResidency residency(10);
  residency.MarkOnDevice(0, 2);
  ParamsUploadPlan plan =
      PlanParamsUpload(Placement::kDeviceResident, residency, kGeometry, 100, 300);
  EXPECT_THAT(plan.uploads, ElementsAre(ElementRange{100, 200}));
  EXPECT_EQ(plan.traffic, Traffic(0, 0, 400, 0));
  EXPECT_THAT(PlanParamsUpload(Placement::kDevicePaged, residency, kGeometry, 0, 950).uploads,
              IsEmpty());
}

TEST(StepPlanTest, SyncToHostCopiesEveryPageOnTheDeviceBack) {
  PageResidency residency(10);
  residency.MarkOnDevice(2, 4);
  residency.MarkOnDevice(9, 10);
  ParamsUploadPlan plan = PlanSyncToHost(Placement::kDeviceResident, residency, kGeometry);
  EXPECT_THAT(plan.uploads, ElementsAre(ElementRange{200, 400}, ElementRange{900, 950}));
  EXPECT_EQ(plan.traffic, Traffic(0, 3, 0, 250 * 12));
  EXPECT_THAT(PlanSyncToHost(Placement::kDevicePaged, residency, kGeometry).uploads, IsEmpty());
}

TEST(StepPlanTest, MarkOffDeviceClearsOnlyItsPages) {
  PageResidency residency(10);
  residency.MarkOnDevice(0, 10);
  residency.MarkOffDevice(3, 6);
  EXPECT_EQ(residency.CountOnDevice(), 7u);
  EXPECT_TRUE(residency.on_device(2));
  EXPECT_FALSE(residency.on_device(3));
  EXPECT_FALSE(residency.on_device(5));
  EXPECT_TRUE(residency.on_device(6));
}

TEST(StepPlanTest, StateToHostCopiesThePagesOfTheRangeOnTheDeviceClipped) {
  PageResidency residency(10);
  residency.MarkOnDevice(1, 4);  // Pages 1, 2, 3.
  residency.MarkOnDevice(9, 10);
  ParamsUploadPlan plan =
      PlanStateToHost(Placement::kDeviceResident, residency, kGeometry, 250, 950);
  EXPECT_THAT(plan.uploads, ElementsAre(ElementRange{250, 400}, ElementRange{900, 950}));
  // Pages 2, 3 and 9: 200 elements of p, m and v back.
  EXPECT_EQ(plan.traffic, Traffic(0, 3, 0, 200 * 12));
  EXPECT_THAT(PlanStateToHost(Placement::kDeviceResident, residency, kGeometry, 400, 900).uploads,
              IsEmpty());
  EXPECT_THAT(PlanStateToHost(Placement::kDevicePaged, residency, kGeometry, 0, 950).uploads,
              IsEmpty());
  EXPECT_THAT(PlanStateToHost(Placement::kHost, residency, kGeometry, 0, 950).uploads, IsEmpty());
  EXPECT_THAT(PlanStateToHost(Placement::kDeviceResident, residency, kGeometry, 300, 300).uploads,
              IsEmpty());
}

TEST(StepPlanTest, StateWrittenOverWholePagesMarksThemStaleAndCopiesNothing) {
  PageResidency residency(10);
  residency.MarkOnDevice(0, 10);
  StateWrittenPlan plan =
      PlanStateWritten(Placement::kDeviceResident, residency, kGeometry, 0, 950);
  EXPECT_EQ(plan.first_stale_page, 0u);
  EXPECT_EQ(plan.end_stale_page, 10u);
  EXPECT_THAT(plan.uploads, IsEmpty());
  EXPECT_EQ(plan.traffic, Traffic(0, 0, 0, 0));
  plan = PlanStateWritten(Placement::kDeviceResident, residency, kGeometry, 200, 500);
  EXPECT_EQ(plan.first_stale_page, 2u);
  EXPECT_EQ(plan.end_stale_page, 5u);
  EXPECT_THAT(plan.uploads, IsEmpty());
}

TEST(StepPlanTest, StateWrittenCopiesTheWrittenPartsOfPartlyCoveredPagesOnTheDevice) {
  PageResidency residency(10);
  residency.MarkOnDevice(0, 10);
  // Pages 1 (from 150) and 6 (to 620) are partly inside; 2..5 wholly.
  StateWrittenPlan plan =
      PlanStateWritten(Placement::kDeviceResident, residency, kGeometry, 150, 620);
  EXPECT_EQ(plan.first_stale_page, 2u);
  EXPECT_EQ(plan.end_stale_page, 6u);
  EXPECT_THAT(plan.uploads, ElementsAre(ElementRange{150, 200}, ElementRange{600, 620}));
  EXPECT_EQ(plan.traffic, Traffic(0, 0, 70 * 12, 0));
  // Inside one page: nothing wholly covered, one upload.
  plan = PlanStateWritten(Placement::kDeviceResident, residency, kGeometry, 310, 330);
  EXPECT_EQ(plan.first_stale_page, plan.end_stale_page);
  EXPECT_THAT(plan.uploads, ElementsAre(ElementRange{310, 330}));
  // The short last page from its start to num_elements is whole.
  plan = PlanStateWritten(Placement::kDeviceResident, residency, kGeometry, 900, 950);
  EXPECT_EQ(plan.first_stale_page, 9u);
  EXPECT_EQ(plan.end_stale_page, 10u);
  EXPECT_THAT(plan.uploads, IsEmpty());
}

TEST(StepPlanTest, StateWrittenCopiesNothingForPagesOffTheDeviceOrPagedGroups) {
  PageResidency residency(10);
  residency.MarkOnDevice(6, 7);  // Only page 6.
  StateWrittenPlan plan =
      PlanStateWritten(Placement::kDeviceResident, residency, kGeometry, 150, 620);
  EXPECT_THAT(plan.uploads, ElementsAre(ElementRange{600, 620}));
  residency.MarkOnDevice(0, 10);
  plan = PlanStateWritten(Placement::kDevicePaged, residency, kGeometry, 150, 620);
  EXPECT_EQ(plan.first_stale_page, 2u);
  EXPECT_EQ(plan.end_stale_page, 6u);
  EXPECT_THAT(plan.uploads, IsEmpty());
  plan = PlanStateWritten(Placement::kDeviceResident, residency, kGeometry, 500, 500);
  EXPECT_EQ(plan.first_stale_page, plan.end_stale_page);
  EXPECT_THAT(plan.uploads, IsEmpty());
}

TEST(StepPlanTest, AddTrafficAccumulatesIntoCounters) {
  PagingCounters counters;
  AddTraffic(Traffic(1, 2, 3, 4), &counters);
  AddTraffic(Traffic(10, 20, 30, 40), &counters);
  EXPECT_EQ(counters.page_ins.load(), 11u);
  EXPECT_EQ(counters.page_outs.load(), 22u);
  EXPECT_EQ(counters.bytes_host_to_device.load(), 33u);
  EXPECT_EQ(counters.bytes_device_to_host.load(), 44u);
  EXPECT_EQ(counters.copy_wait_us.load(), 0u);
}

}  // namespace
}  // namespace optstate
