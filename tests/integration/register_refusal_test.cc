// A refused RegisterGroup stream leaves no group it created, and a group that
// existed before the stream stays registered; a message after the spec that
// is not a RegisterGroupRequest is refused, never taken for a half-close.
// Against a real optstated process, through gRPC only.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_rpc.h"

namespace optstate::testing {
namespace {

constexpr int kMaxMessageBytes = 1052672;  // The least the daemon accepts.
constexpr uint64_t kPage = 256 * 1024;     // The daemon's default page.

class RegisterRefusalTest : public ::testing::Test {
 public:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(
        {"--threads=2", "--max_message_bytes=" + std::to_string(kMaxMessageBytes)});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    // The client may send more than the daemon takes.
    channel_ = OwnChannel(daemon_->target(), 8 * kMaxMessageBytes);
    stub_ = v1::OptimizerState::NewStub(channel_);
  }

  static v1::RegisterGroupRequest Spec(const std::string& name, uint64_t n, bool values) {
    v1::RegisterGroupRequest r;
    r.mutable_spec()->set_name(name);
    r.mutable_spec()->set_num_elements(n);
    r.mutable_spec()->set_has_initial_values(values);
    return r;
  }
  static v1::RegisterGroupRequest Values(uint64_t offset, const std::vector<float>& v) {
    v1::RegisterGroupRequest r;
    r.mutable_values()->set_offset(offset);
    r.mutable_values()->set_data(
        std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
    return r;
  }

  // One RegisterGroup call carrying these messages' bytes.
  grpc::Status Register(const std::vector<std::string>& messages,
                        v1::RegisterGroupResponse* response = nullptr) {
    std::vector<std::string> replies;
    grpc::Status status =
        RawStream(channel_, "/optstate.v1.OptimizerState/RegisterGroup", messages, &replies);
    if (response != nullptr && !replies.empty()) response->ParseFromString(replies.front());
    return status;
  }
  grpc::Status Register(const std::vector<v1::RegisterGroupRequest>& messages,
                        v1::RegisterGroupResponse* response = nullptr) {
    std::vector<std::string> bytes;
    for (const auto& m : messages) bytes.push_back(m.SerializeAsString());
    return Register(bytes, response);
  }

  grpc::Status Describe(const std::string& name, v1::DescribeGroupResponse* out) {
    grpc::ClientContext context;
    v1::DescribeGroupRequest request;
    request.set_name(name);
    return stub_->DescribeGroup(&context, request, out);
  }

  uint64_t HostBytes() {
    grpc::ClientContext context;
    v1::GetStatsResponse stats;
    EXPECT_TRUE(stub_->GetStats(&context, v1::GetStatsRequest(), &stats).ok());
    return stats.host_bytes();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
};

struct BadStream {
  std::string what;
  grpc::StatusCode expected;
  std::vector<v1::RegisterGroupRequest> after_spec;
  bool with_values = true;
};

TEST_F(RegisterRefusalTest, ARefusedStreamLeavesNoGroupItCreated) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> good(1000, 0.5f);
  std::vector<float> with_nan = good;
  with_nan[17] = nan;
  v1::RegisterGroupRequest odd = Values(0, good);
  odd.mutable_values()->mutable_data()->pop_back();
  v1::RegisterGroupRequest unknown_dtype = Values(0, good);
  unknown_dtype.mutable_values()->set_dtype(static_cast<v1::DType>(7));
  const std::vector<BadStream> table = {
      {"values past the end", grpc::StatusCode::INVALID_ARGUMENT, {Values(2621440, good)}},
      {"values not page aligned", grpc::StatusCode::INVALID_ARGUMENT, {Values(7, good)}},
      {"odd byte count", grpc::StatusCode::INVALID_ARGUMENT, {odd}},
      {"unknown dtype", grpc::StatusCode::INVALID_ARGUMENT, {unknown_dtype}},
      {"a NaN value", grpc::StatusCode::INVALID_ARGUMENT, {Values(0, with_nan)}},
      {"values for a group registered without them",
       grpc::StatusCode::INVALID_ARGUMENT,
       {Values(0, good)},
       /*with_values=*/false},
      {"a second spec", grpc::StatusCode::INVALID_ARGUMENT, {Spec("r2", 1000, true)}},
      {"good values, then a bad chunk",
       grpc::StatusCode::INVALID_ARGUMENT,
       {Values(0, good), Values(7, good)}},
      {"a values message over the size limit",
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       {Values(0, std::vector<float>(kMaxMessageBytes / 4 + 1024, 0.5f))}},
  };
  const uint64_t bytes_before = HostBytes();
  for (const BadStream& bad : table) {
    SCOPED_TRACE(bad.what);
    const uint64_t n = bad.what == "a values message over the size limit" ? 4 * kPage : 1000;
    std::vector<v1::RegisterGroupRequest> stream = {Spec("r2", n, bad.with_values)};
    stream.insert(stream.end(), bad.after_spec.begin(), bad.after_spec.end());
    grpc::Status status = Register(stream);
    EXPECT_EQ(status.error_code(), bad.expected) << status.error_message();
    // A stream gRPC itself cut (the oversized message) is seen by the
    // daemon a moment after the client sees its status.
    v1::DescribeGroupResponse described;
    grpc::Status found = Describe("r2", &described);
    for (int i = 0; i < 100 && found.ok(); ++i) {
      absl::SleepFor(absl::Milliseconds(20));
      found = Describe("r2", &described);
    }
    EXPECT_EQ(found.error_code(), grpc::StatusCode::NOT_FOUND)
        << "the refused stream left its group: " << described.ShortDebugString();
    EXPECT_EQ(HostBytes(), bytes_before);
  }
  // The name is free: a good registration creates it.
  v1::RegisterGroupResponse response;
  ASSERT_TRUE(Register({Spec("r2", 1000, true), Values(0, good)}, &response).ok());
  EXPECT_TRUE(response.created());
  EXPECT_EQ(response.group().pages_awaiting_values(), 0u);
}

TEST_F(RegisterRefusalTest, AGroupThatExistedBeforeARefusedStreamStays) {
  const std::vector<float> good(1000, 0.5f);
  ASSERT_TRUE(Register({Spec("kept", 1000, true), Values(0, good)}).ok());
  grpc::Status status = Register({Spec("kept", 1000, true), Values(7, good)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  v1::DescribeGroupResponse described;
  ASSERT_TRUE(Describe("kept", &described).ok());
  EXPECT_EQ(described.group().info().pages_awaiting_values(), 0u);
  EXPECT_EQ(described.group().info().num_elements(), 1000u);
}

TEST_F(RegisterRefusalTest, AMessageAfterTheSpecThatDoesNotParseIsRefusedByName) {
  const std::string spec = Spec("r1", 1000, true).SerializeAsString();
  // Field 2 (values) announces 64 bytes and carries 3; then bytes that are no message.
  const std::vector<std::string> malformed = {std::string("\xff\xff\xff"), std::string("\x12\x40"
                                                                                       "abc",
                                                                                       5)};
  for (const std::string& bad : malformed) {
    v1::RegisterGroupResponse response;
    grpc::Status status = Register({spec, bad}, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message() << " reply: " << response.ShortDebugString();
    EXPECT_NE(status.error_message().find("RegisterGroupRequest"), std::string::npos)
        << status.error_message();
    v1::DescribeGroupResponse described;
    EXPECT_EQ(Describe("r1", &described).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // The same as the first message.
  grpc::Status status = Register({std::string("\xff\xff\xff")});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("RegisterGroupRequest"), std::string::npos)
      << status.error_message();
}

TEST_F(RegisterRefusalTest, AGroupStillAwaitingValuesIsNotExportedOrSealedForAMove) {
  // Its second page has no values: an export would give it as zeros, which
  // an import would take as values (and a move would then train from them).
  const std::vector<float> page(kPage, 0.5f);
  v1::RegisterGroupResponse response;
  ASSERT_TRUE(Register({Spec("part", kPage + 10, true), Values(0, page)}, &response).ok());
  ASSERT_EQ(response.group().pages_awaiting_values(), 1u);
  for (const std::string moved_to : {"", "127.0.0.1:1"}) {
    grpc::ClientContext context;
    v1::ExportStateRequest request;
    request.set_name("part");
    request.set_moved_to(moved_to);
    auto reader = stub_->ExportState(&context, request);
    v1::ExportStateResponse message;
    EXPECT_FALSE(reader->Read(&message)) << "nothing exported";
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << moved_to;
    EXPECT_NE(status.error_message().find("1 pages with no initial values yet"), std::string::npos)
        << status.error_message();
  }
  v1::DescribeGroupResponse described;
  ASSERT_TRUE(Describe("part", &described).ok());
  EXPECT_TRUE(described.group().info().moved_to().empty()) << "not sealed";
  // With every value uploaded it exports.
  ASSERT_TRUE(
      Register({Spec("part", kPage + 10, true), Values(kPage, std::vector<float>(10, 0.5f))}).ok());
  grpc::ClientContext context;
  v1::ExportStateRequest request;
  request.set_name("part");
  auto reader = stub_->ExportState(&context, request);
  v1::ExportStateResponse message;
  int messages = 0;
  while (reader->Read(&message)) ++messages;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_GT(messages, 1);
}

}  // namespace
}  // namespace optstate::testing
