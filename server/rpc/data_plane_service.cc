// GetDataPlane answers from what the server was started with.
#include "server/rpc/data_plane_service.h"

#include "server/rpc/call_auth.h"
#include "server/rpc/proto_convert.h"

namespace optstate {

grpc::ServerUnaryReactor* DataPlaneService::GetDataPlane(grpc::CallbackServerContext* context,
                                                         const v1::GetDataPlaneRequest*,
                                                         v1::GetDataPlaneResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = AuthenticateCall(authenticator_, context);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  if (caller->by_certificate) {
    // The region socket authenticates with tokens: it sees no certificate.
    reactor->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        "the shared-memory data plane needs a token: this caller's tenant '" + caller->tenant +
            "' comes from its client certificate, which the region socket cannot see; send "
            "'authorization: Bearer TOKEN' (a tokens-file line for the tenant) to use shared "
            "memory, or step over the wire (DataPlane::kWire, data_plane=\"wire\")"));
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
