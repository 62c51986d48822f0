// Ordinary aligned host memory. Large blocks come from mmap via aligned_alloc
// and are zero already; the memset touches only what the kernel lazily maps.
#include "server/state/host_allocator.h"

#include <cstdlib>
#include <cstring>

namespace optstate {
namespace {

class AlignedAllocator : public HostAllocator {
 public:
  void* Allocate(size_t bytes) override {
    constexpr size_t kAlign = 64;
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) rounded = kAlign;
    void* memory = std::aligned_alloc(kAlign, rounded);
    if (memory != nullptr) std::memset(memory, 0, rounded);
    return memory;
  }
  void Free(void* memory, size_t) override { std::free(memory); }
  absl::string_view name() const override { return "aligned"; }
};

}  // namespace

HostAllocator* AlignedHostAllocator() {
  static AlignedAllocator* allocator = new AlignedAllocator();
  return allocator;
}

}  // namespace optstate
