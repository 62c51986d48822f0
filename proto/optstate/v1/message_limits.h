// Message sizes both ends of the wire rely on: the room a message keeps for
// its fields beside its payload, and the daemon's default page.
#ifndef OPTSTATE_PROTO_OPTSTATE_V1_MESSAGE_LIMITS_H_
#define OPTSTATE_PROTO_OPTSTATE_V1_MESSAGE_LIMITS_H_

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

}  // namespace optstate

#endif  // OPTSTATE_PROTO_OPTSTATE_V1_MESSAGE_LIMITS_H_
