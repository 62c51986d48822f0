// What a group's last applied step was stepped with (proto LastStep), so a
// trainer that resumes from the daemon's live state (RemoteAdamW
// resume="daemon") restores its param_groups as they were at that step.
#ifndef OPTSTATE_SERVER_STATE_LAST_STEP_RECORD_H_
#define OPTSTATE_SERVER_STATE_LAST_STEP_RECORD_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/kernels/adamw_hyperparameters.h"

namespace optstate {

struct SteppedWith {
  uint64_t step = 0;
  AdamWHyperparameters hyperparameters;
};

// Thread-safe.
class LastStepRecord {
 public:
  // Keeps `stepped` unless a later step is recorded already (chunks of one
  // step carry the same hyperparameters; the highest step wins).
  void Record(const SteppedWith& stepped) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!last_.has_value() || stepped.step >= last_->step) last_ = stepped;
  }
  // Forgets the record (the state was replaced: imported or rewound).
  void Reset() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    last_.reset();
  }
  // nullopt: no step applied since the group was made (registered, imported
  // or restored) or its state was replaced.
  std::optional<SteppedWith> Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  mutable absl::Mutex mu_;
  std::optional<SteppedWith> last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_LAST_STEP_RECORD_H_
