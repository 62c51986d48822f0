// A step through shared memory: in place where the caller's buffers are
// SharedBuffers, else through the groups' areas of the region.
#include "client/transport/shared_memory/shared_memory_transport.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/step/buffer_parts.h"
#include "client/step/finite_check.h"
#include "client/step/group_ranges.h"
#include "client/transport/chunk_fields.h"
#include "optstate/message_limits.h"
#include "optstate/streaming_copy.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {
namespace {

// A step that copies at least this many gradient bytes through the region
// copies them, and its params back, with non-temporal stores
// (CopyStreaming) where no conversion is needed: larger than most of a
// last-level cache, so the daemon reads the region, and the trainer its
// params, from memory anyway (BENCHMARKS.md, "Eight read streams, streamed copies").
constexpr uint64_t kStreamingCopyBytes = 32 << 20;

// Region chunks carry no payload, so messages may cover more of a step
// than the wire's chunk_bytes: fewer messages, less gRPC cost per step.
// 64 MiB (the default max_message_bytes): lora7b's 256 groups are one
// message, not sixteen of 4 MiB, which was 10% faster on the copying path
// since its params are copied out at the end anyway (BENCHMARKS.md, "The
// copying path's copies on every core").
constexpr uint64_t kMinRegionChunkBytes = 64 << 20;

// The step as one message, when every gradient and params_out lies in a
// SharedBuffer (`in_place`), the message has at most kMaxOneMessageChunks
// chunks, and it takes at most half of max_message_bytes; std::nullopt
// otherwise. Its chunks are whole groups, unless the caller vouched for its
// gradients (`checked`): then each group is cut into chunks of whole pages
// of at most kCheckedAsAppliedBytes of gradient (at least one page), which
// the daemon checks one by one as it applies them, in cache, on the threads
// that apply them, instead of reading a large group's gradient twice; if
// that makes more than kMaxOneMessageChunks chunks, whole groups.
constexpr size_t kMaxOneMessageChunks = 1024;
static_assert(kMaxOneMessageChunks <= kMaxPackedChunks);
// A chunk's fields beside its group name, generously: ids, offsets, sizes,
// dtypes, lr, grad_scale, the session key and their framing.
constexpr uint64_t kRegionChunkFieldsBytes = 160;

std::optional<std::vector<PlannedPieces>> OneMessagePlan(absl::Span<const ChunkGroup> layouts,
                                                         bool in_place, bool checked,
                                                         size_t grad_size,
                                                         const ClientOptions& options) {
  if (!in_place || layouts.empty()) return std::nullopt;
  auto plan = [&](bool cut) -> std::optional<std::vector<PlannedPieces>> {
    PlannedPieces message;
    uint64_t bytes = 0;
    for (size_t g = 0; g < layouts.size(); ++g) {
      const ChunkGroup& group = layouts[g];
      const uint64_t n = group.num_elements;
      uint64_t piece = n;  // Elements a chunk; the last one may be shorter.
      if (cut && group.page_elements > 0) {
        piece = group.page_elements *
                std::max<uint64_t>(1, kCheckedAsAppliedBytes / (group.page_elements * grad_size));
      }
      uint64_t at = 0;
      do {
        if (message.size() == kMaxOneMessageChunks) return std::nullopt;
        const uint64_t count = std::min(piece, n - at);
        message.push_back({g, at, count});
        bytes += group.name.size() + kRegionChunkFieldsBytes;
        at += count;
      } while (at < n);
    }
    if (bytes > static_cast<uint64_t>(options.max_message_bytes) / 2) return std::nullopt;
    return std::vector<PlannedPieces>{std::move(message)};
  };
  if (checked) {
    if (std::optional<std::vector<PlannedPieces>> cut = plan(true)) return cut;
  }
  return plan(false);
}

// The bytes of a reply, gathered (region replies carry no payload).
bool Gather(grpc::ByteBuffer* buffer, std::string* out) {
  std::vector<grpc::Slice> slices;
  if (!buffer->Dump(&slices).ok()) return false;
  out->clear();
  for (const grpc::Slice& s : slices)
    out->append(reinterpret_cast<const char*>(s.begin()), s.size());
  return true;
}

}  // namespace

