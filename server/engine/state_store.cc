// Registration (budget first, allocation outside the lock), lookup, deletion.
#include "server/engine/state_store.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/state/page_range_lock.h"

namespace optstate {
namespace {

std::string DescribeConfig(const GroupConfig& c) {
  const auto& h = c.hyperparameters;
  return absl::StrCat("num_elements=", c.num_elements, " ", DescribeHyperparameters(h),
                      " has_initial_values=", c.has_initial_values ? "true" : "false");
}

// HostBytesFor for a message: a size whose bytes do not fit 64 bits says so,
// rather than print the wrapped product.
std::string HostBytesText(const GroupConfig& config) {
  const uint64_t per_element = StateBytesPerElement(config);
  if (config.num_elements > UINT64_MAX / per_element) return "more than 2^64";
  return absl::StrCat(HostBytesFor(config));
}

// "group 'w'", or "group 'w' of tenant 'alice'" where the daemon has
// tenants: two tenants' lines about a group of the same name stay apart.
std::string GroupText(const GroupKey& key) {
  return key.tenant.empty() ? absl::StrCat("group '", key.name, "'")
                            : absl::StrCat("group '", key.name, "' of tenant '", key.tenant, "'");
}

}  // namespace

absl::Status ValidateGroupName(const std::string& name) {
  if (name.empty() || name.size() > 512) {
    return absl::InvalidArgumentError(
        absl::StrCat("group name must be 1 to 512 characters, got ", name.size()));
  }
  for (char ch : name) {
    if (ch <= ' ' || ch > '~') {
      return absl::InvalidArgumentError(
          "group name must be printable ASCII without spaces (for example "
          "'model.layers.0.attn.q_proj.weight')");
    }
  }
  return absl::OkStatus();
}

StateStore::StateStore(StepBackend* backend, uint64_t max_host_bytes, uint64_t page_elements,
                       HeapTrimmer* trimmer)
    : backend_(backend),
      trimmer_(trimmer),
      max_host_bytes_(max_host_bytes),
      page_elements_(page_elements) {}

StateStore::~StateStore() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, group] : groups_) backend_->DetachGroup(*group);
}

absl::StatusOr<uint64_t> StateStore::CheckConfig(const GroupKey& key,
                                                 const GroupConfig& config) const {
  if (absl::Status s = ValidateGroupName(key.name); !s.ok()) return s;
  if (config.num_elements == 0) {
    return absl::InvalidArgumentError("num_elements must be at least 1");
  }
  if (absl::Status s = ValidateHyperparameters(config.hyperparameters); !s.ok()) return s;
  return config.num_elements > max_host_bytes_ / StateBytesPerElement(config)
             ? UINT64_MAX
             : HostBytesFor(config);
}

absl::Status StateStore::CheckTenantQuota(const GroupKey& key, const GroupConfig& config,
                                          uint64_t needed) const {
  const auto it = tenant_usage_.find(key.tenant);
  const TenantUsage used = it == tenant_usage_.end() ? TenantUsage() : it->second;
  if (quotas_ != nullptr) {
    const TenantQuota quota = quotas_->QuotaOf(key.tenant);
    if (used.groups >= quota.max_groups) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", key.tenant, "' holds ", used.groups, " groups, its quota max_groups=",
          quota.max_groups, "; group '", key.name,
          "' was not created: delete a group, or raise max_groups for the tenant in the tokens "
          "file (or --tenant_max_groups)"));
    }
    // (needed == UINT64_MAX is past the daemon-wide budget: its message below.)
    if (needed != UINT64_MAX && quota.max_host_bytes != TenantQuota().max_host_bytes &&
        (needed > quota.max_host_bytes || used.host_bytes > quota.max_host_bytes - needed)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "group '", key.name, "' needs ", HostBytesText(config), " bytes of host memory (",
          StateBytesPerElement(config), " per element) but tenant '", key.tenant, "' uses ",
          used.host_bytes, " of its quota max_host_bytes=", quota.max_host_bytes,
          "; group not created: delete groups, or raise max_host_bytes for the tenant in the "
          "tokens file (or --tenant_max_host_bytes)"));
    }
  }
  return absl::OkStatus();
}

