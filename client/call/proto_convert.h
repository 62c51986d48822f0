// The client's translation of the daemon's replies into optstate's own types
// (GroupInfo, Stats), so no protobuf type reaches the public headers. Not API.
#ifndef OPTSTATE_CLIENT_CALL_PROTO_CONVERT_H_
#define OPTSTATE_CLIENT_CALL_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "optstate/group_info.h"
#include "optstate/stats.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::client_internal {

// FAILED_PRECONDITION when the daemon predates double hyperparameters (it
// fills only the retired float32 fields, and ignored the ones this client
// sends). `created` is false.
absl::StatusOr<GroupInfo> GroupInfoFromProto(const v1::GroupInfo& proto);

// Both ways between Hyperparameters and the wire's AdamWHyperparameters
// (every field set when sending; unset ones read as torch's defaults).
void HyperparametersToProto(const Hyperparameters& h, v1::AdamWHyperparameters* proto);
Hyperparameters HyperparametersFromProto(const v1::AdamWHyperparameters& proto);

// Every field of the reply; fails as GroupInfoFromProto for any group's info.
absl::StatusOr<Stats> StatsFromProto(const v1::GetStatsResponse& proto);

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_CALL_PROTO_CONVERT_H_
