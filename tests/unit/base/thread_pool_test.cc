// Specification of ThreadPool (server/base/thread_pool.h): ParallelFor runs every
// shard exactly once and returns only after all have returned, also when
// called from a pool thread; Schedule runs every task before the pool is gone.
#include "server/base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace optstate {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A deadlock shows as a wait that never ends. Waiting this long instead turns
// it into a failure; the pool is then leaked, since joining its threads would
// hang the test binary.
constexpr seconds kDeadlockTimeout(30);

// Blocks threads until opened.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    opened_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    opened_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable opened_;
  bool open_ = false;
};

std::vector<int> Snapshot(const std::vector<std::atomic<int>>& calls) {
  std::vector<int> out;
  for (const auto& c : calls) out.push_back(c.load());
  return out;
}

TEST(ThreadPool, StartsAtLeastOneWorker) {
  EXPECT_EQ(ThreadPool(3).size(), 3);
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(0).size(), 1);
  EXPECT_EQ(ThreadPool(-4).size(), 1);
}

TEST(ThreadPool, ParallelForCallsEveryShardExactlyOnce) {
  ThreadPool pool(4);
  for (size_t shards : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{5}, size_t{1000}}) {
    std::vector<std::atomic<int>> calls(shards);
    pool.ParallelFor(shards, [&](size_t i) { calls[i].fetch_add(1); });
    EXPECT_EQ(Snapshot(calls), std::vector<int>(shards, 1)) << shards << " shards";
  }
}

TEST(ThreadPool, ParallelForWithMoreWorkersThanShardsCallsEveryShardExactlyOnce) {
  ThreadPool pool(8);
  std::vector<std::atomic<int>> calls(3);
  pool.ParallelFor(3, [&](size_t i) { calls[i].fetch_add(1); });
  EXPECT_EQ(Snapshot(calls), std::vector<int>(3, 1));
}

TEST(ThreadPool, ParallelForOverZeroShardsCallsNothing) {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  pool.ParallelFor(0, [&](size_t) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 0);
}

// Shards run by workers take a while, each a different while, so a
// ParallelFor that returned before its last shard would find it unfinished.
TEST(ThreadPool, ParallelForReturnsOnlyAfterEveryShardHasReturned) {
  ThreadPool pool(3);
  constexpr size_t kShards = 24;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> worker_shards{0};
  std::vector<std::atomic<bool>> finished(kShards);
  pool.ParallelFor(kShards, [&](size_t i) {
    if (std::this_thread::get_id() != caller) {
      std::this_thread::sleep_for(milliseconds(5 + 5 * worker_shards.fetch_add(1)));
    }
    finished[i].store(true);
  });
  for (size_t i = 0; i < kShards; ++i) EXPECT_TRUE(finished[i].load()) << "shard " << i;
}

// Each shard waits (up to a deadline) until a second thread has run a shard,
// which happens only if idle workers take part.
TEST(ThreadPool, ParallelForRunsShardsOnMoreThanOneThread) {
  ThreadPool pool(2);
  std::mutex mu;
  std::condition_variable second_thread_seen;
  std::vector<std::thread::id> ids;
  auto distinct = [&] {
    std::vector<std::thread::id> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    return std::unique(sorted.begin(), sorted.end()) - sorted.begin();
  };
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  pool.ParallelFor(16, [&](size_t) {
    std::unique_lock<std::mutex> lock(mu);
    ids.push_back(std::this_thread::get_id());
    if (distinct() > 1) second_thread_seen.notify_all();
    second_thread_seen.wait_until(lock, deadline, [&] { return distinct() > 1; });
  });
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_GT(distinct(), 1);
}

