// Keeps the most recent latency samples and answers percentile queries.
#ifndef OPTSTATE_SERVER_BASE_LATENCY_RECORDER_H_
#define OPTSTATE_SERVER_BASE_LATENCY_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace optstate {

struct Percentiles {
  double p50_us = 0;
  double p99_us = 0;
  uint64_t samples = 0;  // All samples ever recorded, not only the window.
};

// Thread-safe. Percentiles are over the last `window` samples.
class LatencyRecorder {
 public:
  // A window of 0 is taken as 1.
  explicit LatencyRecorder(size_t window = 4096) : window_(window == 0 ? 1 : window) {}

  void Record(double micros);
  Percentiles Summarize() const;

 private:
  const size_t window_;
  mutable absl::Mutex mu_;
  std::vector<double> samples_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_LATENCY_RECORDER_H_
