// What a step must satisfy before anything is sent, whatever carries it:
// the step number and options, each group's buffers and their lengths
// against the group's layout. Not API.
#ifndef OPTSTATE_CLIENT_STEP_STEP_CHECKS_H_
#define OPTSTATE_CLIENT_STEP_STEP_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// INVALID_ARGUMENT for a step number (0), a grad_scale or lr (the step's or
// a group's) that no step takes, or a group named twice.
absl::Status CheckStep(absl::Span<const GroupStep> groups, uint64_t step,
                       const StepOptions& options);

// INVALID_ARGUMENT when a 16-bit buffer of `group` is not bfloat16 or
// float16, or not of the wire type StepOptions gives it (GroupStep).
absl::Status CheckBufferForms(const GroupStep& group, const StepOptions& options);

// INVALID_ARGUMENT when `group`'s gradient, or its params_out unless empty,
// does not have the group's `num_elements`.
absl::Status CheckLengths(const GroupStep& group, uint64_t num_elements);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_STEP_CHECKS_H_
