// A step's chunks against the kept plan's: the same places, and per-step
// fields that are either the plan's or one value for every chunk.
#include "client/transport/shared_memory/step_plan_cache.h"

namespace optstate::client_internal {
namespace {

bool SamePlace(const PlanChunk& a, const PlanChunk& b) {
  return a.offset == b.offset && a.count == b.count && a.group_elements == b.group_elements &&
         a.gradient_region == b.gradient_region && a.gradient_offset == b.gradient_offset &&
         a.params_region == b.params_region && a.params_offset == b.params_offset;
}

// Field `field` of the step's chunks against the plan's: unset when every
// chunk has the plan's value, else the one value all chunks have (false
// when they have several, or none).
template <typename T>
bool Override(absl::Span<const PlanChunk> chunks, const std::vector<PlanChunk>& kept,
              std::optional<T> PerStepFields::*field, std::optional<T>* out) {
  bool same = true;
  for (size_t k = 0; k < chunks.size() && same; ++k) {
    same = chunks[k].fields.*field == kept[k].fields.*field;
  }
  if (same) return true;
  const std::optional<T>& first = chunks[0].fields.*field;
  if (!first.has_value()) return false;
  for (const PlanChunk& chunk : chunks) {
    if (chunk.fields.*field != first) return false;
  }
  *out = first;
  return true;
}

}  // namespace

StepPlanCache::Kept* StepPlanCache::Find(absl::string_view session, WireType gradient_dtype,
                                         WireType param_dtype, absl::Span<const PlanChunk> chunks) {
  for (Kept& kept : kept_) {
    if (kept.number == 0 || kept.session != session || kept.gradient_dtype != gradient_dtype ||
        kept.param_dtype != param_dtype || kept.chunks.size() != chunks.size() || chunks.empty()) {
      continue;
    }
    bool same = true;
    for (size_t k = 0; k < chunks.size() && same; ++k) {
      same = SamePlace(chunks[k], kept.chunks[k]) && chunks[k].group == kept.groups[k];
    }
    if (same) return &kept;
  }
  return nullptr;
}

std::optional<PlanUse> StepPlanCache::Match(absl::string_view session, WireType gradient_dtype,
                                            WireType param_dtype,
                                            absl::Span<const PlanChunk> chunks) {
  Kept* kept = Find(session, gradient_dtype, param_dtype, chunks);
  if (kept == nullptr) return std::nullopt;
  PlanUse use{kept->number, {}};
  PerStepFields& o = use.overrides;
  const std::vector<PlanChunk>& was = kept->chunks;
  if (!Override(chunks, was, &PerStepFields::lr, &o.lr) ||
      !Override(chunks, was, &PerStepFields::beta1, &o.beta1) ||
      !Override(chunks, was, &PerStepFields::beta2, &o.beta2) ||
      !Override(chunks, was, &PerStepFields::eps, &o.eps) ||
      !Override(chunks, was, &PerStepFields::weight_decay, &o.weight_decay) ||
      !Override(chunks, was, &PerStepFields::maximize, &o.maximize) ||
      !Override(chunks, was, &PerStepFields::grad_scale, &o.grad_scale)) {
    return std::nullopt;
  }
  kept->last_use = ++use_clock_;
  return use;
}

uint64_t StepPlanCache::Define(absl::string_view session, WireType gradient_dtype,
                               WireType param_dtype, absl::Span<const PlanChunk> chunks) {
  // The same chunks' plan (its per-step fields changed), a free number, or
  // the least recently used.
  const Kept* same = Find(session, gradient_dtype, param_dtype, chunks);
  size_t slot = same != nullptr ? static_cast<size_t>(same - kept_) : 0;
  for (size_t k = 0; same == nullptr && k < kMaxPlans; ++k) {
    if (kept_[k].number == 0) {
      slot = k;
      break;
    }
    if (kept_[k].last_use < kept_[slot].last_use) slot = k;
  }
  kept_[slot] = Kept();  // Until Defined: the daemon forgets it as the message arrives.
  pending_.number = slot + 1;
  pending_.last_use = ++use_clock_;
  pending_.session = std::string(session);
  pending_.gradient_dtype = gradient_dtype;
  pending_.param_dtype = param_dtype;
  pending_.groups.clear();
  pending_.chunks.assign(chunks.begin(), chunks.end());
  for (PlanChunk& chunk : pending_.chunks) {
    pending_.groups.emplace_back(chunk.group);
    chunk.group = absl::string_view();
  }
  return pending_.number;
}

void StepPlanCache::Defined(uint64_t number) {
  if (pending_.number != number) return;
  kept_[number - 1] = std::move(pending_);
  pending_ = Kept();
}

void StepPlanCache::Forget(uint64_t number) {
  if (number >= 1 && number <= kMaxPlans) kept_[number - 1] = Kept();
}

}  // namespace optstate::client_internal
