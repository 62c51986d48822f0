// ImportState's checks and the all-at-once install.
#include "server/durability/state_import.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/durability/checkpointer.h"
#include "server/state/page_range_lock.h"

namespace optstate {

absl::string_view StateTensorName(StateTensor tensor) {
  switch (tensor) {
    case StateTensor::kParams:
      return "params";
    case StateTensor::kExpAvg:
      return "exp_avg";
    case StateTensor::kExpAvgSq:
      return "exp_avg_sq";
    case StateTensor::kPageSteps:
      return "page_steps";
    case StateTensor::kMaxExpAvgSq:
      return "max_exp_avg_sq";
  }
  return "?";
}

absl::Status CheckSameShape(const Group& existing, uint64_t num_elements,
                            const AdamWHyperparameters& h) {
  if (existing.num_elements() == num_elements && existing.config().hyperparameters == h) {
    return absl::OkStatus();
  }
  const AdamWHyperparameters& e = existing.config().hyperparameters;
  return absl::AlreadyExistsError(absl::StrCat(
      "group '", existing.key().name,
      "' already exists with num_elements=", existing.num_elements(), " ",
      DescribeHyperparameters(e), "; the imported state has num_elements=", num_elements, " ",
      DescribeHyperparameters(h),
      ". Delete the group first or import under another name"));
}

absl::StatusOr<std::unique_ptr<StateImport>> StateImport::Begin(StateStore* store,
                                                                StepBackend* backend,
                                                                const StateHeader& header) {
  if (absl::Status s = ValidateGroupName(header.key.name); !s.ok()) return s;
  if (absl::StatusOr<std::shared_ptr<Group>> existing = store->Find(header.key); existing.ok()) {
    if (absl::Status s = CheckSameShape(**existing, header.num_elements, header.hyperparameters);
        !s.ok()) {
      return s;
    }
  }
  GroupConfig config;
  config.num_elements = header.num_elements;
  config.hyperparameters = header.hyperparameters;
  // Every page arrives with values: a later RegisterGroup with initial
  // values finds an equal group (pages past step 0 it never rewinds).
  config.has_initial_values = true;
  absl::StatusOr<StagedGroup> staged = store->Stage(header.key, config);
  if (!staged.ok()) return staged.status();
  return std::unique_ptr<StateImport>(
      new StateImport(store, backend, std::move(*staged), header.accept_non_finite));
}

absl::Status StateImport::AddChunk(StateTensor tensor, uint64_t offset, absl::string_view data) {
  Group& group = staged_.group();
  const absl::string_view name = StateTensorName(tensor);
  if (tensor == StateTensor::kPageSteps) {
    if (data.empty() || data.size() % sizeof(uint64_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a page_steps chunk holds ", data.size(),
          " bytes; it must hold one or more uint64 little-endian steps (8 bytes each)"));
    }
    const uint64_t count = data.size() / sizeof(uint64_t);
    if (offset != page_steps_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_steps chunk starts at page ", offset, "; the next expected is page ",
                       page_steps_.size(), " (send page_steps in order)"));
    }
    if (count > group.num_pages() - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_steps chunk covers pages [", offset, ", ", offset + count,
                       ") but group '", group.key().name, "' has ", group.num_pages(), " pages of ",
                       group.page_elements(), " elements (this daemon's page size)"));
    }
    std::vector<uint64_t> steps(count);
    std::memcpy(steps.data(), data.data(), data.size());
    for (uint64_t i = 0; i < count; ++i) {
      if (steps[i] == UINT64_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(
            "page step ", steps[i], " of page ", offset + i,
            " is out of range; a page's step must be between 0 (never stepped) and 2^64-2 (the "
            "steps it has taken; torch's state['step'])"));
      }
    }
    page_steps_.insert(page_steps_.end(), steps.begin(), steps.end());
    return absl::OkStatus();
  }
  if (tensor == StateTensor::kMaxExpAvgSq && group.max_exp_avg_sq() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a max_exp_avg_sq chunk for group '", group.key().name,
        "', which has amsgrad=false; send max_exp_avg_sq only with amsgrad=true"));
  }
  if (data.empty() || data.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a ", name, " chunk holds ", data.size(),
                                                   " bytes; it must hold one or more float32 "
                                                   "little-endian elements (4 bytes each)"));
  }
  const int index = static_cast<int>(tensor);
  const uint64_t count = data.size() / sizeof(float);
  const uint64_t n = group.num_elements();
  if (offset != received_[index]) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " chunk starts at element ", offset, "; the next expected is element ",
                     received_[index], " (send each tensor in order)"));
  }
  if (count > n - offset) {
    return absl::InvalidArgumentError(absl::StrCat(name, " chunk covers ", count,
                                                   count == 1 ? " element" : " elements",
                                                   " from element ", offset,
                                                   " but group '", group.key().name, "' has ",
                                                   n, " elements"));
  }
  float* const target = (tensor == StateTensor::kParams     ? group.params()
                         : tensor == StateTensor::kExpAvg   ? group.exp_avg()
                         : tensor == StateTensor::kExpAvgSq ? group.exp_avg_sq()
                                                            : group.max_exp_avg_sq()) +
                        offset;
  std::memcpy(target, data.data(), data.size());
  // A square below 0 no step leaves: refused. A finite gradient's square
  // can overflow float32 to +inf (torch's AdamW holds the same inf), which
  // is taken. The rest a step leaves only once a run has diverged (3.4e38
  // then -3.4e38 with torch's defaults: exp_avg -inf, params NaN; 0 x inf
  // in a square with beta2 0): taken with accept_non_finite alone, as a
  // restore takes it, and refused otherwise (an import of a healthy run
  // holds none, so one is most likely a bug of the sender's).
  const bool squares = tensor == StateTensor::kExpAvgSq || tensor == StateTensor::kMaxExpAvgSq;
  const bool refuse_non_finite = !accept_non_finite_;
  for (uint64_t i = 0; (squares || refuse_non_finite) && i < count; ++i) {
    const float value = target[i];
    const bool below_zero = squares && value < 0;
    const bool non_finite =
        refuse_non_finite && (squares ? std::isnan(value) : !std::isfinite(value));
    if (!below_zero && !non_finite) continue;
    std::memset(target, 0, data.size());  // Nothing of a refused chunk stays.
    return absl::InvalidArgumentError(absl::StrCat(
        name, " element ", offset + i, " is ", value, "; ",
        below_zero
            ? absl::StrCat(name,
                           " is never below 0 (a square; a step can leave +inf there, or "
                           "NaN once a run diverged, never less)")
            : absl::StrCat("values must be finite", squares ? " (the squares may be +inf)" : "",
                           ". A diverged run's state, which may hold inf and NaN, is taken "
                           "only when the header says so "
                           "(GroupStateHeader.accept_non_finite)")));
  }
  received_[index] += count;
  return absl::OkStatus();
}

