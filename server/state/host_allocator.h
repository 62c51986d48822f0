// Where a group's host arrays come from: ordinary 64-byte aligned memory, or
// page-locked memory when a CUDA device will copy them.
#ifndef OPTSTATE_SERVER_STATE_HOST_ALLOCATOR_H_
#define OPTSTATE_SERVER_STATE_HOST_ALLOCATOR_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace optstate {

// Implementations are thread-safe.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // Returns `bytes` of zero-filled memory aligned to 64 bytes, or nullptr.
  virtual void* Allocate(size_t bytes) = 0;
  // Releases memory from Allocate; `bytes` is the size asked for.
  virtual void Free(void* memory, size_t bytes) = 0;
  virtual absl::string_view name() const = 0;
};

// The process-wide allocator of ordinary aligned memory: an array of 1 MiB
// or more is a mapping of its own (2 MiB aligned, huge pages advised), and
// Free unmaps it; smaller ones come from the heap.
HostAllocator* AlignedHostAllocator();

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_HOST_ALLOCATOR_H_
