// Rewinding one job (the groups of one tenant under one name prefix) to a
// checkpoint of --state_dir while the daemon serves every other job.
#ifndef OPTSTATE_SERVER_DURABILITY_JOB_REWIND_H_
#define OPTSTATE_SERVER_DURABILITY_JOB_REWIND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backends/step_backend.h"
#include "server/base/thread_pool.h"
#include "server/engine/state_store.h"
#include "server/state/group_lease.h"

namespace optstate {

struct JobRewindRequest {
  std::string tenant;
  std::string prefix;  // Non-empty: the job's groups are those named prefix + ...
  // The step to go back to; unset: the newest checkpoint's.
  std::optional<uint64_t> step;
  LeaseClaim lease;  // The caller's: it must be admitted to every group it replaces.
  // Every check, then the outcome the rewind would have (groups: those it
  // would rewind), changing nothing.
  bool validate_only = false;
  // False for a tenant of a daemon with tenants (not an admin): why a
  // checkpoint could not be read (its manifest, which names every tenant's
  // groups) is logged, not told.
  bool caller_sees_every_tenant = true;
};

struct JobRewindOutcome {
  std::string checkpoint_id;
  uint64_t step = 0;                // The step the job's stepped groups are at now.
  std::vector<std::string> groups;  // Those rewound, by name.
  // Newer checkpoints passed over, each with why (another step, a torn job,
  // a fault in a file).
  std::vector<std::string> passed_over;
  // The checkpoint of every group written after the rewind (Checkpointer::
  // Rewind), or why none was (one of the two set; neither with validate_only).
  std::string written_checkpoint_id;
  std::string not_written;
};

// Finds, newest first, the first complete checkpoint of `state_dir` holding
// groups of the job whose stepped groups are all at one step (`step` when
// given), loads those groups (files verified), and installs them: an existing
// group of the same size and hyperparameters gets its whole state replaced
// (ReplaceGroupState, so a step sees all of the old state or all of the new),
// a deleted one is made again; each then has the checkpoint's record of its
// last step (none when it held none) and is leased to the caller. Refused, changing nothing:
// INVALID_ARGUMENT for an empty prefix; NOT_FOUND when no checkpoint holds such a state of the job
// (saying what was passed over); FAILED_PRECONDITION when a group of the job
// that exists now is not in that checkpoint (added since: delete it first),
// or when another holder leases one of its groups (GroupLease), or when one
// of them moved to another daemon since (StateStore::Seal's note);
// ALREADY_EXISTS when one differs in size or hyperparameters from the
// checkpoint's; RESOURCE_EXHAUSTED when no checkpoint was taken and one
// was refused for room: its copies do not fit in the daemon's budget beside
// the live state (or a group deleted since, made again, not in the tenant's
// quota); ABORTED while an import or another rewind replaces one of the
// job's groups. A backend that fails part-way leaves the groups before it
// rewound and says which. With request.validate_only, returns after the
// checks, having changed nothing.
absl::StatusOr<JobRewindOutcome> RewindJob(StateStore* store, StepBackend* backend,
                                           const std::string& state_dir,
                                           const JobRewindRequest& request, ThreadPool* pool);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_JOB_REWIND_H_
