// The step's one finite check: a gradient element is refused when it is not
// finite as the daemon will read it (narrowed to the wire type, widened
// back, times grad_scale). Every transport checks with these, so a refusal
// reads the same on every data plane. Not API.
#ifndef OPTSTATE_CLIENT_STEP_FINITE_CHECK_H_
#define OPTSTATE_CLIENT_STEP_FINITE_CHECK_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "optstate/client.h"

namespace optstate::client_internal {

// INVALID_ARGUMENT naming the first element of `group`'s gradient, from
// `from` on, that is not finite as the daemon will read it, with its value
// as the caller gave it; the message says the whole step was refused and
// nothing was sent.
absl::Status NotFiniteError(const GroupStep& group, const StepOptions& options, size_t from);

// Elements [offset, offset + count) of `group`'s gradient, as the caller
// gave them: OK when all are finite as the daemon will read them, else
// NotFiniteError from the first bad one.
absl::Status CheckGivenFinite(const GroupStep& group, const StepOptions& options, uint64_t offset,
                              uint64_t count);

// The same elements already in the wire type at `wire` (where a transport
// put them, or a SharedBuffer holds them): one pass over those bytes when
// |grad_scale| <= 1 (a narrowed value is then finite times the scale exactly
// when it is finite), else each widened and scaled.
absl::Status CheckWireFinite(const GroupStep& group, const StepOptions& options, const void* wire,
                             uint64_t offset, uint64_t count);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_FINITE_CHECK_H_
