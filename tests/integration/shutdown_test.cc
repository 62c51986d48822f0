// SIGTERM ends every open stream (Step, RegisterGroup, ImportState,
// ExportState) at once with UNAVAILABLE saying the daemon is shutting down,
// and the daemon exits promptly: idle streams do not hold it for the grace
// period. A unary call under way (a Checkpoint being written) is answered
// with its outcome; one waiting for a step that cannot come any more, and
// one made during the shutdown, get UNAVAILABLE.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_rpc.h"
#include "tests/testing/reference_adamw.h"

namespace optstate::testing {
namespace {

constexpr int kChannels = 10;
constexpr int kStreamsPerChannel = 100;

struct OpenStream {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::StepRequest, v1::StepResponse>> call;
  v1::StepResponse reply;
  grpc::Status status;
};

// Waits for `n` completions on `cq`; false if one failed or time ran out.
bool Drain(grpc::CompletionQueue* cq, int n, absl::Duration timeout, int* failed = nullptr) {
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  for (int i = 0; i < n; ++i) {
    void* tag;
    bool ok;
    if (cq->AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) return false;
    if (!ok && failed != nullptr) ++*failed;
  }
  return true;
}

TEST(ShutdownTest, AThousandIdleStreamsDoNotHoldTheExit) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < kChannels; ++c) channels.push_back(OwnChannel((*daemon)->target()));
  auto stub = v1::OptimizerState::NewStub(channels[0]);
  {
    grpc::ClientContext context;
    v1::RegisterGroupResponse response;
    auto writer = stub->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest request;
    request.mutable_spec()->set_name("g");
    request.mutable_spec()->set_num_elements(16);
    ASSERT_TRUE(writer->Write(request));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  // Every stream carries one step (so the daemon surely holds it), then idles.
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<OpenStream>> streams;
  for (int c = 0; c < kChannels; ++c) {
    auto channel_stub = v1::OptimizerState::NewStub(channels[c]);
    for (int s = 0; s < kStreamsPerChannel; ++s) {
      auto stream = std::make_unique<OpenStream>();
      stream->call = channel_stub->AsyncStep(&stream->context, &cq, stream.get());
      streams.push_back(std::move(stream));
    }
  }
  const int n = static_cast<int>(streams.size());
  int failed = 0;
  ASSERT_TRUE(Drain(&cq, n, absl::Seconds(30), &failed));
  ASSERT_EQ(failed, 0);
  v1::StepRequest request;
  request.set_group("g");
  request.set_step(1);
  request.set_gradient(std::string(16 * sizeof(float), '\0'));
  for (auto& s : streams) s->call->Write(request, s.get());
  ASSERT_TRUE(Drain(&cq, n, absl::Seconds(30), &failed));
  for (auto& s : streams) s->call->Read(&s->reply, s.get());
  ASSERT_TRUE(Drain(&cq, n, absl::Seconds(30), &failed));
  ASSERT_EQ(failed, 0) << "not every stream was answered";
  for (auto& s : streams) s->call->Finish(&s->status, s.get());
  // And a registration stream left open after its spec.
  grpc::ClientContext register_context;
  v1::RegisterGroupResponse register_response;
  auto registering = stub->RegisterGroup(&register_context, &register_response);
  {
    v1::RegisterGroupRequest spec;
    spec.mutable_spec()->set_name("open");
    spec.mutable_spec()->set_num_elements(16);
    ASSERT_TRUE(registering->Write(spec));
  }

  const absl::Time signalled = absl::Now();
  absl::StatusOr<int> exit_code = (*daemon)->Stop(/*timeout_seconds=*/10);
  const absl::Duration took = absl::Now() - signalled;
  ASSERT_TRUE(exit_code.ok()) << exit_code.status() << " after " << took;
  std::cout << "SIGTERM to exit: " << took << " with " << n << " idle streams\n";
  EXPECT_EQ(*exit_code, 0);
  EXPECT_LT(took, absl::Seconds(2)) << "exit took " << took << " with " << n << " idle streams";
  ASSERT_TRUE(Drain(&cq, n, absl::Seconds(10)));
  int shutting_down = 0;
  for (auto& s : streams) {
    EXPECT_EQ(s->status.error_code(), grpc::StatusCode::UNAVAILABLE) << s->status.error_message();
    if (s->status.error_message().find("shutting down") != std::string::npos) ++shutting_down;
  }
  EXPECT_EQ(shutting_down, n) << "streams must be told the daemon is shutting down";
  grpc::Status registration = registering->Finish();
  EXPECT_EQ(registration.error_code(), grpc::StatusCode::UNAVAILABLE)
      << registration.error_message();
  EXPECT_NE(registration.error_message().find("shutting down"), std::string::npos)
      << registration.error_message();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

// An ImportState stream open at SIGTERM (header and a chunk sent, not ended)
// is told the daemon is shutting down, the daemon exits promptly, and the
// final checkpoint holds no trace of the half-finished import: the restarted
// daemon does not know the group.
TEST(ShutdownTest, AnOpenImportStateStreamIsEndedAndDoesNotHoldTheExit) {
  const std::string state_dir =
      ::testing::TempDir() + "/shutdown-import-state-" + std::to_string(getpid());
  std::filesystem::remove_all(state_dir);
  auto daemon = DaemonProcess::Start({"--threads=2", "--state_dir=" + state_dir});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = v1::OptimizerState::NewStub(OwnChannel((*daemon)->target()));
  const uint64_t n = 64;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ImportStateResponse response;
  auto writer = stub->ImportState(&context, &response);
  v1::ImportStateRequest header;
  header.mutable_header()->set_name("importing");
  header.mutable_header()->set_num_elements(n);
  ASSERT_TRUE(writer->Write(header));
  v1::ImportStateRequest params;
  params.mutable_chunk()->set_tensor(v1::STATE_TENSOR_PARAMS);
  params.mutable_chunk()->set_data(std::string(n * sizeof(float), '\0'));
  ASSERT_TRUE(writer->Write(params));
  // The daemon has the stream once it answers a call made after it.
  {
    grpc::ClientContext stats_context;
    v1::GetStatsResponse stats;
    ASSERT_TRUE(stub->GetStats(&stats_context, v1::GetStatsRequest(), &stats).ok());
  }

  const absl::Time signalled = absl::Now();
  absl::StatusOr<int> exit_code = (*daemon)->Stop(/*timeout_seconds=*/10);
  const absl::Duration took = absl::Now() - signalled;
  ASSERT_TRUE(exit_code.ok()) << exit_code.status() << " after " << took;
  EXPECT_EQ(*exit_code, 0);
  EXPECT_LT(took, absl::Seconds(2)) << "exit took " << took << " with an open import";
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("shutting down"), std::string::npos)
      << status.error_message();

  auto restarted = DaemonProcess::Start({"--threads=2", "--state_dir=" + state_dir});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  auto restarted_stub = v1::OptimizerState::NewStub(OwnChannel((*restarted)->target()));
  grpc::ClientContext describe;
  v1::DescribeGroupRequest name;
  name.set_name("importing");
  v1::DescribeGroupResponse described;
  EXPECT_EQ(restarted_stub->DescribeGroup(&describe, name, &described).error_code(),
            grpc::StatusCode::NOT_FOUND);
  absl::StatusOr<int> restarted_exit = (*restarted)->Stop();
  ASSERT_TRUE(restarted_exit.ok()) << restarted_exit.status();
  EXPECT_EQ(*restarted_exit, 0);
  std::filesystem::remove_all(state_dir);
}

// An ExportState stream mid-way at SIGTERM: its client, reading on, gets
// the messages already on their way, then UNAVAILABLE "shutting down", and
// the daemon exits promptly; one whose client has stopped reading does not
// hold the exit either.
TEST(ShutdownTest, AnExportStateStreamIsEndedAndDoesNotHoldTheExit) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = v1::OptimizerState::NewStub(OwnChannel((*daemon)->target()));
  const uint64_t n = 8 << 20;  // 96 MiB of state: 129 messages.
  {
    grpc::ClientContext context;
    v1::RegisterGroupResponse response;
    auto writer = stub->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest request;
    request.mutable_spec()->set_name("exported");
    request.mutable_spec()->set_num_elements(n);
    ASSERT_TRUE(writer->Write(request));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  v1::ExportStateRequest request;
  request.set_name("exported");
  // One client that has stopped reading after the header...
  grpc::ClientContext stalled_context;
  auto stalled = stub->ExportState(&stalled_context, request);
  v1::ExportStateResponse stalled_response;
  ASSERT_TRUE(stalled->Read(&stalled_response));
  // ...and one reading 10 ms apart, until the signal, then as fast as it can.
  std::atomic<bool> signalled{false};
  std::atomic<int> messages{0};
  grpc::ClientContext context;
  auto reader = stub->ExportState(&context, request);
  grpc::Status status;
  std::thread reading([&] {
    v1::ExportStateResponse response;
    while (reader->Read(&response)) {
      ++messages;
      if (!signalled) absl::SleepFor(absl::Milliseconds(10));
    }
    status = reader->Finish();
  });
  while (messages < 10) absl::SleepFor(absl::Milliseconds(1));

  signalled = true;
  const absl::Time signalled_at = absl::Now();
  absl::StatusOr<int> exit_code = (*daemon)->Stop(/*timeout_seconds=*/10);
  const absl::Duration took = absl::Now() - signalled_at;
  reading.join();
  ASSERT_TRUE(exit_code.ok()) << exit_code.status() << " after " << took;
  EXPECT_EQ(*exit_code, 0);
  EXPECT_LT(took, absl::Seconds(2)) << "exit took " << took << " with two exports open";
  EXPECT_LT(messages, 129) << "the export ended whole: SIGTERM came too late to test anything";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("shutting down"), std::string::npos)
      << status.error_message();
  while (stalled->Read(&stalled_response)) {
  }
  EXPECT_FALSE(stalled->Finish().ok());
}