absl::Status StateStore::Reserve(const GroupKey& key, const GroupConfig& config, uint64_t needed,
                                 bool for_tenant) {
  if (for_tenant) {
    if (absl::Status s = CheckTenantQuota(key, config, needed); !s.ok()) return s;
  }
  if (needed == UINT64_MAX || host_bytes_ + needed > max_host_bytes_) {
    const std::string what = absl::StrCat(
        for_tenant ? absl::StrCat("group '", key.name, "' needs ")
                   : absl::StrCat("replacing the state of group '", key.name,
                                  "' needs room for the incoming copy until it is swapped in: "),
        HostBytesText(config), " bytes of host memory (", StateBytesPerElement(config),
        " per element)");
    if (!key.tenant.empty()) {
      // A tenant's caller is not told the daemon's totals: they count other
      // tenants' groups (GetStats shows a tenant its own use only).
      return absl::ResourceExhaustedError(
          absl::StrCat(what,
                       ", more than the daemon has free under its --max_host_bytes (other tenants' "
                       "groups count there too); delete groups, or ask its operator for room"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " but only ", max_host_bytes_ - host_bytes_, " of --max_host_bytes=", max_host_bytes_,
        " are free; delete groups or raise --max_host_bytes"));
  }
  host_bytes_ += needed;
  if (!for_tenant) return absl::OkStatus();
  TenantUsage& usage = tenant_usage_[key.tenant];
  usage.host_bytes += needed;
  usage.groups += 1;
  return absl::OkStatus();
}

void StateStore::ReleaseStaged(const GroupKey& key, uint64_t bytes, bool for_tenant) {
  absl::MutexLock lock(&mu_);
  ReleaseLocked(key.tenant, bytes, for_tenant);
  if (!for_tenant) replacing_.erase(key);
}

void StateStore::ReleaseLocked(const std::string& tenant, uint64_t bytes, bool for_tenant) {
  host_bytes_ -= bytes;
  if (!for_tenant) return;
  auto it = tenant_usage_.find(tenant);
  if (it == tenant_usage_.end()) return;
  it->second.host_bytes -= bytes;
  if (--it->second.groups == 0) tenant_usage_.erase(it);
}

void StateStore::SetTenantQuotas(const TenantQuotas* quotas) {
  absl::MutexLock lock(&mu_);
  quotas_ = quotas;
}

StateStore::TenantUsage StateStore::UsageOf(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  const auto it = tenant_usage_.find(tenant);
  return it == tenant_usage_.end() ? TenantUsage() : it->second;
}

absl::flat_hash_map<std::string, StateStore::TenantUsage> StateStore::TenantUsages() const {
  absl::MutexLock lock(&mu_);
  return tenant_usage_;
}

absl::StatusOr<StateStore::Registration> StateStore::Register(const GroupKey& key,
                                                              const GroupConfig& config) {
  absl::StatusOr<uint64_t> checked = CheckConfig(key, config);
  if (!checked.ok()) return checked.status();
  const uint64_t needed = *checked;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = groups_.find(key); it != groups_.end()) {
      if (it->second->move().sealed()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", key.name, "' is sealed for its move to daemon '",
            it->second->move().moved_to(),
            "' (a client's Rebalance moves groups when the daemons change): register and step "
            "it there, with the client given the new list of daemons, or finish the Rebalance"));
      }
      const GroupConfig& existing = it->second->config();
      // A registration without initial values of a group that has them
      // (registered with values, imported, restored) asks for nothing it
      // lacks: the same group, as a Rebalance's import leaves it.
      const bool equal = existing == config ||
                         (!config.has_initial_values &&
                          existing.num_elements == config.num_elements &&
                          existing.hyperparameters == config.hyperparameters);
      if (equal) {
        it->second->mark_joined();
        return Registration{it->second, false};
      }
      return absl::AlreadyExistsError(
          absl::StrCat("group '", key.name, "' already exists with ",
                       DescribeConfig(it->second->config()), "; asked for ", DescribeConfig(config),
                       ". Delete it first or register under another name"));
    }
    if (auto moved = moved_.find(key); moved != moved_.end()) {
      // A client still on the old member list: a new group here would start
      // from step 0 beside the moved one.
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", key.name, "' moved to daemon '", moved->second,
          "' (a client's Rebalance moves groups when the daemons change): register and step "
          "it there, with the client given the new list of daemons. To make a new group of "
          "this name here, DeleteGroup it here first (which forgets the move)"));
    }
    if (registering_.contains(key)) {
      return absl::AbortedError(
          absl::StrCat("group '", key.name, "' is being registered by another call; retry"));
    }
    if (absl::Status s = Reserve(key, config, needed); !s.ok()) return s;
    registering_.insert(key);
  }

  // Allocation and backend placement take time; other groups keep stepping.
  absl::StatusOr<std::shared_ptr<Group>> group =
      Group::Create(key, config, page_elements_, backend_->host_allocator());
  absl::Status placed = group.ok() ? backend_->AttachGroup(**group) : group.status();

  absl::MutexLock lock(&mu_);
  registering_.erase(key);
  if (!placed.ok()) {
    ReleaseLocked(key.tenant, needed);
    return placed;
  }
  groups_.emplace(key, *group);
  ForgetNoteLocked(key);
  Log(LogLevel::kInfo, "registered ", GroupText(key), ": ", config.num_elements, " elements, ",
      (*group)->num_pages(), " pages, ", needed, " host bytes");
  return Registration{*group, true};
}

