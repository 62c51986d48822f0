// A group's lr for the step wins over the call's; unset, the group's own.
#include "client/transport/chunk_fields.h"

#include "optstate/v1/dtype_proto.h"

namespace optstate::client_internal {

PerStepFields PerStepFieldsOf(const GroupStep& group, const StepOptions& options) {
  PerStepFields f;
  f.lr = group.lr ? group.lr : options.lr;
  f.beta1 = group.beta1;
  f.beta2 = group.beta2;
  f.eps = group.eps;
  f.weight_decay = group.weight_decay;
  f.maximize = group.maximize;
  f.grad_scale = options.grad_scale;
  return f;
}

void SetPerStepFields(const PerStepFields& f, v1::StepRequest* request) {
  if (f.lr) request->set_lr(*f.lr);
  if (f.beta1) request->set_beta1(*f.beta1);
  if (f.beta2) request->set_beta2(*f.beta2);
  if (f.eps) request->set_eps(*f.eps);
  if (f.weight_decay) request->set_weight_decay(*f.weight_decay);
  if (f.maximize) request->set_maximize(*f.maximize);
  if (f.grad_scale) request->set_grad_scale(*f.grad_scale);
}

void ChunkFields(const GroupStep& group, const ChunkPiece& piece, uint64_t step,
                 const StepOptions& options, v1::StepRequest* fields) {
  fields->Clear();
  fields->set_group(group.group);
  fields->set_step(step);
  fields->set_offset(piece.offset);
  fields->set_group_elements(group.gradient.size());
  fields->set_gradient_dtype(WireTypeToProto(options.gradient_dtype));
  fields->set_param_dtype(WireTypeToProto(options.param_dtype));
  SetPerStepFields(PerStepFieldsOf(group, options), fields);
}

}  // namespace optstate::client_internal
