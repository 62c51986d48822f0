// Step plans (StepRequest.plan) on the raw protocol, against an optstated
// process: a plan's uses step exactly as its chunks would, answered once;
// per-step fields override every chunk; every use is checked again (groups
// deleted or registered anew); unknown plans, other sessions' plans and
// malformed uses are refused with nothing applied; plans end with their
// session and past eight a session forgets its least recently used one.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"
#include "tests/testing/raw_region.h"

namespace optstate {
namespace {

using ::optstate::testing::DaemonProcess;
using ::optstate::testing::FreshSeed;
using ::optstate::testing::GroupModel;
using ::optstate::testing::OpenRegion;
using ::optstate::testing::RandomNormal;
using ::optstate::testing::RawRegion;
using ::optstate::testing::RegionSocketOf;

constexpr uint64_t kPage = 256 * 1024;  // The daemon's default.
// Group "a" of two pages and "b" of one, float32 gradients and params, laid
// out in a region as: a's gradient, b's gradient, a's params, b's params.
constexpr uint64_t kA = 2 * kPage, kB = kPage, kTotal = kA + kB;

// A chunk covering all of `group` (`elements`, at element `at` of the
// layout above) in `region`.
v1::StepRequest WholeGroup(const std::string& group, uint64_t elements, uint64_t at,
                           const RawRegion& region) {
  v1::StepRequest chunk;
  chunk.set_group(group);
  chunk.set_group_elements(elements);
  chunk.set_region_session(region.key);
  v1::RegionSlice* g = chunk.mutable_gradient_region();
  g->set_region(region.id);
  g->set_offset(at * 4);
  g->set_bytes(elements * 4);
  v1::RegionSlice* p = chunk.mutable_params_region();
  p->set_region(region.id);
  p->set_offset((kTotal + at) * 4);
  p->set_bytes(elements * 4);
  return chunk;
}

// The message of step `step` of both groups, defining plan `plan` (0: none).
v1::StepRequest Definition(uint64_t step, uint64_t plan, const RawRegion& region) {
  v1::StepRequest message = WholeGroup("a", kA, 0, region);
  message.set_step(step);
  message.set_plan(plan);
  v1::StepRequest* b = message.add_more();
  *b = WholeGroup("b", kB, kA, region);
  b->set_step(step);
  return message;
}

// A use of plan `plan` at `step` in the session of `region`.
v1::StepRequest Use(uint64_t step, uint64_t plan, const RawRegion& region) {
  v1::StepRequest message;
  message.set_plan(plan);
  message.set_step(step);
  message.set_region_session(region.key);
  return message;
}

class StepPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start({"--threads=2"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    auto client = Client::Connect(daemon_->target(), ClientOptions());
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    stub_ = v1::OptimizerState::NewStub(
        grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
    seed_ = FreshSeed();
    rng_.seed(seed_);
    for (const auto& [name, n] : {std::pair<std::string, uint64_t>{"a", kA}, {"b", kB}}) {
      std::vector<float> initial = RandomNormal(rng_, n, 1.0f);
      ASSERT_TRUE(client_->RegisterGroup(name, initial).ok());
      models_.emplace_back(initial, Hyperparameters{});
    }
    path_ = RegionSocketOf(daemon_->target());
    ASSERT_FALSE(path_.empty());
    region_ = OpenRegion(path_, 2 * kTotal * 4);
    ASSERT_NE(region_, nullptr);
  }

  // Sends `requests` on one Step stream (as lease holder `holder`, if not
  // empty): its status, and the replies in `replies`.
  absl::Status SendAll(const std::vector<v1::StepRequest>& requests,
                       std::vector<v1::StepResponse>* replies = nullptr,
                       const std::string& holder = "") {
    grpc::ClientContext context;
    if (!holder.empty()) context.AddMetadata("optstate-lease", "holder=" + holder);
    auto stream = stub_->Step(&context);
    for (const v1::StepRequest& r : requests) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
    v1::StepResponse response;
    while (stream->Read(&response)) {
      if (replies != nullptr) replies->push_back(response);
    }
    grpc::Status status = stream->Finish();
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }

  // New gradients for step `step` in the region; the models take them (and
  // `lr`, when not negative) as the daemon should.
  void NextGradients(uint64_t step, double lr = -1.0) {
    std::vector<float> g = RandomNormal(rng_, kTotal, 1e-2f);
    std::memcpy(region_->base, g.data(), kTotal * 4);
    models_[0].Step(step, std::vector<float>(g.begin(), g.begin() + kA), 1.0f, lr);
    models_[1].Step(step, std::vector<float>(g.begin() + kA, g.end()), 1.0f, lr);
  }

  // The params the daemon wrote into the region are the models'.
  void ExpectParamsOfModels(const std::string& when) {
    const float* params = reinterpret_cast<const float*>(region_->base) + kTotal;
    EXPECT_EQ(std::vector<float>(params, params + kA), models_[0].params_fp32())
        << when << ", seed " << seed_;
    EXPECT_EQ(std::vector<float>(params + kA, params + kTotal), models_[1].params_fp32())
        << when << ", seed " << seed_;
  }

  // The steps every page of `group` has reached.
  uint64_t MinStep(const std::string& group) {
    absl::StatusOr<GroupInfo> info = client_->DescribeGroup(group);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->min_step : 0;
  }

  uint32_t seed_;
  std::mt19937 rng_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
  std::vector<GroupModel> models_;
  std::string path_;
  std::unique_ptr<RawRegion> region_;
};

TEST_F(StepPlanTest, UsesStepAsTheChunksWouldAndAreAnsweredOnce) {
  NextGradients(1);
  std::vector<v1::StepResponse> replies;
  ASSERT_TRUE(SendAll({Definition(1, 7, *region_)}, &replies).ok());
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].group(), "a");  // A definition is answered chunk by chunk,
  EXPECT_EQ(replies[0].more_size(), 1);
  EXPECT_EQ(replies[0].plan(), 7u);  // its own reply saying the plan is kept.
  EXPECT_EQ(replies[0].more(0).plan(), 0u);
  ExpectParamsOfModels("step 1, the definition");
  for (uint64_t t = 2; t <= 4; ++t) {
    // Step 3 sets the lr of every chunk; the others keep the definition's (none: the groups').
    const double lr = t == 3 ? 5e-4 : -1.0;
    NextGradients(t, lr);
    v1::StepRequest use = Use(t, 7, *region_);
    if (lr > 0) use.set_lr(lr);
    replies.clear();
    absl::Status status =
        SendAll({use}, &replies);  // A new stream each step: plans outlive streams.
    ASSERT_TRUE(status.ok()) << t << " " << status;
    ASSERT_EQ(replies.size(), 1u);
    const v1::StepResponse& reply = replies[0];
    EXPECT_EQ(reply.plan(), 7u);
    EXPECT_EQ(reply.step(), t);
    EXPECT_TRUE(reply.group().empty());
    EXPECT_EQ(reply.more_size(), 0);
    EXPECT_EQ(reply.num_elements(), kTotal);
    EXPECT_EQ(reply.pages_applied(), 3u);
    EXPECT_EQ(reply.pages_replayed(), 0u);
    EXPECT_TRUE(reply.params_in_region());
    ExpectParamsOfModels(absl::StrCat("step ", t));
  }
  // A use resent (its reply lost) applies nothing again.
  replies.clear();
  ASSERT_TRUE(SendAll({Use(4, 7, *region_)}, &replies).ok());
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].pages_applied(), 0u);
  EXPECT_EQ(replies[0].pages_replayed(), 3u);
  ExpectParamsOfModels("step 4 resent");
  absl::StatusOr<Stats> stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->regions.step_plans, 1u);
}

