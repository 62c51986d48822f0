// A Step message read into the engine's MessageChunks (fields converted,
// regions looked up), stepped by MessageStep, and answered.
#include "server/rpc/step_message.h"

#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "optstate/v1/step_wire_format.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/step_plan.h"
#include "server/rpc/step_reply_builder.h"

namespace optstate {
namespace {

// The chunk at `index` of a message: the message's own (0), or more[index-1].
const v1::StepRequest& PieceOf(const v1::StepRequest& request, size_t index) {
  return index == 0 ? request : request.more(static_cast<int>(index - 1));
}

// The refusal, naming the packed chunk it is about (of `request`, or of step
// plan `plan` when not 0) and what of its message was applied; a refusal of
// the message's own chunk is left as it is, unless the other chunks were
// applied at once or it is a plan's.
absl::Status Named(const v1::StepRequest& request, uint64_t plan, const MessageRefusal& refusal) {
  absl::string_view consequence;
  switch (refusal.applied) {
    case MessageApplied::kNothing:
      consequence = "nothing in its message was applied";
      break;
    case MessageApplied::kChunksBefore:
      consequence = "the chunks before it in its message were applied";
      break;
    case MessageApplied::kOthers:
      consequence = "the other chunks of its message were applied where they could be";
      break;
  }
  const absl::Status& status = refusal.status;
  if (plan != 0) {
    return absl::Status(status.code(),
                        absl::StrCat("chunk ", refusal.chunk, " of step plan ", plan, " (group '",
                                     PieceOf(request, refusal.chunk).group(),
                                     "'): ", status.message(), " (", consequence, ")"));
  }
  if (refusal.chunk == 0) {
    if (refusal.applied != MessageApplied::kOthers) return status;
    return absl::Status(status.code(), absl::StrCat(status.message(), " (", consequence, ")"));
  }
  return absl::Status(
      status.code(), absl::StrCat("StepRequest.more[", refusal.chunk - 1, "] (group '",
                                  PieceOf(request, refusal.chunk).group(), "'): ", status.message(),
                                  " (", consequence, ")"));
}

// The chunk `request` carries (`packed`: one of an outer message's `more`)
// with `gradient`, for the engine; `chunk` points into both. For a chunk of
// a step plan, `plan_use` is the message that uses it: its step, and its
// per-step fields where set, replace the chunk's.
absl::Status ToChunk(const v1::StepRequest& request, const SegmentedBytes& gradient,
                     const std::string& tenant, bool packed, const v1::StepRequest* plan_use,
                     StepChunk* chunk) {
  if (packed && !request.more().empty()) {
    return absl::InvalidArgumentError(
        "a chunk packed in StepRequest.more packs chunks itself; put every chunk of the "
        "message in the outer request's more");
  }
  if (packed && request.gradients_checked()) {
    return absl::InvalidArgumentError(
        "a chunk packed in StepRequest.more sets gradients_checked; it is the whole "
        "message's: set it on the outer StepRequest");
  }
  absl::StatusOr<WireType> gradient_type =
      WireTypeFromProto(request.gradient_dtype(), "gradient_dtype");
  if (!gradient_type.ok()) return gradient_type.status();
  absl::StatusOr<WireType> param_type = WireTypeFromProto(request.param_dtype(), "param_dtype");
  if (!param_type.ok()) return param_type.status();
  chunk->group = GroupKey{tenant, request.group()};
  chunk->step = request.step();
  chunk->offset = request.offset();
  chunk->group_elements = request.group_elements();
  chunk->gradient = gradient;
  if (request.has_lr_float32()) {
    return absl::InvalidArgumentError(
        "StepRequest.lr_float32 (field 6) is retired: send the per-step lr as a double in "
        "StepRequest.lr (field 11); this client predates it and must be rebuilt");
  }
  if (request.has_lr()) chunk->lr = request.lr();
  if (request.has_beta1()) chunk->beta1 = request.beta1();
  if (request.has_beta2()) chunk->beta2 = request.beta2();
  if (request.has_eps()) chunk->eps = request.eps();
  if (request.has_weight_decay()) chunk->weight_decay = request.weight_decay();
  if (request.has_maximize()) chunk->maximize = request.maximize();
  if (request.has_grad_scale()) chunk->grad_scale = request.grad_scale();
  chunk->gradient_type = *gradient_type;
  chunk->param_type = *param_type;
  if (plan_use != nullptr) {
    chunk->step = plan_use->step();
    if (plan_use->has_lr()) chunk->lr = plan_use->lr();
    if (plan_use->has_beta1()) chunk->beta1 = plan_use->beta1();
    if (plan_use->has_beta2()) chunk->beta2 = plan_use->beta2();
    if (plan_use->has_eps()) chunk->eps = plan_use->eps();
    if (plan_use->has_weight_decay()) chunk->weight_decay = plan_use->weight_decay();
    if (plan_use->has_maximize()) chunk->maximize = plan_use->maximize();
    if (plan_use->has_grad_scale()) chunk->grad_scale = plan_use->grad_scale();
  }
  return absl::OkStatus();
}

// Where a chunk's region slices lie, once looked up.
struct RegionUse {
  SegmentedBytes gradient;  // Over the gradient's slice, when it names one.
  char* params = nullptr;   // The params' slice, when it names one.
};

// The regions a message's chunks name, each looked up in the registry once
// per message (a zero-copy step names one buffer in all its chunks) and
// held, mapped, until the message is applied.
class MessageRegions {
 public:
  MessageRegions(const RegionRegistry* registry, const std::string& tenant)
      : registry_(registry), tenant_(tenant) {}

