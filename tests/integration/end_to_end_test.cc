// A real optstated process stepped through the client: results against the
// float64 reference and the project's scalar fp32 kernel.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "optstate/client.h"
#include "server/kernels/adamw_kernel.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"

namespace optstate::testing {
namespace {

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start({"--threads=2"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    // The wire data plane: these tests count its chunks and bytes
    // (shared_memory_test.cc steps the same through shared memory).
    ClientOptions options;
    options.data_plane = DataPlane::kWire;
    auto client = Client::Connect(daemon_->target(), options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ == nullptr) return;
    absl::StatusOr<int> exit_code = daemon_->Stop();
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 0) << "optstated must exit 0 on SIGTERM";
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

// Four pages of 256 Ki elements and a partial fifth.
constexpr size_t kElements = 4 * 262144 + 1000;

TEST_F(EndToEndTest, FiftyStepsMatchFloat64AndScalarFp32References) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Hyperparameters h;
  h.lr = 2e-3;
  h.weight_decay = 0.05;
  std::vector<float> initial = RandomNormal(rng, kElements, 1.0f);
  ASSERT_TRUE(client_->RegisterGroup("model.w", initial, h).ok());
  GroupModel model(initial, h);
  std::vector<float> params(kElements);
  for (uint64_t t = 1; t <= 50; ++t) {
    std::vector<float> grad = RandomNormal(rng, kElements, 1e-2f);
    ASSERT_TRUE(client_->Step("model.w", t, grad, absl::MakeSpan(params)).ok()) << t;
    model.Step(t, grad);
  }
  const double rel64 = RelativeL2Error(params, model.params_f64());
  const double max64 = MaxAbsError(params, model.params_f64());
  const double rel32 = RelativeL2Error(params, model.params_fp32());
  std::cout << "50 steps: rel vs float64 " << rel64 << ", max abs " << max64
            << ", rel vs scalar fp32 " << rel32 << "\n";
  EXPECT_LE(rel64, 1e-5);
  EXPECT_LE(max64, 1e-4);
  // The kernel is torch's step bit for bit (tests/torch), and the daemon's
  // params are the kernel's, bit for bit, after fifty steps over the wire.
  EXPECT_EQ(rel32, 0.0);
  EXPECT_TRUE(params == model.params_fp32());
}

TEST_F(EndToEndTest, Bfloat16WireCarriesRoundedGradientsAndParams) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> initial = RandomNormal(rng, kElements, 1.0f);
  ASSERT_TRUE(client_->RegisterGroup("bf16.w", initial).ok());
  GroupModel model(initial, {});
  StepOptions options;
  options.gradient_dtype = WireType::kBFloat16;
  options.param_dtype = WireType::kBFloat16;
  std::vector<float> params(kElements);
  for (uint64_t t = 1; t <= 5; ++t) {
    std::vector<float> grad = RandomNormal(rng, kElements, 1e-2f);
    ASSERT_TRUE(client_->Step("bf16.w", t, grad, absl::MakeSpan(params), options).ok());
    for (float& g : grad) g = BFloat16ToFloat(FloatToBFloat16(g));  // What the server saw.
    model.Step(t, grad);
  }
  // The server's fp32 params equal the scalar model bit for bit, so the bf16
  // reply must be exactly their round-to-nearest-even.
  size_t mismatches = 0;
  for (size_t i = 0; i < kElements; ++i) {
    mismatches += params[i] != BFloat16ToFloat(FloatToBFloat16(model.params_fp32()[i]));
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_LE(RelativeL2Error(model.params_fp32(), model.params_f64()), 1e-6);
}

// A model held in bf16 passes its own tensors (16-bit buffer views):
// sent and filled bit for bit, the same step as float buffers on a bf16 wire.
// Many small groups and one of several pages, so chunks are packed too.
TEST_F(EndToEndTest, SixteenBitBuffersAreSentAndFilledAsTheyAre) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<size_t> sizes = {kElements, 4096, 1, 70000, 300, 65536};
  std::vector<std::string> names;
  std::vector<GroupModel> models;
  for (size_t g = 0; g < sizes.size(); ++g) {
    names.push_back("native." + std::to_string(g));
    std::vector<float> initial = RandomNormal(rng, sizes[g], 1.0f);
    ASSERT_TRUE(client_->RegisterGroup(names[g], initial).ok());
    models.emplace_back(initial, Hyperparameters{});
  }
  for (WireType params_type : {WireType::kBFloat16, WireType::kFloat16}) {
    SCOPED_TRACE(std::string(WireTypeName(params_type)));
    StepOptions options;
    options.gradient_dtype = WireType::kBFloat16;
    options.param_dtype = params_type;
    const uint64_t first = params_type == WireType::kBFloat16 ? 1 : 4;
    for (uint64_t t = first; t < first + 3; ++t) {
      std::vector<std::vector<uint16_t>> grads(sizes.size()), params(sizes.size());
      std::vector<GroupStep> steps;
      for (size_t g = 0; g < sizes.size(); ++g) {
        for (float x : RandomNormal(rng, sizes[g], 1e-2f)) grads[g].push_back(FloatToBFloat16(x));
        params[g].assign(sizes[g], 0xffff);
        GroupStep step;
        step.group = names[g];
        step.gradient = ConstBufferView::Of16Bit(grads[g], WireType::kBFloat16);
        step.params_out = BufferView::Of16Bit(absl::MakeSpan(params[g]), params_type);
        steps.push_back(step);
      }
      ASSERT_TRUE(client_->Step(steps, t, options).ok()) << t;
      for (size_t g = 0; g < sizes.size(); ++g) {
        std::vector<float> seen(sizes[g]);
        for (size_t i = 0; i < sizes[g]; ++i) seen[i] = BFloat16ToFloat(grads[g][i]);
        models[g].Step(t, seen);
        size_t mismatches = 0;
        for (size_t i = 0; i < sizes[g]; ++i) {
          const float p = models[g].params_fp32()[i];
          mismatches += params[g][i] !=
                        (params_type == WireType::kBFloat16 ? FloatToBFloat16(p) : FloatToHalf(p));
        }
        ASSERT_EQ(mismatches, 0u) << "step " << t << " group " << g;
      }
    }
  }
  EXPECT_LE(RelativeL2Error(models[0].params_fp32(), models[0].params_f64()), 1e-6);
}

TEST_F(EndToEndTest, SixteenBitBuffersThatDoNotFitTheWireTypesAreRefusedBeforeSending) {
  ASSERT_TRUE(client_->RegisterGroup("forms", std::vector<float>(100, 1.0f)).ok());
  std::vector<uint16_t> g16(100, FloatToBFloat16(0.1f)), p16(100);
  std::vector<float> g32(100, 0.1f), p32(100);
  StepOptions bf16;
  bf16.gradient_dtype = WireType::kBFloat16;
  bf16.param_dtype = WireType::kBFloat16;
  struct Case {
    const char* what;
    GroupStep step;
    StepOptions options;
    const char* says;
  };
  const ConstBufferView bg16 = ConstBufferView::Of16Bit(g16, WireType::kBFloat16);
  const BufferView bp16 = BufferView::Of16Bit(absl::MakeSpan(p16), WireType::kBFloat16);
  // A buffer made by Of16Bit with a type that is not 16-bit.
  const ConstBufferView g16_as_float32 = ConstBufferView::Of16Bit(g16, WireType::kFloat32);
  const BufferView p16_as_float32 = BufferView::Of16Bit(absl::MakeSpan(p16), WireType::kFloat32);
  StepOptions fp16 = bf16;
  fp16.gradient_dtype = WireType::kFloat16;
  fp16.param_dtype = WireType::kFloat16;
  const Case cases[] = {
      {"a bfloat16 gradient on a float32 wire",
       {"forms", bg16, {}},
       StepOptions{},
       "gradient_dtype bfloat16 (it is float32)"},
      {"a bfloat16 gradient on a float16 wire",
       {"forms", bg16, {}},
       fp16,
       "gradient_dtype bfloat16 (it is float16)"},
      {"a bfloat16 params_out with float32 params",
       {"forms", g32, bp16},
       StepOptions{},
       "param_dtype bfloat16 (it is float32)"},
      {"a bfloat16 params_out with float16 params",
       {"forms", g32, bp16},
       fp16,
       "param_dtype bfloat16 (it is float16)"},
      {"Of16Bit gradient of float32",
       {"forms", g16_as_float32, {}},
       bf16,
       "not bfloat16 or float16"},
      {"Of16Bit params_out of float32",
       {"forms", bg16, p16_as_float32},
       bf16,
       "not bfloat16 or float16"},
      {"16-bit gradient of another length",
       {"forms",
        ConstBufferView::Of16Bit(absl::MakeConstSpan(g16).subspan(1), WireType::kBFloat16),
        {}},
       bf16,
       "gradient of group 'forms' has 99 elements"},
      {"16-bit params_out of another length",
       {"forms", bg16, BufferView::Of16Bit(absl::MakeSpan(p16).subspan(1), WireType::kBFloat16)},
       bf16,
       "params_out of group 'forms' has 99 elements"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::Status s = client_->Step(absl::MakeConstSpan(&c.step, 1), 1, c.options);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(c.says));
  }
  // A non-finite bf16 element: named, nothing sent; after grad_scale too.
  g16[42] = 0x7f80;  // +infinity.
  absl::Status s = client_->Step({{"forms", bg16, {}}}, 1, bf16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("at element 42 is inf"));
  g16[42] = FloatToBFloat16(3e38f);
  StepOptions scaled = bf16;
  scaled.grad_scale = 4.0f;
  s = client_->Step({{"forms", bg16, {}}}, 1, scaled);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("at element 42"));
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("forms");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->max_step, 0u);
  g16[42] = FloatToBFloat16(0.1f);
  EXPECT_TRUE(client_->Step({{"forms", bg16, bp16}}, 1, bf16).ok());
  EXPECT_NE(p16[0], 0);
}

