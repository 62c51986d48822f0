// The daemon's checkpoints: the trainer's Checkpoint{wait_for_step} call,
// the --checkpoint_interval timer, the final checkpoint at shutdown, pruning
// to --checkpoints_to_keep, restore at start, and the figures for GetStats.
#ifndef OPTSTATE_SERVER_DURABILITY_CHECKPOINTER_H_
#define OPTSTATE_SERVER_DURABILITY_CHECKPOINTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/base/thread_pool.h"
#include "server/durability/checkpoint_writer.h"
#include "server/durability/job_rewind.h"
#include "server/durability/state_dir_lock.h"
#include "server/engine/state_store.h"

namespace optstate {

struct CheckpointerOptions {
  std::string state_dir;                           // Required.
  absl::Duration interval = absl::ZeroDuration();  // Zero: no timer.
  int keep = 2;                                    // Complete checkpoints kept, >= 1.
  uint64_t buffer_bytes = 8 << 20;                 // Each of the writer's 2 runs (>= a page).
};

struct CheckpointCall {
  // The groups wait_for_step applies to; empty: all of `tenant`'s, or with
  // no tenant every group.
  std::vector<GroupKey> groups;
  std::optional<std::string> tenant;
  std::optional<uint64_t> wait_for_step;
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled = [] { return false; };
};

struct CheckpointOutcome {
  std::string id;
  uint64_t step = 0;
  uint64_t bytes = 0;
};

struct CheckpointStats {
  std::optional<CheckpointOutcome> last;
  // The tenant whose call wrote `last` (its step is that tenant's groups');
  // unset for an admin's call, the timer's and a daemon without tenants.
  std::optional<std::string> last_tenant;
  double last_duration_seconds = 0;
  int64_t last_finished_unix_micros = 0;
  uint64_t written = 0;
  uint64_t failures = 0;
  std::string last_error;
  std::string restored_id;
  std::vector<std::string> restore_refusals;
};

// Thread-safe. Checkpoints are written one at a time, in the order asked.
class Checkpointer {
 public:
  // Creates state_dir if needed, takes its lock (FAILED_PRECONDITION while
  // another daemon holds it; state_dir_lock.h), restores its newest complete
  // checkpoint into `store` (which must be empty and must outlive the
  // checkpointer, as must `backend`) and removes the unfinished checkpoints
  // earlier crashes left (a failure to remove them is logged, not fatal). The lock is held until the checkpointer is
  // destroyed. With `require_state`, FAILED_PRECONDITION (listing each
  // refusal) when no checkpoint could be restored. `pool` (may be null)
  // reads each group's file in parallel pieces.
  static absl::StatusOr<std::unique_ptr<Checkpointer>> OpenAndRestore(
      const CheckpointerOptions& options, StateStore* store, StepBackend* backend,
      bool require_state, ThreadPool* pool = nullptr);
  // Stops the timer and waits for calls in flight.
  ~Checkpointer();

  // The trainer's contract (proto: rpc Checkpoint). Blocks: waits until
  // every page of the named groups is at wait_for_step (polling every
  // millisecond), then writes a checkpoint of every group and returns once
  // it is durable. NOT_FOUND for an unknown group; FAILED_PRECONDITION naming
  // the step held when a page is past wait_for_step (nothing written);
  // DEADLINE_EXCEEDED when it is not reached by call.deadline; CANCELLED when
  // call.cancelled() or Stop(); DEADLINE_EXCEEDED or CANCELLED, writing
  // nothing, when the deadline passed or the call was cancelled while it
  // waited for earlier checkpoints to be written; NOT_FOUND when a named group is deleted
  // while it waits; FAILED_PRECONDITION, writing nothing, while a checkpoint
  // found at start was refused (every one, or one newer than the one
  // restored: writes_refused()); UNAVAILABLE, writing nothing, when a wait
  // for wait_for_step is ended by EndWaitsForSteps; the writer's errors.
  absl::StatusOr<CheckpointOutcome> Checkpoint(const CheckpointCall& call);
  // Checkpoint on a thread of its own; `done` runs on that thread, or at
  // once with RESOURCE_EXHAUSTED when kMaxCallsPerTenant calls of the
  // call's tenant (CheckpointCall::tenant; unset: "", as for every call of a
  // daemon without tenants), or kMaxCallsInFlight in all, are waiting. One
  // tenant's waiting calls (each may wait for a step until its deadline)
  // then leave room for the others'.
  static constexpr size_t kMaxCallsPerTenant = 64;
  static constexpr size_t kMaxCallsInFlight = 256;
  void CheckpointAsync(CheckpointCall call,
                       std::function<void(absl::StatusOr<CheckpointOutcome>)> done);

