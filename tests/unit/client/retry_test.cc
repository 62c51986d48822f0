// The client's one retry loop: which failures it retries, how often, and
// what it says when every attempt failed; and how gRPC's statuses are read.
#include "client/call/retry.h"

#include <gtest/gtest.h>

#include <vector>

#include "client/call/status.h"

namespace optstate::client_internal {
namespace {

ClientOptions Quick(int attempts) {
  ClientOptions options;
  options.max_attempts = attempts;
  options.initial_backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(2);
  return options;
}

TEST(WithRetriesTest, RetriesTransientFailuresUntilOneSucceeds) {
  std::vector<int> attempts;
  absl::Status status = WithRetries(Quick(5), nullptr, [&](int n) {
    attempts.push_back(n);
    return n < 2 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(attempts, (std::vector<int>{0, 1, 2}));
}

TEST(WithRetriesTest, ReturnsAPermanentFailureAtOnce) {
  int calls = 0;
  absl::Status status = WithRetries(Quick(5), nullptr, [&](int) {
    ++calls;
    return absl::NotFoundError("no such group");
  });
  EXPECT_EQ(status, absl::NotFoundError("no such group"));
  EXPECT_EQ(calls, 1);
}

TEST(WithRetriesTest, AfterTheLastAttemptSaysHowManyWhenNamed) {
  int calls = 0;
  auto failing = [&](int) {
    ++calls;
    return absl::DeadlineExceededError("slow");
  };
  EXPECT_EQ(WithRetries(Quick(3), nullptr, failing), absl::DeadlineExceededError("slow"));
  EXPECT_EQ(calls, 3);
  absl::Status named = WithRetries(Quick(3), nullptr, failing, "step 7 (wire)");
  EXPECT_EQ(named.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(named.message(), "step 7 (wire) failed after 3 attempts: slow");
  EXPECT_EQ(calls, 6);
}

// ClientOptions::interrupted is asked during the waits between attempts (in
// slices of at most 100 ms): true ends the call with CANCELLED at once, well
// before reconnect_timeout, naming the attempts made and the last failure.
TEST(WithRetriesTest, AnInterruptionDuringAWaitEndsTheCallCancelled) {
  ClientOptions options = Quick(2);
  options.initial_backoff = options.max_backoff = absl::Seconds(1);
  options.reconnect_timeout = absl::Minutes(1);
  int asked = 0;
  options.interrupted = [&] { return ++asked == 3; };
  int calls = 0;
  const absl::Time start = absl::Now();
  absl::Status status = WithRetries(
      options, nullptr,
      [&](int) {
        ++calls;
        return absl::UnavailableError("connection refused");
      },
      "step 7");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(status.message(),
            "interrupted while waiting to retry step 7 after 1 attempt (the last: connection "
            "refused)");
}

TEST(WaitInterruptiblyTest, WithoutAnInterruptionWaitsUntilTheDeadline) {
  ClientOptions options;
  const absl::Time start = absl::Now();
  EXPECT_EQ(WaitInterruptibly(options, nullptr, start + absl::Milliseconds(250)),
            WaitEnd::kDeadline);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  int asked = 0;
  options.interrupted = [&] { return ++asked > 100; };
  EXPECT_EQ(WaitInterruptibly(options, nullptr, absl::Now() + absl::Milliseconds(450)),
            WaitEnd::kDeadline);
  EXPECT_GE(asked, 3);  // Slices of at most 100 ms, asked before each.
  EXPECT_LE(asked, 7);
}

TEST(WithRetriesTest, EveryTransientCodeIsRetriedAndNoOther) {
  for (absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
        absl::StatusCode::kAborted, absl::StatusCode::kCancelled, absl::StatusCode::kUnknown}) {
    int calls = 0;
    (void)WithRetries(Quick(2), nullptr, [&](int) {
      ++calls;
      return absl::Status(code, "x");
    });
    EXPECT_EQ(calls, 2) << absl::StatusCodeToString(code);
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kAlreadyExists, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kInternal}) {
    int calls = 0;
    (void)WithRetries(Quick(2), nullptr, [&](int) {
      ++calls;
      return absl::Status(code, "x");
    });
    EXPECT_EQ(calls, 1) << absl::StatusCodeToString(code);
  }
}

// gRPC reports a stream its peer reset (HTTP/2 RST_STREAM, as gRPC 1.51 does
// under a full memory quota) as INTERNAL: no answer of the daemon's, so
// UNAVAILABLE, retried. The daemon's own INTERNAL answers stay INTERNAL.
TEST(FromGrpcStatusTest, AStreamTheTransportResetIsUnavailableAndTheDaemonsInternalStays) {
  const absl::Status reset = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::INTERNAL, "Received RST_STREAM with error code 1"));
  EXPECT_EQ(reset.code(), absl::StatusCode::kUnavailable) << reset;
  EXPECT_NE(reset.message().find("reset the stream (Received RST_STREAM with error code 1)"),
            absl::string_view::npos)
      << reset;
  EXPECT_TRUE(IsRetryable(reset));
  const absl::Status daemons =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::INTERNAL, "group 'g' page 3 is broken"));
  EXPECT_EQ(daemons, absl::InternalError("group 'g' page 3 is broken"));
}

TEST(BackoffTest, DoublesFromTheInitialUpToTheMaximum) {
  ClientOptions options;
  options.initial_backoff = absl::Milliseconds(50);
  options.max_backoff = absl::Milliseconds(300);
  EXPECT_EQ(Backoff(options, 1), absl::Milliseconds(50));
  EXPECT_EQ(Backoff(options, 2), absl::Milliseconds(100));
  EXPECT_EQ(Backoff(options, 3), absl::Milliseconds(200));
  EXPECT_EQ(Backoff(options, 4), absl::Milliseconds(300));
  EXPECT_EQ(Backoff(options, 40), absl::Milliseconds(300));
}

}  // namespace
}  // namespace optstate::client_internal
