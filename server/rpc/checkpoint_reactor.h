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

// The durability fields of GetStats (20-25).
void CheckpointStatsToProto(const CheckpointStats& stats, v1::GetStatsResponse* proto);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_CHECKPOINT_REACTOR_H_
