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
                                      absl::Span<const float> gradient,
                                      const unsigned char** payload) {
  const size_t field_bytes = fields.ByteSizeLong();
  const size_t gradient_bytes = gradient.size() * WireTypeSize(type);
  const size_t prefix = CodedOutputStream::VarintSize32(kGradientTag) +
                        CodedOutputStream::VarintSize64(gradient_bytes);
  // Refcounted even when small, so `*payload` points into memory every copy shares.
  grpc_slice slice = grpc_slice_malloc_large(field_bytes + prefix + gradient_bytes);
  uint8_t* at = fields.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(slice));
  at = CodedOutputStream::WriteVarint32ToArray(kGradientTag, at);
  at = CodedOutputStream::WriteVarint64ToArray(gradient_bytes, at);
  EncodeFromFloat(type, gradient.data(), at, gradient.size());
  if (payload != nullptr) *payload = at;
  grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&owned, 1);
}

namespace {

// One pass over the StepResponse in `reply` (`total` bytes long), refusing
// what protobuf's parser would refuse. Every params field must hold
// `expected_bytes`; `*saw_params` says whether one was there. With
// `params_out` null it parses the other fields into `fields` and skips the
// params; otherwise it only widens the params into `params_out`.
absl::Status ScanStepResponse(grpc::ByteBuffer* reply, size_t total, WireType type,
                              size_t expected_bytes, v1::StepResponse* fields,
                              float* params_out, bool* saw_params) {
  grpc::ProtoBufferReader reader(reply);  // Reads without consuming the buffer.
  if (!reader.status().ok()) return NotAStepResponse("its bytes cannot be read");
  CodedInputStream input(&reader);
  input.SetTotalBytesLimit(INT_MAX);
  while (static_cast<size_t>(input.CurrentPosition()) < total) {
    const uint32_t tag = input.ReadTag();
    if (tag == 0 || WireFormatLite::GetTagFieldNumber(tag) == 0) {
      return NotAStepResponse("a malformed or zero field tag");
    }
    if (tag == kParamsTag) {
      uint64_t length = 0;
      if (!input.ReadVarint64(&length)) return NotAStepResponse("a malformed params length");
      if (length != expected_bytes) {
        return absl::InternalError(absl::StrCat("a Step reply carries ", length,
                                                " bytes of params; expected ", expected_bytes,
                                                " (elements of ", WireTypeName(type), ")"));
      }
      WideningSink sink(type, params_out);
      size_t left = expected_bytes;
      while (left > 0) {
        const void* data = nullptr;
        int size = 0;
        if (!input.GetDirectBufferPointer(&data, &size) || size <= 0) break;
        const size_t take = std::min(left, static_cast<size_t>(size));
        if (params_out != nullptr) sink.Feed(static_cast<const unsigned char*>(data), take);
        input.Skip(static_cast<int>(take));
        left -= take;
      }
      if (left > 0) return NotAStepResponse("the params field runs past the end of the message");
      *saw_params = true;
      continue;
    }
    bool ok = true;
    uint64_t value = 0;
    if (params_out != nullptr) {
      ok = WireFormatLite::SkipField(&input, tag);  // Parsed in the first pass.
    } else {
      switch (tag) {
        case kGroupTag:
          ok = WireFormatLite::ReadString(&input, fields->mutable_group()) &&
               WireFormatLite::VerifyUtf8String(fields->group().data(),
                                                static_cast<int>(fields->group().size()),
                                                WireFormatLite::PARSE, "StepResponse.group");
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
        default:  // Unknown fields, or a wrong wire type: skipped, as protobuf does.
          ok = WireFormatLite::SkipField(&input, tag);
      }
    }
    if (!ok) {
      return NotAStepResponse(absl::StrCat("field ", WireFormatLite::GetTagFieldNumber(tag),
                                           " is malformed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseStepResponse(grpc::ByteBuffer* reply, WireType type, size_t elements,
                               absl::Span<float> params_out,
                               absl::FunctionRef<absl::Status(const v1::StepResponse&)> check,
                               v1::StepResponse* fields) {
  const size_t total = reply->Length();
  const size_t expected_bytes = elements * WireTypeSize(type);
  absl::Status status;
  bool saw_params = false;
  if (!params_out.empty() && params_out.size() != elements) {
    status = absl::InternalError(absl::StrCat("params_out holds ", params_out.size(),
                                              " floats for a reply of ", elements, " elements"));
  } else if (total > static_cast<size_t>(INT_MAX)) {
    status = NotAStepResponse("larger than 2 GiB");
  } else {
    status = ScanStepResponse(reply, total, type, expected_bytes, fields, nullptr, &saw_params);
  }
  if (status.ok() && !saw_params && expected_bytes != 0) {
    status = absl::InternalError(
        absl::StrCat("a Step reply carries no params; expected ", expected_bytes, " bytes"));
  }
  if (status.ok()) status = check(*fields);
  if (status.ok() && !params_out.empty()) {
    status = ScanStepResponse(reply, total, type, expected_bytes, nullptr, params_out.data(),
                              &saw_params);
  }
  reply->Clear();
  return status;
}

}  // namespace optstate::client_internal
