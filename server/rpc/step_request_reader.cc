// A StepRequest scanner over the message's slices: CodedInputStream reads
// the fields, and each gradient is recorded as the slice pieces holding it.
#include "server/rpc/step_request_reader.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "optstate/v1/step_wire_format.h"

namespace optstate {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

constexpr auto kVarint = WireFormatLite::WIRETYPE_VARINT;
constexpr auto kFixed32 = WireFormatLite::WIRETYPE_FIXED32;
constexpr auto kFixed64 = WireFormatLite::WIRETYPE_FIXED64;
constexpr uint32_t kGroupTag = LengthDelimitedTag(v1::StepRequest::kGroupFieldNumber);
constexpr uint32_t kStepTag = WireTag(v1::StepRequest::kStepFieldNumber, kVarint);
constexpr uint32_t kOffsetTag = WireTag(v1::StepRequest::kOffsetFieldNumber, kVarint);
constexpr uint32_t kGradientDtypeTag = WireTag(v1::StepRequest::kGradientDtypeFieldNumber, kVarint);
constexpr uint32_t kLrTag = WireTag(v1::StepRequest::kLrFieldNumber, kFixed64);
constexpr uint32_t kBeta1Tag = WireTag(v1::StepRequest::kBeta1FieldNumber, kFixed64);
constexpr uint32_t kBeta2Tag = WireTag(v1::StepRequest::kBeta2FieldNumber, kFixed64);
constexpr uint32_t kEpsTag = WireTag(v1::StepRequest::kEpsFieldNumber, kFixed64);
constexpr uint32_t kWeightDecayTag = WireTag(v1::StepRequest::kWeightDecayFieldNumber, kFixed64);
constexpr uint32_t kMaximizeTag = WireTag(v1::StepRequest::kMaximizeFieldNumber, kVarint);
constexpr uint32_t kGradientsCheckedTag =
    WireTag(v1::StepRequest::kGradientsCheckedFieldNumber, kVarint);
constexpr uint32_t kLrFloat32Tag = WireTag(v1::StepRequest::kLrFloat32FieldNumber, kFixed32);
constexpr uint32_t kGradScaleTag = WireTag(v1::StepRequest::kGradScaleFieldNumber, kFixed32);
constexpr uint32_t kParamDtypeTag = WireTag(v1::StepRequest::kParamDtypeFieldNumber, kVarint);
constexpr uint32_t kGroupElementsTag = WireTag(v1::StepRequest::kGroupElementsFieldNumber, kVarint);
constexpr uint32_t kPlanTag = WireTag(v1::StepRequest::kPlanFieldNumber, kVarint);
constexpr uint32_t kGradientRegionTag =
    LengthDelimitedTag(v1::StepRequest::kGradientRegionFieldNumber);
constexpr uint32_t kParamsRegionTag = LengthDelimitedTag(v1::StepRequest::kParamsRegionFieldNumber);
constexpr uint32_t kRegionSessionTag =
    LengthDelimitedTag(v1::StepRequest::kRegionSessionFieldNumber);
constexpr uint32_t kSliceRegionTag = WireTag(v1::RegionSlice::kRegionFieldNumber, kVarint);
constexpr uint32_t kSliceOffsetTag = WireTag(v1::RegionSlice::kOffsetFieldNumber, kVarint);
constexpr uint32_t kSliceBytesTag = WireTag(v1::RegionSlice::kBytesFieldNumber, kVarint);

// The slices of a message, one after another, as protobuf's input stream.
class SlicesInputStream : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SlicesInputStream(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    if (backed_up_ > 0) {  // What BackUp returned, from the current slice.
      *data = slices_[index_ - 1].begin() + slices_[index_ - 1].size() - backed_up_;
      *size = static_cast<int>(backed_up_);
      count_ += backed_up_;
      backed_up_ = 0;
      return true;
    }
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
    if (index_ == slices_.size()) return false;
    const grpc::Slice& slice = slices_[index_++];
    *data = slice.begin();
    *size = static_cast<int>(slice.size());
    count_ += slice.size();
    return true;
  }
  void BackUp(int count) override {
    backed_up_ = static_cast<size_t>(count);
    count_ -= backed_up_;
  }
  bool Skip(int count) override {
    const void* data = nullptr;
    int size = 0;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return static_cast<int64_t>(count_); }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;      // The next slice to hand out.
  size_t backed_up_ = 0;  // Bytes at the end of slice index_-1 handed back.
  size_t count_ = 0;
};

