// Checkpoint calls: resolve the groups, wait for the step, write, prune, count.
#include "server/durability/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/durability/checkpoint_reader.h"
#include "server/durability/file_util.h"
#include "server/durability/move_notes_file.h"

namespace optstate {

Checkpointer::Checkpointer(StateDirLock lock, const CheckpointerOptions& options, StateStore* store,
                           StepBackend* backend)
    : lock_(std::move(lock)),
      options_(options),
      store_(store),
      backend_(backend),
      writer_(options.state_dir, store->page_elements(), backend, options.buffer_bytes,
              &store->commit_gate()) {}

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::OpenAndRestore(
    const CheckpointerOptions& options, StateStore* store, StepBackend* backend, bool require_state,
    ThreadPool* pool) {
  if (options.state_dir.empty()) {
    return absl::InvalidArgumentError("--state_dir is empty");
  }
  if (options.keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoints_to_keep must be at least 1, got ", options.keep));
  }
  if (options.interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--checkpoint_interval must not be negative");
  }
  if (options.interval > absl::ZeroDuration() && options.interval < absl::Seconds(1)) {
    Log(LogLevel::kWarning, "--checkpoint_interval=", absl::FormatDuration(options.interval),
        ": a checkpoint writes and fsyncs every group's state, and one starts that often (as "
        "soon as the last ends); minutes are usual");
  }
  if (absl::Status s = MakeDirectories(options.state_dir); !s.ok()) return s;
  absl::StatusOr<StateDirLock> lock = StateDirLock::Acquire(options.state_dir);
  if (!lock.ok()) return lock.status();
  if (access(options.state_dir.c_str(), W_OK) != 0) {
    // A restore to inspect works so (the lock is taken read-only); a daemon
    // meant to keep state would fail at its first checkpoint, or at its stop.
    Log(LogLevel::kWarning, "--state_dir=", options.state_dir,
        " cannot be written by this daemon (", std::strerror(errno),
        "): its newest checkpoint is restored, but no checkpoint will be written and a stop "
        "exits 3 without its final one. Give the daemon's user write access to it (or mount it "
        "read-write), unless this daemon only restores state to inspect");
  }
  absl::StatusOr<RestoreOutcome> restored = RestoreNewest(store, options.state_dir, pool);
  if (!restored.ok()) return restored.status();
  if (require_state && restored->restored_id.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--require_state: no usable checkpoint in ", options.state_dir,
        restored->refusals.empty() ? " (there is none)"
                                   : absl::StrCat(": ", absl::StrJoin(restored->refusals, "; "))));
  }
  std::unique_ptr<Checkpointer> checkpointer(
      new Checkpointer(*std::move(lock), options, store, backend));
  checkpointer->pool_ = pool;
  {
    absl::MutexLock lock(&checkpointer->write_mu_);
    absl::StatusOr<std::vector<std::string>> unfinished = checkpointer->writer_.RemoveUnfinished();
    if (!unfinished.ok()) {
      // Left over, not wrong: a restore never reads them, and the next
      // checkpoint's Prune tries again.
      Log(LogLevel::kWarning,
          "could not remove the unfinished checkpoints earlier crashes left in ", options.state_dir,
          ": ", unfinished.status().ToString());
    } else if (!unfinished->empty()) {
      Log(LogLevel::kInfo, "removed ", unfinished->size(), " unfinished checkpoint director",
          unfinished->size() == 1 ? "y" : "ies", " that earlier crashes left in ",
          options.state_dir, ": ", absl::StrJoin(*unfinished, ", "));
    }
    checkpointer->next_sequence_ = restored->next_sequence;
    checkpointer->refused_at_start_ = restored->refused_sequences;
  }
  {
    absl::MutexLock lock(&checkpointer->mu_);
    checkpointer->stats_.restored_id = restored->restored_id;
    checkpointer->stats_.restore_refusals = restored->refusals;
  }
  if (restored->restored_id.empty() && !restored->refusals.empty()) {
    checkpointer->writes_refused_ = absl::StrCat(
        "no checkpoint is written: every checkpoint in ", options.state_dir,
        " was refused at start (", absl::StrJoin(restored->refusals, "; "),
        "), and a new one would replace them; fix what the refusals name and restart, or move "
        "them out of --state_dir to start afresh");
    Log(LogLevel::kError, checkpointer->writes_refused_);
  } else if (restored->refused_for_a_fixable_cause) {
    // The restore goes newest first: each refused checkpoint is newer than
    // the one restored. A new checkpoint would be the newest, so the next
    // start would restore it, never the refused ones, and prune them: of a
    // damaged one (DATA_LOSS) nothing is lost, of one that needs other flags
    // or a newer daemon its newer state would be.
    checkpointer->writes_refused_ = absl::StrCat(
        "no checkpoint is written: ", restored->refusals.size(), " checkpoint",
        restored->refusals.size() == 1 ? "" : "s", " newer than the restored ",
        restored->restored_id, " ", restored->refusals.size() == 1 ? "was" : "were",
        " refused at start (", absl::StrJoin(restored->refusals, "; "),
        "), and a new one would take their place as the newest, to be restored and kept "
        "instead of them; fix what the refusals name and restart (the newest is then "
        "restored), or move them out of --state_dir and restart to go on from ",
        restored->restored_id);
    Log(LogLevel::kError, checkpointer->writes_refused_);
  }
  checkpointer->RestoreMoveNotes();
  if (options.interval > absl::ZeroDuration()) {
    Checkpointer* raw = checkpointer.get();
    checkpointer->timer_ = std::thread([raw] { raw->RunTimer(); });
  }
  return checkpointer;
}

