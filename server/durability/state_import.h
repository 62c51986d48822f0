// An import of a group's whole state (ImportState): the pieces are checked
// and gathered out of sight, and become visible to Step all at once.
#ifndef OPTSTATE_SERVER_DURABILITY_STATE_IMPORT_H_
#define OPTSTATE_SERVER_DURABILITY_STATE_IMPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/backends/step_backend.h"
#include "server/engine/state_store.h"
#include "server/state/group.h"

namespace optstate {

class Checkpointer;  // checkpointer.h

// kMaxExpAvgSq: an amsgrad group's max_exp_avg_sq (none other has it).
enum class StateTensor { kParams, kExpAvg, kExpAvgSq, kPageSteps, kMaxExpAvgSq };

// "params", "exp_avg", "exp_avg_sq", "page_steps" or "max_exp_avg_sq".
absl::string_view StateTensorName(StateTensor tensor);

struct StateHeader {
  GroupKey key;
  uint64_t num_elements = 0;
  AdamWHyperparameters hyperparameters;
  // Takes what a diverged run leaves: any value in params and exp_avg, NaN
  // in the squares. Without it those are refused: a healthy run's state
  // holds none (the squares' +inf, a finite gradient's overflow, excepted).
  bool accept_non_finite = false;
};

// Not thread-safe: one stream feeds it. Destroying it uncommitted frees what
// it gathered; nothing of it was ever visible.
class StateImport {
 public:
  // Checks the header and sets aside memory for the state (counted against
  // the store's budget while the import lasts, also when it replaces a
  // group). INVALID_ARGUMENT for a bad name, size or hyperparameters;
  // ALREADY_EXISTS when a group of that name differs in size or
  // hyperparameters; RESOURCE_EXHAUSTED past the budget.
  static absl::StatusOr<std::unique_ptr<StateImport>> Begin(StateStore* store, StepBackend* backend,
                                                            const StateHeader& header);

  // One run of `tensor`: float32 little-endian elements from element
  // `offset` (uint64 little-endian steps from page `offset` for page steps).
  // Each tensor's runs must come in order, each starting where the last
  // ended. INVALID_ARGUMENT, naming what to fix and changing nothing, for a
  // run out of order or past the end, a length that is not whole elements, a
  // negative exp_avg_sq or max_exp_avg_sq, a step of 2^64-1, max_exp_avg_sq
  // for a group without amsgrad, and (without accept_non_finite) a param or
  // exp_avg that is not finite or a square that is NaN.
  absl::Status AddChunk(StateTensor tensor, uint64_t offset, absl::string_view data);

  struct Result {
    std::shared_ptr<Group> group;
    bool replaced = false;  // An existing group's state was replaced.
  };
  // Checks that every element and page step arrived (one step per page of
  // the store's page size, or exactly one for every page; max_exp_avg_sq too
  // for an amsgrad group), then installs the
  // state: a new group becomes visible, or an existing one of equal size and
  // hyperparameters has all its pages replaced while holding every page
  // mutex. INVALID_ARGUMENT for missing pieces; ALREADY_EXISTS as in Begin;
  // FAILED_PRECONDITION when another holder than `claim`'s leases the
  // existing group (GroupLease); the backend's error when it cannot take the
  // state. On error nothing is visible or changed. The group is then leased
  // to `claim`'s holder (none: as it was). Call at most once.
  // With `checkpointer`, an existing group is replaced while no checkpoint
  // is written (Checkpointer::WhileNoCheckpointIsWritten), so no checkpoint
  // holds some of its pages from before the import and some from after.
  absl::StatusOr<Result> Commit(const LeaseClaim& claim = LeaseClaim(),
                                Checkpointer* checkpointer = nullptr);

 private:
  StateImport(StateStore* store, StepBackend* backend, StagedGroup staged, bool accept_non_finite)
      : store_(store),
        backend_(backend),
        staged_(std::move(staged)),
        accept_non_finite_(accept_non_finite) {}

  StateStore* const store_;
  StepBackend* const backend_;
  StagedGroup staged_;
  const bool accept_non_finite_;  // StateHeader::accept_non_finite.
  // Elements received so far, by StateTensor (page steps: unused).
  uint64_t received_[5] = {0, 0, 0, 0, 0};
  std::vector<uint64_t> page_steps_;
};

// ALREADY_EXISTS unless `existing` has `num_elements` and `hyperparameters`.
absl::Status CheckSameShape(const Group& existing, uint64_t num_elements,
                            const AdamWHyperparameters& hyperparameters);

// Copies the whole state of `source` (params, m, v, max_exp_avg_sq with
// amsgrad, page steps) into
// `target`, of the same size, holding every page mutex of `target`
// (ascending), so a Step sees all of the old state or all of the new.
// NOT_FOUND once target is deleted, DATA_LOSS when it is broken, the
// backend's error when it cannot take the state (then nothing changed).
// With `unseal`, a target sealed for a move (group_move.h) is unsealed under
// the same locks: the import makes this daemon its home again (a Rebalance
// back, or one finishing a move in place), so steps apply; `*unsealed`
// (when given) says whether it was.
absl::Status ReplaceGroupState(StepBackend& backend, const Group& source, Group& target,
                               bool unseal = false, bool* unsealed = nullptr);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_STATE_IMPORT_H_