// A trainer mid-stream when SIGTERM comes: every reply it gets is a whole,
// correctly applied step (the messages already on a worker finish and are
// answered), then the stream ends with UNAVAILABLE "shutting down".
TEST(ShutdownTest, WorkUnderWayIsAnsweredThenTheStreamEnds) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = v1::OptimizerState::NewStub(OwnChannel((*daemon)->target()));
  constexpr uint64_t kElements = 1 << 20;  // 4 MiB per step message.
  {
    grpc::ClientContext context;
    v1::RegisterGroupResponse response;
    auto writer = stub->RegisterGroup(&context, &response);
    v1::RegisterGroupRequest request;
    request.mutable_spec()->set_name("big");
    request.mutable_spec()->set_num_elements(kElements);
    ASSERT_TRUE(writer->Write(request));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  std::vector<float> gradient(kElements);
  for (uint64_t i = 0; i < kElements; ++i) gradient[i] = 1e-3f * static_cast<float>(i % 97) - 0.04f;
  constexpr uint64_t kSteps = 12;
  grpc::ClientContext context;
  auto stream = stub->Step(&context);
  std::thread writer([&] {
    for (uint64_t t = 1; t <= kSteps; ++t) {
      v1::StepRequest request;
      request.set_group("big");
      request.set_step(t);
      request.set_gradient(
          std::string(reinterpret_cast<const char*>(gradient.data()), kElements * sizeof(float)));
      if (!stream->Write(request)) return;
    }
    stream->WritesDone();
  });
  std::thread stopper;
  absl::StatusOr<int> exit_code;
  absl::Duration took;
  // Replies are kept and checked after the stream ends: the client reads at
  // once, so the exit time is the daemon's.
  std::vector<v1::StepResponse> replies;
  v1::StepResponse response;
  while (stream->Read(&response)) {
    replies.push_back(response);
    if (replies.size() == 1) {
      stopper = std::thread([&] {
        const absl::Time signalled = absl::Now();
        exit_code = (*daemon)->Stop(10);
        took = absl::Now() - signalled;
      });
    }
  }
  grpc::Status status = stream->Finish();
  writer.join();
  ASSERT_TRUE(stopper.joinable());
  stopper.join();
  std::cout << replies.size() << " of " << kSteps << " steps answered; SIGTERM to exit " << took
            << "\n";
  ReferenceState reference;
  reference.params.assign(kElements, 0.0);
  reference.exp_avg.assign(kElements, 0.0);
  reference.exp_avg_sq.assign(kElements, 0.0);
  const std::vector<double> grad64(gradient.begin(), gradient.end());
  for (uint64_t t = 1; t <= replies.size(); ++t) {
    const v1::StepResponse& reply = replies[t - 1];
    ASSERT_EQ(reply.step(), t);
    ASSERT_EQ(reply.params().size(), kElements * sizeof(float));
    ReferenceAdamWStep({}, t, grad64, &reference);
    std::vector<float> params(kElements);
    std::memcpy(params.data(), reply.params().data(), reply.params().size());
    EXPECT_LE(RelativeL2Error(params, reference.params), 1e-6) << "step " << t;
  }
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  EXPECT_LT(took, absl::Seconds(2));
  if (replies.size() < kSteps) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_NE(status.error_message().find("shutting down"), std::string::npos)
        << status.error_message();
  }
}