  // No more steps will be applied (the daemon is shutting down and its
  // streams have ended): a call waiting for a step ends with UNAVAILABLE,
  // writing nothing, instead of waiting for its deadline; so does any
  // call's wait from now on. Checkpoints go on being written.
  void EndWaitsForSteps();
  // Ends the timer and makes waiting calls return CANCELLED; waits for the
  // threads of CheckpointAsync. Idempotent. Checkpoint still works after it
  // (the final checkpoint at shutdown).
  void Stop();

  CheckpointStats Stats() const;
  // The --state_dir it writes in.
  const std::string& state_dir() const { return options_.state_dir; }

  // Runs `change` while no checkpoint is written or pruned. A change of a
  // group's whole state (an ImportState over an existing group) then lands
  // before a checkpoint's capture or after it, never between two of its
  // pages.
  absl::Status WhileNoCheckpointIsWritten(absl::FunctionRef<absl::Status()> change);

  // RewindJob (job_rewind.h) over this state_dir, while no checkpoint is
  // written or pruned; then (not validate_only) a checkpoint of every group,
  // so that a restart restores the rewound job, within `after`'s deadline
  // and while it is not cancelled (its id, or why it was not written, in
  // the outcome: the rewind stands either way).
  absl::StatusOr<JobRewindOutcome> Rewind(const JobRewindRequest& request,
                                          const CheckpointCall& after = CheckpointCall());
  // Rewind on a thread of its own, as CheckpointAsync (the two share its
  // limit of calls in flight).
  void RewindAsync(JobRewindRequest request, CheckpointCall after,
                   std::function<void(absl::StatusOr<JobRewindOutcome>)> done);

  // Why no checkpoint is written ("" when they are): when checkpoints were
  // found at start and every one was refused, a new checkpoint would soon
  // become the newest (and prune them), so the state they hold, which may
  // only need the right flags to load, would be lost. Set once, at start.
  const std::string& writes_refused() const { return writes_refused_; }

 private:
  Checkpointer(StateDirLock lock, const CheckpointerOptions& options, StateStore* store,
               StepBackend* backend);
  void RunTimer();
  // Runs `work` on a call thread (joined by Stop), or `refuse`s it with
  // CANCELLED when stopping, RESOURCE_EXHAUSTED past kMaxCallsPerTenant
  // calls of `tenant` or kMaxCallsInFlight in all, UNAVAILABLE when no
  // thread starts. `what` names the call.
  void OnCallThread(std::function<void()> work, const std::function<void(absl::Status)>& refuse,
                    absl::string_view what, const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WaitForStep(const std::vector<std::shared_ptr<Group>>& groups, uint64_t step,
                           const CheckpointCall& call);
  void Record(const absl::StatusOr<CheckpointOutcome>& outcome, absl::Duration took,
              const std::optional<std::string>& tenant = std::nullopt);
  // After the restore: the notes of moves of <state_dir>/MOVES back into the
  // store (a restored group among them sealed again), then every change of
  // the store's notes written there (move_notes_file.h).
  void RestoreMoveNotes();
  // FAILED_PRECONDITION saying why when the file cannot be written.
  absl::Status WriteMoveNotesNow() ABSL_LOCKS_EXCLUDED(moves_mu_);

  StateDirLock lock_;  // First: released after everything else is done.
  const CheckpointerOptions options_;
  StateStore* const store_;
  StepBackend* const backend_;
  ThreadPool* pool_ = nullptr;  // Set before the checkpointer is shared; may stay null.
  absl::Mutex moves_mu_;        // Held while <state_dir>/MOVES is written.
  absl::Mutex write_mu_;        // Held while a checkpoint is written.
  CheckpointWriter writer_ ABSL_GUARDED_BY(write_mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(write_mu_) = 1;
  // The checkpoints refused at start: Prune neither counts nor removes them.
  std::vector<uint64_t> refused_at_start_ ABSL_GUARDED_BY(write_mu_);

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool steps_ended_ ABSL_GUARDED_BY(mu_) = false;  // EndWaitsForSteps.
  // Threads of CheckpointAsync; each sets its flag as the last thing it
  // does, and is joined by the next CheckpointAsync or by Stop.
  struct CallThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
    std::string tenant;
  };
  std::vector<CallThread> calls_ ABSL_GUARDED_BY(mu_);
  CheckpointStats stats_ ABSL_GUARDED_BY(mu_);
  std::string writes_refused_;  // Written before the checkpointer is shared.
  std::thread timer_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_CHECKPOINTER_H_
