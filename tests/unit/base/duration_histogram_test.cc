// DurationHistogram against counts made by hand: inclusive upper bounds, the
// +Inf bucket, sums, and many threads observing at once.
#include "server/base/duration_histogram.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace optstate {
namespace {

TEST(DurationHistogramTest, BoundsAreInclusiveAndTheRestIsInTheLastBucket) {
  DurationHistogram histogram;
  histogram.Observe(absl::Microseconds(10));   // == the first bound: first bucket.
  histogram.Observe(absl::Nanoseconds(10001)); // Just past it: second.
  histogram.Observe(absl::Seconds(60));        // == the last bound.
  histogram.Observe(absl::Seconds(61));        // +Inf.
  histogram.Observe(-absl::Seconds(1));        // Counted as zero: first bucket.
  const DurationHistogram::Snapshot s = histogram.Read();
  EXPECT_EQ(s.counts[0], 2u);
  EXPECT_EQ(s.counts[1], 1u);
  EXPECT_EQ(s.counts[DurationHistogram::kBoundsSeconds.size() - 1], 1u);
  EXPECT_EQ(s.counts[DurationHistogram::kBuckets - 1], 1u);
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum_seconds, 10e-6 + 10001e-9 + 60 + 61);
}

TEST(DurationHistogramTest, ThreadsObservingAtOnceLoseNothing) {
  DurationHistogram histogram;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&histogram] {
      for (int i = 0; i < 10000; ++i) histogram.Observe(absl::Milliseconds(2));
    });
  }
  for (std::thread& t : threads) t.join();
  const DurationHistogram::Snapshot s = histogram.Read();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_EQ(s.counts[7], 40000u);  // (1 ms, 2.5 ms].
  EXPECT_NEAR(s.sum_seconds, 80.0, 1e-6);
}

}  // namespace
}  // namespace optstate
