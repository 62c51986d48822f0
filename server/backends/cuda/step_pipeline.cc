// The piece pipeline: slots taken from the pool (or the caller's own oldest
// slot reused), host bounce of the gradient, async copies, kernel, drain.
#include "server/backends/cuda/step_pipeline.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/time/clock.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/kernels/adamw_cuda.h"

namespace optstate {
namespace {

uint64_t MicrosSince(absl::Time start) {
  return static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start));
}

absl::Status WaitForSlot(StagingSlot* slot, uint64_t* copy_wait_us) {
  const absl::Time start = absl::Now();
  absl::Status s = CudaStatus(cudaStreamSynchronize(slot->stream), "cudaStreamSynchronize");
  *copy_wait_us += MicrosSince(start);
  return s;
}

absl::Status CopyIn(void* device, const void* host, uint64_t bytes, cudaStream_t stream) {
  return CudaStatus(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync host to device");
}

absl::Status CopyOut(void* host, const void* device, uint64_t bytes, cudaStream_t stream) {
  return CudaStatus(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync device to host");
}

// Slots this call holds, oldest first. Never blocks on the pool while holding
// one: when the pool is empty it waits for its own oldest piece instead.
class HeldSlots {
 public:
  HeldSlots(StagingPool& pool, uint64_t* copy_wait_us) : pool_(pool), wait_us_(copy_wait_us) {}
  // Drains and returns every slot still held (on the error path too).
  ~HeldSlots() {
    for (StagingSlot* slot : held_) {
      cudaStreamSynchronize(slot->stream);
      pool_.Release(slot);
    }
  }

  // An idle slot for the next piece, pushed as the newest.
  absl::StatusOr<StagingSlot*> Next() {
    StagingSlot* slot = pool_.TryAcquire();
    if (slot == nullptr && held_.empty()) {
      const absl::Time start = absl::Now();
      slot = pool_.Acquire();
      *wait_us_ += MicrosSince(start);
    }
    if (slot == nullptr) {
      slot = held_.front();
      held_.pop_front();
      if (absl::Status s = WaitForSlot(slot, wait_us_); !s.ok()) {
        pool_.Release(slot);
        return s;
      }
    }
    held_.push_back(slot);
    return slot;
  }

  // Waits for every held slot and returns them; the first error, if any.
  absl::Status Drain() {
    absl::Status first;
    while (!held_.empty()) {
      StagingSlot* slot = held_.front();
      held_.pop_front();
      absl::Status s = WaitForSlot(slot, wait_us_);
      pool_.Release(slot);
      if (first.ok()) first = s;
    }
    return first;
  }

 private:
  StagingPool& pool_;
  uint64_t* const wait_us_;
  std::deque<StagingSlot*> held_;
};

// Enqueues one paged piece [a, b) on `slot`: state and gradient in, update,
// state out.
absl::Status EnqueuePagedPiece(StagingPool& pool, StagingSlot* slot, const StepArrays& arrays,
                               uint64_t a, uint64_t b, size_t grad_size, WireType grad_type,
                               const AdamWConstants& c) {
  const uint64_t piece = pool.paged_piece_elements();
  const uint64_t n = b - a;
  cudaStream_t stream = slot->stream;
  float* p = slot->paged_p();
  float* m = slot->paged_m(piece);
  float* v = slot->paged_v(piece);
  void* g = slot->paged_grad(piece);
  if (absl::Status s = CopyIn(g, slot->host_bounce, n * grad_size, stream); !s.ok()) return s;
  if (absl::Status s = CopyIn(p, arrays.host_p + a, n * 4, stream); !s.ok()) return s;
  if (absl::Status s = CopyIn(m, arrays.host_m + a, n * 4, stream); !s.ok()) return s;
  if (absl::Status s = CopyIn(v, arrays.host_v + a, n * 4, stream); !s.ok()) return s;
  if (absl::Status s =
          CudaStatus(LaunchAdamWUpdate(c, p, m, v, g, grad_type, n, stream), "AdamW kernel");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CopyOut(arrays.host_p + a, p, n * 4, stream); !s.ok()) return s;
  if (absl::Status s = CopyOut(arrays.host_m + a, m, n * 4, stream); !s.ok()) return s;
  return CopyOut(arrays.host_v + a, v, n * 4, stream);
}

// Enqueues one resident piece [a, b) on `slot`: page-ins that intersect it,
// the gradient in, update on the device arrays, params out.
absl::Status EnqueueResidentPiece(StagingSlot* slot, const StepArrays& arrays, uint64_t a,
                                  uint64_t b, const std::vector<ElementRange>& page_ins,
                                  size_t grad_size, WireType grad_type, const AdamWConstants& c) {
  const uint64_t n = b - a;
  cudaStream_t stream = slot->stream;
  for (const ElementRange& r : page_ins) {
    const uint64_t lo = std::max(a, r.begin);
    const uint64_t hi = std::min(b, r.end);
    if (lo >= hi) continue;
    const uint64_t bytes = (hi - lo) * 4;
    if (absl::Status s = CopyIn(arrays.device_p + lo, arrays.host_p + lo, bytes, stream); !s.ok()) {
      return s;
    }
    if (absl::Status s = CopyIn(arrays.device_m + lo, arrays.host_m + lo, bytes, stream); !s.ok()) {
      return s;
    }
    if (absl::Status s = CopyIn(arrays.device_v + lo, arrays.host_v + lo, bytes, stream); !s.ok()) {
      return s;
    }
  }
  void* g = slot->device;
  if (absl::Status s = CopyIn(g, slot->host_bounce, n * grad_size, stream); !s.ok()) return s;
  if (absl::Status s = CudaStatus(LaunchAdamWUpdate(c, arrays.device_p + a, arrays.device_m + a,
                                                    arrays.device_v + a, g, grad_type, n, stream),
                                  "AdamW kernel");
      !s.ok()) {
    return s;
  }
  return CopyOut(arrays.host_p + a, arrays.device_p + a, n * 4, stream);
}

// Host copy into a pinned bounce buffer; one thread moves about 10 GB/s,
// slower than PCIe, so large pieces are split over the pool.
void CopyToBounce(ThreadPool* threads, unsigned char* dst, const unsigned char* src,
                  uint64_t bytes) {
  constexpr uint64_t kShard = 1 << 20;
  if (threads == nullptr || bytes < 4 * kShard) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const uint64_t shards =
      std::min<uint64_t>(static_cast<uint64_t>(threads->size()) + 1, bytes / kShard);
  threads->ParallelFor(shards, [&](size_t i) {
    const uint64_t first = bytes * i / shards;
    const uint64_t last = bytes * (i + 1) / shards;
    std::memcpy(dst + first, src + first, last - first);
  });
}

}  // namespace

absl::Status RunStepPipeline(StagingPool& pool, ThreadPool* threads, const StepArrays& arrays,
                             uint64_t begin, uint64_t end,
                             const std::vector<ElementRange>& page_ins, const void* grad,
                             WireType grad_type, const AdamWConstants& constants,
                             uint64_t* copy_wait_us) {
  const bool resident = arrays.device_p != nullptr;
  const size_t grad_size = WireTypeSize(grad_type);
  const uint64_t piece =
      resident ? pool.resident_piece_elements(grad_size) : pool.paged_piece_elements();
  const auto* grad_bytes = static_cast<const unsigned char*>(grad);
  HeldSlots held(pool, copy_wait_us);
  for (uint64_t a = begin; a < end; a += piece) {
    const uint64_t b = std::min(end, a + piece);
    absl::StatusOr<StagingSlot*> slot = held.Next();
    if (!slot.ok()) return slot.status();
    // The slot is idle, so its bounce buffer is free to overwrite.
    CopyToBounce(threads, (*slot)->host_bounce, grad_bytes + (a - begin) * grad_size,
                 (b - a) * grad_size);
    absl::Status s =
        resident
            ? EnqueueResidentPiece(*slot, arrays, a, b, page_ins, grad_size, grad_type, constants)
            : EnqueuePagedPiece(pool, *slot, arrays, a, b, grad_size, grad_type, constants);
    if (!s.ok()) return s;
  }
  return held.Drain();
}

absl::Status RunCopiesOnSlot(StagingPool& pool,
                             const std::function<absl::Status(cudaStream_t)>& enqueue,
                             uint64_t* copy_wait_us) {
  HeldSlots held(pool, copy_wait_us);
  absl::StatusOr<StagingSlot*> slot = held.Next();
  if (!slot.ok()) return slot.status();
  if (absl::Status s = enqueue((*slot)->stream); !s.ok()) return s;
  return held.Drain();
}

}  // namespace optstate
