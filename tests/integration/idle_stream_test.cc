// --stream_idle_timeout ends a Step stream on which nothing has happened for
// that long with UNAVAILABLE saying it was idle (and RegisterGroup,
// ImportState and ExportState streams the same way); a stream in use is
// never ended, and optstate::Client steps on across such an end as if it had
// not happened.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/random_tensors.h"
#include "tests/testing/raw_rpc.h"
#include "tests/testing/reference_adamw.h"

namespace optstate::testing {
namespace {

class IdleStreamTest : public ::testing::Test {
 public:
  void SetUp() override {
    auto daemon = DaemonProcess::Start({"--threads=2", "--stream_idle_timeout=1s"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    stub_ = v1::OptimizerState::NewStub(OwnChannel(daemon_->target()));
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::OptimizerState::Stub> stub_;
};

TEST_F(IdleStreamTest, AStreamThatSendsNothingIsEndedAsIdle) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  const absl::Time opened = absl::Now();
  auto stream = stub_->Step(&context);
  v1::StepResponse response;
  EXPECT_FALSE(stream->Read(&response));
  grpc::Status status = stream->Finish();
  const absl::Duration took = absl::Now() - opened;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("idle"), std::string::npos) << status.error_message();
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(5));
}

// A registration stream left open after its spec is ended the same way; it
// did not end OK, so the group it created is removed.
TEST_F(IdleStreamTest, AnIdleRegisterGroupStreamIsEndedAndItsGroupRemoved) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::RegisterGroupResponse response;
  auto writer = stub_->RegisterGroup(&context, &response);
  v1::RegisterGroupRequest request;
  request.mutable_spec()->set_name("left.open");
  request.mutable_spec()->set_num_elements(64);
  ASSERT_TRUE(writer->Write(request));
  const absl::Time opened = absl::Now();
  grpc::Status status = writer->Finish();
  const absl::Duration took = absl::Now() - opened;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("idle"), std::string::npos) << status.error_message();
  EXPECT_GE(took, absl::Milliseconds(800));
  EXPECT_LT(took, absl::Seconds(5));
  grpc::ClientContext describe;
  v1::DescribeGroupRequest name;
  name.set_name("left.open");
  v1::DescribeGroupResponse described;
  EXPECT_EQ(stub_->DescribeGroup(&describe, name, &described).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// An ImportState stream left open after its header and some chunks is ended
// the same way, and the import it gathered is dropped: no group of that name
// is visible, and the memory set aside for it is given back.
TEST_F(IdleStreamTest, AnIdleImportStateStreamIsEndedAndLeavesNoGroup) {
  auto client = Client::Connect(daemon_->target());
  ASSERT_TRUE(client.ok());
  absl::StatusOr<Stats> before = (*client)->GetStats();
  ASSERT_TRUE(before.ok());
  const uint64_t n = 64;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::ImportStateResponse response;
  auto writer = stub_->ImportState(&context, &response);
  v1::ImportStateRequest header;
  header.mutable_header()->set_name("half.imported");
  header.mutable_header()->set_num_elements(n);
  ASSERT_TRUE(writer->Write(header));
  v1::ImportStateRequest params;
  params.mutable_chunk()->set_tensor(v1::STATE_TENSOR_PARAMS);
  params.mutable_chunk()->set_offset(0);
  params.mutable_chunk()->set_data(std::string(n * sizeof(float), '\0'));
  ASSERT_TRUE(writer->Write(params));
  const absl::Time opened = absl::Now();
  grpc::Status status = writer->Finish();
  const absl::Duration took = absl::Now() - opened;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("idle"), std::string::npos) << status.error_message();
  EXPECT_GE(took, absl::Milliseconds(800));
  EXPECT_LT(took, absl::Seconds(5));
  absl::StatusOr<GroupInfo> info = (*client)->DescribeGroup("half.imported");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound) << info.status();
  absl::StatusOr<Stats> after = (*client)->GetStats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->host_bytes, before->host_bytes);
}

// An import whose messages keep coming, each within the idle timeout, is
// not ended, and installs its group when it ends whole.
TEST_F(IdleStreamTest, AnImportStateStreamInUseIsNotEnded) {
  const uint64_t n = 64;
  grpc::ClientContext context;
  v1::ImportStateResponse response;
  auto writer = stub_->ImportState(&context, &response);
  std::vector<v1::ImportStateRequest> requests(5);
  requests[0].mutable_header()->set_name("slow.import");
  requests[0].mutable_header()->set_num_elements(n);
  const uint64_t step = 2;
  requests[1].mutable_chunk()->set_tensor(v1::STATE_TENSOR_PAGE_STEPS);
  requests[1].mutable_chunk()->set_data(std::string(reinterpret_cast<const char*>(&step), 8));
  const v1::StateTensor tensors[] = {v1::STATE_TENSOR_PARAMS, v1::STATE_TENSOR_EXP_AVG,
                                     v1::STATE_TENSOR_EXP_AVG_SQ};
  for (int i = 0; i < 3; ++i) {
    requests[2 + i].mutable_chunk()->set_tensor(tensors[i]);
    requests[2 + i].mutable_chunk()->set_data(std::string(n * sizeof(float), '\0'));
  }
  // Five messages 400 ms apart: 2 s on one stream, never 1 s without one.
  for (const auto& request : requests) {
    ASSERT_TRUE(writer->Write(request));
    absl::SleepFor(absl::Milliseconds(400));
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.group().min_step(), step);
}

