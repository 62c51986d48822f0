// Backend selection for --backend=auto|cpu|cuda.
#include "server/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "server/cpu_backend.h"
#include "server/log.h"

namespace optstate {

absl::StatusOr<std::unique_ptr<StepBackend>> CreateBackend(const BackendOptions& options,
                                                           ThreadPool* pool) {
  if (options.kind == "cpu") return std::make_unique<CpuBackend>(pool);
  if (options.kind == "cuda") {
    return absl::FailedPreconditionError(
        "--backend=cuda: this optstated was built without the CUDA backend; use --backend=cpu "
        "or auto");
  }
  if (options.kind == "auto") {
    Log(LogLevel::kInfo, "backend: cpu (auto; no CUDA backend built in)");
    return std::make_unique<CpuBackend>(pool);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be auto, cpu or cuda, got '", options.kind, "'"));
}

}  // namespace optstate
