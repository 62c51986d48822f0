// GetDataPlane answers from what the server was started with.
#include "server/rpc/data_plane_service.h"

#include "server/rpc/call_auth.h"
#include "server/rpc/proto_convert.h"

namespace optstate {

grpc::ServerUnaryReactor* DataPlaneService::GetDataPlane(grpc::CallbackServerContext* context,
                                                         const v1::GetDataPlaneRequest*,
                                                         v1::GetDataPlaneResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::StatusOr<Caller> caller = AuthenticateCall(authenticator_, context); !caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  absl::MutexLock lock(&mu_);
  if (!region_socket_.empty()) {
    response->set_region_socket(region_socket_);
    response->set_daemon_id(daemon_id_);
    response->set_max_regions_per_client(limits_.max_regions_per_client);
    response->set_max_region_bytes(limits_.max_region_bytes);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace optstate
