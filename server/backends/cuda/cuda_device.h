// Finding out whether a CUDA device is usable, and what it has. Any error of
// the runtime (no driver, no device, no kernel image) means "not usable".
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_DEVICE_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace optstate {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  uint64_t total_bytes = 0;  // cudaMemGetInfo's total.
  uint64_t free_bytes = 0;   // Free when probed.

  // "device 0 'NVIDIA H200' (sm_90, 132 SMs, 139.8 GiB)".
  std::string ToString() const;
};

// Makes `ordinal` the calling thread's device and describes it, checking that
// it can run the AdamW kernel. FAILED_PRECONDITION saying why otherwise
// (the runtime's error, no devices, ordinal out of range).
absl::StatusOr<CudaDeviceInfo> ProbeCudaDevice(int ordinal);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_DEVICE_H_