// Protobuf's parser reads tags and lengths of at most 5 bytes, and nests
// messages and groups at most this deep; CodedInputStream's own readers take
// 10-byte varints (dropping the bits past 32), so these checks are ours.
constexpr int kMaxDepth = 100;

// A tag of at most 5 bytes (bits past 32 dropped, as protobuf does), with a
// field number.
bool ReadTag(CodedInputStream* input, uint32_t* tag) {
  const int before = input->CurrentPosition();
  uint64_t value = 0;
  if (!input->ReadVarint64(&value) || input->CurrentPosition() - before > 5) return false;
  *tag = static_cast<uint32_t>(value);
  return WireFormatLite::GetTagFieldNumber(*tag) != 0;
}

// A length-delimited field's length: at most 5 bytes, within what is left.
bool ReadLength(CodedInputStream* input, uint64_t* length) {
  const int before = input->CurrentPosition();
  return input->ReadVarint64(length) && input->CurrentPosition() - before <= 5 &&
         input->BytesUntilLimit() >= 0 &&
         *length <= static_cast<uint64_t>(input->BytesUntilLimit());
}

// Skips the field `tag` starts (read already) in a message nested `depth`
// deep; false when it is malformed, as protobuf's parser would find it.
bool SkipField(CodedInputStream* input, uint32_t tag, int depth) {
  uint64_t value = 0;
  uint32_t fixed = 0;
  switch (WireFormatLite::GetTagWireType(tag)) {
    case WireFormatLite::WIRETYPE_VARINT:
      return input->ReadVarint64(&value);
    case WireFormatLite::WIRETYPE_FIXED64:
      return input->ReadLittleEndian64(&value);
    case WireFormatLite::WIRETYPE_FIXED32:
      return input->ReadLittleEndian32(&fixed);
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
      return ReadLength(input, &value) && input->Skip(static_cast<int>(value));
    case WireFormatLite::WIRETYPE_START_GROUP: {
      if (depth + 1 > kMaxDepth) return false;
      for (;;) {
        uint32_t inner = 0;
        if (input->BytesUntilLimit() == 0 || !ReadTag(input, &inner)) return false;
        if (WireFormatLite::GetTagWireType(inner) == WireFormatLite::WIRETYPE_END_GROUP) {
          return WireFormatLite::GetTagFieldNumber(inner) == WireFormatLite::GetTagFieldNumber(tag);
        }
        if (!SkipField(input, inner, depth + 1)) return false;
      }
    }
    default:  // An end-group tag outside a group, or wire type 6 or 7.
      return false;
  }
}

absl::Status NotAStepRequest(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("the message is not a StepRequest (malformed protobuf: ", why,
                   "); send optstate.v1.StepRequest"));
}

class RequestScanner {
 public:
  RequestScanner(size_t max_packed, StepMessage* message)
      : max_packed_(max_packed), message_(message) {}

  absl::Status Scan(CodedInputStream* input) {
    message_->gradients.emplace_back();
    return ScanMessage(input, /*piece=*/0, /*depth=*/0, &message_->request);
  }

