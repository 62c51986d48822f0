// The default ApplyAndEncode: gather, Apply, encode.
#include "server/backends/step_backend.h"

#include <vector>

namespace optstate {

absl::Status StepBackend::ApplyAndEncode(Group& group, uint64_t begin, uint64_t end,
                                         const SegmentedBytes& gradient, size_t grad_offset,
                                         WireType grad_type, const AdamWConstants& constants,
                                         void* params_out, WireType params_type) {
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

}  // namespace optstate
