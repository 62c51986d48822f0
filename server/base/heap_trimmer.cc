// One thread: wait for a request or the period, trim when asked or when the
// policy says so, keep the gap.
#include "server/base/heap_trimmer.h"

#include <malloc.h>

#include <algorithm>

namespace optstate {

void HeapTrimPolicy::Trimmed(const HeapReading& after) {
  system_at_trim_ = after.system_bytes;
  peak_in_use_ = after.in_use_bytes;
}

bool HeapTrimPolicy::Due(const HeapReading& now) {
  peak_in_use_ = std::max(peak_in_use_, now.in_use_bytes);
  if (now.system_bytes > system_at_trim_ + slack_) return true;
  const uint64_t fall = std::max(slack_, peak_in_use_ / 4);
  return now.in_use_bytes + fall < peak_in_use_;
}

HeapReading ReadHeap() {
  const struct mallinfo2 info = mallinfo2();
  return HeapReading{info.arena, info.uordblks};
}

HeapTrimmer::HeapTrimmer(absl::Duration period, uint64_t slack_bytes, absl::Duration min_gap,
                         std::function<HeapReading()> read_heap, std::function<void()> trim)
    : period_(period),
      min_gap_(min_gap),
      read_heap_(std::move(read_heap)),
      trim_(trim ? std::move(trim) : [] { malloc_trim(0); }),
      policy_(slack_bytes) {
  policy_.Trimmed(read_heap_());
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
    bool requested;
    {
      absl::MutexLock lock(&mu_);
      if (periodic) {
        mu_.AwaitWithTimeout(absl::Condition(&due), period_);
      } else {
        mu_.Await(absl::Condition(&due));
      }
      if (stop_) return;
      requested = requested_;
      requested_ = false;
    }
    if (!requested && !policy_.Due(read_heap_())) continue;
    trim_();
    policy_.Trimmed(read_heap_());
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
