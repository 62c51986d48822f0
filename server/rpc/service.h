// The gRPC service optstate.v1.OptimizerState. It only translates RPCs into
// calls on the state store and the step engine; it holds no optimizer math.
#ifndef OPTSTATE_SERVER_RPC_SERVICE_H_
#define OPTSTATE_SERVER_RPC_SERVICE_H_

#include "optstate/v1/optstate.grpc.pb.h"
#include "server/engine/step_engine.h"
#include "server/regions/region_registry.h"

namespace optstate {

// Every method on the callback API; Step raw (grpc::ByteBuffer in and out) so
// its reactor parses requests and writes replies itself (server/rpc/step_reply_builder.h).
using OptimizerStateCallbackBase = v1::OptimizerState::WithCallbackMethod_RegisterGroup<
    v1::OptimizerState::WithRawCallbackMethod_Step<v1::OptimizerState::WithCallbackMethod_GetStats<
        v1::OptimizerState::WithCallbackMethod_ListGroups<
            v1::OptimizerState::WithCallbackMethod_DescribeGroup<
                v1::OptimizerState::WithCallbackMethod_DeleteGroup<
                    v1::OptimizerState::Service>>>>>>;

// Thread-safe; `engine` must outlive the service.
class OptimizerStateService : public OptimizerStateCallbackBase {
 public:
  // `max_reply_bytes`: the largest message the server may send (Step
  // refuses, before applying anything, a message whose reply would be larger).
  // `regions`: the same-host data plane's regions, or null when the daemon
  // offers none.
  OptimizerStateService(StepEngine* engine, size_t max_reply_bytes,
                        const RegionRegistry* regions = nullptr)
      : engine_(engine), max_reply_bytes_(max_reply_bytes), regions_(regions) {}

  grpc::ServerReadReactor<v1::RegisterGroupRequest>* RegisterGroup(
      grpc::CallbackServerContext* context, v1::RegisterGroupResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Step(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* ListGroups(grpc::CallbackServerContext* context,
                                       const v1::ListGroupsRequest* request,
                                       v1::ListGroupsResponse* response) override;
  grpc::ServerUnaryReactor* DescribeGroup(grpc::CallbackServerContext* context,
                                          const v1::DescribeGroupRequest* request,
                                          v1::DescribeGroupResponse* response) override;
  grpc::ServerUnaryReactor* DeleteGroup(grpc::CallbackServerContext* context,
                                        const v1::DeleteGroupRequest* request,
                                        v1::DeleteGroupResponse* response) override;

 private:
  // The caller's tenant; "" until authentication maps callers to tenants.
  static std::string TenantOf(const grpc::CallbackServerContext* context) { return ""; }

  StepEngine* const engine_;
  const size_t max_reply_bytes_;
  const RegionRegistry* const regions_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_SERVICE_H_
