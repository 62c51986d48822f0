// CheckpointWriter's pipeline (run k captured and checksummed while run k-1
// is written): a group of many runs reads back bit for bit through
// LoadCheckpoint, and a refusal at a later run (a page at another step than
// exact_step) stops the writer thread and leaves no directory behind,
// saying why the page is not at it.
#include "server/durability/checkpoint_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"
#include "server/durability/checkpoint_reader.h"
#include "server/engine/state_store.h"

namespace optstate {
namespace {

constexpr uint64_t kPage = 64;
// 12 bytes per element: one run holds 2 pages, so a group of 37 pages is
// 19 runs, its last one a single short page.
constexpr uint64_t kBufferBytes = 2 * kPage * 12;
constexpr uint64_t kElements = 36 * kPage + 5;

class CheckpointWriterTest : public ::testing::Test {
 public:
  CheckpointWriterTest()
      : pool_(2), backend_(&pool_), store_(&backend_, uint64_t{1} << 30, kPage) {}

  void SetUp() override {
    // ctest runs each test in a process of its own, in parallel: one
    // directory per process.
    dir_ = ::testing::TempDir() + "/checkpoint-writer-test-" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    GroupConfig config;
    config.num_elements = kElements;
    auto registered = store_.Register({"", "g"}, config);
    ASSERT_TRUE(registered.ok()) << registered.status();
    group_ = registered->group;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (uint64_t i = 0; i < kElements; ++i) {
      group_->params()[i] = value(rng);
      group_->exp_avg()[i] = value(rng);
      const float gradient = value(rng);
      group_->exp_avg_sq()[i] = gradient * gradient;  // A square, as a step leaves it.
    }
    for (uint64_t p = 0; p < group_->num_pages(); ++p) {
      group_->set_page_step(p, 9);
      group_->mark_page_has_values(p);
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ThreadPool pool_;
  CpuBackend backend_;
  StateStore store_;
  std::string dir_;
  std::shared_ptr<Group> group_;
};

TEST_F(CheckpointWriterTest, AGroupOfManyRunsReadsBackBitForBit) {
  CheckpointWriter writer(dir_, kPage, &backend_, kBufferBytes);
  absl::StatusOr<WrittenCheckpoint> written = writer.Write(1, 9, {{group_, 9}});
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->manifest.groups.size(), 1u);
  EXPECT_EQ(written->manifest.groups[0].bytes, DataFileBytes(kElements, kPage));

  StateStore restored(&backend_, uint64_t{1} << 30, kPage);
  Manifest manifest;
  absl::StatusOr<std::vector<StagedGroup>> staged =
      LoadCheckpoint(&restored, dir_ + "/" + written->id, &manifest, &pool_);
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_EQ(staged->size(), 1u);
  const Group& copy = (*staged)[0].group();
  for (uint64_t i = 0; i < kElements; ++i) {
    ASSERT_EQ(copy.params()[i], group_->params()[i]) << i;
    ASSERT_EQ(copy.exp_avg()[i], group_->exp_avg()[i]) << i;
    ASSERT_EQ(copy.exp_avg_sq()[i], group_->exp_avg_sq()[i]) << i;
  }
  for (uint64_t p = 0; p < copy.num_pages(); ++p) EXPECT_EQ(copy.page_step(p), 9u) << p;
}

// An amsgrad group's records carry max_exp_avg_sq after exp_avg_sq, and it
// reads back with it, bit for bit, next to a group without.
TEST_F(CheckpointWriterTest, AnAmsgradGroupsMaxExpAvgSqReadsBackBitForBit) {
  GroupConfig config;
  config.num_elements = kElements;
  config.hyperparameters.amsgrad = true;
  auto registered = store_.Register({"", "ams"}, config);
  ASSERT_TRUE(registered.ok()) << registered.status();
  std::shared_ptr<Group> ams = registered->group;
  ASSERT_NE(ams->max_exp_avg_sq(), nullptr);
  EXPECT_EQ(group_->max_exp_avg_sq(), nullptr);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(0.0f, 1.0f);
  for (uint64_t i = 0; i < kElements; ++i) {
    ams->params()[i] = value(rng);
    ams->exp_avg()[i] = value(rng);
    ams->exp_avg_sq()[i] = value(rng);
    ams->max_exp_avg_sq()[i] = ams->exp_avg_sq()[i] + value(rng);
  }
  for (uint64_t p = 0; p < ams->num_pages(); ++p) {
    ams->set_page_step(p, 9);
    ams->mark_page_has_values(p);
  }
  CheckpointWriter writer(dir_, kPage, &backend_, kBufferBytes);
  absl::StatusOr<WrittenCheckpoint> written = writer.Write(1, 9, {{group_, 9}, {ams, 9}});
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->manifest.groups.size(), 2u);
  StateStore restored(&backend_, uint64_t{1} << 30, kPage);
  Manifest manifest;
  absl::StatusOr<std::vector<StagedGroup>> staged =
      LoadCheckpoint(&restored, dir_ + "/" + written->id, &manifest, &pool_);
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_EQ(staged->size(), 2u);
  for (const StagedGroup& s : *staged) {
    const Group& copy = s.group();
    const bool is_ams = copy.key().name == "ams";
    const Group& original = is_ams ? *ams : *group_;
    EXPECT_EQ(copy.config().hyperparameters.amsgrad, is_ams);
    ASSERT_EQ(copy.max_exp_avg_sq() != nullptr, is_ams);
    EXPECT_EQ(written->manifest.groups[is_ams ? 1 : 0].bytes,
              DataFileBytes(kElements, kPage, is_ams));
    for (uint64_t i = 0; i < kElements; ++i) {
      ASSERT_EQ(copy.params()[i], original.params()[i]) << i;
      ASSERT_EQ(copy.exp_avg_sq()[i], original.exp_avg_sq()[i]) << i;
      if (is_ams) {
        ASSERT_EQ(copy.max_exp_avg_sq()[i], original.max_exp_avg_sq()[i]) << i;
      }
    }
  }
}

TEST_F(CheckpointWriterTest, ARefusalAtALaterRunStopsTheWriterAndLeavesNothing) {
  group_->set_page_step(30, 10);  // Run 15 of 19: earlier runs are written by then.
  CheckpointWriter writer(dir_, kPage, &backend_, kBufferBytes);
  absl::StatusOr<WrittenCheckpoint> written = writer.Write(1, 9, {{group_, 9}});
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition) << written.status();
  EXPECT_THAT(std::string(written.status().message()), ::testing::HasSubstr("page 30"));
  EXPECT_THAT(std::string(written.status().message()), ::testing::HasSubstr("send step 10"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(CheckpointWriterTest, APageBehindTheStepWaitedForIsRefusedAsReplaced) {
  // A page behind exact_step reached it before (the wait for it ended) and
  // was replaced since: an ImportState or RewindJob between the wait and the
  // capture. The refusal told the caller to step no further before the wait.
  group_->set_page_step(30, 8);
  CheckpointWriter writer(dir_, kPage, &backend_, kBufferBytes);
  absl::StatusOr<WrittenCheckpoint> written = writer.Write(1, 9, {{group_, 9}});
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition) << written.status();
  const std::string message(written.status().message());
  EXPECT_THAT(message, ::testing::HasSubstr("page 30 was at step 8"));
  EXPECT_THAT(message, ::testing::HasSubstr("an ImportState or RewindJob replaced"));
  EXPECT_THAT(message, ::testing::Not(::testing::HasSubstr("send step")));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

}  // namespace
}  // namespace optstate
