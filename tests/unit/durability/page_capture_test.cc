// CapturePages: a group's pages copied with their steps, and a group that a
// backend left broken refused (its pages may hold a step their numbers do not
// say, which a restore or import would let a retry apply twice).
#include "server/durability/page_capture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"
#include "server/state/group.h"

namespace optstate {
namespace {

TEST(PageCaptureTest, CopiesPagesWithTheirSteps) {
  ThreadPool pool(1);
  CpuBackend backend(&pool);
  GroupConfig config;
  config.num_elements = 100;
  auto group = Group::Create({"", "g"}, config, 64, backend.host_allocator());
  ASSERT_TRUE(group.ok());
  for (int i = 0; i < 100; ++i) (*group)->params()[i] = static_cast<float>(i);
  (*group)->set_page_step(1, 7);
  CapturedPages pages;
  ASSERT_TRUE(CapturePages(backend, **group, 0, 2, &pages).ok());
  ASSERT_EQ(pages.params.size(), 100u);
  EXPECT_EQ(pages.params[99], 99.0f);
  EXPECT_EQ(pages.steps, (std::vector<uint64_t>{0, 7}));
}

TEST(PageCaptureTest, ABrokenGroupIsRefusedWithDataLoss) {
  ThreadPool pool(1);
  CpuBackend backend(&pool);
  GroupConfig config;
  config.num_elements = 100;
  auto group = Group::Create({"", "g"}, config, 64, backend.host_allocator());
  ASSERT_TRUE(group.ok());
  (*group)->mark_broken();
  CapturedPages pages;
  absl::Status s = CapturePages(backend, **group, 0, 2, &pages);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("delete it and register it again"));
}

}  // namespace
}  // namespace optstate