StagedGroup::StagedGroup(StagedGroup&& other) noexcept
    : store_(other.store_),
      group_(std::move(other.group_)),
      reserved_(other.reserved_),
      counted_for_tenant_(other.counted_for_tenant_) {
  other.reserved_ = 0;
}

StagedGroup::~StagedGroup() {
  if (reserved_ == 0) return;
  const GroupKey key = group_->key();
  group_.reset();
  store_->ReleaseStaged(key, reserved_, counted_for_tenant_);
}

absl::StatusOr<StagedGroup> StateStore::Stage(const GroupKey& key, const GroupConfig& config) {
  absl::StatusOr<uint64_t> checked = CheckConfig(key, config);
  if (!checked.ok()) return checked.status();
  bool for_tenant = true;
  {
    absl::MutexLock lock(&mu_);
    for_tenant = !groups_.contains(key);  // A copy to replace a live group's state: no new group.
    if (!for_tenant && replacing_.contains(key)) {
      return absl::AbortedError(absl::StrCat(
          "group '", key.name,
          "' is having its state replaced by another import or rewind; retry once it ends"));
    }
    if (absl::Status s = Reserve(key, config, *checked, for_tenant); !s.ok()) return s;
    if (!for_tenant) replacing_.insert(key);
  }
  absl::StatusOr<std::shared_ptr<Group>> group =
      Group::Create(key, config, page_elements_, backend_->host_allocator());
  if (!group.ok()) {
    ReleaseStaged(key, *checked, for_tenant);
    return group.status();
  }
  return StagedGroup(this, std::move(*group), *checked, for_tenant);
}

