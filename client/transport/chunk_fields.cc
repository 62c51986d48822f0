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
  if (group.beta1) fields->set_beta1(*group.beta1);
  if (group.beta2) fields->set_beta2(*group.beta2);
  if (group.eps) fields->set_eps(*group.eps);
  if (group.weight_decay) fields->set_weight_decay(*group.weight_decay);
  if (group.maximize) fields->set_maximize(*group.maximize);
  if (options.grad_scale) fields->set_grad_scale(*options.grad_scale);
}

}  // namespace optstate::client_internal