  // FAILED_PRECONDITION when the daemon offers no regions, else OK.
  absl::Status Offered() const {
    if (registry_ != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "this daemon offers no shared-memory regions (started with --region_socket=none); send "
        "the gradient in StepRequest.gradient");
  }

  // RegionRegistry::Find's answer for (session, id). Only when Offered().
  absl::StatusOr<const MappedRegion*> Find(absl::string_view session, uint64_t id) {
    for (const Held& held : held_) {
      if (held.id == id && held.session == session) return held.region.get();
    }
    absl::StatusOr<std::shared_ptr<const MappedRegion>> region =
        registry_->Find(tenant_, session, id);
    if (!region.ok()) return region.status();
    held_.push_back(Held{std::string(session), id, std::move(*region)});
    return held_.back().region.get();
  }

 private:
  struct Held {
    std::string session;
    uint64_t id;
    std::shared_ptr<const MappedRegion> region;
  };
  const RegionRegistry* const registry_;
  const std::string& tenant_;
  std::vector<Held> held_;  // Few: one or two per client.
};

// Looks up the regions `request` names, if any: its gradient (into
// use->gradient; the chunk must carry none itself, `wire_gradient` empty)
// and its params.
absl::Status ResolveRegions(const v1::StepRequest& request, MessageRegions* regions,
                            const SegmentedBytes& wire_gradient, RegionUse* use) {
  if (!request.has_gradient_region() && !request.has_params_region()) return absl::OkStatus();
  if (absl::Status offered = regions->Offered(); !offered.ok()) return offered;
  auto find = [&](const v1::RegionSlice& slice, absl::string_view what) -> absl::StatusOr<char*> {
    absl::StatusOr<const MappedRegion*> region =
        regions->Find(request.region_session(), slice.region());
    if (!region.ok()) return region.status();
    return (*region)->Slice(slice.offset(), slice.bytes(), what);
  };
  if (request.has_gradient_region()) {
    if (wire_gradient.size() != 0) {
      return absl::InvalidArgumentError(
          "the chunk carries a gradient and names a gradient_region; send one of them");
    }
    absl::StatusOr<char*> at = find(request.gradient_region(), "gradient_region");
    if (!at.ok()) return at.status();
    use->gradient = SegmentedBytes(absl::string_view(*at, request.gradient_region().bytes()));
  }
  if (request.has_params_region()) {
    absl::StatusOr<char*> at = find(request.params_region(), "params_region");
    if (!at.ok()) return at.status();
    use->params = *at;
  }
  if (request.has_gradient_region() && request.has_params_region()) {
    const v1::RegionSlice& g = request.gradient_region();
    const v1::RegionSlice& p = request.params_region();
    // The update writes params while it reads the gradient: refuse slices
    // that share a byte (both in bounds, so the sums cannot wrap).
    if (g.region() == p.region() && g.bytes() != 0 && p.bytes() != 0 &&
        g.offset() < p.offset() + p.bytes() && p.offset() < g.offset() + g.bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient_region bytes [", g.offset(), ", ", g.offset() + g.bytes(),
                       ") and params_region bytes [", p.offset(), ", ", p.offset() + p.bytes(),
                       ") of region ", g.region(), " overlap; give the params their own bytes"));
    }
  }
  return absl::OkStatus();
}

// The region slice `slice` names, once bounds-checked.
RegionSpan SpanOf(const v1::RegionSlice& slice) {
  return RegionSpan{slice.region(), slice.offset(), slice.bytes()};
}

// INVALID_ARGUMENT when the reply to a message (its chunks checked) could
// be larger than gRPC will send: it is refused before anything is applied,
// rather than applied and then not answered. Params written into a region
// take no room in the reply.
absl::Status CheckReplyFits(const v1::StepRequest& request, const MessageStep& step,
                            size_t max_reply_bytes) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < step.size(); ++i) {
    bytes += step.reply_params_bytes(i) + PieceOf(request, i).group().size() + kReplyFieldsBytes;
  }
  if (bytes <= max_reply_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the reply to this message would take up to ", bytes,
      " bytes (params in the "
      "requested param_dtype), more than the daemon's --max_message_bytes=",
      max_reply_bytes,
      "; send fewer elements per message or ask for 16-bit params; nothing was applied"));
}

}  // namespace

