// The in-flight window of one step stream: the writer waits in it for
// room, the reader counts replies into it. Not API.
#ifndef OPTSTATE_CLIENT_STEP_SEND_WINDOW_H_
#define OPTSTATE_CLIENT_STEP_SEND_WINDOW_H_

#include <cstddef>

#include "absl/synchronization/mutex.h"

namespace optstate::client_internal {

// At most `size` messages written and not yet answered. Thread-safe.
class SendWindow {
 public:
  explicit SendWindow(size_t size) : size_(size) {}

  // Blocks until message `i` (0, 1, ...) may be written, that is fewer than
  // `size` messages before it are unanswered; false once Stop was called.
  bool WaitForRoom(size_t i) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (!stopped_ && i - answered_ >= size_) room_.Wait(&mu_);
    return !stopped_;
  }

  void Answered() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++answered_;
    room_.Signal();
  }

  // Wakes the writer for good (the reader is done); returns the replies counted.
  size_t Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    room_.Signal();
    return answered_;
  }

 private:
  const size_t size_;
  absl::Mutex mu_;
  absl::CondVar room_;
  size_t answered_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace optstate::client_internal

#endif  // OPTSTATE_CLIENT_STEP_SEND_WINDOW_H_
