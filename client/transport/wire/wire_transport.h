// The wire data plane: every gradient and param in the Step messages
// themselves, serialized without protobuf copies (transport/wire/step_wire.h).
// Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_WIRE_WIRE_TRANSPORT_H_
#define OPTSTATE_CLIENT_TRANSPORT_WIRE_WIRE_TRANSPORT_H_

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "client/step/plan_chunks.h"
#include "client/step/step_input.h"
#include "client/transport/step_transport.h"
#include "client/transport/wire/step_wire.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {

// One step over the wire. Prepare plans the messages (PlanChunks: chunks
// of chunk_bytes, small ones packed) and checks every gradient finite as it
// will be sent, in order, so a refusal names the step's first bad element:
// the first kMaxPreparedBytes of narrowed gradient are narrowed into their
// requests (kept for resends) and checked there; the rest are checked from
// the caller's buffers and narrowed when sent. While the step runs it holds
// up to kMaxPreparedBytes beyond the caller's buffers.
class WireTransport : public StepTransport {
 public:
  static constexpr size_t kMaxPreparedBytes = 64 << 20;

  WireTransport(const StepInput& input, const ClientOptions& options)
      : input_(input), options_(options) {}

  absl::StatusOr<size_t> Prepare() override;
  grpc::ByteBuffer Request(size_t i) override;
  absl::Status TakeReply(size_t i, grpc::ByteBuffer* reply) override;
  size_t max_in_flight() const override {
    return static_cast<size_t>(options_.max_chunks_in_flight);
  }
  absl::string_view name() const override { return "wire"; }

 private:
  // A message as PlanChunks planned it, and its request when narrowed ahead.
  struct Message {
    PlannedPieces pieces;
    std::optional<grpc::ByteBuffer> request;
  };
  // The request for `message`, its gradients narrowed into it; `payloads`
  // gets each piece's narrowed gradient. `fields` is the caller's scratch.
  grpc::ByteBuffer BuildRequest(const Message& message, std::vector<v1::StepRequest>* fields,
                                std::vector<const unsigned char*>* payloads = nullptr) const;

  const StepInput input_;
  const ClientOptions& options_;
  std::vector<Message> messages_;
  std::vector<v1::StepRequest> writer_fields_;  // The writer thread's scratch.
  v1::StepResponse reply_fields_;               // The reading thread's scratch.
  absl::InlinedVector<ReplyPiece, 16> expected_;
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_WIRE_WIRE_TRANSPORT_H_
