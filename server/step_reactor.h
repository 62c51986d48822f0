// The Step stream: one reactor per call. Reads chunks, hands each to the step
// engine on the worker pool, and writes one reply per chunk, in order.
#ifndef OPTSTATE_SERVER_STEP_REACTOR_H_
#define OPTSTATE_SERVER_STEP_REACTOR_H_

#include <deque>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/step_engine.h"

namespace optstate {

// Flow: StartRead -> OnReadDone -> (engine on a worker) -> OnChunkDone ->
// StartWrite -> OnWriteDone, with the read of chunk i+1 overlapping the update
// of chunk i. Chunks of one stream are applied one after another, so a stream
// may carry step k and step k+1 of the same page. The first refused chunk
// ends the call with its status, after the replies to earlier chunks.
// No callback blocks: engine work runs on the pool, and gRPC calls are made
// outside the reactor's mutex.
class StepReactor : public grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse> {
 public:
  StepReactor(StepEngine* engine, std::string tenant);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  // Chunks read ahead of the engine plus replies not yet written; bounds the
  // memory one stream can pin.
  static constexpr size_t kMaxQueuedChunks = 8;

  // Starts whatever may start now: a read, a chunk on the engine, a write, or
  // Finish. Safe to call from any thread. Each action started holds a token
  // (starting_) from the decision until its gRPC call has been made, so Finish
  // can never come before, or race with, another call on the stream; the
  // caller passes the tokens it held.
  void Advance(int tokens_released);
  void ApplyOnWorker();  // Runs processing_request_ on the engine.

  StepEngine* const engine_;
  const std::string tenant_;

  absl::Mutex mu_;
  v1::StepRequest incoming_;  // Written by gRPC while a read is in flight.
  v1::StepRequest processing_request_;  // Owned by the worker while processing_.
  std::deque<v1::StepRequest> queued_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepResponse> to_write_ ABSL_GUARDED_BY(mu_);  // Front is in flight.
  bool read_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool processing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  int starting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STEP_REACTOR_H_