TEST_F(EndToEndTest, Float16GradientsAreWidenedExactly) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> initial = RandomNormal(rng, 70000, 1.0f);
  ASSERT_TRUE(client_->RegisterGroup("fp16.w", initial).ok());
  GroupModel model(initial, {});
  StepOptions options;
  options.gradient_dtype = WireType::kFloat16;
  std::vector<float> params(initial.size());
  for (uint64_t t = 1; t <= 5; ++t) {
    std::vector<float> grad = RandomNormal(rng, initial.size(), 1e-2f);
    ASSERT_TRUE(client_->Step("fp16.w", t, grad, absl::MakeSpan(params), options).ok());
    for (float& g : grad) g = HalfToFloat(FloatToHalf(g));
    model.Step(t, grad);
  }
  EXPECT_EQ(params, model.params_fp32());
  EXPECT_LE(RelativeL2Error(params, model.params_f64()), 1e-6);
}

TEST_F(EndToEndTest, PerStepLearningRateAndGradScaleAreApplied) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> initial = RandomNormal(rng, 300000, 1.0f);
  ASSERT_TRUE(client_->RegisterGroup("sched.w", initial).ok());
  GroupModel model(initial, {});
  std::vector<float> params(initial.size());
  for (uint64_t t = 1; t <= 10; ++t) {
    std::vector<float> grad = RandomNormal(rng, initial.size(), 1.0f);
    StepOptions options;
    options.lr = 1e-3 * static_cast<double>(t) / 10.0;  // A warm-up schedule.
    options.grad_scale = 1.0f / 1024.0f;                // Loss-scale unscaling.
    ASSERT_TRUE(client_->Step("sched.w", t, grad, absl::MakeSpan(params), options).ok());
    model.Step(t, grad, *options.grad_scale, *options.lr);
  }
  EXPECT_EQ(params, model.params_fp32());
  EXPECT_LE(RelativeL2Error(params, model.params_f64()), 1e-5);
  EXPECT_LE(MaxAbsError(params, model.params_f64()), 1e-4);
}

