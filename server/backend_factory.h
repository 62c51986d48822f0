// Chooses and builds the step backend named by --backend.
#ifndef OPTSTATE_SERVER_BACKEND_FACTORY_H_
#define OPTSTATE_SERVER_BACKEND_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/step_backend.h"
#include "server/thread_pool.h"

namespace optstate {

struct BackendOptions {
  std::string kind = "auto";  // "auto", "cpu" or "cuda".
  // The rest configure the CUDA backend and are ignored by the CPU one.
  std::string paging = "adaptive";  // "none", "adaptive" or "fully_paged".
  uint64_t vram_reserved_bytes = 0;
  double vram_target_utilization = 0.9;
  uint64_t vram_total_bytes = 0;  // 0: what the device reports.
  int staging_slots = 4;
  uint64_t staging_slot_bytes = 64ull << 20;
  int device = 0;
};

// "auto" gives the CUDA backend when one is built in and a device is usable,
// else the CPU backend; "cuda" without a usable device is FAILED_PRECONDITION
// saying why; anything else is INVALID_ARGUMENT. `pool` must outlive the
// backend.
absl::StatusOr<std::unique_ptr<StepBackend>> CreateBackend(const BackendOptions& options,
                                                           ThreadPool* pool);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKEND_FACTORY_H_
