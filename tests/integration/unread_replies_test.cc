// A Step stream whose client sends and never reads its replies: the daemon
// reads no further message once the stream holds 64 MiB of requests and
// replies (one message always), and once every stream together holds
// --grpc_buffer_bytes of them, so such clients cannot take the daemon's
// memory (sixteen 48 MiB replies a stream were held before: +797 MiB for
// one stream). Counted by the replays the daemon answered: each message
// replays step 1 of a group already at step 1, so each one the daemon read
// is answered, and counted in chunks_replayed, whether or not it is read.
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_rpc.h"

namespace optstate::testing {
namespace {

// Streams that each send `messages` replays of step 1 of `group` (of `n`
// elements) and read nothing; the writers stop when the daemon stops reading
// (flow control) and are let go by cancelling the calls.
class UnreadStreams {
 public:
  UnreadStreams(const std::string& target, const std::string& group, uint64_t n, int streams,
                int messages) {
    for (int s = 0; s < streams; ++s) {
      auto& one = streams_.emplace_back(std::make_unique<One>());
      one->stub = v1::OptimizerState::NewStub(OwnChannel(target));
      one->stream = one->stub->Step(&one->context);
      one->writer = std::thread([&one = *one, group, n, messages] {
        v1::StepRequest request;
        request.set_group(group);
        request.set_step(1);
        request.set_gradient(std::string(n * sizeof(float), '\0'));
        for (int i = 0; i < messages && one.stream->Write(request); ++i) {
        }
      });
    }
  }
  ~UnreadStreams() {
    for (auto& one : streams_) one->context.TryCancel();
    for (auto& one : streams_) {
      one->writer.join();
      one->stream->Finish().ok();
    }
  }

 private:
  struct One {
    std::unique_ptr<v1::OptimizerState::Stub> stub;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream;
    std::thread writer;
  };
  std::vector<std::unique_ptr<One>> streams_;
};

uint64_t ReplaysOf(Client& client, const std::string& group) {
  absl::StatusOr<Stats> stats = client.GetStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (!stats.ok()) return 0;
  for (const GroupStats& g : stats->groups) {
    if (g.info.name == group) return g.chunks_replayed;
  }
  ADD_FAILURE() << "no group " << group;
  return 0;
}

// Registers `group` of `n` elements and applies its step 1.
void StepOnce(Client& client, const std::string& group, uint64_t n) {
  ASSERT_TRUE(client.RegisterGroup(group, n).ok());
  std::vector<float> gradient(n, 0.5f), params(n);
  ASSERT_TRUE(client.Step(group, 1, gradient, absl::MakeSpan(params)).ok());
}

TEST(UnreadRepliesTest, OneStreamHoldsAtMostItsLimitOfReplies) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  const uint64_t n = 12 << 20;  // 48 MiB of gradient a message, 48 MiB of params a reply.
  StepOnce(**client, "big", n);
  const uint64_t before = ReplaysOf(**client, "big");
  {
    UnreadStreams unread((*daemon)->target(), "big", n, 1, 20);
    absl::SleepFor(absl::Seconds(4));
    const uint64_t answered = ReplaysOf(**client, "big") - before;
    // Two messages reach 64 MiB; the third read may have begun before the
    // second was counted. Before the limit: 16.
    EXPECT_GE(answered, 1u);
    EXPECT_LE(answered, 3u);
  }
}

TEST(UnreadRepliesTest, AllStreamsTogetherHoldAtMostTheBufferBytes) {
  // 128 MiB, the least --grpc_buffer_bytes allows with 64 MiB messages.
  auto daemon = DaemonProcess::Start({"--threads=2", "--grpc_buffer_bytes=134217728"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  const uint64_t n = 1 << 20;  // 4 MiB a message, 4 MiB a reply.
  StepOnce(**client, "small", n);
  const uint64_t before = ReplaysOf(**client, "small");
  constexpr int kStreams = 12;
  {
    UnreadStreams unread((*daemon)->target(), "small", n, kStreams, 16);
    absl::SleepFor(absl::Seconds(4));
    const uint64_t answered = ReplaysOf(**client, "small") - before;
    // 128 MiB of 4 MiB messages and replies, plus what each stream may read
    // past it (one message, and one read under way as another finished):
    // 32 + 2 a stream. Each stream alone would hold 16 (12 x 16 = 192).
    EXPECT_GE(answered, static_cast<uint64_t>(kStreams));
    EXPECT_LE(answered, 32u + 2u * kStreams);
  }
  // The streams' bytes are given back when they end: a stepping client is
  // not held up by them.
  std::vector<float> gradient(n, 0.5f), params(n);
  EXPECT_TRUE((*client)->Step("small", 2, gradient, absl::MakeSpan(params)).ok());
}

}  // namespace
}  // namespace optstate::testing
