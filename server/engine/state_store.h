// The set of live groups, keyed by (tenant, name), and the host-memory
// budget they share. Owns registration and deletion; holds no optimizer math.
#ifndef OPTSTATE_SERVER_ENGINE_STATE_STORE_H_
#define OPTSTATE_SERVER_ENGINE_STATE_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/backends/step_backend.h"
#include "server/base/heap_trimmer.h"
#include "server/engine/tenant_quotas.h"
#include "server/state/group.h"

namespace optstate {

class StateStore;

// A group allocated and counted against the host-memory budget but not
// visible to anyone (an import or a restore fills it first). Destroying it
// unpublished frees the group and its share of the budget. A copy staged to
// replace a live group's state (replaces_live) is counted against the
// daemon's budget only, not its tenant's quota: it is no new group. Not
// thread-safe; the store must outlive it.
class StagedGroup {
 public:
  StagedGroup(StagedGroup&& other) noexcept;
  StagedGroup& operator=(StagedGroup&&) = delete;
  ~StagedGroup();

  Group& group() const { return *group_; }
  // Whether a group of its key was live when it was staged.
  bool replaces_live() const { return !counted_for_tenant_; }

 private:
  friend class StateStore;
  StagedGroup(StateStore* store, std::shared_ptr<Group> group, uint64_t reserved,
              bool counted_for_tenant)
      : store_(store),
        group_(std::move(group)),
        reserved_(reserved),
        counted_for_tenant_(counted_for_tenant) {}

  StateStore* store_;
  std::shared_ptr<Group> group_;
  uint64_t reserved_;  // Host bytes counted for it; 0 once published or moved from.
  bool counted_for_tenant_;  // Also counted against its tenant's quota.
};

// Thread-safe.
class StateStore {
 public:
  // `backend` must outlive the store. Every group uses pages of
  // `page_elements` elements. `trimmer` (may be null; else must outlive the
  // store) is asked to trim the heap after each deletion.
  StateStore(StepBackend* backend, uint64_t max_host_bytes, uint64_t page_elements,
             HeapTrimmer* trimmer = nullptr);
  ~StateStore();

  struct Registration {
    std::shared_ptr<Group> group;
    bool created = false;
  };

  // Creates the group, or returns the existing one when its config is equal.
  // INVALID_ARGUMENT for a bad name (it must be 1 to 512 printable ASCII
  // characters without spaces), size or hyperparameters; ALREADY_EXISTS
  // when a group of that name differs; RESOURCE_EXHAUSTED past the host-memory
  // budget, past the tenant's quota (SetTenantQuotas; the message names the
  // quota and the tenant's use) or when the backend cannot place it; ABORTED
  // while another call is registering the same name; FAILED_PRECONDITION
  // naming the daemon for a name with a note of its move (Seal). On error
  // nothing changes. An existing equal group is returned even at the quota,
  // and marked joined (Group::joined).
  absl::StatusOr<Registration> Register(const GroupKey& key, const GroupConfig& config);

  // Allocates a group outside the store, counted against the budget, for
  // the caller to fill and then Publish. Same checks and codes as Register,
  // but the name is not looked up (Publish does that), except that a copy of
  // a group live under that key (to replace its state: an import, a rewind)
  // is held to the daemon's budget only, not to the tenant's quota, and is
  // ABORTED while another such copy of that key is staged.
  absl::StatusOr<StagedGroup> Stage(const GroupKey& key, const GroupConfig& config);

  // Attaches the staged group to the backend, tells it the host state was
  // written (StepBackend::StateWritten) and makes the group visible.
  // ALREADY_EXISTS when a group of that name exists by then, ABORTED while one
  // is being registered, RESOURCE_EXHAUSTED past the tenant's quota for a
  // copy staged to replace a live group that went since, the backend's error
  // when it cannot take the state; on error nothing is visible and `staged`
  // still owns the group.
  absl::StatusOr<std::shared_ptr<Group>> Publish(StagedGroup& staged);

  // NOT_FOUND names the group; FAILED_PRECONDITION naming the daemon for a
  // group deleted after a move (Seal); INVALID_ARGUMENT (without quoting it)
  // for a name no group can have (ValidateGroupName), before any lookup.
  absl::StatusOr<std::shared_ptr<Group>> Find(const GroupKey& key) const;

