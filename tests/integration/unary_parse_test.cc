// A unary request whose bytes are not its method's request message is
// refused with INVALID_ARGUMENT naming the message expected (as Step does),
// not gRPC's bare UNIMPLEMENTED; the daemon's state is left as it was.
#include <gtest/gtest.h>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_rpc.h"

namespace optstate::testing {
namespace {

TEST(UnaryParseTest, UnparseableRequestsAreInvalidArgumentNamingTheMessage) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto channel = OwnChannel((*daemon)->target());
  auto stub = v1::OptimizerState::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::RegisterGroupResponse response;
    auto writer = stub->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest request;
    request.mutable_spec()->set_name("g");
    request.mutable_spec()->set_num_elements(100);
    ASSERT_TRUE(writer->Write(request));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"GetStats", "GetStatsRequest"},
      {"ListGroups", "ListGroupsRequest"},
      {"DescribeGroup", "DescribeGroupRequest"},
      {"DeleteGroup", "DeleteGroupRequest"},
  };
  // Bytes that are no message, and a field 1 that announces 64 bytes and carries 3.
  const std::vector<std::string> bodies = {std::string("\xff\xff\xff"), std::string("\x0a\x40"
                                                                                    "abc",
                                                                                    5)};
  for (const auto& [method, message] : methods) {
    for (const std::string& body : bodies) {
      SCOPED_TRACE(method);
      grpc::Status status = RawUnary(channel, "/optstate.v1.OptimizerState/" + method, body);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
      EXPECT_NE(status.error_message().find(message), std::string::npos) << status.error_message();
    }
  }
  // Nothing was deleted; a good request still answers.
  grpc::ClientContext context;
  v1::DescribeGroupRequest request;
  request.set_name("g");
  v1::DescribeGroupResponse response;
  ASSERT_TRUE(stub->DescribeGroup(&context, request, &response).ok());
  EXPECT_EQ(response.group().info().num_elements(), 100u);
}

}  // namespace
}  // namespace optstate::testing
