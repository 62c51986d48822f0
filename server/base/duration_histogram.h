// Counts durations into fixed buckets, for Prometheus histograms.
#ifndef OPTSTATE_SERVER_BASE_DURATION_HISTOGRAM_H_
#define OPTSTATE_SERVER_BASE_DURATION_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"

namespace optstate {

// Thread-safe and lock-free: Observe is two relaxed atomic adds, cheap
// enough for every Step message. A Read taken while Observe runs may count
// a sample in its bucket and not yet in the sum (or the reverse); each
// bucket's count and the sum only ever grow.
class DurationHistogram {
 public:
  // Upper bounds of the buckets, in seconds (Prometheus' `le`), from 10 us
  // to a minute; one more bucket, +Inf, holds the rest.
  static constexpr std::array<double, 18> kBoundsSeconds = {
      1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
      1e-2, 2.5e-2, 5e-2, 0.1,  0.25,   0.5,  1,    5,      60};
  static constexpr size_t kBuckets = kBoundsSeconds.size() + 1;

  struct Snapshot {
    std::array<uint64_t, kBuckets> counts{};  // Per bucket, not cumulative; last is +Inf.
    uint64_t count = 0;                        // Sum of counts.
    double sum_seconds = 0;
  };

  // A negative duration counts as zero.
  void Observe(absl::Duration duration);
  Snapshot Read() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> sum_nanos_{0};
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_DURATION_HISTOGRAM_H_
