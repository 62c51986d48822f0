// A client's shared-memory region stays bounded by its live layout whatever
// dtypes its steps alternate between (the rss-soak OOM: every dtype flip
// laid out new areas and every overflow doubled the region), the daemon's
// GetStats says what it maps, and a client that goes releases all of it.
// Results stay bit-identical to the wire's.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "optstate/client.h"
#include "tests/testing/in_process_daemon.h"
#include "tests/testing/random_tensors.h"

namespace optstate {
namespace {

using ::optstate::testing::FreshSeed;
using ::optstate::testing::RandomNormal;

constexpr uint64_t kPage = 4096;

uint64_t AlignUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

// The bound SharedMemoryPlane::region_bytes documents for groups of `sizes`
// all stepped recently: max(1 MiB, 2 x their areas at their largest (4-byte
// gradient and params, each 64-byte aligned)), rounded up to a page.
uint64_t RegionBound(const std::vector<uint64_t>& sizes) {
  uint64_t live = 0;
  for (uint64_t n : sizes) live += 2 * AlignUp(4 * n, 64);
  return AlignUp(std::max<uint64_t>(2 * live, 1 << 20), 4096);
}

// One step's dtypes and buffer kind; the test cycles through them.
struct Flavour {
  WireType gradient;
  WireType params;
  bool sixteen_bit_buffers;
};
const Flavour kFlavours[] = {
    {WireType::kFloat32, WireType::kFloat32, false},
    {WireType::kBFloat16, WireType::kFloat32, false},
    {WireType::kBFloat16, WireType::kBFloat16, true},
    {WireType::kFloat16, WireType::kFloat16, false},
    {WireType::kFloat32, WireType::kBFloat16, false},
    {WireType::kFloat16, WireType::kFloat16, true},
};

class SharedMemoryRegionBoundTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = ::optstate::testing::InProcessDaemon::Start(2, kPage);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    ClientOptions wire;
    wire.data_plane = DataPlane::kWire;
    ClientOptions shared;
    shared.data_plane = DataPlane::kSharedMemory;
    auto a = Client::Connect(daemon_->target(), wire);
    auto b = Client::Connect(daemon_->target(), shared);
    ASSERT_TRUE(a.ok() && b.ok());
    wire_ = std::move(*a);
    shm_ = std::move(*b);
    seed_ = FreshSeed();
    rng_.seed(seed_);
  }

  RegionStats Regions() {
    absl::StatusOr<Stats> stats = wire_->GetStats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? stats->regions : RegionStats{};
  }

  // Steps twin groups of `sizes` through `steps` steps cycling through
  // kFlavours, starting at flavour `first`; after every step the replies
  // match the wire's bit for bit and the daemon maps at most the bound.
  void StepAlternating(const std::string& tag, const std::vector<uint64_t>& sizes, int steps,
                       size_t first) {
    SCOPED_TRACE(::testing::Message() << tag << " seed " << seed_);
    const size_t n = sizes.size();
    const uint64_t bound = RegionBound(sizes);
    std::vector<std::vector<float>> grads(n), out_wire(n), out_shm(n);
    std::vector<std::vector<uint16_t>> grads16(n), out16_wire(n), out16_shm(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> initial = RandomNormal(rng_, sizes[i], 1.0f);
      ASSERT_TRUE(wire_->RegisterGroup(absl::StrCat(tag, ".wire.", i), initial).ok());
      ASSERT_TRUE(shm_->RegisterGroup(absl::StrCat(tag, ".shm.", i), initial).ok());
      out_wire[i].resize(sizes[i]);
      out_shm[i].resize(sizes[i]);
      out16_wire[i].resize(sizes[i]);
      out16_shm[i].resize(sizes[i]);
    }
    for (int t = 1; t <= steps; ++t) {
      const Flavour& f = kFlavours[(first + static_cast<size_t>(t)) % std::size(kFlavours)];
      StepOptions options;
      options.gradient_dtype = f.gradient;
      options.param_dtype = f.params;
      std::vector<GroupStep> through_wire, through_shm;
      for (size_t i = 0; i < n; ++i) {
        grads[i] = RandomNormal(rng_, sizes[i], 1e-2f);
        GroupStep w{absl::StrCat(tag, ".wire.", i), grads[i], absl::MakeSpan(out_wire[i])};
        GroupStep s{absl::StrCat(tag, ".shm.", i), grads[i], absl::MakeSpan(out_shm[i])};
        if (f.sixteen_bit_buffers) {
          grads16[i].resize(sizes[i]);
          EncodeFromFloat(f.gradient, grads[i].data(), grads16[i].data(), sizes[i]);
          w.gradient = s.gradient = ConstBufferView::Of16Bit(grads16[i], f.gradient);
          w.params_out = BufferView::Of16Bit(absl::MakeSpan(out16_wire[i]), f.params);
          s.params_out = BufferView::Of16Bit(absl::MakeSpan(out16_shm[i]), f.params);
        }
        through_wire.push_back(w);
        through_shm.push_back(s);
      }
      ASSERT_TRUE(wire_->Step(through_wire, t, options).ok()) << t;
      absl::Status shared = shm_->Step(through_shm, t, options);
      ASSERT_TRUE(shared.ok()) << t << " " << shared;
      for (size_t i = 0; i < n; ++i) {
        if (f.sixteen_bit_buffers) {
          ASSERT_EQ(out16_wire[i], out16_shm[i]) << "group " << i << " step " << t;
        } else {
          ASSERT_EQ(0, std::memcmp(out_wire[i].data(), out_shm[i].data(), sizes[i] * 4))
              << "group " << i << " step " << t;
        }
      }
      const RegionStats regions = Regions();
      ASSERT_EQ(regions.sessions, 1u) << "step " << t;
      ASSERT_EQ(regions.regions, 1u) << "step " << t;
      ASSERT_LE(regions.registered_bytes, bound) << "step " << t;
      ASSERT_LE(regions.mapped_bytes, bound) << "step " << t;
      // Every reply is in: no step holds a region, so a replaced one is unmapped.
      ASSERT_EQ(regions.mapped_bytes, regions.registered_bytes) << "step " << t;
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(daemon_->StateBits(absl::StrCat(tag, ".wire.", i)),
                daemon_->StateBits(absl::StrCat(tag, ".shm.", i)))
          << "params, m and v of group " << i;
    }
  }

