// A group's lr for the step wins over the call's; unset, the group's own.
#include "client/transport/chunk_fields.h"

#include "optstate/v1/dtype_proto.h"

namespace optstate::client_internal {

void ChunkFields(const GroupStep& group, const ChunkPiece& piece, uint64_t step,
                 const StepOptions& options, v1::StepRequest* fields) {
  fields->Clear();
  fields->set_group(group.group);
  fields->set_step(step);
  fields->set_offset(piece.offset);
  fields->set_group_elements(group.gradient.size());
  fields->set_gradient_dtype(WireTypeToProto(options.gradient_dtype));
  fields->set_param_dtype(WireTypeToProto(options.param_dtype));
  if (group.lr) {
    fields->set_lr(*group.lr);
  } else if (options.lr) {
    fields->set_lr(*options.lr);
  }
  if (options.grad_scale) fields->set_grad_scale(*options.grad_scale);
}

}  // namespace optstate::client_internal
