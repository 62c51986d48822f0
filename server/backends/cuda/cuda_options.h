// The CUDA backend's settings (the --paging, --vram_*, --staging_* and
// --cuda_device flags). Plain values, no CUDA headers: the assembly layer and
// the CPU-only build include it.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_OPTIONS_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optstate {

inline constexpr int kMaxStagingSlots = 1024;

struct CudaOptions {
  std::string paging = "adaptive";  // "none", "adaptive" or "fully_paged".
  uint64_t vram_reserved_bytes = 0;
  double vram_target_utilization = 0.9;
  uint64_t vram_total_bytes = 0;  // 0: what the device reports.
  int staging_slots = 4;
  uint64_t staging_slot_bytes = 64ull << 20;
  int device = 0;
};

// The bounds of the flags themselves, checked on every backend (a value
// taken on a CPU host would refuse the start only on a GPU one).
inline absl::Status CheckCudaOptions(const CudaOptions& options) {
  if (options.staging_slots < 2 || options.staging_slots > kMaxStagingSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("--staging_slots must be between 2 and ", kMaxStagingSlots,
                     " (two or more let copies and updates overlap), got ", options.staging_slots));
  }
  if (options.staging_slot_bytes < 4096 || options.staging_slot_bytes > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--staging_slot_bytes must be between 4096 and 2^40, got ", options.staging_slot_bytes));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_device must be a device ordinal (0, 1, ...), got ", options.device));
  }
  return absl::OkStatus();
}

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_OPTIONS_H_
