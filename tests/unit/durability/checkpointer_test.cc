// Checkpointer around the writer: one checkpointer per state_dir (its LOCK),
// the unfinished checkpoints earlier crashes left removed at open, and a
// call whose caller has gone (cancelled, or past its deadline) by the time
// it may write writes nothing.
#include "server/durability/checkpointer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"
#include "server/durability/state_dir_lock.h"
#include "server/engine/state_store.h"

namespace optstate {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kPage = 64;

class CheckpointerTest : public ::testing::Test {
 public:
  CheckpointerTest() : pool_(2), backend_(&pool_), store_(&backend_, uint64_t{1} << 30, kPage) {}

  void SetUp() override {
    // ctest runs each test in a process of its own, in parallel.
    dir_ = ::testing::TempDir() + "/checkpointer-test-" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    options_.state_dir = dir_;
    GroupConfig config;
    config.num_elements = 3 * kPage;
    auto registered = store_.Register({"", "g"}, config);
    ASSERT_TRUE(registered.ok()) << registered.status();
    for (uint64_t p = 0; p < registered->group->num_pages(); ++p) {
      registered->group->mark_page_has_values(p);
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  ThreadPool pool_;
  CpuBackend backend_;
  StateStore store_;
  std::string dir_;
  CheckpointerOptions options_;
};

TEST_F(CheckpointerTest, ASecondCheckpointerOnTheStateDirIsRefusedUntilTheFirstGoes) {
  auto first = Checkpointer::OpenAndRestore(options_, &store_, &backend_, false, &pool_);
  ASSERT_TRUE(first.ok()) << first.status();
  StateStore other(&backend_, uint64_t{1} << 30, kPage);
  auto second = Checkpointer::OpenAndRestore(options_, &other, &backend_, false, &pool_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("in use by another optstated (pid ", getpid(), ")")));
  first->reset();
  auto third = Checkpointer::OpenAndRestore(options_, &other, &backend_, false, &pool_);
  EXPECT_TRUE(third.ok()) << third.status();
}

// A state_dir the daemon's user may not write, with no LOCK in it yet, is
// the operator's to fix: FAILED_PRECONDITION saying so (as every other write
// refused for permission), not INTERNAL. Run as another user when root.
TEST_F(CheckpointerTest, AStateDirWithoutWriteAccessIsAFailedPrecondition) {
  std::filesystem::permissions(
      dir_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec |
                std::filesystem::perms::others_read | std::filesystem::perms::others_exec);
  int code = -1;
  std::string message;
  if (getuid() != 0) {
    absl::StatusOr<StateDirLock> lock = StateDirLock::Acquire(dir_);
    code = static_cast<int>(lock.status().code());
    message = std::string(lock.status().message());
  } else {
    // The child reports the code through its exit status.
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(100);
      _exit(static_cast<int>(StateDirLock::Acquire(dir_).status().code()));
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_NE(WEXITSTATUS(status), 100) << "could not become user 65534";
    code = WEXITSTATUS(status);
  }
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kFailedPrecondition)) << message;
  if (!message.empty()) {
    EXPECT_THAT(message, HasSubstr("write access"));
  }
}

// The flock is on LOCK's file, not its name: once LOCK is removed, a second
// checkpointer locks a new one, so the first writes nothing more (it would
// number and prune checkpoints beside the other's).
TEST_F(CheckpointerTest, ACheckpointerWhoseLockFileWasRemovedWritesNoMore) {
  auto first = Checkpointer::OpenAndRestore(options_, &store_, &backend_, false, &pool_);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Checkpoint({}).ok());
  std::filesystem::remove(dir_ + "/LOCK");
  StateStore other(&backend_, uint64_t{1} << 30, kPage);
  auto second = Checkpointer::OpenAndRestore(options_, &other, &backend_, false, &pool_);
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<CheckpointOutcome> refused = (*first)->Checkpoint({});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("is no longer the lock file"));
  EXPECT_EQ((*first)->Stats().failures, 1u);
  EXPECT_THAT(Names(), UnorderedElementsAre("LOCK", "ckpt-0000000000000001"));
  EXPECT_TRUE((*second)->Checkpoint({}).ok());
}

