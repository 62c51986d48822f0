// The ImportState stream: a header, then chunks of a group's whole state,
// installed all at once when the stream ends whole. One reactor per call.
#ifndef OPTSTATE_SERVER_RPC_IMPORT_REACTOR_H_
#define OPTSTATE_SERVER_RPC_IMPORT_REACTOR_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/durability/checkpointer.h"
#include "server/durability/state_import.h"
#include "server/engine/step_engine.h"
#include "server/rpc/stream_registry.h"
#include "server/state/group_lease.h"

namespace optstate {

// Flow: StartRead -> OnReadDone -> (worker: StateImport::Begin, or AddChunk)
// -> StartRead ... -> OnReadDone(!ok) -> (worker: Commit unless the call was
// cancelled) -> Finish with the group's info. One message is handled at a
// time. The first error ends the call; the import gathered so far is
// dropped (its staged memory given back) before the status is sent, and
// nothing of it was ever visible.
// Ended from outside (StreamRegistry: shutdown, idle timeout), it handles no
// further message, drops the import the same way, and ends with the
// registry's status once a message on a worker is done. A stream whose
// commit is already on a worker is not held: it finishes with the commit's
// outcome, so a client never hears UNAVAILABLE for an import that was
// installed.
// Messages are read as bytes and parsed here (raw_message.h): a message that
// is not an ImportStateRequest is refused as such, where gRPC's typed read
// would report it as the end of the stream and the import would commit.
class ImportReactor : public grpc::ServerReadReactor<grpc::ByteBuffer>, public ManagedStream {
 public:
  // `streams` must outlive the reactor; `response` gets the serialized
  // ImportStateResponse.
  // `checkpointer` (null without a state_dir): an import over an existing
  // group lands between checkpoints (StateImport::Commit).
  ImportReactor(StepEngine* engine, grpc::CallbackServerContext* context, std::string tenant,
                grpc::ByteBuffer* response, StreamRegistry* streams,
                LeaseClaim lease = LeaseClaim(), Checkpointer* checkpointer = nullptr);

  void OnReadDone(bool ok) override;
  void OnDone() override;

  // ManagedStream. Idle: no message read or handled since `idle_since`.
  bool HoldIfIdleSince(absl::Time idle_since) override;
  void EndHeld(absl::Status status) override;

 private:
  // Run on a worker; each ends with StartRead or End, touching nothing after.
  void HandleMessage();
  void CommitAndFinish();
  // Records the call's final status (the first one wins), then finishes when
  // nothing is running or held.
  void End(absl::Status status);
  void FinishIfDue();

  StepEngine* const engine_;
  Checkpointer* const checkpointer_;
  grpc::CallbackServerContext* const context_;
  const std::string tenant_;
  const LeaseClaim lease_;  // The call's (call_lease.h), held to an existing group.
  grpc::ByteBuffer* const response_;
  StreamRegistry* const streams_;
  bool in_registry_ = false;  // streams_->Add took it.
  grpc::ByteBuffer incoming_;  // Written by gRPC while a read is in flight.
  uint64_t messages_ = 0;      // Read so far; touched by the thread handling one.
  // Set by the header. Touched by the one thread handling the current
  // message, and by FinishIfDue once nothing handles one any more.
  std::unique_ptr<StateImport> import_;

  absl::Mutex mu_;
  bool handling_ ABSL_GUARDED_BY(mu_) = false;    // A message or the commit is on a worker.
  bool committing_ ABSL_GUARDED_BY(mu_) = false;  // The commit was scheduled.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;      // Held to be ended: handle nothing more.
  bool has_header_ ABSL_GUARDED_BY(mu_) = false;  // import_ was begun.
  int holds_ ABSL_GUARDED_BY(mu_) = 0;            // Finish waits while held.
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> final_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_IMPORT_REACTOR_H_
