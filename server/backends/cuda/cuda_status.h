// CUDA runtime errors as absl::Status, for the boundaries of the CUDA backend.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_STATUS_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace optstate {

// OK for cudaSuccess; otherwise INTERNAL "<what>: <cuda error name>: <text>".
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_STATUS_H_
