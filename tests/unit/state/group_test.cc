// Group on its own: page geometry, per-page steps, the values flags, the
// deleted and broken flags, and its host arrays, each against figures
// worked out by hand for the sizes used.
#include "server/state/group.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace optstate {
namespace {

GroupConfig Config(uint64_t num_elements, bool has_initial_values = false) {
  GroupConfig config;
  config.num_elements = num_elements;
  config.has_initial_values = has_initial_values;
  return config;
}

std::shared_ptr<Group> Make(uint64_t num_elements, uint64_t page_elements,
                            bool has_initial_values = false) {
  absl::StatusOr<std::shared_ptr<Group>> group =
      Group::Create(GroupKey{"t", "g"}, Config(num_elements, has_initial_values), page_elements,
                    AlignedHostAllocator());
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? *group : nullptr;
}

// Counts what it hands out and takes back; fails the allocation numbered
// `fail_at` (1-based; 0: none).
class CountingAllocator : public HostAllocator {
 public:
  explicit CountingAllocator(int fail_at = 0) : fail_at_(fail_at) {}
  void* Allocate(size_t bytes) override {
    if (++calls_ == fail_at_) return nullptr;
    ++live_;
    return AlignedHostAllocator()->Allocate(bytes);
  }
  void Free(void* memory, size_t bytes) override {
    --live_;
    AlignedHostAllocator()->Free(memory, bytes);
  }
  absl::string_view name() const override { return "counting"; }
  int live() const { return live_; }

 private:
  const int fail_at_;
  int calls_ = 0;
  int live_ = 0;
};

TEST(GroupGeometry, APartialLastPageEndsAtTheGroupsEnd) {
  // 10 elements in pages of 4: [0, 4), [4, 8), [8, 10).
  std::shared_ptr<Group> g = Make(10, 4);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->num_elements(), 10u);
  EXPECT_EQ(g->page_elements(), 4u);
  EXPECT_EQ(g->num_pages(), 3u);
  EXPECT_EQ(g->PageBegin(0), 0u);
  EXPECT_EQ(g->PageEnd(0), 4u);
  EXPECT_EQ(g->PageBegin(1), 4u);
  EXPECT_EQ(g->PageEnd(1), 8u);
  EXPECT_EQ(g->PageBegin(2), 8u);
  EXPECT_EQ(g->PageEnd(2), 10u);
}

TEST(GroupGeometry, WholePagesAndASinglePartialPage) {
  std::shared_ptr<Group> whole = Make(12, 4);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(whole->num_pages(), 3u);
  EXPECT_EQ(whole->PageEnd(2), 12u);
  std::shared_ptr<Group> small = Make(3, 4);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->num_pages(), 1u);
  EXPECT_EQ(small->PageEnd(0), 3u);
}

TEST(GroupGeometry, HostBytesAreTwelvePerElement) {
  // params, exp_avg and exp_avg_sq: three fp32 values per element.
  std::shared_ptr<Group> g = Make(1000, 64);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->host_bytes(), 12000u);
  EXPECT_EQ(HostBytesFor(Config(1000, false)), 12000u);
  EXPECT_EQ(g->max_exp_avg_sq(), nullptr);
}

// amsgrad: max_exp_avg_sq, a fourth zeroed array of its own.
TEST(GroupGeometry, AnAmsgradGroupHasAZeroedFourthArrayAndSixteenBytesPerElement) {
  GroupConfig config = Config(1000, false);
  config.hyperparameters.amsgrad = true;
  absl::StatusOr<std::shared_ptr<Group>> g =
      Group::Create(GroupKey{"t", "g"}, config, 64, AlignedHostAllocator());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->host_bytes(), 16000u);
  ASSERT_NE((*g)->max_exp_avg_sq(), nullptr);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ((*g)->max_exp_avg_sq()[i], 0.0f) << i;
  EXPECT_NE((*g)->max_exp_avg_sq(), (*g)->exp_avg_sq());
}

TEST(GroupArrays, StartZeroedAlignedAndApart) {
  std::shared_ptr<Group> g = Make(1000, 64);
  ASSERT_NE(g, nullptr);
  for (float* a : {g->params(), g->exp_avg(), g->exp_avg_sq()}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(a[i], 0.0f) << i;
  }
  // Writing one array leaves the others as they were.
  for (uint64_t i = 0; i < 1000; ++i) g->params()[i] = 1.0f;
  for (uint64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(g->exp_avg()[i], 0.0f);
    ASSERT_EQ(g->exp_avg_sq()[i], 0.0f);
  }
}

