// A group sealed for a move (ExportStateRequest.moved_to, what a client's
// Rebalance sends) against a real optstated: the export still streams the
// state; later steps are refused FAILED_PRECONDITION naming the move and
// change nothing; GroupInfo.moved_to shows it; after DeleteGroup the name
// answers with the move (RegisterGroup too) until the note is deleted; a sealed
// group refuses RegisterGroup and is unsealed by an ImportState; a bad
// destination is refused and seals nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"

namespace optstate::testing {
namespace {

using ::testing::HasSubstr;

constexpr size_t kElements = 3000;

class GroupMoveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start({"--page_elements=1024"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    ClientOptions options;
    options.max_attempts = 1;
    options.data_plane = DataPlane::kWire;
    auto client = Client::Connect(daemon_->target(), options);
    ASSERT_TRUE(client.ok());
    client_ = *std::move(client);
    stub_ = v1::OptimizerState::NewStub(
        grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    absl::StatusOr<int> exit = daemon_->Stop();
    EXPECT_TRUE(exit.ok() && *exit == 0);
  }

  absl::Status StepOnce(uint64_t step) {
    std::vector<float> grad(kElements, 0.25f), params(kElements);
    return client_->Step("w", step, grad, absl::MakeSpan(params));
  }

  // ExportState with moved_to; the status, and the page steps it streamed.
  grpc::Status ExportForMove(const std::string& moved_to, std::vector<uint64_t>* page_steps) {
    grpc::ClientContext context;
    v1::ExportStateRequest request;
    request.set_name("w");
    request.set_moved_to(moved_to);
    auto reader = stub_->ExportState(&context, request);
    v1::ExportStateResponse response;
    while (reader->Read(&response)) {
      if (response.has_chunk() && response.chunk().tensor() == v1::STATE_TENSOR_PAGE_STEPS) {
        const std::string& data = response.chunk().data();
        for (size_t at = 0; at + 8 <= data.size(); at += 8) {
          uint64_t s = 0;
          std::memcpy(&s, data.data() + at, 8);  // Little-endian, as this machine.
          page_steps->push_back(s);
        }
      }
    }
    return reader->Finish();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
};

TEST_F(GroupMoveTest, ASealedGroupExportsItsStateAndRefusesLaterSteps) {
  ASSERT_TRUE(client_->RegisterGroup("w", kElements).ok());
  ASSERT_TRUE(StepOnce(1).ok());
  ASSERT_TRUE(StepOnce(2).ok());
  std::vector<uint64_t> page_steps;
  ASSERT_TRUE(ExportForMove("10.0.0.12:50051", &page_steps).ok());
  EXPECT_EQ(page_steps, std::vector<uint64_t>(3, 2));

  absl::Status refused = StepOnce(3);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("moved to daemon '10.0.0.12:50051'"));
  EXPECT_THAT(refused.message(), HasSubstr("nothing was applied"));
  // A replay of the step it holds is refused too: the copy here is frozen.
  EXPECT_EQ(StepOnce(2).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("w");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->moved_to, "10.0.0.12:50051");
  EXPECT_EQ(info->min_step, 2u);
  EXPECT_EQ(info->max_step, 2u);
  // A second seal (a Rebalance finishing an earlier one's move) names the new place.
  page_steps.clear();
  ASSERT_TRUE(ExportForMove("10.0.0.13:50051", &page_steps).ok());
  EXPECT_THAT(StepOnce(3).message(), HasSubstr("moved to daemon '10.0.0.13:50051'"));
}

TEST_F(GroupMoveTest, AfterTheDeleteTheNameSaysWhereItWentUntilItsNoteIsDeleted) {
  ASSERT_TRUE(client_->RegisterGroup("w", kElements).ok());
  ASSERT_TRUE(StepOnce(1).ok());
  std::vector<uint64_t> page_steps;
  ASSERT_TRUE(ExportForMove("optstated-3", &page_steps).ok());
  ASSERT_TRUE(client_->DeleteGroup("w").ok());
  // A RegisterGroup too: a client still on the old member list made the group
  // again here at step 0, and its trainer was told of renamed parameters.
  for (absl::Status refused : {StepOnce(2), client_->DescribeGroup("w").status(),
                               client_->RegisterGroup("w", kElements).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.message(), HasSubstr("moved to daemon 'optstated-3'"));
  }
  absl::StatusOr<std::vector<GroupInfo>> listed = client_->ListGroups();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // The note deleted, as the refusal advises: the name is free here.
  ASSERT_TRUE(client_->DeleteGroup("w").ok());
  EXPECT_EQ(client_->DeleteGroup("w").code(), absl::StatusCode::kNotFound);
  absl::StatusOr<GroupInfo> again = client_->RegisterGroup("w", kElements);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->created);
  EXPECT_TRUE(again->moved_to.empty());
  EXPECT_TRUE(StepOnce(1).ok());
}

// Still sealed here (the Rebalance was killed before its delete): a
// RegisterGroup is refused naming the move, not answered as if the group
// stepped here; an ImportState (a Rebalance moving it back) replaces its
// state and unseals it.
TEST_F(GroupMoveTest, ASealedGroupRefusesRegistrationAndAnImportUnsealsIt) {
  ASSERT_TRUE(client_->RegisterGroup("w", kElements).ok());
  ASSERT_TRUE(StepOnce(1).ok());
  absl::StatusOr<Client::GroupState> state = client_->ExportState("w");
  ASSERT_TRUE(state.ok());
  std::vector<uint64_t> page_steps;
  ASSERT_TRUE(ExportForMove("optstated-3", &page_steps).ok());
  absl::Status refused = client_->RegisterGroup("w", kElements).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("sealed for its move to daemon 'optstated-3'"));

