// Decides which groups' state lives in VRAM (resident) and which is paged
// through the staging pool, under a VramBudget. Bookkeeping only: no CUDA.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_PAGING_POLICY_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_PAGING_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/backends/cuda/paging/paging_strategy.h"
#include "server/backends/cuda/paging/vram_budget.h"
#include "server/state/group.h"

namespace optstate {

// The staging pool is carved out of the budget first; resident groups share
// what is left. A resident group stays resident until it is removed (nothing
// is ever demoted to make room). Thread-safe; every method is short and
// takes only the policy's own mutex, so callers may hold page mutexes.
class PagingPolicy {
 public:
  PagingPolicy(PagingStrategy strategy, VramBudget budget, uint64_t staging_pool_bytes);

  PagingStrategy strategy() const { return strategy_; }
  const VramBudget& budget() const { return budget_; }
  // budget().available_bytes() less the staging pool, or 0.
  uint64_t resident_capacity_bytes() const { return capacity_bytes_; }
  // Bytes taken by resident groups now (promotions decided by Remove count).
  uint64_t resident_bytes() const;
  size_t num_groups() const;

  // Places a new group `id` (unique among the policy's groups) whose state
  // takes `device_bytes` of VRAM when resident:
  //   none:        kDeviceResident, or RESOURCE_EXHAUSTED naming `name`, the
  //                bytes needed and the bytes available;
  //   adaptive:    kDeviceResident when it fits beside the resident groups,
  //                else kDevicePaged;
  //   fully_paged: kDevicePaged.
  // A refused group is not recorded. INVALID_ARGUMENT when `id` is known.
  absl::StatusOr<Placement> Admit(uint64_t id, absl::string_view name, uint64_t device_bytes);

  // Forgets group `id` (unknown ids are ignored). Under adaptive, when it was
  // resident, paged groups that now fit become resident, in the order they
  // were admitted, each taken if it fits (first fit). Returns those ids;
  // their bytes are counted already and the caller moves their state in.
  std::vector<uint64_t> Remove(uint64_t id);

  // A resident placement could not be realised (the device allocation
  // failed): `id` becomes paged and its bytes return. Promotes nobody, so a
  // failing allocation is never retried in a loop.
  void FallBackToPaged(uint64_t id);

  // What the policy decided for `id` and counts against the budget; kHost
  // for an unknown id. A decision runs ahead of the group: the backend then
  // realises it and records the group's placement (Group::placement()), or
  // reverts it with FallBackToPaged.
  Placement placement(uint64_t id) const;

 private:
  struct Entry {
    uint64_t order;  // Admission order, for first-fit promotion.
    uint64_t device_bytes;
    Placement placement;  // The decision, for the budget's arithmetic.
  };

  const PagingStrategy strategy_;
  const VramBudget budget_;
  const uint64_t staging_pool_bytes_;
  const uint64_t capacity_bytes_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> groups_ ABSL_GUARDED_BY(mu_);
  uint64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_PAGING_POLICY_H_
