// The fused AdamW kernel for CUDA devices: one pass over p, g, m, v, the same
// formula and operation order as the CPU kernel (server/kernels/adamw_kernel.h).
#ifndef OPTSTATE_SERVER_KERNELS_ADAMW_CUDA_H_
#define OPTSTATE_SERVER_KERNELS_ADAMW_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "optstate/dtype.h"
#include "server/kernels/adamw_kernel.h"

namespace optstate {

// Enqueues one AdamW step over `count` elements on `stream`. p, m, v and
// grad are device pointers; grad holds `count` elements of `grad_type`,
// widened to fp32 in the kernel. Every operation is separately rounded
// (__fmul_rn and friends, no contraction), so the result is bit-identical to
// AdamWUpdate on the CPU. Loads are 16-byte vectors when p, m, v are 16-byte
// aligned and grad is aligned to four of its elements; otherwise each element
// is loaded on its own. Returns the launch's error (cudaSuccess when queued).
cudaError_t LaunchAdamWUpdate(const AdamWConstants& c, float* p, float* m, float* v,
                              const void* grad, WireType grad_type, size_t count,
                              cudaStream_t stream);

// cudaSuccess when the current device can run the kernel (an image for its
// architecture is in this binary); else the error that says why.
cudaError_t CheckAdamWKernelImage();

}  // namespace optstate

#endif  // OPTSTATE_SERVER_KERNELS_ADAMW_CUDA_H_
