// Chunk validation, page locking, exactly-once bookkeeping and reply encoding.
#include "server/engine/step_engine.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/state/page_range_lock.h"

namespace optstate {
namespace {

struct ChunkRange {
  uint64_t count;       // Elements in the chunk.
  uint64_t first_page;  // Pages [first_page, end_page) are covered whole.
  uint64_t end_page;
};

absl::StatusOr<ChunkRange> ValidateRange(const Group& group, uint64_t offset, WireType type,
                                         size_t bytes, absl::string_view what) {
  const size_t element_size = WireTypeSize(type);
  if (bytes % element_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds ", bytes,
                                                   " bytes, not a multiple of ", element_size,
                                                   " (the size of ", WireTypeName(type), ")"));
  }
  const uint64_t count = bytes / element_size;
  const uint64_t n = group.num_elements();
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (offset >= n || count > n - offset) {
    // Said as offset and count: offset + count may pass 2^64.
    return absl::InvalidArgumentError(absl::StrCat(what, " covers ", count,
                                                   count == 1 ? " element" : " elements",
                                                   " from element ", offset,
                                                   " but group '", group.key().name, "' has ",
                                                   n, " elements"));
  }
  const uint64_t page = group.page_elements();
  if (offset % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", offset, " is not on a page boundary: chunks of group '",
                     group.key().name, "' must start at a multiple of page_elements=", page));
  }
  const uint64_t end = offset + count;
  if (end % page != 0 && end != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ends at element ", end, ", which is neither a page boundary (page_elements=", page,
        ") nor the group's end (", n, ")"));
  }
  return ChunkRange{count, offset / page, (end + page - 1) / page};
}

const LeaseClaim& ClaimOf(const StepChunk& chunk) {
  static const LeaseClaim* const anonymous = new LeaseClaim();
  return chunk.lease != nullptr ? *chunk.lease : *anonymous;
}

absl::Status NotFoundAfterDelete(const Group& group) {
  return absl::NotFoundError(absl::StrCat("group '", group.key().name, "' was deleted"));
}

// A step for a group sealed for a move, or moved away (StateStore::Seal).
absl::Status MovedGroup(const std::string& name, const std::string& moved_to) {
  return absl::FailedPreconditionError(absl::StrCat(
      "group '", name, "' moved to daemon '", moved_to,
      "' (a client's Rebalance moves groups when the daemons change); nothing was applied "
      "here: step it there, with the client given the new list of daemons"));
}

absl::Status BrokenGroup(const Group& group) {
  return absl::DataLossError(absl::StrCat(
      "group '", group.key().name,
      "' failed part-way through an update and its state can no longer be trusted; delete it "
      "and register it again"));
}

}  // namespace

absl::StatusOr<ValidatedChunk> StepEngine::Validate(const StepChunk& chunk, ValueCheck values) {
  ValidatedChunk validated;
  validated.started = absl::Now();
  absl::StatusOr<std::shared_ptr<Group>> found = store_->Find(chunk.group);
  if (!found.ok()) return found.status();  // Moved away: FAILED_PRECONDITION saying where.
  Group& group = **found;
  if (group.move().sealed()) return MovedGroup(group.key().name, group.move().moved_to());
  if (absl::Status s = group.lease().Check(ClaimOf(chunk), group.key().name, validated.started);
      !s.ok()) {
    return s;
  }
  if (chunk.group_elements != 0 && chunk.group_elements != group.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.key().name, "' has ", group.num_elements(),
        " elements; this step was planned for ", chunk.group_elements,
        " (was it deleted and registered anew with another size?). Pass a gradient of the "
        "group's size"));
  }
  absl::StatusOr<ChunkRange> range =
      ValidateRange(group, chunk.offset, chunk.gradient_type, chunk.gradient.size(), "gradient");
  if (!range.ok()) return range.status();
  if (chunk.step == 0) {
    return absl::InvalidArgumentError("step must be at least 1 (the first step is 1)");
  }
  if (chunk.step == UINT64_MAX) {
    // A page at step 2^64-1 could be neither stepped nor replayed (its next
    // step does not exist), nor exported and imported again.
    return absl::InvalidArgumentError("step must be at most 2^64-2, the last step a page can take");
  }

  AdamWStepInputs inputs;
  inputs.hyperparameters = group.config().hyperparameters;
  AdamWHyperparameters& h = inputs.hyperparameters;
  if (chunk.lr.has_value()) h.lr = *chunk.lr;
  if (chunk.maximize.has_value()) h.maximize = *chunk.maximize;
  if (chunk.beta1 || chunk.beta2 || chunk.eps || chunk.weight_decay) {
    h.beta1 = chunk.beta1.value_or(h.beta1);
    h.beta2 = chunk.beta2.value_or(h.beta2);
    h.eps = chunk.eps.value_or(h.eps);
    h.weight_decay = chunk.weight_decay.value_or(h.weight_decay);
    if (absl::Status s = ValidateHyperparameters(h); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group '", group.key().name, "': this step's hyperparameters: ", s.message()));
    }
  }
  inputs.step = chunk.step;
  inputs.grad_scale = chunk.grad_scale.value_or(1.0f);
  if (!std::isfinite(inputs.hyperparameters.lr) || inputs.hyperparameters.lr < 0) {
    return absl::InvalidArgumentError(absl::StrCat("group '", group.key().name,
                                                   "': lr must be finite and >= 0, got ",
                                                   ExactText(inputs.hyperparameters.lr)));
  }
  if (!std::isfinite(inputs.grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_scale must be finite, got ", inputs.grad_scale));
  }
  // The step runs in fp32: an lr that is finite as a double can still make
  // the step size or the decay overflow there.
  const AdamWConstants constants = ComputeAdamWConstants(inputs);
  if (!std::isfinite(constants.neg_step_size) || !std::isfinite(constants.decay)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group.key().name, "': lr ", ExactText(inputs.hyperparameters.lr),
        " with weight_decay ", ExactText(inputs.hyperparameters.weight_decay), " at step ",
        inputs.step,
        " gives a step size or decay beyond float32's range (the step runs in fp32); use a "
        "smaller lr"));
  }
  validated.group = std::move(*found);
  validated.count = range->count;
  validated.first_page = range->first_page;
  validated.end_page = range->end_page;
  validated.constants = constants;
  validated.hyperparameters = inputs.hyperparameters;
  if (values == ValueCheck::kNow) {
    if (absl::Status s = CheckGradientValues(chunk, validated, 0, validated.count); !s.ok()) {
      return s;
    }
  }
  return validated;
}

