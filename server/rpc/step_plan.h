// Step plans (StepRequest.plan): the chunks of a same-host Step message,
// kept by the client's region session, so that later messages name them by
// number instead of spelling out every chunk. Every use is checked as if
// the chunks had been sent again; the plan saves the sending and reading of
// them, not a check.
#ifndef OPTSTATE_SERVER_RPC_STEP_PLAN_H_
#define OPTSTATE_SERVER_RPC_STEP_PLAN_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optstate/v1/optstate.pb.h"
#include "server/regions/region_registry.h"
#include "server/rpc/step_request_reader.h"

namespace optstate {

// A plan as kept: the defining message's chunks, as read (they carry no
// gradient bytes): its own chunk, then those packed in `more`. (Declared in
// step_request_reader.h, which a StepMessage that uses one holds.)
struct StepPlan {
  v1::StepRequest chunks;
};

// Whether `request` uses a plan rather than spelling out its chunks: it
// names a plan and no group.
inline bool UsesStepPlan(const v1::StepRequest& request) {
  return request.plan() != 0 && request.group().empty();
}

// The chunks `message` steps: its own, or those of the plan it uses.
inline const v1::StepRequest& ChunksOf(const StepMessage& message) {
  return message.plan != nullptr ? message.plan->chunks : message.request;
}

// Whether `request` defines plan request.plan() as it is stepped.
inline bool DefinesStepPlan(const v1::StepRequest& request) {
  return request.plan() != 0 && !request.group().empty();
}

// For a message that defines a plan: INVALID_ARGUMENT, naming the chunk,
// unless every chunk names a gradient_region and a params_region and the
// outer request's region_session (a plan's use sends no bytes and gets no
// params back).
absl::Status CheckStepPlanDefinition(const v1::StepRequest& request);

// For `message`, which uses a plan: INVALID_ARGUMENT naming a field such a
// message cannot carry (a chunk's own: offset, gradient, dtypes, regions,
// group_elements, more); FAILED_PRECONDITION when the daemon has no region
// socket (`regions` null); NOT_FOUND when its region session does not keep
// the plan for `tenant` (never defined, forgotten, the session gone or
// another's). Else the plan.
absl::StatusOr<std::shared_ptr<const StepPlan>> FindStepPlan(RegionRegistry* regions,
                                                             const std::string& tenant,
                                                             const StepMessage& message);

// Keeps `request`'s chunks (CheckStepPlanDefinition passed) as its region
// session's plan request.plan() for `tenant`, counted by the bytes they
// take (RegionRegistry::Keep: NOT_FOUND once the session is gone,
// RESOURCE_EXHAUSTED for a plan past the daemon's bytes for plans;
// FAILED_PRECONDITION when `regions` is null).
absl::Status KeepStepPlan(RegionRegistry* regions, const std::string& tenant,
                          const v1::StepRequest& request);

// Forgets plan request.plan() of request's session, if kept (its defining
// message was refused).
void ForgetStepPlan(RegionRegistry* regions, const std::string& tenant,
                    const v1::StepRequest& request);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STEP_PLAN_H_
