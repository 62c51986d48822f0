// The defaults: ApplyAndEncode gathers, applies and encodes; the host state
// is the state only for host-placed groups.
#include "server/backends/step_backend.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace optstate {

absl::Status StepBackend::ApplyAndEncode(Group& group, uint64_t begin, uint64_t end,
                                         const SegmentedBytes& gradient, size_t grad_offset,
                                         WireType grad_type, const AdamWConstants& constants,
                                         void* params_out, WireType params_type, ParamsStore) {
  const size_t grad_bytes = (end - begin) * WireTypeSize(grad_type);
  const char* grad = gradient.Contiguous(grad_offset, grad_bytes);
  std::vector<char> gathered;
  if (grad == nullptr) {
    gathered.resize(grad_bytes);
    gradient.CopyTo(grad_offset, grad_bytes, gathered.data());
    grad = gathered.data();
  }
  absl::Status applied = Apply(group, begin, end, grad, grad_type, constants);
  if (applied.ok()) EncodeFromFloat(params_type, group.params() + begin, params_out, end - begin);
  return applied;
}

absl::Status StepBackend::ApplyAndEncodeCheckingAhead(
    Group& group, uint64_t begin, uint64_t end, const SegmentedBytes& gradient, size_t grad_offset,
    WireType grad_type, const AdamWConstants& constants, void* params_out, WireType params_type,
    ParamsStore store, const GradientRange& ahead, bool* ahead_finite) {
  absl::Status applied = ApplyAndEncode(group, begin, end, gradient, grad_offset, grad_type,
                                        constants, params_out, params_type, store);
  if (applied.ok()) {
    *ahead_finite =
        FindNonFiniteGradient(ahead.data, ahead.type, ahead.count, ahead.grad_scale) == ahead.count;
  }
  return applied;
}

namespace {

absl::Status HostStateIsTheState(const Group& group, absl::string_view backend) {
  if (group.placement() == Placement::kHost) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "group '", group.key().name, "' keeps its state on the device, and the ", backend,
      " backend cannot yet copy it for export, import or checkpoints; run optstated with "
      "--backend=cpu to use them"));
}

}  // namespace

absl::Status StepBackend::ReadStateToHost(Group& group, uint64_t, uint64_t) {
  return HostStateIsTheState(group, name());
}

absl::Status StepBackend::StateWritten(Group& group, uint64_t, uint64_t) {
  return HostStateIsTheState(group, name());
}

}  // namespace optstate
