// The newest checkpoint that holds a job whole, and its groups installed over the live ones.
#include "server/durability/job_rewind.h"

#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/durability/checkpoint_reader.h"
#include "server/durability/state_import.h"
#include "server/state/group_config.h"

namespace optstate {
namespace {

bool OfJob(const JobRewindRequest& request, const GroupKey& key) {
  return key.tenant == request.tenant && absl::StartsWith(key.name, request.prefix);
}

// Why the job's state in `manifest` cannot be rewound to (request.step, or
// any one step); "" when it can, with its step in `*step` (for a job's
// frozen groups alone: request.step, or 0). A group at step 0 there was
// frozen then (the same at every step; it may be stepped since, unfrozen).
// When every group of the job is at step 0 there, the checkpoint holds
// frozen groups alone only while their live copies in `store` are at step 0
// too (or gone); one stepped since makes it the job before its first step:
// step 0.
std::string Unsuitable(const Manifest& manifest, const JobRewindRequest& request,
                       const StateStore& store, uint64_t* step) {
  bool any = false;
  bool stepped_since = false;  // A group at step 0 there, stepped live.
  std::optional<uint64_t> at;
  for (const ManifestGroup& g : manifest.groups) {
    if (!OfJob(request, g.key)) continue;
    any = true;
    if (g.max_step == 0) {
      if (!stepped_since) {
        absl::StatusOr<std::shared_ptr<Group>> live = store.Find(g.key);
        stepped_since = live.ok() && (*live)->MaxStep() > 0;
      }
      continue;
    }
    if (g.min_step != g.max_step || (at.has_value() && *at != g.max_step)) {
      return absl::StrCat("the job is part-way through a step there (group '", g.key.name,
                          "' at steps ", g.min_step, "..", g.max_step, ")");
    }
    at = g.max_step;
  }
  if (!any) return "it holds no group of the job";
  if (!at.has_value() && stepped_since) at = 0;
  if (!at.has_value()) {
    // Frozen groups only (a daemon of a job spread over several may hold no
    // other): they are the same at every step, so any step asked is theirs.
    *step = request.step.value_or(0);
    return "";
  }
  *step = *at;
  if (request.step.has_value() && *request.step != *step) {
    return absl::StrCat("it holds the job at step ", *step);
  }
  return "";
}

}  // namespace

absl::StatusOr<JobRewindOutcome> RewindJob(StateStore* store, StepBackend* backend,
                                           const std::string& state_dir,
                                           const JobRewindRequest& request, ThreadPool* pool) {
  if (request.prefix.empty()) {
    return absl::InvalidArgumentError(
        "name a job by its non-empty name prefix (RewindJobRequest.prefix): an empty one "
        "would rewind every group of the tenant");
  }
  if (absl::Status s = ValidateGroupName(request.prefix); !s.ok()) {
    // No group's name starts with it: nothing to look for in the checkpoints.
    return absl::InvalidArgumentError(absl::StrCat(
        "RewindJobRequest.prefix starts group names, so it must be a group name itself: ",
        s.message()));
  }
  absl::StatusOr<std::vector<std::string>> dirs = CompleteCheckpointsNewestFirst(state_dir);
  if (!dirs.ok()) return dirs.status();
  // The caller (any tenant) is told checkpoints by name, not where the
  // daemon keeps them.
  auto shown = [prefix = state_dir + "/"](absl::string_view text) {
    return absl::StrReplaceAll(text, {{prefix, ""}});
  };
  JobRewindOutcome outcome;
  absl::Status no_room;  // The first checkpoint refused for room, if any.
  for (const std::string& dir : *dirs) {
    Manifest manifest;
    uint64_t step = 0;
    std::string why;
    absl::StatusOr<std::vector<StagedGroup>> staged = LoadCheckpoint(
        store, dir, &manifest, pool, [&](const ManifestGroup& g) { return OfJob(request, g.key); });
    if (!staged.ok() && absl::IsAborted(staged.status())) {
      return absl::AbortedError(
          absl::StrCat("rewinding job '", request.prefix, "': ", shown(staged.status().message())));
    }
    if (!staged.ok() && absl::IsResourceExhausted(staged.status()) && no_room.ok()) {
      // No room for this checkpoint's copies (the daemon's budget, or the
      // quota for groups deleted since): an older one may fit, or hold the
      // step asked; if none is taken, this is the answer, not NOT_FOUND.
      no_room = absl::ResourceExhaustedError(absl::StrCat("rewinding job '", request.prefix,
                                                          "' to ", shown(dir), ": ",
                                                          shown(staged.status().message())));
    }
    if (!staged.ok() && !request.caller_sees_every_tenant && absl::IsDataLoss(staged.status())) {
      // Damage found in the manifest may name other tenants' groups.
      Log(LogLevel::kWarning, "rewinding job '", request.prefix, "' of tenant '", request.tenant,
          "': passed over ", dir, ": ", staged.status().message());
      why =
          "it could not be read (the reason may name other tenants' groups: the daemon's log "
          "and an admin's RewindJob say it)";
    } else if (!staged.ok()) {
      why = std::string(staged.status().message());
    } else {
      why = Unsuitable(manifest, request, *store, &step);
    }
    if (!why.empty()) {
      outcome.passed_over.push_back(absl::StrCat(shown(dir), ": ", shown(why)));
      continue;
    }
    // Every check before anything changes: the job's live groups are all in
    // the checkpoint, of its shape, and the caller may touch them.
    std::vector<std::shared_ptr<Group>> existing(staged->size());
    absl::flat_hash_set<std::string> restored;
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < staged->size(); ++i) {
      const Group& source = (*staged)[i].group();
      restored.insert(source.key().name);
      absl::StatusOr<std::shared_ptr<Group>> live = store->Find(source.key());
      if (absl::IsFailedPrecondition(live.status())) {
        // Moved to another daemon since (a Rebalance; the store keeps a note):
        // made again here, it would be a second, stale copy that steps.
        return absl::FailedPreconditionError(absl::StrCat(
            "rewinding job '", request.prefix, "' to checkpoint ", manifest.id, ": ",
            live.status().message(),
            "; nothing was rewound. Rewind the job through a client of the daemons that hold "
            "it now (the new member list), to a checkpoint written since the move"));
      }
      if (!live.ok()) continue;  // Deleted since: made again.
      if ((*live)->move().sealed()) {
        // Sealed for a move (or a copy restored from before one, sealed again
        // from the notes the daemon keeps): its home is elsewhere.
        return absl::FailedPreconditionError(absl::StrCat(
            "rewinding job '", request.prefix, "' to checkpoint ", manifest.id, ": group '",
            source.key().name, "' is sealed for its move to daemon '", (*live)->move().moved_to(),
            "'; nothing was rewound. Rewind the job through a client of the daemons that hold "
            "it now (the new member list, after finishing the Rebalance), to a checkpoint "
            "written since the move"));
      }
      if (!CheckSameShape(**live, source.num_elements(), source.config().hyperparameters).ok()) {
        // Deleted and registered again since, with another size or other
        // hyperparameters: the checkpoint's state is not this group's.
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", source.key().name, "' of job '", request.prefix,
            "' has num_elements=", (*live)->num_elements(), " ",
            DescribeHyperparameters((*live)->config().hyperparameters), " here, but num_elements=",
            source.num_elements(), " ", DescribeHyperparameters(source.config().hyperparameters),
            " in checkpoint ", manifest.id, " (step ", step,
            "): it was registered again since with another shape; nothing was rewound. Delete "
            "it first (it is then made again from the checkpoint), or rewind to a newer "
            "checkpoint"));
      }
      if (absl::Status s = (*live)->lease().Check(request.lease, source.key().name, now); !s.ok()) {
        return s;
      }
      existing[i] = *std::move(live);
    }
    for (const std::shared_ptr<Group>& live : store->List(request.tenant)) {
      if (absl::StartsWith(live->key().name, request.prefix) &&
          !restored.contains(live->key().name)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", live->key().name, "' of job '", request.prefix, "' is not in checkpoint ",
            manifest.id, " (step ", step,
            "): it was added since. Delete it first (it would be left at its own step), or "
            "rewind to a newer checkpoint"));
      }
    }
    if (request.validate_only) {
      for (const StagedGroup& source : *staged) outcome.groups.push_back(source.group().key().name);
      outcome.checkpoint_id = manifest.id;
      outcome.step = step;
      return outcome;  // The staged groups are dropped: nothing was published.
    }
    for (size_t i = 0; i < staged->size(); ++i) {
      StagedGroup& source = (*staged)[i];
      const std::string& name = source.group().key().name;
      std::shared_ptr<Group> target = existing[i];
      // The checkpoint's record of its last step (LoadCheckpoint set it), if any.
      const std::optional<SteppedWith> recorded = source.group().last_step().Get();
      absl::Status status;
      if (target != nullptr) {
        status = ReplaceGroupState(*backend, source.group(), *target);
      } else {
        absl::StatusOr<std::shared_ptr<Group>> published = store->Publish(source);
        status = published.status();
        if (published.ok()) target = *std::move(published);
      }
      if (!status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("rewinding job '", request.prefix, "' to checkpoint ",
                                         manifest.id, ": group '", name, "' failed (",
                                         status.message(), "); the groups before it were rewound: ",
                                         absl::StrJoin(outcome.groups, ", ")));
      }
      target->last_step().Reset();
      if (recorded.has_value()) target->last_step().Record(*recorded);
      (void)target->lease().Admit(request.lease, name, absl::Now(), store->lease_term());
      outcome.groups.push_back(name);
    }
    outcome.checkpoint_id = manifest.id;
    outcome.step = step;
    Log(LogLevel::kInfo, "job '", request.prefix, "' rewound to checkpoint ", manifest.id,
        " (step ", step, "): ", outcome.groups.size(), " groups");
    return outcome;
  }
  if (!no_room.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(no_room.message(), "; nothing was rewound (checkpoints passed over: ",
                     absl::StrJoin(outcome.passed_over, "; "), ")"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no checkpoint in --state_dir holds job '", request.prefix, "'",
      request.step.has_value() ? absl::StrCat(" at step ", *request.step) : std::string(), " whole",
      outcome.passed_over.empty() ? " (there is none)" : ": ",
      absl::StrJoin(outcome.passed_over, "; ")));
}

}  // namespace optstate
