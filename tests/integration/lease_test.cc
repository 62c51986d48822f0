// Leases through the C++ client and a real optstated (docs/jobs.md): the
// job that steps a group holds it; another holder's Step and DeleteGroup are
// refused, naming the holder, with the group's state as it was; takeovers
// by name; what GroupInfo shows; what NOT_FOUND says of the daemon.
#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"

namespace optstate::testing {
namespace {

constexpr size_t kElements = 1000;

std::unique_ptr<Client> Connect(const std::string& target, const std::string& holder,
                                const std::string& takeover = "") {
  ClientOptions options;
  options.lease_holder = holder;
  options.lease_job = holder.empty() ? "" : "job-" + holder + "/";
  options.lease_takeover = takeover;
  options.max_attempts = 1;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

absl::Status StepOnce(Client& client, uint64_t step, float value = 0.5f) {
  std::vector<float> grad(kElements, value), params(kElements);
  return client.Step("w", step, grad, absl::MakeSpan(params));
}

class LeaseTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::string>& flags) {
    auto daemon = DaemonProcess::Start(flags);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
  }
  void TearDown() override {
    if (daemon_ == nullptr) return;
    absl::StatusOr<int> exit_code = daemon_->Stop();
    ASSERT_TRUE(exit_code.ok()) << exit_code.status();
    EXPECT_EQ(*exit_code, 0);
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(LeaseTest, AnotherHolderIsRefusedNamingTheHolderAndTheGroupStaysAsItWas) {
  Start({"--threads=2"});
  std::unique_ptr<Client> a = Connect(daemon_->target(), "a");
  std::unique_ptr<Client> b = Connect(daemon_->target(), "b");
  std::unique_ptr<Client> anonymous = Connect(daemon_->target(), "");
  ASSERT_TRUE(a->RegisterGroup("w", std::vector<float>(kElements, 1.0f), Hyperparameters{}).ok());
  ASSERT_TRUE(StepOnce(*a, 1).ok());

  absl::StatusOr<GroupInfo> info = anonymous->DescribeGroup("w");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->lease.has_value());
  EXPECT_EQ(info->lease->holder, "a");
  EXPECT_EQ(info->lease->job, "job-a/");
  EXPECT_EQ(info->lease->pid, static_cast<uint64_t>(getpid()));
  EXPECT_FALSE(info->lease->expired);
  EXPECT_GT(info->lease->expires_unix_micros, absl::ToUnixMicros(absl::Now()));
  ASSERT_TRUE(info->last_step.has_value());
  EXPECT_EQ(info->last_step->step, 1u);
  EXPECT_EQ(info->last_step->lr, 1e-3);

  for (Client* other : {b.get(), anonymous.get()}) {
    const absl::Status step = StepOnce(*other, 2);
    EXPECT_EQ(step.code(), absl::StatusCode::kFailedPrecondition) << step;
    EXPECT_NE(step.message().find("leased by job 'job-a/' (holder a"), absl::string_view::npos)
        << step;
    const absl::Status del = other->DeleteGroup("w");
    EXPECT_EQ(del.code(), absl::StatusCode::kFailedPrecondition) << del;
  }
  info = anonymous->DescribeGroup("w");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->max_step, 1u);
  EXPECT_EQ(info->lease->holder, "a");