  // Removes the group; its memory is freed once in-flight steps let go of it.
  // Returns the host bytes freed: 0 for a name that has only a note of its
  // move (Seal), which is forgotten. NOT_FOUND when there is no such group;
  // INVALID_ARGUMENT for a name no group can have; FAILED_PRECONDITION when
  // another holder than `claim`'s leases it (GroupLease::Check).
  absl::StatusOr<uint64_t> Delete(const GroupKey& key, const LeaseClaim& claim = LeaseClaim());

  // Seals the group for a move to the daemon `moved_to` names (GroupMove):
  // waits for its chunks in flight, then no step applies to it. Deleting a
  // sealed group leaves a note of the move (Find and Register answer with
  // it) until a group of that key is imported again or the note is deleted
  // (Delete). NOT_FOUND, INVALID_ARGUMENT and
  // FAILED_PRECONDITION (the lease) as Delete; INVALID_ARGUMENT for an empty
  // `moved_to`; the move notes listener's error (its seal undone) when the
  // seal cannot be kept.
  absl::StatusOr<std::shared_ptr<Group>> Seal(const GroupKey& key, const std::string& moved_to,
                                              const LeaseClaim& claim = LeaseClaim());
  // Notes of moves kept at most (the newest).
  static constexpr size_t kMaxMoveNotes = 1 << 16;

  // The moves this daemon knows of, for a file that outlives a restart
  // (durability/move_notes_file.h): every group sealed for a move (still
  // here) and every note of one deleted after its move, sorted by key.
  struct MoveNote {
    GroupKey key;
    std::string moved_to;
  };
  std::vector<MoveNote> MoveNotes() const ABSL_LOCKS_EXCLUDED(mu_);
  // A note of a move of a group not here (one read back after a restart);
  // ignored where a group of that key is here (Seal that one instead).
  void AddMoveNote(const GroupKey& key, std::string moved_to) ABSL_LOCKS_EXCLUDED(mu_);
  // Called, outside the store's lock, each time MoveNotes() may have changed
  // (a seal, a delete after a move, a note forgotten, an import over a
  // note); MoveNotesChanged() calls it for an unseal made outside the store
  // (ReplaceGroupState) and returns what it returned. A seal it refuses is
  // undone and refused (Seal): a seal the daemon cannot keep over a restart
  // would let the stale copy step after one. Set it once, before serving.
  void SetMoveNotesListener(std::function<absl::Status()> listener);
  absl::Status MoveNotesChanged() const;

  // Undoes the registration that created `group` (a RegisterGroup stream
  // that was refused or broke): removes it if it is still the group
  // registered under its key, no page of it has been stepped (another
  // stream may have trained it meanwhile) and no other registration was
  // answered with it (Group::joined: that caller holds it as registered).
  // Returns whether it was removed. Steps that find it afterwards get
  // NOT_FOUND.
  bool Unregister(const std::shared_ptr<Group>& group);

  // The tenant's groups, sorted by name.
  std::vector<std::shared_ptr<Group>> List(const std::string& tenant) const;
  // Every tenant's groups, sorted by (tenant, name).
  std::vector<std::shared_ptr<Group>> ListAll() const;

  // Every group's counters added up since the store was made: the groups
  // there are and those deleted or unregistered, so each total only grows
  // (a deleted group's counters are added once no step can change them).
  CounterTotals counter_totals() const;

  // From now on, Register and Stage hold each tenant to `quotas` (may be
  // null: no quotas; else must outlive the store). Groups already held are
  // kept, whatever their tenant's quota (a restore is not refused).
  void SetTenantQuotas(const TenantQuotas* quotas) ABSL_LOCKS_EXCLUDED(mu_);

