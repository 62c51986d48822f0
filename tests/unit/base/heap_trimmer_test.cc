// HeapTrimPolicy: steady load is never trimmed; growth of the heap and a fall
// in its use are. HeapTrimmer: requests always trim, periodic looks only
// when the policy says so, and what a load left goes back once the daemon is
// idle, whatever the readings showed.
#include "server/base/heap_trimmer.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace optstate {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(HeapTrimPolicyTest, SteadyLoadSwingingBelowTheSlackIsNeverTrimmed) {
  HeapTrimPolicy policy(64 * kMiB);
  policy.Trimmed({300 * kMiB, 120 * kMiB});
  // Use swings between 80 and 140 MiB (a quarter of the peak is 35 MiB, the
  // slack 64); the heap stays at what it took.
  for (int i = 0; i < 1000; ++i) {
    const uint64_t in_use = (i % 2 == 0 ? 80 : 140) * kMiB;
    EXPECT_FALSE(policy.Due({300 * kMiB, in_use})) << i;
  }
}

TEST(HeapTrimPolicyTest, TheHeapGrowingPastTheSlackIsTrimmed) {
  HeapTrimPolicy policy(64 * kMiB);
  policy.Trimmed({300 * kMiB, 120 * kMiB});
  EXPECT_FALSE(policy.Due({364 * kMiB, 120 * kMiB}));
  EXPECT_TRUE(policy.Due({365 * kMiB, 120 * kMiB}));
  policy.Trimmed({365 * kMiB, 120 * kMiB});  // Interior pages given back; the heap keeps its size.
  EXPECT_FALSE(policy.Due({365 * kMiB, 120 * kMiB}));
}

TEST(HeapTrimPolicyTest, UseFallingByMoreThanTheSlackOrAQuarterOfItsPeakIsTrimmed) {
  HeapTrimPolicy policy(64 * kMiB);
  policy.Trimmed({1024 * kMiB, 100 * kMiB});
  EXPECT_FALSE(policy.Due({1024 * kMiB, 600 * kMiB}));  // The peak: 600 MiB.
  // A quarter of 600 MiB is 150 MiB, more than the slack.
  EXPECT_FALSE(policy.Due({1024 * kMiB, 450 * kMiB}));
  EXPECT_TRUE(policy.Due({1024 * kMiB, 449 * kMiB}));
  policy.Trimmed({1024 * kMiB, 449 * kMiB});
  // The slack bounds small peaks: from 100 MiB, a fall of 64 MiB.
  HeapTrimPolicy small(64 * kMiB);
  small.Trimmed({200 * kMiB, 100 * kMiB});
  EXPECT_FALSE(small.Due({200 * kMiB, 36 * kMiB}));
  EXPECT_TRUE(small.Due({200 * kMiB, 35 * kMiB}));
}

TEST(HeapTrimPolicyTest, ThePeakIsForgottenAtATrim) {
  HeapTrimPolicy policy(64 * kMiB);
  policy.Trimmed({1024 * kMiB, 100 * kMiB});
  EXPECT_FALSE(policy.Due({1024 * kMiB, 500 * kMiB}));
  EXPECT_TRUE(policy.Due({1024 * kMiB, 300 * kMiB}));
  policy.Trimmed({1024 * kMiB, 300 * kMiB});
  EXPECT_FALSE(policy.Due({1024 * kMiB, 300 * kMiB}));
}

TEST(HeapTrimPolicyTest, FreedSinceTrimCountsFreeMemoryBeyondWhatTheLastTrimLeft) {
  HeapTrimPolicy policy(64 * kMiB);
  policy.Trimmed({300 * kMiB, 120 * kMiB});  // 180 MiB free, given back.
  // A sixteenth of the slack: 4 MiB.
  EXPECT_FALSE(policy.FreedSinceTrim({300 * kMiB, 116 * kMiB}));
  EXPECT_TRUE(policy.FreedSinceTrim({300 * kMiB, 115 * kMiB}));
  EXPECT_FALSE(policy.Due({300 * kMiB, 100 * kMiB})) << "a fall of 20 MiB is under the slack";
  EXPECT_TRUE(policy.FreedSinceTrim({300 * kMiB, 100 * kMiB}));
  // Taken from the system and freed again: free beyond what the trim left.
  EXPECT_TRUE(policy.FreedSinceTrim({340 * kMiB, 120 * kMiB}));
  policy.Trimmed({300 * kMiB, 100 * kMiB});
  EXPECT_FALSE(policy.FreedSinceTrim({300 * kMiB, 100 * kMiB}));
  EXPECT_FALSE(policy.FreedSinceTrim({300 * kMiB, 140 * kMiB})) << "used again: nothing to give";
}

// A trimmer whose heap readings and trims the test controls.
struct FakeHeap {
  absl::Mutex mu;
  HeapReading reading ABSL_GUARDED_BY(mu);
  std::atomic<int> trims{0};
  HeapReading Read() {
    absl::MutexLock lock(&mu);
    return reading;
  }
  void Set(HeapReading r) {
    absl::MutexLock lock(&mu);
    reading = r;
  }
};

