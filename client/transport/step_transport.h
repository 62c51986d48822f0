// How a step's messages travel: one interface, one implementation per data
// plane (transport/wire/, transport/shared_memory/). Not API.
//
// Client::Step drives every step the same way (client/client_step.cc):
// 1. It checks the step (step/step_checks.h) and each group's layout, and
//    hands the transport the result (StepInput).
// 2. Prepare: the transport readies the step's messages (lays out, copies,
//    narrows) and checks every gradient finite as the daemon will read it
//    (step/finite_check.h). A refusal here means nothing was sent.
// 3. Each attempt of the client's one retry loop (call/retry.h) runs
//    RunStepStream (transport/step_stream.h) over the messages not yet
//    answered: BeforeAttempt, then Request(i) on the writer thread and
//    TakeReply(i) on the reading thread, message by message in order. The
//    daemon applies each page once, so a resent message never applies an
//    element twice.
// 4. Finish, once, after the last attempt.
// A new data plane (or a client of several daemons) is one more
// implementation of this interface, not another copy of the pipeline.
#ifndef OPTSTATE_CLIENT_TRANSPORT_STEP_TRANSPORT_H_
#define OPTSTATE_CLIENT_TRANSPORT_STEP_TRANSPORT_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"

namespace optstate::client_internal {

class StepTransport {
 public:
  virtual ~StepTransport() = default;

  // Readies the step: the number of messages it takes, or the refusal
  // (INVALID_ARGUMENT for a gradient not finite, naming its first bad
  // element; a data plane's own refusal) with nothing sent.
  virtual absl::StatusOr<size_t> Prepare() = 0;
  // Called before every attempt; a status fails that attempt (UNAVAILABLE:
  // it is retried).
  virtual absl::Status BeforeAttempt() { return absl::OkStatus(); }
  // The request for message `i` (< Prepare's count). Called on the stream's
  // writer thread only, once per attempt that sends it.
  virtual grpc::ByteBuffer Request(size_t i) = 0;
  // Takes the reply to message `i`: checks that it answers that message and
  // writes its params out. INTERNAL, naming what is wrong, when it does not
  // (the step is abandoned). Called on the reading thread only.
  virtual absl::Status TakeReply(size_t i, grpc::ByteBuffer* reply) = 0;
  // Called once after the step's last attempt, whatever its outcome, on
  // the calling thread: writes out what the replies taken left for the end
  // of the step (INTERNAL when it cannot).
  virtual absl::Status Finish() { return absl::OkStatus(); }
  // After an attempt failed with `status`: whether the transport now sends
  // its messages otherwise, so the attempt is to be made again at once (a
  // step plan the daemon no longer keeps: the chunks are sent instead).
  // Called on the calling thread between attempts.
  virtual bool ResendAfter(const absl::Status& /*status*/) { return false; }
  // Messages written and not yet answered, at most, per stream.
  virtual size_t max_in_flight() const = 0;
  // The data plane, as the client's messages name it ("wire", "shared memory").
  virtual absl::string_view name() const = 0;
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_STEP_TRANSPORT_H_