  uint32_t seed_;
  std::mt19937 rng_;
  std::unique_ptr<::optstate::testing::InProcessDaemon> daemon_;
  std::unique_ptr<Client> wire_;
  std::unique_ptr<Client> shm_;
};

// About 1.4 MB of areas at their largest: the bound is twice that, and the
// old layout (new areas on every dtype flip, the region doubled on every
// overflow) passed it within a few steps.
const std::vector<uint64_t> kGroups = {100000, 60005, 3 * kPage + 7};

TEST_F(SharedMemoryRegionBoundTest, AlternatingDtypesKeepsTheRegionBounded) {
  StepAlternating("alt", kGroups, 40, /*first=*/std::size(kFlavours) - 1);
  // Settled at once: the first step laid the areas out at 4 bytes/element.
  EXPECT_EQ(Regions().registrations, 1u);
}

TEST_F(SharedMemoryRegionBoundTest, StartingWith16BitDtypesSettlesOnOneLayout) {
  // The first step lays areas out at 2 bytes/element; the first 4-byte
  // gradient and the first 4-byte params each re-place them once (keeping
  // the larger capacity), then none move: at most one region per change.
  StepAlternating("alt16", kGroups, 40, /*first=*/1);
  EXPECT_LE(Regions().registrations, 3u);
}

// This process's resident shared memory (the region's pages, mapped by the
// client and by the in-process daemon), in kB.
uint64_t ResidentSharedKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssShmem:", 0) == 0) return std::stoull(line.substr(9));
  }
  return 0;
}

// A trainer that makes and deletes groups one after another (new names each
// time): a deleted group's area was kept as live for 64 steps, so the region
// grew to 64 deleted groups' worth (126 x the one live group in a probe) and
// held their pages until the client closed.
TEST_F(SharedMemoryRegionBoundTest, DeletedGroupsGiveTheirAreasAndPagesBack) {
  constexpr uint64_t n = 1 << 20;  // 4 MiB of gradient and 4 MiB of params.
  const uint64_t bound = RegionBound({n});
  const uint64_t before = ResidentSharedKb();
  std::vector<float> out(n);
  for (int i = 0; i < 12; ++i) {
    const std::string name = absl::StrCat("churn.", i);
    ASSERT_TRUE(shm_->RegisterGroup(name, RandomNormal(rng_, n, 1.0f)).ok());
    const std::vector<float> grad = RandomNormal(rng_, n, 1e-2f);
    ASSERT_TRUE(shm_->Step({GroupStep{name, grad, absl::MakeSpan(out)}}, 1).ok()) << i;
    EXPECT_GE(ResidentSharedKb(), before + 8 * 1024) << "the step's pages, group " << i;
    ASSERT_TRUE(shm_->DeleteGroup(name).ok());
    EXPECT_LE(ResidentSharedKb(), before + 64) << "pages kept after deleting group " << i;
    const RegionStats regions = Regions();
    ASSERT_LE(regions.registered_bytes, bound) << "group " << i;
  }
  // Deleted areas' offsets are not reused (a chunk of an abandoned step may
  // still write there): a new region, sized from the live areas, comes once
  // the region (twice one group's) is full.
  EXPECT_LE(Regions().registrations, 1u + 12 / 2);
}

TEST_F(SharedMemoryRegionBoundTest, AClientThatGoesReleasesItsRegion) {
  StepAlternating("gone", kGroups, 6, 0);
  ASSERT_GT(Regions().mapped_bytes, 0u);
  shm_.reset();
  // The daemon sees the region socket close on its own thread, and unmaps
  // the session's regions just after it forgets the session.
  RegionStats regions = Regions();
  for (int i = 0; i < 500 && (regions.sessions != 0 || regions.mapped_bytes != 0); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    regions = Regions();
  }
  EXPECT_EQ(regions.sessions, 0u);
  EXPECT_EQ(regions.regions, 0u);
  EXPECT_EQ(regions.registered_bytes, 0u);
  EXPECT_EQ(regions.mapped_bytes, 0u);
}

}  // namespace
}  // namespace optstate
