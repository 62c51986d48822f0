// Request serialization into one slice, and a StepResponse parser that reads
// the params field in place from the reply's slices.
#include "client/step_wire.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpc/slice.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace optstate::client_internal {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

constexpr uint32_t Tag(int field, WireFormatLite::WireType type) {
  return (static_cast<uint32_t>(field) << 3) | static_cast<uint32_t>(type);
}
constexpr uint32_t kGradientTag =
    Tag(v1::StepRequest::kGradientFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kParamsTag =
    Tag(v1::StepResponse::kParamsFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kGroupTag =
    Tag(v1::StepResponse::kGroupFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

// Widens a byte stream of `type` elements arriving in pieces of any length
// into consecutive floats; an element split between pieces is joined.
class WideningSink {
 public:
  WideningSink(WireType type, float* out) : type_(type), out_(out) {}

  void Feed(const unsigned char* bytes, size_t n) {
    if (type_ == WireType::kFloat32) {  // Bytes in order: no element to join.
      std::memcpy(reinterpret_cast<unsigned char*>(out_) + float_bytes_, bytes, n);
      float_bytes_ += n;
      return;
    }
    if (has_carry_ && n > 0) {
      const unsigned char joined[2] = {carry_, bytes[0]};
      DecodeToFloat(type_, joined, out_ + elements_++, 1);
      has_carry_ = false;
      ++bytes;
      --n;
    }
    DecodeToFloat(type_, bytes, out_ + elements_, n / 2);
    elements_ += n / 2;
    if (n % 2 != 0) {
      carry_ = bytes[n - 1];
      has_carry_ = true;
    }
  }

 private:
  const WireType type_;
  float* const out_;
  size_t float_bytes_ = 0;  // float32: bytes written.
  size_t elements_ = 0;     // 2-byte types: elements written.
  unsigned char carry_ = 0;
  bool has_carry_ = false;
};

absl::Status NotAStepResponse(absl::string_view what) {
  return absl::InternalError(absl::StrCat("a Step reply is not a StepResponse: ", what));
}

}  // namespace

grpc::ByteBuffer SerializeStepRequest(const v1::StepRequest& fields, WireType type,
                                      absl::Span<const float> gradient) {
  const size_t field_bytes = fields.ByteSizeLong();
  const size_t payload = gradient.size() * WireTypeSize(type);
  const size_t prefix =
      CodedOutputStream::VarintSize32(kGradientTag) + CodedOutputStream::VarintSize64(payload);
  grpc_slice slice = grpc_slice_malloc(field_bytes + prefix + payload);
  uint8_t* at = fields.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(slice));
  at = CodedOutputStream::WriteVarint32ToArray(kGradientTag, at);
  at = CodedOutputStream::WriteVarint64ToArray(payload, at);
  EncodeFromFloat(type, gradient.data(), at, gradient.size());
  grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&owned, 1);
}

absl::Status ParseStepResponse(grpc::ByteBuffer* reply, WireType type, size_t elements,
                               absl::Span<float> params_out, v1::StepResponse* fields) {
  const size_t total = reply->Length();
  if (total > static_cast<size_t>(INT_MAX)) return NotAStepResponse("larger than 2 GiB");
  const size_t expected_bytes = elements * WireTypeSize(type);
  absl::Status status;
  bool saw_params = false;
  {
    grpc::ProtoBufferReader reader(reply);
    CodedInputStream input(&reader);
    input.SetTotalBytesLimit(INT_MAX);
    for (;;) {
      const uint32_t tag = input.ReadTag();
      if (tag == 0) {
        if (static_cast<size_t>(input.CurrentPosition()) != total) {
          status = NotAStepResponse("a malformed or zero field tag");
        }
        break;
      }
      if (tag == kParamsTag) {
        uint32_t length = 0;
        if (!input.ReadVarint32(&length)) {
          status = NotAStepResponse("a malformed params length");
          break;
        }
        if (length != expected_bytes) {
          status = absl::InternalError(absl::StrCat(
              "a Step reply carries ", length, " bytes of params; expected ", expected_bytes,
              " (", elements, " elements of ", WireTypeName(type), ")"));
          break;
        }
        WideningSink sink(type, params_out.data());
        size_t left = length;
        while (left > 0) {
          const void* data = nullptr;
          int size = 0;
          if (!input.GetDirectBufferPointer(&data, &size) || size <= 0) break;
          const size_t take = std::min(left, static_cast<size_t>(size));
          if (!params_out.empty()) sink.Feed(static_cast<const unsigned char*>(data), take);
          input.Skip(static_cast<int>(take));
          left -= take;
        }
        if (left > 0) {
          status = NotAStepResponse("the params field runs past the end of the message");
          break;
        }
        saw_params = true;
        continue;
      }
      bool ok = true;
      uint64_t value = 0;
      switch (tag) {
        case kGroupTag:
          ok = WireFormatLite::ReadString(&input, fields->mutable_group());
          break;
        case Tag(v1::StepResponse::kStepFieldNumber, WireFormatLite::WIRETYPE_VARINT):
          ok = input.ReadVarint64(&value);
          fields->set_step(value);
          break;
        case Tag(v1::StepResponse::kOffsetFieldNumber, WireFormatLite::WIRETYPE_VARINT):
          ok = input.ReadVarint64(&value);
          fields->set_offset(value);
          break;
        case Tag(v1::StepResponse::kNumElementsFieldNumber, WireFormatLite::WIRETYPE_VARINT):
          ok = input.ReadVarint64(&value);
          fields->set_num_elements(value);
          break;
        case Tag(v1::StepResponse::kParamDtypeFieldNumber, WireFormatLite::WIRETYPE_VARINT):
          ok = input.ReadVarint64(&value);
          fields->set_param_dtype(static_cast<v1::DType>(static_cast<int32_t>(value)));
          break;
        case Tag(v1::StepResponse::kPagesAppliedFieldNumber, WireFormatLite::WIRETYPE_VARINT):
          ok = input.ReadVarint64(&value);
          fields->set_pages_applied(value);
          break;
        case Tag(v1::StepResponse::kPagesReplayedFieldNumber, WireFormatLite::WIRETYPE_VARINT):
          ok = input.ReadVarint64(&value);
          fields->set_pages_replayed(value);
          break;
        default:  // A field this client does not know: skipped, as protobuf would.
          ok = WireFormatLite::SkipField(&input, tag);
      }
      if (!ok) {
        status = NotAStepResponse(absl::StrCat("field ", tag >> 3, " is malformed"));
        break;
      }
    }
  }
  reply->Clear();
  if (status.ok() && !saw_params && expected_bytes != 0) {
    return absl::InternalError(absl::StrCat("a Step reply carries no params; expected ",
                                            expected_bytes, " bytes"));
  }
  return status;
}

}  // namespace optstate::client_internal
