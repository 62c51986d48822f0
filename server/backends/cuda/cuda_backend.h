// The CUDA step backend: group state in pinned host memory, resident in VRAM
// or paged through a fixed staging pool as the PagingPolicy decides, stepped
// by the fused CUDA AdamW kernel.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_BACKEND_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/backends/cuda/cuda_device.h"
#include "server/backends/cuda/cuda_options.h"
#include "server/backends/cuda/paging/paging_policy.h"
#include "server/backends/cuda/staging_pool.h"
#include "server/backends/step_backend.h"
#include "server/base/thread_pool.h"

namespace optstate {

// Thread-safe, as StepBackend requires. Lock order: page mutexes, then
// groups_mu_, then a group's GroupState::mu, then the policy's own
// mutex; nothing here takes a page mutex, so callers may hold any.
class CudaBackend : public StepBackend {
 public:
  // Probes options.device and sets it up: INVALID_ARGUMENT for bad options
  // (paging, slots, a pool that does not fit the budget), FAILED_PRECONDITION
  // when no device is usable, RESOURCE_EXHAUSTED when the pool cannot be
  // allocated.
  // `threads` (may be null; must outlive the backend) helps copy gradients
  // into pinned memory.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaOptions& options,
                                                             ThreadPool* threads = nullptr);
  // Every group must have been detached.
  ~CudaBackend() override;

  absl::string_view name() const override { return "cuda"; }
  HostAllocator* host_allocator() override;
  absl::Status AttachGroup(Group& group) override;
  void DetachGroup(Group& group) override;
  absl::Status Apply(Group& group, uint64_t begin, uint64_t end, const void* grad,
                     WireType grad_type, const AdamWConstants& constants) override;
  absl::Status ParamsWritten(Group& group, uint64_t begin, uint64_t end) override;

  // For a resident group, copies params, m and v of the pages of [begin,
  // end) that are on the device to the host arrays (clipped to the range),
  // on one staging slot's stream, and returns once they landed: straight
  // into the group's pinned arrays, so no memory beyond the pool is used. A
  // paged group's host arrays hold its state after every step, so for it
  // (and for pages not on the device) nothing is copied. INTERNAL naming the
  // CUDA call that failed; the device copy is unchanged then.
  absl::Status ReadStateToHost(Group& group, uint64_t begin, uint64_t end) override;
  // Marks the pages wholly inside [begin, end) off the device, so the next
  // step copies their new state in (a page-in); copies nothing for them. The
  // written part of a page only partly inside the range (callers write whole
  // pages; this is for completeness) is copied to the device of a resident
  // group at once. INTERNAL naming the CUDA call when that copy fails; the
  // group is then marked broken, since such a page's device copy may hold
  // part of the new state.
  absl::Status StateWritten(Group& group, uint64_t begin, uint64_t end) override;
  BackendStats Stats() const override;

  // ReadStateToHost of the whole group, so that readers of
  // exp_avg()/exp_avg_sq() (tests) see current values. The caller holds the
  // page mutexes of every page of the group.
  absl::Status SyncToHost(Group& group);

  // "device 0 'NVIDIA H200' (...), paging=adaptive, budget total=... , staging
  // pool 4 x 67108864 bytes": what the start-up log line says.
  std::string Describe() const;
  const PagingPolicy& policy() const { return policy_; }
  // Bytes of VRAM held by resident groups' arrays now (allocated, not planned).
  uint64_t allocated_group_bytes() const {
    return allocated_group_bytes_.load(std::memory_order_relaxed);
  }

 private:
  class GroupState;

  CudaBackend(CudaDeviceInfo device, PagingStrategy strategy, VramBudget budget,
              std::unique_ptr<StagingPool> pool, ThreadPool* threads);

  GroupState& StateOf(Group& group) const;
  // Allocates a resident group's device arrays (zeroed when `zero_fill`) and
  // makes the group resident; RESOURCE_EXHAUSTED when VRAM ran out.
  absl::Status MakeResident(Group& group, GroupState& state, bool zero_fill);
  void FreeDeviceArrays(Group& group, GroupState& state);

  const CudaDeviceInfo device_;
  PagingPolicy policy_;
  std::unique_ptr<StagingPool> pool_;
  ThreadPool* const threads_;
  std::atomic<uint64_t> allocated_group_bytes_{0};

  // Live groups by policy id, for promotion after a delete.
  absl::Mutex groups_mu_;
  absl::flat_hash_map<uint64_t, Group*> groups_ ABSL_GUARDED_BY(groups_mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(groups_mu_) = 1;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_BACKEND_H_
