// cudaHostAlloc with a tracked fallback to AlignedHostAllocator.
#include "server/backends/cuda/pinned_host_allocator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/base/log.h"

namespace optstate {
namespace {

class PinnedAllocator : public HostAllocator {
 public:
  void set_device(int ordinal) { device_.store(ordinal, std::memory_order_relaxed); }

  void* Allocate(size_t bytes) override {
    if (bytes == 0) bytes = 64;
    void* memory = nullptr;
    // The calling thread (a registration's) may never have chosen a device:
    // without this, the runtime would create a context on device 0.
    cudaSetDevice(device_.load(std::memory_order_relaxed));
    if (cudaHostAlloc(&memory, bytes, cudaHostAllocPortable) == cudaSuccess) {
      std::memset(memory, 0, bytes);
      return memory;
    }
    const cudaError_t error = cudaGetLastError();  // Clear the sticky-free error.
    if (!warned_.exchange(true)) {
      Log(LogLevel::kWarning, "cudaHostAlloc of ", bytes, " bytes failed (",
          cudaGetErrorString(error),
          "); using pageable memory, host<->device copies will be slower");
    }
    memory = AlignedHostAllocator()->Allocate(bytes);
    if (memory != nullptr) {
      absl::MutexLock lock(&mu_);
      pageable_.insert(memory);
    }
    return memory;
  }

  void Free(void* memory, size_t bytes) override {
    if (memory == nullptr) return;
    {
      absl::MutexLock lock(&mu_);
      if (pageable_.erase(memory) > 0) {
        AlignedHostAllocator()->Free(memory, bytes);
        return;
      }
    }
    cudaSetDevice(device_.load(std::memory_order_relaxed));
    cudaFreeHost(memory);
  }

  absl::string_view name() const override { return "pinned"; }

 private:
  std::atomic<int> device_{0};
  std::atomic<bool> warned_{false};
  absl::Mutex mu_;
  absl::flat_hash_set<void*> pageable_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

namespace {

PinnedAllocator* TheAllocator() {
  static PinnedAllocator* allocator = new PinnedAllocator();
  return allocator;
}

}  // namespace

HostAllocator* PinnedHostAllocator() { return TheAllocator(); }

void SetPinnedHostAllocatorDevice(int ordinal) { TheAllocator()->set_device(ordinal); }

}  // namespace optstate
