// Slot allocation at start-up and a mutex+condition free list.
#include "server/backends/cuda/staging_pool.h"

#include "absl/strings/str_cat.h"
#include "server/backends/cuda/cuda_status.h"

namespace optstate {

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(int slots, uint64_t slot_bytes) {
  if (slots < 1) return absl::InvalidArgumentError("the staging pool needs at least one slot");
  if (slot_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--staging_slot_bytes must be at least 4096, got ", slot_bytes));
  }
  // Four regions of piece*4 bytes; piece a multiple of 64 keeps each region
  // 256-byte aligned (cudaMalloc returns 256-byte aligned memory).
  const uint64_t piece = slot_bytes / 16 / 64 * 64;
  std::unique_ptr<StagingPool> pool(new StagingPool(slot_bytes, piece));
  for (int i = 0; i < slots; ++i) {
    auto slot = std::make_unique<StagingSlot>();
    slot->index = i;
    StagingSlot* s = slot.get();
    pool->slots_.push_back(std::move(slot));  // The destructor frees what was made.
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&s->device), slot_bytes);
        e != cudaSuccess) {
      s->device = nullptr;
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("could not allocate staging slot ", i, " (", slot_bytes,
                       " bytes of device memory): ", cudaGetErrorString(e)));
    }
    if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&s->host_bounce), slot_bytes,
                                      cudaHostAllocPortable);
        e != cudaSuccess) {
      s->host_bounce = nullptr;
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("could not allocate the pinned bounce buffer of staging slot ", i, " (",
                       slot_bytes, " bytes): ", cudaGetErrorString(e)));
    }
    if (absl::Status st = CudaStatus(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                                     "cudaStreamCreate");
        !st.ok()) {
      s->stream = nullptr;
      return st;
    }
  }
  absl::MutexLock lock(&pool->mu_);
  for (auto it = pool->slots_.rbegin(); it != pool->slots_.rend(); ++it) {
    pool->free_.push_back(it->get());
  }
  return pool;
}

StagingPool::~StagingPool() {
  for (auto& slot : slots_) {
    if (slot->stream != nullptr) {
      cudaStreamSynchronize(slot->stream);
      cudaStreamDestroy(slot->stream);
    }
    if (slot->device != nullptr) cudaFree(slot->device);
    if (slot->host_bounce != nullptr) cudaFreeHost(slot->host_bounce);
  }
}

StagingSlot* StagingPool::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::vector<StagingSlot*>* free) { return !free->empty(); }, &free_));
  StagingSlot* slot = free_.back();
  free_.pop_back();
  return slot;
}

StagingSlot* StagingPool::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) return nullptr;
  StagingSlot* slot = free_.back();
  free_.pop_back();
  return slot;
}

void StagingPool::Release(StagingSlot* slot) {
  absl::MutexLock lock(&mu_);
  free_.push_back(slot);
}

}  // namespace optstate
