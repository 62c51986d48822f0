// StepReplyBuilder: one slice laid out as
// [params tag][length][params][fields], behind a `more` tag and length when
// the reply is packed.
#include "server/rpc/step_reply_builder.h"

#include <cstdint>
#include <cstring>

#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/slice.h"
#include "optstate/v1/step_wire_format.h"

namespace optstate {
namespace {

using google::protobuf::io::CodedOutputStream;

// The most the other StepResponse fields take: group (tag, length, name) and
// six varint fields (tag and at most 10 bytes each).
size_t MaxFieldBytes(size_t group_name_bytes) {
  return 1 + CodedOutputStream::VarintSize64(group_name_bytes) + group_name_bytes + 6 * 11;
}

}  // namespace

StepReplyBuilder::~StepReplyBuilder() {
  if (reserved_) grpc_slice_unref(slice_);
}

char* StepReplyBuilder::ReserveParams(size_t params_bytes) {
  const size_t prefix = CodedOutputStream::VarintSize32(kStepParamsTag) +
                        CodedOutputStream::VarintSize64(params_bytes);
  if (reserved_) grpc_slice_unref(slice_);  // A second call replaces the first.
  // Refcounted even when small: the returned pointer must stay put.
  slice_ =
      grpc_slice_malloc_large(head_ + prefix + params_bytes + MaxFieldBytes(group_name_bytes_));
  reserved_ = true;
  uint8_t* at = GRPC_SLICE_START_PTR(slice_) + head_;
  at = CodedOutputStream::WriteVarint32ToArray(kStepParamsTag, at);
  at = CodedOutputStream::WriteVarint64ToArray(params_bytes, at);
  used_ = prefix + params_bytes;
  return reinterpret_cast<char*>(at);
}

grpc::Slice StepReplyBuilder::Finish(const v1::StepResponse& fields) {
  const size_t field_bytes = fields.ByteSizeLong();
  const size_t message_bytes = (reserved_ ? used_ : 0) + field_bytes;
  // The `more` field's tag and length, when packed; written just before the message.
  const size_t prefix = head_ == 0 ? 0
                                   : CodedOutputStream::VarintSize32(kStepMoreTag) +
                                         CodedOutputStream::VarintSize64(message_bytes);
  if (!reserved_ || field_bytes > GRPC_SLICE_LENGTH(slice_) - head_ - used_) {
    // No params, or fields larger than planned (a longer group name than
    // announced): a fresh slice, at the price of copying what was written.
    grpc_slice whole = grpc_slice_malloc(head_ + message_bytes);
    if (reserved_) {
      std::memcpy(GRPC_SLICE_START_PTR(whole), GRPC_SLICE_START_PTR(slice_), head_ + used_);
      grpc_slice_unref(slice_);
    }
    slice_ = whole;
    reserved_ = true;
  }
  uint8_t* message = GRPC_SLICE_START_PTR(slice_) + head_;
  fields.SerializeWithCachedSizesToArray(message + message_bytes - field_bytes);
  if (prefix != 0) {
    uint8_t* at = CodedOutputStream::WriteVarint32ToArray(kStepMoreTag, message - prefix);
    CodedOutputStream::WriteVarint64ToArray(message_bytes, at);
  }
  // A view of the bytes written, sharing slice_'s memory.
  grpc_slice written = grpc_slice_sub(slice_, head_ - prefix, head_ + message_bytes);
  grpc_slice_unref(slice_);
  reserved_ = false;
  return grpc::Slice(written, grpc::Slice::STEAL_REF);
}

}  // namespace optstate