absl::StatusOr<StateImport::Result> StateImport::Commit(const LeaseClaim& claim,
                                                        Checkpointer* checkpointer) {
  Group& group = staged_.group();
  const uint64_t n = group.num_elements();
  const bool amsgrad = group.max_exp_avg_sq() != nullptr;
  for (StateTensor t : {StateTensor::kParams, StateTensor::kExpAvg, StateTensor::kExpAvgSq,
                        StateTensor::kMaxExpAvgSq}) {
    if (t == StateTensor::kMaxExpAvgSq && !amsgrad) continue;
    const uint64_t got = received_[static_cast<int>(t)];
    if (got != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the import of group '", group.key().name, "' ended with ", StateTensorName(t),
          " covering elements [0, ", got, ") of ", n, "; send every element of params, exp_avg",
          amsgrad ? ", exp_avg_sq and max_exp_avg_sq (amsgrad)" : " and exp_avg_sq"));
    }
  }
  if (page_steps_.size() != 1 && page_steps_.size() != group.num_pages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the import of group '", group.key().name, "' carried ", page_steps_.size(),
        " page steps; send one per page (", group.num_pages(), " pages of ", group.page_elements(),
        " elements, this daemon's page size) or exactly one for every page"));
  }
  for (uint64_t p = 0; p < group.num_pages(); ++p) {
    absl::MutexLock lock(&group.page_mutex(p));
    group.set_page_step(p, page_steps_.size() == 1 ? page_steps_[0] : page_steps_[p]);
    group.mark_page_has_values(p);
  }
  Result result;
  if (absl::StatusOr<std::shared_ptr<Group>> existing = store_->Find(group.key()); existing.ok()) {
    if (absl::Status s = CheckSameShape(**existing, n, group.config().hyperparameters); !s.ok()) {
      return s;
    }
    if (absl::Status s = (*existing)->lease().Check(claim, group.key().name, absl::Now());
        !s.ok()) {
      return s;
    }
    bool unsealed = false;
    auto replace = [&] {
      // Again, after any wait for a checkpoint: the lease may have moved.
      if (absl::Status s = (*existing)->lease().Check(claim, group.key().name, absl::Now());
          !s.ok()) {
        return s;
      }
      return ReplaceGroupState(*backend_, group, **existing, /*unseal=*/true, &unsealed);
    };
    if (absl::Status s =
            checkpointer != nullptr ? checkpointer->WhileNoCheckpointIsWritten(replace) : replace();
        !s.ok()) {
      return s;
    }
    // Unsealed: its move is undone. A failure to write that is logged; the
    // seal's line then stays in MOVES, and a restart seals it again (the next
    // Rebalance, or an import, unseals it).
    if (unsealed) (void)store_->MoveNotesChanged();
    (*existing)->last_step().Reset();  // The steps it recorded are not this state's.
    // The imported state is the group's now: the RegisterGroup stream that
    // created it no longer removes it when that stream fails, even with
    // every page at step 0 (StateStore::Unregister).
    (*existing)->mark_joined();
    // Taken after the state is in: a refused replace leaves the lease as it
    // was (another holder taking it between the check and here keeps it).
    (void)(*existing)->lease().Admit(claim, group.key().name, absl::Now(), store_->lease_term());
    result.group = std::move(*existing);
    result.replaced = true;
    Log(LogLevel::kInfo, "group '", group.key().name, "': state replaced by an import, steps ",
        result.group->MinStep(), "..", result.group->MaxStep());
    return result;
  }
  absl::StatusOr<std::shared_ptr<Group>> published = store_->Publish(staged_);
  if (!published.ok()) return published.status();
  result.group = std::move(*published);
  (void)result.group->lease().Admit(claim, group.key().name, absl::Now(), store_->lease_term());
  Log(LogLevel::kInfo, "group '", group.key().name,
      "' created by an import: ", result.group->num_elements(), " elements, steps ",
      result.group->MinStep(), "..", result.group->MaxStep());
  return result;
}