TEST_F(EndToEndTest, EachGroupOfOneStepTakesItsOwnLearningRate) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> init_a = RandomNormal(rng, 70000, 1.0f);
  std::vector<float> init_b = RandomNormal(rng, 300000, 1.0f);
  ASSERT_TRUE(client_->RegisterGroup("lr.a", init_a).ok());
  ASSERT_TRUE(client_->RegisterGroup("lr.b", init_b).ok());
  GroupModel model_a(init_a, {}), model_b(init_b, {});
  std::vector<float> params_a(init_a.size()), params_b(init_b.size());
  for (uint64_t t = 1; t <= 5; ++t) {
    std::vector<float> grad_a = RandomNormal(rng, init_a.size(), 1.0f);
    std::vector<float> grad_b = RandomNormal(rng, init_b.size(), 1.0f);
    const double lr_a = 1e-3 * static_cast<double>(t);  // Two schedules in one step.
    const double lr_b = 5e-2 / static_cast<double>(t);
    std::vector<GroupStep> groups = {
        {"lr.a", grad_a, absl::MakeSpan(params_a), lr_a},
        {"lr.b", grad_b, absl::MakeSpan(params_b), lr_b},
    };
    StepOptions options;
    options.lr = 0.5;  // Overridden by each group's own.
    ASSERT_TRUE(client_->Step(groups, t, options).ok());
    model_a.Step(t, grad_a, 1.0f, lr_a);
    model_b.Step(t, grad_b, 1.0f, lr_b);
  }
  EXPECT_EQ(params_a, model_a.params_fp32());
  EXPECT_EQ(params_b, model_b.params_fp32());
  const std::vector<float> zeros(init_a.size(), 0.0f);
  std::vector<GroupStep> bad = {{"lr.a", zeros, {}, -1.0}};
  absl::Status refused = client_->Step(bad, 6);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("lr of group 'lr.a'"));
  // Each per-step hyperparameter is checked before anything is sent, as the
  // daemon checks it: a step of several messages refused at a later one had
  // applied the earlier ones.
  GroupStep eps_zero{"lr.b", zeros, {}};
  eps_zero.eps = 0.0;
  GroupStep beta_one{"lr.b", zeros, {}};
  beta_one.beta2 = 1.0;
  GroupStep decay_negative{"lr.b", zeros, {}};
  decay_negative.weight_decay = -0.1;
  GroupStep lr_too_large{"lr.b", zeros, {}, 1e39};
  for (const auto& [group, words] :
       {std::pair{eps_zero, "group 'lr.b': this step's eps must be finite and > 0"},
        {beta_one, "group 'lr.b': this step's beta2 must be in [0, 1), got 1"},
        {decay_negative, "group 'lr.b': this step's weight_decay must be finite and >= 0"},
        {lr_too_large, "lr of group 'lr.b' must be finite and >= 0 (and within float32's"}}) {
    std::vector<GroupStep> step = {{"lr.a", zeros, {}}, group};
    refused = client_->Step(step, 6);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr(words));
  }
  absl::StatusOr<GroupInfo> untouched = client_->DescribeGroup("lr.a");
  ASSERT_TRUE(untouched.ok());
  EXPECT_EQ(untouched->max_step, 5u);
}

