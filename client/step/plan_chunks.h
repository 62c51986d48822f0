// Chunk planning for Client::Step: each group's gradient cut into page-aligned
// chunks, and consecutive small chunks packed into shared messages. Not API.
#ifndef OPTSTATE_CLIENT_STEP_PLAN_CHUNKS_H_
#define OPTSTATE_CLIENT_STEP_PLAN_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "optstate/dtype.h"

namespace optstate::client_internal {

// What planning needs to know of one group of the step.
struct ChunkGroup {
  absl::string_view name;  // Sent in every chunk; counts toward a message's size.
  uint64_t num_elements = 0;
  uint64_t page_elements = 0;  // Chunks start on multiples of this.
};

// The client's options and the step's wire types, as planning sees them.
struct ChunkLimits {
  uint64_t chunk_bytes = 0;        // ClientOptions::chunk_bytes (> 0).
  uint64_t max_message_bytes = 0;  // ClientOptions::max_message_bytes (> kMessageFieldRoomBytes).
  WireType gradient_dtype = WireType::kFloat32;
  WireType param_dtype = WireType::kFloat32;
  // Gradient bytes a message packs at most; 0: chunk_bytes.
  uint64_t message_gradient_bytes = 0;
};

// Elements [offset, offset + count) of group `group` (an index into the
// planned groups): whole pages, the last one possibly short at the group's end.
struct ChunkPiece {
  size_t group;
  uint64_t offset;
  uint64_t count;
};

// One message: a chunk, and the chunks packed after it (StepRequest.more).
using PlannedPieces = absl::InlinedVector<ChunkPiece, 1>;

// Pages per chunk of `group`: chunk_bytes of gradient rounded down to whole
// pages, at least one, and at most as many as keep the request and the reply
// (params may be wider than the gradient) within max_message_bytes less
// kMessageFieldRoomBytes (optstate/message_limits.h) for the other fields. INVALID_ARGUMENT, naming
// the group, when not even one page fits; INTERNAL when the layout has pages of 0 elements.
absl::StatusOr<uint64_t> PagesPerChunk(const ChunkGroup& group, const ChunkLimits& limits);

// The step's messages, in the order of `groups` and of their elements. Every
// group is cut into chunks of PagesPerChunk pages (the last one to its end);
// a chunk is packed into the message before it while that message keeps to
// chunk_bytes (or message_gradient_bytes) of gradient, to at most 1024
// chunks, and to max_message_bytes less kMessageFieldRoomBytes, counting per chunk its widest payload, its group name and 96
// bytes of fields and framing (no less than the daemon reckons a chunk's
// reply takes beyond its params). Fails as PagesPerChunk for the first group
// that fails it.
absl::StatusOr<std::vector<PlannedPieces>> PlanChunks(absl::Span<const ChunkGroup> groups,
                                                      const ChunkLimits& limits);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_PLAN_CHUNKS_H_
