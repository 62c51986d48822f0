// Step messages on the wire, read and written by the Step reactor itself
// (the method is raw: grpc::ByteBuffer in and out).
// Replies: a StepResponse serialized straight into one gRPC slice, so the
// updated params are copied once, from the state into the reply, and never
// again: the params field comes first on the wire (protobuf parsers accept
// fields in any order) and the step engine writes its payload in place; the
// other fields follow once the chunk is done.
#ifndef OPTSTATE_SERVER_STEP_WIRE_H_
#define OPTSTATE_SERVER_STEP_WIRE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "grpc/slice.h"
#include "grpcpp/support/byte_buffer.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate {

// Parses a request as gRPC's own deserializer would, and empties `buffer`.
// INVALID_ARGUMENT if it is not a StepRequest.
absl::Status ParseStepRequest(grpc::ByteBuffer* buffer, v1::StepRequest* request);

// Not thread-safe; one per reply. Call ReserveParams at most once (a second
// call starts over), then Finish once.
class StepReplyBuilder {
 public:
  // `group_name_bytes`: the length of the group name the reply will carry
  // (sizes the room kept for the other fields).
  explicit StepReplyBuilder(size_t group_name_bytes) : group_name_bytes_(group_name_bytes) {}
  ~StepReplyBuilder();
  StepReplyBuilder(const StepReplyBuilder&) = delete;
  StepReplyBuilder& operator=(const StepReplyBuilder&) = delete;

  // Memory for exactly `params_bytes` of params, valid until Finish.
  char* ReserveParams(size_t params_bytes);

  // The whole message: the params written so far, then `fields` (whose own
  // params must be empty). Without ReserveParams, just `fields`.
  grpc::ByteBuffer Finish(const v1::StepResponse& fields);

 private:
  const size_t group_name_bytes_;
  grpc_slice slice_;
  bool reserved_ = false;
  size_t used_ = 0;  // Bytes of slice_ written: tag, length and params.
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STEP_WIRE_H_