TEST_F(CheckpointerTest, OpenRemovesTheUnfinishedCheckpointsOfEarlierCrashes) {
  for (const char* name : {"ckpt-0000000000000004.tmp", "ckpt-0000000000000007.tmp"}) {
    std::filesystem::create_directories(dir_ + "/" + name);
    std::ofstream(dir_ + "/" + name + "/group-0.data") << "part of a checkpoint";
  }
  std::filesystem::create_directories(dir_ + "/notes.tmp");  // Not a checkpoint's: kept.
  auto checkpointer = Checkpointer::OpenAndRestore(options_, &store_, &backend_, false, &pool_);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  EXPECT_THAT(Names(), UnorderedElementsAre("LOCK", "notes.tmp"));
  // Numbering goes on past them.
  absl::StatusOr<CheckpointOutcome> written = (*checkpointer)->Checkpoint({});
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->id, "ckpt-0000000000000008");
}

TEST_F(CheckpointerTest, ACallWhoseCallerHasGoneWritesNothing) {
  auto checkpointer = Checkpointer::OpenAndRestore(options_, &store_, &backend_, false, &pool_);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  CheckpointCall cancelled;
  cancelled.cancelled = [] { return true; };
  EXPECT_EQ((*checkpointer)->Checkpoint(cancelled).status().code(), absl::StatusCode::kCancelled);
  CheckpointCall late;
  late.deadline = absl::Now() - absl::Seconds(1);
  absl::StatusOr<CheckpointOutcome> refused = (*checkpointer)->Checkpoint(late);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(refused.status().message(), HasSubstr("nothing was written"));
  EXPECT_THAT(Names(), UnorderedElementsAre("LOCK"));
  EXPECT_EQ((*checkpointer)->Stats().written, 0u);
  EXPECT_EQ((*checkpointer)->Stats().failures, 0u);
  EXPECT_TRUE((*checkpointer)->Checkpoint({}).ok());
  EXPECT_EQ((*checkpointer)->Stats().written, 1u);
}

// One tenant's calls that wait (here for a step no page will reach) take at
// most kMaxCallsPerTenant of the call threads: its next is refused, and
// another tenant's call still runs.
TEST_F(CheckpointerTest, OneTenantsWaitingCallsLeaveRoomForAnothers) {
  auto checkpointer = Checkpointer::OpenAndRestore(options_, &store_, &backend_, false, &pool_);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  auto waiting = [&] {
    CheckpointCall call;
    call.tenant = "";  // The tenant of group g.
    call.wait_for_step = 1000;
    call.cancelled = [&] { return stop.load(); };
    return call;
  };
  for (size_t i = 0; i < Checkpointer::kMaxCallsPerTenant; ++i) {
    (*checkpointer)->CheckpointAsync(waiting(),
                                     [&](absl::StatusOr<CheckpointOutcome>) { ++answered; });
  }
  absl::Status refused;
  (*checkpointer)->CheckpointAsync(
      waiting(), [&](absl::StatusOr<CheckpointOutcome> outcome) { refused = outcome.status(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("of this tenant"));
  absl::Notification done;
  absl::StatusOr<CheckpointOutcome> others = absl::UnknownError("not answered");
  CheckpointCall another;
  another.tenant = "a";
  (*checkpointer)->CheckpointAsync(another, [&](absl::StatusOr<CheckpointOutcome> outcome) {
    others = std::move(outcome);
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(others.ok()) << others.status();
  EXPECT_EQ(answered.load(), 0);
  stop = true;
  (*checkpointer)->Stop();
  EXPECT_EQ(answered.load(), static_cast<int>(Checkpointer::kMaxCallsPerTenant));
}

}  // namespace
}  // namespace optstate
