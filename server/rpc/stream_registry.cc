// Ending streams from outside their reactors.
//
// 1. A stream adds itself when created and removes itself in OnDone, just
//    before it is deleted.
// 2. To end streams, the registry takes a hold on each (HoldIfIdleSince)
//    under its lock: a stream still in the set has not been deleted, and the
//    hold keeps it from finishing until EndHeld. Lock order: registry, then
//    stream.
// 3. EndHeld runs outside the registry's lock (Finish may run OnDone, which
//    calls Remove), once per hold.
// 4. The heap trimmer hears of the first stream added to an empty set and
//    of the last one removed under the registry's lock, so what it is told
//    follows the set's order (its own lock is taken last, and it calls no one
//    holding it).
// 5. The sweeper wakes every tenth of the idle timeout (at most every second,
//    at least every 50 ms), so a stream is ended at most 10% after it.
#include "server/rpc/stream_registry.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optstate {

StreamRegistry::StreamRegistry(absl::Duration idle_timeout, HeapTrimmer* trimmer)
    : idle_timeout_(idle_timeout), trimmer_(trimmer) {
  if (idle_timeout_ > absl::ZeroDuration() && idle_timeout_ != absl::InfiniteDuration()) {
    sweeper_ = std::thread([this] { SweepIdle(); });
  }
}

StreamRegistry::~StreamRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
}

bool StreamRegistry::Add(ManagedStream* stream) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return false;
  if (streams_.empty() && trimmer_ != nullptr) trimmer_->SetIdle(false);
  streams_.insert(stream);
  return true;
}

void StreamRegistry::Remove(ManagedStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
  if (streams_.empty() && trimmer_ != nullptr) trimmer_->SetIdle(true);
}

void StreamRegistry::EndAll() {
  std::vector<ManagedStream*> held;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (ManagedStream* stream : streams_) {
      if (stream->HoldIfIdleSince(absl::InfiniteFuture())) held.push_back(stream);
    }
  }
  for (ManagedStream* stream : held) stream->EndHeld(ShuttingDownError());
}

bool StreamRegistry::WaitUntilEmpty(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_.empty(); };
  return mu_.AwaitWithDeadline(absl::Condition(&empty), deadline);
}

void StreamRegistry::SweepIdle() {
  const absl::Duration period =
      std::clamp(idle_timeout_ / 10, absl::Milliseconds(50), absl::Seconds(1));
  for (;;) {
    std::vector<ManagedStream*> held;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), period);
      if (stop_) return;
      const absl::Time idle_since = absl::Now() - idle_timeout_;
      for (ManagedStream* stream : streams_) {
        if (stream->HoldIfIdleSince(idle_since)) held.push_back(stream);
      }
    }
    for (ManagedStream* stream : held) stream->EndHeld(IdleError());
  }
}

absl::Status StreamRegistry::ShuttingDownError() {
  return absl::UnavailableError(
      "optstated is shutting down; retry against the restarted daemon (steps already answered "
      "are kept, resending the rest applies them exactly once)");
}

absl::Status StreamRegistry::IdleError() const {
  return absl::UnavailableError(absl::StrCat(
      "the stream was idle for ", absl::FormatDuration(idle_timeout_),
      " (--stream_idle_timeout) and was ended; open a new one (optstate::Client does)"));
}

}  // namespace optstate
