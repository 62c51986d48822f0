// Client::Step: checks the whole step, has PlanChunks cut it into messages
// of page-aligned chunks, checks every gradient finite as it will be sent,
// and streams the messages with a bounded window; on a transient failure it
// resends only the messages that got no reply (the server applies each page
// exactly once).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client_impl.h"
#include "client/step/plan_chunks.h"
#include "client/transport/wire/step_wire.h"
#include "optstate/v1/dtype_proto.h"

namespace optstate {

namespace client_internal {

void ChunkFields(const GroupStep& group, const ChunkPiece& piece, uint64_t step,
                 const StepOptions& options, v1::StepRequest* fields) {
  fields->Clear();
  fields->set_group(group.group);
  fields->set_step(step);
  fields->set_offset(piece.offset);
  fields->set_group_elements(group.gradient.size());
  fields->set_gradient_dtype(WireTypeToProto(options.gradient_dtype));
  fields->set_param_dtype(WireTypeToProto(options.param_dtype));
  if (group.lr) {
    fields->set_lr(*group.lr);
  } else if (options.lr) {
    fields->set_lr(*options.lr);
  }
  if (options.grad_scale) fields->set_grad_scale(*options.grad_scale);
}

}  // namespace client_internal

using client_internal::Backoff;
using client_internal::ChunkFields;
using client_internal::ChunkGroup;
using client_internal::ChunkLimits;
using client_internal::ChunkPiece;
using client_internal::FromGrpcStatus;
using client_internal::IsRetryable;
using client_internal::PagesPerChunk;
using client_internal::PlanChunks;
using client_internal::PlannedPieces;
using client_internal::SetDeadline;

namespace {

// One request as PlanChunks planned it: a chunk, and the chunks packed after
// it in StepRequest.more (small tensors share a message). The unit of
// sending and resending.
struct PlannedChunk {
  PlannedPieces pieces;
  // The whole request, when narrowed ahead of sending (and kept for resends).
  std::optional<grpc::ByteBuffer> request;
};

// The most of a step's narrowed gradient the client narrows ahead of sending
// (and holds until the step ends): checking the narrowed bytes saves a pass
// over the float gradient; later chunks are checked from the floats and
// narrowed when sent.
constexpr size_t kMaxPreparedBytes = 64 << 20;

// Whether a view holds 16-bit elements (made by Of16Bit) rather than floats.
bool Is16Bit(const ConstBufferView& view) { return view.element_bytes() == 2; }
bool Is16Bit(const BufferView& view) { return view.element_bytes() == 2; }

// Elements [offset, offset + count) of a view as floats; empty when the view
// is empty or 16-bit.
absl::Span<const float> FloatPart(const ConstBufferView& view, uint64_t offset, uint64_t count) {
  if (view.empty() || Is16Bit(view)) return {};
  return absl::MakeConstSpan(static_cast<const float*>(view.data()) + offset, count);
}
absl::Span<float> FloatPart(const BufferView& view, uint64_t offset, uint64_t count) {
  if (view.empty() || Is16Bit(view)) return {};
  return absl::MakeSpan(static_cast<float*>(view.data()) + offset, count);
}

// The same as 16-bit elements; empty when the view is empty or float32.
absl::Span<const uint16_t> SixteenBitPart(const ConstBufferView& view, uint64_t offset,
                                          uint64_t count) {
  if (view.empty() || !Is16Bit(view)) return {};
  return absl::MakeConstSpan(static_cast<const uint16_t*>(view.data()) + offset, count);
}
absl::Span<uint16_t> SixteenBitPart(const BufferView& view, uint64_t offset, uint64_t count) {
  if (view.empty() || !Is16Bit(view)) return {};
  return absl::MakeSpan(static_cast<uint16_t*>(view.data()) + offset, count);
}

// The element at `i` of the gradient as the caller gave it (a 16-bit one widened).
float GivenValue(const GroupStep& group, size_t i) {
  float value;
  if (Is16Bit(group.gradient)) {
    DecodeToFloat(group.gradient.dtype(), static_cast<const uint16_t*>(group.gradient.data()) + i,
                  &value, 1);
  } else {
    value = static_cast<const float*>(group.gradient.data())[i];
  }
  return value;
}

// Whether the element at `i` of the gradient is finite as the server sees it.
bool FiniteAsSent(const GroupStep& group, const StepOptions& options, size_t i) {
  float value = GivenValue(group, i);
  if (options.gradient_dtype != WireType::kFloat32) {
    unsigned char wire[2];
    EncodeFromFloat(options.gradient_dtype, &value, wire, 1);
    DecodeToFloat(options.gradient_dtype, wire, &value, 1);
  }
  return std::fabs(value * options.grad_scale.value_or(1.0f)) <= FLT_MAX;
}

// INVALID_ARGUMENT naming the first element of `group`'s gradient, from
// `from` on, that is not finite as the server will see it.
absl::Status NotFiniteError(const GroupStep& group, const StepOptions& options, size_t from) {
  const size_t n = group.gradient.size();
  size_t bad = from;
  while (bad < n && FiniteAsSent(group, options, bad)) ++bad;
  return absl::InvalidArgumentError(absl::StrCat(
      "gradient of group '", group.group, "' at element ", bad, " is ",
      bad < n ? GivenValue(group, bad) : 0.0f, ", which is not finite as ",
      WireTypeName(options.gradient_dtype), " after grad_scale ", options.grad_scale.value_or(1.0f),
      "; the whole step was refused and nothing was sent"));
}

// The check with |grad_scale| > 1, where a finite narrowed value can still
// overflow: each block is narrowed and widened as the server will (a 16-bit
// gradient only widened), then scaled.
absl::Status CheckFiniteScaled(const GroupStep& group, const StepOptions& options) {
  const float scale = options.grad_scale.value_or(1.0f);
  constexpr size_t kBlock = 4096;
  float widened[kBlock];
  uint16_t narrowed[kBlock];
  const size_t total = group.gradient.size();
  for (size_t begin = 0; begin < total; begin += kBlock) {
    const size_t n = std::min(kBlock, total - begin);
    const float* values = widened;
    if (Is16Bit(group.gradient)) {
      DecodeToFloat(options.gradient_dtype, SixteenBitPart(group.gradient, begin, n).data(),
                    widened, n);
    } else if (options.gradient_dtype != WireType::kFloat32) {
      EncodeFromFloat(options.gradient_dtype, FloatPart(group.gradient, begin, n).data(), narrowed,
                      n);
      DecodeToFloat(options.gradient_dtype, narrowed, widened, n);
    } else {
      values = FloatPart(group.gradient, begin, n).data();
    }
    bool all_finite = true;
    for (size_t i = 0; i < n; ++i) all_finite &= std::fabs(values[i] * scale) <= FLT_MAX;
    if (!all_finite) return NotFiniteError(group, options, begin);
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT when a 16-bit buffer of `group` is not bfloat16 or
// float16, or not of the wire type StepOptions gives it (GroupStep).
absl::Status CheckBufferForms(const GroupStep& group, const StepOptions& options) {
  auto is_16_bit_type = [](WireType type) {
    return type == WireType::kBFloat16 || type == WireType::kFloat16;
  };
  if ((Is16Bit(group.gradient) && !is_16_bit_type(group.gradient.dtype())) ||
      (Is16Bit(group.params_out) && !is_16_bit_type(group.params_out.dtype()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.group, "' gives a ",
        Is16Bit(group.gradient) && !is_16_bit_type(group.gradient.dtype()) ? "gradient"
                                                                           : "params_out",
        " made by Of16Bit with a dtype that is not bfloat16 or float16; a float32 buffer "
        "is a span of floats"));
  }
  if (Is16Bit(group.gradient) && !group.gradient.empty() &&
      group.gradient.dtype() != options.gradient_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.group, "' gives a ", WireTypeName(group.gradient.dtype()),
        " gradient, which is sent as it is and needs StepOptions.gradient_dtype ",
        WireTypeName(group.gradient.dtype()), " (it is ", WireTypeName(options.gradient_dtype),
        "); set it, or give float32 values to have them narrowed"));
  }
  if (Is16Bit(group.params_out) && !group.params_out.empty() &&
      group.params_out.dtype() != options.param_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.group, "' gives a ", WireTypeName(group.params_out.dtype()),
        " params_out, which receives the params as they arrive and needs "
        "StepOptions.param_dtype ",
        WireTypeName(group.params_out.dtype()), " (it is ", WireTypeName(options.param_dtype),
        "); set it, or give a float32 params_out to have them widened"));
  }
  return absl::OkStatus();
}

