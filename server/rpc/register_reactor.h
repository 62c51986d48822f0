// The RegisterGroup stream: a spec, then chunks of initial values. One
// reactor per call; store and engine work runs on the worker pool.
#ifndef OPTSTATE_SERVER_RPC_REGISTER_REACTOR_H_
#define OPTSTATE_SERVER_RPC_REGISTER_REACTOR_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/engine/step_engine.h"
#include "server/rpc/stream_registry.h"

namespace optstate {

// Flow: StartRead -> OnReadDone -> (worker: parse, register or write values)
// -> StartRead ... -> OnReadDone(!ok) -> Finish with the group's info. One
// message is handled at a time. Messages are raw: one that does not parse is
// refused with INVALID_ARGUMENT naming it (never taken for a half-close).
// The first error ends the call; a values chunk refused changed nothing.
// A group this stream created is kept only when the call ends OK: a
// refusal removes it before the status is sent, and a call that breaks or is
// cancelled (gRPC cut it: an oversized message, a deadline, a lost
// connection) removes it once the daemon sees the call end. A group that
// existed before the stream is never removed by it (values its good chunks
// wrote stay), nor one another stream has stepped meanwhile.
// Ended from outside (StreamRegistry: shutdown, idle timeout), it handles no
// further message and ends with the registry's status, which does not count
// as OK: a group it created is removed.
class RegisterReactor : public grpc::ServerReadReactor<grpc::ByteBuffer>, public ManagedStream {
 public:
  // `streams` must outlive the reactor. `lease`: the call's lease claim
  // (call_lease.h): values for pages at step 0 of a group another holder
  // leases are refused (StepEngine::WriteInitialValues).
  RegisterReactor(StepEngine* engine, std::string tenant, grpc::ByteBuffer* response,
                  StreamRegistry* streams, LeaseClaim lease = LeaseClaim());

  void OnReadDone(bool ok) override;
  void OnCancel() override { cancelled_.store(true, std::memory_order_release); }
  void OnDone() override;

  // ManagedStream. Idle: no message read or handled since `idle_since`.
  bool HoldIfIdleSince(absl::Time idle_since) override;
  void EndHeld(absl::Status status) override;

 private:
  // Runs on a worker: parses and handles incoming_, then reads on or ends.
  void HandleMessage();
  absl::Status HandleRequest(const v1::RegisterGroupRequest& request);
  // Records the call's final status (the first one wins; a refusal removes a
  // group this stream created first), then finishes when nothing is running.
  void End(absl::Status status);
  void FinishIfDue();
  absl::Status GroupDeletedError() const;
  // Removes the group this stream created, if it did (StateStore::Unregister).
  void RemoveCreatedGroup();

  StepEngine* const engine_;
  const std::string tenant_;
  const LeaseClaim lease_;
  grpc::ByteBuffer* const response_;
  StreamRegistry* const streams_;
  bool in_registry_ = false;   // streams_->Add took it.
  grpc::ByteBuffer incoming_;  // Written by gRPC while a read is in flight.
  std::atomic<bool> cancelled_{false};

  // Touched only by the one thread handling the current message (reads and
  // handling alternate).
  uint64_t messages_ = 0;  // Read so far.
  // Set by the spec message. Weak: a stream left open must not keep a
  // deleted group's memory, which the store no longer counts.
  std::weak_ptr<Group> group_;
  bool registered_ = false;  // The spec message registered group_.
  std::string name_;         // group_'s.
  bool created_ = false;     // group_ did not exist before this stream.

  absl::Mutex mu_;
  bool handling_ ABSL_GUARDED_BY(mu_) = false;  // A message is on a worker.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;    // Held to be ended: handle nothing more.
  int holds_ ABSL_GUARDED_BY(mu_) = 0;          // Finish waits while held.
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> final_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool removed_ ABSL_GUARDED_BY(mu_) = false;  // RemoveCreatedGroup ran.
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_REGISTER_REACTOR_H_
