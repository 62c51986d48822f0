#include "server/base/duration_histogram.h"

#include <algorithm>

namespace optstate {

void DurationHistogram::Observe(absl::Duration duration) {
  const int64_t nanos = std::max<int64_t>(0, absl::ToInt64Nanoseconds(duration));
  // Divided, not multiplied by 1e-9: correctly rounded, so a duration equal
  // to a bound gives that bound's double exactly.
  const double seconds = static_cast<double>(nanos) / 1e9;
  // The first bound not below the sample: `le` is inclusive.
  const size_t bucket =
      std::lower_bound(kBoundsSeconds.begin(), kBoundsSeconds.end(), seconds) - kBoundsSeconds.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(static_cast<uint64_t>(nanos), std::memory_order_relaxed);
}

DurationHistogram::Snapshot DurationHistogram::Read() const {
  Snapshot snapshot;
  for (size_t i = 0; i < kBuckets; ++i) {
    snapshot.counts[i] = counts_[i].load(std::memory_order_relaxed);
    snapshot.count += snapshot.counts[i];
  }
  snapshot.sum_seconds = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
  return snapshot;
}

}  // namespace optstate
