// Exactly once: a step broken off part-way and retried applies every element
// once; a resent step changes nothing; a step that skips ahead is refused.
#include <gtest/gtest.h>

#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/cutting_proxy.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"

namespace optstate::testing {
namespace {

constexpr size_t kPage = 262144;
constexpr size_t kElements = 4 * kPage + 321;  // Five pages.

class ExactlyOnceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    ClientOptions options;
    options.initial_backoff = absl::Milliseconds(1);
    // The wire data plane: these tests cut its bytes (shared_memory_test.cc
    // has the shared-memory ones).
    options.data_plane = DataPlane::kWire;
    auto client = Client::Connect(daemon_->target(), options);
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    stub_ = v1::OptimizerState::NewStub(
        grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
    seed_ = FreshSeed();
    rng_.seed(seed_);
    std::vector<float> initial = RandomNormal(rng_, kElements, 1.0f);
    ASSERT_TRUE(client_->RegisterGroup("w", initial).ok());
    model_ = std::make_unique<GroupModel>(initial, Hyperparameters{});
    params_.resize(kElements);
  }

  // Steps t through the client and the model alike.
  void StepBoth(uint64_t t) {
    std::vector<float> grad = RandomNormal(rng_, kElements, 1e-2f);
    ASSERT_TRUE(client_->Step("w", t, grad, absl::MakeSpan(params_)).ok()) << t;
    model_->Step(t, grad);
  }

  // Sends step t for the first `pages` pages on a raw stream, reads
  // `replies_to_read` replies, then cancels the call.
  void SendPartOfStepThenCancel(uint64_t t, const std::vector<float>& grad, size_t pages,
                                size_t replies_to_read) {
    grpc::ClientContext context;
    auto stream = stub_->Step(&context);
    for (size_t page = 0; page < pages; ++page) {
      v1::StepRequest request;
      request.set_group("w");
      request.set_step(t);
      request.set_offset(page * kPage);
      request.set_gradient(grad.data() + page * kPage, kPage * sizeof(float));
      ASSERT_TRUE(stream->Write(request));
    }
    v1::StepResponse response;
    for (size_t i = 0; i < replies_to_read; ++i) ASSERT_TRUE(stream->Read(&response));
    context.TryCancel();
    stream->Finish().IgnoreError();
  }

  uint32_t seed_;
  std::mt19937 rng_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
  std::unique_ptr<GroupModel> model_;
  std::vector<float> params_;
};

TEST_F(ExactlyOnceTest, StepCancelledAfterSomeChunksThenRetriedAppliesEachElementOnce) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  StepBoth(1);
  StepBoth(2);
  std::vector<float> grad = RandomNormal(rng_, kElements, 1e-2f);
  SendPartOfStepThenCancel(3, grad, /*pages=*/2, /*replies_to_read=*/2);
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("w");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->min_step, 2u);
  EXPECT_EQ(info->max_step, 3u);
  ASSERT_TRUE(client_->Step("w", 3, grad, absl::MakeSpan(params_)).ok());
  model_->Step(3, grad);
  EXPECT_EQ(params_, model_->params_fp32());
  StepBoth(4);
  EXPECT_EQ(params_, model_->params_fp32());
  EXPECT_LE(RelativeL2Error(params_, model_->params_f64()), 1e-6);
}

TEST_F(ExactlyOnceTest, StepCancelledBeforeAnyReplyThenRetriedAppliesEachElementOnce) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  StepBoth(1);
  std::vector<float> grad = RandomNormal(rng_, kElements, 1e-2f);
  // Some of these chunks may have been applied before the cancel, some not.
  SendPartOfStepThenCancel(2, grad, /*pages=*/4, /*replies_to_read=*/0);
  ASSERT_TRUE(client_->Step("w", 2, grad, absl::MakeSpan(params_)).ok());
  model_->Step(2, grad);
  EXPECT_EQ(params_, model_->params_fp32());
}

