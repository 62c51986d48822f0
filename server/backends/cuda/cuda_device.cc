// Device probing: count, select, memory, and a check that the kernel loads.
#include "server/backends/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/kernels/adamw_cuda.h"

namespace optstate {
namespace {

absl::Status Unusable(absl::string_view what, cudaError_t error) {
  return absl::FailedPreconditionError(absl::StrCat("no usable CUDA device: ", what,
                                                    " failed: ", cudaGetErrorName(error), " (",
                                                    cudaGetErrorString(error), ")"));
}

}  // namespace

std::string CudaDeviceInfo::ToString() const {
  return absl::StrFormat("device %d '%s' (sm_%d%d, %d SMs, %.1f GiB)", ordinal, name, compute_major,
                         compute_minor, multiprocessors,
                         static_cast<double>(total_bytes) / (1ull << 30));
}

absl::StatusOr<CudaDeviceInfo> ProbeCudaDevice(int ordinal) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();  // Clear it, so later calls do not report it again.
    return Unusable("cudaGetDeviceCount", e);
  }
  if (count == 0) return absl::FailedPreconditionError("no usable CUDA device: none found");
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device: --cuda_device=", ordinal, " but ", count, " device(s) exist"));
  }
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return Unusable("cudaSetDevice", e);
  CudaDeviceInfo info;
  info.ordinal = ordinal;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    return Unusable("cudaMemGetInfo", e);
  }
  info.free_bytes = free_bytes;
  info.total_bytes = total_bytes;
  cudaDeviceProp props;
  if (cudaError_t e = cudaGetDeviceProperties(&props, ordinal); e != cudaSuccess) {
    return Unusable("cudaGetDeviceProperties", e);
  }
  info.name = props.name;
  info.compute_major = props.major;
  info.compute_minor = props.minor;
  info.multiprocessors = props.multiProcessorCount;
  if (cudaError_t e = CheckAdamWKernelImage(); e != cudaSuccess) {
    return Unusable(absl::StrCat("loading the AdamW kernel for sm_", props.major, props.minor,
                                 " (this binary is built for sm_80 and sm_90)"),
                    e);
  }
  return info;
}

}  // namespace optstate
