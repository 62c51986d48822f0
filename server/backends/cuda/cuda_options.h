// The CUDA backend's settings (the --paging, --vram_*, --staging_* and
// --cuda_device flags). Plain values, no CUDA headers: the assembly layer and
// the CPU-only build include it.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_OPTIONS_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_OPTIONS_H_

#include <cstdint>
#include <string>

namespace optstate {

struct CudaOptions {
  std::string paging = "adaptive";  // "none", "adaptive" or "fully_paged".
  uint64_t vram_reserved_bytes = 0;
  double vram_target_utilization = 0.9;
  uint64_t vram_total_bytes = 0;  // 0: what the device reports.
  int staging_slots = 4;
  uint64_t staging_slot_bytes = 64ull << 20;
  int device = 0;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_CUDA_OPTIONS_H_
