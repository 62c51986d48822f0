// Where the AdamW update runs and where state lives while it does: the CPU
// backend steps host memory in place; the CUDA backend keeps groups resident
// in VRAM or pages them through a device staging pool.
#ifndef OPTSTATE_SERVER_BACKENDS_STEP_BACKEND_H_
#define OPTSTATE_SERVER_BACKENDS_STEP_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "optstate/dtype.h"
#include "server/base/segmented_bytes.h"
#include "server/kernels/adamw_kernel.h"
#include "server/state/group.h"
#include "server/state/host_allocator.h"

namespace optstate {

// Backend-wide figures for GetStats; zero where a backend has no such thing.
struct BackendStats {
  std::string strategy;
  uint64_t budget_total_bytes = 0;
  uint64_t budget_reserved_bytes = 0;
  double budget_target_utilization = 0;
  uint64_t budget_available_bytes = 0;
  uint64_t resident_bytes = 0;
  uint64_t staging_pool_bytes = 0;
  uint64_t staging_slots = 0;
};

// Implementations are thread-safe. Apply may run for different groups, and for
// disjoint page ranges of one group, at the same time.
class StepBackend {
 public:
  virtual ~StepBackend() = default;

  // "cpu" or "cuda".
  virtual absl::string_view name() const = 0;

  // Allocator for every group's host arrays.
  virtual HostAllocator* host_allocator() = 0;

  // Chooses the group's placement and sets up its backend state; called once,
  // before the group is visible. RESOURCE_EXHAUSTED (saying the bytes needed
  // and available) when the group cannot be placed.
  virtual absl::Status AttachGroup(Group& group) = 0;

  // Releases what AttachGroup set up; called once the group is unreachable by
  // new steps. Other groups may be placed anew as a result.
  virtual void DetachGroup(Group& group) = 0;

  // Applies one AdamW step to elements [begin, end) of `group`. The caller
  // holds the page mutex of every page in the range, and has checked that the
  // scaled gradients are finite. `grad` holds end-begin elements of
  // `grad_type`, at any alignment. When this returns OK, the host params of
  // the range hold the updated values.
  virtual absl::Status Apply(Group& group, uint64_t begin, uint64_t end, const void* grad,
                             WireType grad_type, const AdamWConstants& constants) = 0;

  // Apply, then writes the range's updated params, narrowed to `params_type`,
  // to `params_out` (end-begin elements, any alignment): a reply's buffer, or
  // a shared-memory region (`store` kStreaming: another process reads them,
  // so the CPU may write past its cache; see ParamsStore).
  // The gradient is end-begin elements of `grad_type` from byte
  // `grad_offset` of `gradient`, in the pieces it arrived in. This default
  // gathers a gradient split across pieces into one buffer, calls Apply, and
  // reads the params back from the host params; a backend may read the
  // pieces in place and write the params during the update instead.
  virtual absl::Status ApplyAndEncode(Group& group, uint64_t begin, uint64_t end,
                                      const SegmentedBytes& gradient, size_t grad_offset,
                                      WireType grad_type, const AdamWConstants& constants,
                                      void* params_out, WireType params_type, ParamsStore store);

  // ApplyAndEncode that also checks `ahead`, the gradient of the chunk the
  // calling thread applies next, for a value that is not finite (scaled by
  // its grad_scale), on the calling thread: `*ahead_finite` is set to
  // whether every element is finite when the call returns OK. This
  // default checks it after ApplyAndEncode; the CPU backend reads it among
  // the update's own loads (AdamWUpdateAndEncodeCheckingAhead).
  virtual absl::Status ApplyAndEncodeCheckingAhead(
      Group& group, uint64_t begin, uint64_t end, const SegmentedBytes& gradient,
      size_t grad_offset, WireType grad_type, const AdamWConstants& constants, void* params_out,
      WireType params_type, ParamsStore store, const GradientRange& ahead, bool* ahead_finite);

  // The host params of [begin, end) were overwritten (initial values); the
  // caller holds the page mutexes of the range.
  virtual absl::Status ParamsWritten(Group& group, uint64_t begin, uint64_t end) = 0;

  // Makes the host params, m and v of [begin, end) hold the group's current
  // state (a device may hold newer values), for a checkpoint or an export;
  // the caller holds the page mutexes of the range. This default answers OK
  // for host-placed groups (the host arrays are the state) and
  // FAILED_PRECONDITION for others: a backend that keeps state elsewhere
  // overrides it.
  virtual absl::Status ReadStateToHost(Group& group, uint64_t begin, uint64_t end);

  // The host params, m and v of [begin, end) were overwritten (an import or
  // a restore); the caller holds the page mutexes of the range, or the group
  // is not yet visible. Same default as ReadStateToHost.
  virtual absl::Status StateWritten(Group& group, uint64_t begin, uint64_t end);

  virtual BackendStats Stats() const = 0;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_STEP_BACKEND_H_