// The caller runs shards itself, so ParallelFor finishes while every worker
// is blocked.
TEST(ThreadPool, ParallelForCompletesWhileEveryWorkerIsBusy) {
  Gate release;
  std::vector<std::atomic<int>> calls(100);
  auto pool = std::make_unique<ThreadPool>(2);
  for (int i = 0; i < pool->size(); ++i) pool->Schedule([&] { release.Wait(); });

  auto done = std::async(std::launch::async, [&] {
    pool->ParallelFor(calls.size(), [&](size_t i) { calls[i].fetch_add(1); });
  });
  const bool finished = done.wait_for(kDeadlockTimeout) == std::future_status::ready;
  release.Open();
  if (!finished) {
    pool.release();  // Deliberately leaked: see kDeadlockTimeout.
    FAIL() << "ParallelFor waited for busy workers";
  }
  EXPECT_EQ(Snapshot(calls), std::vector<int>(calls.size(), 1));
}

// Every worker runs a task that itself calls ParallelFor: no worker is left
// to help, and none may wait for one.
TEST(ThreadPool, ParallelForFromInsidePoolTasksDoesNotDeadlock) {
  constexpr int kTasks = 2;
  constexpr size_t kShards = 50;
  std::vector<std::vector<std::atomic<int>>> calls(kTasks);
  for (auto& c : calls) c = std::vector<std::atomic<int>>(kShards);
  std::vector<std::promise<void>> finished(kTasks);
  std::vector<std::future<void>> waits;
  for (auto& f : finished) waits.push_back(f.get_future());
  auto pool = std::make_unique<ThreadPool>(2);

  for (int t = 0; t < kTasks; ++t) {
    pool->Schedule([&, t] {
      pool->ParallelFor(kShards, [&](size_t i) { calls[t][i].fetch_add(1); });
      finished[t].set_value();
    });
  }
  for (int t = 0; t < kTasks; ++t) {
    if (waits[t].wait_for(kDeadlockTimeout) != std::future_status::ready) {
      pool.release();  // Deliberately leaked: see kDeadlockTimeout.
      FAIL() << "ParallelFor inside pool task " << t << " deadlocked";
    }
  }
  for (int t = 0; t < kTasks; ++t) {
    EXPECT_EQ(Snapshot(calls[t]), std::vector<int>(kShards, 1)) << "task " << t;
  }
}

TEST(ThreadPool, NestedParallelForInsideAShardCallsEveryInnerShardExactlyOnce) {
  constexpr size_t kOuter = 8, kInner = 16;
  std::vector<std::atomic<int>> calls(kOuter * kInner);
  auto pool = std::make_unique<ThreadPool>(3);
  auto done = std::async(std::launch::async, [&] {
    pool->ParallelFor(kOuter, [&](size_t outer) {
      pool->ParallelFor(kInner, [&](size_t inner) { calls[outer * kInner + inner].fetch_add(1); });
    });
  });
  if (done.wait_for(kDeadlockTimeout) != std::future_status::ready) {
    pool.release();  // Deliberately leaked: see kDeadlockTimeout.
    FAIL() << "nested ParallelFor deadlocked";
  }
  EXPECT_EQ(Snapshot(calls), std::vector<int>(calls.size(), 1));
}

TEST(ThreadPool, ScheduleRunsEveryTaskBeforeTheDestructorReturns) {
  constexpr int kTasks = 500;
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < kTasks; ++i) {
      pool.Schedule([&ran, i] {
        if (i % 50 == 0) std::this_thread::sleep_for(milliseconds(1));
        ran.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(ran.load(), kTasks);
}

TEST(ThreadPool, ScheduleRunsTasksOnWorkersNotOnTheCaller) {
  std::thread::id ran_on;
  {
    ThreadPool pool(1);
    pool.Schedule([&] { ran_on = std::this_thread::get_id(); });
  }
  EXPECT_NE(ran_on, std::thread::id());
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(ThreadPool, ScheduleFromManyThreadsAtOnceRunsEveryTask) {
  constexpr int kThreads = 4, kPerThread = 250;
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    std::vector<std::thread> schedulers;
    for (int t = 0; t < kThreads; ++t) {
      schedulers.emplace_back([&] {
        for (int i = 0; i < kPerThread; ++i) pool.Schedule([&] { ran.fetch_add(1); });
      });
    }
    for (auto& s : schedulers) s.join();
  }
  EXPECT_EQ(ran.load(), kThreads * kPerThread);
}

}  // namespace
}  // namespace optstate