absl::StatusOr<size_t> SharedMemoryTransport::Prepare() {
  const absl::Span<const GroupStep> groups = input_.groups;
  const StepOptions& options = input_.options;
  plane_.BeginStep();
  one_message_ = false;
  const size_t grad_size = WireTypeSize(options.gradient_dtype);
  const size_t param_size = WireTypeSize(options.param_dtype);
  // 1. Which buffers lie in a SharedBuffer in the wire type.
  gradient_at_.assign(groups.size(), InPlace{});
  params_at_.assign(groups.size(), InPlace{});
  for (size_t i = 0; i < groups.size() && plane_.has_shared_buffers(); ++i) {
    const GroupStep& group = groups[i];
    const uint64_t n = group.gradient.size();
    if (Is16Bit(group.gradient) || options.gradient_dtype == WireType::kFloat32) {
      gradient_at_[i] = plane_.FindInPlace(group.gradient.data(), n * grad_size, &held_);
    }
    if (!group.params_out.empty() &&
        (Is16Bit(group.params_out) || options.param_dtype == WireType::kFloat32)) {
      params_at_[i] = plane_.FindInPlace(group.params_out.data(), n * param_size, &held_);
    }
    const InPlace& g = gradient_at_[i];
    const InPlace& p = params_at_[i];
    if (g.region != SIZE_MAX && g.region == p.region && g.offset < p.offset + n * param_size &&
        p.offset < g.offset + n * grad_size) {
      params_at_[i] = InPlace{};  // The daemon refuses overlapping slices: copy these out.
    }
  }
  std::vector<GroupStep> through_areas;
  uint64_t copied_bytes = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (gradient_at_[i].region == SIZE_MAX || params_at_[i].region == SIZE_MAX) {
      through_areas.push_back(groups[i]);
    }
    if (gradient_at_[i].region == SIZE_MAX) copied_bytes += groups[i].gradient.size() * grad_size;
  }
  stream_copies_ = copied_bytes >= kStreamingCopyBytes;
  if (!through_areas.empty()) {
    if (absl::Status s = plane_.EnsureAreas(through_areas, options); !s.ok()) {
      layout_refused_ = true;
      return s;
    }
  }
  // 2. One message when wholly in place; else copy in, check, plan.
  if (std::optional<std::vector<PlannedPieces>> one_message = OneMessagePlan(
          input_.layouts, through_areas.empty(), options.gradients_checked, grad_size, options_)) {
    plan_ = *std::move(one_message);
    one_message_ = true;
    answered_.assign(plan_.size(), false);
    return plan_.size();
  }
  std::vector<ElementItem> gradients(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) gradients[i] = {groups[i].gradient.size(), grad_size};
  if (absl::Status s = ForEachElementSplit(gradients,
                                           [this](size_t i, uint64_t begin, uint64_t end) {
                                             return CopyInAndCheck(i, begin, end);
                                           });
      !s.ok()) {
    return s;
  }
  // Chunks of at most kCheckedAsAppliedBytes, packed into messages of up to
  // kMinRegionChunkBytes: the messages are marked gradients_checked (checked
  // here), so the daemon checks each chunk as it applies it, in cache, where
  // a larger chunk it would read twice.
  ChunkLimits limits{kCheckedAsAppliedBytes, static_cast<uint64_t>(options_.max_message_bytes),
                     options.gradient_dtype, options.param_dtype};
  limits.message_gradient_bytes = std::max(options_.chunk_bytes, kMinRegionChunkBytes);
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(input_.layouts, limits);
  if (!plan.ok()) return plan.status();
  plan_ = *std::move(plan);
  answered_.assign(plan_.size(), false);
  return plan_.size();
}

absl::Status SharedMemoryTransport::CopyInAndCheck(size_t i, uint64_t begin, uint64_t end) const {
  const GroupStep& group = input_.groups[i];
  const StepOptions& options = input_.options;
  const size_t grad_size = WireTypeSize(options.gradient_dtype);
  if (gradient_at_[i].region != SIZE_MAX) {
    if (options.gradients_checked) return absl::OkStatus();  // The caller's word.
    return CheckWireFinite(group, options,
                           static_cast<const char*>(group.gradient.data()) + begin * grad_size,
                           begin, end - begin);
  }
  // Copied block by block, each checked while it is still in cache (one
  // pass over memory: bench/copy-check-bench measured blocks of 16-256 Ki
  // elements alike, and 1.5-2x faster than a 64 MiB group copied, then
  // checked); CheckWireFinite names the first bad element if any. A plain
  // copy (the wire's bits are the buffer's) in a large step is streamed and
  // checked in the caller's buffer, which the copy has just brought into
  // cache: the same bits.
  char* dst = plane_.base() + plane_.area(group.group).gradient_offset;
  const auto* src = static_cast<const char*>(group.gradient.data());
  const bool plain_copy = Is16Bit(group.gradient) || options.gradient_dtype == WireType::kFloat32;
  const bool streamed = stream_copies_ && plain_copy;
  bool finite = std::fabs(options.grad_scale.value_or(1.0f)) <= 1.0f;
  constexpr uint64_t kBlock = 16384;
  for (uint64_t at = begin; at < end; at += kBlock) {
    const size_t count = std::min(kBlock, end - at);
    char* block = dst + at * grad_size;
    const char* from = src + at * grad_size;  // For a plain copy.
    if (streamed) {
      CopyStreaming(block, from, count * grad_size);
    } else if (plain_copy) {
      std::memcpy(block, from, count * grad_size);
    } else {
      EncodeFromFloat(options.gradient_dtype,
                      static_cast<const float*>(group.gradient.data()) + at, block, count);
    }
    if (finite) finite = AllWireFinite(options.gradient_dtype, streamed ? from : block, count);
  }
  if (finite) return absl::OkStatus();
  return CheckWireFinite(group, options, dst + begin * grad_size, begin, end - begin);
}

