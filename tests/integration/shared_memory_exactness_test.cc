// The same steps through shared memory and through the wire give
// bit-identical params, m and v: an in-process daemon, two clients (one per
// data plane), twin groups, and the store's arrays compared bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optstate/client.h"
#include "tests/testing/in_process_daemon.h"
#include "tests/testing/random_tensors.h"

namespace optstate {
namespace {

using ::optstate::testing::FreshSeed;
using ::optstate::testing::GroupModel;
using ::optstate::testing::RandomNormal;

constexpr uint64_t kPage = 4096;

class SharedMemoryExactnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = ::optstate::testing::InProcessDaemon::Start(2, kPage);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    const std::string target = daemon_->target();
    ClientOptions wire;
    wire.data_plane = DataPlane::kWire;
    ClientOptions shared;
    shared.data_plane = DataPlane::kSharedMemory;
    auto a = Client::Connect(target, wire);
    auto b = Client::Connect(target, shared);
    ASSERT_TRUE(a.ok() && b.ok());
    wire_ = std::move(*a);
    shm_ = std::move(*b);
    seed_ = FreshSeed();
    rng_.seed(seed_);
  }

  std::vector<uint32_t> StateBits(const std::string& name) { return daemon_->StateBits(name); }

  // Registers `sizes` groups twice ("wire.i", "shm.i"), steps both through
  // `steps` steps with the same gradients, and compares replies and state.
  void StepTwins(const std::string& tag, const std::vector<uint64_t>& sizes, WireType gradient_type,
                 WireType param_type, bool sixteen_bit_buffers, int steps) {
    SCOPED_TRACE(::testing::Message() << tag << " seed " << seed_);
    const size_t n = sizes.size();
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
      StepOptions options;
      options.gradient_dtype = gradient_type;
      options.param_dtype = param_type;
      if (t == 2) options.grad_scale = 0.5f;
      if (t == 3) options.lr = 3e-3;
      if (t == 4) options.grad_scale = 4.0f;  // Checked finite after scaling.
      std::vector<GroupStep> through_wire, through_shm;
      for (size_t i = 0; i < n; ++i) {
        grads[i] = RandomNormal(rng_, sizes[i], 1e-2f);
        GroupStep w{absl::StrCat(tag, ".wire.", i), grads[i], absl::MakeSpan(out_wire[i])};
        GroupStep s{absl::StrCat(tag, ".shm.", i), grads[i], absl::MakeSpan(out_shm[i])};
        if (t == 5) w.lr = s.lr = 1e-3 * static_cast<double>(i + 2);  // Each group its own.
        if (sixteen_bit_buffers) {
          grads16[i].resize(sizes[i]);
          EncodeFromFloat(gradient_type, grads[i].data(), grads16[i].data(), sizes[i]);
          w.gradient = s.gradient = ConstBufferView::Of16Bit(grads16[i], gradient_type);
          w.params_out = BufferView::Of16Bit(absl::MakeSpan(out16_wire[i]), param_type);
          s.params_out = BufferView::Of16Bit(absl::MakeSpan(out16_shm[i]), param_type);
        }
        through_wire.push_back(w);
        through_shm.push_back(s);
      }
      ASSERT_TRUE(wire_->Step(through_wire, t, options).ok()) << t;
      absl::Status shared = shm_->Step(through_shm, t, options);
      ASSERT_TRUE(shared.ok()) << t << " " << shared;
      for (size_t i = 0; i < n; ++i) {
        if (sixteen_bit_buffers) {
          ASSERT_EQ(out16_wire[i], out16_shm[i]) << "group " << i << " step " << t;
        } else {
          ASSERT_EQ(0, std::memcmp(out_wire[i].data(), out_shm[i].data(), sizes[i] * 4))
              << "group " << i << " step " << t;
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(StateBits(absl::StrCat(tag, ".wire.", i)), StateBits(absl::StrCat(tag, ".shm.", i)))
          << "params, m and v of group " << i;
    }
  }

  uint32_t seed_;
  std::mt19937 rng_;
  std::unique_ptr<::optstate::testing::InProcessDaemon> daemon_;
  std::unique_ptr<Client> wire_;
  std::unique_ptr<Client> shm_;
};

// Several pages, a short last page, and a group smaller than a page.
const std::vector<uint64_t> kMixed = {3 * kPage + 123, 2 * kPage, 77};

TEST_F(SharedMemoryExactnessTest, Float32GradientsAndFloatBuffersAreBitIdentical) {
  StepTwins("f32", kMixed, WireType::kFloat32, WireType::kFloat32, false, 5);
}

TEST_F(SharedMemoryExactnessTest, BFloat16GradientsFromFloatBuffersAreBitIdentical) {
  StepTwins("bf16", kMixed, WireType::kBFloat16, WireType::kFloat32, false, 4);
}

TEST_F(SharedMemoryExactnessTest, Float16GradientsFromFloatBuffersAreBitIdentical) {
  StepTwins("f16", kMixed, WireType::kFloat16, WireType::kFloat16, false, 4);
}

TEST_F(SharedMemoryExactnessTest, SixteenBitCallerBuffersAreBitIdentical) {
  StepTwins("bf16buf", kMixed, WireType::kBFloat16, WireType::kBFloat16, true, 4);
  StepTwins("f16buf", kMixed, WireType::kFloat16, WireType::kFloat16, true, 3);
}

TEST_F(SharedMemoryExactnessTest, ThreeHundredPackedSmallGroupsInOneStreamAreBitIdentical) {
  std::vector<uint64_t> sizes(300);
  for (size_t i = 0; i < sizes.size(); ++i) sizes[i] = 64 + (i * 37) % 900;
  StepTwins("packed", sizes, WireType::kFloat32, WireType::kFloat32, false, 3);
}

// A step that copies 32 MiB or more through the region streams its plain
// copies (CopyStreaming) and checks the caller's own buffers: the same bits
// as the wire, odd sizes and a grad_scale above 1 (step 4) included.
const std::vector<uint64_t> kStreamed = {5 * 1024 * 1024 + 123, 3 * 1024 * 1024 + 77};

TEST_F(SharedMemoryExactnessTest, AStepLargeEnoughToStreamItsCopiesIsBitIdentical) {
  StepTwins("streamed", kStreamed, WireType::kFloat32, WireType::kFloat32, false, 4);
}

TEST_F(SharedMemoryExactnessTest, SixteenBitBuffersOfAStepLargeEnoughToStreamAreBitIdentical) {
  StepTwins("streamed16", {9 * 1024 * 1024 + 5, 8 * 1024 * 1024}, WireType::kBFloat16,
            WireType::kBFloat16, true, 2);
}

// In such a step a gradient that is not finite, anywhere in any group, is
// still found before anything is sent: the step is refused and no group's
// state moves.
TEST_F(SharedMemoryExactnessTest, ANonFiniteGradientInAStreamedStepRefusesItWhole) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  std::vector<std::vector<float>> grads, out;
  std::vector<std::string> names;
  for (size_t i = 0; i < kStreamed.size(); ++i) {
    names.push_back(absl::StrCat("refused.", i));
    ASSERT_TRUE(shm_->RegisterGroup(names[i], RandomNormal(rng_, kStreamed[i], 1.0f)).ok());
    grads.push_back(RandomNormal(rng_, kStreamed[i], 1e-2f));
    out.emplace_back(kStreamed[i]);
  }
  auto step = [&](uint64_t t) {
    std::vector<GroupStep> groups;
    for (size_t i = 0; i < names.size(); ++i) {
      groups.push_back({names[i], grads[i], absl::MakeSpan(out[i])});
    }
    return shm_->Step(groups, t);
  };
  ASSERT_TRUE(step(1).ok());
  const std::vector<uint32_t> before0 = StateBits(names[0]), before1 = StateBits(names[1]);
  for (auto [group, at] : {std::pair<size_t, size_t>{1, kStreamed[1] - 1}, {0, 0}, {1, 4096}}) {
    const float kept = grads[group][at];
    grads[group][at] = group == 0 ? INFINITY : NAN;
    absl::Status refused = step(2);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_EQ(StateBits(names[0]), before0) << "group " << group << " element " << at;
    EXPECT_EQ(StateBits(names[1]), before1) << "group " << group << " element " << at;
    grads[group][at] = kept;
  }
  EXPECT_TRUE(step(2).ok());
}

TEST_F(SharedMemoryExactnessTest, SharedMemoryMatchesTheReference) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const uint64_t n = 2 * kPage + 5;
  std::vector<float> initial = RandomNormal(rng_, n, 1.0f);
  ASSERT_TRUE(shm_->RegisterGroup("ref", initial).ok());
  GroupModel model(initial, Hyperparameters{});
  std::vector<float> params(n);
  for (uint64_t t = 1; t <= 3; ++t) {
    std::vector<float> grad = RandomNormal(rng_, n, 1e-2f);
    ASSERT_TRUE(shm_->Step("ref", t, grad, absl::MakeSpan(params)).ok());
    model.Step(t, grad);
  }
  EXPECT_EQ(params, model.params_fp32());
  for (uint64_t i = 0; i < n; ++i) EXPECT_NEAR(params[i], model.params_f64()[i], 1e-5) << i;
}

}  // namespace
}  // namespace optstate