// The request for `chunk`, its gradients narrowed into it; `payloads` gets
// each piece's narrowed gradient. `fields` is scratch, reused across calls.
grpc::ByteBuffer BuildRequest(absl::Span<const GroupStep> groups, const PlannedChunk& chunk,
                              uint64_t step, const StepOptions& options,
                              std::vector<v1::StepRequest>* fields,
                              std::vector<const unsigned char*>* payloads = nullptr) {
  if (fields->size() < chunk.pieces.size()) fields->resize(chunk.pieces.size());
  absl::InlinedVector<client_internal::RequestPiece, 16> pieces;
  for (size_t k = 0; k < chunk.pieces.size(); ++k) {
    const ChunkPiece& piece = chunk.pieces[k];
    const GroupStep& group = groups[piece.group];
    ChunkFields(group, piece, step, options, &(*fields)[k]);
    pieces.push_back({&(*fields)[k], FloatPart(group.gradient, piece.offset, piece.count),
                      SixteenBitPart(group.gradient, piece.offset, piece.count)});
  }
  return client_internal::SerializeStepRequest(pieces, options.gradient_dtype, payloads);
}

// Refuses the step if any gradient element is not finite as the server will
// see it: narrowed to the wire type, widened back, times grad_scale. With
// |grad_scale| <= 1 the product is finite exactly when the narrowed value is,
// so the first chunks (up to kMaxPreparedBytes) are narrowed into their
// requests and checked there, and the rest are checked from the float bits;
// a larger scale takes CheckFiniteScaled. Chunks are checked in order, so the
// error names the step's first bad element.
absl::Status CheckAndPrepare(absl::Span<const GroupStep> groups, uint64_t step,
                             const StepOptions& options, std::vector<PlannedChunk>* chunks) {
  const WireType type = options.gradient_dtype;
  if (std::fabs(options.grad_scale.value_or(1.0f)) > 1.0f) {
    for (const GroupStep& group : groups) {
      if (absl::Status s = CheckFiniteScaled(group, options); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  size_t prepared = 0;
  std::vector<v1::StepRequest> fields;
  std::vector<const unsigned char*> payloads;
  for (PlannedChunk& chunk : *chunks) {
    size_t bytes = 0;
    for (const ChunkPiece& piece : chunk.pieces) bytes += piece.count * WireTypeSize(type);
    const bool prepare = prepared + bytes <= kMaxPreparedBytes;
    if (prepare) {
      chunk.request = BuildRequest(groups, chunk, step, options, &fields, &payloads);
      prepared += bytes;
    }
    for (size_t k = 0; k < chunk.pieces.size(); ++k) {
      const ChunkPiece& piece = chunk.pieces[k];
      const GroupStep& group = groups[piece.group];
      bool finite;
      if (prepare) {
        finite = AllWireFinite(type, payloads[k], piece.count);
      } else if (Is16Bit(group.gradient)) {
        finite = AllWireFinite(
            type, SixteenBitPart(group.gradient, piece.offset, piece.count).data(), piece.count);
      } else {
        finite = AllNarrowToFinite(
            type, FloatPart(group.gradient, piece.offset, piece.count).data(), piece.count);
      }
      if (!finite) return NotFiniteError(group, options, piece.offset);
    }
  }
  return absl::OkStatus();
}

// The send window of one stream: the writer thread waits in it for room,
// the reading thread counts replies into it. Thread-safe.
class SendWindow {
 public:
  explicit SendWindow(size_t size) : size_(size) {}

  // Blocks until message `i` (0, 1, ...) may be written, that is fewer than
  // `size` messages before it are unanswered; false once Stop was called.
  bool WaitForRoom(size_t i) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (!stopped_ && i - answered_ >= size_) room_.Wait(&mu_);
    return !stopped_;
  }

  void Answered() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++answered_;
    room_.Signal();
  }

  // Wakes the writer for good (the reader is done); returns the replies counted.
  size_t Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    room_.Signal();
    return answered_;
  }

 private:
  const size_t size_;
  absl::Mutex mu_;
  absl::CondVar room_;
  size_t answered_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// One stream carrying `pending` chunks; clears each answered chunk from it.
absl::Status RunStream(grpc::ChannelInterface* channel, const grpc::internal::RpcMethod& method,
                       const ClientOptions& client_options, absl::Span<const GroupStep> groups,
                       uint64_t step, const StepOptions& options,
                       std::vector<PlannedChunk>* pending) {
  grpc::ClientContext context;
  SetDeadline(&context, client_options);
  // A raw stream (client/step_wire.h), created as generated stubs do, with
  // gRPC's internal factory (stable across the 1.x releases we build with).
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, method, &context));

  SendWindow window(static_cast<size_t>(client_options.max_chunks_in_flight));
  const size_t total = pending->size();

  std::thread writer([&] {
    std::vector<v1::StepRequest> fields;  // All but the gradients.
    for (size_t i = 0; i < total; ++i) {
      if (!window.WaitForRoom(i)) break;
      const PlannedChunk& chunk = (*pending)[i];
      grpc::ByteBuffer request;
      if (chunk.request) {
        request = *chunk.request;  // Shares its slice.
      } else {
        request = BuildRequest(groups, chunk, step, options, &fields);
      }
      if (!stream->Write(request)) break;  // The stream broke; Finish says why.
    }
    stream->WritesDone();
  });

  absl::Status mismatch;
  std::vector<bool> done(total, false);
  grpc::ByteBuffer reply;
  v1::StepResponse response;  // All but the params, which go straight to params_out.
  absl::InlinedVector<client_internal::ReplyPiece, 16> expected;
  for (size_t i = 0; i < total && stream->Read(&reply); ++i) {
    const PlannedChunk& chunk = (*pending)[i];
    expected.clear();
    for (const ChunkPiece& piece : chunk.pieces) {
      const GroupStep& group = groups[piece.group];
      expected.push_back({piece.count, FloatPart(group.params_out, piece.offset, piece.count),
                          SixteenBitPart(group.params_out, piece.offset, piece.count)});
    }
    response.Clear();
    absl::Status parsed = client_internal::ParseStepResponse(
        &reply, options.param_dtype, expected,
        [&](size_t k, const v1::StepResponse& fields) {
          const ChunkPiece& piece = chunk.pieces[k];
          const GroupStep& group = groups[piece.group];
          if (fields.group() == group.group && fields.offset() == piece.offset) {
            return absl::OkStatus();
          }
          return absl::InternalError(absl::StrCat("it is for group '", fields.group(), "' offset ",
                                                  fields.offset(), "; expected '", group.group,
                                                  "' offset ", piece.offset));
        },
        &response);
    if (!parsed.ok()) {
      mismatch = absl::InternalError(
          absl::StrCat("reply to message ", i, " of the stream: ", parsed.message()));
      break;
    }
    done[i] = true;
    window.Answered();
  }
  const size_t answered_all = window.Stop();
  // After a mismatch the call is abandoned; cancelling unblocks the writer.
  // Otherwise Read only fails once the call is over, and Finish says why.
  if (!mismatch.ok()) context.TryCancel();
  writer.join();
  absl::Status status = FromGrpcStatus(stream->Finish());

  std::vector<PlannedChunk> left;
  for (size_t i = 0; i < total; ++i) {
    if (!done[i]) left.push_back((*pending)[i]);
  }
  *pending = std::move(left);
  if (!mismatch.ok()) return mismatch;
  if (!pending->empty() && status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the stream ended after ", answered_all, " of ", total, " replies"));
  }
  if (!pending->empty() && status.code() == absl::StatusCode::kCancelled) {
    return absl::UnavailableError(absl::StrCat("the stream broke after ", answered_all, " of ",
                                               total, " replies: ", status.message()));
  }
  return pending->empty() ? absl::OkStatus() : status;
}

