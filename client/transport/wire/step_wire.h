// The client's side of the Step stream without protobuf copies of payloads
// (the stream is raw: grpc::ByteBuffer in and out). A request is serialized
// into one slice with the gradient narrowed straight into it; a reply's
// params are widened straight from the received slices into the caller's
// params_out. A request may pack several chunks (StepRequest.more), and its
// reply then packs theirs. Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_WIRE_STEP_WIRE_H_
#define OPTSTATE_CLIENT_TRANSPORT_WIRE_STEP_WIRE_H_

#include <cstddef>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "optstate/dtype.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {

// One chunk of a request: its fields (gradient and `more` empty) and the
// gradient to narrow into it, or, when `gradient16` is not empty, its
// elements already in the wire type (copied as they are).
struct RequestPiece {
  const v1::StepRequest* fields;
  absl::Span<const float> gradient;
  absl::Span<const uint16_t> gradient16 = {};
};

// One StepRequest message, in one slice: the first piece's fields, then its
// gradient field (the gradient narrowed to `type`), then each further piece
// as a StepRequest in `more`, laid out the same way. `payloads`, when asked
// for, receives a pointer per piece to its narrowed gradient inside the
// message (valid while the message lives).
grpc::ByteBuffer SerializeStepRequest(absl::Span<const RequestPiece> pieces, WireType type,
                                      std::vector<const unsigned char*>* payloads = nullptr);

// What a reply must carry for one chunk of its request: `elements` params,
// widened into `params_out` unless it is empty (else it holds `elements`),
// or copied as they are into `params_out16` (a 16-bit type) when that is not
// empty.
struct ReplyPiece {
  size_t elements;
  absl::Span<float> params_out;
  absl::Span<uint16_t> params_out16 = {};
};

// Parses the reply to a request of `pieces.size()` chunks from `reply`
// (emptied) into `fields`, all but the params: the first chunk's reply, and
// one in `fields->more` per further chunk. Refuses what protobuf's parser
// would refuse, and a reply whose packed replies are not one per further
// chunk. Once the whole message has parsed and `check(i, reply)` accepts the
// reply to every chunk i (the caller's check that it is for the chunk it
// expects), the params are written into each piece's params_out or
// params_out16; they are all untouched on any error. INTERNAL, naming what is wrong, when the bytes
// are not such a reply or params have another length; else `check`'s status.
absl::Status ParseStepResponse(
    grpc::ByteBuffer* reply, WireType type, absl::Span<const ReplyPiece> pieces,
    absl::FunctionRef<absl::Status(size_t, const v1::StepResponse&)> check,
    v1::StepResponse* fields);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_WIRE_STEP_WIRE_H_
