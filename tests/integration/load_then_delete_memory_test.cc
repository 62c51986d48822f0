// After a heavy load from many connections ends and every group is deleted,
// the daemon's memory goes back within one --heap_trim_interval, every time
// (issue 33).
//
// The shape of the report: many clients, each with its own connection and
// its own group, group sizes spread across the 1 MiB threshold at which
// state arrays get mappings of their own (both the heap and unmapped arrays
// are exercised), back-to-back Step calls over the wire, then every group
// deleted, then the connections closed, each at its own moment, as trainers
// exit after cleaning up. The connections' buffers (about 1 MiB each on the
// daemon) are freed after the deletes' trims; before the settle trim
// (server/base/heap_trimmer.h) a later look gave them back only when they
// came to more than --heap_trim_slack (64 MiB): 64 connections' 68 MiB went
// back 10 s later, 32 connections' 16-45 MiB were still there one interval
// later in all 12 cycles (against the daemon of 26ac04e; now in none).
//
// Why the repetition: where the last frees fall against the last trims and
// looks is set by scheduling, so each load-then-delete cycle (its sizes and
// close times drawn from the seed) is a fresh draw of that race. The report
// saw memory stay in one run of six; 12 independent cycles miss a behaviour
// that shows in one run of six with probability (5/6)^12 = 11%, and one that
// shows in every other run with 0.02%; what the connections leave fails
// every cycle. The bound, 16 MiB over the idle daemon, is 5 times what such a
// cycle leaves once trimmed (2-3 MiB: the heap's and threads' bookkeeping)
// and half of what 32 connections' buffers take; the issue asks for 64 MiB.
// The test runs for about 80 s on 2 cores (the load is short: what matters
// is the ending).
//
// Label `rss` (tests/integration/CMakeLists.txt): it measures resident
// memory, which the sanitizer build's allocator keeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "optstate/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/resident_memory.h"
#include "tests/testing/test_seed.h"

namespace optstate::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr int kCycles = 12;
constexpr int kClients = 32;
constexpr absl::Duration kTrimInterval = absl::Seconds(4);
constexpr absl::Duration kLoad = absl::Seconds(2);
// Connections are closed between these after the last delete.
constexpr absl::Duration kMinHold = absl::Milliseconds(200), kMaxHold = absl::Milliseconds(1500);
constexpr uint64_t kAllowedOverIdle = 16 * kMiB;
// Arrays of 1 MiB (262,144 elements) and more are mappings of their own
// (server/state/host_allocator.cc); the sizes span 1/4 to 4 times that.
constexpr double kMinElements = 65536, kMaxElements = 1048576;

struct CycleResult {
  uint64_t loaded = 0;       // RSS with every group stepped, before the deletes.
  uint64_t at_close = 0;     // RSS when the last connection closed.
  uint64_t after = 0;        // RSS when it was back, or at the deadline.
  absl::Duration to_return;  // From the last close to `after`.
  int failures = 0;          // Clients whose register, step or delete failed.
  uint64_t elements = 0;
};

constexpr int kMinSteps = 2;  // Every page of every group touched, on a machine however busy.

