// The client's side of the Step stream without protobuf copies of payloads
// (the stream is raw: grpc::ByteBuffer in and out). A request is serialized
// into one slice with the gradient narrowed straight into it; a reply's
// params are widened straight from the received slices into the caller's
// params_out. Not API.
#ifndef OPTSTATE_CLIENT_STEP_WIRE_H_
#define OPTSTATE_CLIENT_STEP_WIRE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "optstate/dtype.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {

// The full name of the Step method, for a raw call.
inline constexpr char kStepMethod[] = "/optstate.v1.OptimizerState/Step";

// One StepRequest message: `fields` (whose gradient must be empty), then the
// gradient field: `gradient` narrowed to `type`.
grpc::ByteBuffer SerializeStepRequest(const v1::StepRequest& fields, WireType type,
                                      absl::Span<const float> gradient);

// Parses a StepResponse from `reply` (emptied) into `fields`, all but its
// params. The params must be `elements` elements of `type`; they are widened
// into `params_out` unless it is empty (else it has `elements` floats).
// INTERNAL, naming what is wrong, when the bytes are not a StepResponse or
// the params have another length; params_out may then hold some of them.
absl::Status ParseStepResponse(grpc::ByteBuffer* reply, WireType type, size_t elements,
                               absl::Span<float> params_out, v1::StepResponse* fields);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_WIRE_H_
