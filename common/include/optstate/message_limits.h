// Message sizes and packing limits both ends of the wire rely on (no
// protobuf here: the client's transport-free step layer plans with them).
#ifndef OPTSTATE_MESSAGE_LIMITS_H_
#define OPTSTATE_MESSAGE_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace optstate {

// Bytes of a message (request or reply, of any method) kept for everything
// but its payload (gradient, params or state values): a sender fills a
// message with at most max_message_bytes - kMessageFieldRoomBytes of payload.
inline constexpr uint64_t kMessageFieldRoomBytes = 4096;

// The daemon's default page (optstated --page_elements): the exactly-once
// granularity, and the least a chunk carries.
inline constexpr uint64_t kDefaultPageElements = 256 * 1024;

// The least max_message_bytes either end accepts: one float32 page of the
// default size and the field room.
inline constexpr uint64_t kMinMessageBytes = kDefaultPageElements * 4 + kMessageFieldRoomBytes;

// The most chunks one Step message may pack in StepRequest.more: the daemon
// refuses a message with more (INVALID_ARGUMENT), so a client packs at most
// this many.
inline constexpr size_t kMaxPackedChunks = 4096;

// Room a reply takes beyond its params, per chunk: the params' tag and
// length, the other fields (group name aside) and a packed reply's framing;
// at most 72 bytes, rounded up. The daemon refuses a message whose reply,
// reckoned so, could pass its --max_message_bytes; a client that packs a
// message up to the limit reserves at least this much per chunk, or the
// daemon would refuse what it packed.
inline constexpr uint64_t kReplyFieldsBytes = 96;

// In a message that sets StepRequest.gradients_checked, the daemon checks the
// values of each chunk of at most this many bytes of gradient just before it
// applies it (in cache), not with the others before any; so a sender that
// vouches for its gradients cuts a large group into chunks of at most this
// size (whole pages), or the daemon reads that group's gradient twice.
inline constexpr uint64_t kCheckedAsAppliedBytes = 1 << 20;

}  // namespace optstate

#endif  // OPTSTATE_MESSAGE_LIMITS_H_