// One cycle: kClients clients, each on its own connection with its own group,
// step without pause for kLoad (and at least kMinSteps times), then, once all
// have, delete their groups, and, once all have, close their connections,
// each at a random moment.
CycleResult RunCycle(const std::string& target, pid_t pid, uint64_t idle, std::mt19937_64& rng,
                     int cycle) {
  CycleResult result;
  std::vector<uint64_t> sizes(kClients);
  std::vector<absl::Duration> holds(kClients);
  for (int c = 0; c < kClients; ++c) {
    // Log-uniform; the first two clients take the two ends.
    const double u = c == 0 ? 0.0 : c == 1 ? 1.0 : std::uniform_real_distribution<>(0, 1)(rng);
    sizes[c] = static_cast<uint64_t>(
        std::exp(std::log(kMinElements) + u * (std::log(kMaxElements) - std::log(kMinElements))));
    holds[c] = kMinHold + (kMaxHold - kMinHold) * std::uniform_real_distribution<>(0, 1)(rng);
    result.elements += sizes[c];
  }
  absl::Mutex mu;
  int failures = 0;
  std::atomic<int> stepped{0}, deleted{0}, closed{0};
  absl::Notification delete_now, close_now;
  const absl::Time until = absl::Now() + kLoad;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      ClientOptions options;
      options.data_plane = DataPlane::kWire;  // The daemon's own memory, not a region's.
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, options);
      const std::string name = absl::StrCat("cycle", cycle, ".client", c);
      std::vector<float> gradient(sizes[c], 1e-3f), params(sizes[c]);
      bool ok = client.ok() && (*client)->RegisterGroup(name, sizes[c]).ok();
      for (uint64_t t = 1; ok && (t <= kMinSteps || absl::Now() < until); ++t) {
        ok = (*client)->Step(name, t, gradient, absl::MakeSpan(params)).ok();
      }
      stepped.fetch_add(1);
      delete_now.WaitForNotification();
      ok = ok && (*client)->DeleteGroup(name).ok();
      deleted.fetch_add(1);
      close_now.WaitForNotification();
      absl::SleepFor(holds[c]);
      if (client.ok()) client->reset();  // Closes the connection.
      closed.fetch_add(1);
      if (!ok) {
        absl::MutexLock lock(&mu);
        ++failures;
      }
    });
  }
  while (stepped.load() < kClients) absl::SleepFor(absl::Milliseconds(10));
  result.loaded = ResidentBytes(pid);
  delete_now.Notify();
  while (deleted.load() < kClients) absl::SleepFor(absl::Milliseconds(10));
  close_now.Notify();
  while (closed.load() < kClients) absl::SleepFor(absl::Milliseconds(10));
  for (std::thread& t : threads) t.join();
  const absl::Time last_close = absl::Now();
  result.failures = failures;
  result.at_close = ResidentBytes(pid);
  // Every group is deleted and every stream and connection gone: back within
  // one trim interval (and a moment for the trim itself on a busy machine).
  const absl::Time deadline = last_close + kTrimInterval + absl::Milliseconds(500);
  result.after = result.at_close;
  while (result.after > idle + kAllowedOverIdle && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    result.after = ResidentBytes(pid);
  }
  result.to_return = absl::Now() - last_close;
  return result;
}

TEST(LoadThenDeleteMemoryTest, EveryCycleGivesTheMemoryBackWithinOneTrimInterval) {
  auto daemon = DaemonProcess::Start(
      {"--threads=2", absl::StrCat("--heap_trim_interval=", absl::FormatDuration(kTrimInterval))});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const pid_t pid = (*daemon)->pid();
  const uint64_t idle = ResidentBytes(pid);
  ASSERT_GT(idle, 0u);
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  std::mt19937_64 rng(seed);
  int cycles_kept = 0;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    SCOPED_TRACE(absl::StrCat("cycle ", cycle));
    const CycleResult r = RunCycle((*daemon)->target(), pid, idle, rng, cycle);
    ASSERT_EQ(r.failures, 0);
    // Read after the RSS check: this call's own connection adds its buffers.
    ClientOptions options;
    options.data_plane = DataPlane::kWire;
    absl::StatusOr<Stats> stats;
    if (auto client = Client::Connect((*daemon)->target(), options); client.ok()) {
      stats = (*client)->GetStats();
    }
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::cout << "cycle " << cycle << ": " << r.elements / 1e6 << " M elements, VmRSS "
              << idle / kMiB << " MiB idle, " << r.loaded / kMiB << " loaded, " << r.at_close / kMiB
              << " at the last close, " << r.after / kMiB << " after "
              << absl::FormatDuration(r.to_return) << "; heap " << stats->heap.in_use_bytes / kMiB
              << " MiB in use, " << stats->heap.resident_bytes / kMiB << " resident, "
              << stats->heap.free_bytes / kMiB << " free, " << stats->heap.trims << " trims\n";
    EXPECT_EQ(stats->num_groups, 0u);
    // Params, m and v of every group, stepped: resident before the deletes.
    EXPECT_GE(r.loaded, idle + r.elements * 12) << "the groups were not resident";
    EXPECT_GT(stats->heap.resident_bytes, 0u);
    EXPECT_LE(stats->heap.resident_bytes, stats->heap.in_use_bytes + kAllowedOverIdle)
        << "the heap kept free memory resident";
    if (r.after > idle + kAllowedOverIdle) ++cycles_kept;
    EXPECT_LE(r.after, idle + kAllowedOverIdle)
        << (r.after - idle) / kMiB << " MiB over idle " << absl::FormatDuration(r.to_return)
        << " after the last connection closed";
  }
  std::cout << cycles_kept << " of " << kCycles << " cycles kept memory past one trim interval\n";
}

}  // namespace
}  // namespace optstate::testing
