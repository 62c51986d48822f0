// Translation between the wire messages (optstate.v1) and the server's own
// types, for the rpc layer (the only server layer that sees protobuf types).
#ifndef OPTSTATE_SERVER_RPC_PROTO_CONVERT_H_
#define OPTSTATE_SERVER_RPC_PROTO_CONVERT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "optstate/dtype.h"
#include "optstate/v1/dtype_proto.h"
#include "optstate/v1/optstate.pb.h"
#include "server/backends/step_backend.h"
#include "server/state/group.h"

namespace optstate {

// DTYPE_UNSPECIFIED reads as float32; an unknown value is INVALID_ARGUMENT
// naming `field`.
absl::StatusOr<WireType> WireTypeFromProto(v1::DType dtype, absl::string_view field);

// Unset fields take torch's defaults. INVALID_ARGUMENT when a retired
// float32 field (1-5, from clients built before the fields became doubles)
// is set: registering defaults in its place would be a silent change.
absl::StatusOr<AdamWHyperparameters> HyperparametersFromProto(
    const v1::AdamWHyperparameters& proto);
void HyperparametersToProto(const AdamWHyperparameters& h, v1::AdamWHyperparameters* proto);

void GroupInfoToProto(const Group& group, v1::GroupInfo* proto);
void GroupStatsToProto(const Group& group, v1::GroupStats* proto);
void BackendStatsToProto(const BackendStats& stats, v1::DeviceStats* proto);

// Status messages travel as percent-encoded metadata, which the peer bounds
// (8 KiB by default): a longer one would reach it as RESOURCE_EXHAUSTED
// instead of our answer. Names are at most 512 characters, so messages that
// quote them stay well inside this; anything longer is clipped.
inline constexpr size_t kMaxStatusMessageBytes = 1536;

// The gRPC status for `status`, its message clipped to kMaxStatusMessageBytes.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_PROTO_CONVERT_H_