absl::StatusOr<std::shared_ptr<Group>> StateStore::Publish(StagedGroup& staged) {
  Group& group = staged.group();
  const GroupKey& key = group.key();
  {
    absl::MutexLock lock(&mu_);
    if (groups_.contains(key)) {
      return absl::AlreadyExistsError(
          absl::StrCat("group '", key.name, "' was registered meanwhile; delete it first"));
    }
    if (registering_.contains(key)) {
      return absl::AbortedError(
          absl::StrCat("group '", key.name, "' is being registered by another call; retry"));
    }
    if (!staged.counted_for_tenant_) {
      // Staged to replace a live group, which went since: a new group now.
      if (absl::Status s = CheckTenantQuota(key, group.config(), staged.reserved_); !s.ok()) {
        return s;
      }
      TenantUsage& usage = tenant_usage_[key.tenant];
      usage.host_bytes += staged.reserved_;
      usage.groups += 1;
      staged.counted_for_tenant_ = true;
      replacing_.erase(key);
    }
    registering_.insert(key);
  }
  absl::Status placed = backend_->AttachGroup(group);
  if (placed.ok()) {
    placed = backend_->StateWritten(group, 0, group.num_elements());
    if (!placed.ok()) backend_->DetachGroup(group);
  }
  bool note_forgotten = false;
  {
    absl::MutexLock lock(&mu_);
    registering_.erase(key);
    if (!placed.ok()) return placed;
    groups_.emplace(key, staged.group_);
    note_forgotten = ForgetNoteLocked(key);
    staged.reserved_ = 0;  // The store counts it now.
  }
  // DEBUG: a restore installs every group of the checkpoint (its own line
  // counts them); an import says so itself.
  Log(LogLevel::kDebug, "group '", key.name,
      "' installed with its whole state: ", group.num_elements(), " elements, ", group.num_pages(),
      " pages, steps ", group.MinStep(), "..", group.MaxStep());
  if (note_forgotten) (void)MoveNotesChanged();  // The checkpointer logs a failure.
  return std::move(staged.group_);
}

absl::StatusOr<std::shared_ptr<Group>> StateStore::Find(const GroupKey& key) const {
  if (absl::Status s = ValidateGroupName(key.name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(key);
  if (it == groups_.end()) {
    if (auto moved = moved_.find(key); moved != moved_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", key.name, "' moved to daemon '", moved->second,
          "' (a client's Rebalance moves groups when the daemons change): it is not here; use "
          "it there, with the client given the new list of daemons"));
    }
    return absl::NotFoundError(absl::StrCat("no group named '", key.name,
                                            "'; register it first (ListGroups lists them)",
                                            not_found_note_));
  }
  return it->second;
}

void StateStore::SetNotFoundNote(std::string note) {
  absl::MutexLock lock(&mu_);
  not_found_note_ = std::move(note);
}

