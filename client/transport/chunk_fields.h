// The StepRequest fields of a chunk that every transport sets alike. Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_CHUNK_FIELDS_H_
#define OPTSTATE_CLIENT_TRANSPORT_CHUNK_FIELDS_H_

#include <cstdint>
#include <optional>

#include "client/step/plan_chunks.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {

// A chunk's fields that hold for its step alone (the rest are where and
// what it is): what a step plan's use may set for every chunk at once.
struct PerStepFields {
  std::optional<double> lr, beta1, beta2, eps, weight_decay;
  std::optional<bool> maximize;
  std::optional<float> grad_scale;
};

// A group's per-step fields in a step: the group's lr, else the call's;
// the group's other overrides; the call's grad_scale.
PerStepFields PerStepFieldsOf(const GroupStep& group, const StepOptions& options);

// Sets in `request` those of `fields` that are set.
void SetPerStepFields(const PerStepFields& fields, v1::StepRequest* request);

// Clears `fields` and sets a chunk's fields but its gradient (or region
// slices): group, step, offset, group size, dtypes, the group's or the
// call's lr, the group's other overrides (betas, eps, weight_decay,
// maximize), grad_scale.
void ChunkFields(const GroupStep& group, const ChunkPiece& piece, uint64_t step,
                 const StepOptions& options, v1::StepRequest* fields);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_CHUNK_FIELDS_H_
