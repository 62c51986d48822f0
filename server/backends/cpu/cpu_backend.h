// The CPU backend: steps host memory in place with the vectorized AdamW
// kernel, split over a thread pool.
#ifndef OPTSTATE_SERVER_BACKENDS_CPU_CPU_BACKEND_H_
#define OPTSTATE_SERVER_BACKENDS_CPU_CPU_BACKEND_H_

#include "server/backends/step_backend.h"
#include "server/base/thread_pool.h"

namespace optstate {

class CpuBackend : public StepBackend {
 public:
  // `pool` must outlive the backend.
  explicit CpuBackend(ThreadPool* pool) : pool_(pool) {}

  absl::string_view name() const override { return "cpu"; }
  HostAllocator* host_allocator() override { return AlignedHostAllocator(); }
  absl::Status AttachGroup(Group& group) override;
  void DetachGroup(Group& group) override {}
  absl::Status Apply(Group& group, uint64_t begin, uint64_t end, const void* grad,
                     WireType grad_type, const AdamWConstants& constants) override;
  // Reads the gradient from its pieces in place and narrows the params into
  // `params_out` in the kernel's own pass (AdamWUpdateAndEncode, with
  // `store`), each shard its part.
  absl::Status ApplyAndEncode(Group& group, uint64_t begin, uint64_t end,
                              const SegmentedBytes& gradient, size_t grad_offset,
                              WireType grad_type, const AdamWConstants& constants, void* params_out,
                              WireType params_type, ParamsStore store) override;
  // Runs the range on the calling thread, in one kernel call a piece of the
  // gradient, the first of them reading `ahead` as well (MessageStep asks
  // for it only when every thread has chunks of its own to apply).
  absl::Status ApplyAndEncodeCheckingAhead(Group& group, uint64_t begin, uint64_t end,
                                           const SegmentedBytes& gradient, size_t grad_offset,
                                           WireType grad_type, const AdamWConstants& constants,
                                           void* params_out, WireType params_type,
                                           ParamsStore store, const GradientRange& ahead,
                                           bool* ahead_finite) override;
  absl::Status ParamsWritten(Group& group, uint64_t begin, uint64_t end) override {
    return absl::OkStatus();
  }
  BackendStats Stats() const override;

 private:
  // Both: `params_out` null for Apply.
  void Run(Group& group, uint64_t begin, uint64_t end, const SegmentedBytes& gradient,
           size_t grad_offset, WireType grad_type, const AdamWConstants& constants,
           void* params_out, WireType params_type, ParamsStore store);

  ThreadPool* const pool_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CPU_CPU_BACKEND_H_
