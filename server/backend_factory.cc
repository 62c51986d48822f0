// Backend selection for --backend=auto|cpu|cuda.
#include "server/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/base/log.h"
#ifdef OPTSTATE_HAVE_CUDA
#include "server/backends/cuda/cuda_backend.h"
#include "server/backends/cuda/cuda_device.h"
#endif

namespace optstate {

absl::StatusOr<std::unique_ptr<StepBackend>> CreateBackend(const BackendOptions& options,
                                                           ThreadPool* pool) {
  // Checked whichever backend runs (the CUDA backend's own parse,
  // paging_strategy.h, is not built without CUDA): a typo taken on a CPU
  // host would refuse the start only on a GPU one.
  const std::string& paging = options.cuda.paging;
  if (paging != "none" && paging != "adaptive" && paging != "fully_paged") {
    return absl::InvalidArgumentError(
        absl::StrCat("--paging must be none, adaptive or fully_paged, got '", paging, "'"));
  }
  if (absl::Status s = CheckCudaOptions(options.cuda); !s.ok()) return s;
  if (options.kind == "cpu") return std::make_unique<CpuBackend>(pool);
#ifdef OPTSTATE_HAVE_CUDA
  if (options.kind == "cuda") {
    absl::StatusOr<std::unique_ptr<CudaBackend>> cuda = CudaBackend::Create(options.cuda, pool);
    if (!cuda.ok()) {
      if (absl::IsFailedPrecondition(cuda.status())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--backend=cuda: ", cuda.status().message(), "; use --backend=cpu or auto"));
      }
      return cuda.status();
    }
    Log(LogLevel::kInfo, "backend: cuda (", (*cuda)->Describe(), ")");
    return std::unique_ptr<StepBackend>(std::move(*cuda));
  }
  if (options.kind == "auto") {
    // Any runtime error (no driver, no device, no kernel image) means cpu.
    absl::StatusOr<CudaDeviceInfo> device = ProbeCudaDevice(options.cuda.device);
    if (!device.ok()) {
      Log(LogLevel::kInfo, "backend: cpu (auto; ", device.status().message(), ")");
      return std::make_unique<CpuBackend>(pool);
    }
    absl::StatusOr<std::unique_ptr<CudaBackend>> cuda = CudaBackend::Create(options.cuda, pool);
    if (!cuda.ok()) return cuda.status();  // Bad CUDA flags: say so, do not hide them.
    Log(LogLevel::kInfo, "backend: cuda (auto; ", (*cuda)->Describe(), ")");
    return std::unique_ptr<StepBackend>(std::move(*cuda));
  }
#else
  if (options.kind == "cuda") {
    return absl::FailedPreconditionError(
        "--backend=cuda: this optstated was built without the CUDA backend; use --backend=cpu "
        "or auto");
  }
  if (options.kind == "auto") {
    Log(LogLevel::kInfo, "backend: cpu (auto; no CUDA backend built in)");
    return std::make_unique<CpuBackend>(pool);
  }
#endif
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be auto, cpu or cuda, got '", options.kind, "'"));
}

}  // namespace optstate
