// One step as the client checked it: what every transport is handed. Not API.
#ifndef OPTSTATE_CLIENT_STEP_STEP_INPUT_H_
#define OPTSTATE_CLIENT_STEP_STEP_INPUT_H_

#include <cstdint>

#include "absl/types/span.h"
#include "client/step/plan_chunks.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// The caller's groups and options, and each group's layout (one per group,
// in order), all checked (step/step_checks.h, PagesPerChunk); the spans and
// the options outlive the step.
struct StepInput {
  absl::Span<const GroupStep> groups;
  absl::Span<const ChunkGroup> layouts;
  uint64_t step = 0;
  const StepOptions& options;
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_STEP_INPUT_H_
