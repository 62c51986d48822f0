// A fixed set of device staging slots, allocated once at start-up and reused
// by every step: each slot has device memory, a pinned host bounce buffer for
// gradients, and its own stream.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_STAGING_POOL_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_STAGING_POOL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace optstate {

// One slot. While a caller holds it, it alone enqueues work on `stream`.
struct StagingSlot {
  int index = 0;
  cudaStream_t stream = nullptr;
  // slot_bytes of device memory. For a paged piece of up to
  // paged_piece_elements(): p, m, v, then the gradient, each a 256-byte
  // aligned region of paged_piece_elements() * 4 bytes. For a resident
  // piece: the gradient only, from the start.
  unsigned char* device = nullptr;
  // slot_bytes of pinned host memory: the gradient is copied here first, so
  // its copy to the device is asynchronous whatever memory it came from.
  unsigned char* host_bounce = nullptr;

  float* paged_p() const { return reinterpret_cast<float*>(device); }
  float* paged_m(uint64_t piece) const { return reinterpret_cast<float*>(device) + piece; }
  float* paged_v(uint64_t piece) const { return reinterpret_cast<float*>(device) + 2 * piece; }
  void* paged_grad(uint64_t piece) const { return reinterpret_cast<float*>(device) + 3 * piece; }
};

// Thread-safe. A caller never blocks in Acquire while holding a slot (it
// reuses its own instead, see RunStepPipeline), so slots cannot deadlock.
class StagingPool {
 public:
  // Allocates `slots` slots of `slot_bytes` on the calling thread's current
  // device. INVALID_ARGUMENT when slot_bytes < 4 KiB or slots < 1;
  // RESOURCE_EXHAUSTED (or INTERNAL for other runtime errors) when the memory
  // or streams cannot be had.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(int slots, uint64_t slot_bytes);
  // Waits for every stream, then frees everything. All slots must be released.
  ~StagingPool();

  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  int slots() const { return static_cast<int>(slots_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t pool_bytes() const { return slot_bytes_ * slots_.size(); }
  // Elements of a paged piece one slot holds: p, m, v and an fp32-sized
  // gradient, a multiple of 64.
  uint64_t paged_piece_elements() const { return paged_piece_elements_; }
  // Elements of a resident piece (the gradient only) of `grad_element_size`.
  uint64_t resident_piece_elements(size_t grad_element_size) const {
    return slot_bytes_ / grad_element_size / 64 * 64;
  }

  // Blocks until a slot is free and returns it.
  StagingSlot* Acquire();
  // A free slot, or nullptr when none is.
  StagingSlot* TryAcquire();
  // Returns a slot whose stream has no pending work.
  void Release(StagingSlot* slot);

 private:
  StagingPool(uint64_t slot_bytes, uint64_t paged_piece_elements)
      : slot_bytes_(slot_bytes), paged_piece_elements_(paged_piece_elements) {}

  const uint64_t slot_bytes_;
  const uint64_t paged_piece_elements_;
  std::vector<std::unique_ptr<StagingSlot>> slots_;  // Fixed after Create.

  absl::Mutex mu_;
  std::vector<StagingSlot*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_STAGING_POOL_H_
