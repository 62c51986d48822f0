// Requests narrowed ahead up to kMaxPreparedBytes (checked in their own
// bytes), the rest checked from the caller's buffers and narrowed by the
// writer; replies' params widened straight into params_out.
#include "client/transport/wire/wire_transport.h"

#include "absl/strings/str_cat.h"
#include "client/step/buffer_parts.h"
#include "client/step/finite_check.h"
#include "client/transport/chunk_fields.h"

namespace optstate::client_internal {

grpc::ByteBuffer WireTransport::BuildRequest(const Message& message,
                                             std::vector<v1::StepRequest>* fields,
                                             std::vector<const unsigned char*>* payloads) const {
  if (fields->size() < message.pieces.size()) fields->resize(message.pieces.size());
  absl::InlinedVector<RequestPiece, 16> pieces;
  for (size_t k = 0; k < message.pieces.size(); ++k) {
    const ChunkPiece& piece = message.pieces[k];
    const GroupStep& group = input_.groups[piece.group];
    ChunkFields(group, piece, input_.step, input_.options, &(*fields)[k]);
    pieces.push_back({&(*fields)[k], FloatPart(group.gradient, piece.offset, piece.count),
                      SixteenBitPart(group.gradient, piece.offset, piece.count)});
  }
  return SerializeStepRequest(pieces, input_.options.gradient_dtype, payloads);
}

absl::StatusOr<size_t> WireTransport::Prepare() {
  const ChunkLimits limits{options_.chunk_bytes, static_cast<uint64_t>(options_.max_message_bytes),
                           input_.options.gradient_dtype, input_.options.param_dtype};
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(input_.layouts, limits);
  if (!plan.ok()) return plan.status();
  messages_.clear();
  messages_.reserve(plan->size());
  for (PlannedPieces& pieces : *plan) messages_.push_back({std::move(pieces), std::nullopt});

  const size_t wire_size = WireTypeSize(input_.options.gradient_dtype);
  size_t prepared = 0;
  std::vector<v1::StepRequest> fields;
  std::vector<const unsigned char*> payloads;
  for (Message& message : messages_) {
    size_t bytes = 0;
    for (const ChunkPiece& piece : message.pieces) bytes += piece.count * wire_size;
    const bool ahead = prepared + bytes <= kMaxPreparedBytes;
    if (ahead) {
      message.request = BuildRequest(message, &fields, &payloads);
      prepared += bytes;
    }
    for (size_t k = 0; k < message.pieces.size(); ++k) {
      const ChunkPiece& piece = message.pieces[k];
      const GroupStep& group = input_.groups[piece.group];
      absl::Status finite =
          ahead ? CheckWireFinite(group, input_.options, payloads[k], piece.offset, piece.count)
                : CheckGivenFinite(group, input_.options, piece.offset, piece.count);
      if (!finite.ok()) return finite;
    }
  }
  return messages_.size();
}

grpc::ByteBuffer WireTransport::Request(size_t i) {
  const Message& message = messages_[i];
  if (message.request) return *message.request;  // Shares its slice.
  return BuildRequest(message, &writer_fields_);
}

absl::Status WireTransport::TakeReply(size_t i, grpc::ByteBuffer* reply) {
  const Message& message = messages_[i];
  expected_.clear();
  for (const ChunkPiece& piece : message.pieces) {
    const GroupStep& group = input_.groups[piece.group];
    expected_.push_back({piece.count, FloatPart(group.params_out, piece.offset, piece.count),
                         SixteenBitPart(group.params_out, piece.offset, piece.count)});
  }
  reply_fields_.Clear();
  return ParseStepResponse(
      reply, input_.options.param_dtype, expected_,
      [&](size_t k, const v1::StepResponse& fields) {
        const ChunkPiece& piece = message.pieces[k];
        const GroupStep& group = input_.groups[piece.group];
        if (fields.group() == group.group && fields.offset() == piece.offset) {
          return absl::OkStatus();
        }
        return absl::InternalError(absl::StrCat("it is for group '", fields.group(), "' offset ",
                                                fields.offset(), "; expected '", group.group,
                                                "' offset ", piece.offset));
      },
      &reply_fields_);
}

}  // namespace optstate::client_internal