std::vector<PlanChunk> SharedMemoryTransport::OneMessageChunks() const {
  const StepOptions& options = input_.options;
  const size_t grad_size = WireTypeSize(options.gradient_dtype);
  const size_t param_size = WireTypeSize(options.param_dtype);
  std::vector<PlanChunk> chunks;
  chunks.reserve(plan_[0].size());
  for (const ChunkPiece& piece : plan_[0]) {
    const GroupStep& group = input_.groups[piece.group];
    const InPlace& gi = gradient_at_[piece.group];
    const InPlace& pi = params_at_[piece.group];
    PlanChunk& chunk = chunks.emplace_back();
    chunk.group = group.group;
    chunk.offset = piece.offset;
    chunk.count = piece.count;
    chunk.group_elements = group.gradient.size();
    chunk.gradient_region = plane_.shared_region_id(gi.region);
    chunk.gradient_offset = gi.offset + piece.offset * grad_size;
    chunk.params_region = plane_.shared_region_id(pi.region);
    chunk.params_offset = pi.offset + piece.offset * param_size;
    chunk.fields = PerStepFieldsOf(group, options);
  }
  return chunks;
}

grpc::ByteBuffer SharedMemoryTransport::Request(size_t i) {
  const StepOptions& options = input_.options;
  const size_t grad_size = WireTypeSize(options.gradient_dtype);
  const size_t param_size = WireTypeSize(options.param_dtype);
  const PlannedPieces& pieces = plan_[i];
  v1::StepRequest outer;
  // A one-message step: the plan kept with the daemon when its chunks are
  // the same, else one defined with this message (step_plan_cache.h).
  plan_used_ = plan_defined_ = 0;
  if (one_message_) {
    const std::vector<PlanChunk> chunks = OneMessageChunks();
    StepPlanCache& cache = plane_.step_plan();
    const std::optional<PlanUse> use =
        resent_chunks_ ? std::nullopt
                       : cache.Match(plane_.session_key(), options.gradient_dtype,
                                     options.param_dtype, chunks);
    if (use.has_value()) {
      plan_used_ = use->plan;
      outer.set_plan(use->plan);
      outer.set_region_session(plane_.session_key());
      outer.set_step(input_.step);
      if (options.gradients_checked) outer.set_gradients_checked(true);
      SetPerStepFields(use->overrides, &outer);
      const std::string bytes = outer.SerializeAsString();
      grpc::Slice slice(bytes);
      return grpc::ByteBuffer(&slice, 1);
    }
    plan_defined_ =
        cache.Define(plane_.session_key(), options.gradient_dtype, options.param_dtype, chunks);
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ChunkPiece& piece = pieces[k];
    const GroupStep& group = input_.groups[piece.group];
    v1::StepRequest* fields = k == 0 ? &outer : outer.add_more();
    ChunkFields(group, piece, input_.step, options, fields);
    if (k == 0 && (options.gradients_checked || !one_message_)) {
      // The caller's word, or this client's own check of the whole step
      // (CopyInAndCheck, before anything was sent): the daemon may check each
      // chunk as it applies it.
      fields->set_gradients_checked(true);
    }
    fields->set_region_session(plane_.session_key());
    if (k == 0 && plan_defined_ != 0) fields->set_plan(plan_defined_);
    const InPlace& gi = gradient_at_[piece.group];
    const InPlace& pi = params_at_[piece.group];
    const SharedMemoryPlane::Area* area =
        gi.region == SIZE_MAX || pi.region == SIZE_MAX ? &plane_.area(group.group) : nullptr;
    v1::RegionSlice* g = fields->mutable_gradient_region();
    g->set_region(gi.region != SIZE_MAX ? plane_.shared_region_id(gi.region) : plane_.region_id());
    g->set_offset((gi.region != SIZE_MAX ? gi.offset : area->gradient_offset) +
                  piece.offset * grad_size);
    g->set_bytes(piece.count * grad_size);
    v1::RegionSlice* p = fields->mutable_params_region();
    p->set_region(pi.region != SIZE_MAX ? plane_.shared_region_id(pi.region) : plane_.region_id());
    p->set_offset((pi.region != SIZE_MAX ? pi.offset : area->params_offset) +
                  piece.offset * param_size);
    p->set_bytes(piece.count * param_size);
  }
  const std::string bytes = outer.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status SharedMemoryTransport::TakeReply(size_t i, grpc::ByteBuffer* buffer) {
  const PlannedPieces& pieces = plan_[i];
  std::string bytes;
  v1::StepResponse reply;
  if (plan_used_ != 0) {  // One reply for the plan's chunks.
    uint64_t elements = 0;
    for (const ChunkPiece& piece : pieces) elements += piece.count;
    if (!Gather(buffer, &bytes) || !reply.ParseFromString(bytes) || reply.more_size() != 0 ||
        reply.plan() != plan_used_ || reply.step() != input_.step ||
        reply.num_elements() != elements || !reply.params_in_region()) {
      return absl::InternalError(absl::StrCat("it is not the reply to step ", input_.step,
                                              " of step plan ", plan_used_, " (", elements,
                                              " elements, params in the region)"));
    }
    answered_[i] = true;
    return absl::OkStatus();
  }
  if (!Gather(buffer, &bytes) || !reply.ParseFromString(bytes) ||
      static_cast<size_t>(reply.more_size()) + 1 != pieces.size()) {
    return absl::InternalError("it is not a StepResponse of one reply per chunk");
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    const v1::StepResponse& r = k == 0 ? reply : reply.more(static_cast<int>(k - 1));
    const ChunkPiece& piece = pieces[k];
    const GroupStep& group = input_.groups[piece.group];
    if (r.group() != group.group || r.offset() != piece.offset || !r.params_in_region()) {
      return absl::InternalError(absl::StrCat("it is for group '", r.group(), "' offset ",
                                              r.offset(), "; expected '", group.group, "' offset ",
                                              piece.offset, " with its params in the region"));
    }
  }
  // The plan is used from the next step on only if the daemon says it kept
  // it (one that predates plans, or is past its bytes for them, does not).
  if (plan_defined_ != 0 && reply.plan() == plan_defined_) {
    plane_.step_plan().Defined(plan_defined_);
  }
  answered_[i] = true;
  return absl::OkStatus();
}

bool SharedMemoryTransport::ResendAfter(const absl::Status& status) {
  // A use of a plan the daemon does not keep (its session's plans
  // forgotten, or a daemon that never kept it) refuses it with NOT_FOUND
  // before anything is applied: send the chunks, defining it anew. Any
  // other refusal of the use is the chunks' own, and a resend of them gets
  // the same one (with the chunk's name rather than the plan's).
  if (plan_used_ == 0 || resent_chunks_ || status.code() != absl::StatusCode::kNotFound) {
    return false;
  }
  plane_.step_plan().Forget(plan_used_);
  resent_chunks_ = true;
  return true;
}

absl::Status SharedMemoryTransport::Finish() {
  // The params of every answered message's chunks in the region, copied out
  // together once the daemon is done: on several threads for a large step
  // (the daemon has nothing left to do meanwhile), where copying each as
  // its reply came took a core from the daemon's update of the next.
  const StepOptions& options = input_.options;
  const size_t param_size = WireTypeSize(options.param_dtype);
  std::vector<const ChunkPiece*> copies;
  std::vector<ElementItem> items;
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (!answered_[i]) continue;
    for (const ChunkPiece& piece : plan_[i]) {
      const GroupStep& group = input_.groups[piece.group];
      if (group.params_out.empty() || params_at_[piece.group].region != SIZE_MAX) continue;
      copies.push_back(&piece);
      items.push_back({piece.count, param_size});
    }
  }
  return ForEachElementSplit(items, [&](size_t k, uint64_t begin, uint64_t end) {
    const ChunkPiece& piece = *copies[k];
    const GroupStep& group = input_.groups[piece.group];
    const uint64_t first = piece.offset + begin, count = end - begin;
    const char* src = plane_.base() + plane_.area(group.group).params_offset + first * param_size;
    if (stream_copies_ && (Is16Bit(group.params_out) || options.param_dtype == WireType::kFloat32)) {
      CopyStreaming(static_cast<char*>(group.params_out.data()) + first * param_size, src,
                    count * param_size);
    } else if (Is16Bit(group.params_out)) {
      std::memcpy(static_cast<uint16_t*>(group.params_out.data()) + first, src, count * 2);
    } else {
      DecodeToFloat(options.param_dtype, src, static_cast<float*>(group.params_out.data()) + first,
                    count);
    }
    return absl::OkStatus();
  });
}

}  // namespace optstate::client_internal