absl::StatusOr<uint64_t> StateStore::Delete(const GroupKey& key, const LeaseClaim& claim) {
  if (absl::Status s = ValidateGroupName(key.name); !s.ok()) return s;
  std::shared_ptr<Group> group;
  std::optional<std::string> forgotten;  // The note deleted, where the name had only one.
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(key);
    if (it == groups_.end()) {
      auto moved = moved_.find(key);
      if (moved == moved_.end()) {
        return absl::NotFoundError(absl::StrCat("no group named '", key.name, "' to delete"));
      }
      // The note of its move is what is deleted (RegisterGroup's advice).
      forgotten = moved->second;
      ForgetNoteLocked(key);
    } else {
      group = it->second;
    }
  }
  if (forgotten.has_value()) {
    if (absl::Status kept = MoveNotesChanged(); !kept.ok()) {
      // Forgotten in memory alone, a restart would bring the note back: kept.
      absl::MutexLock lock(&mu_);
      if (!groups_.contains(key) && moved_.emplace(key, *forgotten).second) {
        moved_order_.push_back(key);
      }
      return absl::Status(kept.code(), absl::StrCat("the note that group '", key.name,
                                                    "' moved was not deleted: ", kept.message()));
    }
    Log(LogLevel::kInfo, "forgot that group '", key.name, "' moved to daemon '", *forgotten, "'");
    return 0;
  }
  bool noted = false;
  {
    // Page locks first (ascending, as steps take them), then the store's
    // lock, as Unregister does: once every page is held no chunk of this
    // group is in flight, so its counters are final when they move to
    // removed_counters_, in the same critical section that takes it out of
    // groups_ (a reader of counter_totals() sees them in one or the other).
    PageRangeLock all_pages(*group);
    // Under every page lock: no step of the holder is in flight, so the
    // lease it holds is the one checked.
    if (absl::Status s = group->lease().Check(claim, key.name, absl::Now()); !s.ok()) return s;
    // Not while a checkpoint commits its list of groups (commit_gate): this
    // delete comes wholly before that checkpoint, or wholly after it.
    absl::ReaderMutexLock gate(&commit_gate_);
    {
      absl::MutexLock lock(&mu_);
      auto it = groups_.find(key);
      if (it == groups_.end() || it->second != group) {
        // A concurrent DeleteGroup took it first.
        return absl::NotFoundError(absl::StrCat("no group named '", key.name, "' to delete"));
      }
      groups_.erase(it);
      ReleaseLocked(key.tenant, group->host_bytes());
      removed_counters_.Add(group->counters());
      if (group->move().sealed()) {
        if (moved_.insert_or_assign(key, group->move().moved_to()).second) {
          moved_order_.push_back(key);
        }
        while (moved_order_.size() > kMaxMoveNotes) {
          Log(LogLevel::kWarning, "forgot the oldest note of a move, of group '",
              moved_order_.front().name, "' (", kMaxMoveNotes,
              " are kept): a client on the old member list may register it here again");
          moved_.erase(moved_order_.front());
          moved_order_.pop_front();
        }
        noted = true;
      }
    }
    group->mark_deleted();
    backend_->DetachGroup(*group);
  }
  // A failure leaves the seal's own line in the file: a restart still
  // knows the move (the checkpointer logs it).
  if (noted) (void)MoveNotesChanged();
  Log(LogLevel::kInfo, "deleted ", GroupText(key), " at step ", group->MaxStep(), ", freeing ",
      group->host_bytes(), " host bytes");
  const uint64_t freed = group->host_bytes();
  group.reset();  // Frees the memory unless a chunk in flight still holds it.
  if (trimmer_ != nullptr) trimmer_->RequestTrim();
  return freed;
}

absl::StatusOr<std::shared_ptr<Group>> StateStore::Seal(const GroupKey& key,
                                                        const std::string& moved_to,
                                                        const LeaseClaim& claim) {
  const bool printable = std::all_of(moved_to.begin(), moved_to.end(),
                                     [](char c) { return c > ' ' && c <= '~'; });
  if (moved_to.empty() || moved_to.size() > 512 || !printable) {
    return absl::InvalidArgumentError(
        "a move must name the daemon the group moves to: 1 to 512 printable ASCII characters "
        "without spaces");
  }
  absl::StatusOr<std::shared_ptr<Group>> group = Find(key);
  if (!group.ok()) return group.status();
  // What it was before (a second seal names a new destination), for undoing.
  std::string sealed_before;
  {
    // Every page held: no chunk is in flight, and none applies after the seal.
    PageRangeLock all_pages(**group);
    if (absl::Status s = (*group)->lease().Check(claim, key.name, absl::Now()); !s.ok()) return s;
    if ((*group)->deleted()) {
      return absl::NotFoundError(absl::StrCat("no group named '", key.name, "' to move"));
    }
    if ((*group)->move().sealed()) sealed_before = (*group)->move().moved_to();
    (*group)->move().Seal(moved_to);
  }
  if (absl::Status kept = MoveNotesChanged(); !kept.ok()) {
    {
      PageRangeLock all_pages(**group);
      if (sealed_before.empty()) {
        (*group)->move().Unseal();
      } else {
        (*group)->move().Seal(sealed_before);
      }
    }
    (void)MoveNotesChanged();  // Best effort: the seal is gone again.
    return absl::Status(
        kept.code(),
        absl::StrCat("group '", key.name, "' was not sealed for its move: ", kept.message()));
  }
  Log(LogLevel::kInfo, GroupText(key), " sealed at step ", (*group)->MaxStep(), " for its move to ",
      moved_to);
  return group;
}