TEST_F(StepPlanTest, UnknownPlansAndOtherSessionsPlansAreNotFoundAndApplyNothing) {
  NextGradients(1);
  ASSERT_TRUE(SendAll({Definition(1, 7, *region_)}).ok());
  absl::Status unknown = SendAll({Use(2, 8, *region_)});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_NE(unknown.message().find("step plan 8"), std::string::npos) << unknown;
  EXPECT_NE(unknown.message().find("define it again"), std::string::npos) << unknown;
  // Plan 7 named with another session's key, and with none.
  auto other = OpenRegion(path_, 4096);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(SendAll({Use(2, 7, *other)}).code(), absl::StatusCode::kNotFound);
  v1::StepRequest no_session = Use(2, 7, *region_);
  no_session.clear_region_session();
  EXPECT_EQ(SendAll({no_session}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MinStep("a"), 1u);
  EXPECT_EQ(MinStep("b"), 1u);
  // Nothing was applied: step 2 through the plan is the models' step 2.
  NextGradients(2);
  ASSERT_TRUE(SendAll({Use(2, 7, *region_)}).ok());
  ExpectParamsOfModels("step 2");
}

TEST_F(StepPlanTest, MalformedUsesAndDefinitionsAreInvalidArgument) {
  NextGradients(1);
  ASSERT_TRUE(SendAll({Definition(1, 7, *region_)}).ok());
  // A use carrying a chunk's own fields.
  for (const char* field : {"offset", "gradient_dtype", "group_elements", "params_region"}) {
    v1::StepRequest use = Use(2, 7, *region_);
    if (std::string(field) == "offset") use.set_offset(kPage);
    if (std::string(field) == "gradient_dtype") use.set_gradient_dtype(v1::DTYPE_BFLOAT16);
    if (std::string(field) == "group_elements") use.set_group_elements(kA);
    if (std::string(field) == "params_region") use.mutable_params_region()->set_region(1);
    absl::Status status = SendAll({use});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field << ": " << status;
    EXPECT_NE(status.message().find(absl::StrCat("`", field, "`")), std::string::npos) << status;
  }
  // A definition whose packed chunk carries its gradient instead of naming
  // a region: refused unapplied, and plan 7 is no longer kept.
  v1::StepRequest bad = Definition(2, 7, *region_);
  bad.mutable_more(0)->clear_gradient_region();
  bad.mutable_more(0)->set_gradient(std::string(kB * 4, '\0'));
  absl::Status refused = SendAll({bad});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("names no gradient_region"), std::string::npos) << refused;
  EXPECT_EQ(SendAll({Use(2, 7, *region_)}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MinStep("a"), 1u);
  EXPECT_EQ(MinStep("b"), 1u);
  NextGradients(2);
  ASSERT_TRUE(SendAll({Definition(2, 7, *region_)}).ok());
  ExpectParamsOfModels("step 2");
}

TEST_F(StepPlanTest, EveryUseIsCheckedAgainstTheGroupsAsTheyAreNow) {
  NextGradients(1);
  ASSERT_TRUE(SendAll({Definition(1, 7, *region_)}).ok());
  // b registered anew with another size: the use is refused (as its chunk
  // would be), naming the plan and the group, and a is not stepped.
  ASSERT_TRUE(client_->DeleteGroup("b").ok());
  ASSERT_TRUE(client_->RegisterGroup("b", 2 * kB).ok());
  absl::Status resized = SendAll({Use(2, 7, *region_)});
  EXPECT_EQ(resized.code(), absl::StatusCode::kInvalidArgument) << resized;
  EXPECT_NE(resized.message().find("step plan 7 (group 'b')"), std::string::npos) << resized;
  EXPECT_EQ(MinStep("a"), 1u);
  // b gone: NOT_FOUND, a still not stepped.
  ASSERT_TRUE(client_->DeleteGroup("b").ok());
  absl::Status gone = SendAll({Use(2, 7, *region_)});
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_NE(gone.message().find("'b'"), std::string::npos) << gone;
  EXPECT_EQ(MinStep("a"), 1u);
}

TEST_F(StepPlanTest, AUseIsHeldToTheGroupsLeasesAsItsChunksWouldBe) {
  // The plan's definition takes the lease of both groups for job-1.
  NextGradients(1);
  ASSERT_TRUE(SendAll({Definition(1, 7, *region_)}, nullptr, "job-1").ok());
  // Another holder's use, and one without a holder, are refused; a is not stepped.
  absl::Status other = SendAll({Use(2, 7, *region_)}, nullptr, "job-2");
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_NE(other.message().find("job-1"), std::string::npos) << other;
  EXPECT_EQ(SendAll({Use(2, 7, *region_)}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MinStep("a"), 1u);
  EXPECT_EQ(MinStep("b"), 1u);
  // The holder's own use steps.
  NextGradients(2);
  ASSERT_TRUE(SendAll({Use(2, 7, *region_)}, nullptr, "job-1").ok());
  ExpectParamsOfModels("step 2 by the holder");
}

TEST_F(StepPlanTest, ASessionKeepsEightPlansAndItsEndForgetsThem) {
  NextGradients(1);
  ASSERT_TRUE(SendAll({Definition(1, 1, *region_)}).ok());
  // Plans 2..9 defined by step 1 resent (nothing applied again): plan 1,
  // used least recently, is forgotten.
  for (uint64_t plan = 2; plan <= 9; ++plan) {
    ASSERT_TRUE(SendAll({Definition(1, plan, *region_)}).ok()) << plan;
  }
  EXPECT_EQ(SendAll({Use(2, 1, *region_)}).code(), absl::StatusCode::kNotFound);
  absl::StatusOr<Stats> stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->regions.step_plans, 8u);
  NextGradients(2);
  ASSERT_TRUE(SendAll({Use(2, 9, *region_)}).ok());
  ExpectParamsOfModels("step 2, plan 9");
  // The session ends: its plans go with it.
  region_.reset();
  for (int i = 0; i < 200; ++i) {
    stats = client_->GetStats();
    ASSERT_TRUE(stats.ok());
    if (stats->regions.step_plans == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(stats->regions.step_plans, 0u);
  EXPECT_EQ(stats->regions.sessions, 0u);
}

}  // namespace
}  // namespace optstate
