// Chooses and builds the step backend named by --backend.
#ifndef OPTSTATE_SERVER_BACKEND_FACTORY_H_
#define OPTSTATE_SERVER_BACKEND_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/backends/cuda/cuda_options.h"
#include "server/backends/step_backend.h"
#include "server/base/thread_pool.h"

namespace optstate {

struct BackendOptions {
  std::string kind = "auto";  // "auto", "cpu" or "cuda".
  CudaOptions cuda;           // Ignored by the CPU backend.
};

// "auto" gives the CUDA backend when one is built in and a device is usable,
// else the CPU backend; "cuda" without a usable device is FAILED_PRECONDITION
// saying why; anything else is INVALID_ARGUMENT. `pool` must outlive the
// backend.
absl::StatusOr<std::unique_ptr<StepBackend>> CreateBackend(const BackendOptions& options,
                                                           ThreadPool* pool);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKEND_FACTORY_H_
