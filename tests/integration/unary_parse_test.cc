// A request whose bytes are not its method's request message is refused
// with INVALID_ARGUMENT naming the message expected (as Step does), not
// gRPC's bare UNIMPLEMENTED, on every method; a client stream's bad message
// is refused as such, not taken for the stream's end; the daemon's state is
// left as it was.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/time/clock.h"
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
      {"GetStats", "GetStatsRequest"},           {"ListGroups", "ListGroupsRequest"},
      {"DescribeGroup", "DescribeGroupRequest"}, {"DeleteGroup", "DeleteGroupRequest"},
      {"ExportState", "ExportStateRequest"},     {"Checkpoint", "CheckpointRequest"},
      {"RewindJob", "RewindJobRequest"},
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
  for (const std::string& body : bodies) {
    grpc::Status status = RawUnary(channel, "/optstate.v1.DataPlane/GetDataPlane", body);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("GetDataPlaneRequest"), std::string::npos)
        << status.error_message();
  }
  // Nothing was deleted; a good request still answers.
  grpc::ClientContext context;
  v1::DescribeGroupRequest request;
  request.set_name("g");
  v1::DescribeGroupResponse response;
  ASSERT_TRUE(stub->DescribeGroup(&context, request, &response).ok());
  EXPECT_EQ(response.group().info().num_elements(), 100u);
}

TEST(UnaryParseTest, ABadImportStateMessageRefusesTheImportAndIsNotTakenForItsEnd) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto channel = OwnChannel((*daemon)->target());
  // A whole import of 4 elements at step 7, then bytes that are no message,
  // then a chunk past the end: with the bad bytes read as a half-close, the
  // import would commit and the call answer OK.
  constexpr uint64_t kElements = 4;
  std::vector<std::string> messages;
  v1::ImportStateRequest header;
  header.mutable_header()->set_name("imported");
  header.mutable_header()->set_num_elements(kElements);
  messages.push_back(header.SerializeAsString());
  const std::vector<float> values(kElements, 0.25f);
  for (v1::StateTensor tensor :
       {v1::STATE_TENSOR_PARAMS, v1::STATE_TENSOR_EXP_AVG, v1::STATE_TENSOR_EXP_AVG_SQ}) {
    v1::ImportStateRequest chunk;
    chunk.mutable_chunk()->set_tensor(tensor);
    chunk.mutable_chunk()->set_data(values.data(), values.size() * sizeof(float));
    messages.push_back(chunk.SerializeAsString());
  }
  v1::ImportStateRequest steps;
  steps.mutable_chunk()->set_tensor(v1::STATE_TENSOR_PAGE_STEPS);
  const uint64_t step = 7;
  steps.mutable_chunk()->set_data(&step, sizeof(step));
  messages.push_back(steps.SerializeAsString());
  const std::vector<std::string> whole = messages;
  messages.push_back(std::string("\xff\xff\xff"));
  v1::ImportStateRequest past_end;
  past_end.mutable_chunk()->set_tensor(v1::STATE_TENSOR_PARAMS);
  past_end.mutable_chunk()->set_offset(kElements);
  past_end.mutable_chunk()->set_data(values.data(), sizeof(float));
  messages.push_back(past_end.SerializeAsString());

  const std::string method = "/optstate.v1.OptimizerState/ImportState";
  grpc::Status status = RawStream(channel, method, messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("message 6 of the ImportState stream"), std::string::npos)
      << status.error_message();
  auto stub = v1::OptimizerState::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::DescribeGroupRequest request;
    request.set_name("imported");
    v1::DescribeGroupResponse response;
    EXPECT_EQ(stub->DescribeGroup(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND)
        << "nothing imported";
  }
  // The same messages without the bad ones import, and the reply parses.
  std::vector<std::string> replies;
  status = RawStream(channel, method, whole, &replies);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(replies.size(), 1u);
  v1::ImportStateResponse reply;
  ASSERT_TRUE(reply.ParseFromString(replies[0]));
  EXPECT_EQ(reply.group().name(), "imported");
  EXPECT_EQ(reply.group().num_elements(), kElements);
  EXPECT_EQ(reply.group().min_step(), step);
}

// A string field that is not UTF-8 makes protobuf's parser log a line; a
// client sending such requests gets INVALID_ARGUMENT each time, and the
// daemon's log at most a line a second of them, not one per call.
TEST(UnaryParseTest, RequestsWithInvalidUtf8DoNotFloodTheLog) {
  const std::string dir = ::testing::TempDir() + "/utf8_log";
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/daemon.log";
  std::filesystem::remove(log);
  auto daemon = DaemonProcess::Start({"--threads=2"}, log);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto channel = OwnChannel((*daemon)->target());
  const absl::Time started = absl::Now();
  constexpr int kCalls = 300;
  for (int i = 0; i < kCalls; ++i) {
    // DescribeGroupRequest{name: "\xff\xfe"}.
    grpc::Status status = RawUnary(channel, "/optstate.v1.OptimizerState/DescribeGroup",
                                   std::string("\x0a\x02\xff\xfe", 4));
    ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  const int64_t seconds = absl::ToInt64Seconds(absl::Now() - started) + 2;
  daemon->reset();  // The log is whole once the daemon has gone.
  std::ifstream in(log);
  int lines = 0;
  for (std::string line; std::getline(in, line);) lines += line.find("UTF-8") != std::string::npos;
  EXPECT_GE(lines, 1);
  EXPECT_LE(lines, seconds) << "of " << kCalls << " calls";
}

}  // namespace
}  // namespace optstate::testing
