// A register/step/delete sequence under a small injected budget, driven
// through PagingPolicy and the step plans exactly as CudaBackend drives them
// (admit at attach; plan, carry out, mark and count per step; promote on
// delete with pages moving in lazily), checking placements and counters.
#include <map>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/backends/cuda/paging/paging_policy.h"
#include "server/backends/cuda/paging/step_plan.h"

namespace optstate {
namespace {

constexpr uint64_t kPage = 1024;

// What CudaBackend keeps per group, without the device arrays.
struct SimGroup {
  SimGroup(uint64_t id, uint64_t elements)
      : id(id), geometry{kPage, elements}, residency(geometry.EndPage(elements)) {}
  uint64_t id;
  PageGeometry geometry;
  PageResidency residency;
  Placement placement = Placement::kHost;
  PagingCounters counters;
};

class SimBackend {
 public:
  explicit SimBackend(PagingPolicy* policy) : policy_(policy) {}

  absl::Status Register(const std::string& name, uint64_t elements) {
    auto group = std::make_unique<SimGroup>(next_id_++, elements);
    absl::StatusOr<Placement> placed = policy_->Admit(group->id, name, elements * 12);
    if (!placed.ok()) return placed.status();
    group->placement = *placed;
    // A new resident group is zero-filled on the device: every page is there.
    if (*placed == Placement::kDeviceResident) {
      group->residency.MarkOnDevice(0, group->residency.num_pages());
    }
    groups_[name] = std::move(group);
    return absl::OkStatus();
  }

  void Step(const std::string& name, uint64_t begin, uint64_t end, size_t grad_size) {
    SimGroup& g = *groups_.at(name);
    StepPlan plan = PlanStep(g.placement, g.residency, g.geometry, begin, end, grad_size);
    if (plan.on_device_arrays) g.residency.MarkOnDevice(plan.first_page, plan.end_page);
    AddTraffic(plan.traffic, &g.counters);
  }

  void WriteParams(const std::string& name, uint64_t begin, uint64_t end) {
    SimGroup& g = *groups_.at(name);
    AddTraffic(PlanParamsUpload(g.placement, g.residency, g.geometry, begin, end).traffic,
               &g.counters);
  }

  void Delete(const std::string& name) {
    SimGroup& g = *groups_.at(name);
    for (uint64_t id : policy_->Remove(g.id)) {
      for (auto& [other_name, other] : groups_) {
        if (other->id == id) other->placement = Placement::kDeviceResident;
      }
    }
    groups_.erase(name);
  }

  const SimGroup& group(const std::string& name) const { return *groups_.at(name); }