 private:
  // One StepRequest up to the input's limit: the outer one (piece 0, depth
  // 0) or one packed in its `more` (piece i, depth 1).
  absl::Status ScanMessage(CodedInputStream* input, size_t piece, int depth,
                           v1::StepRequest* fields) {
    while (input->BytesUntilLimit() != 0) {
      uint32_t tag = 0;
      if (!ReadTag(input, &tag)) return NotAStepRequest("a malformed or zero field tag");
      absl::Status status;
      if (tag == kStepGradientTag) {
        status = ScanGradient(input, piece);
      } else if (tag == kStepMoreTag) {
        status = ScanPacked(input, piece, fields);
      } else if (!ParseField(input, tag, depth, fields)) {
        status = NotAStepRequest(
            absl::StrCat("field ", WireFormatLite::GetTagFieldNumber(tag), " is malformed"));
      }
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // The gradient field (after its tag): where its bytes lie. A later
  // occurrence replaces an earlier one, as in protobuf.
  absl::Status ScanGradient(CodedInputStream* input, size_t piece) {
    uint64_t length = 0;
    if (!ReadLength(input, &length)) return NotAStepRequest("a malformed gradient field");
    SegmentedBytes& gradient = message_->gradients[piece];
    gradient.Clear();
    while (length > 0) {
      const void* data = nullptr;
      int size = 0;
      if (!input->GetDirectBufferPointer(&data, &size) || size <= 0) {
        return NotAStepRequest("the gradient runs past the end of the message");
      }
      const uint64_t take = std::min(length, static_cast<uint64_t>(size));
      gradient.Append(absl::string_view(static_cast<const char*>(data), take));
      input->Skip(static_cast<int>(take));
      length -= take;
    }
    return absl::OkStatus();
  }

  // A chunk packed in `more` (after the field's tag).
  absl::Status ScanPacked(CodedInputStream* input, size_t piece, v1::StepRequest* fields) {
    uint64_t length = 0;
    if (!ReadLength(input, &length)) return NotAStepRequest("a malformed `more` field");
    if (piece != 0) {
      // Refused by the caller, naming the chunk; its contents are not read.
      fields->add_more();
      input->Skip(static_cast<int>(length));
      return absl::OkStatus();
    }
    if (static_cast<size_t>(fields->more_size()) >= max_packed_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the message packs more than ", max_packed_, " chunks in StepRequest.more; at most ",
          max_packed_, " (send the rest in further messages)"));
    }
    const size_t packed = message_->gradients.size();
    message_->gradients.emplace_back();
    const CodedInputStream::Limit outer = input->PushLimit(static_cast<int>(length));
    absl::Status status = ScanMessage(input, packed, /*depth=*/1, fields->add_more());
    input->PopLimit(outer);
    return status;
  }

  // A RegionSlice field's message (after its tag), in a StepRequest nested
  // `depth` deep, merged into `slice` as protobuf merges a repeated message
  // field; false when malformed.
  static bool ParseRegionSlice(CodedInputStream* input, int depth, v1::RegionSlice* slice) {
    uint64_t length = 0;
    if (!ReadLength(input, &length) || depth + 1 > kMaxDepth) return false;
    const CodedInputStream::Limit outer = input->PushLimit(static_cast<int>(length));
    bool ok = true;
    while (ok && input->BytesUntilLimit() != 0) {
      uint32_t tag = 0;
      uint64_t varint = 0;
      if (!ReadTag(input, &tag)) {
        ok = false;
      } else if (tag == kSliceRegionTag || tag == kSliceOffsetTag || tag == kSliceBytesTag) {
        ok = input->ReadVarint64(&varint);
        if (tag == kSliceRegionTag) slice->set_region(varint);
        if (tag == kSliceOffsetTag) slice->set_offset(varint);
        if (tag == kSliceBytesTag) slice->set_bytes(varint);
      } else {
        ok = SkipField(input, tag, depth + 1);
      }
    }
    input->PopLimit(outer);
    return ok;
  }

