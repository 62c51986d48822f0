// Deleted groups give their memory back to the system: the daemon's
// resident size returns to where it started after groups are registered,
// stepped (every byte of params, m and v touched) and deleted.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "optstate/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/resident_memory.h"

namespace optstate::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(MemoryReturnTest, RegisteringSteppingAndDeletingGroupsReturnsTheirMemory) {
  auto daemon = DaemonProcess::Start({"--threads=2", "--max_host_bytes=536870912"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // Over the wire: this measures the daemon's own memory. A shared-memory
  // client's region is that client's memory, mapped into the daemon until the
  // client goes (shared_memory_hostile_test checks it is released then).
  ClientOptions options;
  options.data_plane = DataPlane::kWire;
  auto client = Client::Connect((*daemon)->target(), options);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->ListGroups().ok());  // The connection and its buffers exist.
  const pid_t pid = (*daemon)->pid();
  const uint64_t start = ResidentBytes(pid);
  ASSERT_GT(start, 0u);
  constexpr int kGroups = 10;
  constexpr uint64_t kElements = 48 * kMiB / 12;  // 48 MiB of params, m and v.
  std::vector<float> gradient(kElements, 1e-3f);
  for (int i = 0; i < kGroups; ++i) {
    const std::string name = absl::StrCat("g", i);
    ASSERT_TRUE((*client)->RegisterGroup(name, kElements).ok()) << name;
    ASSERT_TRUE((*client)->Step(name, 1, gradient, {}).ok()) << name;
  }
  const uint64_t loaded = ResidentBytes(pid);
  EXPECT_GE(loaded, start + 400 * kMiB) << "the groups were not resident";
  for (int i = 0; i < kGroups; ++i) ASSERT_TRUE((*client)->DeleteGroup(absl::StrCat("g", i)).ok());
  uint64_t after = ResidentBytes(pid);
  for (int i = 0; i < 50 && after > start + 64 * kMiB; ++i) {
    absl::SleepFor(absl::Milliseconds(40));
    after = ResidentBytes(pid);
  }
  std::cout << "VmRSS: " << start / kMiB << " MiB at start, " << loaded / kMiB
            << " MiB with the groups, " << after / kMiB << " MiB after deleting them\n";
  EXPECT_LE(after, start + 64 * kMiB);
}

}  // namespace
}  // namespace optstate::testing
