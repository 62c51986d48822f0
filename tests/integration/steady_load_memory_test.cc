// Under steady load from many clients the daemon's memory stays bounded and
// goes back to where it started once the groups are deleted: receive
// buffers freed on many threads must not stay with the allocator.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "optstate/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/resident_memory.h"

namespace optstate::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(SteadyLoadMemoryTest, MemoryReturnsAfterManyClientsStepAndDelete) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const pid_t pid = (*daemon)->pid();
  const uint64_t idle = ResidentBytes(pid);
  constexpr int kClients = 12;
  constexpr int kGroups = 4;
  const absl::Time until = absl::Now() + absl::Seconds(8);
  std::vector<std::thread> threads;
  absl::Mutex mu;
  int failures = 0;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = Client::Connect((*daemon)->target());
      std::mt19937 rng(c);
      std::vector<std::string> names;
      std::vector<std::vector<float>> grads, params;
      bool ok = client.ok();
      for (int g = 0; ok && g < kGroups; ++g) {
        names.push_back(absl::StrCat("c", c, "g", g));
        const size_t n = 4096 + rng() % 200000;  // Messages of many sizes.
        grads.emplace_back(n, 1e-3f);
        params.emplace_back(n);
        ok = (*client)->RegisterGroup(names.back(), params.back()).ok();
      }
      for (uint64_t t = 1; ok && absl::Now() < until; ++t) {
        std::vector<GroupStep> step;
        for (int g = 0; g < kGroups; ++g)
          step.push_back({names[g], grads[g], absl::MakeSpan(params[g])});
        StepOptions options;
        options.gradient_dtype = t % 2 ? WireType::kFloat32 : WireType::kBFloat16;
        ok = (*client)->Step(step, t, options).ok();
      }
      for (const std::string& name : names) ok = ok && (*client)->DeleteGroup(name).ok();
      if (!ok) {
        absl::MutexLock lock(&mu);
        ++failures;
      }
    });
  }
  uint64_t peak = 0;
  while (absl::Now() < until) {
    peak = std::max(peak, ResidentBytes(pid));
    absl::SleepFor(absl::Milliseconds(200));
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures, 0);
  uint64_t after = ResidentBytes(pid);
  for (int i = 0; i < 40 && after > idle + 24 * kMiB; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    after = ResidentBytes(pid);
  }
  std::cout << "VmRSS: " << idle / kMiB << " MiB idle, " << peak / kMiB << " MiB peak under load, "
            << after / kMiB << " MiB after deleting every group\n";
  EXPECT_LE(after, idle + 24 * kMiB);
}

}  // namespace
}  // namespace optstate::testing