// INVALID_ARGUMENT for a step number, options or group list no step takes.
absl::Status CheckStep(absl::Span<const GroupStep> groups, uint64_t step,
                       const StepOptions& options) {
  if (step == 0) return absl::InvalidArgumentError("step must be at least 1 (the first step is 1)");
  if (options.grad_scale && !std::isfinite(*options.grad_scale)) {
    return absl::InvalidArgumentError("grad_scale must be finite");
  }
  if (options.lr && !(std::isfinite(*options.lr) && *options.lr >= 0)) {
    return absl::InvalidArgumentError("lr must be finite and >= 0");
  }
  absl::flat_hash_set<absl::string_view> names;
  for (const GroupStep& group : groups) {
    if (group.lr && !(std::isfinite(*group.lr) && *group.lr >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("lr of group '", group.group, "' must be finite and >= 0"));
    }
    if (!names.insert(group.group).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("group '", group.group,
                       "' is named twice in one step; a group takes one gradient "
                       "per step"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ChunkGroup>> Client::Impl::StepLayouts(
    Client& client, absl::Span<const GroupStep> groups, const StepOptions& options,
    const ChunkLimits& limits) {
  std::vector<ChunkGroup> layouts;
  layouts.reserve(groups.size());
  for (const GroupStep& group : groups) {
    if (absl::Status s = CheckBufferForms(group, options); !s.ok()) return s;
    const size_t gradient_elements = group.gradient.size();
    absl::StatusOr<GroupInfo> layout = Layout(client, group.group);
    if (layout.ok() && gradient_elements != layout->num_elements) {
      // The group may have been registered anew elsewhere: ask once more.
      Forget(group.group);
      layout = Layout(client, group.group);
    }
    if (!layout.ok()) return layout.status();
    if (gradient_elements != layout->num_elements) {
      return absl::InvalidArgumentError(absl::StrCat("gradient of group '", group.group, "' has ",
                                                     gradient_elements, " elements; the group has ",
                                                     layout->num_elements));
    }
    if (!group.params_out.empty() && group.params_out.size() != layout->num_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "params_out of group '", group.group, "' has ", group.params_out.size(),
          " elements; the group has ", layout->num_elements, " (or pass an empty one)"));
    }
    layouts.push_back({group.group, layout->num_elements, layout->page_elements});
    // Checked here, group by group, so the first bad group is named before
    // later groups' layouts are looked up.
    if (absl::StatusOr<uint64_t> pages = PagesPerChunk(layouts.back(), limits); !pages.ok()) {
      return pages.status();
    }
  }
  return layouts;
}

absl::Status Client::Step(absl::Span<const GroupStep> groups, uint64_t step,
                          const StepOptions& options) {
  if (absl::Status s = CheckStep(groups, step, options); !s.ok()) return s;
  const ChunkLimits limits{impl_->options.chunk_bytes,
                           static_cast<uint64_t>(impl_->options.max_message_bytes),
                           options.gradient_dtype, options.param_dtype};
  absl::StatusOr<std::vector<ChunkGroup>> layouts =
      impl_->StepLayouts(*this, groups, options, limits);
  if (!layouts.ok()) return layouts.status();
  if (std::optional<absl::Status> shared =
          impl_->data_plane.MaybeStep(impl_->channel.get(), *impl_->raw_step, impl_->options,
                                      groups, *layouts, step, options)) {
    // As below: a group deleted or registered anew elsewhere is looked up again next time.
    if (shared->code() == absl::StatusCode::kNotFound ||
        shared->code() == absl::StatusCode::kInvalidArgument) {
      for (const GroupStep& group : groups) impl_->Forget(group.group);
    }
    return *shared;
  }
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(*layouts, limits);
  if (!plan.ok()) return plan.status();
  std::vector<PlannedChunk> pending;
  pending.reserve(plan->size());
  for (PlannedPieces& pieces : *plan) pending.push_back({std::move(pieces), std::nullopt});
  if (absl::Status s = CheckAndPrepare(groups, step, options, &pending); !s.ok()) return s;

  absl::Status last;
  for (int attempt = 0; attempt < impl_->options.max_attempts && !pending.empty(); ++attempt) {
    if (attempt > 0) absl::SleepFor(Backoff(impl_->options, attempt));
    last = RunStream(impl_->channel.get(), *impl_->raw_step, impl_->options, groups, step, options,
                     &pending);
    if (last.ok()) return last;
    if (!IsRetryable(last)) {
      // A group deleted or registered anew elsewhere: look its layout up again next time.
      if (last.code() == absl::StatusCode::kNotFound ||
          last.code() == absl::StatusCode::kInvalidArgument) {
        for (const GroupStep& group : groups) impl_->Forget(group.group);
      }
      return last;
    }
  }
  if (pending.empty()) return absl::OkStatus();
  return absl::Status(last.code(),
                      absl::StrCat("step ", step, " failed after ", impl_->options.max_attempts,
                                   " attempts: ", last.message()));
}

absl::Status Client::Step(const std::string& group, uint64_t step, ConstBufferView gradient,
                          BufferView params_out, const StepOptions& options) {
  GroupStep one{group, gradient, params_out};
  return Step(absl::MakeConstSpan(&one, 1), step, options);
}

SharedBuffer::SharedBuffer(std::shared_ptr<client_internal::SharedMapping> mapping)
    : mapping_(std::move(mapping)) {}
SharedBuffer::~SharedBuffer() = default;
void* SharedBuffer::data() const { return mapping_->base; }
uint64_t SharedBuffer::bytes() const { return mapping_->bytes; }

absl::StatusOr<std::unique_ptr<SharedBuffer>> Client::AllocateSharedBuffer(uint64_t bytes) {
  absl::StatusOr<std::shared_ptr<client_internal::SharedMapping>> mapping =
      impl_->data_plane.AllocateShared(impl_->channel.get(), impl_->options, bytes);
  if (!mapping.ok()) return mapping.status();
  return std::unique_ptr<SharedBuffer>(new SharedBuffer(*std::move(mapping)));
}

}  // namespace optstate