TEST_F(ExactlyOnceTest, ResentCompletedStepChangesNothingAndReturnsCurrentParams) {
  StepBoth(1);
  StepBoth(2);
  const std::vector<float> after_two = params_;
  std::vector<float> other_grad = RandomNormal(rng_, kElements, 1.0f);
  std::vector<float> replayed(kElements);
  ASSERT_TRUE(client_->Step("w", 2, other_grad, absl::MakeSpan(replayed)).ok());
  EXPECT_EQ(replayed, after_two);
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->groups.size(), 1u);
  EXPECT_EQ(stats->groups[0].chunks_replayed, 5u);
  StepBoth(3);  // Training goes on from the untouched state.
  EXPECT_EQ(params_, model_->params_fp32());
}

TEST_F(ExactlyOnceTest, StepThatSkipsAheadIsRefusedNamingTheExpectedStep) {
  StepBoth(1);
  std::vector<float> grad(kElements, 0.1f);
  absl::Status s = client_->Step("w", 3, grad, absl::MakeSpan(params_));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("expected step 2"), std::string::npos) << s;
  StepBoth(2);
  EXPECT_EQ(params_, model_->params_fp32());
}

TEST_F(ExactlyOnceTest, ClientRetriesAStepWhoseConnectionBreaksAndAppliesEachElementOnce) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  StepBoth(1);
  CuttingProxy proxy(daemon_->port());
  ClientOptions options;
  options.initial_backoff = absl::Milliseconds(5);
  options.chunk_bytes = kPage * sizeof(float);  // One page per chunk.
  options.max_chunks_in_flight = 2;
  options.data_plane = DataPlane::kWire;  // The proxy cuts wire bytes.
  auto through_proxy = Client::Connect("127.0.0.1:" + std::to_string(proxy.port()), options);
  ASSERT_TRUE(through_proxy.ok());
  ASSERT_TRUE((*through_proxy)->DescribeGroup("w").ok());  // Connects before the cut is armed.
  std::vector<float> grad = RandomNormal(rng_, kElements, 1e-2f);
  // Cut the connection in the middle of the third page's gradient.
  proxy.ArmCut(2 * kPage * sizeof(float) + kPage * 2);
  ASSERT_TRUE((*through_proxy)->Step("w", 2, grad, absl::MakeSpan(params_)).ok());
  EXPECT_EQ(proxy.cuts(), 1);
  model_->Step(2, grad);
  EXPECT_EQ(params_, model_->params_fp32());
  StepBoth(3);
  EXPECT_EQ(params_, model_->params_fp32());
}

// Small tensors travel packed several to a message (StepRequest.more): a
// connection cut inside the third message is retried, and every element of
// every group is applied once.
TEST_F(ExactlyOnceTest, PackedSmallGroupsCutMidStepAreRetriedAndAppliedOnce) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  constexpr size_t kGroups = 40, kSmall = 3000;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<GroupModel>> models;
  for (size_t g = 0; g < kGroups; ++g) {
    names.push_back("small." + std::to_string(g));
    std::vector<float> initial = RandomNormal(rng_, kSmall, 1.0f);
    ASSERT_TRUE(client_->RegisterGroup(names.back(), initial).ok());
    models.push_back(std::make_unique<GroupModel>(initial, Hyperparameters{}));
  }
  CuttingProxy proxy(daemon_->port());
  ClientOptions options;
  options.initial_backoff = absl::Milliseconds(5);
  options.chunk_bytes = 5 * kSmall * sizeof(float);  // Five groups per message.
  options.max_chunks_in_flight = 2;
  options.data_plane = DataPlane::kWire;  // The proxy cuts wire bytes.
  auto through_proxy = Client::Connect("127.0.0.1:" + std::to_string(proxy.port()), options);
  ASSERT_TRUE(through_proxy.ok());
  ASSERT_TRUE((*through_proxy)->DescribeGroup(names[0]).ok());  // Connects before the cut.
  for (uint64_t t = 1; t <= 3; ++t) {
    std::vector<std::vector<float>> grads, params(kGroups, std::vector<float>(kSmall));
    std::vector<GroupStep> steps;
    for (size_t g = 0; g < kGroups; ++g) {
      grads.push_back(RandomNormal(rng_, kSmall, 1e-2f));
      steps.push_back({names[g], grads[g], absl::MakeSpan(params[g])});
    }
    // Step 2: cut inside the third message's gradients.
    if (t == 2) proxy.ArmCut(12 * kSmall * sizeof(float));
    ASSERT_TRUE((*through_proxy)->Step(steps, t).ok()) << t;
    for (size_t g = 0; g < kGroups; ++g) {
      models[g]->Step(t, grads[g]);
      ASSERT_EQ(params[g], models[g]->params_fp32()) << "step " << t << " group " << g;
    }
  }
  EXPECT_EQ(proxy.cuts(), 1);
}

