// Carries out one AdamW step over a range through the staging pool, piece by
// piece: copy in, update, copy out, with pieces on different slot streams so
// the copy in of one piece, the update of another and the copy out of a third
// overlap.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_STEP_PIPELINE_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_STEP_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "optstate/dtype.h"
#include "server/backends/cuda/paging/step_plan.h"
#include "server/backends/cuda/staging_pool.h"
#include "server/base/thread_pool.h"
#include "server/kernels/adamw_kernel.h"

namespace optstate {

// Where a group's arrays are; indices are element numbers of the group.
struct StepArrays {
  float* host_p = nullptr;  // Pinned host arrays (pageable works, slower).
  float* host_m = nullptr;
  float* host_v = nullptr;
  // A resident group's device arrays; null for a paged group.
  float* device_p = nullptr;
  float* device_m = nullptr;
  float* device_v = nullptr;
};

// Runs the step over [begin, end) of `arrays` with `grad` (end-begin
// elements of `grad_type`, host memory at any alignment). Resident
// (device arrays set): first copies in the state of `page_ins` (ranges inside
// [begin, end)), then only the gradient goes in and the params come back.
// Paged: p, m, v and the gradient go in, p, m, v come back. Returns when every
// copy back has landed; adds the time spent waiting on the device to
// *copy_wait_us. INTERNAL on any CUDA error (after draining its streams).
// `threads`, when not null, splits the host copy of large gradient pieces into
// the pinned bounce buffers (it may be the pool the caller runs on).
absl::Status RunStepPipeline(StagingPool& pool, ThreadPool* threads, const StepArrays& arrays,
                             uint64_t begin, uint64_t end,
                             const std::vector<ElementRange>& page_ins, const void* grad,
                             WireType grad_type, const AdamWConstants& constants,
                             uint64_t* copy_wait_us);

// Takes one slot, lets `enqueue` put copies on its stream, waits for them
// and returns the slot; for copies outside a step (initial params, syncing
// state back to the host). Adds the wait to *copy_wait_us.
absl::Status RunCopiesOnSlot(StagingPool& pool,
                             const std::function<absl::Status(cudaStream_t)>& enqueue,
                             uint64_t* copy_wait_us);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_STEP_PIPELINE_H_