void Checkpointer::RestoreMoveNotes() {
  absl::StatusOr<std::vector<StateStore::MoveNote>> notes = ReadMoveNotes(options_.state_dir);
  if (!notes.ok()) {
    // Kept aside for the operator, not overwritten by the next seal: the
    // copies it would have sealed are steppable until it is fixed.
    const std::string path = absl::StrCat(options_.state_dir, "/", kMoveNotesFileName);
    const std::string aside = absl::StrCat(path, ".refused");
    const bool kept = Rename(path, aside).ok();
    Log(LogLevel::kError, notes.status().message(),
        kept ? absl::StrCat(" (kept as ", aside, ")") : std::string(),
        ": groups this daemon moved away before it restarted are not sealed again; a client on "
        "the old member list may step them here. Finish or undo the Rebalance from a client of "
        "every member (docs/scale-out.md)");
  } else {
    size_t sealed = 0;
    for (StateStore::MoveNote& note : *notes) {
      // A group restored from a checkpoint written before its move (or one
      // sealed when the daemon stopped) is a stale copy: sealed again, it
      // steps no more, and the next Rebalance deletes it.
      if (store_->Find(note.key).ok() && store_->Seal(note.key, note.moved_to).ok()) {
        ++sealed;
      } else {
        store_->AddMoveNote(note.key, std::move(note.moved_to));
      }
    }
    if (!notes->empty()) {
      Log(LogLevel::kInfo, "read ", notes->size(), " notes of groups moved to other daemons from ",
          options_.state_dir, "/", kMoveNotesFileName, " (", sealed,
          " of them restored here: sealed again)");
    }
  }
  store_->SetMoveNotesListener([this] { return WriteMoveNotesNow(); });
}

absl::Status Checkpointer::WriteMoveNotesNow() {
  absl::MutexLock lock(&moves_mu_);
  // Of the store now, under this lock: two writers in a row write the same
  // newest notes, never an older set last.
  const std::vector<StateStore::MoveNote> notes = store_->MoveNotes();
  absl::Status status = lock_.StillHeld();
  if (status.ok()) status = WriteMoveNotes(options_.state_dir, notes);
  if (!status.ok()) {
    Log(LogLevel::kWarning, "the notes of groups moved to other daemons were not written (",
        status.message(), ")");
    return absl::FailedPreconditionError(absl::StrCat(
        "this daemon cannot keep the note of a move in ", options_.state_dir, "/",
        kMoveNotesFileName, " (", status.message(),
        "), so after a restart its copy would step again: make --state_dir writable, or move "
        "the group by hand"));
  }
  return absl::OkStatus();
}

