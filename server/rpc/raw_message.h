// Protobuf messages read from and written to gRPC byte buffers by the
// service itself, so a request that does not parse gets INVALID_ARGUMENT
// naming the message expected instead of gRPC's bare UNIMPLEMENTED.
#ifndef OPTSTATE_SERVER_RPC_RAW_MESSAGE_H_
#define OPTSTATE_SERVER_RPC_RAW_MESSAGE_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace optstate {

// Parses `buffer` (left as it was) into `message`. INVALID_ARGUMENT naming
// the message's type (and `where`, when not empty: "message 2 of the
// RegisterGroup stream") when the bytes are not one.
absl::Status ParseRawMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message,
                             absl::string_view where = "");

// Serializes `message` into `buffer`, replacing what it held; INTERNAL if
// protobuf cannot.
absl::Status SerializeRawMessage(const google::protobuf::Message& message,
                                 grpc::ByteBuffer* buffer);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_RAW_MESSAGE_H_