  // A takeover naming another holder breaks nothing; one naming a as dead does.
  EXPECT_EQ(StepOnce(*Connect(daemon_->target(), "b", "dead=x"), 2).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(StepOnce(*Connect(daemon_->target(), "b", "expired=a"), 2).code(),
            absl::StatusCode::kFailedPrecondition);  // live: not expired
  ASSERT_TRUE(StepOnce(*Connect(daemon_->target(), "b", "dead=a"), 2).ok());
  EXPECT_EQ(anonymous->DescribeGroup("w")->lease->holder, "b");
  EXPECT_EQ(StepOnce(*a, 3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(b->DeleteGroup("w").ok());
}

TEST_F(LeaseTest, AnExpiredLeaseIsTakenOverByNameAndLetsAnOperatorDelete) {
  Start({"--threads=2", "--lease_seconds=1"});
  std::unique_ptr<Client> a = Connect(daemon_->target(), "a");
  ASSERT_TRUE(a->RegisterGroup("w", std::vector<float>(kElements, 1.0f), Hyperparameters{}).ok());
  ASSERT_TRUE(StepOnce(*a, 1).ok());
  absl::SleepFor(absl::Milliseconds(1200));
  std::unique_ptr<Client> anonymous = Connect(daemon_->target(), "");
  EXPECT_TRUE(anonymous->DescribeGroup("w")->lease->expired);
  // Expired, still held: another job must take it over on purpose.
  EXPECT_EQ(StepOnce(*Connect(daemon_->target(), "b"), 2).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(StepOnce(*Connect(daemon_->target(), "b", "expired=a"), 2).ok());
  absl::SleepFor(absl::Milliseconds(1200));
  EXPECT_TRUE(anonymous->DeleteGroup("w").ok());  // a lapsed lease: an operator cleans up
}

TEST_F(LeaseTest, NotFoundSaysWhenTheDaemonStartedAndWhetherItKeepsState) {
  Start({"--threads=2"});
  std::unique_ptr<Client> client = Connect(daemon_->target(), "a");
  const absl::Status missing = StepOnce(*client, 1);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("This optstated started at 20"), absl::string_view::npos)
      << missing;
  EXPECT_NE(missing.message().find("without --state_dir"), absl::string_view::npos) << missing;
  absl::StatusOr<Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_FALSE(stats->has_state_dir);
  EXPECT_EQ(stats->lease_seconds, 60);
  EXPECT_LE(stats->started_unix_micros, absl::ToUnixMicros(absl::Now()));
  EXPECT_GT(stats->started_unix_micros, absl::ToUnixMicros(absl::Now() - absl::Minutes(5)));
}

// Raw calls: a takeover without a holder of its own stepped and deleted a
// group another holder leased, leaving that holder's lease; two lease values
// were taken silently (the first won).
TEST_F(LeaseTest, ATakeoverWithoutAHolderAndTwoLeaseValuesAreRefused) {
  Start({"--threads=2"});
  std::unique_ptr<Client> a = Connect(daemon_->target(), "a");
  ASSERT_TRUE(a->RegisterGroup("w", std::vector<float>(kElements, 1.0f), Hyperparameters{}).ok());
  ASSERT_TRUE(StepOnce(*a, 1).ok());
  auto stub = v1::OptimizerState::NewStub(
      grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
  auto delete_with = [&](const std::vector<std::pair<std::string, std::string>>& metadata) {
    grpc::ClientContext context;
    for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
    v1::DeleteGroupRequest request;
    request.set_name("w");
    v1::DeleteGroupResponse response;
    return stub->DeleteGroup(&context, request, &response);
  };
  grpc::Status refused = delete_with({{"optstate-lease-takeover", "dead=a"}});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("needs 'optstate-lease' naming the caller"),
            std::string::npos)
      << refused.error_message();
  refused = delete_with({{"optstate-lease", "holder=a"}, {"optstate-lease", "holder=b"}});
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("'optstate-lease' was sent 2 times"), std::string::npos)
      << refused.error_message();
  absl::StatusOr<GroupInfo> info = a->DescribeGroup("w");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->lease.has_value());
  EXPECT_EQ(info->lease->holder, "a");
  EXPECT_TRUE(StepOnce(*a, 2).ok());
}

// A first step broken part-way leaves the holder's group with pages still
// at step 0, which the holder's resend steps from their initial values.
// Another job's RegisterGroup with values rewrote them (answered OK), and the
// holder's resent step then ran on that job's values.
TEST_F(LeaseTest, AnotherHoldersValuesForAPageAtStepZeroAreRefused) {
  Start({"--threads=2"});
  std::unique_ptr<Client> a = Connect(daemon_->target(), "a");
  constexpr uint64_t kGroup = 1 << 20;  // Two pages or more.
  ASSERT_TRUE(a->RegisterGroup("torn", std::vector<float>(kGroup, 1.0f), Hyperparameters{}).ok());
  absl::StatusOr<GroupInfo> info = a->DescribeGroup("torn");
  ASSERT_TRUE(info.ok()) << info.status();
  const uint64_t page = info->page_elements;
  ASSERT_LT(page, kGroup);
  // Holder a's step 1 of the first page only: a step broken part-way.
  auto stub = v1::OptimizerState::NewStub(
      grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    context.AddMetadata("optstate-lease", "holder=a job=job-a/");
    auto stream = stub->Step(&context);
    v1::StepRequest request;
    request.set_group("torn");
    request.set_step(1);
    request.set_offset(0);
    request.set_gradient(std::string(page * sizeof(float), '\0'));
    ASSERT_TRUE(stream->Write(request));
    stream->WritesDone();
    v1::StepResponse response;
    EXPECT_TRUE(stream->Read(&response));
    ASSERT_TRUE(stream->Finish().ok());
  }
  info = a->DescribeGroup("torn");
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->min_step, 0u);
  ASSERT_EQ(info->max_step, 1u);

