// The gRPC service optstate.v1.OptimizerState. It only translates RPCs into
// calls on the state store and the step engine; it holds no optimizer math.
#ifndef OPTSTATE_SERVER_SERVICE_H_
#define OPTSTATE_SERVER_SERVICE_H_

#include "optstate/v1/optstate.grpc.pb.h"
#include "server/step_engine.h"

namespace optstate {

// Thread-safe; `engine` must outlive the service.
class OptimizerStateService : public v1::OptimizerState::CallbackService {
 public:
  explicit OptimizerStateService(StepEngine* engine) : engine_(engine) {}

  grpc::ServerReadReactor<v1::RegisterGroupRequest>* RegisterGroup(
      grpc::CallbackServerContext* context, v1::RegisterGroupResponse* response) override;
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* Step(
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
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_SERVICE_H_
