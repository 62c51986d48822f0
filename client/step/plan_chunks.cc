// PlanChunks: page-aligned chunks per group, packed greedily in order.
#include "client/step/plan_chunks.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "optstate/message_limits.h"

namespace optstate::client_internal {
namespace {

// Room kept per packed chunk for its fields and framing, beyond the group
// name: what the daemon reckons a chunk's reply takes beyond its params,
// which it checks before applying a message.
constexpr uint64_t kPieceOverheadBytes = kReplyFieldsBytes;
// Chunks packed into one message at most (the daemon takes up to
// kMaxPackedChunks).
constexpr size_t kMaxPiecesPerMessage = 1024;
static_assert(kMaxPiecesPerMessage <= kMaxPackedChunks);

uint64_t WidestElementBytes(const ChunkLimits& limits) {
  return std::max(WireTypeSize(limits.gradient_dtype), WireTypeSize(limits.param_dtype));
}

}  // namespace

absl::StatusOr<uint64_t> PagesPerChunk(const ChunkGroup& group, const ChunkLimits& limits) {
  if (group.page_elements == 0) {
    return absl::InternalError(
        absl::StrCat("the daemon describes group '", group.name, "' with pages of 0 elements"));
  }
  const uint64_t max_pages = (limits.max_message_bytes - kMessageFieldRoomBytes) /
                             (group.page_elements * WidestElementBytes(limits));
  if (max_pages == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "one page of group '", group.name, "' (", group.page_elements,
        " elements) does not fit ClientOptions.max_message_bytes=", limits.max_message_bytes,
        "; raise it"));
  }
  const uint64_t page_bytes = group.page_elements * WireTypeSize(limits.gradient_dtype);
  return std::clamp<uint64_t>(limits.chunk_bytes / page_bytes, 1, max_pages);
}

absl::StatusOr<std::vector<PlannedPieces>> PlanChunks(absl::Span<const ChunkGroup> groups,
                                                      const ChunkLimits& limits) {
  const uint64_t widest = WidestElementBytes(limits);
  const uint64_t message_limit = limits.max_message_bytes - kMessageFieldRoomBytes;
  const uint64_t packed_gradient_limit =
      limits.message_gradient_bytes != 0 ? limits.message_gradient_bytes : limits.chunk_bytes;
  std::vector<PlannedPieces> messages;
  uint64_t packed_gradient_bytes = 0;  // Of messages.back().
  uint64_t packed_message_bytes = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const ChunkGroup& group = groups[g];
    absl::StatusOr<uint64_t> pages = PagesPerChunk(group, limits);
    if (!pages.ok()) return pages.status();
    const uint64_t chunk_elements = *pages * group.page_elements;
    for (uint64_t offset = 0; offset < group.num_elements; offset += chunk_elements) {
      const ChunkPiece piece{g, offset, std::min(chunk_elements, group.num_elements - offset)};
      const uint64_t gradient_bytes = piece.count * WireTypeSize(limits.gradient_dtype);
      const uint64_t message_bytes = piece.count * widest + group.name.size() + kPieceOverheadBytes;
      if (!messages.empty() && messages.back().size() < kMaxPiecesPerMessage &&
          packed_gradient_bytes + gradient_bytes <= packed_gradient_limit &&
          packed_message_bytes + message_bytes <= message_limit) {
        messages.back().push_back(piece);
        packed_gradient_bytes += gradient_bytes;
        packed_message_bytes += message_bytes;
      } else {
        messages.push_back({piece});
        packed_gradient_bytes = gradient_bytes;
        packed_message_bytes = message_bytes;
      }
    }
  }
  return messages;
}

}  // namespace optstate::client_internal
