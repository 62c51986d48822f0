// The StepRequest fields of a chunk that every transport sets alike. Not API.
#ifndef OPTSTATE_CLIENT_TRANSPORT_CHUNK_FIELDS_H_
#define OPTSTATE_CLIENT_TRANSPORT_CHUNK_FIELDS_H_

#include <cstdint>

#include "client/step/plan_chunks.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {

// Clears `fields` and sets a chunk's fields but its gradient (or region
// slices): group, step, offset, group size, dtypes, the group's or the
// call's lr, the group's other overrides (betas, eps, weight_decay,
// maximize), grad_scale.
void ChunkFields(const GroupStep& group, const ChunkPiece& piece, uint64_t step,
                 const StepOptions& options, v1::StepRequest* fields);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_TRANSPORT_CHUNK_FIELDS_H_