TEST_F(EndToEndTest, StatsReportStepsChunksAndBytes) {
  std::vector<float> initial(kElements, 0.5f);
  ASSERT_TRUE(client_->RegisterGroup("stats.w", initial).ok());
  std::vector<float> grad(kElements, 0.01f), params(kElements);
  for (uint64_t t = 1; t <= 3; ++t) {
    ASSERT_TRUE(client_->Step("stats.w", t, grad, absl::MakeSpan(params)).ok());
  }
  absl::StatusOr<Stats> stats = client_->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->backend, "cpu");
  ASSERT_EQ(stats->groups.size(), 1u);
  const GroupStats& g = stats->groups[0];
  EXPECT_EQ(g.info.num_elements, kElements);
  EXPECT_EQ(g.info.min_step, 3u);
  EXPECT_EQ(g.info.max_step, 3u);
  EXPECT_EQ(g.steps_completed, 3u);
  EXPECT_EQ(g.chunks_applied, 3u * 5u);  // Five pages, one chunk each, per step.
  EXPECT_EQ(g.info.host_bytes, kElements * 12);
  // Received: initial values once, then three fp32 gradients; sent: three replies.
  EXPECT_EQ(g.bytes_received, kElements * 4 * 4);
  EXPECT_EQ(g.bytes_sent, kElements * 4 * 3);
  EXPECT_EQ(g.step_latency.samples, 3u);
  EXPECT_GT(g.step_latency.p50_us, 0.0);
  EXPECT_GE(g.step_latency.p99_us, g.step_latency.p50_us);
  EXPECT_EQ(g.chunk_latency.samples, 15u);
  EXPECT_EQ(stats->paging.page_ins, 0u);
  EXPECT_EQ(stats->paging.bytes_host_to_device, 0u);
}