TEST(GroupArrays, AFailedAllocationIsResourceExhaustedAndFreesWhatWasTaken) {
  CountingAllocator allocator(/*fail_at=*/3);
  {
    absl::StatusOr<std::shared_ptr<Group>> g =
        Group::Create(GroupKey{"t", "big"}, Config(100), 64, &allocator);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(g.status().message().find("1200 bytes"), absl::string_view::npos) << g.status();
    EXPECT_NE(g.status().message().find("'big'"), absl::string_view::npos) << g.status();
  }
  EXPECT_EQ(allocator.live(), 0);
}

TEST(GroupArrays, AreFreedWithTheGroup) {
  CountingAllocator allocator;
  {
    absl::StatusOr<std::shared_ptr<Group>> g =
        Group::Create(GroupKey{"t", "g"}, Config(100), 64, &allocator);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(allocator.live(), 3);
  }
  EXPECT_EQ(allocator.live(), 0);
}

TEST(GroupSteps, StartAtZeroAndMinMaxFollowThePages) {
  std::shared_ptr<Group> g = Make(10, 4);
  ASSERT_NE(g, nullptr);
  for (uint64_t p = 0; p < 3; ++p) EXPECT_EQ(g->page_step(p), 0u);
  EXPECT_EQ(g->MinStep(), 0u);
  EXPECT_EQ(g->MaxStep(), 0u);
  {
    absl::MutexLock lock(&g->page_mutex(1));
    g->set_page_step(1, 5);
  }
  EXPECT_EQ(g->page_step(0), 0u);
  EXPECT_EQ(g->page_step(1), 5u);
  EXPECT_EQ(g->page_step(2), 0u);
  EXPECT_EQ(g->MinStep(), 0u);
  EXPECT_EQ(g->MaxStep(), 5u);
  for (uint64_t p : {0, 2}) {
    absl::MutexLock lock(&g->page_mutex(p));
    g->set_page_step(p, 4);
  }
  EXPECT_EQ(g->MinStep(), 4u);
  EXPECT_EQ(g->MaxStep(), 5u);
}

TEST(GroupValues, WithoutInitialValuesEveryPageHasValues) {
  std::shared_ptr<Group> g = Make(10, 4, /*has_initial_values=*/false);
  ASSERT_NE(g, nullptr);
  for (uint64_t p = 0; p < 3; ++p) EXPECT_TRUE(g->page_has_values(p));
  EXPECT_EQ(g->PagesAwaitingValues(), 0u);
}

TEST(GroupValues, WithInitialValuesEachPageAwaitsItsOwnOnce) {
  std::shared_ptr<Group> g = Make(10, 4, /*has_initial_values=*/true);
  ASSERT_NE(g, nullptr);
  for (uint64_t p = 0; p < 3; ++p) EXPECT_FALSE(g->page_has_values(p));
  EXPECT_EQ(g->PagesAwaitingValues(), 3u);
  {
    absl::MutexLock lock(&g->page_mutex(2));
    g->mark_page_has_values(2);
  }
  EXPECT_FALSE(g->page_has_values(0));
  EXPECT_TRUE(g->page_has_values(2));
  EXPECT_EQ(g->PagesAwaitingValues(), 2u);
  {
    absl::MutexLock lock(&g->page_mutex(2));
    g->mark_page_has_values(2);  // Again: counted once.
  }
  EXPECT_EQ(g->PagesAwaitingValues(), 2u);
  for (uint64_t p : {0, 1}) {
    absl::MutexLock lock(&g->page_mutex(p));
    g->mark_page_has_values(p);
  }
  EXPECT_EQ(g->PagesAwaitingValues(), 0u);
}

TEST(GroupFlags, DeletedAndBrokenStartClearAndStaySet) {
  std::shared_ptr<Group> g = Make(10, 4);
  ASSERT_NE(g, nullptr);
  EXPECT_FALSE(g->deleted());
  EXPECT_FALSE(g->broken());
  g->mark_broken();
  EXPECT_TRUE(g->broken());
  EXPECT_FALSE(g->deleted());
  g->mark_deleted();
  EXPECT_TRUE(g->deleted());
  EXPECT_TRUE(g->broken());
}

TEST(GroupIdentity, KeyAndConfigAreKept) {
  GroupConfig config = Config(10, true);
  config.hyperparameters.lr = 0.25;
  absl::StatusOr<std::shared_ptr<Group>> g =
      Group::Create(GroupKey{"tenant", "name"}, config, 4, AlignedHostAllocator());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->key().tenant, "tenant");
  EXPECT_EQ((*g)->key().name, "name");
  EXPECT_EQ((*g)->config().hyperparameters.lr, 0.25);
  EXPECT_TRUE((*g)->config() == config);
  EXPECT_FALSE((GroupKey{"a", "x"} == GroupKey{"b", "x"}));
}

}  // namespace
}  // namespace optstate
