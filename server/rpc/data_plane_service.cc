// GetDataPlane answers from what the server was started with.
#include "server/rpc/data_plane_service.h"

namespace optstate {

grpc::ServerUnaryReactor* DataPlaneService::GetDataPlane(grpc::CallbackServerContext* context,
                                                         const v1::GetDataPlaneRequest*,
                                                         v1::GetDataPlaneResponse* response) {
  absl::MutexLock lock(&mu_);
  if (!region_socket_.empty()) {
    response->set_region_socket(region_socket_);
    response->set_daemon_id(daemon_id_);
    response->set_max_regions_per_client(limits_.max_regions_per_client);
    response->set_max_region_bytes(limits_.max_region_bytes);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace optstate
