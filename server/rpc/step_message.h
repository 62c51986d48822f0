// One Step message applied as a unit, the Step reactor's work on a worker
// thread (no gRPC calls): its chunks read into the engine's terms, stepped by
// MessageStep (server/engine/message_step.h, which decides what is checked
// and applied at once), and the reply written.
#ifndef OPTSTATE_SERVER_RPC_STEP_MESSAGE_H_
#define OPTSTATE_SERVER_RPC_STEP_MESSAGE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/support/slice.h"
#include "server/engine/message_step.h"
#include "server/engine/step_engine.h"
#include "server/regions/region_registry.h"
#include "server/rpc/step_request_reader.h"

namespace optstate {

// Applies `message` (read by ReadStepRequest) for `tenant`. Every chunk, its
// own and those packed in `more`, passes MessageStep::Check, and the reply
// must fit `max_reply_bytes`, before any is applied: such a refusal
// (INVALID_ARGUMENT, NOT_FOUND) changes nothing. Then the chunks are applied
// (MessageStep::Apply: in order, or at once over the engine's pool for a
// large message of independent chunks) and their replies appended to `reply`
// (one slice per chunk, serialized by StepReplyBuilder); a chunk refused
// there (page state: FAILED_PRECONDITION, NOT_FOUND once deleted, DATA_LOSS)
// leaves the chunks before it applied, or, applied at once, the others where
// they could be, and the refusal says which. A refusal of a packed chunk
// names it (the first such chunk, as a check in order would find it).
// A chunk may name a RegionSlice of `regions` (the same-host data plane) for
// its gradient and for its params instead of carrying them: such a chunk is
// checked like the others, and before anything is applied its regions are
// looked up for `tenant` and its session (NOT_FOUND: not this client's,
// unregistered, or its client gone) and its slices bounds-checked
// (OUT_OF_RANGE); INVALID_ARGUMENT for a chunk carrying both a gradient and
// a gradient_region, a params_region of another size than the params, or
// gradient and params slices that overlap; FAILED_PRECONDITION when
// `regions` is null (no region socket). The kernel then reads the gradient
// from the region and writes the params into it; the mappings stay alive
// until the message is done, even if unregistered meanwhile.
// `lease` (null: none) is the caller's lease claim, held to every chunk's
// group (StepChunk::lease; FAILED_PRECONDITION for another holder's group).
// Step plans (server/rpc/step_plan.h): a message that defines one
// (INVALID_ARGUMENT when a chunk names no regions, or another session) is
// kept as its session's plan in `regions` once its chunks pass Check; a
// message that uses one (message.plan set) has the plan's chunks, stepped
// at its step with its per-step fields where set, checked and applied as
// above, and is answered with one StepResponse of the chunks' counts summed.
absl::Status ApplyStepMessage(StepEngine* engine, const std::string& tenant, size_t max_reply_bytes,
                              const StepMessage& message, std::vector<grpc::Slice>* reply,
                              RegionRegistry* regions = nullptr, const LeaseClaim* lease = nullptr);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STEP_MESSAGE_H_
