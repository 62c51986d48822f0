// Validation of a whole message first, then its chunks: in order, or, for a
// large message of distinct groups, at once on the pool.
#include "server/rpc/step_message.h"

#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "optstate/v1/step_wire_format.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/step_reply_builder.h"

namespace optstate {
namespace {

// The chunk at `index` of a message: the message's own (0), or more[index-1].
const v1::StepRequest& PieceOf(const v1::StepRequest& request, size_t index) {
  return index == 0 ? request : request.more(static_cast<int>(index - 1));
}

// `status`, naming the packed chunk it is about.
absl::Status AboutPacked(const absl::Status& status, const v1::StepRequest& request, size_t index,
                         absl::string_view consequence) {
  if (index == 0 || status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("StepRequest.more[", index - 1, "] (group '",
                                                  PieceOf(request, index).group(), "'): ",
                                                  status.message(), " (", consequence, ")"));
}

// The chunk `request` carries (`packed`: one of an outer message's `more`)
// with `gradient`, for the engine; `chunk` points into both.
absl::Status ToChunk(const v1::StepRequest& request, const SegmentedBytes& gradient,
                     const std::string& tenant, bool packed, StepChunk* chunk) {
  if (packed && !request.more().empty()) {
    return absl::InvalidArgumentError(
        "a chunk packed in StepRequest.more packs chunks itself; put every chunk of the "
        "message in the outer request's more");
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
  if (request.has_grad_scale()) chunk->grad_scale = request.grad_scale();
  chunk->gradient_type = *gradient_type;
  chunk->param_type = *param_type;
  return absl::OkStatus();
}

// Where a chunk's region slices lie, once looked up.
struct RegionUse {
  SegmentedBytes gradient;  // Over the gradient's slice, when it names one.
  char* params = nullptr;   // The params' slice, when it names one.
};

// Looks up the regions `request` names, if any: its gradient (replacing
// `*gradient`, which must be empty) and its params. `held` keeps the
// mappings alive while the message is applied.
absl::Status ResolveRegions(const v1::StepRequest& request, const std::string& tenant,
                            const RegionRegistry* regions, const SegmentedBytes& wire_gradient,
                            RegionUse* use,
                            std::vector<std::shared_ptr<const MappedRegion>>* held) {
  if (!request.has_gradient_region() && !request.has_params_region()) return absl::OkStatus();
  if (regions == nullptr) {
    return absl::FailedPreconditionError(
        "this daemon offers no shared-memory regions (started with --region_socket=none); send "
        "the gradient in StepRequest.gradient");
  }
  auto find = [&](const v1::RegionSlice& slice, absl::string_view what) -> absl::StatusOr<char*> {
    absl::StatusOr<std::shared_ptr<const MappedRegion>> region =
        regions->Find(tenant, request.region_session(), slice.region());
    if (!region.ok()) return region.status();
    absl::StatusOr<char*> at = (*region)->Slice(slice.offset(), slice.bytes(), what);
    if (at.ok()) held->push_back(std::move(*region));
    return at;
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

// INVALID_ARGUMENT when the reply to a message (its chunks validated) could
// be larger than gRPC will send: it is refused before anything is applied,
// rather than applied and then not answered. Params written into a region
// take no room in the reply.
absl::Status CheckReplyFits(const v1::StepRequest& request, absl::Span<const StepChunk> chunks,
                            absl::Span<const ValidatedChunk> validated,
                            absl::Span<const RegionUse> uses, size_t max_reply_bytes) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint64_t params =
        uses[i].params != nullptr ? 0 : validated[i].count * WireTypeSize(chunks[i].param_type);
    bytes += params + PieceOf(request, i).group().size() + kReplyFieldsBytes;
  }
  if (bytes <= max_reply_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the reply to this message would take up to ", bytes,
      " bytes (params in the "
      "requested param_dtype), more than the daemon's --max_message_bytes=",
      max_reply_bytes,
      "; send fewer elements per message or ask for 16-bit params; nothing was applied"));
}

// A message with at least this many gradient bytes is spread over the pool.
constexpr uint64_t kSpreadMessageBytes = 4 << 20;
// The value check of a spread message runs in parts of at most this many
// elements.
constexpr uint64_t kValuePartElements = 1 << 18;

// Whether no chunk's params_region shares a byte with another chunk's
// gradient_region or params_region (applied at once, one chunk would write
// what another reads or writes at the same time; in order, each sees the
// params of the chunks before it, as the client asked). A chunk's own two
// slices were checked apart by ResolveRegions.
bool NoParamsOverlapAcrossChunks(const v1::StepRequest& request) {
  struct Slice {
    uint64_t region, begin, end;  // Bounds-checked by ResolveRegions: no wrap.
    bool operator<(const Slice& other) const {
      return region != other.region ? region < other.region : begin < other.begin;
    }
  };
  std::vector<Slice> params, gradients;
  auto add = [](const v1::RegionSlice& slice, std::vector<Slice>* to) {
    if (slice.bytes() != 0)
      to->push_back({slice.region(), slice.offset(), slice.offset() + slice.bytes()});
  };
  for (int i = -1; i < request.more_size(); ++i) {
    const v1::StepRequest& piece = i < 0 ? request : request.more(i);
    if (piece.has_params_region()) add(piece.params_region(), &params);
    if (piece.has_gradient_region()) add(piece.gradient_region(), &gradients);
  }
  std::sort(params.begin(), params.end());
  for (size_t i = 1; i < params.size(); ++i) {  // Sorted and apart: each ends before the next.
    if (params[i].region == params[i - 1].region && params[i].begin < params[i - 1].end) {
      return false;
    }
  }
  for (const Slice& g : gradients) {
    // The first params slice of g's region that ends after g begins, if any,
    // is the only one that can overlap it.
    auto it = std::partition_point(params.begin(), params.end(), [&g](const Slice& p) {
      return p.region < g.region || (p.region == g.region && p.end <= g.begin);
    });
    if (it != params.end() && it->region == g.region && it->begin < g.end) return false;
  }
  return true;
}

// Whether no two chunks of `request` name the same group.
bool DistinctGroups(const v1::StepRequest& request) {
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(1 + request.more_size());
  seen.insert(request.group());
  for (const v1::StepRequest& packed : request.more()) {
    if (!seen.insert(packed.group()).second) return false;
  }
  return true;
}

// The deferred value checks of `chunks` (validated), in parts on the
// engine's pool. On a bad value: *first_bad = the index of the first chunk
// holding one and its status (naming the chunk's first bad element);
// otherwise OK and *first_bad unchanged.
absl::Status CheckValuesSpread(const StepEngine& engine, absl::Span<const StepChunk> chunks,
                               absl::Span<const ValidatedChunk> validated, size_t* first_bad) {
  struct Part {
    size_t chunk;
    uint64_t begin, end;
  };
  std::vector<Part> parts;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (uint64_t begin = 0; begin < validated[i].count; begin += kValuePartElements) {
      parts.push_back({i, begin, std::min(validated[i].count, begin + kValuePartElements)});
    }
  }
  std::vector<absl::Status> statuses(parts.size());
  engine.pool()->ParallelFor(parts.size(), [&](size_t k) {
    const Part& part = parts[k];
    statuses[k] =
        engine.CheckGradientValues(chunks[part.chunk], validated[part.chunk], part.begin, part.end);
  });
  for (size_t k = 0; k < parts.size(); ++k) {  // Parts are in element order.
    if (statuses[k].ok()) continue;
    *first_bad = parts[k].chunk;
    return statuses[k];
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyStepMessage(StepEngine* engine, const std::string& tenant, size_t max_reply_bytes,
                              const StepMessage& message, std::vector<grpc::Slice>* reply,
                              const RegionRegistry* regions) {
  const v1::StepRequest& request = message.request;
  const size_t pieces = 1 + static_cast<size_t>(request.more_size());
  if (message.gradients.size() != pieces) {
    return absl::InternalError(absl::StrCat("a Step message with ", pieces, " chunks carries ",
                                            message.gradients.size(), " gradients"));
  }
  std::vector<StepChunk> chunks(pieces);
  std::vector<ValidatedChunk> validated(pieces);
  std::vector<RegionUse> uses(pieces);
  std::vector<std::shared_ptr<const MappedRegion>> held;
  // A large message has its values checked, and its chunks applied, on the
  // pool's threads: the same answers as one thread gives, in order.
  uint64_t gradient_bytes = 0;
  for (size_t i = 0; i < pieces; ++i) {
    const v1::StepRequest& piece = PieceOf(request, i);
    gradient_bytes +=
        piece.has_gradient_region() ? piece.gradient_region().bytes() : message.gradients[i].size();
  }
  const bool spread = engine->pool()->size() > 1 && gradient_bytes >= kSpreadMessageBytes;
  const ValueCheck values = spread ? ValueCheck::kDeferred : ValueCheck::kNow;
  // 1. Every chunk checked, in order, up to the first refusal (`refused`).
  //    `values_checkable`: the refused chunk passed Validate, so a deferred
  //    value check of it still comes first (as Validate's own would have).
  size_t refused = pieces;
  absl::Status refusal;
  bool values_checkable = false;
  for (size_t i = 0; i < pieces; ++i) {
    const v1::StepRequest& piece = PieceOf(request, i);
    absl::Status status =
        ResolveRegions(piece, tenant, regions, message.gradients[i], &uses[i], &held);
    if (status.ok()) {
      status = ToChunk(piece, piece.has_gradient_region() ? uses[i].gradient : message.gradients[i],
                       tenant, i > 0, &chunks[i]);
    }
    if (status.ok() && uses[i].params != nullptr) {
      chunks[i].params_store = ParamsStore::kStreaming;  // The client reads them, not us.
    }
    if (status.ok()) {
      absl::StatusOr<ValidatedChunk> checked = engine->Validate(chunks[i], values);
      if (checked.ok()) {
        validated[i] = std::move(*checked);
      } else {
        status = checked.status();
      }
    }
    if (status.ok() && uses[i].params != nullptr &&
        piece.params_region().bytes() != validated[i].count * WireTypeSize(chunks[i].param_type)) {
      values_checkable = true;
      status = absl::InvalidArgumentError(absl::StrCat(
          "params_region holds ", piece.params_region().bytes(), " bytes; the chunk's ",
          validated[i].count, " params in ", WireTypeName(chunks[i].param_type), " take ",
          validated[i].count * WireTypeSize(chunks[i].param_type)));
    }
    if (!status.ok()) {
      refused = i;
      refusal = status;
      break;
    }
  }
  // 2. The values of the chunks before it (and of it, when it passed
  //    Validate), when deferred: the first bad one comes before the refusal,
  //    as one thread checking in order finds it.
  if (values == ValueCheck::kDeferred) {
    const size_t checked = refused == pieces ? pieces : refused + (values_checkable ? 1 : 0);
    absl::Status bad = CheckValuesSpread(*engine, absl::MakeConstSpan(chunks).first(checked),
                                         absl::MakeConstSpan(validated).first(checked), &refused);
    if (!bad.ok()) refusal = bad;
  }
  if (refused != pieces) {
    return AboutPacked(refusal, request, refused, "nothing in its message was applied");
  }
  if (absl::Status s = CheckReplyFits(request, chunks, validated, uses, max_reply_bytes); !s.ok()) {
    return s;
  }
  // 3. The chunks applied: in order, or at once on the pool when the message
  //    is large, its chunks are of distinct groups (so no two touch one page)
  //    and none writes params where another chunk reads or writes (so their
  //    order cannot matter).
  std::vector<std::unique_ptr<StepReplyBuilder>> builders(pieces);
  // Default-constructed: UNKNOWN (not applied), with no message to allocate.
  std::vector<absl::StatusOr<StepChunkResult>> results(pieces);
  auto apply = [&](size_t i) {
    const v1::StepRequest& piece = PieceOf(request, i);
    builders[i] = std::make_unique<StepReplyBuilder>(piece.group().size(), /*packed=*/i > 0);
    StepReplyBuilder* builder = builders[i].get();
    char* const region_params = uses[i].params;
    results[i] = engine->Apply(chunks[i], validated[i], [builder, region_params](size_t bytes) {
      return region_params != nullptr ? region_params : builder->ReserveParams(bytes);
    });
    return results[i].ok();
  };
  const bool at_once =
      spread && pieces > 1 && DistinctGroups(request) && NoParamsOverlapAcrossChunks(request);
  if (at_once) {
    engine->pool()->ParallelFor(pieces, [&](size_t i) { apply(i); });
  } else {
    for (size_t i = 0; i < pieces && apply(i); ++i) {
    }
  }
  for (size_t i = 0; i < pieces; ++i) {
    if (results[i].ok()) continue;
    if (!at_once) {
      return AboutPacked(results[i].status(), request, i,
                         "the chunks before it in its message were applied");
    }
    constexpr absl::string_view kOthers =
        "the other chunks of its message were applied where they could be";
    if (i > 0) return AboutPacked(results[i].status(), request, i, kOthers);
    // The message's own chunk, which AboutPacked leaves unnamed.
    const absl::Status& status = results[i].status();
    return absl::Status(status.code(), absl::StrCat(status.message(), " (", kOthers, ")"));
  }
  for (size_t i = 0; i < pieces; ++i) {
    const v1::StepRequest& piece = PieceOf(request, i);
    v1::StepResponse response;
    response.set_group(piece.group());
    response.set_step(piece.step());
    response.set_offset(piece.offset());
    response.set_num_elements(results[i]->num_elements);
    response.set_param_dtype(WireTypeToProto(chunks[i].param_type));
    response.set_pages_applied(results[i]->pages_applied);
    response.set_pages_replayed(results[i]->pages_replayed);
    response.set_params_in_region(uses[i].params != nullptr);
    reply->push_back(builders[i]->Finish(response));
  }
  return absl::OkStatus();
}

}  // namespace optstate
