// A step's groups worked on in a few contiguous ranges at once (copies and
// checks of a large step on several threads). Not API.
#ifndef OPTSTATE_CLIENT_STEP_GROUP_RANGES_H_
#define OPTSTATE_CLIENT_STEP_GROUP_RANGES_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// Calls prepare(i) for every group, in order within each of up to
// 4 contiguous ranges of about equal gradient bytes, the
// first range on this thread and the others on threads of their own (one
// range for a step under 8 MiB of gradient a thread). The status of
// the lowest index that failed, so the error names the step's first bad
// element; OK when none did. `prepare` must be safe to call concurrently
// for different groups.
absl::Status ForEachGroupSplit(absl::Span<const GroupStep> groups,
                               const std::function<absl::Status(size_t)>& prepare);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_GROUP_RANGES_H_
