// The ExportState stream: a group's header, then its pages, each page's
// tensors and step read together under its lock. One reactor per call.
#ifndef OPTSTATE_SERVER_RPC_EXPORT_REACTOR_H_
#define OPTSTATE_SERVER_RPC_EXPORT_REACTOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/durability/page_capture.h"
#include "server/engine/step_engine.h"
#include "server/rpc/stream_registry.h"
#include "server/rpc/tenant_stream_limit.h"

namespace optstate {

// Flow: (constructor) header -> StartWrite -> OnWriteDone -> (worker:
// capture the next run of pages, about 1 MiB per tensor) -> StartWrite of
// its page_steps, params, exp_avg, exp_avg_sq chunks, one at a time -> ...
// -> Finish. One message is in flight at a time, so the reactor holds one
// run of pages (copies of at most max(3 MiB, one page of params, m and v))
// however large the group. Each chunk holds whole pages of one tensor and
// fits the message limit.
// Ended from outside (StreamRegistry): at shutdown, and when one message
// has waited to be taken by the client for --stream_idle_timeout (the
// client stopped reading). It then finishes with the registry's status
// right away, behind the message in flight (a capture on a worker finishes
// first, and nothing more is written), lets go of the group and its copies,
// and leaves the registry at once: a client that does not read cannot hold
// the daemon's exit.
// Messages are serialized here and written as bytes (the service is raw:
// service.h).
class ExportReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public ManagedStream {
 public:
  // `streams` must outlive the reactor. `moved_to` non-empty: the group is
  // sealed for its move there first (StateStore::Seal, under `lease`; it
  // waits for the group's chunks in flight), and a refused seal ends the
  // call with its status before anything is written.
  // `slot`: the stream's place under --tenant_max_streams, held until the
  // reactor is done.
  ExportReactor(StepEngine* engine, const GroupKey& key, StreamRegistry* streams,
                const std::string& moved_to = "", const LeaseClaim& lease = LeaseClaim(),
                StreamSlot slot = StreamSlot());

  void OnWriteDone(bool ok) override;
  void OnDone() override;

  // ManagedStream. Idle: a message written before `idle_since` is still
  // not taken, and no capture is on a worker.
  bool HoldIfIdleSince(absl::Time idle_since) override;
  void EndHeld(absl::Status status) override;

 private:
  // Runs on a worker; ends with StartWrite or Finish, touching nothing after.
  void WriteNext();
  // Starts writing response_ (which the caller has filled), unless the
  // stream is being ended: then finishes it.
  void Write();
  // Finishes with `status` unless finished already; leaves the registry.
  void FinishOnce(absl::Status status);

  StepEngine* const engine_;
  StreamRegistry* const streams_;
  StreamSlot slot_;
  std::shared_ptr<Group> group_;
  uint64_t pages_per_run_ = 1;
  uint64_t next_page_ = 0;  // First page not yet captured.
  // Of pages_: 0 (capture anew), 1 steps, 2 params, 3 m, 4 v, 5 max_exp_avg_sq (amsgrad).
  int next_tensor_ = 0;
  CapturedPages pages_;
  v1::ExportStateResponse response_;
  grpc::ByteBuffer outgoing_;  // response_ serialized; read by gRPC while a write is in flight.

  absl::Mutex mu_;
  bool in_registry_ ABSL_GUARDED_BY(mu_) = false;  // Added and not yet removed.
  bool on_worker_ ABSL_GUARDED_BY(mu_) = false;    // WriteNext is scheduled or running.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;      // A write is in flight.
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);
  bool ending_ ABSL_GUARDED_BY(mu_) = false;  // Held to be ended: write nothing more.
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> final_ ABSL_GUARDED_BY(mu_);  // Set by EndHeld.
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_EXPORT_REACTOR_H_
