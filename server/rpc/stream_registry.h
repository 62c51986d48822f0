// The open Step, RegisterGroup, ImportState and ExportState streams: ended all
// at once when the daemon shuts down, one by one when idle past
// --stream_idle_timeout; whether there are any tells the heap trimmer whether
// the daemon is idle.
#ifndef OPTSTATE_SERVER_RPC_STREAM_REGISTRY_H_
#define OPTSTATE_SERVER_RPC_STREAM_REGISTRY_H_

#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/base/heap_trimmer.h"

namespace optstate {

// A stream the registry can end. Both calls come from a registry thread,
// never from a gRPC callback.
class ManagedStream {
 public:
  virtual ~ManagedStream() = default;
  // Takes a hold that keeps the stream from finishing (and so from being
  // deleted) until EndHeld, and stops it from starting work on messages it
  // reads from now on. Returns false, taking nothing, when the stream has
  // already ended or (`idle_since` finite) is busy or was active after
  // `idle_since`. Called with the registry's lock held.
  virtual bool HoldIfIdleSince(absl::Time idle_since) = 0;
  // Ends the held stream with `status` once the work already under way is
  // done and answered, and releases the hold. The stream may be gone after.
  virtual void EndHeld(absl::Status status) = 0;
};

// Thread-safe.
class StreamRegistry {
 public:
  // `idle_timeout`: a stream with nothing to do for this long is ended
  // (IdleError); zero or infinite: never. `trimmer` (may be null; else must
  // outlive the registry) is told the daemon is idle whenever no stream is
  // open (HeapTrimmer::SetIdle).
  explicit StreamRegistry(absl::Duration idle_timeout, HeapTrimmer* trimmer = nullptr);
  ~StreamRegistry();

  // Registers a new stream. False once shutting down: the stream must then
  // end itself with ShuttingDownError() and not call Remove.
  bool Add(ManagedStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Called by the stream before it is deleted.
  void Remove(ManagedStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses new streams from now on and ends every open one with
  // ShuttingDownError(), each after the work it has under way; returns
  // without waiting for them to finish.
  void EndAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every stream has been removed, or `deadline`; returns
  // whether none is left.
  bool WaitUntilEmpty(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // UNAVAILABLE: the daemon is shutting down (a client retries elsewhere, or
  // against the restarted daemon).
  static absl::Status ShuttingDownError();
  absl::Status IdleError() const;

 private:
  void SweepIdle() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration idle_timeout_;
  HeapTrimmer* const trimmer_;
  absl::Mutex mu_;
  absl::flat_hash_set<ManagedStream*> streams_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;  // Runs SweepIdle while an idle timeout is set.
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_STREAM_REGISTRY_H_
