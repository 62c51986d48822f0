// The client's side of the Step stream without protobuf copies of payloads
// (the stream is raw: grpc::ByteBuffer in and out). A request is serialized
// into one slice with the gradient narrowed straight into it; a reply's
// params are widened straight from the received slices into the caller's
// params_out. Not API.
#ifndef OPTSTATE_CLIENT_STEP_WIRE_H_
#define OPTSTATE_CLIENT_STEP_WIRE_H_

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "optstate/dtype.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {

// The full name of the Step method, for a raw call.
inline constexpr char kStepMethod[] = "/optstate.v1.OptimizerState/Step";

// One StepRequest message: `fields` (whose gradient must be empty), then the
// gradient field: `gradient` narrowed to `type`. `*payload`, when asked for,
// points at the narrowed gradient inside the message (valid while it lives).
grpc::ByteBuffer SerializeStepRequest(const v1::StepRequest& fields, WireType type,
                                      absl::Span<const float> gradient,
                                      const unsigned char** payload = nullptr);

// Parses a StepResponse from `reply` (emptied) into `fields`, all but its
// params, refusing what protobuf's parser would refuse. The params must be
// `elements` elements of `type`. Once the whole message has parsed and
// `check(*fields)` accepts it (the caller's check that the reply is for the
// chunk it expects), the params are widened into `params_out`, unless it is
// empty (else it holds `elements` floats); params_out is untouched on any
// error. INTERNAL, naming what is wrong, when the bytes are not a
// StepResponse or the params have another length; else `check`'s status.
absl::Status ParseStepResponse(grpc::ByteBuffer* reply, WireType type, size_t elements,
                               absl::Span<float> params_out,
                               absl::FunctionRef<absl::Status(const v1::StepResponse&)> check,
                               v1::StepResponse* fields);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_WIRE_H_