  // Any other field of a message nested `depth` deep, as protobuf parses it
  // into `fields`; false when malformed.
  static bool ParseField(CodedInputStream* input, uint32_t tag, int depth,
                         v1::StepRequest* fields) {
    uint64_t varint = 0;
    uint32_t fixed = 0;
    switch (tag) {
      case kGroupTag:
        return ReadLength(input, &varint) &&
               input->ReadString(fields->mutable_group(), static_cast<int>(varint)) &&
               WireFormatLite::VerifyUtf8String(fields->group().data(),
                                                static_cast<int>(fields->group().size()),
                                                WireFormatLite::PARSE, "StepRequest.group");
      case kStepTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_step(varint);
        return true;
      case kOffsetTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_offset(varint);
        return true;
      case kGroupElementsTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_group_elements(varint);
        return true;
      case kGradientDtypeTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_gradient_dtype(static_cast<v1::DType>(static_cast<int32_t>(varint)));
        return true;
      case kParamDtypeTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_param_dtype(static_cast<v1::DType>(static_cast<int32_t>(varint)));
        return true;
      case kLrTag: {
        uint64_t fixed64 = 0;
        if (!input->ReadLittleEndian64(&fixed64)) return false;
        fields->set_lr(absl::bit_cast<double>(fixed64));
        return true;
      }
      case kBeta1Tag:
      case kBeta2Tag:
      case kEpsTag:
      case kWeightDecayTag: {
        uint64_t fixed64 = 0;
        if (!input->ReadLittleEndian64(&fixed64)) return false;
        const double value = absl::bit_cast<double>(fixed64);
        if (tag == kBeta1Tag) fields->set_beta1(value);
        if (tag == kBeta2Tag) fields->set_beta2(value);
        if (tag == kEpsTag) fields->set_eps(value);
        if (tag == kWeightDecayTag) fields->set_weight_decay(value);
        return true;
      }
      case kMaximizeTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_maximize(varint != 0);
        return true;
      case kGradientsCheckedTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_gradients_checked(varint != 0);
        return true;
      case kPlanTag:
        if (!input->ReadVarint64(&varint)) return false;
        fields->set_plan(varint);
        return true;
      case kLrFloat32Tag:
        if (!input->ReadLittleEndian32(&fixed)) return false;
        fields->set_lr_float32(absl::bit_cast<float>(fixed));
        return true;
      case kGradScaleTag:
        if (!input->ReadLittleEndian32(&fixed)) return false;
        fields->set_grad_scale(absl::bit_cast<float>(fixed));
        return true;
      case kGradientRegionTag:
        return ParseRegionSlice(input, depth, fields->mutable_gradient_region());
      case kParamsRegionTag:
        return ParseRegionSlice(input, depth, fields->mutable_params_region());
      case kRegionSessionTag:
        return ReadLength(input, &varint) &&
               input->ReadString(fields->mutable_region_session(), static_cast<int>(varint));
      default:  // Unknown fields, and known ones of another wire type: skipped, as protobuf does.
        return SkipField(input, tag, depth);
    }
  }

  const size_t max_packed_;
  StepMessage* const message_;
};

}  // namespace

absl::Status ReadStepRequest(grpc::ByteBuffer* buffer, size_t max_packed, StepMessage* message) {
  message->request.Clear();
  message->gradients.clear();
  message->slices.Clear();
  const size_t total = buffer->Length();
  const grpc::Status dumped = message->slices.TakeFrom(buffer);
  if (!dumped.ok()) return NotAStepRequest("its bytes cannot be read");
  if (total > static_cast<size_t>(INT_MAX)) return NotAStepRequest("larger than 2 GiB");
  SlicesInputStream stream(message->slices.slices());
  CodedInputStream input(&stream);
  input.SetTotalBytesLimit(INT_MAX);
  input.PushLimit(static_cast<int>(total));
  absl::Status status = RequestScanner(max_packed, message).Scan(&input);
  if (!status.ok()) {
    message->request.Clear();
    message->gradients.clear();
    message->slices.Clear();
  }
  return status;
}

}  // namespace optstate
