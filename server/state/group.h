// One parameter group: a named flat fp32 tensor with its AdamW state (params,
// exp_avg m, exp_avg_sq v, and max_exp_avg_sq with amsgrad) in host memory, divided into fixed pages that each
// record the step they have reached. Its parts by concept: identity
// (group_key.h), what registration fixes (group_config.h), where it lives
// (placement.h), per-page steps (page_table.h), counters (group_counters.h),
// the job that holds it (group_lease.h), its last step's hyperparameters
// (last_step_record.h), whether it is sealed for a move (group_move.h).
#ifndef OPTSTATE_SERVER_STATE_GROUP_H_
#define OPTSTATE_SERVER_STATE_GROUP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/state/group_config.h"
#include "server/state/group_counters.h"
#include "server/state/group_key.h"
#include "server/state/group_lease.h"
#include "server/state/group_move.h"
#include "server/state/host_allocator.h"
#include "server/state/last_step_record.h"
#include "server/state/page_table.h"
#include "server/state/placement.h"

namespace optstate {

// Thread-safety: configuration and array pointers are immutable. The elements
// of a page, and its step and values flag, may be changed only while holding
// page_mutex(page); page_step() and the counters may be read without it.
class Group {
 public:
  // Allocates zeroed params, m and v (and max_exp_avg_sq with amsgrad) from
  // `allocator`; RESOURCE_EXHAUSTED if the memory cannot be had.
  static absl::StatusOr<std::shared_ptr<Group>> Create(GroupKey key, GroupConfig config,
                                                       uint64_t page_elements,
                                                       HostAllocator* allocator);
  ~Group();

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const GroupKey& key() const { return key_; }
  const GroupConfig& config() const { return config_; }
  uint64_t num_elements() const { return config_.num_elements; }
  uint64_t page_elements() const { return page_elements_; }
  uint64_t num_pages() const { return pages_.num_pages(); }
  uint64_t host_bytes() const { return HostBytesFor(config_); }
  uint64_t PageBegin(uint64_t page) const { return page * page_elements_; }
  uint64_t PageEnd(uint64_t page) const;

  float* params() const { return params_; }
  float* exp_avg() const { return exp_avg_; }
  float* exp_avg_sq() const { return exp_avg_sq_; }
  // torch's state['max_exp_avg_sq'] (amsgrad); null without amsgrad.
  float* max_exp_avg_sq() const { return max_exp_avg_sq_; }

  absl::Mutex& page_mutex(uint64_t page) const { return pages_.mutex(page); }
  uint64_t page_step(uint64_t page) const { return pages_.step(page); }
  // Requires page_mutex(page).
  void set_page_step(uint64_t page, uint64_t step) { pages_.set_step(page, step); }
  bool page_has_values(uint64_t page) const { return pages_.has_values(page); }
  // Requires page_mutex(page).
  void mark_page_has_values(uint64_t page) { pages_.mark_has_values(page); }

  uint64_t MinStep() const { return pages_.MinStep(); }
  uint64_t MaxStep() const { return pages_.MaxStep(); }
  uint64_t PagesAwaitingValues() const { return pages_.PagesAwaitingValues(); }

  // Where the state lives while a step runs: the one record of it, set by
  // the backend (when it attaches the group, and when it moves it), read
  // by anyone (DescribeGroup, the backend's own steps).
  Placement placement() const { return placement_.load(std::memory_order_acquire); }
  void set_placement(Placement p) { placement_.store(p, std::memory_order_release); }

  GroupCounters& counters() const { return counters_; }
  // The job that holds the group, if any (thread-safe).
  GroupLease& lease() const { return lease_; }
  // What the last applied step used (thread-safe).
  LastStepRecord& last_step() const { return last_step_; }
  // Whether it is sealed for a move to another daemon (thread-safe).
  GroupMove& move() const { return move_; }

  // Set, with every page mutex held, when the group is deleted; a step that
  // finds it set after taking its page mutexes must not touch the state.
  bool deleted() const { return deleted_.load(std::memory_order_acquire); }
  void mark_deleted() { deleted_.store(true, std::memory_order_release); }
  // Another RegisterGroup call found this group (StateStore::Register), or
  // an import replaced its state (StateImport::Commit): the RegisterGroup
  // call that created it no longer removes it when that call fails
  // (StateStore::Unregister). Set once, never cleared.
  bool joined() const { return joined_.load(std::memory_order_acquire); }
  void mark_joined() { joined_.store(true, std::memory_order_release); }

  // Set when a backend failed part-way through an update: some pages of the
  // range may hold the new state while their step says otherwise, so a
  // retry could apply them twice. Every later chunk is refused (DATA_LOSS);
  // the group must be deleted and registered again.
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  void mark_broken() { broken_.store(true, std::memory_order_release); }

  // Owned by the backend; set before the group is visible to steps.
  std::unique_ptr<BackendGroupState> backend_state;

 private:
  Group(GroupKey key, GroupConfig config, uint64_t page_elements, HostAllocator* allocator);

  const GroupKey key_;
  const GroupConfig config_;
  const uint64_t page_elements_;
  HostAllocator* const allocator_;
  float* params_ = nullptr;
  float* exp_avg_ = nullptr;
  float* exp_avg_sq_ = nullptr;
  float* max_exp_avg_sq_ = nullptr;
  mutable PageTable pages_;
  std::atomic<Placement> placement_{Placement::kHost};
  std::atomic<bool> deleted_{false};
  std::atomic<bool> joined_{false};
  std::atomic<bool> broken_{false};
  mutable GroupCounters counters_;
  mutable GroupLease lease_;
  mutable LastStepRecord last_step_;
  mutable GroupMove move_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_H_
