// Request parsing, and StepReplyBuilder: one slice laid out as
// [params tag][length][params][fields].
#include "server/step_wire.h"

#include <cstdint>
#include <cstring>

#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace optstate {
namespace {

using google::protobuf::io::CodedOutputStream;

// StepResponse.params: field 6, length-delimited.
constexpr uint32_t kParamsTag = (v1::StepResponse::kParamsFieldNumber << 3) | 2;

// The most the other StepResponse fields take: group (tag, length, name) and
// six varint fields (tag and at most 10 bytes each).
size_t MaxFieldBytes(size_t group_name_bytes) {
  return 1 + CodedOutputStream::VarintSize64(group_name_bytes) + group_name_bytes + 6 * 11;
}

}  // namespace

absl::Status ParseStepRequest(grpc::ByteBuffer* buffer, v1::StepRequest* request) {
  bool parsed = false;
  {
    grpc::ProtoBufferReader reader(buffer);
    parsed = reader.status().ok() && request->ParseFromZeroCopyStream(&reader);
  }
  buffer->Clear();
  if (!parsed) {
    return absl::InvalidArgumentError(
        "the message is not a StepRequest (malformed protobuf); send optstate.v1.StepRequest");
  }
  return absl::OkStatus();
}

StepReplyBuilder::~StepReplyBuilder() {
  if (reserved_) grpc_slice_unref(slice_);
}

char* StepReplyBuilder::ReserveParams(size_t params_bytes) {
  const size_t prefix =
      CodedOutputStream::VarintSize32(kParamsTag) + CodedOutputStream::VarintSize64(params_bytes);
  if (reserved_) grpc_slice_unref(slice_);  // A second call replaces the first.
  // Refcounted even when small: the returned pointer must stay put.
  slice_ = grpc_slice_malloc_large(prefix + params_bytes + MaxFieldBytes(group_name_bytes_));
  reserved_ = true;
  uint8_t* at = GRPC_SLICE_START_PTR(slice_);
  at = CodedOutputStream::WriteVarint32ToArray(kParamsTag, at);
  at = CodedOutputStream::WriteVarint64ToArray(params_bytes, at);
  used_ = prefix + params_bytes;
  return reinterpret_cast<char*>(at);
}

grpc::ByteBuffer StepReplyBuilder::Finish(const v1::StepResponse& fields) {
  const size_t field_bytes = fields.ByteSizeLong();
  if (!reserved_ || field_bytes > GRPC_SLICE_LENGTH(slice_) - used_) {
    // No params, or fields larger than planned (a longer group name than
    // announced): a fresh slice, at the price of copying what was written.
    grpc_slice whole = grpc_slice_malloc((reserved_ ? used_ : 0) + field_bytes);
    if (reserved_) std::memcpy(GRPC_SLICE_START_PTR(whole), GRPC_SLICE_START_PTR(slice_), used_);
    fields.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(whole) +
                                           (reserved_ ? used_ : 0));
    grpc::Slice out(whole, grpc::Slice::STEAL_REF);
    return grpc::ByteBuffer(&out, 1);
  }
  fields.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(slice_) + used_);
  // A view of the bytes written, sharing slice_'s memory.
  grpc::Slice out(grpc_slice_sub(slice_, 0, used_ + field_bytes), grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&out, 1);
}

}  // namespace optstate
