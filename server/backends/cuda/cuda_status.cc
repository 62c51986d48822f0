// cudaError_t to absl::Status.
#include "server/backends/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace optstate {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Reported now: do not let it resurface in a later cudaGetLastError().
  (void)cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

}  // namespace optstate
