// Specification of LatencyRecorder (server/base/latency_recorder.h): p50 and p99
// by nearest rank (the ceil(q*N)-th smallest sample) over the last `window`
// samples, with a count of every sample ever recorded.
#include "server/base/latency_recorder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

namespace seeds = ::optstate::testing;

// 1..n in random order.
std::vector<double> ShuffledOneTo(size_t n, std::mt19937_64& rng) {
  std::vector<double> values(n);
  std::iota(values.begin(), values.end(), 1.0);
  std::shuffle(values.begin(), values.end(), rng);
  return values;
}

TEST(LatencyRecorder, EmptyRecorderReportsZeros) {
  const Percentiles p = LatencyRecorder(16).Summarize();
  EXPECT_EQ(p.p50_us, 0);
  EXPECT_EQ(p.p99_us, 0);
  EXPECT_EQ(p.samples, 0u);
}

TEST(LatencyRecorder, SingleSampleIsEveryPercentile) {
  LatencyRecorder recorder(16);
  recorder.Record(42.5);
  const Percentiles p = recorder.Summarize();
  EXPECT_EQ(p.p50_us, 42.5);
  EXPECT_EQ(p.p99_us, 42.5);
  EXPECT_EQ(p.samples, 1u);
}

// 1..100: the 50th and 99th smallest.
TEST(LatencyRecorder, PercentilesOfOneToHundredAreFiftyAndNinetyNine) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  LatencyRecorder recorder(100);
  for (double v : ShuffledOneTo(100, rng)) recorder.Record(v);
  const Percentiles p = recorder.Summarize();
  EXPECT_EQ(p.p50_us, 50);
  EXPECT_EQ(p.p99_us, 99);
  EXPECT_EQ(p.samples, 100u);
}

// 1..10: ranks ceil(5) = 5 and ceil(9.9) = 10, the maximum.
TEST(LatencyRecorder, PercentilesOfOneToTenAreFiveAndTen) {
  LatencyRecorder recorder(10);
  for (double v : {7, 3, 10, 1, 9, 2, 8, 4, 6, 5}) recorder.Record(v);
  const Percentiles p = recorder.Summarize();
  EXPECT_EQ(p.p50_us, 5);
  EXPECT_EQ(p.p99_us, 10);
}

// For every N in 1..1000, the ranks computed in integers:
// ceil(N/2) = (N+1)/2 and ceil(99N/100) = (99N+99)/100.
TEST(LatencyRecorder, NearestRankMatchesIntegerRanksForEverySampleCount) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (size_t n = 1; n <= 1000; ++n) {
    LatencyRecorder recorder(n);
    for (double v : ShuffledOneTo(n, rng)) recorder.Record(v);
    const Percentiles p = recorder.Summarize();
    ASSERT_EQ(p.p50_us, static_cast<double>((n + 1) / 2)) << n << " samples";
    ASSERT_EQ(p.p99_us, static_cast<double>((99 * n + 99) / 100)) << n << " samples";
  }
}

TEST(LatencyRecorder, WindowKeepsOnlyTheLastNSamples) {
  LatencyRecorder recorder(10);
  for (int v = 1; v <= 25; ++v) recorder.Record(v);  // The window holds 16..25.
  const Percentiles p = recorder.Summarize();
  EXPECT_EQ(p.p50_us, 20);
  EXPECT_EQ(p.p99_us, 25);
}

TEST(LatencyRecorder, OutlierLeavesThePercentilesOnceOutOfTheWindow) {
  LatencyRecorder recorder(5);
  recorder.Record(1e6);
  for (double v : {1, 2, 3, 4}) recorder.Record(v);
  EXPECT_EQ(recorder.Summarize().p99_us, 1e6);
  recorder.Record(5);
  EXPECT_EQ(recorder.Summarize().p99_us, 5);
  EXPECT_EQ(recorder.Summarize().p50_us, 3);
}

TEST(LatencyRecorder, ZeroWindowKeepsTheLastSample) {
  LatencyRecorder recorder(0);
  recorder.Record(5.0);
  recorder.Record(7.0);
  const Percentiles p = recorder.Summarize();
  EXPECT_EQ(p.p50_us, 7.0);
  EXPECT_EQ(p.p99_us, 7.0);
  EXPECT_EQ(p.samples, 2u);
}

TEST(LatencyRecorder, SamplesCountsEveryRecordNotOnlyTheWindow) {
  LatencyRecorder recorder(4);
  for (int i = 0; i < 37; ++i) recorder.Record(i);
  EXPECT_EQ(recorder.Summarize().samples, 37u);
}

TEST(LatencyRecorder, ConcurrentRecordsAreAllCounted) {
  constexpr int kThreads = 4, kPerThread = 5000;
  LatencyRecorder recorder(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&recorder, t] {
      for (int i = 0; i < kPerThread; ++i) recorder.Record(t + 1);
      (void)recorder.Summarize();
    });
  }
  for (auto& thread : threads) thread.join();
  const Percentiles p = recorder.Summarize();
  EXPECT_EQ(p.samples, static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_GE(p.p50_us, 1);  // Every value in the window is one of those recorded.
  EXPECT_LE(p.p99_us, kThreads);
}

}  // namespace
}  // namespace optstate