// An ExportState stream whose client stops reading is ended once a message
// has waited for the client for the idle timeout: reading on, the client
// gets what was already on its way, then UNAVAILABLE saying the stream was
// idle, never the whole group (96 MiB, far more than the connection buffers).
TEST_F(IdleStreamTest, AnExportStateStreamWhoseClientStopsReadingIsEnded) {
  auto client = Client::Connect(daemon_->target());
  ASSERT_TRUE(client.ok());
  const uint64_t n = 8 << 20;
  ASSERT_TRUE((*client)->RegisterGroup("exported", n).ok());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ExportStateRequest request;
  request.set_name("exported");
  auto reader = stub_->ExportState(&context, request);
  v1::ExportStateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_TRUE(response.has_header());
  absl::SleepFor(absl::Seconds(3));  // Not reading, past the 1 s timeout.
  uint64_t bytes = 0;
  while (reader->Read(&response)) bytes += response.chunk().data().size();
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("idle"), std::string::npos) << status.error_message();
  EXPECT_LT(bytes, 3 * n * sizeof(float));
}

// A Step stream whose client sends and stops reading is ended once a reply
// has waited for the client for the idle timeout (the daemon then holds one
// reply for it, not the kMaxPinnedChunks messages a stream may pin): reading
// on, the client gets the replies already on their way, then UNAVAILABLE
// saying the stream was idle, never all of its 40 messages' replies.
TEST_F(IdleStreamTest, AStepStreamWhoseClientStopsReadingIsEnded) {
  auto client = Client::Connect(daemon_->target());
  ASSERT_TRUE(client.ok());
  const uint64_t n = 1 << 20;  // 4 MiB of gradient a message, 4 MiB of params a reply.
  ASSERT_TRUE((*client)->RegisterGroup("unread", n).ok());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub_->Step(&context);
  constexpr int kMessages = 40;
  std::thread writer([&] {
    v1::StepRequest request;
    request.set_group("unread");
    request.set_step(1);  // The first applies; the rest are replays of it.
    request.set_gradient(std::string(n * sizeof(float), '\0'));
    for (int i = 0; i < kMessages && stream->Write(request); ++i) {
    }
    stream->WritesDone();
  });
  // Not reading: the reply in flight waits past the 1 s timeout (a margin of
  // 5 s for a slow machine: once reading starts, the stream is busy again).
  absl::SleepFor(absl::Seconds(6));
  int replies = 0;
  v1::StepResponse response;
  while (stream->Read(&response)) ++replies;
  writer.join();
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("idle"), std::string::npos) << status.error_message();
  EXPECT_LT(replies, kMessages);
  // The group is whole and steps on.
  std::vector<float> params(n);
  EXPECT_TRUE((*client)->Step("unread", 2, std::vector<float>(n, 0.0f), absl::MakeSpan(params))
                  .ok());
}

TEST_F(IdleStreamTest, AStreamInUseIsNotEnded) {
  {
    grpc::ClientContext context;
    v1::RegisterGroupResponse response;
    auto writer = stub_->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest request;
    request.mutable_spec()->set_name("busy");
    request.mutable_spec()->set_num_elements(8);
    ASSERT_TRUE(writer->Write(request));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  grpc::ClientContext context;
  auto stream = stub_->Step(&context);
  // Eight steps 400 ms apart: 3.2 s on one stream, never 1 s without a message.
  for (uint64_t t = 1; t <= 8; ++t) {
    v1::StepRequest request;
    request.set_group("busy");
    request.set_step(t);
    request.set_gradient(std::string(8 * sizeof(float), '\0'));
    ASSERT_TRUE(stream->Write(request));
    v1::StepResponse response;
    ASSERT_TRUE(stream->Read(&response)) << "ended at step " << t;
    EXPECT_EQ(response.step(), t);
    absl::SleepFor(absl::Milliseconds(400));
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(IdleStreamTest, TheClientStepsOnAfterIdleTimeouts) {
  auto client = Client::Connect(daemon_->target());
  ASSERT_TRUE(client.ok());
  std::mt19937 rng(14);
  const size_t n = 1000;
  std::vector<float> initial = RandomNormal(rng, n, 1.0f);
  ASSERT_TRUE((*client)->RegisterGroup("w", initial).ok());
  ReferenceState reference;
  reference.params.assign(initial.begin(), initial.end());
  reference.exp_avg.assign(n, 0.0);
  reference.exp_avg_sq.assign(n, 0.0);
  std::vector<float> params(n);
  for (uint64_t t = 1; t <= 3; ++t) {
    std::vector<float> grad = RandomNormal(rng, n, 1e-2f);
    ASSERT_TRUE((*client)->Step("w", t, grad, absl::MakeSpan(params)).ok()) << "step " << t;
    ReferenceAdamWStep({}, t, std::vector<double>(grad.begin(), grad.end()), &reference);
    EXPECT_LE(RelativeL2Error(params, reference.params), 1e-6) << "step " << t;
    absl::SleepFor(absl::Milliseconds(1500));  // Past the idle timeout.
  }
}

}  // namespace
}  // namespace optstate::testing
