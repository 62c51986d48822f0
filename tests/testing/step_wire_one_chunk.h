// client/step_wire.h's calls for a message of one chunk, which only tests
// make: a request of one piece, and the reply to it.
#ifndef OPTSTATE_TESTS_TESTING_STEP_WIRE_ONE_CHUNK_H_
#define OPTSTATE_TESTS_TESTING_STEP_WIRE_ONE_CHUNK_H_

#include <vector>

#include "client/transport/wire/step_wire.h"

namespace optstate::client_internal {

// SerializeStepRequest of one chunk: `fields` with `gradient` narrowed to
// `type`; `payload`, when given, points at the narrowed gradient.
inline grpc::ByteBuffer SerializeStepRequest(const v1::StepRequest& fields, WireType type,
                                             absl::Span<const float> gradient,
                                             const unsigned char** payload = nullptr) {
  const RequestPiece piece{&fields, gradient};
  std::vector<const unsigned char*> payloads;
  grpc::ByteBuffer message = SerializeStepRequest(absl::MakeConstSpan(&piece, 1), type,
                                                  payload != nullptr ? &payloads : nullptr);
  if (payload != nullptr) *payload = payloads[0];
  return message;
}

// ParseStepResponse of the reply to one chunk: `elements` params into
// `params_out` (or skipped when it is empty).
inline absl::Status ParseStepResponse(
    grpc::ByteBuffer* reply, WireType type, size_t elements, absl::Span<float> params_out,
    absl::FunctionRef<absl::Status(const v1::StepResponse&)> check, v1::StepResponse* fields) {
  const ReplyPiece piece{elements, params_out};
  return ParseStepResponse(
      reply, type, absl::MakeConstSpan(&piece, 1),
      [&](size_t, const v1::StepResponse& reply_fields) { return check(reply_fields); }, fields);
}

}  // namespace optstate::client_internal

#endif  // OPTSTATE_TESTS_TESTING_STEP_WIRE_ONE_CHUNK_H_