TEST_F(EndToEndTest, DeletedGroupFreesMemoryAndLaterStepsAreNotFound) {
  std::vector<float> initial(1000, 1.0f), grad(1000, 0.1f), params(1000);
  ASSERT_TRUE(client_->RegisterGroup("gone", initial).ok());
  ASSERT_TRUE(client_->Step("gone", 1, grad, absl::MakeSpan(params)).ok());
  ASSERT_TRUE(client_->DeleteGroup("gone").ok());
  absl::StatusOr<Stats> stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->host_bytes, 0u);
  EXPECT_EQ(stats->num_groups, 0u);
  absl::Status s = client_->Step("gone", 2, grad, absl::MakeSpan(params));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

TEST_F(EndToEndTest, AGroupListedTwiceInOneStepIsRefusedBeforeSending) {
  ASSERT_TRUE(client_->RegisterGroup("twice", std::vector<float>(100, 1.0f)).ok());
  std::vector<float> g1(100, 0.1f), g2(100, 0.2f), out1(100), out2(100);
  std::vector<GroupStep> step = {{"twice", g1, absl::MakeSpan(out1)},
                                 {"twice", g2, absl::MakeSpan(out2)}};
  absl::Status s = client_->Step(step, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("twice");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->max_step, 0u);
}

TEST_F(EndToEndTest, GradientsNotFiniteOnTheWireAreRefusedBeforeSending) {
  constexpr size_t kN = 10000;
  constexpr size_t kBad = 9001;  // Past the first 4096-element block.
  ASSERT_TRUE(client_->RegisterGroup("finite", std::vector<float>(kN, 1.0f)).ok());
  struct Case {
    const char* what;
    WireType dtype;
    float bad_value;
    float grad_scale;
    bool refused;
  };
  const float big = 3.3e38f;  // Finite as bfloat16 (largest: 3.3895e38).
  const Case cases[] = {
      {"fp32 NaN", WireType::kFloat32, std::nanf(""), 1.0f, true},
      {"fp32 overflowing after grad_scale", WireType::kFloat32, 1e38f, 8.0f, true},
      {"largest float rounds to bf16 infinity", WireType::kBFloat16, 3.4e38f, 1.0f, true},
      {"bf16 NaN", WireType::kBFloat16, -std::nanf(""), 0.5f, true},
      {"finite bf16, grad_scale <= 1", WireType::kBFloat16, big, 0.5f, false},
      {"finite bf16 overflowing after grad_scale", WireType::kBFloat16, big, 2.0f, true},
      {"65520 rounds to fp16 infinity", WireType::kFloat16, -65520.0f, 1.0f, true},
      {"largest fp16", WireType::kFloat16, 65504.0f, 1.0f, false},
  };
  std::vector<float> params(kN);
  uint64_t step = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<float> grad(kN, 0.01f);
    grad[kBad] = c.bad_value;
    StepOptions options;
    options.gradient_dtype = c.dtype;
    options.grad_scale = c.grad_scale;
    absl::Status s = client_->Step("finite", step, grad, absl::MakeSpan(params), options);
    absl::StatusOr<GroupInfo> info = client_->DescribeGroup("finite");
    ASSERT_TRUE(info.ok());
    if (c.refused) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("at element 9001"));
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("nothing was sent"));
      EXPECT_EQ(info->max_step, step - 1) << "nothing may be sent";
    } else {
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(info->max_step, step);
      ++step;
    }
  }
}