// Registers `name` with `n` elements of zeros.
void RegisterZeros(v1::OptimizerState::Stub* stub, const std::string& name, uint64_t n) {
  grpc::ClientContext context;
  v1::RegisterGroupResponse response;
  auto writer = stub->RegisterGroup(&context, &response);
  v1::RegisterGroupRequest request;
  request.mutable_spec()->set_name(name);
  request.mutable_spec()->set_num_elements(n);
  ASSERT_TRUE(writer->Write(request));
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
}

// A Checkpoint being written when SIGTERM comes is answered with its id (it
// is durable: the restart restores a checkpoint at least that new), not
// cancelled; a call made meanwhile is told the daemon is shutting down. The
// writer is held (the test pause hook) from before the signal until after
// that call, so neither depends on how fast the disk is.
TEST(ShutdownTest, ACheckpointBeingWrittenIsAnsweredAndNewCallsAreRefused) {
  const std::string state_dir =
      ::testing::TempDir() + "/shutdown-checkpoint-" + std::to_string(getpid());
  const std::string paused = state_dir + ".paused";
  std::filesystem::remove_all(state_dir);
  std::filesystem::remove(paused);
  setenv("OPTSTATE_TEST_CHECKPOINT_PAUSE", "1:manifest_written", 1);
  setenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE", paused.c_str(), 1);
  setenv("OPTSTATE_TEST_CHECKPOINT_RESUME", "1", 1);
  auto daemon = DaemonProcess::Start({"--threads=2", "--state_dir=" + state_dir});
  unsetenv("OPTSTATE_TEST_CHECKPOINT_PAUSE");
  unsetenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE");
  unsetenv("OPTSTATE_TEST_CHECKPOINT_RESUME");
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = v1::OptimizerState::NewStub(OwnChannel((*daemon)->target()));
  RegisterZeros(stub.get(), "big", 1 << 20);
  grpc::Status checkpointed;
  v1::CheckpointResponse checkpoint;
  std::thread calling([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    checkpointed = stub->Checkpoint(&context, v1::CheckpointRequest(), &checkpoint);
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!std::filesystem::exists(paused) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(std::filesystem::exists(paused)) << "the writer never reached its pause";
  absl::StatusOr<int> exit_code;
  std::thread stopping([&] { exit_code = (*daemon)->Stop(/*timeout_seconds=*/60); });
  // The signal is taken within a few ms; the call below must come after it.
  absl::SleepFor(absl::Milliseconds(500));
  grpc::ClientContext stats_context;
  v1::GetStatsResponse stats;
  grpc::Status during = stub->GetStats(&stats_context, v1::GetStatsRequest(), &stats);
  std::filesystem::remove(paused);  // The writer goes on.
  calling.join();
  stopping.join();
  EXPECT_EQ(during.error_code(), grpc::StatusCode::UNAVAILABLE) << during.error_message();
  EXPECT_NE(during.error_message().find("shutting down"), std::string::npos)
      << during.error_message();
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.error_code() << ": "
                                 << checkpointed.error_message();
  EXPECT_FALSE(checkpoint.id().empty());
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);

  auto restarted = DaemonProcess::Start({"--threads=2", "--state_dir=" + state_dir});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  auto restarted_stub = v1::OptimizerState::NewStub(OwnChannel((*restarted)->target()));
  grpc::ClientContext restored_context;
  v1::GetStatsResponse restored;
  ASSERT_TRUE(restarted_stub->GetStats(&restored_context, v1::GetStatsRequest(), &restored).ok());
  EXPECT_GE(restored.restored_checkpoint_id(), checkpoint.id());  // Names of 16 digits.
  EXPECT_EQ(restored.num_groups(), 1u);
  absl::StatusOr<int> restarted_exit = (*restarted)->Stop();
  ASSERT_TRUE(restarted_exit.ok()) << restarted_exit.status();
  std::filesystem::remove_all(state_dir);
}

// A Checkpoint waiting for a step that no stream will bring any more is
// answered UNAVAILABLE (resend the steps and retry against the restarted
// daemon) at SIGTERM, and does not hold the exit until its deadline.
TEST(ShutdownTest, ACheckpointWaitingForAStepIsToldToRetryAndDoesNotHoldTheExit) {
  const std::string state_dir =
      ::testing::TempDir() + "/shutdown-waiting-" + std::to_string(getpid());
  std::filesystem::remove_all(state_dir);
  auto daemon = DaemonProcess::Start({"--threads=2", "--state_dir=" + state_dir});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = v1::OptimizerState::NewStub(OwnChannel((*daemon)->target()));
  RegisterZeros(stub.get(), "g", 16);
  grpc::Status waited;
  std::thread calling([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::CheckpointRequest request;
    request.set_wait_for_step(3);
    v1::CheckpointResponse response;
    waited = stub->Checkpoint(&context, request, &response);
  });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time signalled = absl::Now();
  absl::StatusOr<int> exit_code = (*daemon)->Stop(/*timeout_seconds=*/20);
  const absl::Duration took = absl::Now() - signalled;
  calling.join();
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::UNAVAILABLE) << waited.error_message();
  EXPECT_NE(waited.error_message().find("shutting down"), std::string::npos)
      << waited.error_message();
  std::filesystem::remove_all(state_dir);
}

}  // namespace
}  // namespace optstate::testing
