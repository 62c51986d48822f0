// Validation of a whole message first, then its chunks in order.
#include "server/rpc/step_message.h"

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "optstate/v1/step_wire_format.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/step_reply_builder.h"

namespace optstate {
namespace {

// The chunk at `index` of a message: the message's own (0), or more[index-1].
const v1::StepRequest& PieceOf(const v1::StepRequest& request, size_t index) {
  return index == 0 ? request : request.more(static_cast<int>(index - 1));
}

// `status`, naming the packed chunk it is about.
absl::Status AboutPacked(const absl::Status& status, const v1::StepRequest& request, size_t index,
                         absl::string_view consequence) {
  if (index == 0 || status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("StepRequest.more[", index - 1, "] (group '",
                                                  PieceOf(request, index).group(), "'): ",
                                                  status.message(), " (", consequence, ")"));
}

// The chunk `request` carries (`packed`: one of an outer message's `more`)
// with `gradient`, for the engine; `chunk` points into both.
absl::Status ToChunk(const v1::StepRequest& request, const SegmentedBytes& gradient,
                     const std::string& tenant, bool packed, StepChunk* chunk) {
  if (packed && !request.more().empty()) {
    return absl::InvalidArgumentError(
        "a chunk packed in StepRequest.more packs chunks itself; put every chunk of the "
        "message in the outer request's more");
  }
  absl::StatusOr<WireType> gradient_type =
      WireTypeFromProto(request.gradient_dtype(), "gradient_dtype");
  if (!gradient_type.ok()) return gradient_type.status();
  absl::StatusOr<WireType> param_type = WireTypeFromProto(request.param_dtype(), "param_dtype");
  if (!param_type.ok()) return param_type.status();
  chunk->group = GroupKey{tenant, request.group()};
  chunk->step = request.step();
  chunk->offset = request.offset();
  chunk->group_elements = request.group_elements();
  chunk->gradient = gradient;
  if (request.has_lr_float32()) {
    return absl::InvalidArgumentError(
        "StepRequest.lr_float32 (field 6) is retired: send the per-step lr as a double in "
        "StepRequest.lr (field 11); this client predates it and must be rebuilt");
  }
  if (request.has_lr()) chunk->lr = request.lr();
  if (request.has_grad_scale()) chunk->grad_scale = request.grad_scale();
  chunk->gradient_type = *gradient_type;
  chunk->param_type = *param_type;
  return absl::OkStatus();
}

// INVALID_ARGUMENT when the reply to a message (its chunks validated) could
// be larger than gRPC will send: it is refused before anything is applied,
// rather than applied and then not answered.
absl::Status CheckReplyFits(const v1::StepRequest& request, absl::Span<const StepChunk> chunks,
                            absl::Span<const ValidatedChunk> validated, size_t max_reply_bytes) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    bytes += validated[i].count * WireTypeSize(chunks[i].param_type) +
             PieceOf(request, i).group().size() + kReplyFieldsBytes;
  }
  if (bytes <= max_reply_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the reply to this message would take up to ", bytes,
      " bytes (params in the "
      "requested param_dtype), more than the daemon's --max_message_bytes=",
      max_reply_bytes,
      "; send fewer elements per message or ask for 16-bit params; nothing was applied"));
}

}  // namespace

absl::Status ApplyStepMessage(StepEngine* engine, const std::string& tenant, size_t max_reply_bytes,
                              const StepMessage& message, std::vector<grpc::Slice>* reply) {
  const v1::StepRequest& request = message.request;
  const size_t pieces = 1 + static_cast<size_t>(request.more_size());
  if (message.gradients.size() != pieces) {
    return absl::InternalError(absl::StrCat("a Step message with ", pieces, " chunks carries ",
                                            message.gradients.size(), " gradients"));
  }
  std::vector<StepChunk> chunks(pieces);
  std::vector<ValidatedChunk> validated(pieces);
  for (size_t i = 0; i < pieces; ++i) {
    absl::Status status =
        ToChunk(PieceOf(request, i), message.gradients[i], tenant, i > 0, &chunks[i]);
    if (status.ok()) {
      absl::StatusOr<ValidatedChunk> checked = engine->Validate(chunks[i]);
      if (checked.ok()) {
        validated[i] = std::move(*checked);
      } else {
        status = checked.status();
      }
    }
    if (!status.ok()) {
      return AboutPacked(status, request, i, "nothing in its message was applied");
    }
  }
  if (absl::Status s = CheckReplyFits(request, chunks, validated, max_reply_bytes); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < pieces; ++i) {
    const v1::StepRequest& piece = PieceOf(request, i);
    StepReplyBuilder builder(piece.group().size(), /*packed=*/i > 0);
    absl::StatusOr<StepChunkResult> result = engine->Apply(
        chunks[i], validated[i], [&builder](size_t bytes) { return builder.ReserveParams(bytes); });
    if (!result.ok()) {
      return AboutPacked(result.status(), request, i,
                         "the chunks before it in its message were applied");
    }
    v1::StepResponse response;
    response.set_group(piece.group());
    response.set_step(piece.step());
    response.set_offset(piece.offset());
    response.set_num_elements(result->num_elements);
    response.set_param_dtype(WireTypeToProto(chunks[i].param_type));
    response.set_pages_applied(result->pages_applied);
    response.set_pages_replayed(result->pages_replayed);
    reply->push_back(builder.Finish(response));
  }
  return absl::OkStatus();
}

}  // namespace optstate
