// Client::AllocateSharedBuffer: gradients and params kept in a SharedBuffer
// are named to the daemon where they are (no region of the client's own is
// needed for them), the results are bit-identical to the wire's, a buffer
// the caller destroys is unregistered, and a wire client gets none. And the
// finite check on both paths: in a buffer, and copied through the region.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optstate/client.h"
#include "tests/testing/in_process_daemon.h"
#include "tests/testing/random_tensors.h"

namespace optstate {
namespace {

using ::optstate::testing::FreshSeed;
using ::optstate::testing::RandomNormal;

constexpr uint64_t kPage = 4096;
// Several pages with a short last one, one page, and a group under a page.
const std::vector<uint64_t> kSizes = {3 * kPage + 123, kPage, 77};

class SharedMemoryBufferTest : public ::testing::Test {
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

  void RegisterTwins(const std::string& tag) {
    for (size_t i = 0; i < kSizes.size(); ++i) {
      std::vector<float> initial = RandomNormal(rng_, kSizes[i], 1.0f);
      ASSERT_TRUE(wire_->RegisterGroup(absl::StrCat(tag, ".wire.", i), initial).ok());
      ASSERT_TRUE(shm_->RegisterGroup(absl::StrCat(tag, ".shm.", i), initial).ok());
    }
  }