// A Step on a group this client has not seen looks its layout up first; a
// connection that breaks under that lookup is retried like the stream.
TEST_F(ExactlyOnceTest, AStepWhoseLayoutLookupLosesItsConnectionIsRetried) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  CuttingProxy proxy(daemon_->port());
  ClientOptions options;
  options.initial_backoff = absl::Milliseconds(5);
  options.data_plane = DataPlane::kWire;  // The proxy cuts wire bytes.
  auto through_proxy = Client::Connect("127.0.0.1:" + std::to_string(proxy.port()), options);
  ASSERT_TRUE(through_proxy.ok());
  ASSERT_TRUE((*through_proxy)->GetStats().ok());  // Connects before the cut is armed.
  proxy.ArmCut(1);  // Inside the DescribeGroup request the Step starts with.
  std::vector<float> grad = RandomNormal(rng_, kElements, 1e-2f);
  absl::Status s = (*through_proxy)->Step("w", 1, grad, absl::MakeSpan(params_));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(proxy.cuts(), 1);
  model_->Step(1, grad);
  EXPECT_EQ(params_, model_->params_fp32());
}

TEST(ClientRetryTest, GivesUpWithUnavailableAfterMaxAttemptsWhenNoDaemonListens) {
  ClientOptions options;
  options.max_attempts = 2;
  options.initial_backoff = absl::Milliseconds(1);
  auto dead = Client::Connect("127.0.0.1:1", options);
  ASSERT_TRUE(dead.ok());
  absl::StatusOr<GroupInfo> info = (*dead)->RegisterGroup("w", 10);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
}

TEST(ClientOptionsTest, NoAttemptTimeoutMeansNoDeadlineAndANonPositiveOneIsRefused) {
  auto daemon = DaemonProcess::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.attempt_timeout = absl::InfiniteDuration();
  auto client = Client::Connect((*daemon)->target(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> grad(1000, 0.1f), params(1000);
  ASSERT_TRUE((*client)->RegisterGroup("w", 1000).ok());
  absl::Status s = (*client)->Step("w", 1, grad, absl::MakeSpan(params));
  EXPECT_TRUE(s.ok()) << s;
  options.attempt_timeout = absl::Hours(24 * 365 * 1000);  // Past what the clock can add.
  client = Client::Connect((*daemon)->target(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->DescribeGroup("w").ok());
  for (absl::Duration bad : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    options.attempt_timeout = bad;
    absl::StatusOr<std::unique_ptr<Client>> refused = Client::Connect((*daemon)->target(), options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_NE(refused.status().message().find("attempt_timeout"), std::string::npos);
  }
  options.attempt_timeout = absl::Minutes(1);
  options.max_message_bytes = 1 << 20;  // One float32 page and nothing else.
  EXPECT_EQ(Client::Connect((*daemon)->target(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace optstate::testing
