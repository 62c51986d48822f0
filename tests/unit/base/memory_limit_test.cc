// The cgroup memory limit read from a made-up /proc/self/cgroup and
// /sys/fs/cgroup: v1 and v2, the lowest along the ancestors, "no limit".
#include "server/base/memory_limit.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace optstate {
namespace {

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/optstate-cgroup-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = root_ + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::string root_;
};

TEST_F(CgroupTree, V2TakesTheLowestMemoryMaxAlongTheAncestors) {
  Write("memory.max", "max\n");
  Write("kubepods/memory.max", "8589934592\n");
  Write("kubepods/pod1/memory.max", "max\n");
  Write("kubepods/pod1/c1/memory.max", "1610612736\n");
  EXPECT_EQ(CgroupMemoryLimit("0::/kubepods/pod1/c1\n", root_), 1610612736u);
  EXPECT_EQ(CgroupMemoryLimit("0::/kubepods/pod1\n", root_), 8589934592u);
  // A container's own namespace: its cgroup is the root of what it sees.
  Write("memory.max", "1073741824\n");
  EXPECT_EQ(CgroupMemoryLimit("0::/\n", root_), 1073741824u);
}

TEST_F(CgroupTree, V1ReadsTheMemoryControllersLimitAndTakesItsNoLimitForNone) {
  Write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("memory/docker/abc/memory.limit_in_bytes", "1500000256\n");
  const std::string hybrid = "9:name=systemd:/\n4:memory:/docker/abc\n3:cpu,cpuacct:/\n0::/\n";
  EXPECT_EQ(CgroupMemoryLimit(hybrid, root_), 1500000256u);
  EXPECT_EQ(CgroupMemoryLimit("4:memory:/\n", root_), kNoMemoryLimit);
  EXPECT_EQ(CgroupMemoryLimit("4:cpu,memory:/elsewhere\n", root_), kNoMemoryLimit);
}

TEST_F(CgroupTree, NothingReadableIsNoLimit) {
  EXPECT_EQ(CgroupMemoryLimit("", root_), kNoMemoryLimit);
  EXPECT_EQ(CgroupMemoryLimit("0::/a/b\n", root_), kNoMemoryLimit);
  Write("memory.max", "garbage");
  EXPECT_EQ(CgroupMemoryLimit("0::/\n", root_), kNoMemoryLimit);
}

TEST(MemoryThisProcessMayUseTest, IsAtMostTheHostsMemory) {
  const uint64_t may_use = MemoryThisProcessMayUse();
  const uint64_t host = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                        static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  EXPECT_GT(may_use, 0u);
  EXPECT_LE(may_use, host);
}

}  // namespace
}  // namespace optstate