// The store outlives the checkpointer (Server::Parts); no call is served
// by now, and Stop() has joined the call threads before the listener goes.
Checkpointer::~Checkpointer() {
  Stop();
  store_->SetMoveNotesListener(nullptr);
}

void Checkpointer::EndWaitsForSteps() {
  absl::MutexLock lock(&mu_);
  steps_ended_ = true;
}

void Checkpointer::Stop() {
  std::vector<CallThread> calls;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    calls.swap(calls_);
  }
  for (CallThread& call : calls) call.thread.join();
  if (timer_.joinable()) timer_.join();
}

void Checkpointer::RunTimer() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      const bool* stopping = &stopping_;
      if (mu_.AwaitWithTimeout(absl::Condition(stopping), options_.interval)) return;
    }
    CheckpointCall call;
    call.cancelled = [this] {
      absl::MutexLock lock(&mu_);
      return stopping_;
    };
    absl::StatusOr<CheckpointOutcome> outcome = Checkpoint(call);
    if (!outcome.ok() && !call.cancelled()) {  // Cancelled: the daemon is stopping.
      Log(LogLevel::kError, "interval checkpoint failed: ", outcome.status().ToString());
    }
  }
}

void Checkpointer::CheckpointAsync(CheckpointCall call,
                                   std::function<void(absl::StatusOr<CheckpointOutcome>)> done) {
  const std::string tenant = call.tenant.value_or("");
  OnCallThread([this, call = std::move(call), done] { done(Checkpoint(call)); },
               [done](absl::Status refused) { done(refused); }, "Checkpoint", tenant);
}

void Checkpointer::RewindAsync(JobRewindRequest request, CheckpointCall after,
                               std::function<void(absl::StatusOr<JobRewindOutcome>)> done) {
  const std::string tenant = request.tenant;
  OnCallThread([this, request = std::move(request), after = std::move(after),
                done] { done(Rewind(request, after)); },
               [done](absl::Status refused) { done(refused); }, "RewindJob", tenant);
}

void Checkpointer::OnCallThread(std::function<void()> work,
                                const std::function<void(absl::Status)>& refuse,
                                absl::string_view what, const std::string& tenant) {
  std::vector<CallThread> finished;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refuse(absl::CancelledError("the daemon is shutting down"));
      return;
    }
    auto running = std::partition(calls_.begin(), calls_.end(),
                                  [](const CallThread& c) { return !c.finished->load(); });
    std::move(running, calls_.end(), std::back_inserter(finished));
    calls_.erase(running, calls_.end());
    const size_t of_tenant = std::count_if(calls_.begin(), calls_.end(),
                                           [&](const CallThread& c) { return c.tenant == tenant; });
    if (of_tenant >= kMaxCallsPerTenant) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat(kMaxCallsPerTenant,
                       " Checkpoint and RewindJob calls of this tenant are already waiting; "
                       "wait for one to return (give calls that wait for a step a deadline)"));
    } else if (calls_.size() >= kMaxCallsInFlight) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat(kMaxCallsInFlight,
                       " Checkpoint and RewindJob calls are already waiting; wait for one "
                       "to return"));
    } else {
      auto flag = std::make_shared<std::atomic<bool>>(false);
      try {
        calls_.push_back(CallThread{std::thread([flag, work = std::move(work)] {
                                      work();
                                      flag->store(true);
                                    }),
                                    flag, tenant});
      } catch (const std::system_error& e) {
        refused = absl::UnavailableError(
            absl::StrCat("no thread could be started for the ", what, " call: ", e.what()));
      }
    }
  }
  for (CallThread& c : finished) c.thread.join();
  if (!refused.ok()) refuse(refused);
}

