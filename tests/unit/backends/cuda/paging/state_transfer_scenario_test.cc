// Checkpoint and import plans carried out on values: a simulated device copy
// of a group (host vectors standing in for VRAM), stepped, read back and
// overwritten exactly as CudaBackend carries out PlanStep, PlanStateToHost
// and PlanStateWritten, against a group that lives on the host only. Runs
// without a GPU; tests/gpu/cuda_durability_test.cc checks the real copies.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "server/backends/cuda/paging/step_plan.h"

namespace optstate {
namespace {

constexpr uint64_t kPage = 100;
constexpr uint64_t kElements = 950;  // 10 pages, the last one 50 long.

struct Arrays {
  explicit Arrays(uint64_t n) : p(n), m(n), v(n) {}
  std::vector<float> p, m, v;
};

// A toy update with the shape of AdamW: m and v carry history, p follows.
void Update(Arrays& a, uint64_t i, float g) {
  a.m[i] = a.m[i] * 0.5f + g;
  a.v[i] = a.v[i] * 0.25f + g * g;
  a.p[i] -= 0.1f * a.m[i] / (std::sqrt(a.v[i]) + 1.0f);
}

float Grad(uint64_t step, uint64_t i) {
  return static_cast<float>((step * 7919 + i * 104729) % 2001) / 1000.0f - 1.0f;
}

// What CudaBackend keeps of a group, with the device arrays as host vectors.
class SimGroup {
 public:
  explicit SimGroup(Placement placement)
      : placement_(placement), host_(kElements), device_(kElements), residency_(10) {
    // A new resident group is zero-filled on the device: every page is there.
    if (placement_ == Placement::kDeviceResident) residency_.MarkOnDevice(0, 10);
  }

  void Step(uint64_t step, uint64_t begin, uint64_t end) {
    const StepPlan plan = PlanStep(placement_, residency_, geometry_, begin, end, 4);
    if (!plan.on_device_arrays) {  // Paged: in, update, out: as if on the host.
      for (uint64_t i = begin; i < end; ++i) Update(host_, i, Grad(step, i));
    } else {
      for (const ElementRange& r : plan.page_ins) Copy(host_, device_, r);
      for (uint64_t i = begin; i < end; ++i) {
        Update(device_, i, Grad(step, i));
        host_.p[i] = device_.p[i];  // Only the params come back.
      }
      residency_.MarkOnDevice(plan.first_page, plan.end_page);
    }
    AddTraffic(plan.traffic, &counters_);
  }

  // CudaBackend::ReadStateToHost.
  void ReadStateToHost(uint64_t begin, uint64_t end) {
    const ParamsUploadPlan plan = PlanStateToHost(placement_, residency_, geometry_, begin, end);
    for (const ElementRange& r : plan.uploads) Copy(device_, host_, r);
    AddTraffic(plan.traffic, &counters_);
  }

  // The caller overwrites the host arrays, then CudaBackend::StateWritten.
  void WriteState(uint64_t begin, uint64_t end, const Arrays& from) {
    Copy(from, host_, ElementRange{begin, end});
    const StateWrittenPlan plan = PlanStateWritten(placement_, residency_, geometry_, begin, end);
    residency_.MarkOffDevice(plan.first_stale_page, plan.end_stale_page);
    for (const ElementRange& r : plan.uploads) Copy(host_, device_, r);
    AddTraffic(plan.traffic, &counters_);
  }

  const Arrays& host() const { return host_; }
  const PagingCounters& counters() const { return counters_; }

 private:
  static void Copy(const Arrays& from, Arrays& to, ElementRange r) {
    for (uint64_t i = r.begin; i < r.end; ++i) {
      to.p[i] = from.p[i];
      to.m[i] = from.m[i];
      to.v[i] = from.v[i];
    }
  }

