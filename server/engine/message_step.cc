// A message stepped as a unit:
// 1. Check: every chunk checked in order up to the first refusal. A large
//    message (spread_) leaves the gradients' values out of Validate and
//    checks them afterwards in parts on the pool, those of the chunks before
//    the refused one (and of it, when only its params_out size was wrong):
//    the first bad value there is the refusal, as a check in order finds it.
// 2. (The caller's checks of the whole message, such as its reply's size.)
// 3. Apply: in order, stopping at the first refusal, or at once on the pool
//    when the message is large, no two of its chunks touch one page (they
//    are of distinct groups, or of disjoint pages of one) and none writes
//    params where another chunk reads or writes (so their order cannot
//    matter). A chunk whose sender checked its values
//    (SenderChecked::kValues), if small enough, has them checked here, by
//    the thread about to apply it, instead of in 1 and 2: applied at once,
//    that thread also runs its update (the others are busy with chunks of
//    their own), so its gradient is read from memory once, not twice
//    (BENCHMARKS.md, "The finite check as chunks are applied"), and the
//    check runs inside the update of the chunk the thread applied before
//    (CheckAhead: "The next chunk checked inside the update"); in order,
//    the CPU backend may still split the update over idle threads.
#include "server/engine/message_step.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace optstate {
namespace {

// A message with at least this many gradient bytes is spread over the pool.
constexpr uint64_t kSpreadMessageBytes = 4 << 20;
// The value check of a spread message runs in parts of at most this many
// elements.
constexpr uint64_t kValuePartElements = 1 << 18;

// Whether no chunk's params_region shares a byte with another chunk's
// gradient_region or params_region (applied at once, one chunk would write
// what another reads or writes at the same time; in order, each sees the
// params of the chunks before it, as the client asked). A chunk's own two
// slices were checked apart by the transport.
bool NoParamsOverlapAcrossChunks(const std::vector<MessageChunk>& chunks) {
  struct Slice {
    uint64_t region, begin, end;  // Bounds-checked by the transport: no wrap.
    bool operator<(const Slice& other) const {
      return region != other.region ? region < other.region : begin < other.begin;
    }
  };
  std::vector<Slice> params, gradients;
  auto add = [](const RegionSpan& span, std::vector<Slice>* to) {
    if (span.bytes != 0) to->push_back({span.region, span.offset, span.offset + span.bytes});
  };
  for (const MessageChunk& chunk : chunks) {
    if (chunk.params_region.has_value()) add(*chunk.params_region, &params);
    if (chunk.gradient_region.has_value()) add(*chunk.gradient_region, &gradients);
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

// Whether no two validated chunks cover a page of the same group (chunks of
// distinct groups, or of one group's disjoint page ranges, as a sender that
// vouched for its gradients cuts a large group).
bool NoSharedPages(const std::vector<ValidatedChunk>& chunks) {
  struct Pages {
    const Group* group;
    uint64_t first, end;
    bool operator<(const Pages& other) const {
      return group != other.group ? std::less<const Group*>()(group, other.group)
                                  : first < other.first;
    }
  };
  std::vector<Pages> pages;
  pages.reserve(chunks.size());
  for (const ValidatedChunk& chunk : chunks) {
    pages.push_back({chunk.group.get(), chunk.first_page, chunk.end_page});
  }
  std::sort(pages.begin(), pages.end());
  for (size_t i = 1; i < pages.size(); ++i) {  // Sorted: each must end before the next.
    if (pages[i].group == pages[i - 1].group && pages[i].first < pages[i - 1].end) return false;
  }
  return true;
}

}  // namespace

MessageStep::MessageStep(StepEngine* engine, std::vector<MessageChunk> chunks,
                         SenderChecked sender_checked)
    : engine_(engine),
      chunks_(std::move(chunks)),
      checked_as_applied_(chunks_.size(), false),
      validated_(chunks_.size()),
      results_(chunks_.size()) {
  uint64_t gradient_bytes = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    MessageChunk& chunk = chunks_[i];
    gradient_bytes += chunk.chunk.gradient.size();
    checked_as_applied_[i] = sender_checked == SenderChecked::kValues &&
                             chunk.chunk.gradient.size() <= kCheckedAsAppliedBytes;
    if (chunk.params_out != nullptr) {
      chunk.chunk.params_store = ParamsStore::kStreaming;  // The client reads them, not us.
    }
  }
  spread_ = engine_->pool()->size() > 1 && gradient_bytes >= kSpreadMessageBytes;
}

MessageRefusal MessageStep::Check() {
  // How the values of chunks not left to Apply are checked.
  const ValueCheck later = spread_ ? ValueCheck::kDeferred : ValueCheck::kNow;
  const size_t n = chunks_.size();
  // 1. In order, up to the first refusal. `values_checkable`: the refused
  //    chunk passed Validate, so a deferred value check of it still comes
  //    first (as Validate's own would have).
  MessageRefusal refusal{n, absl::OkStatus(), MessageApplied::kNothing};
  bool values_checkable = false;
  for (size_t i = 0; i < n; ++i) {
    const MessageChunk& chunk = chunks_[i];
    absl::Status status = chunk.read_status;
    if (status.ok()) {
      const ValueCheck values = checked_as_applied_[i] ? ValueCheck::kDeferred : later;
      absl::StatusOr<ValidatedChunk> checked = engine_->Validate(chunk.chunk, values);
      if (checked.ok()) {
        validated_[i] = std::move(*checked);
      } else {
        status = checked.status();
      }
    }
    if (status.ok() && chunk.params_out != nullptr) {
      const uint64_t count = validated_[i].count;
      const uint64_t bytes = count * WireTypeSize(chunk.chunk.param_type);
      const uint64_t room = chunk.params_region.has_value() ? chunk.params_region->bytes : 0;
      if (room != bytes) {
        values_checkable = true;
        status = absl::InvalidArgumentError(
            absl::StrCat("params_region holds ", room, " bytes; the chunk's ", count, " params in ",
                         WireTypeName(chunk.chunk.param_type), " take ", bytes));
      }
    }
    if (!status.ok()) {
      refusal.chunk = i;
      refusal.status = std::move(status);
      break;
    }
  }
  // 2. The values of the chunks before it (and of it, when it passed
  //    Validate), when deferred: the first bad one comes before the refusal.
  if (later == ValueCheck::kDeferred) {
    const size_t checked = refusal.ok() ? n : refusal.chunk + (values_checkable ? 1 : 0);
    MessageRefusal bad = CheckValuesSpread(checked);
    if (!bad.ok()) refusal = std::move(bad);
  }
  if (refusal.ok()) refusal.chunk = 0;
  return refusal;
}

MessageRefusal MessageStep::CheckValuesSpread(size_t n) const {
  struct Part {
    size_t chunk;
    uint64_t begin, end;
  };
  std::vector<Part> parts;
  for (size_t i = 0; i < n; ++i) {
    if (checked_as_applied_[i]) continue;
    for (uint64_t begin = 0; begin < validated_[i].count; begin += kValuePartElements) {
      parts.push_back({i, begin, std::min(validated_[i].count, begin + kValuePartElements)});
    }
  }
  std::vector<absl::Status> statuses(parts.size());
  engine_->pool()->ParallelFor(parts.size(), [&](size_t k) {
    const Part& part = parts[k];
    statuses[k] = engine_->CheckGradientValues(chunks_[part.chunk].chunk, validated_[part.chunk],
                                               part.begin, part.end);
  });
  for (size_t k = 0; k < parts.size(); ++k) {  // Parts are in element order.
    if (!statuses[k].ok()) return {parts[k].chunk, statuses[k], MessageApplied::kNothing};
  }
  return {};
}

uint64_t MessageStep::reply_params_bytes(size_t i) const {
  if (chunks_[i].params_out != nullptr) return 0;
  return validated_[i].count * WireTypeSize(chunks_[i].chunk.param_type);
}

bool MessageStep::AtOnce() const {
  return spread_ && chunks_.size() > 1 && NoSharedPages(validated_) &&
         NoParamsOverlapAcrossChunks(chunks_);
}

MessageRefusal MessageStep::Apply(
    absl::FunctionRef<char*(size_t chunk, size_t bytes)> reserve_params,
    absl::FunctionRef<void(size_t chunk)> applied) {
  // Chunk i applied, its values checked first if left to Apply and not
  // already found finite (`values_finite`: checked ahead by the chunk this
  // thread applied before it); `ahead`, if any, checked while it updates.
  auto apply = [&](size_t i, bool values_finite, CheckAhead* ahead) {
    if (checked_as_applied_[i] && !values_finite) {
      absl::Status values =
          engine_->CheckGradientValues(chunks_[i].chunk, validated_[i], 0, validated_[i].count);
      if (!values.ok()) {
        results_[i] = absl::Status(
            values.code(),
            absl::StrCat(values.message(),
                         " [the message is marked gradients_checked, so each chunk is checked as "
                         "it is applied and other chunks may be applied: rather than skip the "
                         "step, send it again with this gradient finite (the chunks already "
                         "applied replay)]"));
        return false;
      }
    }
    char* const params_out = chunks_[i].params_out;
    results_[i] = engine_->Apply(
        chunks_[i].chunk, validated_[i],
        [&](size_t bytes) { return params_out != nullptr ? params_out : reserve_params(i, bytes); },
        ahead);
    if (!results_[i].ok()) return false;
    applied(i);
    return true;
  };
  const size_t n = chunks_.size();
  const bool at_once = AtOnce();
  // The calling thread and each of the pool's.
  const size_t threads = static_cast<size_t>(engine_->pool()->size()) + 1;
  if (at_once && n >= 2 * threads &&
      std::find(checked_as_applied_.begin(), checked_as_applied_.end(), true) !=
          checked_as_applied_.end()) {
    // Each thread takes chunks in turn, and takes its next one before it
    // applies the one it holds, so that chunk's values (when left to Apply)
    // are checked by the update of the one before it (CheckAhead), still
    // before its own first write. Only with at least two chunks a thread:
    // a chunk updated with a check ahead runs on its thread alone, where
    // fewer chunks would leave threads idle that could share its update.
    std::atomic<size_t> next{0};
    engine_->pool()->ParallelFor(threads, [&](size_t) {
      size_t i = next.fetch_add(1, std::memory_order_relaxed);
      bool values_finite = false;
      while (i < n) {
        const size_t following = next.fetch_add(1, std::memory_order_relaxed);
        // A chunk checked with the others (a large one) keeps its update
        // split over the pool, and its follower is checked on its own.
        std::optional<CheckAhead> ahead =
            checked_as_applied_[i] ? CheckAheadOf(following) : std::nullopt;
        apply(i, values_finite, ahead.has_value() ? &*ahead : nullptr);
        values_finite = ahead.has_value() && ahead->checked && ahead->finite;
        i = following;
      }
    });
  } else if (at_once) {
    engine_->pool()->ParallelFor(n, [&](size_t i) { apply(i, false, nullptr); });
  } else {
    for (size_t i = 0; i < n && apply(i, false, nullptr); ++i) {
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (results_[i].ok()) continue;
    return {i, results_[i].status(),
            at_once ? MessageApplied::kOthers : MessageApplied::kChunksBefore};
  }
  return {};
}

std::optional<CheckAhead> MessageStep::CheckAheadOf(size_t i) const {
  if (i >= chunks_.size() || !checked_as_applied_[i]) return std::nullopt;
  const StepChunk& chunk = chunks_[i].chunk;
  const uint64_t count = validated_[i].count;
  const size_t bytes = count * WireTypeSize(chunk.gradient_type);
  const char* data = chunk.gradient.Contiguous(0, bytes);
  if (data == nullptr) return std::nullopt;  // In pieces: checked on its own.
  CheckAhead ahead;
  ahead.gradient = {data, chunk.gradient_type, count, validated_[i].constants.grad_scale};
  return ahead;
}

}  // namespace optstate