absl::Status Checkpointer::WaitForStep(const std::vector<std::shared_ptr<Group>>& groups,
                                       uint64_t step, const CheckpointCall& call) {
  for (;;) {
    const Group* behind = nullptr;
    uint64_t behind_page = 0;
    for (const auto& group : groups) {
      if (group->deleted()) {
        // Not named: left out of the checkpoint, as if deleted before it.
        if (call.groups.empty()) continue;
        return absl::NotFoundError(absl::StrCat("group '", group->key().name,
                                                "' was deleted while Checkpoint waited for step ",
                                                step, "; nothing was written"));
      }
      for (uint64_t p = 0; p < group->num_pages(); ++p) {
        const uint64_t at = group->page_step(p);
        if (at > step) {
          return absl::FailedPreconditionError(absl::StrCat(
              "group '", group->key().name, "' page ", p, " is at step ", at, ", past step ", step,
              "; a checkpoint at step ", step,
              " can no longer be written (nothing was written). Ask for wait_for_step ", at,
              " or restart both sides from an earlier checkpoint"));
        }
        if (at < step && behind == nullptr) {
          behind = group.get();
          behind_page = p;
        }
      }
    }
    if (behind == nullptr) return absl::OkStatus();
    if (absl::Now() >= call.deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("group '", behind->key().name, "' page ", behind_page, " is at step ",
                       behind->page_step(behind_page), " and did not reach step ", step,
                       " before the call's deadline; nothing was written"));
    }
    if (call.cancelled()) return absl::CancelledError("the Checkpoint call was cancelled");
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::CancelledError("the daemon is shutting down");
      if (steps_ended_) {
        return absl::UnavailableError(absl::StrCat(
            "optstated is shutting down and applies no more steps: group '", behind->key().name,
            "' page ", behind_page, " is at step ", behind->page_step(behind_page), ", not step ",
            step,
            "; nothing was written. Resend the steps and retry Checkpoint against the restarted "
            "daemon"));
      }
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<CheckpointOutcome> Checkpointer::Checkpoint(const CheckpointCall& call) {
  if (!writes_refused_.empty()) {
    // Counted as a failure: the alert on failures tells the operator that
    // this daemon runs without durability until the refusals are dealt with.
    absl::Status refused = absl::FailedPreconditionError(writes_refused_);
    Record(refused, absl::ZeroDuration());
    return refused;
  }
  std::vector<std::shared_ptr<Group>> named;
  for (const GroupKey& key : call.groups) {
    absl::StatusOr<std::shared_ptr<Group>> group = store_->Find(key);
    if (!group.ok()) return group.status();
    named.push_back(*std::move(group));
  }
  if (call.groups.empty()) named = call.tenant ? store_->List(*call.tenant) : store_->ListAll();
  if (call.wait_for_step) {
    if (absl::Status s = WaitForStep(named, *call.wait_for_step, call); !s.ok()) return s;
  }
  absl::MutexLock write_lock(&write_mu_);
  // The wait for the writer (one checkpoint at a time) may outlast the
  // caller: a call whose caller has gone writes nothing (a client retrying
  // with a short deadline would otherwise have every abandoned call write a
  // whole checkpoint, one after another).
  if (call.cancelled()) {
    return absl::CancelledError(
        "the Checkpoint call was cancelled while earlier checkpoints were written; nothing was "
        "written");
  }
  if (absl::Now() >= call.deadline) {
    return absl::DeadlineExceededError(
        "the call's deadline passed while earlier checkpoints were written; nothing was written");
  }
  if (!call.groups.empty()) {
    for (const auto& group : named) {
      if (group->deleted()) {
        return absl::NotFoundError(absl::StrCat("group '", group->key().name,
                                                "' was deleted before its checkpoint was "
                                                "written; nothing was written"));
      }
    }
  }
  // Another daemon may have locked the state_dir since its LOCK went.
  if (absl::Status held = lock_.StillHeld(); !held.ok()) {
    Record(held, absl::ZeroDuration());
    Log(LogLevel::kError, held.message());
    return held;
  }
  const absl::Time started = absl::Now();
  std::vector<CheckpointTarget> targets;
  for (auto& group : store_->ListAll()) {
    // A group registered after the wait (it was not among those waited for)
    // is written as it is, not held to wait_for_step.
    const bool is_named = std::find(named.begin(), named.end(), group) != named.end();
    CheckpointTarget target{group, std::nullopt};
    if (is_named && call.wait_for_step) target.exact_step = *call.wait_for_step;
    target.named = is_named && !call.groups.empty();
    targets.push_back(std::move(target));
  }
  uint64_t step = 0;
  if (call.wait_for_step) {
    step = *call.wait_for_step;
  } else if (!named.empty()) {
    step = UINT64_MAX;
    for (const auto& group : named) step = std::min(step, group->MinStep());
  }
  const uint64_t sequence = next_sequence_++;
  absl::StatusOr<WrittenCheckpoint> written = writer_.Write(sequence, step, targets);
  absl::StatusOr<CheckpointOutcome> outcome;
  if (written.ok()) {
    // The manifest records the steps as captured; without wait_for_step the
    // checkpoint's step is the lowest captured page step of the named groups.
    if (!call.wait_for_step && !named.empty()) {
      step = UINT64_MAX;
      for (const ManifestGroup& g : written->manifest.groups) {
        for (const auto& group : named) {
          if (group->key() == g.key) step = std::min(step, g.min_step);
        }
      }
      if (step == UINT64_MAX) step = 0;  // All of them deleted meanwhile: none written.
    }
    outcome = CheckpointOutcome{written->id, step, written->bytes};
    if (absl::Status pruned = writer_.Prune(options_.keep, "", refused_at_start_); !pruned.ok()) {
      Log(LogLevel::kWarning, "checkpoint ", written->id,
          " is durable, but removing old ones failed: ", pruned.ToString());
    }
    const WriteTimes& t = written->times;
    Log(LogLevel::kInfo, "checkpoint ", written->id, " durable: step ", step, ", ", written->bytes,
        " bytes, ", written->manifest.groups.size(), " groups, ", absl::FormatDuration(absl::Now() - started),
        " (capture ", absl::FormatDuration(t.capture), ", checksum ",
        absl::FormatDuration(t.checksum), ", write ", absl::FormatDuration(t.write),
        " alongside, fsync ", absl::FormatDuration(t.sync), ")");
  } else {
    outcome = written.status();
    Log(LogLevel::kError, "checkpoint ", CheckpointDirName(sequence),
        " failed: ", written.status().ToString());
  }
  Record(outcome, absl::Now() - started, call.tenant);
  return outcome;
}

void Checkpointer::Record(const absl::StatusOr<CheckpointOutcome>& outcome, absl::Duration took,
                          const std::optional<std::string>& tenant) {
  absl::MutexLock lock(&mu_);
  if (outcome.ok()) {
    stats_.last = *outcome;
    stats_.last_tenant = tenant;
    stats_.last_duration_seconds = absl::ToDoubleSeconds(took);
    stats_.last_finished_unix_micros = absl::ToUnixMicros(absl::Now());
    ++stats_.written;
  } else {
    ++stats_.failures;
    stats_.last_error = outcome.status().ToString();
  }
}

CheckpointStats Checkpointer::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status Checkpointer::WhileNoCheckpointIsWritten(absl::FunctionRef<absl::Status()> change) {
  absl::MutexLock write_lock(&write_mu_);
  return change();
}

absl::StatusOr<JobRewindOutcome> Checkpointer::Rewind(const JobRewindRequest& request,
                                                      const CheckpointCall& after) {
  absl::StatusOr<JobRewindOutcome> outcome;
  {
    absl::MutexLock write_lock(&write_mu_);
    outcome = RewindJob(store_, backend_, options_.state_dir, request, pool_);
  }
  if (!outcome.ok() || request.validate_only) return outcome;
  // The newest checkpoint holds the history the job left: a restart would
  // restore it, and the job's next steps would be taken as replays of it.
  CheckpointCall every_group;  // No groups, no tenant: all of them, as the timer's.
  every_group.deadline = after.deadline;
  every_group.cancelled = [this, cancelled = after.cancelled] {
    if (cancelled()) return true;
    absl::MutexLock lock(&mu_);
    return stopping_;  // Shutdown: its final checkpoint holds the rewind.
  };
  absl::StatusOr<CheckpointOutcome> written = Checkpoint(every_group);
  if (written.ok()) {
    outcome->written_checkpoint_id = written->id;
  } else {
    outcome->not_written = std::string(written.status().message());
    Log(LogLevel::kError, "job '", request.prefix, "' was rewound to ", outcome->checkpoint_id,
        ", but the checkpoint after it failed (a restart would restore the history it left; "
        "checkpoint before stepping on): ",
        written.status().ToString());
  }
  return outcome;
}

}  // namespace optstate