  // What a tenant holds: groups registered, staged (but copies staged to
  // replace a live group's state) or being registered, and their host bytes
  // (as counted against its quota).
  struct TenantUsage {
    uint64_t host_bytes = 0;
    uint64_t groups = 0;
  };
  TenantUsage UsageOf(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  // Every tenant holding anything, with its use.
  absl::flat_hash_map<std::string, TenantUsage> TenantUsages() const ABSL_LOCKS_EXCLUDED(mu_);

  // How long a group's lease lasts after its holder's last call
  // (--lease_seconds; 60 s until set).
  void SetLeaseTerm(absl::Duration term) {
    lease_term_us_.store(absl::ToInt64Microseconds(term), std::memory_order_relaxed);
  }
  absl::Duration lease_term() const {
    return absl::Microseconds(lease_term_us_.load(std::memory_order_relaxed));
  }
  // Held shared by each Delete while it takes its group out; a checkpoint
  // holds it exclusively while it fixes its list of groups and commits it
  // (CheckpointWriter), so a delete comes wholly before or after it.
  absl::Mutex& commit_gate() { return commit_gate_; }
  // Appended to Find's NOT_FOUND: what this daemon is (when it started,
  // whether it keeps checkpoints, what it restored), so a trainer that finds
  // its groups gone knows whether the daemon restarted and lost them.
  void SetNotFoundNote(std::string note) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t host_bytes() const;
  uint64_t max_host_bytes() const { return max_host_bytes_; }
  // Elements per page of every group (--page_elements).
  uint64_t page_elements() const { return page_elements_; }

 private:
  friend class StagedGroup;
  // Name, size and hyperparameters; and the bytes to reserve (UINT64_MAX
  // when past any budget).
  absl::StatusOr<uint64_t> CheckConfig(const GroupKey& key, const GroupConfig& config) const;
  // Counts `needed` host bytes against the daemon's budget and, with
  // `for_tenant`, one group and the bytes against the tenant's quota.
  absl::Status Reserve(const GroupKey& key, const GroupConfig& config, uint64_t needed,
                       bool for_tenant = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when one group more of `needed` host bytes is within the tenant's quota.
  absl::Status CheckTenantQuota(const GroupKey& key, const GroupConfig& config,
                                uint64_t needed) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back what Stage counted for a copy of `key` never published, and
  // for a copy to replace a live group, ends its claim on the key.
  void ReleaseStaged(const GroupKey& key, uint64_t bytes, bool for_tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `key`'s note of a move, and its place in moved_order_; whether
  // it had one.
  bool ForgetNoteLocked(const GroupKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back what Reserve counted for one group of `tenant` (with
  // `for_tenant`; else its bytes against the daemon's budget only).
  void ReleaseLocked(const std::string& tenant, uint64_t bytes, bool for_tenant = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StepBackend* const backend_;
  HeapTrimmer* const trimmer_;
  const uint64_t max_host_bytes_;
  const uint64_t page_elements_;
  absl::Mutex commit_gate_;  // Taken before mu_.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<GroupKey, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<GroupKey> registering_ ABSL_GUARDED_BY(mu_);
  // Keys of live groups a staged copy will replace (one copy each at most:
  // what a tenant can stage beyond its quota is bounded by what it holds).
  absl::flat_hash_set<GroupKey> replacing_ ABSL_GUARDED_BY(mu_);
  uint64_t host_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Including registrations under way.
  // Per tenant, the same (no entry: nothing held).
  absl::flat_hash_map<std::string, TenantUsage> tenant_usage_ ABSL_GUARDED_BY(mu_);
  const TenantQuotas* quotas_ ABSL_GUARDED_BY(mu_) = nullptr;
  CounterTotals removed_counters_ ABSL_GUARDED_BY(mu_);  // Of the groups no longer in groups_.
  std::atomic<int64_t> lease_term_us_{60'000'000};
  std::string not_found_note_ ABSL_GUARDED_BY(mu_);
  // Deleted sealed groups: where each went, and the order the notes came in
  // (the oldest is dropped past kMaxMoveNotes).
  absl::flat_hash_map<GroupKey, std::string> moved_ ABSL_GUARDED_BY(mu_);
  std::deque<GroupKey> moved_order_ ABSL_GUARDED_BY(mu_);
  std::function<absl::Status()> move_notes_listener_;  // Set before serving; empty: none.
};

// INVALID_ARGUMENT unless `name` is 1 to 512 printable ASCII characters
// without spaces (the message does not quote the name).
absl::Status ValidateGroupName(const std::string& name);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_ENGINE_STATE_STORE_H_
