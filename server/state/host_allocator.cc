// Ordinary host memory for group state, outside the heap's tuning.
//
// optstated tunes malloc for chunk buffers (mmap threshold 32 MiB, trim
// threshold 1 GiB: optstated_main.cc), which kept every array under 32 MiB
// on the heap, where freeing it returned nothing to the system. So:
// 1. An array of at least kMapBytes is its own anonymous mapping (zero
//    already), placed on a 2 MiB boundary and advised for transparent huge
//    pages when it spans one (fewer TLB misses in the update's pass); Free
//    unmaps it, so deleting a group gives its memory back at once.
// 2. Smaller arrays come from the heap (aligned_alloc, zeroed): one mapping
//    per array would round each up to 4 KiB and, at three per group, could
//    run into vm.max_map_count (65,530) with many small groups. At 1 MiB and
//    up that limit needs more than 64 GiB of state. Freed heap memory goes
//    back to the system only when the heap is trimmed.
#include "server/state/host_allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace optstate {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kMapBytes = 1 << 20;
constexpr size_t kPageBytes = 4096;
constexpr size_t kHugePageBytes = 2 << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Maps `bytes` (a multiple of kPageBytes) on a kHugePageBytes boundary.
void* MapAligned(size_t bytes) {
  const size_t span = bytes + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(begin, kHugePageBytes);
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + span;
  if (end > aligned + bytes)
    munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  void* memory = reinterpret_cast<void*>(aligned);
  if (bytes >= kHugePageBytes) madvise(memory, bytes, MADV_HUGEPAGE);  // Advice only.
  return memory;
}

class AlignedAllocator : public HostAllocator {
 public:
  void* Allocate(size_t bytes) override {
    if (bytes >= kMapBytes) return MapAligned(RoundUp(bytes, kPageBytes));
    const size_t rounded = bytes == 0 ? kAlign : RoundUp(bytes, kAlign);
    void* memory = std::aligned_alloc(kAlign, rounded);
    if (memory != nullptr) std::memset(memory, 0, rounded);
    return memory;
  }
  void Free(void* memory, size_t bytes) override {
    if (bytes >= kMapBytes) {
      munmap(memory, RoundUp(bytes, kPageBytes));
    } else {
      std::free(memory);
    }
  }
  absl::string_view name() const override { return "aligned"; }
};

}  // namespace

HostAllocator* AlignedHostAllocator() {
  static AlignedAllocator* allocator = new AlignedAllocator();
  return allocator;
}

}  // namespace optstate