  void ExpectSameState(const std::string& tag) {
    for (size_t i = 0; i < kSizes.size(); ++i) {
      EXPECT_EQ(daemon_->StateBits(absl::StrCat(tag, ".wire.", i)),
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

uint64_t Total() {
  uint64_t n = 0;
  for (uint64_t s : kSizes) n += s;
  return n;
}

TEST_F(SharedMemoryBufferTest, Float32InPlaceStepsAreBitIdenticalAndNeedNoOtherRegion) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  RegisterTwins("f32");
  const uint64_t total = Total();
  // Gradients of every group back to back, then their params.
  absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer = shm_->AllocateSharedBuffer(8 * total);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float* grads = static_cast<float*>((*buffer)->data());
  float* params = grads + total;
  std::vector<float> wire_grads(total), wire_params(total);
  for (uint64_t t = 1; t <= 5; ++t) {
    StepOptions options;
    if (t == 2) options.grad_scale = 0.5f;
    if (t == 3) options.lr = 3e-3;
    std::vector<float> g = RandomNormal(rng_, total, 1e-2f);
    std::memcpy(grads, g.data(), total * 4);
    std::memcpy(wire_grads.data(), g.data(), total * 4);
    std::vector<GroupStep> through_wire, through_shm;
    uint64_t at = 0;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      const uint64_t n = kSizes[i];
      through_wire.push_back({absl::StrCat("f32.wire.", i),
                              absl::MakeConstSpan(wire_grads.data() + at, n),
                              absl::MakeSpan(wire_params.data() + at, n)});
      through_shm.push_back({absl::StrCat("f32.shm.", i), absl::MakeConstSpan(grads + at, n),
                             absl::MakeSpan(params + at, n)});
      at += n;
    }
    ASSERT_TRUE(wire_->Step(through_wire, t, options).ok()) << t;
    absl::Status shared = shm_->Step(through_shm, t, options);
    ASSERT_TRUE(shared.ok()) << t << " " << shared;
    ASSERT_EQ(0, std::memcmp(wire_params.data(), params, total * 4)) << "step " << t;
    // Only the buffer is registered: no region of the client's own was
    // made, so no gradient or param was copied through one.
    const RegionStats regions = Regions();
    EXPECT_EQ(regions.regions, 1u) << "step " << t;
    EXPECT_EQ(regions.registered_bytes, (*buffer)->bytes()) << "step " << t;
  }
  ExpectSameState("f32");
}

TEST_F(SharedMemoryBufferTest, SixteenBitInPlaceAndMixedPlacementsAreBitIdentical) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  RegisterTwins("mix");
  const uint64_t total = Total();
  absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer = shm_->AllocateSharedBuffer(12 * total);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  uint16_t* grads16 = static_cast<uint16_t*>((*buffer)->data());
  uint16_t* params16 = grads16 + total;
  float* grads32 = reinterpret_cast<float*>(params16 + total);
  std::vector<uint16_t> wire_grads16(total), wire_params16(total), plain_params16(total);
  std::vector<float> wire_params32(total), plain_params32(total);
  for (uint64_t t = 1; t <= 4; ++t) {
    std::vector<float> g = RandomNormal(rng_, total, 1e-2f);
    StepOptions options;
    options.gradient_dtype = WireType::kBFloat16;
    options.param_dtype = WireType::kBFloat16;
    std::vector<GroupStep> through_wire, through_shm;
    uint64_t at = 0;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      const uint64_t n = kSizes[i];
      const std::string w = absl::StrCat("mix.wire.", i), s = absl::StrCat("mix.shm.", i);
      if (i == 0) {
        // 16-bit gradient and params both in the buffer.
        EncodeFromFloat(WireType::kBFloat16, g.data() + at, grads16 + at, n);
        std::memcpy(wire_grads16.data() + at, grads16 + at, n * 2);
        through_shm.push_back(
            {s, ConstBufferView::Of16Bit(absl::MakeConstSpan(grads16 + at, n), WireType::kBFloat16),
             BufferView::Of16Bit(absl::MakeSpan(params16 + at, n), WireType::kBFloat16)});
        through_wire.push_back(
            {w,
             ConstBufferView::Of16Bit(absl::MakeConstSpan(wire_grads16.data() + at, n),
                                      WireType::kBFloat16),
             BufferView::Of16Bit(absl::MakeSpan(wire_params16.data() + at, n),
                                 WireType::kBFloat16)});
      } else if (i == 1) {
        // 16-bit gradient in the buffer, params into plain memory (copied out).
        EncodeFromFloat(WireType::kBFloat16, g.data() + at, grads16 + at, n);
        std::memcpy(wire_grads16.data() + at, grads16 + at, n * 2);
        through_shm.push_back(
            {s, ConstBufferView::Of16Bit(absl::MakeConstSpan(grads16 + at, n), WireType::kBFloat16),
             BufferView::Of16Bit(absl::MakeSpan(plain_params16.data() + at, n),
                                 WireType::kBFloat16)});
        through_wire.push_back(
            {w,
             ConstBufferView::Of16Bit(absl::MakeConstSpan(wire_grads16.data() + at, n),
                                      WireType::kBFloat16),
             BufferView::Of16Bit(absl::MakeSpan(wire_params16.data() + at, n),
                                 WireType::kBFloat16)});
      } else {
        // A float gradient in the buffer with a bf16 wire: narrowed (copied)
        // into the client's region, params widened into plain floats.
        std::memcpy(grads32 + at, g.data() + at, n * 4);
        through_shm.push_back({s, absl::MakeConstSpan(grads32 + at, n),
                               absl::MakeSpan(plain_params32.data() + at, n)});
        through_wire.push_back({w, absl::MakeConstSpan(g.data() + at, n),
                                absl::MakeSpan(wire_params32.data() + at, n)});
      }
      at += n;
    }
    ASSERT_TRUE(wire_->Step(through_wire, t, options).ok()) << t;
    absl::Status shared = shm_->Step(through_shm, t, options);
    ASSERT_TRUE(shared.ok()) << t << " " << shared;
    const uint64_t n0 = kSizes[0], n1 = kSizes[1], n2 = kSizes[2];
    ASSERT_EQ(0, std::memcmp(wire_params16.data(), params16, n0 * 2)) << "in place, step " << t;
    ASSERT_EQ(0, std::memcmp(wire_params16.data() + n0, plain_params16.data() + n0, n1 * 2))
        << "copied out, step " << t;
    ASSERT_EQ(0,
              std::memcmp(wire_params32.data() + n0 + n1, plain_params32.data() + n0 + n1, n2 * 4))
        << "through the region, step " << t;
    EXPECT_EQ(Regions().regions, 2u) << "the buffer and the client's own region";
  }
  ExpectSameState("mix");
}

TEST_F(SharedMemoryBufferTest, ANonFiniteGradientInABufferRefusesTheStep) {
  RegisterTwins("nan");
  const uint64_t total = Total();
  absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer = shm_->AllocateSharedBuffer(8 * total);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float* grads = static_cast<float*>((*buffer)->data());
  float* params = grads + total;
  std::vector<GroupStep> groups;
  uint64_t at = 0;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    groups.push_back({absl::StrCat("nan.shm.", i), absl::MakeConstSpan(grads + at, kSizes[i]),
                      absl::MakeSpan(params + at, kSizes[i])});
    at += kSizes[i];
  }
  const std::vector<uint32_t> before = daemon_->StateBits("nan.shm.0");
  grads[total - 1] = std::numeric_limits<float>::infinity();
  absl::Status status = shm_->Step(groups, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("not finite"), std::string::npos) << status;
  EXPECT_EQ(daemon_->StateBits("nan.shm.0"), before) << "nothing was sent";
}

// The copy into the region checks block by block: a bad value past the
// first block, or one that only overflows when narrowed, is still found and
// named, and nothing is sent.
TEST_F(SharedMemoryBufferTest, ANonFiniteGradientCopiedThroughTheRegionRefusesTheStep) {
  const uint64_t n = 5 * kPage + 3;
  std::vector<float> initial(n, 0.25f);
  ASSERT_TRUE(shm_->RegisterGroup("copied", initial).ok());
  const std::vector<uint32_t> before = daemon_->StateBits("copied");
  std::vector<float> params(n);
  for (WireType wire : {WireType::kFloat32, WireType::kBFloat16}) {
    for (uint64_t at : {uint64_t{16384 + 5}, n - 1}) {
      SCOPED_TRACE(::testing::Message() << WireTypeName(wire) << " at " << at);
      std::vector<float> grad(n, 1e-3f);
      // Finite as a float, infinite once narrowed to bf16.
      grad[at] = wire == WireType::kFloat32 ? std::numeric_limits<float>::quiet_NaN() : 3.4e38f;
      StepOptions options;
      options.gradient_dtype = wire;
      absl::Status status = shm_->Step("copied", 1, grad, absl::MakeSpan(params), options);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_NE(status.message().find(absl::StrCat("at element ", at, " ")), std::string::npos)
          << status;
    }
  }
  EXPECT_EQ(daemon_->StateBits("copied"), before) << "nothing was sent";
  // A finite gradient then steps normally.
  std::vector<float> grad(n, 1e-3f);
  ASSERT_TRUE(shm_->Step("copied", 1, grad, absl::MakeSpan(params)).ok());
  EXPECT_NE(daemon_->StateBits("copied"), before);
}

// A large step is checked on several threads, and the error still names the
// step's first bad element (group 1 here, though the part holding group 3
// may be checked first); a bad value in the last group alone is found too,
// and nothing is applied either way. Both paths: gradients and params in a
// buffer (the step goes as one message, which the daemon checks whole, in
// parts on its threads, before applying any of it) and gradients copied
// through the client's region (the client copies and checks more than 16
// MiB on several threads, one range of groups each, and sends nothing).
TEST_F(SharedMemoryBufferTest, ALargeStepCheckedOnSeveralThreadsNamesItsFirstBadElement) {
  constexpr uint64_t kGroups = 4, kElements = 3 << 20;  // 48 MiB of float32 gradients.
  std::vector<float> initial(kElements, 0.5f);
  for (uint64_t g = 0; g < kGroups; ++g) {
    ASSERT_TRUE(shm_->RegisterGroup(absl::StrCat("large.", g), initial).ok());
  }
  std::vector<std::vector<uint32_t>> before;
  for (uint64_t g = 0; g < kGroups; ++g) {
    before.push_back(daemon_->StateBits(absl::StrCat("large.", g)));
  }
  absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer =
      shm_->AllocateSharedBuffer(kGroups * kElements * 4);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float* const in_buffer = static_cast<float*>((*buffer)->data());
  std::vector<float> in_memory(kGroups * kElements);
  std::vector<float> params(kGroups * kElements);
  for (float* grads : {in_buffer, in_memory.data()}) {
    SCOPED_TRACE(grads == in_buffer ? "in a buffer" : "copied through the region");
    std::fill(grads, grads + kGroups * kElements, 1e-3f);
    std::vector<GroupStep> groups;
    for (uint64_t g = 0; g < kGroups; ++g) {
      groups.push_back({absl::StrCat("large.", g),
                        absl::MakeConstSpan(grads + g * kElements, kElements),
                        absl::MakeSpan(params.data() + g * kElements, kElements)});
    }
    grads[3 * kElements + 5] = std::numeric_limits<float>::quiet_NaN();
    absl::Status status = shm_->Step(groups, 1);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("group 'large.3' at element 5 "), std::string::npos) << status;
    grads[1 * kElements + 7] = std::numeric_limits<float>::infinity();
    status = shm_->Step(groups, 1);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("group 'large.1' at element 7 "), std::string::npos) << status;
    for (uint64_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(daemon_->StateBits(absl::StrCat("large.", g)), before[g]) << "nothing applied";
    }
  }
}

