// Request serialization into one slice, and a StepResponse parser that reads
// the params field in place from the reply's slices.
#include "client/transport/wire/step_wire.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpc/slice.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "optstate/v1/step_wire_format.h"

namespace optstate::client_internal {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

constexpr uint32_t kGroupTag = LengthDelimitedTag(v1::StepResponse::kGroupFieldNumber);

// Widens a byte stream of `type` elements arriving in pieces of any length
// into consecutive floats at `out` (an element split between pieces is
// joined), or copies the bytes as they are to `raw_out` when it is not null.
class WideningSink {
 public:
  WideningSink(WireType type, float* out, unsigned char* raw_out = nullptr)
      : type_(type), out_(out), raw_out_(raw_out) {}

  void Feed(const unsigned char* bytes, size_t n) {
    if (raw_out_ != nullptr || type_ == WireType::kFloat32) {  // No element to join.
      unsigned char* to = raw_out_ != nullptr ? raw_out_ : reinterpret_cast<unsigned char*>(out_);
      std::memcpy(to + bytes_, bytes, n);
      bytes_ += n;
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
  unsigned char* const raw_out_;
  size_t bytes_ = 0;     // Copies: bytes written.
  size_t elements_ = 0;  // Widening 2-byte types: elements written.
  unsigned char carry_ = 0;
  bool has_carry_ = false;
};

absl::Status NotAStepResponse(absl::string_view what) {
  return absl::InternalError(absl::StrCat("a Step reply is not a StepResponse: ", what));
}

size_t PieceElements(const RequestPiece& piece) {
  return piece.gradient16.empty() ? piece.gradient.size() : piece.gradient16.size();
}

}  // namespace

grpc::ByteBuffer SerializeStepRequest(absl::Span<const RequestPiece> pieces, WireType type,
                                      std::vector<const unsigned char*>* payloads) {
  // Each piece as a message: fields, then the gradient field.
  absl::InlinedVector<size_t, 16> message_bytes(pieces.size());
  size_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t gradient_bytes = PieceElements(pieces[i]) * WireTypeSize(type);
    message_bytes[i] = pieces[i].fields->ByteSizeLong() +
                       CodedOutputStream::VarintSize32(kStepGradientTag) +
                       CodedOutputStream::VarintSize64(gradient_bytes) + gradient_bytes;
    total += message_bytes[i];
    if (i > 0) {  // Wrapped in a `more` field.
      total += CodedOutputStream::VarintSize32(kStepMoreTag) +
               CodedOutputStream::VarintSize64(message_bytes[i]);
    }
  }
  // Refcounted even when small, so payload pointers point into memory every copy shares.
  grpc_slice slice = grpc_slice_malloc_large(total);
  uint8_t* at = GRPC_SLICE_START_PTR(slice);
  if (payloads != nullptr) payloads->clear();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) {
      at = CodedOutputStream::WriteVarint32ToArray(kStepMoreTag, at);
      at = CodedOutputStream::WriteVarint64ToArray(message_bytes[i], at);
    }
    const size_t elements = PieceElements(pieces[i]);
    const size_t gradient_bytes = elements * WireTypeSize(type);
    at = pieces[i].fields->SerializeWithCachedSizesToArray(at);
    at = CodedOutputStream::WriteVarint32ToArray(kStepGradientTag, at);
    at = CodedOutputStream::WriteVarint64ToArray(gradient_bytes, at);
    if (pieces[i].gradient16.empty()) {
      EncodeFromFloat(type, pieces[i].gradient.data(), at, elements);
    } else if (gradient_bytes != 0) {
      std::memcpy(at, pieces[i].gradient16.data(), gradient_bytes);
    }
    if (payloads != nullptr) payloads->push_back(at);
    at += gradient_bytes;
  }
  grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&owned, 1);
}

namespace {

// One pass of ParseStepResponse over a reply. The first pass (`widen`
// false) parses every reply's fields into `fields` (the packed ones into
// fields->more) and checks the params' lengths; the second widens the params
// into the pieces' params_out.
class ReplyScanner {
 public:
  ReplyScanner(WireType type, absl::Span<const ReplyPiece> pieces, bool widen)
      : type_(type), pieces_(pieces), widen_(widen), saw_params_(pieces.size(), false) {}

