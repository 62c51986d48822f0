// The gRPC service optstate.v1.DataPlane: tells a client where this daemon's
// region socket is (same-host data plane), so it can choose shared memory.
#ifndef OPTSTATE_SERVER_RPC_DATA_PLANE_SERVICE_H_
#define OPTSTATE_SERVER_RPC_DATA_PLANE_SERVICE_H_

#include <string>

#include "absl/synchronization/mutex.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/regions/region_registry.h"

namespace optstate {

// Thread-safe. Answers "no region socket" until SetRegionSocket (the path
// may depend on the port gRPC bound).
// Raw (grpc::ByteBuffer in and out), as OptimizerStateService: a request that
// is not a GetDataPlaneRequest gets INVALID_ARGUMENT naming it, not gRPC's
// bare UNIMPLEMENTED.
class DataPlaneService
    : public v1::DataPlane::WithRawCallbackMethod_GetDataPlane<v1::DataPlane::Service> {
 public:
  // `authenticator` (may be null): GetDataPlane needs what every other
  // call needs (UNAUTHENTICATED otherwise).
  DataPlaneService(std::string daemon_id, RegionLimits limits,
                   const Authenticator* authenticator = nullptr)
      : daemon_id_(std::move(daemon_id)), limits_(limits), authenticator_(authenticator) {}

  void SetRegionSocket(std::string path) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    region_socket_ = std::move(path);
  }

  grpc::ServerUnaryReactor* GetDataPlane(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  const std::string daemon_id_;
  const RegionLimits limits_;
  const Authenticator* const authenticator_;
  absl::Mutex mu_;
  std::string region_socket_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_DATA_PLANE_SERVICE_H_