// Steps wholly in SharedBuffers go as a step plan (StepRequest.plan) once
// their chunks repeat: per-group hyperparameters that differ from group to
// group, a step of fewer groups, dtypes that change, and a group deleted
// are each what the wire does, bit for bit.
TEST_F(SharedMemoryBufferTest, StepPlansFollowChangingHyperparametersLayoutsAndGroups) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  RegisterTwins("plan");
  const uint64_t total = Total();
  absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer = shm_->AllocateSharedBuffer(8 * total);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float* grads = static_cast<float*>((*buffer)->data());
  float* params = grads + total;
  std::vector<float> wire_grads(total), wire_params(total);
  for (uint64_t t = 1; t <= 12; ++t) {
    StepOptions options;
    // 4-5: bf16 gradients (the buffer's floats narrowed: copied through
    // the region); 6: a schedule's lr for every group; 7: each group its
    // own lr; 8: one weight decay for all; from 9: all groups but the
    // first; 11: grad_scale.
    if (t == 4 || t == 5) options.gradient_dtype = WireType::kBFloat16;
    if (t == 6) options.lr = 2e-3;
    if (t == 11) options.grad_scale = 0.25f;
    std::vector<float> g = RandomNormal(rng_, total, 1e-2f);
    std::memcpy(grads, g.data(), total * 4);
    std::memcpy(wire_grads.data(), g.data(), total * 4);
    std::vector<GroupStep> through_wire, through_shm;
    uint64_t at = 0;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      const uint64_t n = kSizes[i];
      if (i > 0 || t < 9) {
        GroupStep w{absl::StrCat("plan.wire.", i), absl::MakeConstSpan(wire_grads.data() + at, n),
                    absl::MakeSpan(wire_params.data() + at, n)};
        GroupStep s{absl::StrCat("plan.shm.", i), absl::MakeConstSpan(grads + at, n),
                    absl::MakeSpan(params + at, n)};
        if (t == 7) w.lr = s.lr = 1e-3 * static_cast<double>(i + 1);
        if (t == 8) w.weight_decay = s.weight_decay = 0.05;
        through_wire.push_back(w);
        through_shm.push_back(s);
      }
      at += n;
    }
    ASSERT_TRUE(wire_->Step(through_wire, t, options).ok()) << t;
    absl::Status shared = shm_->Step(through_shm, t, options);
    ASSERT_TRUE(shared.ok()) << t << " " << shared;
    ASSERT_EQ(0, std::memcmp(wire_params.data(), params, total * 4)) << "step " << t;
  }
  ExpectSameState("plan");
  // Plans were defined and used: steps 2, 3, 6 and 10 to 12 repeat an
  // earlier step's chunks with per-step fields that are the plan's or one
  // value for all groups (4 and 5 copy through the region: no plan); 7 and
  // 8 redefine the plan of the three groups, 9 defines the two groups'.
  const RegionStats regions = Regions();
  EXPECT_EQ(regions.step_plans, 2u);
  EXPECT_EQ(regions.step_plan_uses, 6u);
  // A group deleted under the kept plan (groups 1 and 2 since step 9): the
  // step is refused NOT_FOUND, naming it, and nothing else is stepped.
  ASSERT_TRUE(wire_->DeleteGroup("plan.shm.1").ok());
  std::vector<GroupStep> through_shm;
  uint64_t at = kSizes[0];
  for (size_t i = 1; i < kSizes.size(); ++i) {
    through_shm.push_back({absl::StrCat("plan.shm.", i), absl::MakeConstSpan(grads + at, kSizes[i]),
                           absl::MakeSpan(params + at, kSizes[i])});
    at += kSizes[i];
  }
  absl::Status gone = shm_->Step(through_shm, 13, StepOptions());
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_NE(gone.message().find("plan.shm.1"), std::string::npos) << gone;
  absl::StatusOr<GroupInfo> last = shm_->DescribeGroup("plan.shm.2");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->max_step, 12u);
}

TEST_F(SharedMemoryBufferTest, ADestroyedBufferIsUnregisteredAtTheNextStep) {
  RegisterTwins("gone");
  absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer = shm_->AllocateSharedBuffer(1 << 20);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->bytes(), 1u << 20);
  EXPECT_EQ(Regions().registered_bytes, 1u << 20);
  buffer->reset();
  std::vector<float> g(kSizes[2], 1e-3f), p(kSizes[2]);
  ASSERT_TRUE(shm_->Step("gone.shm.2", 1, g, absl::MakeSpan(p)).ok());
  const RegionStats regions = Regions();
  EXPECT_EQ(regions.regions, 1u) << "only the client's own region";
  EXPECT_EQ(regions.mapped_bytes, regions.registered_bytes);
  EXPECT_EQ(regions.registrations, 2u);
}

TEST_F(SharedMemoryBufferTest, AWireClientGetsNoBuffer) {
  absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer = wire_->AllocateSharedBuffer(4096);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kFailedPrecondition) << buffer.status();
  EXPECT_EQ(shm_->AllocateSharedBuffer(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace optstate
