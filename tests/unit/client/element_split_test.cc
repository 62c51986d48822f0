// ForEachElementSplit: every element of every item run exactly once, a
// large item cut at aligned elements so several threads share it, each
// thread's calls in element order, a small step on the calling thread
// alone, and the refusal of the first failed call in element order.
#include "client/step/group_ranges.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace optstate::client_internal {
namespace {

struct Call {
  size_t item;
  uint64_t begin, end;
  std::thread::id thread;
};

// Runs the split, recording every call; `fail` says which calls fail.
std::vector<Call> Record(absl::Span<const ElementItem> items, absl::Status* status,
                         const std::function<absl::Status(size_t, uint64_t, uint64_t)>& fail =
                             [](size_t, uint64_t, uint64_t) { return absl::OkStatus(); }) {
  std::mutex mu;
  std::vector<Call> calls;
  *status = ForEachElementSplit(items, [&](size_t item, uint64_t begin, uint64_t end) {
    {
      std::lock_guard<std::mutex> lock(mu);
      calls.push_back({item, begin, end, std::this_thread::get_id()});
    }
    return fail(item, begin, end);
  });
  return calls;
}

// Each element of each item covered by exactly one call.
void ExpectEachElementOnce(absl::Span<const ElementItem> items, const std::vector<Call>& calls) {
  std::vector<std::map<uint64_t, uint64_t>> ranges(items.size());  // begin -> end, per item.
  for (const Call& c : calls) {
    ASSERT_LT(c.item, items.size());
    ASSERT_LT(c.begin, c.end);
    ASSERT_LE(c.end, items[c.item].elements);
    ASSERT_TRUE(ranges[c.item].emplace(c.begin, c.end).second) << "item " << c.item;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    uint64_t next = 0;
    for (const auto& [begin, end] : ranges[i]) {
      EXPECT_EQ(begin, next) << "item " << i;
      next = end;
    }
    EXPECT_EQ(next, items[i].elements) << "item " << i;
  }
}

// A call's place in the step's element order.
bool Before(const Call& a, const Call& b) {
  return a.item != b.item ? a.item < b.item : a.begin < b.begin;
}

TEST(ElementSplit, OneLargeItemIsCutAtAlignedElementsAcrossThreads) {
  const std::vector<ElementItem> items = {{(uint64_t{64} << 20) / 4 + 5, 4}};  // 64 MiB and 5.
  absl::Status status;
  const std::vector<Call> calls = Record(items, &status);
  ASSERT_TRUE(status.ok()) << status;
  ExpectEachElementOnce(items, calls);
  for (const Call& c : calls) EXPECT_EQ(c.begin % kElementSplitAlignment, 0u) << c.begin;
  const size_t cpus = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(calls.size(), std::min<size_t>(4, cpus));
  std::vector<std::thread::id> threads;
  for (const Call& c : calls) threads.push_back(c.thread);
  std::sort(threads.begin(), threads.end());
  EXPECT_EQ(std::unique(threads.begin(), threads.end()) - threads.begin(),
            static_cast<std::ptrdiff_t>(calls.size()));
}

TEST(ElementSplit, ManyItemsAndEmptyOnesEachElementOnceInOrderPerThread) {
  std::vector<ElementItem> items;
  for (int i = 0; i < 256; ++i) items.push_back({65536 + static_cast<uint64_t>(i % 3), 4});
  items.insert(items.begin() + 17, ElementItem{0, 4});
  items.push_back({1, 2});
  items.push_back({(uint64_t{20} << 20) / 2, 2});  // 20 MiB of 16-bit elements: cut.
  absl::Status status;
  const std::vector<Call> calls = Record(items, &status);
  ASSERT_TRUE(status.ok()) << status;
  ExpectEachElementOnce(items, calls);
  std::map<std::thread::id, std::vector<Call>> by_thread;
  for (const Call& c : calls) by_thread[c.thread].push_back(c);
  for (const auto& [thread, own] : by_thread) {
    for (size_t k = 1; k < own.size(); ++k) EXPECT_TRUE(Before(own[k - 1], own[k]));
  }
  // The calling thread runs the first part, which begins the step.
  const std::vector<Call>& mine = by_thread[std::this_thread::get_id()];
  ASSERT_FALSE(mine.empty());
  EXPECT_EQ(mine.front().item, 0u);
  EXPECT_EQ(mine.front().begin, 0u);
}

TEST(ElementSplit, ASmallStepRunsOnTheCallingThreadAlone) {
  const std::vector<ElementItem> items = {{1000, 4}, {(uint64_t{7} << 20) / 4, 4}};  // < 8 MiB.
  absl::Status status;
  const std::vector<Call> calls = Record(items, &status);
  ASSERT_TRUE(status.ok()) << status;
  ExpectEachElementOnce(items, calls);
  ASSERT_EQ(calls.size(), 2u);
  for (const Call& c : calls) EXPECT_EQ(c.thread, std::this_thread::get_id());
}

TEST(ElementSplit, NoItemsNoCalls) {
  absl::Status status;
  EXPECT_TRUE(Record({}, &status).empty());
  EXPECT_TRUE(status.ok());
}

TEST(ElementSplit, TheFirstFailureInElementOrderIsTheAnswerAndItsPartStops) {
  std::vector<ElementItem> items;
  for (int i = 0; i < 64; ++i) items.push_back({1 << 20, 4});  // 256 MiB: 4 parts where 4 CPUs.
  // Elements that fail: one late in the step, one early, one in the last item.
  auto bad_at = [](size_t item, uint64_t begin, uint64_t end) -> absl::Status {
    if ((item == 50 && begin <= 7 && 7 < end) || (item == 3 && begin <= 99 && 99 < end) ||
        item == 63) {
      return absl::InvalidArgumentError(std::to_string(item));
    }
    return absl::OkStatus();
  };
  absl::Status status;
  const std::vector<Call> calls = Record(items, &status, bad_at);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "3");
  // The thread that failed at item 3 went no further.
  std::thread::id failed;
  for (const Call& c : calls) {
    if (c.item == 3) failed = c.thread;
  }
  for (const Call& c : calls) {
    if (c.thread == failed) {
      EXPECT_LE(c.item, 3u);
    }
  }
}

}  // namespace
}  // namespace optstate::client_internal
