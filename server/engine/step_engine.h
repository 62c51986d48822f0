// Applies step chunks and initial-value chunks to groups: validates them,
// enforces exactly-once per page, runs the backend, and encodes the updated
// params for the reply. Knows nothing of gRPC.
#ifndef OPTSTATE_SERVER_ENGINE_STEP_ENGINE_H_
#define OPTSTATE_SERVER_ENGINE_STEP_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "optstate/dtype.h"
#include "server/backends/step_backend.h"
#include "server/base/segmented_bytes.h"
#include "server/base/thread_pool.h"
#include "server/engine/state_store.h"

namespace optstate {

// One chunk of one step. `gradient` is raw little-endian `gradient_type`, in
// one buffer or in the pieces it arrived in (a view: it must outlive the
// chunk's Validate and Apply).
struct StepChunk {
  GroupKey group;
  uint64_t step = 0;
  uint64_t offset = 0;
  // The group's size as the sender planned the step; 0: not checked.
  uint64_t group_elements = 0;
  WireType gradient_type = WireType::kFloat32;
  SegmentedBytes gradient;
  // This step's hyperparameters where they differ from the group's
  // registered ones (torch reads them from param_groups at every step);
  // unset: the group's.
  std::optional<double> lr;
  std::optional<double> beta1;
  std::optional<double> beta2;
  std::optional<double> eps;
  std::optional<double> weight_decay;
  std::optional<bool> maximize;
  std::optional<float> grad_scale;
  WireType param_type = WireType::kFloat32;
  // kStreaming when the params go to another process's memory (a
  // shared-memory region) rather than into a reply this process sends.
  ParamsStore params_store = ParamsStore::kCached;
  // Who sends it (GroupLease); null: a call that names no holder. Must
  // outlive the chunk's Validate and Apply.
  const LeaseClaim* lease = nullptr;
};

struct StepChunkResult {
  uint64_t num_elements = 0;
  uint64_t pages_applied = 0;
  uint64_t pages_replayed = 0;
};

// Whether Validate checks the gradient's values (finite after grad_scale)
// itself, or leaves that to CheckGradientValues (which a caller may run on
// several threads, over parts of the chunk).
enum class ValueCheck { kNow, kDeferred };

// The gradient of the chunk a thread will apply after the one it applies
// now, for Apply to check while it updates (MessageStep's chunks checked as
// applied): the check's reads then overlap the update's arithmetic.
struct CheckAhead {
  GradientRange gradient;
  // Set by Apply: whether it checked `gradient` (it does with the chunk's
  // first range it updates), and then whether every element was finite.
  bool checked = false;
  bool finite = false;
};

// A chunk that passed every check that does not depend on its pages' state
// (StepEngine::Validate), ready for StepEngine::Apply once its values are
// checked too (by Validate itself, or by CheckGradientValues).
struct ValidatedChunk {
  std::shared_ptr<Group> group;
  uint64_t count = 0;       // Elements.
  uint64_t first_page = 0;  // Pages [first_page, end_page) are covered.
  uint64_t end_page = 0;
  AdamWConstants constants{};
  AdamWHyperparameters hyperparameters;  // This step's, overrides applied.
  absl::Time started;  // For the chunk's latency.
};

// Thread-safe: chunks of any groups may be applied from many threads; two
// chunks touching one page are serialized, and only one can apply a step.
class StepEngine {
 public:
  // Every pointer must outlive the engine.
  StepEngine(StateStore* store, StepBackend* backend, ThreadPool* pool)
      : store_(store), backend_(backend), pool_(pool) {}

  // A chunk is applied in two halves, so a caller can check several chunks
  // before applying any. Together they apply AdamW step `chunk.step` to the
  // chunk's pages that are at step-1, leave pages already at `step` as they
  // are (a replay), and write the params of the whole chunk, as they are
  // after the step, in chunk.param_type. A refusal changes nothing; each
  // message says what to fix.
  //
  // Validate refuses what does not depend on page state: NOT_FOUND (no such
  // group), FAILED_PRECONDITION (another holder's lease, GroupLease),
  // INVALID_ARGUMENT (bad range, alignment, length or values; a
  // group_elements other than the group's size; bad lr or grad_scale; and,
  // last, unless `values` is kDeferred, a non-finite gradient).
  //
  // Apply, given the same chunk (its gradient still alive), takes the page
  // locks and refuses the rest: FAILED_PRECONDITION (a page lacks initial
  // values, is behind step-1, or is past `step`; another holder's lease, which
  // it takes or renews for the chunk's holder once every check passed),
  // NOT_FOUND once the group
  // was deleted, DATA_LOSS once a backend failed part-way through an update
  // of the group (it is then refused for good). `reserve_params(bytes)` is
  // called once, after the page checks, and returns where the params go
  // (writable for `bytes`): the reply's own buffer, so they are written once.
  absl::StatusOr<ValidatedChunk> Validate(const StepChunk& chunk,
                                          ValueCheck values = ValueCheck::kNow);

  // The value check Validate(chunk, kDeferred) left out, for elements
  // [begin, end) of the chunk (relative to its offset): INVALID_ARGUMENT,
  // naming the first element there whose scaled gradient is not finite, with
  // the message Validate would give. Thread-safe; reads only the gradient.
  absl::Status CheckGradientValues(const StepChunk& chunk, const ValidatedChunk& validated,
                                   uint64_t begin, uint64_t end) const;
  // Apply (described above) with `ahead`: the first range it updates also
  // checks ahead's gradient (CheckAhead); a chunk refused or wholly replayed
  // leaves it unchecked.
  absl::StatusOr<StepChunkResult> Apply(const StepChunk& chunk, const ValidatedChunk& validated,
                                        absl::FunctionRef<char*(size_t)> reserve_params,
                                        CheckAhead* ahead = nullptr);

  // Writes initial parameter values to the pages of [offset, offset+n) that
  // are still at step 0; pages already stepped are left alone. Same range
  // rules and codes as a step's (INVALID_ARGUMENT); values must be finite,
  // and the group must have been registered with has_initial_values.
  // NOT_FOUND once `group` has been deleted (even if another group of that
  // name exists now). With `claim`: FAILED_PRECONDITION (GroupLease::Check),
  // nothing written, when a page at step 0 would be written while another
  // holder than the claim's leases the group (a second job must not change
  // the values a first step of the holder's, broken part-way, resumes on).
  absl::Status WriteInitialValues(Group& group, uint64_t offset, WireType type,
                                  absl::string_view data, const LeaseClaim* claim = nullptr);

  StateStore* store() const { return store_; }
  StepBackend* backend() const { return backend_; }
  ThreadPool* pool() const { return pool_; }

 private:
  StateStore* const store_;
  StepBackend* const backend_;
  ThreadPool* const pool_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_ENGINE_STEP_ENGINE_H_