TEST_F(EndToEndTest, ABadGradientPastWhatTheClientNarrowsAheadIsStillRefusedBeforeSending) {
  // 65 MiB of fp32 gradient: more than the client narrows ahead (64 MiB).
  constexpr size_t kN = (65u << 20) / 4;
  ASSERT_TRUE(client_->RegisterGroup("large", kN).ok());
  std::vector<float> grad(kN, 0.01f), params(kN);
  grad[kN - 3] = std::numeric_limits<float>::infinity();
  absl::Status s = client_->Step("large", 1, grad, absl::MakeSpan(params));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(absl::StrCat("at element ", kN - 3)));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("nothing was sent"));
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("large");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->max_step, 0u);
  grad[kN - 3] = 0.01f;
  EXPECT_TRUE(client_->Step("large", 1, grad, absl::MakeSpan(params)).ok());
}

TEST_F(EndToEndTest, AGroupRegisteredAnewElsewhereIsSteppedWithItsNewLayout) {
  std::vector<float> grad(100, 0.1f), params(100);
  ASSERT_TRUE(client_->RegisterGroup("reused", std::vector<float>(100, 1.0f)).ok());
  ASSERT_TRUE(client_->Step("reused", 1, grad, absl::MakeSpan(params)).ok());
  auto other = Client::Connect(daemon_->target());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->DeleteGroup("reused").ok());
  ASSERT_TRUE((*other)->RegisterGroup("reused", std::vector<float>(300, 1.0f)).ok());
  std::vector<float> grad300(300, 0.1f), params300(300);
  absl::Status s = client_->Step("reused", 1, grad300, absl::MakeSpan(params300));
  EXPECT_TRUE(s.ok()) << s;
}

// A layout cached before the group was registered anew with more pages
// would cover only part of it; the daemon refuses such a step (it carries the
// size it was planned for), and the next one looks the layout up again.
TEST_F(EndToEndTest, AStepPlannedForAGroupsOldSizeIsRefusedWithoutSteppingPartOfIt) {
  constexpr size_t kPage = 262144;
  std::vector<float> grad(kPage, 0.1f), params(kPage);
  ASSERT_TRUE(client_->RegisterGroup("grown", kPage).ok());
  ASSERT_TRUE(client_->Step("grown", 1, grad, absl::MakeSpan(params)).ok());
  auto other = Client::Connect(daemon_->target());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->DeleteGroup("grown").ok());
  ASSERT_TRUE((*other)->RegisterGroup("grown", 2 * kPage).ok());
  absl::Status s = client_->Step("grown", 1, grad, absl::MakeSpan(params));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("registered anew"), std::string::npos) << s;
  absl::StatusOr<GroupInfo> info = (*other)->DescribeGroup("grown");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->max_step, 0u) << "no page of the new group may have been stepped";
  s = client_->Step("grown", 1, grad, absl::MakeSpan(params));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the group has 524288"), std::string::npos) << s;
}