  for (float& p : state->params) p += 1.0f;  // The copy moved back differs from the one here.
  ASSERT_TRUE(client_->ImportState(*state).ok());
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("w");
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->moved_to.empty());
  absl::StatusOr<Client::GroupState> now = client_->ExportState("w");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->params, state->params);
  EXPECT_TRUE(StepOnce(2).ok());
  EXPECT_TRUE(client_->RegisterGroup("w", kElements).ok());
}

// An import registers a group as having initial values; registering it again
// as it was first registered, without values (a trainer attaching after a
// Rebalance moved its groups), was ALREADY_EXISTS.
TEST_F(GroupMoveTest, AnImportedGroupTakesItsRegistrationWithoutValuesAgain) {
  ASSERT_TRUE(client_->RegisterGroup("w", kElements).ok());
  ASSERT_TRUE(StepOnce(1).ok());
  absl::StatusOr<Client::GroupState> state = client_->ExportState("w");
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(client_->DeleteGroup("w").ok());
  ASSERT_TRUE(client_->ImportState(*state).ok());
  absl::StatusOr<GroupInfo> again = client_->RegisterGroup("w", kElements);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->max_step, 1u);
  EXPECT_TRUE(StepOnce(2).ok());
}

TEST_F(GroupMoveTest, ABadDestinationIsRefusedAndSealsNothing) {
  ASSERT_TRUE(client_->RegisterGroup("w", kElements).ok());
  std::vector<uint64_t> page_steps;
  const grpc::Status refused = ExportForMove("has space", &page_steps);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("printable ASCII characters without spaces"));
  EXPECT_TRUE(page_steps.empty());
  EXPECT_EQ(ExportForMove(std::string(513, 'x'), &page_steps).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(StepOnce(1).ok());
  absl::StatusOr<GroupInfo> info = client_->DescribeGroup("w");
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->moved_to.empty());
}

TEST_F(GroupMoveTest, AnUnknownGroupIsNotFoundAndLeavesNoNote) {
  std::vector<uint64_t> page_steps;
  EXPECT_EQ(ExportForMove("elsewhere", &page_steps).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(client_->DescribeGroup("w").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace optstate::testing