bool WaitForTrims(const FakeHeap& heap, int n) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (heap.trims.load() < n) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(HeapTrimmerTest, PeriodicLooksTrimOnlyWhenThePolicySaysSo) {
  FakeHeap heap;
  heap.Set({300 * kMiB, 120 * kMiB});
  HeapTrimmer trimmer(
      absl::Milliseconds(2), 64 * kMiB, absl::Milliseconds(1), [&] { return heap.Read(); },
      [&] { heap.trims.fetch_add(1); });
  absl::SleepFor(absl::Milliseconds(100));  // About 50 looks at a steady heap.
  EXPECT_EQ(heap.trims.load(), 0);
  heap.Set({400 * kMiB, 120 * kMiB});  // Grew by 100 MiB.
  ASSERT_TRUE(WaitForTrims(heap, 1));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(heap.trims.load(), 1) << "trimmed again with nothing changed";
  EXPECT_EQ(trimmer.trims(), 1u);
}

TEST(HeapTrimmerTest, ARequestAlwaysTrims) {
  FakeHeap heap;
  heap.Set({300 * kMiB, 120 * kMiB});
  HeapTrimmer trimmer(
      absl::ZeroDuration(), 64 * kMiB, absl::Milliseconds(1), [&] { return heap.Read(); },
      [&] { heap.trims.fetch_add(1); });
  trimmer.RequestTrim();
  ASSERT_TRUE(WaitForTrims(heap, 1));
  trimmer.RequestTrim();
  ASSERT_TRUE(WaitForTrims(heap, 2));
}

// The case the policy alone missed (issue 33): the load ends with the heap
// reading as it did at the last trim (its buffers were reused and freed
// between looks, or freed after a requested trim by less than the slack).
// Going idle after serving streams is enough.
TEST(HeapTrimmerTest, TheEndOfTheLoadTrimsWhateverTheReadings) {
  FakeHeap heap;
  heap.Set({300 * kMiB, 120 * kMiB});
  HeapTrimmer trimmer(
      absl::Milliseconds(20), 64 * kMiB, absl::Milliseconds(1), [&] { return heap.Read(); },
      [&] { heap.trims.fetch_add(1); });
  trimmer.SetIdle(false);
  absl::SleepFor(absl::Milliseconds(200));  // About 10 looks at steady load.
  EXPECT_EQ(heap.trims.load(), 0);
  trimmer.SetIdle(true);
  ASSERT_TRUE(WaitForTrims(heap, 1));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(heap.trims.load(), 1) << "trimmed again while idle with nothing freed";
}

TEST(HeapTrimmerTest, SteadyLoadWithBriefIdleMomentsIsNotTrimmed) {
  FakeHeap heap;
  heap.Set({300 * kMiB, 120 * kMiB});
  HeapTrimmer trimmer(
      absl::Seconds(1), 64 * kMiB, absl::Milliseconds(1), [&] { return heap.Read(); },
      [&] { heap.trims.fetch_add(1); });
  // One client stepping without pause: no stream open between two steps for
  // a moment, far less than half a period.
  const absl::Time until = absl::Now() + absl::Milliseconds(1200);
  while (absl::Now() < until) {
    trimmer.SetIdle(false);
    absl::SleepFor(absl::Microseconds(500));
    trimmer.SetIdle(true);
    absl::SleepFor(absl::Microseconds(100));
  }
  trimmer.SetIdle(false);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(heap.trims.load(), 0);
}

TEST(HeapTrimmerTest, ATrimAskedForWhileStreamsAreOpenIsFollowedByOneWhenTheyEnd) {
  FakeHeap heap;
  heap.Set({300 * kMiB, 120 * kMiB});
  HeapTrimmer trimmer(
      absl::Milliseconds(20), 64 * kMiB, absl::Milliseconds(1), [&] { return heap.Read(); },
      [&] { heap.trims.fetch_add(1); });
  trimmer.SetIdle(false);
  trimmer.RequestTrim();  // A group deleted while others are stepped.
  ASSERT_TRUE(WaitForTrims(heap, 1));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(heap.trims.load(), 1) << "trimmed under steady load";
  trimmer.SetIdle(true);
  ASSERT_TRUE(WaitForTrims(heap, 2));
}

TEST(HeapTrimmerTest, MemoryFreedWhileIdleGoesBackEvenBelowTheSlack) {
  FakeHeap heap;
  heap.Set({300 * kMiB, 120 * kMiB});
  HeapTrimmer trimmer(
      absl::Milliseconds(20), 64 * kMiB, absl::Milliseconds(1), [&] { return heap.Read(); },
      [&] { heap.trims.fetch_add(1); });
  trimmer.RequestTrim();  // The last group deleted; its connections still open.
  ASSERT_TRUE(WaitForTrims(heap, 1));
  heap.Set({300 * kMiB, 100 * kMiB});  // They close: 20 MiB freed.
  ASSERT_TRUE(WaitForTrims(heap, 2));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(heap.trims.load(), 2);
}

TEST(HeapTrimmerTest, WithoutAPeriodOnlyRequestsTrim) {
  FakeHeap heap;
  heap.Set({300 * kMiB, 120 * kMiB});
  HeapTrimmer trimmer(
      absl::ZeroDuration(), 64 * kMiB, absl::Milliseconds(1), [&] { return heap.Read(); },
      [&] { heap.trims.fetch_add(1); });
  trimmer.SetIdle(false);
  trimmer.SetIdle(true);
  heap.Set({300 * kMiB, 10 * kMiB});
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(heap.trims.load(), 0);
  trimmer.RequestTrim();
  ASSERT_TRUE(WaitForTrims(heap, 1));
}

}  // namespace
}  // namespace optstate
