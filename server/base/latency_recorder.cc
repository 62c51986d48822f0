// Ring buffer of latency samples; percentiles by nearest rank.
#include "server/base/latency_recorder.h"

#include <algorithm>
#include <cmath>

namespace optstate {

void LatencyRecorder::Record(double micros) {
  absl::MutexLock lock(&mu_);
  if (samples_.size() < window_) {
    samples_.push_back(micros);
  } else {
    samples_[next_] = micros;
  }
  next_ = (next_ + 1) % window_;
  ++total_;
}

Percentiles LatencyRecorder::Summarize() const {
  std::vector<double> sorted;
  Percentiles out;
  {
    absl::MutexLock lock(&mu_);
    sorted = samples_;
    out.samples = total_;
  }
  if (sorted.empty()) return out;
  std::sort(sorted.begin(), sorted.end());
  auto rank = [&](double q) {
    size_t index = static_cast<size_t>(std::ceil(q * sorted.size()));
    return sorted[index == 0 ? 0 : index - 1];
  };
  out.p50_us = rank(0.50);
  out.p99_us = rank(0.99);
  return out;
}

}  // namespace optstate