absl::Status ReplaceGroupState(StepBackend& backend, const Group& source, Group& target,
                               bool unseal, bool* unsealed) {
  if (unsealed != nullptr) *unsealed = false;
  const uint64_t pages = target.num_pages();
  PageRangeLock all_pages(target);
  absl::Status status;
  if (target.deleted()) {
    status = absl::NotFoundError(absl::StrCat("group '", target.key().name, "' was deleted"));
  } else if (target.broken()) {
    status = absl::DataLossError(absl::StrCat(
        "group '", target.key().name,
        "' failed part-way through an update; delete it, then import its state again"));
  } else {
    // Asks the backend first whether it can take this group's state, so a
    // refusal leaves the host arrays as they were.
    status = backend.ReadStateToHost(target, 0, target.num_elements());
  }
  if (status.ok()) {
    const size_t bytes = target.num_elements() * sizeof(float);
    std::memcpy(target.params(), source.params(), bytes);
    std::memcpy(target.exp_avg(), source.exp_avg(), bytes);
    std::memcpy(target.exp_avg_sq(), source.exp_avg_sq(), bytes);
    if (target.max_exp_avg_sq() != nullptr && source.max_exp_avg_sq() != nullptr) {
      std::memcpy(target.max_exp_avg_sq(), source.max_exp_avg_sq(), bytes);
    }
    for (uint64_t p = 0; p < pages; ++p) {
      target.set_page_step(p, source.page_step(p));
      target.mark_page_has_values(p);
    }
    status = backend.StateWritten(target, 0, target.num_elements());
  }
  if (status.ok() && unseal && target.move().sealed()) {
    // Under the same page locks as the replace: a seal (taken with every
    // page lock) cannot come between the two and be undone.
    Log(LogLevel::kInfo, "group '", target.key().name, "': unsealed by an import (its move to '",
        target.move().moved_to(), "' undone)");
    target.move().Unseal();
    if (unsealed != nullptr) *unsealed = true;
  }
  return status;
}

}  // namespace optstate