absl::Status ApplyStepMessage(StepEngine* engine, const std::string& tenant, size_t max_reply_bytes,
                              const StepMessage& message, std::vector<grpc::Slice>* reply,
                              RegionRegistry* regions, const LeaseClaim* lease) {
  const v1::StepRequest& request = message.request;
  // The chunks: the message's own, or those of the step plan it uses (whose
  // gradients are all in regions).
  const StepPlan* plan = message.plan.get();
  const v1::StepRequest& chunks_of = plan != nullptr ? plan->chunks : request;
  const uint64_t plan_used = plan != nullptr ? request.plan() : 0;
  const size_t pieces = 1 + static_cast<size_t>(chunks_of.more_size());
  if (plan == nullptr && message.gradients.size() != pieces) {
    return absl::InternalError(absl::StrCat("a Step message with ", pieces, " chunks carries ",
                                            message.gradients.size(), " gradients"));
  }
  if (plan == nullptr && UsesStepPlan(request)) {
    return absl::InternalError(
        "a Step message that uses a step plan reached the engine without it");
  }
  const bool defines_plan = DefinesStepPlan(request);
  if (defines_plan) {
    ForgetStepPlan(regions, tenant, request);  // Until this message passes its checks.
    if (absl::Status s = CheckStepPlanDefinition(request); !s.ok()) return s;
  }
  static const SegmentedBytes kNoGradient;
  // 1. Every chunk read into the engine's terms, its regions looked up; one
  //    that cannot be is refused in its turn by MessageStep::Check.
  std::vector<MessageChunk> chunks(pieces);
  std::vector<RegionUse> uses(pieces);
  MessageRegions message_regions(regions, tenant);
  for (size_t i = 0; i < pieces; ++i) {
    const v1::StepRequest& piece = PieceOf(chunks_of, i);
    const SegmentedBytes& sent = plan != nullptr ? kNoGradient : message.gradients[i];
    MessageChunk& chunk = chunks[i];
    absl::Status status = ResolveRegions(piece, &message_regions, sent, &uses[i]);
    if (status.ok()) {
      status = ToChunk(piece, piece.has_gradient_region() ? uses[i].gradient : sent, tenant, i > 0,
                       plan != nullptr ? &request : nullptr, &chunk.chunk);
    }
    if (status.ok()) {
      chunk.chunk.lease = lease;
      chunk.params_out = uses[i].params;
      if (piece.has_gradient_region()) chunk.gradient_region = SpanOf(piece.gradient_region());
      if (piece.has_params_region()) chunk.params_region = SpanOf(piece.params_region());
    }
    chunk.read_status = std::move(status);
  }
  // 2. Checked as a unit, and the reply bounded, before anything is applied.
  MessageStep step(engine, std::move(chunks),
                   request.gradients_checked() ? SenderChecked::kValues : SenderChecked::kNothing);
  if (MessageRefusal refused = step.Check(); !refused.ok()) {
    return Named(chunks_of, plan_used, refused);
  }
  if (plan == nullptr) {  // A plan's reply is one small StepResponse.
    if (absl::Status s = CheckReplyFits(request, step, max_reply_bytes); !s.ok()) return s;
  }
  // Kept whatever Apply finds of the pages' state: the chunks are sound.
  // Not kept (a session closed meanwhile, a plan past the daemon's bytes for
  // plans): the reply says nothing of a plan, and the sender sends chunks.
  const bool plan_kept = defines_plan && KeepStepPlan(regions, tenant, request).ok();
  // 3. Applied, the params written straight into the replies' slices, and
  //    each chunk's reply finished by the thread that applied it (applied
  //    at once, on the pool's threads while the other chunks are applied).
  std::vector<std::optional<StepReplyBuilder>> builders(pieces);
  std::vector<grpc::Slice> replies(pieces);
  auto builder = [&](size_t i) -> StepReplyBuilder& {
    if (!builders[i].has_value()) {
      builders[i].emplace(PieceOf(request, i).group().size(), /*packed=*/i > 0);
    }
    return *builders[i];
  };
  auto reserve_params = [&](size_t i, size_t bytes) { return builder(i).ReserveParams(bytes); };
  // A plan's use is answered once, with its chunks' counts summed.
  std::atomic<uint64_t> plan_elements{0}, plan_applied{0}, plan_replayed{0};
  auto answer = [&](size_t i) {
    const StepChunkResult& result = step.result(i);
    if (plan != nullptr) {
      plan_elements.fetch_add(result.num_elements, std::memory_order_relaxed);
      plan_applied.fetch_add(result.pages_applied, std::memory_order_relaxed);
      plan_replayed.fetch_add(result.pages_replayed, std::memory_order_relaxed);
      return;
    }
    const v1::StepRequest& piece = PieceOf(request, i);
    v1::StepResponse response;
    response.set_group(piece.group());
    response.set_step(piece.step());
    response.set_offset(piece.offset());
    response.set_num_elements(result.num_elements);
    response.set_param_dtype(WireTypeToProto(step.chunk(i).param_type));
    response.set_pages_applied(result.pages_applied);
    response.set_pages_replayed(result.pages_replayed);
    response.set_params_in_region(uses[i].params != nullptr);
    if (i == 0 && plan_kept) response.set_plan(request.plan());
    replies[i] = builder(i).Finish(response);
  };
  MessageRefusal refused = step.Apply(reserve_params, answer);
  if (!refused.ok()) return Named(chunks_of, plan_used, refused);
  if (plan != nullptr) {
    v1::StepResponse response;
    response.set_plan(plan_used);
    response.set_step(request.step());
    response.set_num_elements(plan_elements.load());
    response.set_pages_applied(plan_applied.load());
    response.set_pages_replayed(plan_replayed.load());
    response.set_params_in_region(true);
    reply->push_back(grpc::Slice(response.SerializeAsString()));
    return absl::OkStatus();
  }
  for (grpc::Slice& slice : replies) reply->push_back(std::move(slice));
  return absl::OkStatus();
}

}  // namespace optstate