  const Placement placement_;
  const PageGeometry geometry_{kPage, kElements};
  Arrays host_, device_;
  PageResidency residency_;
  PagingCounters counters_;
};

// The reference: the same steps on host arrays only.
void StepReference(Arrays& a, uint64_t step, uint64_t begin, uint64_t end) {
  for (uint64_t i = begin; i < end; ++i) Update(a, i, Grad(step, i));
}

// Elements of [begin, end) where any of p, m, v differ.
uint64_t Differences(const Arrays& a, const Arrays& b, uint64_t begin, uint64_t end) {
  uint64_t n = 0;
  for (uint64_t i = begin; i < end; ++i) {
    n += (a.p[i] != b.p[i] || a.m[i] != b.m[i] || a.v[i] != b.v[i]) ? 1 : 0;
  }
  return n;
}

class StateTransferScenarioTest : public ::testing::TestWithParam<Placement> {};

TEST_P(StateTransferScenarioTest, ReadingARangeBringsExactlyItsCurrentStateToTheHost) {
  SimGroup group(GetParam());
  Arrays ref(kElements);
  for (uint64_t step = 1; step <= 3; ++step) {
    group.Step(step, 0, 500);
    group.Step(step, 500, kElements);
    StepReference(ref, step, 0, kElements);
  }
  group.ReadStateToHost(250, 620);
  EXPECT_EQ(Differences(group.host(), ref, 250, 620), 0u);
  if (GetParam() == Placement::kDeviceResident) {
    // Outside the range the host's m and v are those of before the steps.
    EXPECT_EQ(Differences(group.host(), ref, 0, 250), 250u);
    EXPECT_EQ(group.counters().page_outs.load(), 5u);  // Pages 2..6.
    EXPECT_EQ(group.counters().bytes_device_to_host.load(), 3 * kElements * 4 + 370 * 12);
  } else {
    EXPECT_EQ(Differences(group.host(), ref, 0, kElements), 0u);
    EXPECT_EQ(group.counters().page_outs.load(), 3 * 10u);  // The steps' own.
  }
}

TEST_P(StateTransferScenarioTest, OverwrittenStateIsWhatLaterStepsContinueFrom) {
  SimGroup group(GetParam());
  Arrays ref(kElements);
  for (uint64_t step = 1; step <= 2; ++step) {
    group.Step(step, 0, kElements);
    StepReference(ref, step, 0, kElements);
  }
  // An import of other state into [150, 620): partial pages 1 and 6 at the
  // ends, pages 2..5 whole.
  Arrays imported(kElements);
  for (uint64_t i = 0; i < kElements; ++i) {
    imported.p[i] = ref.p[i] + 1.0f;
    imported.m[i] = ref.m[i] * 2.0f;
    imported.v[i] = ref.v[i] + 0.5f;
  }
  const uint64_t ins_before = group.counters().page_ins.load();
  group.WriteState(150, 620, imported);
  for (uint64_t i = 150; i < 620; ++i) {
    ref.p[i] = imported.p[i];
    ref.m[i] = imported.m[i];
    ref.v[i] = imported.v[i];
  }
  for (uint64_t step = 3; step <= 5; ++step) {
    group.Step(step, 0, kElements);
    StepReference(ref, step, 0, kElements);
  }
  group.ReadStateToHost(0, kElements);
  EXPECT_EQ(Differences(group.host(), ref, 0, kElements), 0u);
  if (GetParam() == Placement::kDeviceResident) {
    // Pages 2..5 moved in again once, with step 3; 70 elements uploaded.
    EXPECT_EQ(group.counters().page_ins.load() - ins_before, 4u);
    EXPECT_EQ(group.counters().bytes_host_to_device.load(), 5 * kElements * 4 + 70 * 12 + 400 * 12);
  }
}

TEST_P(StateTransferScenarioTest, AWholeGroupWrittenBeforeAnyStepIsStepped) {
  // A restore or an import of a new group: attach, then the whole state.
  SimGroup group(GetParam());
  Arrays ref(kElements);
  for (uint64_t i = 0; i < kElements; ++i) {
    ref.p[i] = Grad(99, i);
    ref.m[i] = Grad(98, i) * 0.1f;
    ref.v[i] = Grad(97, i) * Grad(97, i);
  }
  group.WriteState(0, kElements, ref);
  group.ReadStateToHost(0, kElements);  // A checkpoint right after a restore.
  EXPECT_EQ(Differences(group.host(), ref, 0, kElements), 0u);
  for (uint64_t step = 8; step <= 10; ++step) {
    group.Step(step, 0, kElements);
    StepReference(ref, step, 0, kElements);
  }
  group.ReadStateToHost(0, kElements);
  EXPECT_EQ(Differences(group.host(), ref, 0, kElements), 0u);
}

INSTANTIATE_TEST_SUITE_P(Placements, StateTransferScenarioTest,
                         ::testing::Values(Placement::kDeviceResident, Placement::kDevicePaged),
                         [](const ::testing::TestParamInfo<Placement>& info) {
                           return info.param == Placement::kDeviceResident ? "Resident" : "Paged";
                         });

}  // namespace
}  // namespace optstate