absl::Status StepEngine::CheckGradientValues(const StepChunk& chunk,
                                             const ValidatedChunk& validated, uint64_t begin,
                                             uint64_t end) const {
  const size_t element_size = WireTypeSize(chunk.gradient_type);
  const float grad_scale = validated.constants.grad_scale;
  uint64_t bad = end;
  chunk.gradient.ForEachElementRun(begin * element_size, element_size, end - begin,
                                   [&](size_t first, size_t n, const char* data) {
                                     const size_t found = FindNonFiniteGradient(
                                         data, chunk.gradient_type, n, grad_scale);
                                     if (found == n) return true;
                                     bad = begin + first + found;
                                     return false;
                                   });
  if (bad == end) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("gradient of group '", validated.group->key().name, "' at element ",
                   chunk.offset + bad, " is not finite (after grad_scale ", grad_scale,
                   "); nothing in this chunk was applied. Skip the step or fix the loss scale"));
}

absl::StatusOr<StepChunkResult> StepEngine::Apply(const StepChunk& chunk,
                                                  const ValidatedChunk& validated,
                                                  absl::FunctionRef<char*(size_t)> reserve_params,
                                                  CheckAhead* ahead) {
  const absl::Time started = validated.started;
  Group& group = *validated.group;
  const AdamWConstants& constants = validated.constants;

  StepChunkResult result;
  result.num_elements = validated.count;
  size_t params_bytes = 0;
  {
    PageRangeLock locks(group, validated.first_page, validated.end_page);
    if (group.deleted()) return NotFoundAfterDelete(group);
    if (group.broken()) return BrokenGroup(group);
    // Check every page before touching any, so a refusal changes nothing.
    for (uint64_t p = validated.first_page; p < validated.end_page; ++p) {
      if (!group.page_has_values(p)) {
        return absl::FailedPreconditionError(
            absl::StrCat("page ", p, " (elements [", group.PageBegin(p), ", ", group.PageEnd(p),
                         ")) of group '", group.key().name,
                         "' has no initial values yet; finish uploading them with RegisterGroup"));
      }
      const uint64_t at = group.page_step(p);
      if (at + 1 < chunk.step) {
        return absl::FailedPreconditionError(absl::StrCat("group '", group.key().name, "' page ", p,
                                                          " is at step ", at, "; expected step ",
                                                          at + 1, ", got step ", chunk.step));
      }
      if (at > chunk.step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", group.key().name, "' page ", p, " is already at step ", at, ", past step ",
            chunk.step, "; a replay must name the page's current step"));
      }
    }
    // Under the page locks: a seal (taken with every page lock) is seen here.
    if (group.move().sealed()) return MovedGroup(group.key().name, group.move().moved_to());
    if (absl::Status s = group.lease().Admit(ClaimOf(chunk), group.key().name, absl::Now(),
                                             store_->lease_term());
        !s.ok()) {
      return s;
    }
    const size_t grad_size = WireTypeSize(chunk.gradient_type);
    const size_t param_size = WireTypeSize(chunk.param_type);
    params_bytes = validated.count * param_size;
    char* const params = reserve_params(params_bytes);
    // Applied runs get their params written by the update itself; replayed
    // pages are encoded from the state as it is.
    uint64_t p = validated.first_page;
    while (p < validated.end_page) {
      if (group.page_step(p) == chunk.step) {
        ++result.pages_replayed;
        const uint64_t begin = group.PageBegin(p);
        EncodeFromFloat(chunk.param_type, group.params() + begin,
                        params + (begin - chunk.offset) * param_size, group.PageEnd(p) - begin);
        ++p;
        continue;
      }
      uint64_t run_end = p;
      while (run_end < validated.end_page && group.page_step(run_end) + 1 == chunk.step) ++run_end;
      const uint64_t begin = group.PageBegin(p);
      const uint64_t end = group.PageEnd(run_end - 1);
      const size_t grad_offset = (begin - chunk.offset) * grad_size;
      char* const params_at = params + (begin - chunk.offset) * param_size;
      absl::Status applied;
      if (ahead != nullptr && !ahead->checked) {
        applied = backend_->ApplyAndEncodeCheckingAhead(
            group, begin, end, chunk.gradient, grad_offset, chunk.gradient_type, constants,
            params_at, chunk.param_type, chunk.params_store, ahead->gradient, &ahead->finite);
        ahead->checked = applied.ok();
      } else {
        applied = backend_->ApplyAndEncode(group, begin, end, chunk.gradient, grad_offset,
                                           chunk.gradient_type, constants, params_at,
                                           chunk.param_type, chunk.params_store);
      }
      if (!applied.ok()) {
        // Part of the range may already hold the new state.
        group.mark_broken();
        Log(LogLevel::kError, "group '", group.key().name, "' is broken: ", applied.ToString());
        return applied;
      }
      for (uint64_t q = p; q < run_end; ++q) group.set_page_step(q, chunk.step);
      result.pages_applied += run_end - p;
      p = run_end;
    }
    // Counted under the page locks: once DeleteGroup holds them all, the
    // group's counters are final (StateStore::counter_totals).
    GroupCounters& counters = group.counters();
    (result.pages_applied > 0 ? counters.chunks_applied : counters.chunks_replayed)
        .fetch_add(1, std::memory_order_relaxed);
    counters.bytes_received.fetch_add(chunk.gradient.size(), std::memory_order_relaxed);
    counters.bytes_sent.fetch_add(params_bytes, std::memory_order_relaxed);
    if (result.pages_applied > 0) {
      counters.PagesApplied(chunk.step, result.pages_applied, group.num_pages(), started);
      group.last_step().Record(SteppedWith{chunk.step, validated.hyperparameters});
    }
  }
  group.counters().chunk_latency.Record(absl::ToDoubleMicroseconds(absl::Now() - started));
  return result;
}

