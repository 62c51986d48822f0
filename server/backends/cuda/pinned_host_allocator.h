// Page-locked host memory (cudaHostAlloc) for group arrays, so host<->device
// copies are asynchronous DMA. Falls back to ordinary aligned memory when
// the memory cannot be pinned.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_PINNED_HOST_ALLOCATOR_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_PINNED_HOST_ALLOCATOR_H_

#include "server/state/host_allocator.h"

namespace optstate {

// The process-wide pinned allocator; never destroyed, so groups may outlive
// the backend that handed it out. Allocate returns zero-filled memory aligned
// to at least 64 bytes (pinned blocks are page-aligned); when pinning fails it
// logs a warning once and returns aligned pageable memory instead (copies of
// such memory are correct, only slower). Thread-safe.
HostAllocator* PinnedHostAllocator();

// The device whose context pinned memory is allocated and freed in (0 until
// set); the backend sets its own, so a thread that never chose a device
// does not create a context on device 0.
void SetPinnedHostAllocatorDevice(int ordinal);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_PINNED_HOST_ALLOCATOR_H_
