// Facts of the Step messages' wire form that both ends rely on: the field
// tags the raw readers and writers use (the packing limits are in
// optstate/message_limits.h, which this includes).
#ifndef OPTSTATE_PROTO_OPTSTATE_V1_STEP_WIRE_FORMAT_H_
#define OPTSTATE_PROTO_OPTSTATE_V1_STEP_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "google/protobuf/wire_format_lite.h"
#include "optstate/message_limits.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate {

// A field's tag: its number and wire type, as protobuf encodes them.
constexpr uint32_t WireTag(int field, google::protobuf::internal::WireFormatLite::WireType type) {
  return (static_cast<uint32_t>(field) << 3) | static_cast<uint32_t>(type);
}
// The tag of a length-delimited (bytes, string or message) field.
constexpr uint32_t LengthDelimitedTag(int field) {
  return WireTag(field, google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

// StepRequest.gradient and StepResponse.params: the payloads written and
// read in place.
inline constexpr uint32_t kStepGradientTag =
    LengthDelimitedTag(v1::StepRequest::kGradientFieldNumber);
inline constexpr uint32_t kStepParamsTag = LengthDelimitedTag(v1::StepResponse::kParamsFieldNumber);
// StepRequest.more and StepResponse.more (the same number): packed chunks
// and their replies.
static_assert(int{v1::StepRequest::kMoreFieldNumber} == int{v1::StepResponse::kMoreFieldNumber});
inline constexpr uint32_t kStepMoreTag = LengthDelimitedTag(v1::StepRequest::kMoreFieldNumber);

// kMaxPackedChunks and kReplyFieldsBytes: optstate/message_limits.h.

}  // namespace optstate

#endif  // OPTSTATE_PROTO_OPTSTATE_V1_STEP_WIRE_FORMAT_H_
