// GetDataPlane answers from what the server was started with.
#include "server/rpc/data_plane_service.h"

#include "server/rpc/call_auth.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/raw_message.h"

namespace optstate {

grpc::ServerUnaryReactor* DataPlaneService::GetDataPlane(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = AuthenticateCall(authenticator_, context);
  v1::GetDataPlaneRequest parsed;  // No fields; its bytes must still be one.
  absl::Status status = caller.ok() ? ParseRawMessage(*request, &parsed) : caller.status();
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
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
  v1::GetDataPlaneResponse reply;
  {
    absl::MutexLock lock(&mu_);
    if (!region_socket_.empty()) {
      reply.set_region_socket(region_socket_);
      reply.set_daemon_id(daemon_id_);
      reply.set_max_regions_per_client(limits_.max_regions_per_client);
      reply.set_max_region_bytes(limits_.max_region_bytes);
    }
  }
  reactor->Finish(ToGrpcStatus(SerializeRawMessage(reply, response)));
  return reactor;
}

}  // namespace optstate
