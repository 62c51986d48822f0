// Step requests read in place: a StepRequest's fields are parsed as
// protobuf's own parser would, but every chunk's gradient is left where it
// arrived, in the transport's slices, which the parsed message keeps; the
// step engine reads it from there (SegmentedBytes) instead of from a copy.
#ifndef OPTSTATE_SERVER_RPC_STEP_REQUEST_READER_H_
#define OPTSTATE_SERVER_RPC_STEP_REQUEST_READER_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/support/byte_buffer.h"
#include "optstate/v1/optstate.pb.h"
#include "server/base/segmented_bytes.h"
#include "server/rpc/received_slices.h"

namespace optstate {

struct StepPlan;  // server/rpc/step_plan.h

// A Step request as read. Move-only: `gradients` point into `slices`, whose
// bytes must not move (an inlined slice holds its bytes in itself).
struct StepMessage {
  StepMessage() = default;
  StepMessage(StepMessage&&) = default;
  StepMessage& operator=(StepMessage&&) = default;
  StepMessage(const StepMessage&) = delete;
  StepMessage& operator=(const StepMessage&) = delete;

  // Every field but the gradients (left empty), packed chunks in `more`.
  v1::StepRequest request;
  // Per chunk: [0] the request's own gradient, [i] that of request.more(i-1).
  std::vector<SegmentedBytes> gradients;
  // The message's bytes, kept for the gradients (released from any thread).
  ReceivedSlices slices;
  // The plan the message uses (StepRequest.plan, no group), once found by
  // the Step reactor: its chunks are the message's. Null otherwise.
  std::shared_ptr<const StepPlan> plan;
};

// Reads `buffer` (emptied) into `message`. INVALID_ARGUMENT, saying what to
// send instead, when protobuf's parser would refuse the bytes as a
// StepRequest, or when the message packs more than `max_packed` chunks in
// `more` (reading stops there). A chunk packed in `more` that packs chunks
// itself is read with empty placeholders in its own `more` (its gradients not
// kept), for the caller to refuse.
absl::Status ReadStepRequest(grpc::ByteBuffer* buffer, size_t max_packed, StepMessage* message);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STEP_REQUEST_READER_H_