absl::Status StepEngine::WriteInitialValues(Group& group, uint64_t offset, WireType type,
                                            absl::string_view data, const LeaseClaim* claim) {
  if (!group.config().has_initial_values) {
    return absl::InvalidArgumentError(
        absl::StrCat("group '", group.key().name,
                     "' was registered with has_initial_values=false; it takes no values"));
  }
  absl::StatusOr<ChunkRange> range = ValidateRange(group, offset, type, data.size(), "values");
  if (!range.ok()) return range.status();
  const size_t bad = FindNonFiniteGradient(data.data(), type, range->count, 1.0f);
  if (bad != range->count) {
    return absl::InvalidArgumentError(absl::StrCat("initial value at element ", offset + bad,
                                                   " of group '", group.key().name,
                                                   "' is not finite"));
  }
  PageRangeLock locks(group, range->first_page, range->end_page);
  if (group.deleted()) return NotFoundAfterDelete(group);
  if (claim != nullptr) {
    for (uint64_t p = range->first_page; p < range->end_page; ++p) {
      if (group.page_step(p) != 0) continue;
      if (absl::Status s = group.lease().Check(*claim, group.key().name, absl::Now()); !s.ok()) {
        return s;
      }
      break;  // One page to write is enough to ask.
    }
  }
  const size_t element_size = WireTypeSize(type);
  for (uint64_t p = range->first_page; p < range->end_page; ++p) {
    if (group.page_step(p) != 0) continue;  // Already trained: never rewind it.
    const uint64_t begin = group.PageBegin(p);
    const uint64_t end = group.PageEnd(p);
    DecodeToFloat(type, data.data() + (begin - offset) * element_size, group.params() + begin,
                  end - begin);
    if (absl::Status s = backend_->ParamsWritten(group, begin, end); !s.ok()) return s;
    group.mark_page_has_values(p);
  }
  group.counters().bytes_received.fetch_add(data.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace optstate
