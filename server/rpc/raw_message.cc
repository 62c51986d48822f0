// Byte buffers to and from protobuf messages, as gRPC's own codegen does.
#include "server/rpc/raw_message.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace optstate {

absl::Status ParseRawMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message,
                             absl::string_view where) {
  grpc::ByteBuffer copy(buffer);  // The reader consumes it; slices are shared, not copied.
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    message->Clear();
    return absl::InvalidArgumentError(absl::StrCat(
        where.empty() ? "the request" : where, " is not a valid ", message->GetTypeName(),
        " (truncated, or not protobuf bytes of that message); send one encoded by protobuf"));
  }
  return absl::OkStatus();
}

absl::Status SerializeRawMessage(const google::protobuf::Message& message,
                                 grpc::ByteBuffer* buffer) {
  buffer->Clear();  // gRPC's writer needs an empty buffer (a reused one holds the last message).
  bool own_buffer = false;
  grpc::Status status =
      grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, buffer, &own_buffer);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("could not serialize ", message.GetTypeName(), ": ", status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace optstate
