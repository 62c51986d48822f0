// A call's lease claim (proto Lease, docs/jobs.md), from its metadata:
// 'optstate-lease: holder=ID job=NAME host=HOST pid=PID' and
// 'optstate-lease-takeover: expired=ID' or 'dead=ID' (up to 16 of them,
// space-separated: each holder named is taken over on its own terms).
#ifndef OPTSTATE_SERVER_RPC_CALL_LEASE_H_
#define OPTSTATE_SERVER_RPC_CALL_LEASE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "server/state/group_lease.h"

namespace optstate {

// The claim the two metadata values make (nullopt: absent; both absent: a
// claim of no holder). INVALID_ARGUMENT, naming the metadata and what to
// fix, for a field other than holder, job, host and pid, a field twice, a
// holder missing or not 1 to 128 printable characters, a job or host over
// 256, a pid that is not a decimal number, or a takeover that is not
// up to 16 space-separated expired=ID or dead=ID.
absl::StatusOr<LeaseClaim> ParseLeaseClaim(std::optional<absl::string_view> lease,
                                           std::optional<absl::string_view> takeover);

// ParseLeaseClaim of the call's metadata; INVALID_ARGUMENT when either key
// is sent more than once.
absl::StatusOr<LeaseClaim> LeaseClaimOf(const grpc::CallbackServerContext* context);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_CALL_LEASE_H_
