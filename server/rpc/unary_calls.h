// The unary calls under way (GetStats, ListGroups, DescribeGroup,
// DeleteGroup, Checkpoint, RewindJob): at shutdown the daemon refuses new
// ones and waits for those under way to be answered before it stops gRPC,
// so that a Checkpoint being written at SIGTERM is answered with its
// outcome, not cancelled.
#ifndef OPTSTATE_SERVER_RPC_UNARY_CALLS_H_
#define OPTSTATE_SERVER_RPC_UNARY_CALLS_H_

#include <cstddef>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace optstate {

// Thread-safe.
class UnaryCalls {
 public:
  // The reactor of a new call, counted as under way until gRPC is done with
  // it (its OnDone). Once shutting down: a reactor already finished with
  // UNAVAILABLE (retry against the restarted daemon), and false: the caller
  // returns it and does nothing else with the call.
  bool Begin(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor** reactor)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses new calls from now on.
  void StopAccepting() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no call is under way, or `deadline`; whether none is.
  bool WaitUntilNone(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class CountedReactor;
  void Done() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  size_t under_way_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_UNARY_CALLS_H_