 private:
  PagingPolicy* policy_;
  uint64_t next_id_ = 1;
  std::map<std::string, std::unique_ptr<SimGroup>> groups_;
};

void ExpectCounters(const SimGroup& g, uint64_t ins, uint64_t outs, uint64_t h2d, uint64_t d2h) {
  EXPECT_EQ(g.counters.page_ins.load(), ins);
  EXPECT_EQ(g.counters.page_outs.load(), outs);
  EXPECT_EQ(g.counters.bytes_host_to_device.load(), h2d);
  EXPECT_EQ(g.counters.bytes_device_to_host.load(), d2h);
}

// Budget: 1 MiB total at 50% = 524288 available; a pool of 2 x 64 KiB leaves
// 393216 bytes (32768 elements) for resident groups.
TEST(PagingScenarioTest, AdaptiveRegisterStepDeleteUnderASmallBudget) {
  PagingPolicy policy(PagingStrategy::kAdaptive, VramBudget(1 << 20, 0, 0.5), 2 * 65536);
  ASSERT_EQ(policy.resident_capacity_bytes(), 393216u);
  SimBackend backend(&policy);

  ASSERT_TRUE(backend.Register("a", 16384).ok());  // 196608 bytes: resident.
  ASSERT_TRUE(backend.Register("b", 24576).ok());  // 294912 bytes: does not fit, paged.
  ASSERT_TRUE(backend.Register("c", 8192).ok());   // 98304 bytes: fits beside a.
  EXPECT_EQ(backend.group("a").placement, Placement::kDeviceResident);
  EXPECT_EQ(backend.group("b").placement, Placement::kDevicePaged);
  EXPECT_EQ(backend.group("c").placement, Placement::kDeviceResident);
  EXPECT_EQ(policy.resident_bytes(), 294912u);

  // Initial params of c go straight to its device copy.
  backend.WriteParams("c", 0, 8192);
  ExpectCounters(backend.group("c"), 0, 0, 8192 * 4, 0);

  // Step 1, fp32 gradients, every group whole.
  backend.Step("a", 0, 16384, 4);
  backend.Step("b", 0, 24576, 4);
  backend.Step("c", 0, 8192, 4);
  ExpectCounters(backend.group("a"), 0, 0, 16384 * 4, 16384 * 4);
  ExpectCounters(backend.group("b"), 24, 24, 24576 * 16, 24576 * 12);
  ExpectCounters(backend.group("c"), 0, 0, 8192 * 4 + 8192 * 4, 8192 * 4);

  // Deleting a frees 196608 bytes: b (294912) now fits exactly and moves in.
  backend.Delete("a");
  EXPECT_EQ(backend.group("b").placement, Placement::kDeviceResident);
  EXPECT_EQ(policy.resident_bytes(), 393216u);
  EXPECT_EQ(backend.group("b").residency.CountOnDevice(), 0u);  // Pages follow lazily.

  // Step 2 of b in two chunks: each brings its 12 pages in, then steps them
  // on the device (bf16 gradients in the first, fp32 in the second).
  backend.Step("b", 0, 12288, 2);
  ExpectCounters(backend.group("b"), 24 + 12, 24, 24576 * 16 + 12288 * 12 + 12288 * 2,
                 24576 * 12 + 12288 * 4);
  backend.Step("b", 12288, 24576, 4);
  const uint64_t h2d_after_step2 = 24576 * 16 + 12288 * 12 + 12288 * 2 + 12288 * 12 + 12288 * 4;
  const uint64_t d2h_after_step2 = 24576 * 12 + 12288 * 4 + 12288 * 4;
  ExpectCounters(backend.group("b"), 48, 24, h2d_after_step2, d2h_after_step2);
  EXPECT_EQ(backend.group("b").residency.CountOnDevice(), 24u);

  // Step 3: every page is on the device; only gradient in and params out.
  backend.Step("b", 0, 24576, 4);
  ExpectCounters(backend.group("b"), 48, 24, h2d_after_step2 + 24576 * 4,
                 d2h_after_step2 + 24576 * 4);

  // The budget is full: a new group, however small, is paged.
  ASSERT_TRUE(backend.Register("d", 1024).ok());
  EXPECT_EQ(backend.group("d").placement, Placement::kDevicePaged);
  backend.Step("d", 0, 1024, 4);
  ExpectCounters(backend.group("d"), 1, 1, 1024 * 16, 1024 * 12);
  // Its params are uploaded with each page-in, never on their own.
  backend.WriteParams("d", 0, 1024);
  ExpectCounters(backend.group("d"), 1, 1, 1024 * 16, 1024 * 12);

  // Deleting c (resident) frees 98304 bytes: d (12288) moves in.
  backend.Delete("c");
  EXPECT_EQ(backend.group("d").placement, Placement::kDeviceResident);
  EXPECT_EQ(policy.resident_bytes(), 294912u + 12288u);
}

TEST(PagingScenarioTest, NoneRefusesTheGroupThatDoesNotFitAndKeepsTheOthers) {
  PagingPolicy policy(PagingStrategy::kNone, VramBudget(1 << 20, 0, 0.5), 2 * 65536);
  SimBackend backend(&policy);
  ASSERT_TRUE(backend.Register("a", 16384).ok());
  absl::Status refused = backend.Register("b", 24576);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("needs 294912 bytes"), std::string::npos);
  EXPECT_NE(refused.message().find("only 196608 of 393216 bytes"), std::string::npos);
  backend.Step("a", 0, 16384, 4);
  ExpectCounters(backend.group("a"), 0, 0, 16384 * 4, 16384 * 4);
  backend.Delete("a");
  EXPECT_TRUE(backend.Register("b", 24576).ok());
  EXPECT_EQ(backend.group("b").placement, Placement::kDeviceResident);
}

TEST(PagingScenarioTest, FullyPagedCountsEveryTouchedPageBothWays) {
  PagingPolicy policy(PagingStrategy::kFullyPaged, VramBudget(1 << 20, 0, 0.5), 2 * 65536);
  SimBackend backend(&policy);
  ASSERT_TRUE(backend.Register("a", 10 * kPage + 100).ok());  // 11 pages, last short.
  EXPECT_EQ(backend.group("a").placement, Placement::kDevicePaged);
  backend.WriteParams("a", 0, 10 * kPage + 100);
  for (int step = 0; step < 3; ++step) {
    backend.Step("a", 0, 4 * kPage, 2);                 // Pages 0-3.
    backend.Step("a", 4 * kPage, 10 * kPage + 100, 4);  // Pages 4-10.
  }
  const uint64_t first = 4 * kPage, second = 6 * kPage + 100;
  ExpectCounters(backend.group("a"), 3 * 11, 3 * 11, 3 * (first * 14 + second * 16),
                 3 * (first + second) * 12);
  EXPECT_EQ(policy.resident_bytes(), 0u);
}

}  // namespace
}  // namespace optstate