  absl::Status Scan(grpc::ByteBuffer* reply, size_t total, v1::StepResponse* fields) {
    grpc::ProtoBufferReader reader(reply);  // Reads without consuming the buffer.
    if (!reader.status().ok()) return NotAStepResponse("its bytes cannot be read");
    CodedInputStream input(&reader);
    input.SetTotalBytesLimit(INT_MAX);
    input.PushLimit(static_cast<int>(total));
    if (absl::Status s = ScanMessage(&input, 0, fields); !s.ok()) return s;
    if (packed_ + 1 != pieces_.size()) {
      return absl::InternalError(absl::StrCat("a Step reply packs ", packed_,
                                              " replies in `more`; its request packed ",
                                              pieces_.size() - 1));
    }
    for (size_t i = 0; i < pieces_.size(); ++i) {
      if (!saw_params_[i] && pieces_[i].elements != 0) {
        return absl::InternalError(absl::StrCat(
            "a Step reply carries no params", i == 0 ? "" : absl::StrCat(" in more[", i - 1, "]"),
            "; expected ", pieces_[i].elements * WireTypeSize(type_), " bytes"));
      }
    }
    return absl::OkStatus();
  }

 private:
  // Scans one StepResponse up to the input's limit: the outer reply
  // (piece 0), or the one packed for `piece`. `fields` is null when widening.
  absl::Status ScanMessage(CodedInputStream* input, size_t piece, v1::StepResponse* fields) {
    while (input->BytesUntilLimit() > 0) {
      const uint32_t tag = input->ReadTag();
      if (tag == 0 || WireFormatLite::GetTagFieldNumber(tag) == 0) {
        return NotAStepResponse("a malformed or zero field tag");
      }
      if (tag == kStepParamsTag) {
        if (absl::Status s = ScanParams(input, piece); !s.ok()) return s;
        continue;
      }
      if (tag == kStepMoreTag) {
        if (absl::Status s = ScanPacked(input, piece, fields); !s.ok()) return s;
        continue;
      }
      bool ok = true;
      if (widen_) {
        ok = WireFormatLite::SkipField(input, tag);  // Parsed in the first pass.
      } else {
        ok = ParseField(input, tag, fields);
      }
      if (!ok) {
        return NotAStepResponse(
            absl::StrCat("field ", WireFormatLite::GetTagFieldNumber(tag), " is malformed"));
      }
    }
    return absl::OkStatus();
  }

  // A reply packed in the outer one's `more` (after its tag).
  absl::Status ScanPacked(CodedInputStream* input, size_t piece, v1::StepResponse* fields) {
    uint64_t length = 0;
    if (!input->ReadVarint64(&length) ||
        length > static_cast<uint64_t>(std::max(0, input->BytesUntilLimit()))) {
      return NotAStepResponse("a malformed `more` field");
    }
    if (piece != 0) return NotAStepResponse("a packed reply packs replies itself");
    if (++packed_ >= pieces_.size()) {
      return absl::InternalError(absl::StrCat("a Step reply packs more than the ",
                                              pieces_.size() - 1, " replies its request packed"));
    }
    const CodedInputStream::Limit outer = input->PushLimit(static_cast<int>(length));
    absl::Status status = ScanMessage(input, packed_, widen_ ? nullptr : fields->add_more());
    input->PopLimit(outer);
    return status;
  }

  // The params field of `piece`'s reply (after its tag).
  absl::Status ScanParams(CodedInputStream* input, size_t piece) {
    const size_t expected_bytes = pieces_[piece].elements * WireTypeSize(type_);
    uint64_t length = 0;
    if (!input->ReadVarint64(&length)) return NotAStepResponse("a malformed params length");
    if (length != expected_bytes) {
      return absl::InternalError(
          absl::StrCat("a Step reply carries ", length, " bytes of params",
                       piece == 0 ? "" : absl::StrCat(" in more[", piece - 1, "]"), "; expected ",
                       expected_bytes, " (elements of ", WireTypeName(type_), ")"));
    }
    const ReplyPiece& out = pieces_[piece];
    const bool write = widen_ && (!out.params_out.empty() || !out.params_out16.empty());
    WideningSink sink(type_, out.params_out.data(),
                      reinterpret_cast<unsigned char*>(out.params_out16.data()));
    size_t left = expected_bytes;
    while (left > 0) {
      const void* data = nullptr;
      int size = 0;
      if (!input->GetDirectBufferPointer(&data, &size) || size <= 0) break;
      const size_t take = std::min(left, static_cast<size_t>(size));
      if (write) sink.Feed(static_cast<const unsigned char*>(data), take);
      input->Skip(static_cast<int>(take));
      left -= take;
    }
    if (left > 0) return NotAStepResponse("the params field runs past the end of the message");
    saw_params_[piece] = true;
    return absl::OkStatus();
  }

