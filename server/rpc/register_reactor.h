// The RegisterGroup stream: a spec, then chunks of initial values. One
// reactor per call; store and engine work runs on the worker pool.
#ifndef OPTSTATE_SERVER_RPC_REGISTER_REACTOR_H_
#define OPTSTATE_SERVER_RPC_REGISTER_REACTOR_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/engine/step_engine.h"

namespace optstate {

// Flow: StartRead -> OnReadDone -> (worker: register, or write values) ->
// StartRead ... -> OnReadDone(!ok) -> Finish with the group's info. One
// message is handled at a time. The first error ends the call; a values chunk
// refused changed nothing.
class RegisterReactor : public grpc::ServerReadReactor<v1::RegisterGroupRequest> {
 public:
  RegisterReactor(StepEngine* engine, std::string tenant, v1::RegisterGroupResponse* response);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  // Runs on a worker; ends with StartRead or Finish, touching nothing after.
  void HandleMessage();
  void FinishWithGroup();
  absl::Status GroupDeletedError() const;

  StepEngine* const engine_;
  const std::string tenant_;
  v1::RegisterGroupResponse* const response_;
  v1::RegisterGroupRequest request_;
  // Set by the spec message. Weak: a stream left open must not keep a
  // deleted group's memory, which the store no longer counts.
  std::weak_ptr<Group> group_;
  bool registered_ = false;  // The spec message registered group_.
  std::string name_;         // group_'s.
  bool created_ = false;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_REGISTER_REACTOR_H_