std::vector<StateStore::MoveNote> StateStore::MoveNotes() const {
  std::vector<MoveNote> notes;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, moved_to] : moved_) notes.push_back(MoveNote{key, moved_to});
    for (const auto& [key, group] : groups_) {
      if (group->move().sealed()) notes.push_back(MoveNote{key, group->move().moved_to()});
    }
  }
  std::sort(notes.begin(), notes.end(), [](const MoveNote& a, const MoveNote& b) {
    return std::tie(a.key.tenant, a.key.name) < std::tie(b.key.tenant, b.key.name);
  });
  return notes;
}

void StateStore::AddMoveNote(const GroupKey& key, std::string moved_to) {
  absl::MutexLock lock(&mu_);
  if (groups_.contains(key)) return;
  if (moved_.insert_or_assign(key, std::move(moved_to)).second) moved_order_.push_back(key);
  while (moved_order_.size() > kMaxMoveNotes) {
    moved_.erase(moved_order_.front());
    moved_order_.pop_front();
  }
}

bool StateStore::ForgetNoteLocked(const GroupKey& key) {
  if (moved_.erase(key) == 0) return false;
  // Its place in the order too: a key noted again later must not be dropped
  // for its earlier note's age.
  if (auto it = std::find(moved_order_.begin(), moved_order_.end(), key);
      it != moved_order_.end()) {
    moved_order_.erase(it);
  }
  return true;
}

void StateStore::SetMoveNotesListener(std::function<absl::Status()> listener) {
  move_notes_listener_ = std::move(listener);
}

absl::Status StateStore::MoveNotesChanged() const {
  return move_notes_listener_ ? move_notes_listener_() : absl::OkStatus();
}

bool StateStore::Unregister(const std::shared_ptr<Group>& group) {
  // Page locks first (ascending, as steps take them), then the store's lock:
  // no path takes a page lock while holding mu_. With every page held, no
  // step can apply between the check and mark_deleted.
  bool removed = false;
  {
    PageRangeLock all_pages(*group);
    if (!group->deleted() && group->MaxStep() == 0 && !group->joined()) {
      absl::MutexLock lock(&mu_);
      auto it = groups_.find(group->key());
      // joined() again under mu_, which Register marks it under: a call
      // answered with it since the check above keeps it too.
      if (it != groups_.end() && it->second == group && !group->joined()) {
        groups_.erase(it);
        ReleaseLocked(group->key().tenant, group->host_bytes());
        removed_counters_.Add(group->counters());
        removed = true;
      }
    }
    if (removed) {
      group->mark_deleted();
      backend_->DetachGroup(*group);
    }
  }
  if (removed) {
    Log(LogLevel::kInfo, "removed ", GroupText(group->key()),
        ": the RegisterGroup call that created it did not complete");
    if (trimmer_ != nullptr) trimmer_->RequestTrim();
  }
  return removed;
}

std::vector<std::shared_ptr<Group>> StateStore::List(const std::string& tenant) const {
  std::vector<std::shared_ptr<Group>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, group] : groups_) {
      if (key.tenant == tenant) out.push_back(group);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->key().name < b->key().name; });
  return out;
}

CounterTotals StateStore::counter_totals() const {
  absl::MutexLock lock(&mu_);
  CounterTotals totals = removed_counters_;
  for (const auto& [key, group] : groups_) totals.Add(group->counters());
  return totals;
}

std::vector<std::shared_ptr<Group>> StateStore::ListAll() const {
  std::vector<std::shared_ptr<Group>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, group] : groups_) out.push_back(group);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a->key().tenant, a->key().name) < std::tie(b->key().tenant, b->key().name);
  });
  return out;
}

uint64_t StateStore::host_bytes() const {
  absl::MutexLock lock(&mu_);
  return host_bytes_;
}

}  // namespace optstate
