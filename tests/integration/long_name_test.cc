// Group names longer than registration allows can never exist: every call
// refuses them with INVALID_ARGUMENT before looking them up, and no status
// message grows with the text a client sent (a long one would pass the
// client's metadata limit and reach it as RESOURCE_EXHAUSTED instead).
#include <gtest/gtest.h>

#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_rpc.h"

namespace optstate::testing {
namespace {

class LongNameTest : public ::testing::Test {
 public:
  void SetUp() override {
    auto daemon = DaemonProcess::Start({"--threads=2"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    stub_ = v1::OptimizerState::NewStub(OwnChannel(daemon_->target()));
  }

  grpc::Status Describe(const std::string& name) {
    grpc::ClientContext context;
    v1::DescribeGroupRequest request;
    request.set_name(name);
    v1::DescribeGroupResponse response;
    return stub_->DescribeGroup(&context, request, &response);
  }
  grpc::Status Delete(const std::string& name) {
    grpc::ClientContext context;
    v1::DeleteGroupRequest request;
    request.set_name(name);
    v1::DeleteGroupResponse response;
    return stub_->DeleteGroup(&context, request, &response);
  }
  grpc::Status Step(const std::string& name) {
    grpc::ClientContext context;
    auto stream = stub_->Step(&context);
    v1::StepRequest request;
    request.set_group(name);
    request.set_step(1);
    request.set_gradient(std::string(16, '\0'));
    stream->Write(request);
    stream->WritesDone();
    v1::StepResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }
  grpc::Status Register(const std::string& name) {
    grpc::ClientContext context;
    v1::RegisterGroupResponse response;
    auto writer = stub_->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest request;
    request.mutable_spec()->set_name(name);
    request.mutable_spec()->set_num_elements(4);
    writer->Write(request);
    writer->WritesDone();
    return writer->Finish();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
};

TEST_F(LongNameTest, NamesPastTheLimitAreInvalidArgumentEverywhere) {
  for (size_t length : {513, 10 * 1024, 20 * 1024, 200 * 1024}) {
    const std::string name(length, 'x');
    SCOPED_TRACE(length);
    for (int i = 0; i < 5; ++i) {
      for (const grpc::Status& status :
           {Describe(name), Delete(name), Step(name), Register(name)}) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
            << status.error_message().substr(0, 200);
        EXPECT_NE(status.error_message().find("1 to 512 characters"), std::string::npos)
            << status.error_message().substr(0, 200);
        EXPECT_LT(status.error_message().size(), 1024u);
      }
    }
  }
}

TEST_F(LongNameTest, ALongestValidNameIsAnsweredInFull) {
  const std::string name(512, 'y');
  grpc::Status status = Describe(name);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_NE(status.error_message().find(name), std::string::npos);
  status = Step(name);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  ASSERT_TRUE(Register(name).ok());
  EXPECT_TRUE(Describe(name).ok());
  EXPECT_TRUE(Delete(name).ok());
}

TEST_F(LongNameTest, TheClientSeesTheDaemonsAnswerForALongName) {
  auto client = Client::Connect(daemon_->target());
  ASSERT_TRUE(client.ok());
  const std::string name(20 * 1024, 'z');
  absl::StatusOr<GroupInfo> info = (*client)->DescribeGroup(name);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
}

}  // namespace
}  // namespace optstate::testing