// Many small tensors packed up to the least message limit both ends accept:
// the daemon's bound on the reply must not refuse what the client packed.
TEST(MessageLimitTest, MessagesPackedUpToTheLeastLimitAreAccepted) {
  constexpr int kLimit = (1 << 20) + 4096;
  auto daemon = DaemonProcess::Start({"--max_message_bytes=" + std::to_string(kLimit)});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.max_message_bytes = kLimit;
  auto client = Client::Connect((*daemon)->target(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kGroups = 255;
  std::vector<std::vector<float>> grads, params;
  std::vector<GroupStep> steps;
  for (int g = 0; g < kGroups; ++g) {
    const std::string name = "small." + std::to_string(g);
    ASSERT_TRUE((*client)->RegisterGroup(name, 1000).ok());
    grads.emplace_back(1000, 0.01f);
    params.emplace_back(1000);
  }
  for (int g = 0; g < kGroups; ++g) {
    steps.push_back({"small." + std::to_string(g), grads[g], absl::MakeSpan(params[g])});
  }
  absl::Status s = (*client)->Step(steps, 1);
  EXPECT_TRUE(s.ok()) << s;
  absl::StatusOr<GroupInfo> last = (*client)->DescribeGroup("small.254");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->max_step, 1u);
}

// Runs a shell command, returning its exit code and combined output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pipe == nullptr ? -1 : pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(DaemonFlagsTest, BackendCudaWithoutAUsableDeviceExitsNonZeroSayingWhy) {
  // `timeout` ends a daemon that did start (a host with a GPU): then it must
  // have said it runs the cuda backend.
  auto [code, output] = RunCommand(std::string("timeout -s TERM 3 ") + OPTSTATED_PATH +
                                   " --backend=cuda --listen=127.0.0.1:0");
  if (output.find("backend: cuda") != std::string::npos) {
    EXPECT_EQ(code, 0) << output;
  } else {
    EXPECT_EQ(code, 1) << output;
    EXPECT_NE(output.find("FAILED_PRECONDITION: --backend=cuda"), std::string::npos) << output;
    EXPECT_NE(output.find("use --backend=cpu"), std::string::npos) << output;
  }
}

TEST(DaemonFlagsTest, UnknownBackendAndLogLevelAreRefused) {
  auto [code, output] =
      RunCommand(std::string(OPTSTATED_PATH) + " --backend=tpu --listen=127.0.0.1:0");
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find("--backend must be auto, cpu or cuda"), std::string::npos) << output;
  std::tie(code, output) = RunCommand(std::string(OPTSTATED_PATH) + " --log_level=loud");
  EXPECT_EQ(code, 2) << output;
  EXPECT_NE(output.find("--log_level must be"), std::string::npos) << output;
}

// --cpu_kernel names a path this CPU runs, and GetStats reports the one in
// use; a path it lacks, or another word, keeps the daemon from starting.
TEST(DaemonFlagsTest, CpuKernelIsChosenByFlagAndReportedByGetStats) {
  for (KernelIsa isa : SupportedKernelIsas()) {
    SCOPED_TRACE(KernelIsaName(isa));
    auto daemon = DaemonProcess::Start({std::string("--cpu_kernel=") + KernelIsaName(isa)});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = Client::Connect((*daemon)->target());
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<Stats> stats = (*client)->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->cpu_kernel, KernelIsaName(isa));
  }
  auto daemon = DaemonProcess::Start({"--cpu_kernel=auto"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<Stats> stats = (*client)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->cpu_kernel, KernelIsaName(CpuKernelIsa()));

  auto [code, output] =
      RunCommand(std::string(OPTSTATED_PATH) + " --cpu_kernel=sse --listen=127.0.0.1:0");
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find("--cpu_kernel must be auto, avx512, avx2 or scalar, got 'sse'"),
            std::string::npos)
      << output;
  if (CpuKernelIsa() < KernelIsa::kAvx512) {
    std::tie(code, output) =
        RunCommand(std::string(OPTSTATED_PATH) + " --cpu_kernel=avx512 --listen=127.0.0.1:0");
    EXPECT_EQ(code, 1) << output;
    EXPECT_NE(output.find(std::string("this CPU runs at most ") + KernelIsaName(CpuKernelIsa())),
              std::string::npos)
        << output;
  }
}

TEST(DaemonFlagsTest, HelpDocumentsEveryFlag) {
  auto [code, output] = RunCommand(std::string(OPTSTATED_PATH) + " --help");
  for (const char* flag : {"--listen", "--backend", "--cpu_kernel", "--threads", "--max_host_bytes",
                           "--max_message_bytes", "--log_level", "--paging",
                           "--vram_reserved_bytes", "--vram_target_utilization",
                           "--vram_total_bytes", "--staging_slots", "--staging_slot_bytes"}) {
    EXPECT_NE(output.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace optstate::testing