  // A RegisterGroup of the spec and values for every element, as another
  // job's (or anyone's) raw call makes it (optstate::Client sends values only
  // to pages awaiting them).
  auto register_with = [&](const std::string& lease, float value) {
    grpc::ClientContext context;
    if (!lease.empty()) context.AddMetadata("optstate-lease", lease);
    v1::RegisterGroupResponse response;
    auto writer = stub->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest spec;
    spec.mutable_spec()->set_name("torn");
    spec.mutable_spec()->set_num_elements(kGroup);
    spec.mutable_spec()->set_has_initial_values(true);
    writer->Write(spec);
    const std::vector<float> values(kGroup, value);
    v1::RegisterGroupRequest chunk;
    chunk.mutable_values()->set_offset(0);
    chunk.mutable_values()->set_dtype(v1::DTYPE_FLOAT32);
    chunk.mutable_values()->set_data(values.data(), kGroup * sizeof(float));
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  };
  for (const std::string lease : {"holder=b job=job-b/", ""}) {
    const grpc::Status other = register_with(lease, 42.0f);
    EXPECT_EQ(other.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << other.error_message();
    EXPECT_NE(other.error_message().find("leased by job 'job-a/' (holder a"), std::string::npos)
        << other.error_message();
  }
  // Its own values are the holder's to give again (the pages at step 0 take
  // them; the stepped page keeps its step).
  const grpc::Status own = register_with("holder=a job=job-a/", 1.0f);
  EXPECT_TRUE(own.ok()) << own.error_message();

  // The resend: the first page replays, the others step from 1.0, so every
  // page ends as the first did (the same gradient, the same initial value).
  std::vector<float> grad(kGroup, 0.0f), params(kGroup);
  ASSERT_TRUE(a->Step("torn", 1, grad, absl::MakeSpan(params)).ok());
  for (uint64_t i = page; i < kGroup; i += page) {
    ASSERT_EQ(params[i], params[0]) << "element " << i;
  }
  EXPECT_EQ(params[0], 1.0f - 1e-3f * 1e-2f);  // Weight decay alone: a zero gradient.
  // A group whose every page is stepped takes anyone's values as before: none
  // is written.
  const grpc::Status after = register_with("holder=b job=job-b/", 42.0f);
  EXPECT_TRUE(after.ok()) << after.error_message();
  std::vector<float> again(kGroup);
  ASSERT_TRUE(a->Step("torn", 2, grad, absl::MakeSpan(again)).ok());
  EXPECT_LT(again[page], 1.0f);  // Stepped on from its own values, not 42.
}

TEST(LeaseOptionsTest, BadLeaseOptionsAndTargetsAreRefusedAtConnect) {
  ClientOptions options;
  options.lease_holder = "has space";
  EXPECT_EQ(Client::Connect("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.lease_holder = "a";
  options.lease_takeover = "now=a";
  EXPECT_EQ(Client::Connect("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect("", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect("http://127.0.0.1:1", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace optstate::testing
