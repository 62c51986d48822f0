// Step replies on the wire, written on a worker by ApplyStepMessage
// (step_message.h) for the Step reactor (the method is raw: grpc::ByteBuffer
// in and out; requests are read by step_request_reader.h).
// Replies: a StepResponse serialized straight into one gRPC slice, so the
// updated params are copied once, from the state into the reply, and never
// again: the params field comes first on the wire (protobuf parsers accept
// fields in any order) and the step engine writes its payload in place; the
// other fields follow once the chunk is done. The reply to a chunk packed in
// a request's `more` is built the same way, as the StepResponse.more field
// that carries it, and follows the outer reply as further slices.
#ifndef OPTSTATE_SERVER_RPC_STEP_REPLY_BUILDER_H_
#define OPTSTATE_SERVER_RPC_STEP_REPLY_BUILDER_H_

#include <cstddef>

#include "grpc/slice.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate {

// Not thread-safe; one per reply. Call ReserveParams at most once (a second
// call starts over), then Finish once.
class StepReplyBuilder {
 public:
  // `group_name_bytes`: the length of the group name the reply will carry
  // (sizes the room kept for the other fields). `packed`: the reply is to a
  // chunk packed in a request's `more`; Finish then returns the bytes of the
  // outer StepResponse's `more` field holding it (tag, length, message).
  explicit StepReplyBuilder(size_t group_name_bytes, bool packed = false)
      : group_name_bytes_(group_name_bytes), head_(packed ? kMaxPackedPrefix : 0) {}
  ~StepReplyBuilder();
  StepReplyBuilder(const StepReplyBuilder&) = delete;
  StepReplyBuilder& operator=(const StepReplyBuilder&) = delete;

  // Memory for exactly `params_bytes` of params, valid until Finish.
  char* ReserveParams(size_t params_bytes);

  // The whole message: the params written so far, then `fields` (whose own
  // params and `more` must be empty). Without ReserveParams, just `fields`.
  // Packed: wrapped as one `more` field.
  grpc::Slice Finish(const v1::StepResponse& fields);

 private:
  // StepResponse.more's tag (one byte) and a length of up to 10 bytes.
  static constexpr size_t kMaxPackedPrefix = 11;

  const size_t group_name_bytes_;
  const size_t head_;  // Room kept before the message for the `more` prefix.
  grpc_slice slice_;
  bool reserved_ = false;
  size_t used_ = 0;  // Bytes of the message written after head_: tag, length and params.
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STEP_REPLY_BUILDER_H_
