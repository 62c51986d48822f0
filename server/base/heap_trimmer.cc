// One thread: wait for a request or the period, trim, keep the gap.
#include "server/base/heap_trimmer.h"

#include <malloc.h>

namespace optstate {

HeapTrimmer::HeapTrimmer(absl::Duration period, absl::Duration min_gap)
    : period_(period), min_gap_(min_gap) {
  thread_ = std::thread([this] { Run(); });
}

HeapTrimmer::~HeapTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void HeapTrimmer::RequestTrim() {
  absl::MutexLock lock(&mu_);
  requested_ = true;
}

uint64_t HeapTrimmer::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

void HeapTrimmer::Run() {
  const bool periodic = period_ > absl::ZeroDuration() && period_ != absl::InfiniteDuration();
  auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requested_ || stop_; };
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (periodic) {
        mu_.AwaitWithTimeout(absl::Condition(&due), period_);
      } else {
        mu_.Await(absl::Condition(&due));
      }
      if (stop_) return;
      requested_ = false;
    }
    malloc_trim(0);
    {
      absl::MutexLock lock(&mu_);
      ++trims_;
      // Requests within the gap are served by one trim after it.
      mu_.AwaitWithTimeout(absl::Condition(&stop_), min_gap_);
      if (stop_) return;
    }
  }
}

}  // namespace optstate
