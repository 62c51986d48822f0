// The ImportState stream: a header, then chunks of a group's whole state,
// installed all at once when the stream ends whole. One reactor per call.
#ifndef OPTSTATE_SERVER_RPC_IMPORT_REACTOR_H_
#define OPTSTATE_SERVER_RPC_IMPORT_REACTOR_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/durability/state_import.h"
#include "server/engine/step_engine.h"

namespace optstate {

// Flow: StartRead -> OnReadDone -> (worker: StateImport::Begin, or AddChunk)
// -> StartRead ... -> OnReadDone(!ok) -> (worker: Commit unless the call was
// cancelled) -> Finish with the group's info. The first error ends the call;
// the import gathered so far is dropped and nothing of it was visible.
class ImportReactor : public grpc::ServerReadReactor<v1::ImportStateRequest> {
 public:
  ImportReactor(StepEngine* engine, grpc::CallbackServerContext* context, std::string tenant,
                v1::ImportStateResponse* response);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  // Run on a worker; each ends with StartRead or Finish, touching nothing after.
  void HandleMessage();
  void CommitAndFinish();

  StepEngine* const engine_;
  grpc::CallbackServerContext* const context_;
  const std::string tenant_;
  v1::ImportStateResponse* const response_;
  v1::ImportStateRequest request_;
  std::unique_ptr<StateImport> import_;  // Set by the header.
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_IMPORT_REACTOR_H_
