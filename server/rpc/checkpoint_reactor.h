// The Checkpoint call: handed to the checkpointer's own thread (it may wait
// for a step for as long as the call's deadline allows), answered from there.
#ifndef OPTSTATE_SERVER_RPC_CHECKPOINT_REACTOR_H_
#define OPTSTATE_SERVER_RPC_CHECKPOINT_REACTOR_H_

#include <string>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/durability/checkpointer.h"

namespace optstate {

// Starts the call, which `reactor` finishes; `checkpointer` may be null (no
// --state_dir: FAILED_PRECONDITION). Never blocks a gRPC thread.
// A request naming no groups waits for `tenant`'s, or with `all_tenants`
// (an admin, or a daemon without tenants) for every group. `response` gets
// the serialized CheckpointResponse.
void StartCheckpointCall(Checkpointer* checkpointer, grpc::CallbackServerContext* context,
                         grpc::ServerUnaryReactor* reactor, const std::string& tenant,
                         bool all_tenants, const v1::CheckpointRequest& request,
                         grpc::ByteBuffer* response);

// The durability fields of GetStats (20-25). Without `whole_daemon` (a call
// of `tenant` on a daemon with tenants) the last checkpoint's bytes are left
// out, and its step and duration unless that tenant's own call wrote it (the
// counts of checkpoints written and failed stay the daemon's), and the texts of
// refusals and failures, which may name other tenants' groups, are replaced
// by a pointer to an admin's GetStats.
void CheckpointStatsToProto(const CheckpointStats& stats, bool whole_daemon,
                            const std::string& tenant, v1::GetStatsResponse* proto);

// What a tenant's call is told instead of a refusal that may name other
// tenants' groups (Checkpointer::writes_refused).
inline constexpr char kRefusalsForAdmins[] =
    "checkpoints found in the state_dir at start were refused, so none is written; an "
    "admin's GetStats (restore_refusals) and the daemon's log say why (the reasons may name "
    "other tenants' groups)";

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_CHECKPOINT_REACTOR_H_
