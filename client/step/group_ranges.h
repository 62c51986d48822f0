// A step's elements worked on in a few contiguous parts at once (copies and
// checks of a large step on several threads). Not API.
#ifndef OPTSTATE_CLIENT_STEP_GROUP_RANGES_H_
#define OPTSTATE_CLIENT_STEP_GROUP_RANGES_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace optstate::client_internal {

// An item of work: `elements` elements of `element_bytes` bytes each (a
// group's gradient, a reply's piece of params).
struct ElementItem {
  uint64_t elements = 0;
  uint64_t element_bytes = 0;
};

// Calls run(item, begin, end) over every element of every item: the items'
// elements, in order, cut into up to 4 contiguous parts of about equal bytes
// (one part for under 8 MiB a part), the first part on this thread and the
// others on threads of their own. An item larger than a part is cut too, at
// multiples of kElementSplitAlignment elements, so one large group is copied
// on several threads. Within a part, calls are in element order and stop at
// the first that fails. The status of the first failed call in element
// order (the parts are in order), so an error names the step's first bad
// element; OK when none failed. `run` must be safe to call concurrently for
// disjoint ranges.
inline constexpr uint64_t kElementSplitAlignment = 4096;
absl::Status ForEachElementSplit(
    absl::Span<const ElementItem> items,
    const std::function<absl::Status(size_t item, uint64_t begin, uint64_t end)>& run);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_GROUP_RANGES_H_