  // Any field but params and more, as protobuf would parse it into `fields`.
  static bool ParseField(CodedInputStream* input, uint32_t tag, v1::StepResponse* fields) {
    // A varint field: read, then stored by `set`.
    auto varint = [input](auto set) {
      uint64_t value = 0;
      if (!input->ReadVarint64(&value)) return false;
      set(value);
      return true;
    };
    constexpr auto kVarint = WireFormatLite::WIRETYPE_VARINT;
    switch (tag) {
      case kGroupTag:
        return WireFormatLite::ReadString(input, fields->mutable_group()) &&
               WireFormatLite::VerifyUtf8String(fields->group().data(),
                                                static_cast<int>(fields->group().size()),
                                                WireFormatLite::PARSE, "StepResponse.group");
      case WireTag(v1::StepResponse::kStepFieldNumber, kVarint):
        return varint([fields](uint64_t v) { fields->set_step(v); });
      case WireTag(v1::StepResponse::kOffsetFieldNumber, kVarint):
        return varint([fields](uint64_t v) { fields->set_offset(v); });
      case WireTag(v1::StepResponse::kNumElementsFieldNumber, kVarint):
        return varint([fields](uint64_t v) { fields->set_num_elements(v); });
      case WireTag(v1::StepResponse::kParamDtypeFieldNumber, kVarint):
        return varint([fields](uint64_t v) {
          fields->set_param_dtype(static_cast<v1::DType>(static_cast<int32_t>(v)));
        });
      case WireTag(v1::StepResponse::kPagesAppliedFieldNumber, kVarint):
        return varint([fields](uint64_t v) { fields->set_pages_applied(v); });
      case WireTag(v1::StepResponse::kPagesReplayedFieldNumber, kVarint):
        return varint([fields](uint64_t v) { fields->set_pages_replayed(v); });
      default:  // Unknown fields, or a wrong wire type: skipped, as protobuf does.
        return WireFormatLite::SkipField(input, tag);
    }
  }

  const WireType type_;
  const absl::Span<const ReplyPiece> pieces_;
  const bool widen_;
  std::vector<bool> saw_params_;
  size_t packed_ = 0;  // Replies seen in `more`.
};

}  // namespace

absl::Status ParseStepResponse(
    grpc::ByteBuffer* reply, WireType type, absl::Span<const ReplyPiece> pieces,
    absl::FunctionRef<absl::Status(size_t, const v1::StepResponse&)> check,
    v1::StepResponse* fields) {
  const size_t total = reply->Length();
  absl::Status status;
  for (size_t i = 0; i < pieces.size() && status.ok(); ++i) {
    const ReplyPiece& piece = pieces[i];
    if (!piece.params_out.empty() && piece.params_out.size() != piece.elements) {
      status =
          absl::InternalError(absl::StrCat("params_out holds ", piece.params_out.size(),
                                           " floats for a reply of ", piece.elements, " elements"));
    } else if (!piece.params_out16.empty() &&
               (piece.params_out16.size() != piece.elements || WireTypeSize(type) != 2 ||
                !piece.params_out.empty())) {
      status = absl::InternalError(absl::StrCat(
          "params_out16 holds ", piece.params_out16.size(), " elements for a reply of ",
          piece.elements, " elements of ", WireTypeName(type),
          piece.params_out.empty() ? "" : ", and params_out is given too"));
    }
  }
  if (status.ok() && pieces.empty()) status = absl::InternalError("a reply to no chunk");
  if (status.ok() && total > static_cast<size_t>(INT_MAX)) {
    status = NotAStepResponse("larger than 2 GiB");
  }
  if (status.ok()) status = ReplyScanner(type, pieces, /*widen=*/false).Scan(reply, total, fields);
  for (size_t i = 0; i < pieces.size() && status.ok(); ++i) {
    status = check(i, i == 0 ? *fields : fields->more(static_cast<int>(i - 1)));
  }
  bool any_out = false;
  for (const ReplyPiece& piece : pieces) {
    any_out |= !piece.params_out.empty() || !piece.params_out16.empty();
  }
  if (status.ok() && any_out) {
    status = ReplyScanner(type, pieces, /*widen=*/true).Scan(reply, total, nullptr);
  }
  reply->Clear();
  return status;
}

}  // namespace optstate::client_internal
